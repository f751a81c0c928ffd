"""What a zoom-task model reads: its teacher-forced loss on the tool traces with the right videos
and with another question's.

The zoom task's tool trace has two model turns: the first locates the blue stretch in the 16-frame
overview and asks for it, the last reads the markers in the frames the tool served and answers
(:mod:`datatools.zoom_task`). A model that reads a video scores its turn worse when that video
is swapped for another question's; one that writes the same text from the question's wording and
its priors does not notice. Printed per turn (and for the answer letter alone, whose loss is
ln 4 = 1.386 at chance): the mean loss per token with the right videos, with the overviews
rotated by one row, and with the served segments rotated by one row (every segment has the same
shape, so a rotation changes only what they show).

The *lookup* column is the part of the last turn that reads the served frames: the markers looked
up colour by colour ("red none, green small at 00:14, ..."), between "by colour:" and "In time
order". ``--given`` scores only training rows whose trace was given its first request
(``lvrl data zoom --given-oracle-share``): that request is context, not trained, so the whole
target is the last turn, in the words the model was trained on.

Besides a trace-SFT export (``--model``), ``--direct`` checks a model trained on the direct
target with its video as the prompt's, answering from that video alone: the answer letter's
loss with the right video and with another's (for a probe trained on the served frames alone,
give it shards whose videos are those frames).

Usage: python bench/zoom_reading.py --model DIR [--data data/zoom] [--split val] [--rows 64]
       [--direct | --given]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import AutoProcessor

from datamodules.collate import IGNORE_INDEX, VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from datamodules.tool_traces import ToolTraces, marked_first_turn_given
from evaluation.tables import Column, Table, render_table
from models.sft import SFTModule

OVERVIEW_FRAMES = 16
MAX_PIXELS = 4096  # the zoom configs' max_pixels_per_frame


def per_token_loss(module: SFTModule, batch: dict[str, Any]) -> torch.Tensor:
    """Cross-entropy of every labelled token (0 elsewhere), aligned with ``labels[:, 1:]``."""
    labels = batch["labels"][:, 1:]
    with torch.no_grad():  # the module's loss, per token: its logits start at the first label
        kept = module.token_mean_loss(batch, reduction="none").reshape(len(labels), -1)
    loss = torch.zeros(labels.shape)
    loss[:, labels.shape[1] - kept.shape[1] :] = kept
    return loss


def turn_masks(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first and the last model turn's labelled positions in ``labels[:, 1:]``: a trace row's
    labels are two runs, the tool's reply (unlabelled) between them; a row whose first turn was
    given (untrained) has one run, its last turn."""
    trained = labels[:, 1:] != IGNORE_INDEX
    first, last = torch.zeros_like(trained), torch.zeros_like(trained)
    for row in range(trained.shape[0]):
        positions = trained[row].nonzero().flatten().tolist()
        gaps = [b for a, b in itertools.pairwise(positions) if b != a + 1]
        cut = gaps[0] if gaps else positions[0]
        for position in positions:
            (first if position < cut else last)[row, position] = True
    return first, last


LOOKUP_START, LOOKUP_END = "by colour:", "In time order"


def lookup_mask(batch: dict[str, Any], last: torch.Tensor, tokenizer: Any) -> torch.Tensor:
    """The last turn's positions predicting the colour-by-colour lookup: the tokens whose text lies
    after :data:`LOOKUP_START` and before :data:`LOOKUP_END` (aligned with ``labels[:, 1:]``)."""
    targets = batch["input_ids"][:, 1:]
    lookup = torch.zeros_like(last)
    for row in range(last.shape[0]):
        positions = last[row].nonzero().flatten().tolist()
        pieces = [tokenizer.decode([int(targets[row, position])]) for position in positions]
        text = "".join(pieces)
        start, end = text.find(LOOKUP_START), text.find(LOOKUP_END)
        if start < 0 or end < start:
            continue  # no lookup in this turn (a trace that did not find the stretch)
        start += len(LOOKUP_START)
        offset = 0
        for position, piece in zip(positions, pieces, strict=True):
            lookup[row, position] = start <= offset and offset + len(piece) <= end
            offset += len(piece)
    return lookup


def mean_cell(loss: torch.Tensor, mask: torch.Tensor) -> str:
    return f"{float(loss[mask].mean()):.4f}" if bool(mask.any()) else "-"


def answer_letter_mask(batch: dict[str, Any], tokenizer: Any) -> torch.Tensor:
    """The labelled positions predicting the token right after ``<answer>``."""
    answer_open = tokenizer("<answer>", add_special_tokens=False)["input_ids"][-1]
    return (batch["input_ids"][:, :-1] == answer_open) & (batch["labels"][:, 1:] != IGNORE_INDEX)


