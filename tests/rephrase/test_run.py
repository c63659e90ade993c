"""`regroup rephrase` refuses, in one line and before rewriting anything, what would otherwise end in a
traceback: the rules rewriter on data that is not the built-in task, and openai without --base-url."""

from __future__ import annotations

import json

from regroup.cli import main
from regroup.data.load import save_problems
from regroup.tasks import get_task


def test_rules_rewriter_on_other_data_is_one_line(tmp_path, capsys):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "Solve x^2=4 for positive x.", "answer": "2"}) + "\n")
    assert main(["rephrase", "--data", str(data), "--out", str(tmp_path / "out.jsonl"), "--n", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rules rewriter only rewrites the built-in arithmetic task" in err[0]
    assert "1 of 1 rows" in err[0] and not (tmp_path / "out.jsonl").exists()


def test_rules_rewriter_on_the_task_still_works(tmp_path):
    data = tmp_path / "task.jsonl"
    save_problems(get_task("arithmetic").generate(3, seed=1), data)
    assert main(["rephrase", "--data", str(data), "--out", str(tmp_path / "out.jsonl"), "--n", "2"]) == 0


def test_openai_rewriter_without_base_url_is_one_line(tmp_path, capsys):
    data = tmp_path / "task.jsonl"
    save_problems(get_task("arithmetic").generate(1, seed=1), data)
    code = main(["rephrase", "--data", str(data), "--out", str(tmp_path / "out.jsonl"), "--rewriter", "openai"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "needs --base-url and --model" in err[0]
