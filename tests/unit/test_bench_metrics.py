"""The benches read a run's CSV metrics as one history across its resumptions."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.grpo_runs import column


def write_attempt(folder: Path, version: int, rows: list[tuple[int, str, str]]) -> None:
    attempt = folder / f"version_{version}"
    attempt.mkdir(parents=True)
    lines = ["loss,step,val/accuracy", *(f"{loss},{step},{accuracy}" for step, loss, accuracy in rows)]
    (attempt / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_a_resumed_run_reads_as_one_history(tmp_path: Path) -> None:
    """Attempt 0 logs steps 9-39 and is killed after its checkpoint at step 20; attempt 1 resumes
    there and logs 29 and 39 again (and a validation row at step 39); attempts 2 and 10 follow, 10
    the latest. Each step comes from the latest attempt that logged it, and attempts are ordered
    by number, not as text."""
    metrics = tmp_path / "csv"
    write_attempt(metrics, 0, [(9, "0.9", ""), (19, "0.8", ""), (29, "0.7", ""), (39, "0.6", "")])
    write_attempt(metrics, 1, [(29, "0.65", ""), (39, "0.55", ""), (39, "", "0.5")])
    write_attempt(metrics, 10, [(49, "0.45", "")])  # "version_10" sorts before "version_2" as text
    write_attempt(metrics, 2, [(49, "0.4", ""), (59, "0.3", "0.75")])
    assert column(metrics, "loss") == [0.9, 0.8, 0.65, 0.55, 0.45, 0.3]
    assert column(metrics, "val/accuracy") == [0.5, 0.75]
    assert column(metrics / "version_0" / "metrics.csv", "loss") == [0.9, 0.8, 0.7, 0.6]


def test_a_saved_run_reads_the_same_gzipped(tmp_path: Path) -> None:
    """Saved results keep their logs gzipped (``metrics.csv.gz``): the history reads the same, and
    so do ``lvrl report``'s rows."""
    import gzip

    from app.commands.report import metric_rows

    metrics = tmp_path / "csv"
    write_attempt(metrics, 0, [(9, "0.9", ""), (19, "0.8", "")])
    write_attempt(metrics, 1, [(19, "0.75", ""), (29, "0.7", "0.5")])
    plain = column(metrics, "loss"), metric_rows(tmp_path)
    for log in metrics.glob("version_*/metrics.csv"):
        log.with_suffix(".csv.gz").write_bytes(gzip.compress(log.read_bytes()))
        log.unlink()
    assert (column(metrics, "loss"), metric_rows(tmp_path)) == plain and plain[0] == [0.9, 0.75, 0.7]


def test_an_evaluation_stopped_before_its_accuracy_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benches' held-out evaluation (``bench/grpo_runs.py``, used by ``bench/agreement.py`` and
    ``bench/mismatch.py``) keeps an evaluation that logged its accuracy and reruns one that did
    not; the rerun's ``version_1`` is the one read."""
    from bench import grpo_runs

    calls: list[list[str]] = []
    monkeypatch.setattr(grpo_runs, "run_lvrl", lambda out, arguments, **kwargs: calls.append(arguments))
    out = tmp_path / "eval"
    write_attempt(out / "csv", 0, [(0, "0.9", "")])  # stopped: a loss row, no accuracy yet
    grpo_runs.evaluate("model", out, "data", splits="test", samples=8)
    assert len(calls) == 1 and calls[0][0] == "validate"
    given = dict(zip(calls[0][1::2], calls[0][2::2], strict=True))
    assert given["--data.init_args.val_shards"] == "data/test-*.tar"
    assert given["--model.init_args.val_samples"] == "8"
    write_attempt(out / "csv", 1, [(0, "", "0.625")])  # what the rerun logs
    assert column(grpo_runs.evaluate("model", out, "data"), "val/accuracy") == [0.625]
    assert len(calls) == 1  # the finished evaluation is not run again