def rotate_videos(pixels: torch.Tensor, grids: torch.Tensor, which: list[int]) -> torch.Tensor:
    """``pixels`` with videos ``which`` (indices into ``grids``, all of one shape) each replaced by
    the next one's, the last by the first's."""
    offsets = [0, *grids.prod(dim=-1).cumsum(0).tolist()]
    chunks = [pixels[offsets[v] : offsets[v + 1]] for v in which]
    if len({tuple(c.shape) for c in chunks}) != 1:
        raise ValueError("the videos to rotate differ in shape")
    rotated = pixels.clone()
    for video, chunk in zip(which, chunks[1:] + chunks[:1], strict=True):
        rotated[offsets[video] : offsets[video + 1]] = chunk
    return rotated


def trace_rows(module: SFTModule, batch: dict[str, Any], tokenizer: Any) -> list[list[str]]:
    """Per input setting, the mean loss of the first turn, the last turn, its lookup and the answer
    letter."""
    first, last = turn_masks(batch["labels"])
    lookup = lookup_mask(batch, last, tokenizer)
    letter = answer_letter_mask(batch, tokenizer)
    pixels, grids = batch["target_pixel_values_videos"], batch["target_video_grid_thw"]
    if len(grids) != 2 * len(batch["input_ids"]):
        raise ValueError("every row needs its tool trace (an overview and a served segment each)")
    overviews, segments = list(range(0, len(grids), 2)), list(range(1, len(grids), 2))
    settings: list[tuple[str, Callable[[], torch.Tensor]]] = [
        ("right videos", lambda: pixels),
        ("another row's overview", lambda: rotate_videos(pixels, grids, overviews)),
        ("another row's segment", lambda: rotate_videos(pixels, grids, segments)),
    ]
    rows = []
    for name, pixels_of in settings:
        loss = per_token_loss(module, dict(batch, target_pixel_values_videos=pixels_of()))
        rows.append([name, *(mean_cell(loss, mask) for mask in (first, last, lookup, letter))])
    return rows


def direct_rows(module: SFTModule, batch: dict[str, Any], tokenizer: Any) -> list[list[str]]:
    """Per input setting, the target's and the answer letter's mean loss (one video per row)."""
    trained = batch["labels"][:, 1:] != IGNORE_INDEX
    letter = answer_letter_mask(batch, tokenizer)
    pixels, grids = batch["pixel_values_videos"], batch["video_grid_thw"]
    rows = []
    other = rotate_videos(pixels, grids, list(range(len(grids))))
    for name, video in (("right video", pixels), ("another row's video", other)):
        loss = per_token_loss(module, dict(batch, pixel_values_videos=video))
        rows.append([name, f"{float(loss[trained].mean()):.4f}", f"{float(loss[letter].mean()):.4f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="an exported model directory (the run's hf/)")
    parser.add_argument("--data", default="data/zoom", help="the zoom task's shards")
    parser.add_argument("--split", default="val")
    parser.add_argument("--rows", type=int, default=64, help="questions scored (one batch)")
    parser.add_argument("--frames", type=int, default=OVERVIEW_FRAMES, help="frames of the prompt's video")
    parser.add_argument("--direct", action="store_true", help="score the direct target, no tool trace")
    parser.add_argument(
        "--given", action="store_true", help="only rows whose trace was given its first request"
    )
    args = parser.parse_args()
    if args.direct and args.given:
        parser.error("--given scores tool traces; --direct has none")

    processor = AutoProcessor.from_pretrained(args.model)
    module = SFTModule(args.model)
    module.configure_model()
    module.eval()
    stream = VideoQAStream(
        resolve_shards(f"{args.data}/{args.split}-*.tar"),
        num_frames=args.frames,
        max_pixels=MAX_PIXELS,
        keep_video_bytes=not args.direct,
    )
    samples = []
    for sample in stream:
        if args.given and not marked_first_turn_given(sample.row.extra.get("tool_trace")):
            continue
        samples.append(sample)
        if len(samples) == args.rows:
            break
    if len(samples) < 2:
        raise SystemExit(f"{args.data}: fewer than 2 {args.split} questions")
    # Served frames at the data's pixel budget and the family's patch rounding, as the datamodule serves them.
    traces = None if args.direct else ToolTraces(MAX_PIXELS, module.family.merged_patch_pixels)
    batch = VideoQACollator(processor, family=module.family, tool_traces=traces)(samples)
    tokenizer = processor.tokenizer
    if args.direct:
        columns = ["inputs", "target loss", "answer letter loss"]
        rows = direct_rows(module, batch, tokenizer)
    else:
        columns = ["inputs", "first turn loss", "last turn loss", "lookup loss", "answer letter loss"]
        rows = trace_rows(module, batch, tokenizer)
    given = " given their first request" if args.given else ""
    print(f"{args.model}: {len(samples)} {args.split} questions{given} (answer letter at chance: 1.386)")
    print(render_table(Table([Column(c) for c in columns], rows)))


if __name__ == "__main__":
    main()
