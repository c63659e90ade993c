"""regroup.eval.benchmarks: every named benchmark's loader on hand-written rows in its published schema,
the letter-choice grader, the paper protocols, and `run_bench_cli` end to end on the tiny model."""

from __future__ import annotations

import json

import pytest

from regroup.eval.benchmarks import BENCHMARKS, extract_choice, grade_choice, load_benchmark, parse_bench_list, protocol

# One or two rows per benchmark, in the columns its hub copy publishes.
ROWS = {
    "math500": [
        {
            "problem": "Compute $1+1$.",
            "solution": "$1+1=\\boxed{2}$",
            "answer": "2",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/1.json",
        }
    ],
    "aime24": [
        {
            "id": 60,
            "problem": "Find the remainder of 2024 mod 1000.",
            "solution": "...",
            "answer": "024",
            "url": "https://example/aime",
            "year": "2024",
        }
    ],
    "aime25": [{"problem": "How many primes below 10?", "answer": "4", "id": "0"}],
    "amc23": [{"id": 0, "question": "What is 3 * 9?", "answer": 27.0, "url": "https://example/amc"}],
    "minerva": [{"question": "Give the speed of light in m/s to one digit.", "answer": "3e8"}],
    "olympiadbench": [
        {
            "id": 1606,
            "question": "Find $a$.",
            "solution": ["..."],
            "final_answer": ["$\\frac{1}{2}$"],
            "context": None,
            "image_1": None,
            "is_multiple_answer": False,
            "unit": None,
            "answer_type": "Numerical",
            "error": None,
            "question_type": "Open-ended",
            "subfield": "Algebra",
            "subject": "Math",
            "language": "English",
        }
    ],
    "gpqa_diamond": [
        {
            "Question": "Which particle is charged?",
            "Correct Answer": "electron",
            "Incorrect Answer 1": "neutron",
            "Incorrect Answer 2": "photon",
            "Incorrect Answer 3": "neutrino",
            "Record ID": "rec1",
        }
    ],
    "arc_c": [
        {
            "id": "Mercury_1",
            "question": "Which is a mammal?",
            "choices": {"text": ["shark", "whale", "trout", "frog"], "label": ["A", "B", "C", "D"]},
            "answerKey": "B",
        },
        {
            "id": "NYSED_2",
            "question": "Pick three.",
            "choices": {"text": ["one", "two", "three", "four"], "label": ["1", "2", "3", "4"]},
            "answerKey": "3",
        },
    ],
    "mmlu_pro": [
        {
            "question_id": 70,
            "question": "2+2?",
            "options": ["3", "4", "5", "6", "7"],
            "answer": "B",
            "answer_index": 1,
            "cot_content": "",
            "category": "math",
            "src": "ori_mmlu",
        }
    ],
}


def bench_file(tmp_path, name):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS[name]), encoding="utf-8")
    return str(path)


def test_every_benchmark_has_rows_here():
    assert set(ROWS) == set(BENCHMARKS)


@pytest.mark.parametrize(
    "name,answer",
    [
        ("math500", "2"),
        ("aime24", "024"),
        ("aime25", "4"),
        ("amc23", "27"),
        ("minerva", "3e8"),
        ("olympiadbench", "\\frac{1}{2}"),
        ("mmlu_pro", "B"),
    ],
)
def test_loader_maps_published_schema(tmp_path, name, answer):
    problems, origin, skipped = load_benchmark(name, bench_file(tmp_path, name))
    assert skipped == 0 and origin.endswith(f"{name}.jsonl")
    assert problems[0].answer == answer and problems[0].question


def test_gpqa_options_shuffled_stably_and_answer_points_at_the_correct_one(tmp_path):
    (a,), _, _ = load_benchmark("gpqa_diamond", bench_file(tmp_path, "gpqa_diamond"))
    (b,), _, _ = load_benchmark("gpqa_diamond", bench_file(tmp_path, "gpqa_diamond"))
    assert a.question == b.question and a.answer == b.answer
    assert a.meta["choices"][ord(a.answer) - ord("A")] == "electron"
    assert f"{a.answer}. electron" in a.question


def test_arc_numeric_labels_become_letters(tmp_path):
    problems, _, _ = load_benchmark("arc_c", bench_file(tmp_path, "arc_c"))
    assert [p.answer for p in problems] == ["B", "C"]
    assert problems[1].question.endswith("A. one\nB. two\nC. three\nD. four")


def test_limit_and_unusable_rows(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"problem": "no answer"}) + "\n" + json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    problems, _, skipped = load_benchmark("math500", str(path), limit=5)
    assert skipped == 1 and len(problems) == 1


@pytest.mark.parametrize(
    "text,letter",
    [
        ("so the answer is \\boxed{B}", "B"),
        ("\\boxed{(C)}", "C"),
        ("\\boxed{\\text{D}}", "D"),
        ("\\boxed{A. shark}", "A"),
        ("The answer is (C).", "C"),
        ("Answer: D", "D"),
        ("the answer is a whale, so B", "B"),
        ("A is wrong, B is wrong, so C", "C"),
        ("I cannot tell", None),
        ("The answer is (E).", None),  # only four options
    ],
)
def test_extract_choice(text, letter):
    assert extract_choice(text, 4) == letter


