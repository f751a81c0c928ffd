"""Validation question by question: generate, score by problem type, count, record.

:class:`Evaluator` is what a module's validation hooks delegate to (``validation_step`` ->
:meth:`Evaluator.step`, ``on_validation_epoch_end`` -> :meth:`Evaluator.finish`): greedy
answers (and optionally sampled ones) from the module's generator, each scored by its problem
type (:mod:`evaluation.scoring`: a multiple-choice letter parsed tolerantly, a number, or an
open-ended answer asked of the judge when one is configured), multiple-choice accuracy per
category counted by :class:`~evaluation.metrics.MultipleChoiceScores` with the other types
beside it, and every question's result (with its ``problem_id`` and the scoring used) kept as
a record for ``{default_root_dir}/predictions/val-step{N}.jsonl`` (so two evaluations can be
compared question by question: ``lvrl report compare``). A frame-count sweep (the
datamodule's ``val_num_frames``) gives one validation dataloader per count: each is scored on
its own and logged as ``val/frames_{N}/...``; the one at the training frame count also under
the plain ``val/...`` names.

Nothing here knows Lightning or the model: the module passes its generator, device, and what
the trainer says (dataloaders, frame counts, step, rank).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from evaluation.metrics import CHOICE, MultipleChoiceScores, format_accuracy_table
from evaluation.scoring import score_answers
from rewards.judge import JudgeClient, JudgeSettings
from rewards.parsing import follows_format, reasoning_agrees, response_choice
from rollout.base import SamplingConfig


class AnswerGenerator(Protocol):
    """The model's answers: per prompt of a collated batch, ``sampling.n`` completion texts."""

    def __call__(self, batch: dict[str, Any], *, sampling: SamplingConfig) -> list[list[str]]: ...


@dataclass
class ValidationResult:
    """One validation dataloader's outcome (a frame-count sweep has one per frame count)."""

    frames: int | None
    """Frames sampled per video by this dataloader (None when the datamodule does not say)."""
    scores: dict[str, float]
    """:class:`~evaluation.metrics.MultipleChoiceScores` output (synced over data-parallel ranks)."""
    predictions: list[dict[str, Any]]
    """Every question this rank saw: key, problem_id, problem_type, scoring, category, answer,
    predicted, correct (None: not scored), format, completion."""
    primary: bool
    """Whether this dataloader reports under the plain ``val/...`` metric names."""


def val_frame_counts(datamodule: Any) -> list[int] | None:
    """Frame count of each validation dataloader, when the datamodule says (a sweep does)."""
    return getattr(datamodule, "val_frame_counts", None)


def primary_loader(datamodule: Any) -> int:
    """The dataloader at the training frame count: it reports under the plain ``val/...`` names."""
    counts = val_frame_counts(datamodule)
    primary = getattr(getattr(datamodule, "hparams", None), "num_frames", None)
    return counts.index(primary) if counts and primary in counts else 0


