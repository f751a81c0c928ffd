"""bench/zoom.py, the where-to-look comparison: stages in order with their plateau and frames, the
reading probe's swapped videos, the report's splits and target verdict; the longer GRPO runs
continue the one before from its checkpoint with the first's recipe changes, and a length is
chosen on the validation split and judged on the test split alone."""

from __future__ import annotations

import argparse
import copy
import io
import json
import re
import tarfile
from pathlib import Path

import pytest
import yaml

from bench import grpo_runs, zoom
from bench.zoom import with_settings
from bench.zoom_listings import reference_readings, tally
from bench.zoom_report import (
    Cost,
    Plateau,
    SeedResult,
    longer_grpo_report,
    paired_line,
    training_lines,
    verdict,
)

REPO = Path(__file__).resolve().parents[2]


def answers(val: list[bool], test: list[bool]) -> dict[str, bool]:
    """One seed's answers: ``synth-val-N`` and ``synth-test-N`` questions, as the zoom data names them."""
    named = {f"synth-val-{i:06d}": right for i, right in enumerate(val)}
    return named | {f"synth-test-{i:06d}": right for i, right in enumerate(test)}


def test_the_length_is_chosen_on_validation_and_judged_on_test_alone() -> None:
    """Two seeds of 10 + 10 questions. On validation the 300-step runs answer 15 of 20, the
    400-step runs 13 (and 200 steps 10): 300 is chosen, though 400 is far better on test. The
    paired test then counts test questions only: against the start's 4 of 20 test answers,
    300 steps answers 9, right on 5 questions the start missed and wrong on none it had."""
    sft = [answers([True] * 5 + [False] * 5, [True] * 2 + [False] * 8)] * 2
    grpo = {
        200: [answers([True] * 5 + [False] * 5, [True] * 2 + [False] * 8)] * 2,
        300: [
            answers([True] * 8 + [False] * 2, [True] * 5 + [False] * 5),
            answers([True] * 7 + [False] * 3, [True] * 4 + [False] * 6),
        ],
        400: [
            answers([True] * 6 + [False] * 4, [True] * 10),
            answers([True] * 7 + [False] * 3, [True] * 10),
        ],
    }
    report = longer_grpo_report(200, [0, 1], sft, grpo)
    assert "| 300 steps | 0.750 | 0.450 |" in report
    assert "| 400 steps | 0.650 | 1.000 |" in report
    assert "| SFT start | 0.500 | 0.200 |" in report
    assert "tool GRPO, 300 steps (chosen on validation) vs tool SFT, test split" in report
    assert "+25.0% on 20 answers (5 right only in the first, 0 only in the second)" in report


def test_a_tie_on_validation_goes_to_the_shorter_run() -> None:
    same = [answers([True, False], [False, False])]
    report = longer_grpo_report(200, [0], same, {200: same, 300: same})
    assert "tool GRPO, 200 steps (chosen on validation)" in report


def test_questions_without_a_split_in_their_ids_are_refused() -> None:
    other = [{"videomme-001": True, "q2": False}]
    with pytest.raises(ValueError, match="no val questions"):
        longer_grpo_report(200, [0], other, {200: other})


def test_per_seed_results_are_named_by_the_seed_number_not_its_place() -> None:
    """``--seeds 1 0`` lists seed 1's answers first: its gain (+2 of 2) is printed as seed 1's,
    seed 0's (none) as seed 0's. The pooled count keeps the two seeds' same-named questions
    apart: 4 questions, not 2."""
    seed1_start, seed1_after = {"q1": False, "q2": False}, {"q1": True, "q2": True}
    seed0_both = {"q1": True, "q2": False}
    line = paired_line("GRPO vs SFT", [1, 0], [seed1_start, seed0_both], [seed1_after, seed0_both])
    assert "seed 1: +100.0% (p = 0.5)" in line
    assert "seed 0: +0.0% (p = 1)" in line
    assert "+50.0% on 4 answers (2 right only in the first, 0 only in the second)" in line
    with pytest.raises(ValueError):
        paired_line("GRPO vs SFT", [1], [seed1_start, seed0_both], [seed1_after, seed0_both])


