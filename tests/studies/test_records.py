"""studies.records and studies.table: a study's plan and one row per run kept apart from its run folders, and
summarized from there."""

import json

import pytest

from regroup.errors import ConfigError
from studies.records import keep_records


def _study(root):
    """A real-model study folder as run_real_study leaves it while running: plan, progress, start evaluation,
    one finished RL run with its checkpoint and samples, one continued-SFT run with its merged model, and one
    RL run still training (no timing.json yet)."""
    (root / "data").mkdir(parents=True)
    (root / "data" / "train.jsonl").write_text('{"question": "1+1"}\n')  # the input split: not a record
    (root / "plan.json").write_text(json.dumps({"created": "2026-12-02T00:00:00Z"}))
    (root / "real_study.json").write_text(json.dumps([{"arm": "start"}]))
    for bench, counts in ((root / "start" / "heldout", [0, 1]), (root / "drgrpo-s1" / "eval" / "heldout", [1, 1])):
        bench.mkdir(parents=True)
        (bench / "per_problem.jsonl").write_text(
            "".join(json.dumps({"id": f"p{i}", "correct": c, "n": 2}) + "\n" for i, c in enumerate(counts))
        )
        (bench / "summary.json").write_text(json.dumps({"truncated_frac": 0.0}))
    run = root / "drgrpo-s1"
    (run / "config.yaml").write_text("seed: 1\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    (run / "samples.jsonl").write_text("{}\n")
    (run / "timing.json").write_text(json.dumps({"seconds": 2.0}))
    training = root / "matched-s1"
    training.mkdir()
    (training / "config.yaml").write_text("seed: 1\n")
    (training / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    (run / "checkpoints" / "step-30").mkdir(parents=True)
    (run / "checkpoints" / "step-30" / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "step-30" / "model.safetensors").write_bytes(b"\0" * 64)
    model = root / "sft_continued-s1" / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    (model / "sft_metrics.json").write_text(json.dumps({"losses": [1.0, 0.5]}))
    (root / "sft_continued-s1" / "timing.json").write_text(json.dumps({"seconds": 1.0}))
    return root


def test_kept_records_are_the_plan_and_one_row_per_run_and_summarize_as_the_study_folder_does(tmp_path, capsys):
    from studies.cli import main
    from studies.real import summarize_real
    from studies.table import read_table

    study = _study(tmp_path / "runs" / "real-study-x")
    kept = tmp_path / "kept"
    assert main(["--real", "--summarize", str(study), "--keep", str(kept)]) == 0
    from_study = capsys.readouterr().out
    assert "| drgrpo | 1 |" in from_study
    assert sorted(p.name for p in kept.iterdir()) == ["plan.json", "runs.jsonl"]  # no weights, inputs or samples
    rows = read_table(kept / "runs.jsonl")
    # the finished run and the start; the run still training (no timing.json... nor evaluation) is not a row
    assert [(r["arm"], r["seed"]) for r in rows] == [("drgrpo", 1), ("start", 0)]
    assert rows[0]["evals"]["t1"] == {"ids": "p0..1", "n": 2, "correct": [1, 1]}
    assert rows[0]["mechanisms"] == {"reward/mean": 0.5}
    assert summarize_real([kept]) == summarize_real([study])


def test_a_kept_plan_is_never_overwritten_and_the_table_follows_the_study(tmp_path):
    from studies.real import study_table
    from studies.table import read_table

    study = _study(tmp_path / "real-study-x")
    kept = tmp_path / "kept"
    keep_records([study], kept, study_table([study]), log=lambda _: None)
    keep_records([study], kept, study_table([study]), log=lambda _: None)  # identical plan: left as it is
    # the study goes on: the training run finishes its evaluation; the table is rewritten with it
    bench = study / "matched-s1" / "eval" / "heldout"
    bench.mkdir(parents=True)
    (bench / "per_problem.jsonl").write_text(json.dumps({"id": "p0", "correct": 2, "n": 2}) + "\n")
    (bench / "summary.json").write_text(json.dumps({"truncated_frac": 0.5}))
    keep_records([study], kept, study_table([study]), log=lambda _: None)
    assert [r["arm"] for r in read_table(kept / "runs.jsonl")] == ["drgrpo", "matched", "start"]
    (study / "plan.json").write_text(json.dumps({"created": "another day"}))
    with pytest.raises(ConfigError, match="never overwritten"):
        keep_records([study], kept, study_table([study]), log=lambda _: None)
    assert json.loads((kept / "plan.json").read_text())["created"] == "2026-12-02T00:00:00Z"


def test_keep_needs_summarize_and_a_folder(tmp_path):
    from studies.cli import main

    assert main(["--real", "--keep", str(tmp_path / "kept")]) == 2
    assert main(["--real", "--summarize", str(tmp_path / "missing"), "--keep", str(tmp_path / "k")]) == 2
    assert not (tmp_path / "k").exists()


def test_packed_ids_round_trip():
    from studies.table import pack_ids, unpack_ids

    assert pack_ids(["arith-999-0", "arith-999-1", "arith-999-2"]) == "arith-999-0..2"
    assert pack_ids(["a1", "a3"]) == ["a1", "a3"] and pack_ids(["x", "y"]) == ["x", "y"]
    for ids in (["q7", "q8"], ["a1", "a3"], ["p0"]):
        assert unpack_ids(pack_ids(ids)) == ids
