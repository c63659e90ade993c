"""regroup.data.prepare and hub specs: each published schema mapped on rows written by hand, offline."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from regroup.data.load import DataError, HubSpec, load_problems, parse_hub_spec, source_rows
from regroup.data.prepare import TARGETS, answer_text, deepscaler_row, math_row, openr1_row, prepare


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


# MATH (hendrycks / lighteval layout): problem, level, type, solution with the answer boxed.
MATH_ROWS = [
    {
        "problem": "What is $\\frac{2}{4}$ in lowest terms?",
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "Divide by 2: $\\frac{2}{4} = \\boxed{\\frac{1}{2}}$.",
    },
    {
        "problem": "Compute $3^2$.",
        "level": "Level 1",
        "type": "Algebra",
        "solution": "First $\\boxed{6}$ is wrong; $3^2 = \\boxed{9}$.",
    },
    {"problem": "A proof with no boxed answer.", "level": "Level 5", "type": "Geometry", "solution": "Obvious."},
]

# OpenR1-Math-46k (verl layout): chat-list prompt and target, reward_model.ground_truth, extra_info.index.
OPENR1_ROWS = [
    {
        "data_source": "openr1",
        "prompt": [{"role": "user", "content": "Find $x$ if $x+1=3$."}],
        "target": [{"role": "assistant", "content": "<think>\nx = 3 - 1\n</think>\n\nSo $x = \\boxed{2}$."}],
        "ability": "math",
        "reward_model": {"ground_truth": "2", "style": "rule"},
        "extra_info": {"index": 17, "split": "default"},
    },
]

# DeepScaleR-Preview: problem, answer, solution.
DEEPSCALER_ROWS = [
    {"problem": "What is 7*6?", "answer": "42", "solution": "7*6 = 42."},
    {"problem": "No answer here", "answer": "", "solution": ""},
]

# TA-GRPO release: rows sharing `index`, sub_index 0 the original, > 0 its rephrasings.
TA_ROWS = [
    {"index": 5, "sub_index": 0, "problem": "Ann has 3 pens and buys 2. How many?", "answer": "5"},
    {"index": 5, "sub_index": 2, "problem": "How many pens: 3 owned, 2 bought?", "answer": "5"},
    {"index": 5, "sub_index": 1, "problem": "Ann owns 3 pens; she buys 2 more. Count them.", "answer": "5"},
    {"index": 9, "sub_index": 0, "problem": "What is 1+1?", "answer": "2"},
]


def test_answer_text_normalises_published_cells():
    assert answer_text(27.0) == "27" and answer_text(2.5) == "2.5" and answer_text(3) == "3"
    assert answer_text(["$\\frac{1}{2}$"]) == "\\frac{1}{2}" and answer_text(["1", "2"]) == "1, 2"
    assert answer_text("") is None and answer_text(None) is None and answer_text(True) is None


def test_math_answer_is_the_last_boxed_of_the_solution():
    a, b, c = (math_row(r, i) for i, r in enumerate(MATH_ROWS))
    assert a.answer == "\\frac{1}{2}" and a.difficulty == "Level 1" and a.meta == {"type": "Prealgebra"}
    assert b.answer == "9"
    assert c is None  # no boxed answer: skipped, not guessed


def test_openr1_trace_becomes_the_solution():
    p = openr1_row(OPENR1_ROWS[0], 0)
    assert p.id == "17" and p.question == "Find $x$ if $x+1=3$." and p.answer == "2"
    assert p.solution.startswith("<think>") and p.solution.endswith("\\boxed{2}$.")


def test_deepscaler_row_and_skip():
    assert deepscaler_row(DEEPSCALER_ROWS[0], 0).answer == "42"
    assert deepscaler_row(DEEPSCALER_ROWS[1], 1) is None


@pytest.mark.parametrize(
    "name,rows,written,skipped",
    [("math", MATH_ROWS, 2, 1), ("openr1_math_46k", OPENR1_ROWS, 1, 0), ("deepscaler", DEEPSCALER_ROWS, 1, 1)],
)
def test_prepare_from_source_roundtrips(tmp_path, name, rows, written, skipped):
    src = write_jsonl(tmp_path / "src.jsonl", rows)
    out = tmp_path / "out.jsonl"
    summary = prepare(name, str(out), source=src)
    assert summary == {"target": name, "source": src, "written": written, "skipped": skipped, "renamed_ids": 0}
    assert len(load_problems(out).problems) == written


def test_ta_rows_fold_into_variants_in_sub_index_order(tmp_path):
    out = tmp_path / "ta.jsonl"
    prepare("ta_grpo", str(out), source=write_jsonl(tmp_path / "ta_src.jsonl", TA_ROWS))
    first, second = load_problems(out).problems
    assert first.id == "5" and first.question.startswith("Ann has 3 pens")
    assert first.variants == ("Ann owns 3 pens; she buys 2 more. Count them.", "How many pens: 3 owned, 2 bought?")
    assert second.id == "9" and second.variants == ()


def test_ta_target_needs_a_source_and_the_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("REGROUP_DATA_DIR", str(tmp_path / "empty"))
    with pytest.raises(DataError, match="--source"):
        prepare("ta_grpo", str(tmp_path / "o.jsonl"))
    with pytest.raises(DataError, match="index"):
        prepare("ta_grpo", str(tmp_path / "o.jsonl"), source=write_jsonl(tmp_path / "plain.jsonl", DEEPSCALER_ROWS))


def test_local_copy_in_data_dir_is_used_before_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("REGROUP_DATA_DIR", str(tmp_path))
    write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    summary = prepare("math", str(tmp_path / "out.jsonl"))
    assert summary["source"] == str(tmp_path / "math.jsonl") and summary["written"] == 2


@pytest.mark.skipif(importlib.util.find_spec("champ_dataset") is None, reason="champ-dataset not installed")
def test_champ_from_the_installed_package(tmp_path):
    summary = prepare("champ", str(tmp_path / "champ.jsonl"))
    assert summary["written"] == 270 and summary["skipped"] == 0
    first = load_problems(tmp_path / "champ.jsonl").problems[0]
    assert first.id == "P_Combinatorics_1" and first.answer == "239" and first.difficulty == "Combinatorics"
    assert first.solution and "x_n" in first.solution


def test_unknown_target():
    with pytest.raises(DataError, match="choose one of"):
        prepare("nosuch", "x.jsonl")
    assert set(TARGETS) == {
        "math",
        "openr1_math_46k",
        "deepscaler",
        "ta_grpo",
        "champ",
        "arithmetic_heldout",
        "arithmetic_boxed",
    }


def test_arithmetic_heldout_is_disjoint_from_default_training(tmp_path):
    from regroup.config.schema import DataConfig
    from regroup.tasks import get_task

    summary = prepare("arithmetic_heldout", str(tmp_path / "h.jsonl"), limit=16)
    held = load_problems(tmp_path / "h.jsonl").problems
    assert summary["written"] == len(held) == 16
    train = {p.question for p in get_task("arithmetic").generate(DataConfig().num_train, seed=DataConfig().seed)}
    assert not any(p.question in train for p in held)


def test_arithmetic_heldout_without_a_limit_writes_the_documented_256(tmp_path):
    """No `--limit`: 256 problems, as the target's help says (it read a setting DataConfig does not have)."""
    assert prepare("arithmetic_heldout", str(tmp_path / "h.jsonl"))["written"] == 256