def test_a_continued_run_starts_from_the_given_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first attempt starts from the shorter run's checkpoint; once it wrote its own, a
    stopped attempt resumes from that."""
    calls: list[list[str]] = []
    monkeypatch.setattr(grpo_runs, "run_lvrl", lambda run_dir, arguments, **kwargs: calls.append(arguments))
    shorter = tmp_path / "grpo-tool" / "checkpoints" / "last.ckpt"
    run_dir = tmp_path / "grpo-tool-300"
    grpo_runs.fit_or_resume(run_dir, continuing=shorter)
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").touch()
    grpo_runs.fit_or_resume(run_dir, continuing=shorter)
    config = ["fit", "--config", str(run_dir / "config.yaml")]
    assert calls == [[*config, "--ckpt_path", str(shorter)], [*config, "--ckpt_path", "last"]]


def test_recipe_settings_are_read_as_yaml_into_sections_that_exist() -> None:
    config = {"model": {"init_args": {"learning_rate": 3e-5, "kl_kind": "k3"}}, "data": {"init_args": {}}}
    settings = [
        "model.init_args.learning_rate=5e-5",  # a string to PyYAML (YAML 1.1): meant as a number
        "model.init_args.kl_kind=k2",
        "data.init_args.batch_size=16",
        "model.init_args.rollout_correction={mode: mask, upper: 2.0}",
    ]
    changed = with_settings(config, settings)
    init_args = changed["model"]["init_args"]
    assert init_args["learning_rate"] == 5e-5 and isinstance(init_args["learning_rate"], float)
    assert init_args["kl_kind"] == "k2"
    assert init_args["rollout_correction"] == {"mode": "mask", "upper": 2.0}
    assert changed["data"]["init_args"]["batch_size"] == 16
    with pytest.raises(ValueError, match="no mapping 'modle'"):
        with_settings(config, ["modle.init_args.learning_rate=1e-4"])
    with pytest.raises(ValueError, match="no mapping 'kl_kind'"):  # a value is not a section
        with_settings(config, ["model.init_args.kl_kind.inner=1"])
    with pytest.raises(ValueError, match=r"expected dotted\.key=VALUE"):
        with_settings(config, ["model.init_args.learning_rate"])


def test_recipe_settings_reach_a_callback_by_its_index() -> None:
    """The rewards live in the rollout callback's init_args, an item of trainer.callbacks."""
    config = yaml.safe_load((REPO / "configs" / "zoom" / "grpo_tool.yaml").read_text())
    rewards = (
        "[{name: accuracy, weight: 0.9}, {name: format, weight: 0.1}, {name: marker_listing, weight: 0.3}]"
    )
    changed = with_settings(config, [f"trainer.callbacks.0.init_args.rewards={rewards}"])
    rollout = changed["trainer"]["callbacks"][0]
    assert rollout["class_path"].endswith("RolloutCallback")
    assert [r["name"] for r in rollout["init_args"]["rewards"]] == ["accuracy", "format", "marker_listing"]
    with pytest.raises(ValueError, match=r"no list item 'trainer\.callbacks\.99'"):
        with_settings(config, ["trainer.callbacks.99.init_args.num_generations=4"])
    with pytest.raises(ValueError, match=r"no list item 'trainer\.callbacks\.first'"):
        with_settings(config, ["trainer.callbacks.first.init_args.num_generations=4"])
    with pytest.raises(ValueError, match=r"'trainer\.callbacks' is not a mapping"):
        with_settings(config, ["trainer.callbacks.num_generations=4"])


def test_each_continuation_trains_with_the_first_runs_recipe_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 300- and 400-step runs continue the changed recipe, not the config file's own."""
    trained: list[tuple[Path, dict, Path | None]] = []

    def train(run_dir: Path, config: dict, continuing: Path | None = None) -> zoom.Cost:
        trained.append((run_dir, config, continuing))
        return zoom.Cost(1.0)

    monkeypatch.setattr(zoom, "train", train)
    monkeypatch.setattr(
        zoom,
        "evaluate",
        lambda run_dir, shards, name: (run_dir.parent / f"{run_dir.name}-{name}", zoom.Cost(1.0)),
    )
    monkeypatch.setattr(zoom, "last_predictions", lambda eval_dir: {f"synth-{eval_dir.name[-4:]}-0": True})
    first = tmp_path / "seed1" / "grpo-tool"
    settings = ["data.init_args.batch_size=16", "model.init_args.learning_rate=5e-5"]
    zoom.continue_grpo(first, "data/zoom", 1, [300, 400], {}, settings)
    assert [run_dir.name for run_dir, _, _ in trained] == ["grpo-tool-300", "grpo-tool-400"]
    assert [continuing for _, _, continuing in trained] == [
        first / "checkpoints" / "last.ckpt",
        tmp_path / "seed1" / "grpo-tool-300" / "checkpoints" / "last.ckpt",
    ]
    for _, config, _ in trained:
        assert config["data"]["init_args"]["batch_size"] == 16
        assert config["model"]["init_args"]["learning_rate"] == 5e-5
        assert config["model"]["init_args"]["model_path"] == str(tmp_path / "seed1" / "sft-tool" / "hf")


