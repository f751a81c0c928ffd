"""What asking for frames saves on the trainer side, at a real model width.

FrameThinker-style tool use answers from a sparse overview plus the frames it asks for (~48
frames seen) where a dense model reads 256 to 512; the zoom task's runs (docs/tool-use.md, "Frames on
request") show the accuracy side on small models. This measures the other side, the trainer's
cost per GRPO group, with random-weight Qwen3-VL models at the published 2B/4B widths (built
here from transformers' own config classes: nothing is downloaded), for each case:

1. **encode**: the vision tower over the case's videos once, under ``torch.no_grad()``, as the
   trainer fills its cache (:func:`models.vision.encode_videos`; a tool reply's segment through
   :class:`rollout.episodes.FrameTool`, one tower call per distinct span): wall time and peak
   memory above what was allocated before (the pixels already on the device);
2. **scoring**: the GRPO policy pass over one group of G rows of one prompt
   (:func:`models.logprobs.completion_logprobs` on the rows :func:`rollout.experience.scoring_rows`
   builds, the entropy filled beside as ``GRPOModule._score`` does), then ``.sum().backward()``,
   with gradient checkpointing on and the vision tower frozen as the GPU configs run it: wall
   time and peak memory above what the pass starts with (the weights and the cached
   encodings), the language model's gradients (as large as its weights) included.

Cases: ``dense-N`` (one N-frame video sampled evenly from the source video, the question, and G
completions of ``--completion`` sampled tokens) and ``tool`` (the zoom task's episode: a
``--overview``-frame video and the tool-use prompt; each of the G episodes is a request turn of
``--request-tokens``, the tool's reply holding ``--served`` consecutive frames of one stretch at
their true times, then a last turn making up the rest of ``--completion``). The tool episodes
are played by :func:`rollout.episodes.run_episodes` with the turns scripted (random ids, no
special tokens), so the rows are exactly those a tool-use GRPO step scores.

As the trainer does (``GRPOModule._shares_prompts``), the policy pass shares each prompt's keys
and values among its G rows only without gradient checkpointing: transformers keeps no cache
through checkpointed layers, so with it (the default here, as in every GPU config) each row is
forwarded whole. ``--no-checkpointing`` measures the shared-prompt pass instead.

Frames are synthetic uint8 arrays through the family's real processor at ``--frame-size``
(448x448 by default: 14x14 = 196 tokens per two-frame temporal patch). The released processor's
per-video budget (768 x 32 x 32 x 32 pixels) would shrink more than 124 such frames; here it is
raised so that every case sees its frames at that size (``--released-budget`` keeps it). The
timed run of each case is its second: the smallest case runs once untimed first, and every case
is timed once (the smallest one thus on its second run). The host-to-device copy of the pixels
is outside the timers; the processor's CPU work is reported as ``prep_s``.

Not measured: optimizer states, the reference pass and rollouts (``lvrl plan``,
:mod:`planner.memory`, plans the whole step's memory): this is one scoring pass of one group.

Run on a GPU::

    python bench/zoom_cost.py --model qwen3-vl-4b [--json zoom_cost.json] [--micro-batch-rows 2]

and on a CPU (the check the unit test runs)::

    python bench/zoom_cost.py --model tiny --dense 8 --overview 4 --served 4 --frame-size 64x64 \\
        --completion 80 --group 2

(the request alone takes 57 of lvrl's local tokens, so the tool case needs ``--completion`` above it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.layout import PromptLayout, ScoringBatch
from core.tool_use.episode import Episode
from core.tool_use.requests import CALL_CLOSE, CALL_OPEN, TOOL_NAME, FrameBudget
from datamodules.prompts import encode_video_prompt
from datamodules.rows import QARow
from families import ModelFamily, family_of
from models.build import PRESETS, build_model, count_parameters
from models.logprobs import completion_logprobs
from models.published import QWEN3_VL_PUBLISHED, build_published
from models.vision import encode_videos, vision_tower
from rollout.base import RolloutRequest, SamplingConfig
from rollout.episodes import EpisodeVideo, FrameTool, run_episodes
from rollout.experience import scoring_rows
from rollout.scripted import ScriptedEngine

T = TypeVar("T")
FAMILY = "qwen3_vl"
GIB = 1024**3
# The real-width models (models.published): their tokenizer is lvrl's local one; its texts take
# more tokens than Qwen's, a few hundred in a prompt of thousands of video tokens.
MAX_POSITIONS = 262144
"""A bound above the longest case (a 512-frame prompt is ~50k tokens): the default RoPE reads no
table, so the number is only a limit."""

QUESTION = QARow(
    problem_id="zoom-cost",
    video="synthetic.mp4",
    problem="In the blue stretch, which colour is the first marker?",
    problem_type="multiple choice",
    reasoning="",
    answer="A",
    options=("red", "green", "yellow", "white"),
)
"""A zoom-task question (its text only matters for the prompt's length)."""


# -- the command line -----------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Trainer-side cost of dense frames vs frames on request (see the module docstring)."
    )
    parser.add_argument("--model", choices=[*QWEN3_VL_PUBLISHED, *PRESETS], default="qwen3-vl-2b")
    parser.add_argument(
        "--dense", type=int, nargs="+", default=[64, 256, 512], help="frames of each dense case"
    )
    parser.add_argument("--overview", type=int, default=16, help="frames of the tool case's prompt video")
    parser.add_argument(
        "--served", type=int, default=32, help="consecutive frames the tool serves per episode"
    )
    parser.add_argument("--completion", type=int, default=256, help="sampled tokens per row")
    parser.add_argument(
        "--request-tokens",
        type=int,
        default=64,
        help="tokens of the tool case's request turn (at least the request's own)",
    )
    parser.add_argument("--group", type=int, default=8, help="rows per group (G)")
    parser.add_argument("--frame-size", default="448x448", help="WIDTHxHEIGHT, multiples of 32")
    parser.add_argument("--video-frames", type=int, default=1024, help="frames of the source video")
    parser.add_argument("--fps", type=float, default=2.0, help="frame rate of the source video")
    parser.add_argument(
        "--spans",
        choices=("same", "distinct"),
        default="same",
        help="same: every episode asks for the same stretch (encoded once, as on the zoom task); "
        "distinct: each asks for its own (G tower calls)",
    )
    parser.add_argument("--micro-batch-rows", type=int, default=None, help="rows per forward/backward (all)")
    parser.add_argument("--no-checkpointing", action="store_true", help="shared-prompt pass, no recompute")
    parser.add_argument("--released-budget", action="store_true", help="keep the released pixel budget")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-budget", type=float, default=None, help="seconds; later cases are skipped")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    args.width, args.height = (int(side) for side in args.frame_size.lower().split("x"))
    args.dtype = args.dtype or ("bfloat16" if torch.device(args.device).type == "cuda" else "float32")
    if min(args.dense, default=2) < 2 or args.overview < 2 or args.served < 2:
        parser.error("a video needs at least 2 frames (one temporal patch)")
    if not 0 <= args.request_tokens < args.completion:
        parser.error("--request-tokens must be below --completion (the last turn needs some)")
    if args.served > args.video_frames or max(args.dense, default=0) > args.video_frames:
        parser.error("a case asks for more frames than the source video has")
    return args


