"""Where a zoom-task model asks first, read from its probabilities instead of its samples.

For each question, the first turn of a random trace ("I need a closer look at one stretch." and a
request) is scored teacher-forced for each of the video's stretches, after the question and its
16-frame overview; normalised over the stretches, these are the model's odds of asking for each
one first. Printed per model: the mean probability of the blue stretch (the one the answer is
in), the share of questions whose most likely first request is the blue stretch, and the mean
entropy of the request distribution (ln 8 = 2.079 for eight stretches asked alike). The blue
stretch is drawn uniformly, so a model whose first request ignores the overview gives it 1/8 on
average, whatever stretches it prefers. With several models, each after the first is compared
with the first on the same questions: the mean change of the blue stretch's probability (a
paired t-test over the questions) and of the questions where it is the most likely request
(exact McNemar).

This sees a shift that sampling would need thousands of episodes to show (a sampled span hit of
25% moves by a standard error of 5 points over one step's 64 episodes), so it says whether a GRPO
run moved the request toward the overview's blue at all. Only the first request is scored: a
second one follows the reply to the first.

Usage: python bench/zoom_request_probe.py --model [NAME=]DIR [--model ...] [--data data/zoom]
       [--split val] [--rows 200] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformers import AutoProcessor

from app.commands.report import format_p_value, paired_comparison
from bench.zoom_reading import MAX_PIXELS, OVERVIEW_FRAMES, per_token_loss, turn_masks
from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQASample, VideoQAStream
from datamodules.tool_traces import ToolTraces
from datatools.zoom_task import FIRST_THOUGHT, FOUND, ZoomConfig, request_turn, slot_span
from evaluation.provenance import provenance
from evaluation.significance import paired_seeds
from evaluation.tables import Column, Table, render_table
from models.sft import SFTModule


def landmark_slot(config: ZoomConfig, sample: VideoQASample) -> int:
    """The stretch holding the answer (``extra["relevant_span_s"]``, as the task writes it)."""
    start_s, _ = sample.row.extra["relevant_span_s"]
    slot = round(start_s / slot_span(config, 1)[0])
    if slot_span(config, slot)[0] != start_s:
        raise ValueError(f"{sample.key}: its relevant span starts at {start_s} s, not on a stretch")
    return slot


def first_requests(config: ZoomConfig, sample: VideoQASample) -> Iterator[VideoQASample]:
    """``sample`` once per stretch, its trace a single first turn asking for that stretch (what
    follows the request does not change the first turn's probability)."""
    for slot in range(config.slots):
        start_s, end_s = slot_span(config, slot)
        trace = {
            "kind": "random",
            "turns": [request_turn(config, FIRST_THOUGHT, slot)],
            "final_reasoning": FOUND,
            "answer": sample.row.answer,
            "requests": [{"start_s": start_s, "end_s": end_s, "fps": config.request_fps}],
        }
        row = dataclasses.replace(sample.row, extra={**sample.row.extra, "tool_trace": trace})
        yield dataclasses.replace(sample, row=row)


def request_log_probs(
    module: SFTModule, collator: VideoQACollator, candidates: list[VideoQASample]
) -> torch.Tensor:
    """Log-probability of each candidate's first turn, normalised over the candidates."""
    batch = collator(candidates)
    if len(batch["input_ids"]) != len(candidates):
        raise ValueError("a candidate's trace could not be served")
    first, _ = turn_masks(batch["labels"])
    turn = -(per_token_loss(module, batch) * first).sum(dim=1)
    return torch.log_softmax(turn.double(), dim=0)


@dataclasses.dataclass(frozen=True)
class ModelRequests:
    """One model's first-request distribution over the stretches, per question."""

    name: str
    blue: list[float]
    """Log-probability of the blue stretch, per question."""
    top_is_blue: list[bool]
    entropy: list[float]

    def row(self) -> list[str]:
        count = len(self.blue)
        return [
            self.name,
            f"{sum(math.exp(v) for v in self.blue) / count:.4f}",
            f"{sum(self.top_is_blue) / count:.3f}",
            f"{sum(self.entropy) / count:.3f}",
        ]


def score(name: str, model: str, samples: list[VideoQASample], config: ZoomConfig) -> ModelRequests:
    processor = AutoProcessor.from_pretrained(model)
    module = SFTModule(model)
    module.configure_model()
    module.eval()
    traces = ToolTraces(MAX_PIXELS, module.family.merged_patch_pixels)
    collator = VideoQACollator(processor, family=module.family, tool_traces=traces)
    blue, top, entropy = [], [], []
    for sample in samples:
        log_probs = request_log_probs(module, collator, list(first_requests(config, sample)))
        slot = landmark_slot(config, sample)
        blue.append(float(log_probs[slot]))
        top.append(int(log_probs.argmax()) == slot)
        entropy.append(float(-(log_probs.exp() * log_probs).sum()))
    return ModelRequests(name, blue, top, entropy)


def paired_line(base: ModelRequests, new: ModelRequests) -> str:
    """Per question, the change of the blue stretch's probability (a paired t-test: probabilities
    are bounded, so a few questions moved far cannot carry it as log-probabilities can), and the
    questions whose most likely first request became or stopped being the blue stretch (exact
    McNemar)."""
    # The paired t-test the bench uses over seeds, here over questions.
    test = paired_seeds([math.exp(b) for b in base.blue], [math.exp(n) for n in new.blue])
    count, mean = len(test.differences), test.mean
    spread = statistics.stdev(test.differences)
    top = paired_comparison(
        {str(i): v for i, v in enumerate(base.top_is_blue)},
        {str(i): v for i, v in enumerate(new.top_is_blue)},
    )
    return (
        f"- {new.name} vs {base.name}, same {count} questions: P(blue stretch) {mean:+.4f} per question "
        f"(sd {spread:.4f}), paired t-test {format_p_value(test.p_value)}; blue stretch most likely in "
        f"{top.only_new} questions only after, {top.only_base} only before, exact McNemar "
        f"{format_p_value(top.p_value)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[NAME=]DIR",
        help="an export (hf/), named in the table by NAME (else its path); repeat to compare",
    )
    parser.add_argument("--data", default="data/zoom", help="the zoom task's shards (its dataset.json)")
    parser.add_argument("--split", default="val")
    parser.add_argument("--rows", type=int, default=200, help="questions scored")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args()
    config = ZoomConfig.from_json(json.loads((Path(args.data) / "dataset.json").read_text())["config"])
    stream = VideoQAStream(
        resolve_shards(f"{args.data}/{args.split}-*.tar"),
        num_frames=OVERVIEW_FRAMES,
        max_pixels=MAX_PIXELS,
        keep_video_bytes=True,
    )
    samples = []
    for sample in stream:
        samples.append(sample)
        if len(samples) == args.rows:
            break
    if len(samples) < 2:
        raise SystemExit(f"{args.data}: fewer than 2 {args.split} questions")
    named = [
        (spec.partition("=")[0], spec.partition("=")[2]) if "=" in spec else (spec, spec)
        for spec in args.model
    ]
    results = [score(name, model, samples, config) for name, model in named]
    origin = provenance(["python", "bench/zoom_request_probe.py", *sys.argv[1:]])
    columns = ["model", "P(blue stretch) mean", "blue stretch most likely", "entropy (nats)"]
    lines = [
        f"Written by `{origin['command']}` at {origin['commit']} on {origin['date']} "
        f"({origin['machine']['cpu']}, {origin['machine']['cores']} cores).",
        f"First request over the {config.slots} stretches, {len(samples)} {args.split} questions of "
        f"{args.data} (no information: P(blue stretch) 1/{config.slots} = {1 / config.slots:.4f} on "
        f"average; entropy at most ln {config.slots} = {math.log(config.slots):.3f}).",
        render_table(Table([Column(c) for c in columns], [r.row() for r in results])),
    ]
    if len(results) > 1:
        lines.append("\n".join(paired_line(results[0], new) for new in results[1:]))
    text = "\n\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