def test_listings_are_tallied_against_the_held_out_rows(tmp_path: Path) -> None:
    """bench/zoom_listings.py: a listing is right when every colour's size is; its times are right
    when every time is the reference's, tied when two colours share one; counts by hand."""
    truth = "Markers by colour: red none, green small at 00:14, yellow huge at 00:00, white none."
    rows = {
        "val": {"synth-val-000000": truth, "synth-val-000002": truth},
        "test": {"synth-test-000001": truth, "synth-test-000003": truth},
    }
    for split, split_rows in rows.items():
        with tarfile.open(tmp_path / f"{split}-00000.tar", "w") as tar:
            for problem_id, reasoning in split_rows.items():
                body = json.dumps({"problem_id": problem_id, "reasoning": reasoning}).encode()
                member = tarfile.TarInfo(f"{problem_id}.json")
                member.size = len(body)
                tar.addfile(member, io.BytesIO(body))
    readings = reference_readings(tmp_path)
    assert readings == {**rows["val"], **rows["test"]}
    listed = (
        "<think>Markers by colour: red none, green small at 00:09, yellow huge at 00:01, white none.</think>"
    )
    misread = listed.replace("yellow huge", "yellow large")
    tied = listed.replace("00:01", "00:09")
    (tmp_path / "eval" / "predictions").mkdir(parents=True)
    records = [
        {"problem_id": "synth-val-000000", "category": "Temporal", "completion": listed, "correct": False},
        {"problem_id": "synth-test-000001", "category": "Spatial", "completion": misread, "correct": True},
        {"problem_id": "synth-val-000002", "category": "Temporal", "completion": truth, "correct": True},
        {"problem_id": "synth-test-000003", "category": "Temporal", "completion": tied, "correct": False},
    ]
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "eval" / "predictions" / "val-step000000.jsonl").write_text(lines)
    counts = tally(tmp_path / "eval", readings)
    every = counts["all"]
    assert (every.answers, every.listed_right) == (4, 3)
    assert (every.right_given_listed_right, every.right_given_listed_wrong) == (1, 1)
    assert counts["Temporal"].listed_right == 3 and counts["Spatial"].listed_right == 0
    assert (every.timed, every.times_right, every.times_tied) == (4, 1, 1)
    assert (counts["Temporal"].times_right, counts["Temporal"].times_tied) == (1, 1)
    assert every.line() == (
        "listing right 3/4; answer right given a right listing 1/3, given a wrong one 1/1; "
        "written times right 1/4, two colours at one time 1/4"
    )