def log(message: str, started: float) -> None:
    """A progress line now (the run is remote and has a time limit)."""
    print(f"[zoom_cost {time.monotonic() - started:7.1f}s] {message}", flush=True)


# -- models ---------------------------------------------------------------------------------------
def build(args: argparse.Namespace) -> tuple[torch.nn.Module, Any]:
    """``(model, processor)`` on the device, in the dtype, sdpa attention, in training mode with
    the vision tower frozen and (unless told not to) gradient checkpointing, as
    ``VLMModule.configure_model`` leaves the policy."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.model in QWEN3_VL_PUBLISHED:
        model, processor = build_published(args.model, device, dtype, args.seed)
    else:
        # `lvrl model build --family qwen3_vl --preset NAME`'s model, in memory.
        model, processor = build_model(args.model, seed=args.seed, family=FAMILY)
        model = model.to(device=device, dtype=dtype)
    if any(p.dtype != dtype or p.device.type != device.type for p in model.parameters()):
        raise AssertionError(f"the model is not all {dtype} on {device}")
    model.set_attn_implementation("sdpa")
    model.train()
    vision_tower(model).requires_grad_(False)
    if not args.no_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    processor.tokenizer.model_max_length = MAX_POSITIONS  # no length warnings for long prompts
    return model, processor


def language_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters that train (the vision tower is frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


# -- measuring ------------------------------------------------------------------------------------
@dataclass
class Measure:
    """Time and peak memory of one stage (summed over its calls; the largest peak)."""

    ms: float = 0.0
    peak_gib: float | None = None
    """Above what was allocated when the stage began; None on a CPU (not measured)."""


@contextlib.contextmanager
def measured(device: torch.device, into: Measure) -> Iterator[None]:
    """Add the block's wall time (and, on CUDA, its peak allocation above the start) to ``into``."""
    cuda = device.type == "cuda"
    base = 0
    if cuda:
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    yield
    if cuda:
        torch.cuda.synchronize(device)
    into.ms += (time.perf_counter() - start) * 1e3
    if cuda:
        peak = (torch.cuda.max_memory_allocated(device) - base) / GIB
        into.peak_gib = max(into.peak_gib or 0.0, peak)


