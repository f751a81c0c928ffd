"""LightningDataModule streaming LongVideo-Reason-style video QA shards."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import lightning as L
from transformers import AutoConfig, AutoProcessor

from datamodules.collate import TextTokenCounter, VideoQACollator
from datamodules.fork_server import worker_context
from datamodules.qwen_video import QwenVideoSettings
from datamodules.shards import resolve_shards
from datamodules.stream import (
    EpochAwareDataLoader,
    SkipCounter,
    VideoQAStream,
    data_parallel_coordinates,
)
from datamodules.tool_traces import ToolTraces
from families import ModelFamily, family_of
from parallel.collectives import gather_from_all_ranks

log = logging.getLogger(__name__)

HOST_KEYS = ("pixel_values_videos", "target_pixel_values_videos")
"""Batch entries left on the host by :meth:`LongVideoReasonDataModule.transfer_batch_to_device`."""


def trainer_data_parallel_coordinates(
    trainer: L.Trainer | None, sequence_parallel_size: int
) -> tuple[int, int]:
    """This process's data-parallel coordinates: from the strategy's device mesh when it has one."""
    if trainer is None:
        return 0, 1
    strategy = trainer.strategy
    if hasattr(strategy, "data_parallel_rank") and hasattr(strategy, "data_parallel_size"):
        return int(strategy.data_parallel_rank), int(strategy.data_parallel_size)
    return data_parallel_coordinates(trainer.global_rank, trainer.world_size, sequence_parallel_size)


@dataclass(frozen=True)
class TrainingPosition:
    """A copy of where training is in the stream (:meth:`LongVideoReasonDataModule.training_position`)."""

    epoch: int
    next_positions: dict[int, int]
    """Per worker, the next raw position not yet trained on."""
    untrained: dict[tuple[int, int], set[int]]
    """Per (epoch, worker), positions handed out but not trained on."""


class LongVideoReasonDataModule(L.LightningDataModule):
    """Video QA shards (``<key>.mp4`` + ``<key>.json``) for CoT-SFT, evaluation and RL.

    Args:
        train_shards: shard paths, brace patterns or globs for training (``data/train-*.tar``).
        val_shards: the same for validation.
        test_shards: the same for testing.
        processor_path: model directory whose processor (tokenizer, chat template, video
            processor) prepares the inputs; usually linked to the model's path.
        num_frames: frames sampled uniformly over each video (the cap when ``sample_fps`` is set).
        sample_fps: sample this many frames per second of video instead (a 10-minute video at
            0.1 gives 60 frames), never more than ``num_frames``; ``null``: always ``num_frames``.
        val_num_frames: evaluate at each of these frame counts (a frame-count sweep: one
            validation dataloader per count, in order); ``null``: at ``num_frames`` only.
        max_pixels_per_frame: pixel budget of a frame; frames are resized while decoding to the
            largest size within it whose sides are multiples of the pixels one merged visual
            token covers (28 for Qwen2/2.5-VL, 32 for Qwen3-VL: the model's family says);
            128*28*28 is the paper's setting.
        batch_size: samples per training batch and data-parallel rank.
        val_batch_size: samples per validation batch (defaults to ``batch_size``).
        num_workers: dataloader worker processes per rank (decoding runs there).
        shuffle_buffer: training samples held for shuffling (shard order is shuffled too).
        seed: seed of the per-epoch shuffles.
        sequence_parallel_size: ranks that share one sample (they must read the same shards).
        worker_start_method: how dataloader workers start: ``forkserver`` (forked from a server
            process that has imported their code once, so a loader's workers do not import torch
            and transformers again; :mod:`datamodules.fork_server`), ``spawn`` (a fresh
            interpreter per worker) or ``fork`` (a copy of the trainer: a worker forked after an
            in-process vLLM engine has bound its OpenMP threads deadlocks, so not for RL).
        max_prompt_tokens: skip a sample whose prompt, after the chat template, has more text
            tokens than this (the video placeholder counts as one; the video's own tokens are
            bounded by ``num_frames`` x ``max_pixels_per_frame``), counted as
            ``data/skipped/prompt_too_long``; checked before the video is decoded, so an
            extremely long question costs one tokenisation, not a stalled batch. null: no limit.
        max_target_tokens: skip a sample whose CoT-SFT target (reasoning and answer) has more
            tokens than this (``data/skipped/target_too_long``; validation computes a loss on
            it too). null: no limit.
        tool_use: questions for a model that may ask for frames (the frames tool's syntax is
            added to each prompt, :data:`datamodules.prompts.TOOL_INSTRUCTION`); each sample's
            encoded video stays in its batch (``meta["frame_source"]``: tool-use rollouts, the RL
            callback's ``tool_use``, decode requested frames from it; it costs the batch's
            videos' size in host memory while in use); and a row with a tool trace (the zoom
            task's, :mod:`datamodules.tool_traces`) is taught as that episode in CoT-SFT.
        tool_given_request: each row's tool trace's first request is given with the question
            (the oracle-crop baseline, with traces that ask for the right stretch: ``lvrl data
            zoom --trace-requests oracle``): in CoT-SFT it is in the target but not trained, and
            tool-use episodes (validation, rollouts) start with it written for the model and
            served; the model writes what follows. Needs ``tool_use``.
        qwen_video: sample each video as the Qwen models' own preprocessing does (the
            ``qwen-vl-utils`` package's ``fetch_video``: :mod:`datamodules.qwen_video`) with these
            of its keys: ``fps`` or ``nframes``, ``min_frames``, ``max_frames``, ``min_pixels``,
            ``max_pixels``, ``total_pixels``; ``{}`` is Qwen's defaults exactly (2 fps, 4 to 768
            frames, 128 to 768 merged patches a frame) and needs ``num_frames: 768`` and
            ``max_pixels_per_frame: 602112`` (768 x 28 x 28; 786432 for Qwen3-VL's 32-pixel
            patches), which stay the bounds the memory plan and the engine are sized by.
            ``sample_fps`` and ``val_num_frames`` are then unused and must be unset. null: lvrl's
            uniform sampling.

    Frames per video are bounded by ``num_frames`` (every ``val_num_frames`` count and the
    ``sample_fps`` rate are capped by their own count): a longer video is sampled more
    sparsely, never decoded whole. Every skipped sample is logged with its shard, key and
    reason and counted per reason (``data/skipped/<reason>``, the reasons listed in
    :data:`datamodules.stream.SKIP_REASONS`).
    """

    def __init__(
        self,
        train_shards: str | list[str] | None = None,
        val_shards: str | list[str] | None = None,
        test_shards: str | list[str] | None = None,
        processor_path: str = "",
        num_frames: int = 64,
        sample_fps: float | None = None,
        val_num_frames: list[int] | None = None,
        max_pixels_per_frame: int = 128 * 28 * 28,
        batch_size: int = 4,
        val_batch_size: int | None = None,
        num_workers: int = 1,
        shuffle_buffer: int = 256,
        seed: int = 0,
        sequence_parallel_size: int = 1,
        worker_start_method: str = "forkserver",
        max_prompt_tokens: int | None = 4096,
        max_target_tokens: int | None = 4096,
        tool_use: bool = False,
        tool_given_request: bool = False,
        qwen_video: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        if tool_given_request and not tool_use:
            raise ValueError(
                "data.tool_given_request gives each question a request to serve: it needs tool_use: true"
            )
        if sample_fps is not None and sample_fps <= 0:
            raise ValueError(f"data.sample_fps={sample_fps} must be positive (or null for num_frames always)")
        if val_num_frames is not None and (not val_num_frames or min(val_num_frames) < 2):
            raise ValueError(f"data.val_num_frames={val_num_frames} must list frame counts of at least 2")
        limits = {"max_prompt_tokens": max_prompt_tokens, "max_target_tokens": max_target_tokens}
        for name, limit in limits.items():
            if limit is not None and limit < 1:
                raise ValueError(f"data.{name}={limit} must be at least 1 (or null for no limit)")
        if qwen_video is not None:
            if sample_fps is not None or val_num_frames is not None:
                raise ValueError(
                    "data.qwen_video chooses the frames itself: "
                    "leave data.sample_fps and data.val_num_frames unset"
                )
            QwenVideoSettings(**qwen_video)  # a wrong key or value fails here, not in a worker
        if worker_start_method not in ("spawn", "fork", "forkserver"):
            raise ValueError(f"worker_start_method must be spawn, fork or forkserver: {worker_start_method}")
        self.save_hyperparameters()
        self.skipped = SkipCounter()
        self._processor: Any = None
        self._family: ModelFamily | None = None
        # Where training is in the stream: per worker, the next raw position not yet trained on.
        # Data epochs are counted here, not taken from Lightning's epoch counter, which does not
        # always agree with the data after a resume at an epoch boundary.
        self._trained_epoch = 0
        self._trained_positions: dict[int, int] = {}
        self._next_train_epoch = 0
        self._exhausted_epoch = -1
        # Positions handed out by the training loader but not yet trained on, per (epoch, worker):
        # the batch Lightning fetches ahead, and, while dynamic sampling draws later batches,
        # one that is older than the newest trained position (read again after a resume).
        self._untrained: dict[tuple[int, int], set[int]] = {}
        self._train_loader: EpochAwareDataLoader | None = None
        self._loaders: list[EpochAwareDataLoader] = []
        self._resume_state: dict[str, Any] | None = None

    @property
    def skipped_samples(self) -> int:
        """Samples rejected so far (bad rows, missing members, undecodable videos, over-long texts)."""
        return self.skipped.value

    @property
    def skipped_by_reason(self) -> dict[str, int]:
        """``{reason: samples rejected so far}`` of the reasons that occurred."""
        return self.skipped.by_reason()

    @property
    def processor(self) -> Any:
        if self._processor is None:
            if not self.hparams.processor_path:
                raise ValueError("data.processor_path is not set (it is normally linked to model.model_path)")
            self._processor = AutoProcessor.from_pretrained(self.hparams.processor_path)
        return self._processor

    @property
    def family(self) -> ModelFamily:
        """The model's family (its position rule, timing), from the config next to the processor
        (the model's directory)."""
        if self._family is None:
            self._family = family_of(AutoConfig.from_pretrained(self.hparams.processor_path))
        return self._family

    @property
    def val_frame_counts(self) -> list[int]:
        """Frame count of each validation dataloader, in order."""
        return list(self.hparams.val_num_frames or [self.hparams.num_frames])

    def _stream(
        self, spec: str | list[str] | None, name: str, *, train: bool, num_frames: int | None = None
    ) -> VideoQAStream:
        if not spec:
            raise ValueError(f"data.{name}_shards is not set")
        shards = resolve_shards(spec)
        rank, size = trainer_data_parallel_coordinates(self.trainer, self.hparams.sequence_parallel_size)
        return VideoQAStream(
            shards,
            num_frames=num_frames or self.hparams.num_frames,
            max_pixels=self.hparams.max_pixels_per_frame,
            frame_factor=self.family.merged_patch_pixels,
            sample_fps=self.hparams.sample_fps,
            data_parallel_rank=rank,
            data_parallel_size=size,
            shuffle=train,
            shuffle_buffer=self.hparams.shuffle_buffer if train else 0,
            seed=self.hparams.seed,
            skipped=self.skipped,
            text_lengths=self._text_lengths(),
            max_prompt_tokens=self.hparams.max_prompt_tokens,
            max_target_tokens=self.hparams.max_target_tokens,
            keep_video_bytes=self.hparams.tool_use,
            qwen_video=self._qwen_video(),
        )

    def _qwen_video(self) -> QwenVideoSettings | None:
        """The ``qwen_video`` settings, checked against the frame and pixel bounds."""
        if self.hparams.qwen_video is None:
            return None
        settings = QwenVideoSettings(**self.hparams.qwen_video)
        frames, pixels = settings.frame_bound(), settings.pixel_bound(self.family.merged_patch_pixels)
        if frames > self.hparams.num_frames or pixels > self.hparams.max_pixels_per_frame:
            raise ValueError(
                f"data.qwen_video gives up to {frames} frames of {pixels:,} pixels; data.num_frames "
                f"({self.hparams.num_frames}) and data.max_pixels_per_frame "
                f"({self.hparams.max_pixels_per_frame:,}) bound every video: raise them, or lower "
                "qwen_video's max_frames / nframes and max_pixels"
            )
        return settings

    def _collator(self, with_targets: bool = True) -> VideoQACollator:
        """The prompts' layouts (what generation and rollouts start from), and ``with_targets``
        the teacher-forcing layout too (prompt + target, a tool trace's frames decoded)."""
        traces = None
        if self.hparams.tool_use:
            traces = ToolTraces(
                self.hparams.max_pixels_per_frame,
                self.family.merged_patch_pixels,
                given_first_turn=self.hparams.tool_given_request,
            )
        return VideoQACollator(
            self.processor, with_targets=with_targets, family=self.family, tool_traces=traces
        )

    def _text_lengths(self) -> TextTokenCounter | None:
        limited = self.hparams.max_prompt_tokens is not None or self.hparams.max_target_tokens is not None
        return TextTokenCounter(self.processor, self.hparams.tool_use) if limited else None

    def setup(self, stage: str) -> None:
        # Resolve shard lists now so a missing path or an empty glob fails before any training.
        self.datasets: dict[str, VideoQAStream] = {}
        self.val_datasets: list[VideoQAStream] = []
        if stage == "fit":
            self.datasets["train"] = self._stream(self.hparams.train_shards, "train", train=True)
        if stage in ("fit", "validate") and self.hparams.val_shards:
            self.val_datasets = [
                self._stream(self.hparams.val_shards, "val", train=False, num_frames=n)
                for n in self.val_frame_counts
            ]
        elif stage == "validate":
            raise ValueError("validate needs data.val_shards")
        if stage == "test":
            self.datasets["test"] = self._stream(self.hparams.test_shards, "test", train=False)

    def _loader(
        self, dataset: VideoQAStream, batch_size: int, collator: VideoQACollator, *, train: bool = False
    ) -> EpochAwareDataLoader:
        workers = self.hparams.num_workers
        loader = EpochAwareDataLoader(
            dataset,
            epoch_fn=self._start_train_pass if train else None,
            on_exhausted=self._train_pass_exhausted if train else None,
            on_fetched=self._train_batch_fetched if train else None,
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=collator,
            # Decoding is the slow part: let each worker run a couple of batches ahead.
            prefetch_factor=2 if workers > 0 else None,
            multiprocessing_context=worker_context(self.hparams.worker_start_method) if workers > 0 else None,
        )
        self._loaders.append(loader)
        return loader

    def teardown(self, stage: str) -> None:
        # A fit that stops inside an epoch (max_steps) still holds its pass: end the workers
        # now rather than leave them to the interpreter's exit.
        for loader in self._loaders:
            loader.close()
        self._loaders.clear()

    def train_dataloader(self) -> EpochAwareDataLoader:
        # A module that does not train on targets (GRPO learns from its rollouts) gets training
        # batches without them: nothing is laid out or decoded that the step would not read.
        module = self.trainer.lightning_module if self.trainer is not None else None
        collator = self._collator(with_targets=getattr(module, "trains_on_targets", True))
        self._apply_resume_state(self.datasets["train"])
        self._train_loader = self._loader(
            self.datasets["train"], self.hparams.batch_size, collator, train=True
        )
        return self._train_loader

    def draw_train_batch(self) -> Any | None:
        """One more batch of the training pass under way, for a step that samples more prompts than
        its own batch (dynamic sampling, :mod:`rollout.refill`); None when the pass is read to
        its end. The caller passes it through Lightning's transfer hooks as the trainer does with
        a batch it fetched, which counts it as consumed (and saved so in checkpoints)."""
        if self._train_loader is None:
            raise RuntimeError("draw_train_batch() is only possible while training reads the data")
        return self._train_loader.draw()

    def _start_train_pass(self) -> int:
        epoch = self._next_train_epoch
        self._next_train_epoch += 1
        return epoch

    def _train_pass_exhausted(self, epoch: int) -> None:
        self._exhausted_epoch = max(self._exhausted_epoch, epoch)

    def _train_batch_fetched(self, batch: Any) -> None:
        for meta in batch.get("meta", []) if isinstance(batch, dict) else []:
            epoch, worker, position = meta["stream"]
            self._untrained.setdefault((epoch, worker), set()).add(position)

    # -- exact resume ------------------------------------------------------------------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Called for the batch about to be trained on (not for batches prefetched ahead of it).
        if self.trainer is not None and self.trainer.training and isinstance(batch, dict):
            for meta in batch.get("meta", []):
                epoch, worker, position = meta["stream"]
                if epoch != self._trained_epoch:
                    self._trained_epoch, self._trained_positions = epoch, {}
                    self._untrained = {k: v for k, v in self._untrained.items() if k[0] >= epoch}
                self._trained_positions[worker] = max(self._trained_positions.get(worker, 0), position + 1)
                self._untrained.get((epoch, worker), set()).discard(position)
        return batch

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        # The pixel values stay on the host: the vision tower moves only the frames it encodes
        # (each sequence-parallel rank its share), and the whole batch's float32 patches would
        # otherwise sit on every GPU for the whole step (4.6 GiB at 4,096 frames of 128 tokens).
        if not isinstance(batch, dict):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        host = {key: batch[key] for key in HOST_KEYS if key in batch}
        moved = super().transfer_batch_to_device(
            {key: value for key, value in batch.items() if key not in host}, device, dataloader_idx
        )
        return {**moved, **host}

    def training_position(self) -> TrainingPosition:
        """Where training is in the stream now (a copy), to :meth:`rewind_training_position` to."""
        return TrainingPosition(
            self._trained_epoch,
            dict(self._trained_positions),
            {key: set(positions) for key, positions in self._untrained.items()},
        )

    def rewind_training_position(self, position: TrainingPosition) -> None:
        """Back to ``position``: the batches handed to training since then count as not trained
        on (a step stopped before training on its batch, :class:`core.failures.StepNotTaken`)."""
        self._trained_epoch = position.epoch
        self._trained_positions = dict(position.next_positions)
        self._untrained = {key: set(positions) for key, positions in position.untrained.items()}

    def _read_again(self) -> dict[int, list[int]]:
        """Per worker, the positions of the trained epoch below its next position that were read
        but not trained on (empty unless dynamic sampling drew past a batch fetched ahead)."""
        again = {}
        for (epoch, worker), positions in self._untrained.items():
            below = sorted(p for p in positions if p < self._trained_positions.get(worker, 0))
            if epoch == self._trained_epoch and below:
                again[worker] = below
        return again

    def state_dict(self) -> dict[str, Any]:
        """The training stream's position on every data-parallel rank (saved in checkpoints).

        Called on every rank when a checkpoint is written; the ranks' positions are gathered so
        that the one file written by rank 0 holds them all.
        """
        rank, size = trainer_data_parallel_coordinates(self.trainer, self.hparams.sequence_parallel_size)
        again = self._read_again()
        untrained = any(held for (epoch, _), held in self._untrained.items() if epoch == self._trained_epoch)
        mine = {
            "epoch": self._trained_epoch,
            "next_positions": dict(self._trained_positions),
            "read_again": again,
            # Read to its end, and nothing read of it left untrained (a rewound step's batch, a
            # batch fetched ahead while dynamic sampling drew later ones): the last batch trained
            # was its last.
            "epoch_finished": self._exhausted_epoch >= self._trained_epoch and not untrained,
            "skipped_samples": self.skipped.value,
            "skipped_by_reason": self.skipped.by_reason(),
        }
        return {
            "data_parallel_size": size,
            "num_workers": self.hparams.num_workers,
            # Sequence-parallel peers share a data-parallel rank and a position: one entry each.
            "ranks": dict(gather_from_all_ranks((rank, mine))),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume_state = state_dict

    def _apply_resume_state(self, stream: VideoQAStream) -> None:
        state, self._resume_state = self._resume_state, None
        if state is None:
            return
        rank, size = trainer_data_parallel_coordinates(self.trainer, self.hparams.sequence_parallel_size)
        if state["data_parallel_size"] != size or state["num_workers"] != self.hparams.num_workers:
            self._next_train_epoch = max(r["epoch"] for r in state["ranks"].values())
            log.warning(
                "the checkpoint's data stream was read by %d data-parallel ranks x %d workers, this run has "
                "%d x %d: samples cannot be matched, so the current epoch is read again from its start",
                state["data_parallel_size"],
                state["num_workers"],
                size,
                self.hparams.num_workers,
            )
            return
        mine = state["ranks"][rank]
        # Checkpoints written before per-reason counts hold only the total.
        self.skipped.restore(mine.get("skipped_by_reason") or {"unrecorded": mine["skipped_samples"]})
        if mine["epoch_finished"]:
            self._next_train_epoch = mine["epoch"] + 1
            log.info("resuming the data stream at the start of epoch %d", self._next_train_epoch)
            return
        self._trained_epoch, self._trained_positions = mine["epoch"], dict(mine["next_positions"])
        self._next_train_epoch = mine["epoch"]
        # Checkpoints written before dynamic sampling have no positions to read again.
        stream.resume_from(mine["epoch"], mine["next_positions"], mine.get("read_again"))
        trained = sum(mine["next_positions"].values())
        log.info("resuming the data stream in epoch %d after %d samples", mine["epoch"], trained)

    def _eval_loader(self, dataset: VideoQAStream) -> EpochAwareDataLoader:
        collator = self._collator()
        return self._loader(dataset, self.hparams.val_batch_size or self.hparams.batch_size, collator)

    def val_dataloader(self) -> EpochAwareDataLoader | list:
        loaders = [self._eval_loader(dataset) for dataset in self.val_datasets]
        return loaders[0] if len(loaders) == 1 else loaders

    def test_dataloader(self) -> EpochAwareDataLoader:
        return self._eval_loader(self.datasets["test"])