def test_the_stages_run_in_order_and_the_report_reads_the_test_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--stages picks the settings; each trains, then answers the validation split, the test split
    and the probe; the report keeps the splits apart and states the target's verdict."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset.json").write_text(json.dumps({"config": {"size": 56}}))
    trained: list[str] = []
    evaluated: list[tuple[str, str]] = []
    monkeypatch.setattr(zoom, "run_lvrl", lambda *args, **kwargs: None)
    monkeypatch.setattr(zoom, "swapped_videos", lambda data, split, out: out)
    monkeypatch.setattr(zoom, "tokens_per_frame", lambda model, side, pixels: 2.0)

    def train(run_dir: Path, config: dict, continuing: Path | None = None) -> zoom.Cost:
        trained.append(run_dir.name)
        return zoom.Cost(100.0)

    monkeypatch.setattr(zoom, "train", train)

    given: list[tuple[str, bool]] = []

    def evaluate(
        run_dir: Path, shards: str, name: str, given_request: bool = False
    ) -> tuple[Path, zoom.Cost]:
        evaluated.append((run_dir.name, name))
        given.append((shards, given_request))
        return run_dir.parent / f"{run_dir.name}-{name}", zoom.Cost(1.0)

    copies: list[Path] = []
    monkeypatch.setattr(zoom.zoom_oracle_data, "build", lambda random, out, log_dir: copies.append(out))

    accuracy = {"sft-tool": 0.40, "grpo-tool": 0.60, "sft-dense-48": 0.30}
    monkeypatch.setattr(zoom, "evaluate", evaluate)
    monkeypatch.setattr(
        zoom,
        "last",
        lambda metrics, name: {
            "val/accuracy": 0.25
            if metrics.parent.name.endswith("probe")
            else 0.9
            if metrics.parent.name.endswith("given-oracle")
            else accuracy[metrics.parent.name.rsplit("-", 1)[0]],
            # Each split's own figures: the validation table must not show the test split's.
            "val/frames_per_answer": 38.0 if metrics.parent.name.endswith("-val") else 40.0,
            "val/requests_per_answer": 1.25 if metrics.parent.name.endswith("-val") else 1.5,
            "val/span_hit_rate": (0.45 if metrics.parent.name.endswith("-val") else 0.5)
            if "grpo" in str(metrics)
            else 0.25,
        }[name],
    )
    right = {"sft-tool-test": False, "grpo-tool-test": True, "sft-dense-48-test": False}
    monkeypatch.setattr(
        zoom, "last_predictions", lambda eval_dir: {"synth-test-000000": right.get(eval_dir.name, True)}
    )
    monkeypatch.setattr(zoom, "span_hits", lambda eval_dir: {"synth-test-000000": "grpo" in eval_dir.name})
    steps = {"sft-tool": [600, 650], "grpo-tool": [200], "sft-dense-48": [3000]}
    monkeypatch.setattr(zoom, "last_steps", lambda csv_dir: steps[csv_dir.parent.name])
    # dense 48's validation-loss checks: no fall of more than 0.001 over the last three.
    curves = {"sft-dense-48": [0.5, 0.3, 0.2995, 0.2992, 0.2991]}
    monkeypatch.setattr(zoom, "column", lambda csv_dir, name: curves[csv_dir.parent.name])
    oracle = tmp_path / "oracle"
    argv = [
        "zoom.py",
        "--data",
        str(data),
        "--oracle-data",
        str(oracle),
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "out"),
        "--tool-sft-steps",
        "650",
    ]
    argv += ["--stages", "sft-tool", "grpo-tool", "sft-dense-48"]
    monkeypatch.setattr("sys.argv", argv)
    zoom.main()
    printed = capsys.readouterr().out
    assert trained == ["sft-tool", "grpo-tool", "sft-dense-48"]
    assert evaluated[:4] == [
        ("sft-tool", "val"),
        ("sft-tool", "test"),
        ("sft-tool", "probe"),
        ("sft-tool", "val-given-oracle"),
    ]
    # The tool SFT's reading check: the oracle copy's validation split, its request given.
    assert copies == [oracle] and given[3] == (f"{oracle}/val-*.tar", True)
    assert not any(request for _, request in given[:3] + given[4:])
    assert "on its own requests -> given the oracle request: seed 1 40.0% -> 90.0%" in printed
    validation, test = printed.split("test split")[0], printed.split("test split")[1]
    assert (
        "| tool GRPO | 0.600 ± 0.000 | 1: 0.600 | 38.0 ± 0.0 | 76 ± 0 | 200 ± 0 | 100 ± 0 | 1.25 ± 0.00 "
        "| 0.450 ± 0.000 |" in validation
    )
    assert (
        "| tool GRPO | 0.600 ± 0.000 | 1: 0.600 | 40.0 ± 0.0 | 80 ± 0 | 200 ± 0 | 100 ± 0 | 1.50 ± 0.00 "
        "| 0.500 ± 0.000 | 0.250 ± 0.000 |" in test
    )
    assert (
        "| dense 48 | 0.300 ± 0.000 | 1: 0.300 | 48.0 ± 0.0 | 96 ± 0 | 3000 ± 0 | 100 ± 0 | - | - "
        "| 0.250 ± 0.000 |" in test
    )
    assert "tool GRPO vs tool SFT" in test and "tool SFT vs dense 48" in test and "span hit" in test
    assert "tool GRPO 0.600 vs dense 48 0.300: met" in test
    # Each stage trained 100 CPU seconds: the tool path (SFT + GRPO) 200.
    assert "- tool SFT: ran its budget of 650 steps in 1 of 1 seeds\n" in test
    assert (
        "- dense 48: steps seed 1 3000 (at least 650, at most 3000); validation loss at the end (no fall "
        "of more than 0.001 in its last 3 checks: plateaued): plateaued in seeds [1]; 0.50 times the "
        "tool path's CPU seconds" in test
    )
    # Another video's frames cost dense 48 only 5 points: it does not read, so it is no bar.
    assert "best dense baseline that reads: no dense baseline reads" in test
    with pytest.raises(SystemExit):
        monkeypatch.setattr("sys.argv", [*argv[:-3], "grpo-tool"])
        zoom.main()