@dataclass
class TimedEncoder:
    """The trainer's vision-tower call for its cache, timed: the prompt's video and the tool's
    segments (:class:`rollout.episodes.FrameTool`'s ``encode``) go through it."""

    model: torch.nn.Module
    device: torch.device
    measure: Measure = field(default_factory=Measure)
    calls: int = 0

    def __call__(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        pixels = pixels.to(self.device)  # a batch is on the device before the trainer encodes it
        with torch.no_grad(), measured(self.device, self.measure):
            encoded = encode_videos(self.model, pixels, grid_thw)
        self.calls += 1
        return encoded


# -- inputs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyntheticVideo:
    """A ``frames``-frame source video at ``fps``: frame ``i`` is a diagonal ramp shifted by
    ``i`` (distinct frames, made only when asked for, like a decoder)."""

    frames: int
    fps: float
    height: int
    width: int

    def read(self, indices: Sequence[int]) -> np.ndarray:
        # In uint8 throughout (additions wrap at 256): 512 frames of 448x448 are 308 MB, and
        # int64 intermediates would be eight times that.
        ramp = (np.add.outer(np.arange(self.height), np.arange(self.width)) % 256).astype(np.uint8)
        shift = ((np.asarray(indices).reshape(-1, 1) * 5 + np.array([0, 85, 170])) % 256).astype(np.uint8)
        return ramp[None, :, :, None] + shift[:, None, None, :]

    def source(self) -> EpisodeVideo:
        return EpisodeVideo("synthetic", self.fps, self.frames, self.read)


def even_indices(total: int, count: int) -> list[int]:
    """``count`` frame indices spread evenly over ``total`` frames, from the first.

    >>> even_indices(1024, 4)
    [0, 256, 512, 768]
    """
    return [i * total // count for i in range(count)]


@dataclass
class VideoPrompt:
    """A prompt as the collator makes it, with its video's pixels."""

    layout: PromptLayout
    pixels: torch.Tensor
    grid_thw: torch.Tensor
    """``(1, 3)``."""


def video_prompt(
    processor: Any, family: ModelFamily, video: SyntheticVideo, indices: list[int], tool_use: bool
) -> VideoPrompt:
    """The prompt of ``indices``' frames and :data:`QUESTION`, encoded and laid out as the
    collator does (:func:`datamodules.prompts.encode_video_prompt`)."""
    metadata = {
        "fps": video.fps,
        "total_num_frames": video.frames,
        "frames_indices": indices,
        "duration": video.frames / video.fps,
        "height": video.height,
        "width": video.width,
    }
    encoded = encode_video_prompt(
        processor, QUESTION, video.read(indices), metadata, tool_use=tool_use, family=family
    )
    layout = PromptLayout.from_processor_output(
        encoded,
        0,
        processor.tokenizer.convert_tokens_to_ids(family.video_token),
        family.position_rule,
        encoded["template_ids"],
        encoded["timestamps"],
    )
    return VideoPrompt(layout, encoded["pixel_values_videos"], encoded["video_grid_thw"])


def plain_token_ids(tokenizer: Any, family: ModelFamily) -> torch.Tensor:
    """Ids a sampled turn may hold: no special, added (tags) or vision token, so no random turn
    ends in a request or reads as a video slot."""
    banned = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    banned |= set(family.vision_token_ids(tokenizer))
    return torch.tensor([i for i in range(len(tokenizer)) if i not in banned])


def request_text(start: float, end: float) -> str:
    """A frame request as the model writes it (docs/tool-use.md, "Frames on request"), in its shortest
    form: seconds, no rate (the tool's budget gives the source's). lvrl's local tokenizer spells
    JSON almost a character a token (57 tokens here, about half that in Qwen's).

    >>> print(request_text(256, 272))
    <tool_call>
    {"name": "get_frames", "arguments": {"start": 256, "end": 272}}
    </tool_call>
    """
    arguments = f'{{"start": {start:g}, "end": {end:g}}}'
    return f'{CALL_OPEN}\n{{"name": "{TOOL_NAME}", "arguments": {arguments}}}\n{CALL_CLOSE}'


@dataclass
class Case:
    """One case's inputs, made once (the warm-up and the timed run use the same)."""

    name: str
    frames_seen: int
    prompt: VideoPrompt
    turns: list[list[list[int]]]
    """Per row, its sampled turns: one for a dense row; the request and the last turn for a tool episode."""
    served: int = 0
    """Frames each episode asks for (0: a dense case)."""
    prep_s: float = 0.0


def random_turn(plain: torch.Tensor, length: int, generator: torch.Generator) -> list[int]:
    return plain[torch.randint(len(plain), (length,), generator=generator)].tolist()


def dense_case(setup: Setup, frames: int) -> Case:
    video, args = setup.video, setup.args
    prompt = video_prompt(setup.processor, setup.family, video, even_indices(video.frames, frames), False)
    turns = [[random_turn(setup.plain, args.completion, setup.generator)] for _ in range(args.group)]
    return Case(f"dense-{frames}", frames, prompt, turns)


def stretch_start(video: SyntheticVideo, served: int, row: int, spans: str) -> int:
    """First frame of the stretch row ``row`` asks for: the middle stretch of ``served``
    frames, or (``distinct``) the ``row``-th after it, wrapping round the video."""
    stretches = video.frames // served
    return ((stretches // 2 + (row if spans == "distinct" else 0)) % stretches) * served


def tool_case(setup: Setup) -> Case:
    video, args, tokenizer = setup.video, setup.args, setup.processor.tokenizer
    indices = even_indices(video.frames, args.overview)
    prompt = video_prompt(setup.processor, setup.family, video, indices, True)
    turns = []
    for row in range(args.group):
        first = stretch_start(video, args.served, row, args.spans)
        text = request_text(first / video.fps, (first + args.served) / video.fps)
        call = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        # The turn thinks (random tokens), then writes the request; the engine stops at its tag.
        thinking = max(0, args.request_tokens - len(call))
        request = random_turn(setup.plain, thinking, setup.generator) + call
        if len(request) >= args.completion:
            raise ValueError(f"a {len(request)}-token request leaves no last turn: raise --completion")
        last = random_turn(setup.plain, args.completion - len(request), setup.generator)
        turns.append([request, last])
    return Case("tool", args.overview + args.served, prompt, turns, served=args.served)


# -- running a case -------------------------------------------------------------------------------
@dataclass
class Setup:
    args: argparse.Namespace
    model: torch.nn.Module
    processor: Any
    family: ModelFamily
    device: torch.device
    video: SyntheticVideo
    plain: torch.Tensor
    generator: torch.Generator
    share_prompts: bool


@dataclass
class CaseResult:
    """One row of the table (and of the JSON's ``cases``)."""

    case: str
    frames_seen: int
    status: str = "ok"
    frames_encoded: int | None = None
    video_tokens: int | None = None
    """Video slots in a row (its prompt's video and its segments)."""
    seq_len: int | None = None
    """Tokens in the longest row (prompt and completion, replies included)."""
    prompt_tokens: int | None = None
    reply_tokens: int | None = None
    """Tokens the tool wrote into a row (read, not trained; 0 in a dense row)."""
    encode_ms: float | None = None
    encode_peak_gib: float | None = None
    score_ms: float | None = None
    score_peak_gib: float | None = None
    lm_params_with_grad: int | None = None
    """Trainable tensors whose gradient is non-zero after the pass."""
    logprob_sum: float | None = None
    prep_s: float | None = None


@dataclass
class CaseRun:
    """A case's result with the rows it scored (for tests)."""

    result: CaseResult
    batch: ScoringBatch | None = None
    episodes: list[Episode] | None = None


def run_case(setup: Setup, case: Case) -> CaseRun:
    """Encode the case's videos, build its rows and score them once; a stage that runs out of
    device memory is reported as such and its memory given back."""
    result = CaseResult(case.name, case.frames_seen, prep_s=round(case.prep_s, 3))
    run = CaseRun(result)
    encoder = TimedEncoder(setup.model, setup.device)
    laid_out = attempt(lambda: encode_and_lay_out(setup, case, encoder))
    if laid_out is None:
        result.status = "OOM (encode)"
        release(setup)
        return run
    embeds, run.batch, run.episodes, segments, result.frames_encoded = laid_out
    result.encode_ms, result.encode_peak_gib = encoder.measure.ms, encoder.measure.peak_gib
    result.video_tokens = int(run.batch.video_mask[0].sum())
    result.seq_len = int(run.batch.attention_mask.sum(dim=1).max())
    result.prompt_tokens = len(case.prompt.layout)
    result.reply_tokens = run.batch.completion_lengths()[0] - int(run.batch.completion_mask[0].sum())
    scored = attempt(lambda: score_group(setup, run.batch, embeds, segments))
    if scored is None:
        result.status = "OOM (scoring)"
        release(setup)
        return run
    measure, result.logprob_sum = scored
    result.score_ms, result.score_peak_gib = measure.ms, measure.peak_gib
    result.lm_params_with_grad = sum(
        int(p.grad is not None and bool(p.grad.ne(0).any())) for p in language_parameters(setup.model)
    )
    setup.model.zero_grad(set_to_none=True)
    return run


def attempt(stage: Callable[[], T]) -> T | None:
    """``stage()``, or None when the device ran out of memory. Returned from here, the error and
    the activations its traceback held are gone, so :func:`release` can give their memory back."""
    try:
        return stage()
    except torch.OutOfMemoryError:
        return None


def encode_and_lay_out(
    setup: Setup, case: Case, encoder: TimedEncoder
) -> tuple[torch.Tensor, ScoringBatch, list[Episode] | None, list[list[torch.Tensor]] | None, int]:
    """The prompt's video encoded, then the group's rows (:func:`group_rows`, which encodes the
    tool's segments)."""
    (embeds,) = encoder(case.prompt.pixels, case.prompt.grid_thw)
    return (embeds, *group_rows(setup, case, embeds, encoder))


def group_rows(
    setup: Setup, case: Case, embeds: torch.Tensor, encoder: TimedEncoder
) -> tuple[ScoringBatch, list[Episode] | None, list[list[torch.Tensor]] | None, int]:
    """The group's scoring rows as a GRPO step builds them, each row's segment encodings (None
    for dense rows) and the frames the tower encoded."""
    layout, pad = case.prompt.layout, setup.processor.tokenizer.pad_token_id
    engine = ScriptedEngine(case.turns)
    if not case.served:
        completions = [engine.completion(row[0]) for row in case.turns]
        batch, _ = scoring_rows([layout], completions, None, [0] * len(completions), pad, 1)
        return batch, None, None, case.frames_seen
    # One request per episode, served whole at the source's rate (consecutive frames).
    budget = FrameBudget(1, case.served, case.served, default_fps=setup.video.fps)
    tool = FrameTool(budget, setup.processor, setup.family, encoder)
    sampling = SamplingConfig(
        n=len(case.turns), max_new_tokens=max(len(t) for row in case.turns for t in row)
    )
    request = RolloutRequest(layout, layout.encoded_video(embeds))
    groups, stats = run_episodes(engine, [request], [setup.video.source()], sampling, tool)
    if stats.rejected or stats.requests != len(case.turns):
        raise RuntimeError(f"the tool did not serve every request: {stats}")
    episodes = groups[0]
    completions = [
        engine.completion([t for t, s in zip(e.token_ids, e.sampled, strict=True) if s]) for e in episodes
    ]
    batch, _ = scoring_rows([layout], completions, episodes, [0] * len(episodes), pad, 1)
    segments = [[segment.embeds for segment in e.segments] for e in episodes]
    return batch, episodes, segments, case.frames_seen - case.served + stats.encoded_frames


def score_group(
    setup: Setup, batch: ScoringBatch, embeds: torch.Tensor, segments: list[list[torch.Tensor]] | None
) -> tuple[Measure, float]:
    """The policy pass and its backward over the group, in micro-batches of
    ``--micro-batch-rows`` rows (the trainer's gradient accumulation); the log-probs' sum."""
    setup.model.zero_grad(set_to_none=True)
    rows = list(range(len(batch.prompt_of_row)))
    size = setup.args.micro_batch_rows or len(rows)
    measure, total = Measure(), 0.0
    with measured(setup.device, measure):
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            rows_batch = batch.select(chunk)
            logprobs = completion_logprobs(
                setup.model,
                rows_batch,
                [embeds],
                # GRPOModule._score fills the entropy of every completion token too (no grad).
                entropy=torch.zeros(rows_batch.completion_mask.shape, device=setup.device),
                share_prompts=setup.share_prompts,
                segment_embeds=[segments[r] for r in chunk] if segments is not None else None,
            )
            logprobs.sum().backward()
            total += float(logprobs.detach().sum())
    return measure, total


def release(setup: Setup) -> None:
    """Give back what a failed stage held (its gradients, the allocator's cached blocks)."""
    setup.model.zero_grad(set_to_none=True)
    gc.collect()
    if setup.device.type == "cuda":
        torch.cuda.empty_cache()


# -- the report -----------------------------------------------------------------------------------
COLUMNS = (
    ("case", "case", "{}"),
    ("frames", "frames_seen", "{}"),
    ("encoded", "frames_encoded", "{}"),
    ("video tok", "video_tokens", "{}"),
    ("seq len", "seq_len", "{}"),
    ("encode ms", "encode_ms", "{:.1f}"),
    ("enc GiB", "encode_peak_gib", "{:.2f}"),
    ("score ms", "score_ms", "{:.1f}"),
    ("score GiB", "score_peak_gib", "{:.2f}"),
    ("status", "status", "{}"),
)
RATIOS = [(head, key) for head, key, _ in COLUMNS[3:-1]]
"""The columns a dense case is compared on with the tool case (dense / tool)."""


SCORE_KEYS = ("score_ms", "score_peak_gib")
FAILED_KEYS = {"OOM (encode)": ("encode_ms", "encode_peak_gib", *SCORE_KEYS), "OOM (scoring)": SCORE_KEYS}
"""The cells a stage that ran out of memory leaves without a number (the stages after it too)."""


def cell(result: CaseResult, key: str, form: str, cuda: bool) -> str:
    value = getattr(result, key)
    if value is not None:
        return form.format(value)
    if key in FAILED_KEYS.get(result.status, ()):
        return "OOM"
    if key.endswith("peak_gib") and not cuda and not result.status.startswith("skipped"):
        return "n/a"  # not measured on a CPU
    return "-"


def table(results: Sequence[CaseResult], cuda: bool) -> str:
    rows = [[head for head, _, _ in COLUMNS]]
    rows += [[cell(r, key, form, cuda) for _, key, form in COLUMNS] for r in results]
    lines = aligned(rows)
    tool = next((r for r in results if r.case == "tool"), None)
    if tool is not None:
        compared = [["dense / tool", *(head for head, _ in RATIOS)]]
        compared += [[r.case, *(ratio(r, tool, key) for _, key in RATIOS)] for r in results if r is not tool]
        lines += ["", *aligned(compared)]
    return "\n".join(lines)


def summary(result: CaseResult) -> str:
    """One progress line of a finished case."""
    parts = [f"{key}={getattr(result, key)}" for key in ("frames_encoded", "video_tokens", "seq_len")]
    for key in ("encode_ms", "encode_peak_gib", "score_ms", "score_peak_gib"):
        value = getattr(result, key)
        parts.append(f"{key}={'-' if value is None else f'{value:.2f}'}")
    return f"{result.status}: " + " ".join(parts)


def aligned(rows: list[list[str]]) -> list[str]:
    """Text columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]


def ratio(dense: CaseResult, tool: CaseResult, key: str) -> str:
    a, b = getattr(dense, key), getattr(tool, key)
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


# -- main -----------------------------------------------------------------------------------------
@dataclass
class Report:
    """What :func:`main` returns: the JSON's numbers and each case's last run."""

    numbers: dict[str, Any]
    runs: dict[str, CaseRun]
    tokenizer: Any
    """The model's tokenizer (to read the rows)."""


def prepare(setup: Setup, name: str) -> Case:
    started = time.perf_counter()
    case = tool_case(setup) if name == "tool" else dense_case(setup, int(name.removeprefix("dense-")))
    case.prep_s = time.perf_counter() - started
    return case


def make_setup(args: argparse.Namespace, started: float) -> Setup:
    log(f"building {args.model} on {args.device} in {args.dtype}", started)
    model, processor = build(args)
    family = family_of(model.config)
    side = family.merged_patch_pixels
    if args.width % side or args.height % side:
        raise SystemExit(f"--frame-size sides must be multiples of {side} (frames are never resized)")
    video = SyntheticVideo(args.video_frames, args.fps, args.height, args.width)
    if not args.released_budget:
        keep_frames_untouched(processor, max([*args.dense, args.overview, args.served]), video)
    return Setup(
        args,
        model,
        processor,
        family,
        torch.device(args.device),
        video,
        plain_token_ids(processor.tokenizer, family),
        torch.Generator().manual_seed(args.seed),
        # GRPOModule._shares_prompts: never through checkpointed layers (no cache there).
        share_prompts=args.no_checkpointing,
    )


def keep_frames_untouched(processor: Any, frames: int, video: SyntheticVideo) -> None:
    """Raise the video processor's per-video pixel budget to ``frames`` frames of the video's
    size, so that no case's frames are shrunk (the released 25,165,824 pixels hold 124 frames
    of 448x448)."""
    from transformers.image_utils import SizeDict

    size = processor.video_processor.size
    needed = (frames + frames % 2) * video.height * video.width
    if needed > size.longest_edge:
        processor.video_processor.size = SizeDict(shortest_edge=size.shortest_edge, longest_edge=needed)


def header(setup: Setup) -> dict[str, Any]:
    args, model = setup.args, setup.model
    import transformers

    cuda = setup.device.type == "cuda"
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "model": args.model,
        "parameters": count_parameters(model),
        "weights_gib": round(weights / GIB, 3),
        "trainable_tensors": len(language_parameters(model)),
        "device": torch.cuda.get_device_name(setup.device) if cuda else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": args.dtype,
        "attention": model.config.text_config._attn_implementation,
        "gradient_checkpointing": not args.no_checkpointing,
        "share_prompts": setup.share_prompts,
        "group": args.group,
        "completion": args.completion,
        "micro_batch_rows": args.micro_batch_rows or args.group,
        "frame_size": [args.width, args.height],
        "source_video": {"frames": args.video_frames, "fps": args.fps},
        "spans": args.spans,
        "released_budget": args.released_budget,
        "timing": "one untimed run of the smallest case, then one timed run of each case",
    }


def case_names(args: argparse.Namespace) -> list[str]:
    """Timed order: the tool case, then dense by size (a time budget skips the largest)."""
    return ["tool", *(f"dense-{n}" for n in sorted(set(args.dense)))]


def main(argv: Sequence[str] | None = None) -> Report:
    started = time.monotonic()
    args = parse_args(argv)
    setup = make_setup(args, started)
    numbers = header(setup)
    log(
        f"{numbers['parameters']['total'] / 1e9:.3f}B parameters ({numbers['weights_gib']} GiB) on "
        f"{numbers['device']}; checkpointing {numbers['gradient_checkpointing']}, shared prompts "
        f"{setup.share_prompts}, G={args.group}, {args.micro_batch_rows or args.group} rows per pass",
        started,
    )
    deadline = math.inf if args.time_budget is None else started + args.time_budget
    names = case_names(args)
    seen = {"tool": args.overview + args.served, **{f"dense-{n}": n for n in args.dense}}
    cases: dict[str, Case] = {}
    warm = min(names, key=lambda name: seen[name])
    if time.monotonic() < deadline:
        log(f"warm-up: {warm} (untimed)", started)
        cases[warm] = prepare(setup, warm)
        run_case(setup, cases[warm])
    results, runs = [], {}
    for name in names:
        if time.monotonic() > deadline:
            log(f"{name}: skipped (time budget)", started)
            results.append(CaseResult(name, seen[name], status="skipped: time budget"))
            continue
        log(f"{name}: start", started)
        case = cases.pop(name, None) or prepare(setup, name)
        runs[name] = run_case(setup, case)
        results.append(runs[name].result)
        log(f"{name}: {summary(runs[name].result)}", started)
    numbers["cases"] = [dataclasses.asdict(r) for r in results]
    numbers["wall_s"] = round(time.monotonic() - started, 1)
    print()
    print(table(results, setup.device.type == "cuda"), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")
        log(f"wrote {args.json}", started)
    return Report(numbers, runs, setup.processor.tokenizer)


if __name__ == "__main__":
    main()
