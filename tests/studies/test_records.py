"""studies.records and studies.table: a study's plan and one row per run kept apart from its run folders, and
summarized from there."""

import json
from pathlib import Path

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


KEPT_STUDY = Path(__file__).resolve().parents[2] / "docs" / "results" / "study-2026-12-03"


def _row_with(**changes) -> str:
    """A row of the kept miniature study with `changes` (a value None drops the key), as a JSON line."""
    good = json.loads((KEPT_STUDY / "runs.jsonl").read_text().splitlines()[0])
    for key, value in changes.items():
        if value is None:
            good.pop(key)
        else:
            good[key] = value
    return json.dumps(good)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('{"arm": "grpo", "seed": ', "row 3: not a JSON line"),
        ("42", "row 3: not a JSON object but int"),
        (_row_with(seed="x"), "row 3 field 'seed': not a non-negative integer: 'x'"),
        (
            _row_with(seed=1).replace('"seed": 1', '"seed": 1e400'),
            "row 3 field 'seed': not a non-negative integer: inf",
        ),
        (_row_with(evals=[1, 2]), "row 3 field 'evals': not a mapping but list"),
        (_row_with(evals={"t1": {"ids": "p0..1", "n": 2, "correct": [1]}}), "field 'evals.t1': ids, n and correct"),
        (_row_with(extra=None), "row 3: a row without extra"),
    ],
    ids=["not-json", "a-number", "seed-x", "seed-1e400", "evals-a-list", "evals-lengths", "no-extra"],
)
def test_a_malformed_kept_table_row_is_one_line_naming_the_file_and_row(tmp_path, capsys, line, said):
    """`--summarize` checked plan.json and regimes.json but not runs.jsonl: a bad row ended in a traceback."""
    from studies.cli import main

    kept = tmp_path / "kept"
    kept.mkdir()
    for name in ("plan.json", "regimes.json"):
        (kept / name).write_text((KEPT_STUDY / name).read_text())
    first = (KEPT_STUDY / "runs.jsonl").read_text().splitlines()[0]
    (kept / "runs.jsonl").write_text(f"{first}\n\n{line}\n{first}\n")  # the blank line 2 is counted
    assert main(["--summarize", str(kept), "--out", str(tmp_path / "page")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"data error: {kept / 'runs.jsonl'} row 3") and said in err
    assert not (tmp_path / "page" / "study.html").exists()