def test_the_tool_sft_runs_its_budget_and_validates_its_loss_without_a_stop() -> None:
    """Its loss is mostly the random first request: a plateau of it says nothing of the reading."""
    tool = zoom.stage_config(zoom.STAGES[0], Path("r"), Path("m"), "d", 0, 2500)
    assert tool["trainer"]["max_steps"] == 2500
    assert not any(c["class_path"].endswith("EarlyStopping") for c in tool["trainer"]["callbacks"])
    assert tool["trainer"]["val_check_interval"] == zoom.TOOL_SFT_VAL_EVERY
    assert tool["trainer"]["limit_val_batches"] == zoom.PLATEAU_BATCHES
    assert tool["model"]["init_args"]["val_answers"] is False
    assert zoom.STAGES[0].plateau is False and zoom.STAGES[2].plateau is True


def test_a_baseline_trains_the_tool_sfts_budget_then_to_its_plateau_and_at_its_frames() -> None:
    dense = zoom.stage_config(zoom.STAGES[2], Path("r"), Path("m"), "d", 0, 3000, min_steps=2500)
    assert (
        dense["data"]["init_args"]["num_frames"] == 48
        and dense["data"]["init_args"]["val_num_frames"] is None
    )
    assert dense["model"]["init_args"]["val_answers"] is False
    assert dense["trainer"]["limit_val_batches"] == zoom.PLATEAU_BATCHES
    (stop,) = [c for c in dense["trainer"]["callbacks"] if c["class_path"].endswith("EarlyStopping")]
    assert (
        stop["init_args"]["monitor"] == "val/loss"
        and stop["init_args"]["patience"] == zoom.PLATEAU.patience
        and stop["init_args"]["min_delta"] == zoom.PLATEAU.min_delta
    )
    # A plateau before the floor does not count (Lightning's min_steps would stop there at the floor).
    assert stop["class_path"] == "callbacks.early_stopping.DeferredEarlyStopping"
    assert stop["init_args"]["after_step"] == 2500 and "min_steps" not in dense["trainer"]
    capped = zoom.stage_config(zoom.STAGES[5], Path("r"), Path("m"), "d", 0, 2000, min_steps=2500)
    (stop,) = [c for c in capped["trainer"]["callbacks"] if c["class_path"].endswith("EarlyStopping")]
    assert stop["init_args"]["after_step"] == 2000 == capped["trainer"]["max_steps"]
    grpo = zoom.stage_config(zoom.GRPO, Path("r"), Path("m"), "d", 0, 200)
    assert grpo["trainer"]["limit_val_batches"] == 0
    assert not any(c["class_path"].endswith("EarlyStopping") for c in grpo["trainer"]["callbacks"])
    oracle = zoom.stage_config(zoom.STAGES[3], Path("r"), Path("m"), "o", 0, 3000)
    assert oracle["data"]["init_args"]["tool_given_request"] is True
    assert oracle["data"]["init_args"]["train_shards"] == "o/train-*.tar"


