"""The streaming dataset skips broken samples, names them, and counts them."""

from __future__ import annotations

import json
import logging
import multiprocessing
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import webdataset as wds
from helpers.bad_shards import BROKEN_KEYS, write_shard_with_broken_samples
from transformers import AutoProcessor

from datamodules.collate import TextTokenCounter
from datamodules.longvideo_reason import LongVideoReasonDataModule
from datamodules.shards import resolve_shards
from datamodules.stream import SKIP_REASONS, SkipCounter, VideoQAStream, shards_for_rank
from datatools.synthetic import SynthConfig, encode_sample


def test_broken_samples_are_skipped_named_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = tmp_path / "mixed-00000.tar"
    good_keys = write_shard_with_broken_samples(shard, SynthConfig(num_frames=20, size=56))
    stream = VideoQAStream([str(shard)], num_frames=8, max_pixels=56 * 56)
    with caplog.at_level(logging.WARNING, logger="datamodules.stream"):
        keys = [sample.key for sample in stream]
    assert keys == good_keys
    assert stream.skipped.value == len(BROKEN_KEYS)
    for key in BROKEN_KEYS:
        messages = [r.getMessage() for r in caplog.records if key in r.getMessage()]
        assert messages, f"no warning names {key}"
        assert str(shard) in messages[0]
    text = caplog.text
    assert (
        "bad video" in text
        and "malformed JSON" in text
        and "malformed row" in text
        and "no video member" in text
    )