def test_parse_hub_spec():
    assert parse_hub_spec("data/train.jsonl") is None
    assert parse_hub_spec("hf:HuggingFaceH4/MATH-500@test") == HubSpec("HuggingFaceH4/MATH-500", None, "test")
    assert parse_hub_spec("hf:allenai/ai2_arc:ARC-Challenge@test") == HubSpec(
        "allenai/ai2_arc", "ARC-Challenge", "test"
    )
    assert parse_hub_spec("hf:name") == HubSpec("name", None, "train")
    with pytest.raises(DataError, match="expected hf:NAME"):
        parse_hub_spec("hf:name@")


def test_hf_spec_reads_a_local_folder_offline(tmp_path):
    folder = tmp_path / "myset"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"question": "1+1?", "answer": 2}, {"question": "2+2?", "answer": 4}])
    problems = load_problems(f"hf:{folder}@train").problems
    assert [p.answer for p in problems] == ["2", "4"]


def test_offline_hub_says_which_file_to_place_where(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "REGROUP_DATA_DIR": str(tmp_path / "d")}
    proc = subprocess.run(
        [sys.executable, "-m", "regroup", "data", "prepare", "math", "--out", str(tmp_path / "o.jsonl")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert str(tmp_path / "d" / "math.jsonl") in lines[0] and "DigitalLearningGmbH/MATH-lighteval" in lines[0]


def test_source_rows_without_hub_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("REGROUP_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match=str(tmp_path / "thing.jsonl")):
        source_rows("thing", None)


def test_cli_data_prepare(tmp_path, capsys):
    from regroup.cli import main

    src = write_jsonl(tmp_path / "src.jsonl", DEEPSCALER_ROWS)
    assert main(["data", "prepare", "deepscaler", "--source", src, "--out", str(tmp_path / "o.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == 1
    assert main(["data", "prepare", "nosuch", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "choose one of" in capsys.readouterr().err


def test_openr1_repeated_index_gets_unique_ids_the_loader_accepts(tmp_path):
    """OpenR1-Math-46k repeats extra_info.index across its sources: prepare renames, the loader loads."""
    rows = [dict(OPENR1_ROWS[0], extra_info={"index": 17}) for _ in range(3)]
    rows.append(dict(OPENR1_ROWS[0], extra_info={"index": "17-2"}))  # a published id equal to a renamed one
    src = write_jsonl(tmp_path / "openr1.jsonl", rows)
    out = str(tmp_path / "out.jsonl")
    summary = prepare("openr1_math_46k", out, source=src)
    assert summary["written"] == 4 and summary["renamed_ids"] == 2
    ids = [p.id for p in load_problems(out).problems]
    assert ids == ["17", "17-3", "17-4", "17-2"] and len(set(ids)) == 4


def test_arithmetic_boxed_references_verify_under_the_math_reward(tmp_path):
    """The built-in references end in "#### N", which the math reward rejects (so a real-model DaGRPO run
    got zero anchors); the arithmetic_boxed target's references all verify, and its variants keep the answer."""
    from regroup import cli
    from regroup.config.schema import DataConfig
    from regroup.rewards.math_verify import MathAnswerChecker
    from regroup.tasks import get_task
    from regroup.tasks.arithmetic.solver import solve_question

    out = tmp_path / "boxed.jsonl"
    assert cli.main(["data", "prepare", "arithmetic_boxed", "--out", str(out), "--limit", "48"]) == 0
    problems = load_problems(out).problems
    task = get_task("arithmetic")
    originals = task.generate(48, seed=DataConfig().seed)  # the questions a default run trains on, in order
    assert [p.question for p in problems] == [p.question for p in originals]
    with MathAnswerChecker() as checker:
        assert checker.check_many([p.solution for p in problems], problems) == [1.0] * 48
        assert set(checker.check_many([p.solution for p in originals], originals)) == {0.0}  # the "#### N" form
    for p, o in zip(problems, originals):
        assert p.solution.startswith(o.solution.split("####")[0].strip()) and p.solution.endswith(
            f"\\boxed{{{p.answer}}}."
        )
        assert len(p.variants) == 3 and all(str(solve_question(v)) == p.answer for v in p.variants)
    assert prepare("arithmetic_boxed", str(tmp_path / "again.jsonl"), limit=48)["written"] == 48
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()  # reproducible