def test_the_probe_gives_each_question_another_questions_video(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with tarfile.open(data / "test-00000.tar", "w") as tar:
        for index in range(3):
            for extension, payload in (("json", f"row {index}"), ("mp4", f"video {index}")):
                info = tarfile.TarInfo(f"synth-test-{index:06d}.{extension}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload.encode()))
    out = zoom.swapped_videos(data, "test", tmp_path / "probe")
    with tarfile.open(out / "test-00000.tar") as tar:
        files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert [files[f"synth-test-{i:06d}.json"] for i in range(3)] == ["row 0", "row 1", "row 2"]
    assert [files[f"synth-test-{i:06d}.mp4"] for i in range(3)] == ["video 1", "video 2", "video 0"]


def test_a_stage_run_with_another_recipe_is_refused_not_reported(tmp_path: Path) -> None:
    """A folder's finished (or stopped) stage is reused only when this command would train the
    same thing: another SFT length or another GRPO setting stops the bench with the keys that
    differ, while a folder restored from another --out (its paths alone differ) is reported."""
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    run_dir = out / "seed0" / "sft-tool"
    run_dir.mkdir(parents=True)
    restored = elsewhere / "seed0" / "sft-tool"
    recorded = zoom.stage_config(zoom.STAGES[0], restored, elsewhere / "model-small", "d", 0, 600)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(recorded))
    (run_dir / "done").touch()
    attempt(run_dir, 12.0)
    same = zoom.stage_config(zoom.STAGES[0], run_dir, out / "model-small", "d", 0, 600)
    assert zoom.train(run_dir, same) == zoom.Cost(12.0)
    longer = zoom.stage_config(zoom.STAGES[0], run_dir, out / "model-small", "d", 0, 900)
    with pytest.raises(SystemExit, match=r"trainer\.max_steps: 600 -> 900"):
        zoom.train(run_dir, longer)
    (run_dir / "done").unlink()  # a stopped run is not resumed under another recipe either
    with pytest.raises(SystemExit, match=r"trainer\.max_steps: 600 -> 900"):
        zoom.train(run_dir, longer)

    grpo_dir = out / "seed0" / "grpo-tool"
    grpo_dir.mkdir()
    grpo = zoom.stage_config(zoom.GRPO, grpo_dir, run_dir / "hf", "d", 0, 200)
    default = grpo["trainer"]["callbacks"][0]["init_args"]["temperature"]  # the config's own
    hotter = with_settings(
        copy.deepcopy(grpo), [f"trainer.callbacks.0.init_args.temperature={default + 0.5}"]
    )
    (grpo_dir / "config.yaml").write_text(yaml.safe_dump(hotter))
    (grpo_dir / "done").touch()
    attempt(grpo_dir, 5.0)
    changed = f"callbacks.0.init_args.temperature: {default + 0.5} -> {default}"
    with pytest.raises(SystemExit, match=re.escape(changed)):
        zoom.train(grpo_dir, grpo)
    assert zoom.train(grpo_dir, hotter) == zoom.Cost(5.0)
    # A recipe run that kept every checkpoint (for a probe of its steps) trained the same thing.
    checkpoint = next(
        i for i, c in enumerate(hotter["trainer"]["callbacks"]) if "RunCheckpoint" in c["class_path"]
    )
    kept_all = with_settings(
        copy.deepcopy(hotter), [f"trainer.callbacks.{checkpoint}.init_args.save_top_k=-1"]
    )
    (grpo_dir / "config.yaml").write_text(yaml.safe_dump(kept_all))
    assert zoom.train(grpo_dir, hotter) == zoom.Cost(5.0)


def attempt(run_dir: Path, cpu_seconds: float | None, **more: object) -> None:
    """A record as bench.grpo_runs.run_lvrl appends it (the fields the cost reads)."""
    with (run_dir / grpo_runs.ATTEMPTS).open("a") as records:
        records.write(json.dumps({"cpu_seconds": cpu_seconds, **more}) + "\n")


def logged_steps(run_dir: Path, *versions: list[int]) -> None:
    """A CSV logger's version folders, each logging after ``steps`` (a count of steps done; Lightning
    writes the step's 0-based index, one less)."""
    for number, steps in enumerate(versions):
        folder = run_dir / "csv" / f"version_{number}"
        folder.mkdir(parents=True)
        rows = "".join(f"{step - 1},0.5\n" for step in steps)
        (folder / "metrics.csv").write_text("step,train/loss\n" + rows)


def test_a_stage_costs_the_cpu_of_its_attempts_and_charges_unmeasured_steps_at_the_measured_rate(
    tmp_path: Path,
) -> None:
    """Two measured attempts add up. Attempts run before CPU time was counted (one hand-written
    record for the first two CSV versions, up to step 600) are charged per step at the rate of
    the measured ones: 300 s over steps 600-900 is 1 s a step, so the whole 900 steps are 900 s,
    marked as estimated. With no measured step there is no rate: not a number, not a guess."""
    measured = tmp_path / "measured"
    measured.mkdir()
    attempt(measured, 40.0)
    attempt(measured, 2.5)
    assert zoom.stage_cost(measured) == zoom.Cost(42.5)

    legacy = tmp_path / "legacy"
    legacy.mkdir()
    attempt(legacy, None, csv_versions=2, wall_seconds=9000.0)
    # The measured attempt resumed from the checkpoint of step 600 (a SIGTERM stop writes one).
    logged_steps(legacy, [10, 200, 400], [410, 600], [610, 750, 900])
    attempt(legacy, 300.0)
    assert zoom.stage_cost(legacy) == zoom.Cost(900.0, estimated=True)
    assert zoom.cost_cell([zoom.Cost(900.0, estimated=True), zoom.Cost(700.0)]) == "~800 ± 141"

    assert zoom.last_steps(legacy / "csv") == [400, 600, 900]

    nothing_measured = tmp_path / "nothing"
    nothing_measured.mkdir()
    attempt(nothing_measured, None, csv_versions=1)
    logged_steps(nothing_measured, [10, 20])
    cost = zoom.stage_cost(nothing_measured)
    assert cost.estimated and cost.cpu_seconds != cost.cpu_seconds


def test_the_report_says_which_cpu_counted_each_stages_seconds(tmp_path: Path) -> None:
    """A stage's cost carries the CPUs its attempts ran on (a stage resumed on a new machine has
    two); the report names one CPU when every stage shares it, and otherwise which CPU ran each
    stage of each seed, since CPU seconds of two CPU models are not one unit."""
    moved = tmp_path / "moved"
    moved.mkdir()
    attempt(moved, 10.0, machine={"cpu": "AMD EPYC", "cores": 2})
    attempt(moved, 5.0, machine={"cpu": "Intel Xeon", "cores": 2})
    assert zoom.stage_cost(moved) == zoom.Cost(15.0, machines=("AMD EPYC", "Intel Xeon"))

    amd, intel = zoom.Cost(1.0, machines=("AMD EPYC",)), zoom.Cost(1.0, machines=("Intel Xeon",))
    assert zoom.summed([amd, intel]).machines == ("AMD EPYC", "Intel Xeon")
    one = {"tool SFT training": [amd, amd], "dense 48 training": [amd, amd]}
    assert zoom.machine_line(one, [0, 1]) == "CPU seconds counted on one CPU: AMD EPYC"
    two = {"tool SFT training": [amd, amd], "dense 48 training": [amd, intel]}
    line = zoom.machine_line(two, [0, 1])
    assert line.startswith("CPU seconds counted on different CPUs")
    stages = (
        "tool SFT training: AMD EPYC (seed 0, 1), dense 48 training: AMD EPYC (seed 0); Intel Xeon (seed 1)"
    )
    assert line.endswith(stages)


def test_the_status_line_says_where_a_stage_stands(tmp_path: Path) -> None:
    run_dir = tmp_path / "seed0" / "sft-tool"
    evaluations = ["val", "test"]
    assert zoom.stage_state(run_dir, 3000, evaluations, recorded=False) == "sft-tool: not started"
    assert "recorded, not in this folder" in zoom.stage_state(run_dir, 3000, evaluations, recorded=True)
    (run_dir / "csv" / "version_0").mkdir(parents=True)
    rows = "".join(f"0.5,{step}\n" for step in range(9, 350, 10))  # logged every 10 steps: 349 last
    (run_dir / "csv" / "version_0" / "metrics.csv").write_text("train/loss,step\n" + rows)
    assert zoom.stage_state(run_dir, 3000, evaluations, recorded=False) == (
        "sft-tool: training: step 350 of 3000; evaluated: none of val, test"
    )
    # The pace and ETA of the last training progress line, of whichever attempt printed it last.
    (run_dir / "run.log").write_text(
        "train step 340/3000 (11%)  loss 0.25  2.31 s/step  ETA 1h 42m\n"
        "train step 350/3000 (12%)  loss 0.2491  4.04 s/step  ETA 2h 58m\n"
        "Traceback (most recent call last):\n"
        "train step 10/3000 (0%)  loss 0.5\n"  # a resumed attempt's first line: no pace yet
        "validate done: 5 batches in 12s\n"
    )
    assert zoom.stage_state(run_dir, 3000, evaluations, recorded=False) == (
        "sft-tool: training: step 350 of 3000 (its last progress line: 4.04 s/step, ETA 2h 58m); "
        "evaluated: none of val, test"
    )
    (run_dir / "done").touch()
    (tmp_path / "seed0" / "sft-tool-val").mkdir()
    (tmp_path / "seed0" / "sft-tool-val" / "done").touch()
    assert zoom.stage_state(run_dir, 3000, evaluations, recorded=True) == (
        "sft-tool: trained (350 steps); evaluated: val of val, test, recorded"
    )


def test_the_tool_path_of_every_seed_runs_first_then_each_baseline_over_the_seeds() -> None:
    order = [(seed, stage.folder) for seed, stage in zoom.running_order(list(zoom.STAGES), [2, 0])]
    baselines = ["sft-dense-48", "sft-oracle", "sft-dense-128", "sft-dense-256"]
    assert order == [
        (2, "sft-tool"),
        (2, "grpo-tool"),
        (0, "sft-tool"),
        (0, "grpo-tool"),
        *((seed, stage) for stage in baselines for seed in (2, 0)),
    ]


def test_a_target_whose_baselines_were_not_run_gets_no_verdict() -> None:
    """Only the tool path run (``--stages sft-tool grpo-tool``): the targets against the dense
    baselines are neither met nor missed; the span hit target over seeds is judged."""

    def result(seed: int, accuracy: float, span_hit: float) -> SeedResult:
        return SeedResult(
            seed,
            {"test": accuracy, "probe": 0.25},
            {},
            {"test": 40.0},
            Cost(1.0),
            span_hit={"test": span_hit},
        )

    results = {
        "tool SFT": [result(0, 0.40, 0.25), result(1, 0.41, 0.24), result(2, 0.39, 0.26)],
        "tool GRPO": [result(0, 0.60, 0.50), result(1, 0.62, 0.52), result(2, 0.61, 0.49)],
    }
    lines = verdict(results)
    assert lines[0] == "- target: tool GRPO at least +0.10 over dense 48: no verdict, dense 48 was not run"
    assert lines[1].endswith("best dense baseline that reads: no verdict, no dense baseline was run")
    assert lines[2].startswith("- target: span hit rate above the SFT start across seeds: met")
    assert verdict({"tool SFT": results["tool SFT"]}) == ["- no verdict: tool GRPO was not run"]
    # One seed: the clause across seeds is neither met nor missed, and says so.
    one_seed = verdict({label: seeds[:1] for label, seeds in results.items()})
    assert one_seed[2] == (
        "- target: span hit rate above the SFT start across seeds: "
        "no verdict, a test across seeds needs two or more (1 run)"
    )
    # With dense 48 run and not reading (the probe costs it nothing), the first two are judged.
    results["dense 48"] = [
        SeedResult(s, {"test": 0.3, "probe": 0.3}, {}, {"test": 48.0}, Cost(1.0)) for s in (0, 1, 2)
    ]
    judged = verdict(results)
    assert judged[0] == "- target: tool GRPO 0.610 vs dense 48 0.300: met (at least +0.10)"
    assert judged[1].endswith("best dense baseline that reads: no dense baseline reads")


@pytest.mark.parametrize("option", ["--max-sft-steps", "--dense-256-steps"])
def test_a_baseline_cap_below_the_tool_sfts_budget_is_refused(
    option: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["zoom.py", option, "2000", "--tool-sft-steps", "3000"])
    with pytest.raises(SystemExit):
        zoom.main()
    assert f"{option}: a baseline trains at least the tool SFT's budget" in capsys.readouterr().err


def test_dense_256_alone_trains_its_compute_sized_budget() -> None:
    args = argparse.Namespace(grpo_steps=200, tool_sft_steps=3000, max_sft_steps=3500, dense_256_steps=5000)
    steps = {stage.folder: zoom.stage_steps(stage, args) for stage in zoom.STAGES}
    assert steps == {
        "sft-tool": 3000,
        "grpo-tool": 200,
        "sft-dense-48": 3500,
        "sft-oracle": 3500,
        "sft-dense-128": 3500,
        "sft-dense-256": 5000,
    }
    # The sizing its docstring states, from the records it was sized on: the tool path's training
    # CPU seconds a seed (tool SFT + tool GRPO, mean of seeds 0 and 1) and a dense 256 step's.
    records = REPO / "bench/results/zoom_protocol/bench-given-share-0.5"
    tool_path = (
        sum(
            zoom.stage_cost(records / f"seed{seed}" / stage / stage).cpu_seconds
            for seed in (0, 1)
            for stage in ("sft-tool", "grpo-tool")
        )
        / 2
    )
    assert f"the tool path's training cost {round(tool_path):,} CPU seconds a seed" in " ".join(
        (REPO / "bench/zoom.py").read_text().split()
    )
    pace = json.loads((records / "pace.json").read_text())
    assert zoom.DENSE_256_STEPS * pace["stages"]["sft-dense-256"]["cpu_seconds_a_step"] >= 3 * tool_path


def test_a_baseline_run_without_the_tool_path_says_so_instead_of_a_ratio() -> None:
    dense = SeedResult(1, {}, {}, {}, Cost(100.0), steps=3000, val_loss=[0.5, 0.4, 0.3, 0.2])
    (_, line) = training_lines(
        {"dense 48": [dense]}, {"dense 48": 3000}, 3000, {"tool SFT"}, Plateau(3, 0.001)
    )
    assert line.endswith("still falling in seeds [1]; the tool path was not run")


def test_the_pace_measure_trains_the_bench_config_without_checkpoints_validation_or_a_stop() -> None:
    from bench.zoom_pace import pace_config

    dense_256 = zoom.STAGES[5]
    config = pace_config(dense_256, Path("r"), Path("m"), "d", 25)
    bench = zoom.stage_config(dense_256, Path("r"), Path("m"), "d", 0, 25, min_steps=25)
    trainer = config["trainer"]
    assert trainer["max_steps"] == 25 and trainer["limit_val_batches"] == 0
    kept = [c["class_path"] for c in trainer["callbacks"]]
    assert [c["class_path"] for c in bench["trainer"]["callbacks"] if c["class_path"] not in kept] == [
        "callbacks.checkpoint.RunCheckpoint",
        "callbacks.early_stopping.DeferredEarlyStopping",
    ]
    # Everything that sets a step's work is the bench's: the data, its frames, the model.
    assert config["data"] == bench["data"] and config["model"] == bench["model"]
    assert config["data"]["init_args"]["num_frames"] == 256