def test_sample_contents(synth_dir: Path) -> None:
    stream = VideoQAStream(resolve_shards(str(synth_dir / "val-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = list(stream)
    assert len(samples) == 8
    first = samples[0]
    assert first.video.frames.shape == (8, 56, 56, 3)
    assert first.row.is_multiple_choice and len(first.row.options) == 4
    assert first.key == first.row.problem_id


def test_shards_for_rank_partitions_exactly() -> None:
    shards = [f"s{i}" for i in range(11)]
    pieces = [shards_for_rank(shards, r, 3, w, 2) for r in range(3) for w in range(2)]
    flat = [s for piece in pieces for s in piece]
    assert sorted(flat) == sorted(shards) and len(flat) == len(set(flat))
    with pytest.raises(ValueError):
        shards_for_rank(shards, 3, 3, 0, 1)


def write_shard_with_long_texts(path: Path, config: SynthConfig) -> list[str]:
    """Two good samples, a 200,000-character question and a 200,000-character reasoning.

    The over-long samples hold bytes that are no video: had the stream decoded them, they
    would be skipped as ``bad_video``, so their reason also shows they were caught first.
    """
    good = []
    with wds.TarWriter(str(path), encoder=False) as writer:
        for index in range(2):
            key, video, row = encode_sample(config, "val", index)
            writer.write({"__key__": key, "mp4": video, "json": json.dumps(row).encode()})
            good.append(key)
        _, _, row = encode_sample(config, "val", 2)
        long_question = {**row, "problem_id": "long-question", "problem": "Why? " * 40_000}
        long_reasoning = {**row, "problem_id": "long-reasoning", "reasoning": "Because. " * 22_223}
        for sample in (long_question, long_reasoning):
            writer.write(
                {"__key__": sample["problem_id"], "mp4": b"not a video", "json": json.dumps(sample).encode()}
            )
    return good


def test_over_long_texts_are_skipped_before_decoding_named_and_counted(
    tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = tmp_path / "long-00000.tar"
    good = write_shard_with_long_texts(shard, SynthConfig(num_frames=20, size=56))
    counter = TextTokenCounter(AutoProcessor.from_pretrained(tiny_model_dir))
    stream = VideoQAStream(
        [str(shard)],
        num_frames=4,
        max_pixels=56 * 56,
        text_lengths=counter,
        max_prompt_tokens=1024,
        max_target_tokens=1024,
    )
    with caplog.at_level(logging.WARNING, logger="datamodules.stream"):
        samples = list(stream)
    assert [s.key for s in samples] == good
    assert stream.skipped.by_reason() == {"prompt_too_long": 1, "target_too_long": 1}
    assert stream.skipped.value == 2
    (question,) = [r.getMessage() for r in caplog.records if "'long-question'" in r.getMessage()]
    assert (
        str(shard) in question and "prompt_too_long" in question and "data.max_prompt_tokens=1024" in question
    )
    (reasoning,) = [r.getMessage() for r in caplog.records if "'long-reasoning'" in r.getMessage()]
    assert "target_too_long" in reasoning
    # The good samples are within the limits, and counted as the collator will tokenise them.
    prompt_tokens, target_tokens = counter(samples[0].row)
    assert 20 < prompt_tokens <= 1024 and 5 < target_tokens <= 1024


def test_the_datamodule_skips_an_over_long_question_in_validation(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    write_shard_with_long_texts(tmp_path / "val-00000.tar", SynthConfig(num_frames=20, size=56))
    data = LongVideoReasonDataModule(
        val_shards=str(tmp_path / "val-*.tar"),
        processor_path=str(tiny_model_dir),
        num_frames=4,
        max_pixels_per_frame=56 * 56,
        batch_size=4,
        num_workers=0,
        max_target_tokens=None,  # only the question is bounded: the long reasoning passes
    )
    data.setup("validate")
    batches = list(data.val_dataloader())
    keys = [meta["problem_id"] for batch in batches for meta in batch["meta"]]
    assert "long-question" not in keys and len(keys) == 2
    assert data.skipped_by_reason == {"prompt_too_long": 1, "bad_video": 1}  # the reasoning one's "video"
    assert data.skipped_samples == 2
    with pytest.raises(ValueError, match="max_prompt_tokens=0 must be at least 1"):
        LongVideoReasonDataModule(max_prompt_tokens=0)


def test_skip_counts_are_shared_per_reason_and_restored() -> None:
    counter = SkipCounter()
    counter.add(reason="bad_video")
    counter.add(2, reason="prompt_too_long")
    assert counter.by_reason() == {"bad_video": 1, "prompt_too_long": 2} and counter.value == 3
    counter.restore({"malformed_row": 4})
    assert counter.by_reason() == {"malformed_row": 4} and counter.value == 4
    with pytest.raises(ValueError):
        counter.add(reason="no such reason")
    assert set(counter.by_reason()) <= set(SKIP_REASONS)


def one_worker_loader(synth_dir: Path, tiny_model_dir: Path) -> LongVideoReasonDataModule:
    data = LongVideoReasonDataModule(
        train_shards=str(synth_dir / "train-00000.tar"),
        processor_path=str(tiny_model_dir),
        num_frames=4,
        max_pixels_per_frame=56 * 56,
        batch_size=1,
        num_workers=1,
    )
    data.setup("fit")
    return data


def started_worker(data: LongVideoReasonDataModule) -> tuple[Iterator, multiprocessing.process.BaseProcess]:
    """The training pass's batches, one read, and its (one) worker."""
    before = set(multiprocessing.active_children())
    batches = iter(data.train_dataloader())
    assert len(next(batches)["meta"]) == 1
    (worker,) = set(multiprocessing.active_children()) - before
    return batches, worker


def test_a_worker_serves_on_through_the_jobs_signals_and_a_second_sigterm_ends_it_quietly(
    synth_dir: Path, tiny_model_dir: Path
) -> None:
    # A job's pre-emption (SIGTERM) or a terminal's Ctrl-C (SIGINT) reaches every process, the
    # workers too, while the trainer may still fetch a batch before it stops at the end of its
    # step: the worker serves on. A second SIGTERM from outside ends it with status 0: killed
    # by the signal, it would make torch's SIGCHLD handler raise in the trainer.
    data = one_worker_loader(synth_dir, tiny_model_dir)
    batches, worker = started_worker(data)
    # Sent from another process, as a scheduler's or a terminal's is.
    for sig in ("-INT", "-TERM"):
        subprocess.run(["kill", sig, str(worker.pid)], check=True)
    worker.join(timeout=2)
    assert worker.is_alive() and worker.exitcode is None
    assert len(next(batches)["meta"]) == 1  # the data still comes
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)
    worker.join(timeout=60)
    time.sleep(0.5)  # room for the SIGCHLD handler, which would raise here on a killed worker
    assert worker.exitcode == 0
    data.teardown("fit")


def test_the_trainers_first_sigterm_ends_a_worker_at_once(synth_dir: Path, tiny_model_dir: Path) -> None:
    # At interpreter exit multiprocessing sends each live worker one SIGTERM and joins it with no
    # time-out (a fit stopped at max_steps inside an epoch leaves its pass to that). The pass's
    # switch, set just before (datamodules.loader_workers), makes that first SIGTERM the end: a
    # worker that took it for the job's hung `lvrl fit` after its last step.
    from datamodules import loader_workers

    data = one_worker_loader(synth_dir, tiny_model_dir)
    _batches, worker = started_worker(data)  # the pass stays alive, as an unfinished fit's does
    loader_workers.end_every_pass()  # what the exit hook does
    worker.terminate()  # what multiprocessing's exit clean-up then does
    worker.join(timeout=10)
    assert worker.exitcode == 0
    data.teardown("fit")


def test_a_teardown_ends_the_pass_the_trainer_stopped_reading(synth_dir: Path, tiny_model_dir: Path) -> None:
    data = one_worker_loader(synth_dir, tiny_model_dir)
    batches, worker = started_worker(data)
    data.teardown("fit")  # a fit that stopped at max_steps, part-way through the epoch
    worker.join(timeout=10)  # torch's own shutdown: the worker leaves its loop, no signal needed
    assert worker.exitcode == 0
    with pytest.raises(StopIteration):
        next(batches)


def test_a_worker_whose_pass_ended_skips_native_exit_handlers(synth_dir: Path, tiny_model_dir: Path) -> None:
    # A native clean-up that aborts at exit (seen once under load: "terminate called without an
    # active exception", status -6) must not turn a finished worker's end into a crash.
    from datamodules.stream import EpochAwareDataLoader
    from tests.helpers.native_exit import register_native_abort_at_exit

    data = one_worker_loader(synth_dir, tiny_model_dir)
    loader = EpochAwareDataLoader(
        data.datasets["train"],
        batch_size=1,
        num_workers=1,
        collate_fn=list,
        worker_init_fn=register_native_abort_at_exit,
        multiprocessing_context="spawn",
    )
    before = set(multiprocessing.active_children())
    assert len(next(iter(loader))) == 1
    (worker,) = set(multiprocessing.active_children()) - before
    loader.close()  # the trainer ends the pass: its switch is set, torch shuts the worker down
    worker.join(timeout=10)
    assert worker.exitcode == 0


def test_the_pixel_values_stay_on_the_host_when_a_batch_moves_to_the_device(
    synth_dir: Path, tiny_model_dir: Path
) -> None:
    # The "meta" device stands in for a GPU here: every tensor the transfer moves ends up there.
    import torch

    data = one_worker_loader(synth_dir, tiny_model_dir)
    data.hparams.num_workers = 0
    batch = next(iter(data.train_dataloader()))
    moved = data.transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert moved["pixel_values_videos"].device.type == "cpu"
    assert moved["input_ids"].device.type == "meta" and moved["video_grid_thw"].device.type == "meta"
    assert moved.keys() == batch.keys()
    data.teardown("fit")