class Evaluator:
    """Scores validation batches and collects, per dataloader, the scores and every question's record.

    Args:
        generate: the model's answers to a batch (:class:`AnswerGenerator`; a bound method pickles).
        max_new_tokens: generation budget of an answer.
        samples: besides the greedy answer, sample this many answers per question at
            ``temperature`` and report ``sampled_accuracy`` (multiple-choice rows); 0: off.
        temperature: sampling temperature of those answers.
        judge: the LLM judge of open-ended questions; None: they are not scored.
        record_extras: what the generator knows of its last greedy answers beyond their text
            (a tool-use episode's requests and turns): one dict per answer, added to its record.
    """

    def __init__(
        self,
        generate: AnswerGenerator,
        max_new_tokens: int,
        samples: int = 0,
        temperature: float = 1.0,
        judge: JudgeSettings | None = None,
        record_extras: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.generate = generate
        self.record_extras = record_extras
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.temperature = temperature
        self.judge = judge
        self.metrics = torch.nn.ModuleList([MultipleChoiceScores()])
        """One metric per validation dataloader (the module registers the list, so that it moves
        with the module and the strategy can set its process group)."""
        self.results: list[ValidationResult] = []
        """The last validation, per dataloader: scores and every question's record."""
        self.last_scores: dict[str, float] = {}
        """Scores of the last validation (its primary dataloader's, in a frame-count sweep)."""
        self._records: dict[int, list[dict[str, Any]]] = {}

    def start(self) -> None:
        """Forget the records of an unfinished validation (call at the start of each)."""
        self._records = {}

    def scores_of(self, loader: int, device: torch.device | str) -> MultipleChoiceScores:
        """The metric of validation dataloader ``loader``, created on ``device`` when first seen."""
        # Later ones share the first one's process group (the strategy sets it for data-parallel sync).
        while len(self.metrics) <= loader:
            metric = MultipleChoiceScores().to(device)
            metric.process_group = self.metrics[0].process_group
            self.metrics.append(metric)
        return self.metrics[loader]

    def step(self, batch: dict[str, Any], batch_idx: int, loader: int, device: torch.device | str) -> None:
        """Answer, score, count and record the questions of one batch of dataloader ``loader``."""
        greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=self.max_new_tokens)
        completions = [texts[0] for texts in self.generate(batch, sampling=greedy)]
        extras = self.record_extras() if self.record_extras is not None else []
        meta = batch["meta"]
        judge = JudgeClient(self.judge) if self.judge is not None else None
        scored = score_answers(completions, meta, judge)
        sampled_fraction = None
        if self.samples:
            sampling = SamplingConfig(
                n=self.samples,
                temperature=self.temperature,
                max_new_tokens=self.max_new_tokens,
                seed=10_000 * batch_idx,  # the same samples for the same model and batches
            )
            sampled = self.generate(batch, sampling=sampling)
            # Multiple-choice rows only (sampled answers of other types are not scored).
            sampled_fraction = [
                sum(response_choice(t, len(m["options"]) or 4, m["options"]) == m["answer"] for t in texts)
                / len(texts)
                if s.scoring == CHOICE
                else None
                for texts, m, s in zip(sampled, meta, scored, strict=True)
            ]
        records: list[dict[str, Any]] = [
            {
                "key": m["key"],
                "problem_id": m["problem_id"],
                "problem_type": m["problem_type"],
                "scoring": s.scoring,
                "category": m["category"],
                "answer": m["answer"],
                "predicted": s.predicted,
                "correct": s.correct,
                "format": follows_format(c),
                "reasoning_agrees": (
                    reasoning_agrees(c, s.predicted, m["options"]) if s.scoring == CHOICE else None
                ),
                "num_frames": m["num_frames"],
                "completion": c,
                **({"scoring_note": s.note} if s.note else {}),
            }
            for m, s, c in zip(meta, scored, completions, strict=True)
        ]
        if len(extras) == len(records):
            for record, extra in zip(records, extras, strict=True):
                record.update(extra)
        if sampled_fraction is not None:
            for record, fraction in zip(records, sampled_fraction, strict=True):
                if fraction is not None:
                    record["sampled_correct"] = fraction
        self.scores_of(loader, device).update(
            [s.predicted if s.scoring == CHOICE else None for s in scored],
            [m["answer"] for m in meta],
            [m["category"] for m in meta],
            [r["format"] for r in records],
            sampled_fraction,
            [r["reasoning_agrees"] for r in records],
            scoring=[s.scoring for s in scored],
            correct=[s.correct for s in scored],
        )
        self._records.setdefault(loader, []).extend(records)

    def finish(
        self, num_loaders: int, frame_counts: list[int] | None, primary: int, device: torch.device | str
    ) -> list[ValidationResult]:
        """Compute (synced over ranks) and reset each dataloader's scores; the results, also kept
        in :attr:`results` and the primary one's scores in :attr:`last_scores`."""
        self.results = []
        for loader in range(num_loaders):
            metric = self.scores_of(loader, device)
            scores = metric.compute()
            metric.reset()
            frames = frame_counts[loader] if frame_counts and len(frame_counts) == num_loaders else None
            self.results.append(
                ValidationResult(frames, scores, self._records.get(loader, []), loader == primary)
            )
        self.last_scores = self.results[primary].scores
        self._records = {}
        return self.results


def logged_scores(results: list[ValidationResult]) -> dict[str, float]:
    """Metric name -> value to log, in logging order: the primary dataloader's under ``val/...``,
    every dataloader's under ``val/frames_{N}/...`` in a sweep; counts per category left out."""
    sweep = len(results) > 1
    logged: dict[str, float] = {}
    for result in results:
        for name, value in result.scores.items():
            if name.startswith("count"):
                continue
            if result.primary:
                logged[f"val/{name}"] = value
            if sweep:
                logged[f"val/frames_{result.frames}/{name}"] = value
    return logged


def write_predictions(results: list[ValidationResult], folder: Path, step: int, rank: int | None) -> None:
    """One JSON line per validation question, one file per dataloader (each rank writes the
    questions it saw): ``val-step{N}[-frames{F}][-rank{R}].jsonl``; ``rank`` None on one process."""
    folder.mkdir(parents=True, exist_ok=True)
    sweep = len(results) > 1
    for result in results:
        suffix = f"-frames{result.frames}" if sweep and not result.primary else ""
        ranked = f"-rank{rank}" if rank is not None else ""
        path = folder / f"val-step{step:06d}{suffix}{ranked}.jsonl"
        with path.open("w") as f:
            for record in result.predictions:
                f.write(json.dumps(record) + "\n")


def validation_printout(results: list[ValidationResult], model: str) -> list[str]:
    """What ``lvrl validate`` prints: the accuracy table of each dataloader, then two answers of
    the primary one (key, parsed letter, completion)."""
    blocks = []
    for result in results:
        frames = f" at {result.frames} frames" if result.frames else ""
        blocks.append("\n" + format_accuracy_table(result.scores, title=f"Validation of {model}{frames}"))
    primary = next(result for result in results if result.primary)
    for sample in primary.predictions[:2]:
        blocks.append(
            f"[{sample['key']}] key={sample['answer']} parsed={sample['predicted']}: {sample['completion']!r}"
        )
    return blocks