def test_grade_choice(tmp_path):
    (p,), _, _ = load_benchmark("mmlu_pro", bench_file(tmp_path, "mmlu_pro"))
    assert grade_choice("The answer is (B).", p) == 1.0 and grade_choice("\\boxed{A}", p) == 0.0
    assert grade_choice("E", p) == 0.0  # a valid letter for five options, just wrong


def test_protocols_follow_the_papers():
    assert protocol(BENCHMARKS["aime24"], "dagrpo").n == 32 and protocol(BENCHMARKS["aime24"], "dagrpo").top_p == 1.0
    assert protocol(BENCHMARKS["math500"], "dagrpo").n == 1
    ta = protocol(BENCHMARKS["gpqa_diamond"], "ta_grpo")
    assert (ta.temperature, ta.top_p, ta.ks[-1]) == (0.6, 0.95, ta.n)
    assert protocol(BENCHMARKS["arc_c"], "ta_grpo") == protocol(BENCHMARKS["arc_c"], "dagrpo")  # TA-GRPO did not run it
    assert all(b.answer_type in ("math", "choice") for b in BENCHMARKS.values())
    assert {n for n, b in BENCHMARKS.items() if b.answer_type == "choice"} == {"gpqa_diamond", "arc_c", "mmlu_pro"}


def test_parse_bench_list():
    assert parse_bench_list("math500, aime24") == ["math500", "aime24"]
    with pytest.raises(ValueError, match="nosuch"):
        parse_bench_list("math500,nosuch")


def test_run_bench_cli_writes_json_and_markdown(tmp_path, tiny_model_dir):
    from regroup.eval.runner import run_bench_cli

    files = {name: bench_file(tmp_path, name) for name in ("math500", "arc_c")}
    rows = run_bench_cli(
        tiny_model_dir,
        ["math500", "arc_c"],
        str(tmp_path / "out"),
        n=2,
        ks=[1, 2],
        max_new_tokens=4,
        bench_files=files,
        progress=False,
    )
    assert [r["benchmark"] for r in rows] == ["math500", "arc_c", "average"]
    assert rows[0]["num_problems"] == 1 and rows[1]["num_problems"] == 2 and rows[2]["num_problems"] == 3
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["settings"]["per_benchmark"]["arc_c"]["n"] == 2
    assert summary["settings"]["correct_threshold"] == 1.0
    md = (tmp_path / "out" / "summary.md").read_text()
    assert md.startswith("| benchmark | problems | n | pass@1 | pass@2 |") and "| **average** |" in md


def test_eval_cli_offline_bench_is_one_line(tmp_path, tiny_model_dir, monkeypatch, capsys):
    from regroup.cli import main

    monkeypatch.setenv("REGROUP_DATA_DIR", str(tmp_path))
    rc = main(["eval", "--model", tiny_model_dir, "--bench", "math500,nosuch", "--out", str(tmp_path / "o")])
    assert rc == 2 and "nosuch" in capsys.readouterr().err


def test_decoding_presets_and_the_eval_protocol_flag(monkeypatch, tmp_path, tiny_model_dir):
    from regroup import cli
    from regroup.eval.benchmarks import DECODING

    assert (DECODING["t1"].temperature, DECODING["dagrpo"].temperature, DECODING["ta_grpo"].top_p) == (1.0, 0.6, 0.95)
    assert protocol(BENCHMARKS["aime24"], "ta_grpo").n == 128  # the authors' test.py: n = 128
    seen = []
    monkeypatch.setattr("regroup.eval.runner.run_eval_cli", lambda *a, **kw: seen.append(("data", kw)) or [])
    monkeypatch.setattr("regroup.eval.runner.run_bench_cli", lambda *a, **kw: seen.append(("bench", kw)) or [])
    monkeypatch.setattr("regroup.eval.runner.format_table", lambda rows: "")
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    for flag in ([], ["--protocol", "t1"], ["--protocol", "dagrpo"], ["--protocol", "ta_grpo"]):
        assert (
            cli.main(["eval", "--model", tiny_model_dir, "--data", str(data), "--out", str(tmp_path / "o"), *flag]) == 0
        )
    assert [(kw["temperature"], kw["top_p"]) for _, kw in seen] == [(0.6, 0.95), (1.0, 1.0), (0.6, 1.0), (0.6, 0.95)]
    seen.clear()
    for flag in (["--protocol", "t1"], ["--protocol", "ta_grpo"]):
        assert (
            cli.main(["eval", "--model", tiny_model_dir, "--bench", "aime24", "--out", str(tmp_path / "o"), *flag]) == 0
        )
    assert [(kw["paper"], kw["temperature"], kw["top_p"]) for _, kw in seen] == [
        ("dagrpo", 1.0, 1.0),
        ("ta_grpo", None, None),
    ]
