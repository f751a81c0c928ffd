"""bench/zoom_records.py: a finished stage's record keeps what the comparison reads and gives it
back byte for byte; stages whose weights a later stage still needs are trained again, not
restored; and bench/zoom.py, started on an empty folder with the records, trains only what has
no record and prints the same report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import zoom, zoom_records


def finished(folder: Path, predictions: int = 10) -> dict[str, bytes]:
    """A finished working folder as a stage leaves it; returns the files a record must keep."""
    kept = {
        "config.yaml": b"model: {}\n",
        "attempts.jsonl": b'{"cpu_seconds": 12.5}\n',
        "done": b"",
        "run.log": b"train step 10/10\n",
        # Over the compression threshold: stored compressed, restored as it was.
        "csv/version_0/metrics.csv": b"step,loss\n" + b"".join(b"%d,0.5\n" % i for i in range(20000)),
        "predictions/val-step0.jsonl": b"".join(b'{"problem_id": "q%d"}\n' % i for i in range(predictions)),
    }
    dropped = {"checkpoints/last.ckpt": b"weights", "hf/model.safetensors": b"weights", "lvrl.log": b"..."}
    for name, data in {**kept, **dropped}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return kept


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_record_keeps_what_the_report_reads_and_restores_it_byte_for_byte(tmp_path: Path) -> None:
    work, records, again = tmp_path / "work" / "seed2", tmp_path / "records", tmp_path / "again"
    stage = finished(work / "sft-dense-48")
    evaluation = finished(work / "sft-dense-48-test", predictions=5)
    record = zoom_records.keep(
        records, 2, "sft-dense-48", [work / "sft-dense-48", work / "sft-dense-48-test"]
    )
    assert record == records / "seed2" / "sft-dense-48"
    stored = files(record)
    assert "sft-dense-48/csv/version_0/metrics.csv.gz" in stored  # compressed
    assert not any("checkpoints" in name or "hf/" in name or "lvrl.log" in name for name in stored)
    # Written again from the same folders: the same bytes (a re-recorded stage is no change).
    zoom_records.keep(records, 2, "sft-dense-48", [work / "sft-dense-48", work / "sft-dense-48-test"])
    assert files(record) == stored

    assert zoom_records.restore(records, again, 2, "sft-dense-48")
    assert files(again / "seed2" / "sft-dense-48") == stage
    assert files(again / "seed2" / "sft-dense-48-test") == evaluation
    # A stage done in the working folder is left as it is.
    assert not zoom_records.restore(records, again, 2, "sft-dense-48")
    assert not zoom_records.restore(records, again, 2, "sft-tool")  # no record


def test_only_finished_folders_are_recorded(tmp_path: Path) -> None:
    finished(tmp_path / "sft-tool")
    (tmp_path / "sft-tool" / "done").unlink()
    with pytest.raises(ValueError, match="lack 'done'"):
        zoom_records.keep(tmp_path / "records", 0, "sft-tool", [tmp_path / "sft-tool"])
    assert not (tmp_path / "records" / "seed0" / "sft-tool").exists()


def test_a_restore_replaces_a_part_trained_folder_of_a_recorded_stage(tmp_path: Path) -> None:
    """A folder stopped part way (its checkpoint at some step) is superseded by the finished
    record: the stage is done, its checkpoint no longer of use."""
    records, out = tmp_path / "records", tmp_path / "out"
    kept = finished(tmp_path / "seed0" / "sft-dense-48")
    zoom_records.keep(records, 0, "sft-dense-48", [tmp_path / "seed0" / "sft-dense-48"])
    partial = out / "seed0" / "sft-dense-48"
    (partial / "checkpoints").mkdir(parents=True)
    (partial / "checkpoints" / "last.ckpt").write_bytes(b"step 700")
    assert zoom_records.restore(records, out, 0, "sft-dense-48")
    assert files(partial) == kept


TOOL_PATH = ["sft-tool", "grpo-tool", "sft-dense-48"]
LONGER = ["sft-tool", "grpo-tool", "grpo-tool-300", "sft-dense-48"]  # with --longer-grpo 300


@pytest.mark.parametrize(
    ("stages", "recorded", "restored"),
    [
        # GRPO starts from the tool SFT's export: without GRPO's record, the SFT trains again.
        (TOOL_PATH, {"sft-tool", "sft-dense-48"}, ["seed0/sft-dense-48"]),
        (TOOL_PATH, set(TOOL_PATH), ["seed0/sft-tool", "seed0/grpo-tool", "seed0/sft-dense-48"]),
        # A continuation starts from GRPO's checkpoint, GRPO from the SFT's export: all three again.
        (LONGER, {"sft-tool", "grpo-tool"}, []),
        (
            LONGER,
            {"sft-tool", "grpo-tool", "grpo-tool-300"},
            ["seed0/sft-tool", "seed0/grpo-tool", "seed0/grpo-tool-300"],
        ),
    ],
)
def test_a_stage_a_later_stage_starts_from_is_restored_only_with_it(
    tmp_path: Path, stages: list[str], recorded: set[str], restored: list[str]
) -> None:
    records = tmp_path / "records"
    for stage in recorded:
        finished(tmp_path / "seed0" / stage)
        zoom_records.keep(records, 0, stage, [tmp_path / "seed0" / stage])
    starts_from = {"grpo-tool": "sft-tool", "grpo-tool-300": "grpo-tool"}
    assert zoom_records.restore_finished(records, tmp_path / "out", [0], stages, starts_from) == restored


def test_a_bench_started_on_an_empty_folder_trains_only_what_has_no_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bench's own loop, its lvrl commands replaced by folders written as they would be: the
    first run records every stage; a second, on an empty --out, restores them all and trains
    and records nothing; a third, GRPO's record gone, trains and records the tool SFT and GRPO
    again (GRPO needs the SFT's export) and restores the dense baseline. The reports agree."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset.json").write_text(json.dumps({"config": {"size": 56}}))
    ran: list[str] = []

    def run_once(out: Path, work: object) -> None:
        if not (out / "done").exists():
            ran.append(out.name)
            finished(out)

    def train(run_dir: Path, config: dict, continuing: Path | None = None) -> zoom.Cost:
        run_once(run_dir, None)
        return zoom.stage_cost(run_dir)

    def evaluate(
        run_dir: Path, shards: str, name: str, given_request: bool = False
    ) -> tuple[Path, zoom.Cost]:
        out = run_dir.parent / f"{run_dir.name}-{name}"
        run_once(out, None)
        return out, zoom.stage_cost(out)

    monkeypatch.setattr(zoom, "train", train)
    monkeypatch.setattr(zoom, "evaluate", evaluate)
    monkeypatch.setattr(zoom, "run_lvrl", lambda *args, **kwargs: None)
    monkeypatch.setattr(zoom, "swapped_videos", lambda data, split, out: out)
    monkeypatch.setattr(zoom, "tokens_per_frame", lambda model, side, pixels: 2.0)
    monkeypatch.setattr(zoom.zoom_oracle_data, "build", lambda random, out, log_dir: None)
    monkeypatch.setattr(zoom, "last", lambda metrics, name: 0.5)
    monkeypatch.setattr(
        zoom, "last_predictions", lambda eval_dir: {"synth-test-000000": "grpo" in eval_dir.name}
    )
    monkeypatch.setattr(zoom, "span_hits", lambda eval_dir: {"synth-test-000000": True})
    records = tmp_path / "records"
    kept: list[str] = []
    keep = zoom_records.keep

    def keep_and_note(records: Path, seed: int, stage: str, folders: list[Path]) -> Path:
        kept.append(stage)
        return keep(records, seed, stage, folders)

    monkeypatch.setattr(zoom.zoom_records, "keep", keep_and_note)

    def bench(out: str) -> str:
        argv = ["zoom.py", "--data", str(data), "--oracle-data", str(tmp_path / "oracle"), "--seeds", "0"]
        argv += ["--out", str(tmp_path / out), "--records", str(records)]
        monkeypatch.setattr("sys.argv", [*argv, "--stages", "sft-tool", "grpo-tool", "sft-dense-48"])
        ran.clear()
        kept.clear()
        zoom.main()
        printed = capsys.readouterr().out
        return printed[printed.index("zoom task") :]

    first = bench("first")
    assert ran == [
        *("sft-tool", "sft-tool-val", "sft-tool-test", "sft-tool-probe", "sft-tool-val-given-oracle"),
        *("grpo-tool", "grpo-tool-val", "grpo-tool-test", "grpo-tool-probe"),
        *("sft-dense-48", "sft-dense-48-val", "sft-dense-48-test", "sft-dense-48-probe"),
    ]
    assert sorted(p.name for p in (records / "seed0").iterdir()) == ["grpo-tool", "sft-dense-48", "sft-tool"]
    # The report is a results file beside its records, with where it came from.
    written = (records / "report-seeds-0.md").read_text()
    assert "- commit: " in written and "- command: zoom.py --data" in written
    assert first.split("\nwritten: ")[0].strip() in written
    assert kept == ["sft-tool", "grpo-tool", "sft-dense-48"]
    # Restored stages are not recorded again.
    assert bench("second") == first and ran == [] and kept == []
    (records / "seed0" / "grpo-tool" / zoom_records.MANIFEST).unlink()
    assert bench("third") == first
    assert ran == [
        *("sft-tool", "sft-tool-val", "sft-tool-test", "sft-tool-probe", "sft-tool-val-given-oracle"),
        *("grpo-tool", "grpo-tool-val", "grpo-tool-test", "grpo-tool-probe"),
    ]
    assert kept == ["sft-tool", "grpo-tool"]


@pytest.mark.parametrize("folders", [["../../elsewhere"], [".."], ["sft-tool/../.."], ["other"]])
def test_a_record_whose_manifest_names_other_places_is_refused(tmp_path: Path, folders: list[str]) -> None:
    """An edited record can neither remove nor write outside the seed's folder, nor carry files
    its manifest does not list."""
    records, out = tmp_path / "records", tmp_path / "out"
    finished(tmp_path / "seed0" / "sft-tool")
    record = zoom_records.keep(records, 0, "sft-tool", [tmp_path / "seed0" / "sft-tool"])
    manifest = json.loads((record / zoom_records.MANIFEST).read_text())
    (record / zoom_records.MANIFEST).write_text(json.dumps({**manifest, "folders": folders}))
    (out / "keep-me").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"plain names|outside the folders"):
        zoom_records.restore(records, out, 0, "sft-tool")
    assert (out / "keep-me").is_dir() and not (out / "seed0").exists()


def test_a_reading_written_beside_a_record_is_left_out_of_its_restore(tmp_path: Path) -> None:
    """``bench/zoom_curve.py --out RECORD/curve.md`` writes a reading beside a finished record: a
    restore puts back the working folders and leaves the reading; a markdown file inside a folder
    the manifest does not list is still a stray."""
    records, out = tmp_path / "records", tmp_path / "out"
    kept = finished(tmp_path / "seed0" / "grpo-tool")
    record = zoom_records.keep(records, 0, "grpo-tool", [tmp_path / "seed0" / "grpo-tool"])
    (record / "curve.md").write_text("| steps | span hit |\n")
    assert zoom_records.restore(records, out, 0, "grpo-tool")
    assert files(out / "seed0" / "grpo-tool") == kept
    assert sorted(p.name for p in (out / "seed0").iterdir()) == ["grpo-tool"]
    (record / "other").mkdir()
    (record / "other" / "notes.md").write_text("not a reading\n")
    with pytest.raises(ValueError, match="outside the folders"):
        zoom_records.restore(records, tmp_path / "again", 0, "grpo-tool")
