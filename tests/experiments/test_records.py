"""regroup.experiments.records: a study's records kept apart from its weights, and summarized from there."""

import json

import pytest

from regroup.errors import ConfigError
from regroup.experiments.records import keep_records, record_files


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


def test_records_are_what_summaries_read_and_never_weights_inputs_or_samples(tmp_path):
    study = _study(tmp_path / "real-study-x")
    assert [str(p) for p in record_files(study)] == [
        "drgrpo-s1/config.yaml",
        "drgrpo-s1/eval/heldout/per_problem.jsonl",
        "drgrpo-s1/eval/heldout/summary.json",
        "drgrpo-s1/metrics.jsonl",
        "drgrpo-s1/timing.json",
        "plan.json",
        "real_study.json",
        "sft_continued-s1/model/sft_metrics.json",
        "sft_continued-s1/timing.json",
        "start/heldout/per_problem.jsonl",
        "start/heldout/summary.json",
    ]


def test_kept_records_summarize_as_the_study_folder_does(tmp_path, capsys):
    from regroup.cli import main
    from regroup.experiments.study_real import summarize_real

    study = _study(tmp_path / "runs" / "real-study-x")
    kept = tmp_path / "kept"
    assert main(["study", "--real", "--summarize", str(study), "--keep", str(kept)]) == 0
    from_study = capsys.readouterr().out
    assert "| drgrpo | 1 |" in from_study
    assert summarize_real([kept / "real-study-x"]) == summarize_real([study])
    assert not list(kept.rglob("*.safetensors")) and not (kept / "real-study-x" / "data").exists()


def test_a_kept_record_is_never_overwritten(tmp_path):
    study = _study(tmp_path / "real-study-x")
    kept = tmp_path / "kept"
    assert len(keep_records([study], kept, log=lambda _: None)) == 11
    assert keep_records([study], kept, log=lambda _: None) == []  # identical: left as it is
    # the study goes on: the training run finishes, the progress file is rewritten; both are kept
    (study / "matched-s1" / "timing.json").write_text(json.dumps({"seconds": 3.0}))
    (study / "real_study.json").write_text(json.dumps([{"arm": "start"}, {"arm": "matched"}]))
    again = keep_records([study], kept, log=lambda _: None)
    assert sorted(str(p.relative_to(kept / "real-study-x")) for p in again) == [
        "matched-s1/config.yaml",
        "matched-s1/metrics.jsonl",
        "matched-s1/timing.json",
        "real_study.json",
    ]
    assert len(json.loads((kept / "real-study-x" / "real_study.json").read_text())) == 2
    (study / "drgrpo-s1" / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.9}) + "\n")
    (study / "new.json").write_text("{}")
    with pytest.raises(ConfigError, match="never overwritten"):
        keep_records([study], kept, log=lambda _: None)
    assert not (kept / "real-study-x" / "new.json").exists()  # checked before anything is copied
    assert json.loads((kept / "real-study-x" / "drgrpo-s1" / "metrics.jsonl").read_text())["reward/mean"] == 0.5


def test_keep_needs_summarize_and_a_folder(tmp_path):
    from regroup.cli import main

    assert main(["study", "--real", "--keep", str(tmp_path / "kept")]) == 2
    assert main(["study", "--real", "--summarize", str(tmp_path / "missing"), "--keep", str(tmp_path / "k")]) == 2
