"""regroup.eval.runner: sampling + grading → pass@k / mean@n / greedy, and the saved-model CLI path."""

from __future__ import annotations

import json
import math

import pytest

from regroup.eval import runner
from regroup.eval.runner import ProblemResult, average_row, evaluate, format_table, run_eval_cli, summarize

MAX_NEW = 6  # short responses keep the file fast; correctness of the model is not under test


@pytest.fixture(scope="module")
def tiny():
    from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), seed=0)
    return model, tok


@pytest.fixture(scope="module")
def problems():
    from regroup.tasks import get_task

    return list(get_task("arithmetic").generate(6, seed=0))


def test_evaluate_counts_are_consistent(tiny, problems):
    model, tok = tiny
    task_grade = __import__("regroup.tasks", fromlist=["get_task"]).get_task("arithmetic").grade
    calls = []

    def grader(text, problem):
        calls.append(problem.id)
        return task_grade(text, problem)

    model.train()
    res = evaluate(
        model, tok, problems, grader, n=4, ks=(1, 2, 4, 16), max_new_tokens=MAX_NEW, batch_size=8, progress=False
    )
    assert model.training  # mode restored
    assert len(calls) == len(problems) * (4 + 1)  # n samples + one greedy per problem
    assert [r.id for r in res.problems] == [p.id for p in problems]
    for r in res.problems:
        assert r.n == 4 and 0 <= r.correct <= 4 and isinstance(r.greedy_correct, bool)
    s = res.summary
    assert set(s["pass@k"]) == {"1", "2", "4"}  # k = 16 > n is skipped
    assert s["pass@k"]["1"] == pytest.approx(s["mean@n"])
    assert s["pass@k"]["1"] <= s["pass@k"]["2"] <= s["pass@k"]["4"]
    assert s["mean@n"] == pytest.approx(sum(r.correct for r in res.problems) / (4 * len(problems)))
    assert sum(v["count"] for v in s["by_difficulty"].values()) == len(problems)
    json.loads(res.to_json())  # serialisable


def test_always_correct_grader_gives_pass_at_k_one(tiny, problems):
    model, tok = tiny
    res = evaluate(model, tok, problems, lambda text, p: 1.0, n=3, ks=(1, 2, 3), max_new_tokens=MAX_NEW, progress=False)
    assert res.summary["pass@k"] == {"1": 1.0, "2": 1.0, "3": 1.0}
    assert res.summary["mean@n"] == 1.0 and res.summary["greedy"] == 1.0 and res.summary["stderr"] == 0.0


def test_grader_by_problem_gives_hand_computed_summary(tiny, problems):
    """Problems 0, 2, 4 always right, 1, 3, 5 always wrong; None (unscoreable) counts as wrong."""
    model, tok = tiny
    right = {problems[i].id for i in (0, 2, 4)}
    res = evaluate(
        model,
        tok,
        problems,
        lambda text, p: 1.0 if p.id in right else None,
        n=2,
        ks=(1, 2),
        max_new_tokens=MAX_NEW,
        greedy=False,
        progress=False,
    )
    assert [r.correct for r in res.problems] == [2, 0, 2, 0, 2, 0]
    assert res.summary["mean@n"] == 0.5 and res.summary["pass@k"]["2"] == 0.5
    assert res.summary["greedy"] is None and all(r.greedy_correct is None for r in res.problems)
    # accuracies 1,0,1,0,1,0: sample std √(1.5/5) = 0.5477, SE = 0.5477/√6
    assert res.summary["stderr"] == pytest.approx(math.sqrt(0.3 / 6))


def test_same_seed_same_samples(tiny, problems):
    model, tok = tiny
    kw = dict(n=2, ks=(1,), temperature=1.0, max_new_tokens=MAX_NEW, greedy=False, progress=False, seed=5)
    a = evaluate(model, tok, problems[:3], lambda t, p: 0.0, **kw)
    b = evaluate(model, tok, problems[:3], lambda t, p: 0.0, **kw)
    assert [r.sample_response for r in a.problems] == [r.sample_response for r in b.problems]


def test_bad_arguments_are_named(tiny, problems):
    model, tok = tiny
    with pytest.raises(ValueError, match="n \\(samples per problem\\)"):
        evaluate(model, tok, problems, lambda t, p: 1.0, n=0, progress=False)
    with pytest.raises(ValueError, match="at least one problem"):
        evaluate(model, tok, [], lambda t, p: 1.0, progress=False)
    with pytest.raises(ValueError, match="every k in ks"):
        evaluate(model, tok, problems, lambda t, p: 1.0, ks=(0, 1), progress=False)


def test_summarize_by_difficulty_and_threshold():
    rows = [
        ProblemResult("a", 1, 4, 4, True),
        ProblemResult("b", 1, 4, 0, False),
        ProblemResult("c", None, 4, 1, False),
    ]
    s = summarize(rows, ks=(1, 4), greedy=True)
    assert s["mean@n"] == pytest.approx((1 + 0 + 0.25) / 3)
    assert s["pass@k"]["4"] == pytest.approx(2 / 3)  # a and c solved at least once in 4
    assert s["greedy"] == pytest.approx(1 / 3)
    assert list(s["by_difficulty"]) == ["1", "unknown"]
    assert s["by_difficulty"]["1"] == {"mean@n": 0.5, "count": 2, "greedy": 0.5}
    assert runner.is_correct(0.5) and not runner.is_correct(0.3) and not runner.is_correct(None)
    assert not runner.is_correct(float("nan"))


def test_average_row_and_format_table():
    rows = [
        {
            "benchmark": "a",
            "num_problems": 10,
            "n": 8,
            "pass@1": 0.5,
            "pass@8": 0.9,
            "mean@n": 0.5,
            "stderr": 0.03,
            "greedy": 0.6,
        },
        {
            "benchmark": "b",
            "num_problems": 30,
            "n": 8,
            "pass@1": 0.3,
            "pass@8": 0.7,
            "mean@n": 0.3,
            "stderr": 0.04,
            "greedy": None,
        },
    ]
    avg = average_row(rows)
    assert avg["benchmark"] == "average" and avg["num_problems"] == 40
    assert avg["mean@n"] == pytest.approx(0.4) and avg["pass@8"] == pytest.approx(0.8)
    assert avg["stderr"] == pytest.approx(0.025)  # √(0.03² + 0.04²) / 2
    assert avg["greedy"] is None  # not averaged over a subset
    text = format_table(rows + [avg])
    lines = text.splitlines()
    assert lines[0].split() == ["benchmark", "problems", "pass@1", "pass@8", "mean@n", "±", "SE", "greedy"]
    assert "50.0 ± 3.0" in text and "40.0 ± 2.5" in text
    assert lines[-1].startswith("average") and set(lines[-2]) <= {"-", " "}


def _write_files(tmp_path, problems):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": p.question, "target": str(p.answer)} for p in problems]
    jsonl = tmp_path / "bench_a.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    parquet = tmp_path / "bench_b.parquet"
    pq.write_table(pa.Table.from_pylist(rows[3:]), parquet)
    return [str(jsonl), str(parquet)]


@pytest.fixture(scope="module")
def saved_model(tiny, tmp_path_factory):
    model, tok = tiny
    path = tmp_path_factory.mktemp("model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_run_eval_cli_writes_files_and_average_row(saved_model, problems, tmp_path):
    files = _write_files(tmp_path, problems)
    out = tmp_path / "out"
    rows = run_eval_cli(
        saved_model,
        files,
        str(out),
        n=2,
        ks=(1, 2),
        max_new_tokens=MAX_NEW,
        question_field="prompt",
        answer_field="target",
        checker="task",
        progress=False,
    )
    assert [r["benchmark"] for r in rows] == ["bench_a", "bench_b", "average"]
    for bench, count in (("bench_a", 3), ("bench_b", 3)):
        lines = (out / bench / "per_problem.jsonl").read_text().splitlines()
        assert len(lines) == count and all(0 <= json.loads(x)["correct"] <= 2 for x in lines)
        summary = json.loads((out / bench / "summary.json").read_text())
        assert summary["num_problems"] == count and summary["n"] == 2
    top = json.loads((out / "summary.json").read_text())
    assert top["rows"] == rows
    assert rows[2]["mean@n"] == pytest.approx((rows[0]["mean@n"] + rows[1]["mean@n"]) / 2)
    assert "average" in format_table(rows)


def test_run_eval_cli_always_correct_grader(saved_model, problems, tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "make_grader", lambda *args: lambda text, p: 1.0)
    rows = run_eval_cli(
        saved_model,
        _write_files(tmp_path, problems),
        str(tmp_path / "out"),
        n=2,
        ks=(1, 2),
        max_new_tokens=MAX_NEW,
        question_field="prompt",
        answer_field="target",
        progress=False,
    )
    for r in rows:
        assert r["pass@1"] == 1.0 and r["pass@2"] == 1.0 and r["greedy"] == 1.0


def test_run_eval_cli_rejects_unknown_checker(saved_model, tmp_path):
    with pytest.raises(ValueError, match="checker must be 'task' or 'math'"):
        run_eval_cli(saved_model, ["x.jsonl"], str(tmp_path), checker="judge")


class ScriptedSampler:
    """Answers problem i correctly in its first `right[i]` samples, returned in reverse order so that
    evaluate must map completions by prompt_index, not by position."""

    def __init__(self, problems, right):
        self.problems, self.right = problems, right
        self.offset = 0

    def generate(self, prompts, params, seed=None):
        from regroup.rollout.base import Completion

        out = []
        for i in range(len(prompts)):
            p = self.problems[self.offset + i]
            k = 1 if params.temperature == 0 else params.n
            for j in range(k):
                ok = j < self.right[self.offset + i] if params.temperature > 0 else self.right[self.offset + i] > 0
                text = f"so the answer is \\boxed{{{p.answer if ok else 'x'}}}"
                out.append(Completion(i, [1], text, None, False))
        self.offset = (self.offset + len(prompts)) % len(self.problems)
        return out[::-1]


def test_evaluate_with_scripted_sampler_and_math_checker(tiny, problems):
    from regroup.rewards.math_verify import MathAnswerChecker

    model, tok = tiny
    right = [0, 1, 2, 3, 4, 4]
    with MathAnswerChecker() as checker:
        res = evaluate(
            model,
            tok,
            problems,
            checker,
            n=4,
            ks=(1, 4),
            batch_size=8,
            sampler=ScriptedSampler(problems, right),
            progress=False,
        )
    assert [r.correct for r in res.problems] == right
    assert res.summary["mean@n"] == pytest.approx(14 / 24)
    assert res.summary["pass@k"]["4"] == pytest.approx(5 / 6)
    assert res.summary["greedy"] == pytest.approx(5 / 6)


def test_run_eval_cli_math_checker(saved_model, problems, tmp_path):
    out = tmp_path / "out"
    rows = run_eval_cli(
        saved_model,
        _write_files(tmp_path, problems)[:1],
        str(out),
        n=2,
        ks=(1, 2),
        max_new_tokens=MAX_NEW,
        question_field="prompt",
        answer_field="target",
        checker="math",
        progress=False,
    )
    assert rows[0]["mean@n"] == 0.0  # a random model writes no \\boxed{} answer
    top = json.loads((out / "summary.json").read_text())
    assert top["settings"]["checker"] == "math" and top["checker_stats"]["checked"] == 3 * (2 + 1)


# ---------------------------------------------------------------------- a regroup checkpoint's own prompting


def _fake_run(tmp_path, tiny_model_dir, **data):
    import shutil

    from regroup.config.schema import RunConfig
    from regroup.train.run_config import save_config

    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step-000002"
    shutil.copytree(tiny_model_dir, ckpt)
    cfg = RunConfig()
    cfg.model.path = tiny_model_dir
    for key, value in data.items():
        setattr(cfg.data, key, value)
    cfg.rewards.correct_threshold = 0.75
    save_config(cfg, run / "config.yaml")
    return ckpt


def test_eval_reads_prompting_and_threshold_from_the_run(tmp_path, tiny_model_dir):
    template = "{question}\nPut the final answer in \\boxed{}."
    ckpt = _fake_run(tmp_path, tiny_model_dir, prompt_template=template, system_prompt="Be brief.")
    assert runner.run_config_path(str(ckpt)) == str(tmp_path / "run" / "config.yaml")
    assert runner.run_config_path(tiny_model_dir) is None
    setup = runner.load_eval_setup(str(ckpt))
    assert setup.prompter.template == template and setup.prompter.system_prompt == "Be brief."
    assert setup.correct_threshold == 0.75
    # An explicit flag wins over the run's setting.
    assert runner.load_eval_setup(str(ckpt), prompt_template="Q: {question}").prompter.template == "Q: {question}"
    plain = runner.load_eval_setup(tiny_model_dir)
    assert plain.prompter.template is None and plain.correct_threshold == 1.0


def test_evaluate_uses_the_prompter_and_threshold(tiny, problems):
    from regroup.models.prompting import Prompter

    model, tok = tiny
    seen = []

    class Recording(Prompter):
        def encode(self, question):
            seen.append(question)
            return super().encode(question)

    prompter = Recording(tok, use_chat=True, template="Q: {question}")
    res = evaluate(
        model,
        tok,
        problems[:2],
        lambda t, p: 0.6,
        n=1,
        ks=(1,),
        max_new_tokens=2,
        progress=False,
        prompter=prompter,
        correct_threshold=0.7,
    )
    assert seen == [p.question for p in problems[:2]]
    assert res.summary["mean@n"] == 0.0 and res.summary["settings"]["prompt"]["prompt_template"] == "Q: {question}"
    res = evaluate(
        model,
        tok,
        problems[:2],
        lambda t, p: 0.6,
        n=1,
        ks=(1,),
        max_new_tokens=2,
        progress=False,
        prompter=prompter,
        correct_threshold=0.6,
    )
    assert res.summary["mean@n"] == 1.0


def test_format_markdown():
    rows = [
        {
            "benchmark": "a",
            "num_problems": 2,
            "n": 4,
            "pass@1": 0.5,
            "pass@4": None,
            "mean@n": 0.5,
            "stderr": 0.1,
            "greedy": None,
        }
    ]
    rows.append(average_row(rows))
    md = runner.format_markdown(rows).splitlines()
    assert md[0] == "| benchmark | problems | n | pass@1 | pass@4 | mean@n ± SE | greedy |"
    assert md[2] == "| a | 2 | 4 | 50.0 | - | 50.0 ± 10.0 | - |"
    assert md[3].startswith("| **average** | 2 | 4 | 50.0 |")


def test_prompt_config_file_gives_a_plain_model_the_run_prompting(tmp_path, tiny_model_dir):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f'model:\n  path: {tiny_model_dir}\ndata:\n  prompt_template: "Q: {{question}}"\n'
        "rewards:\n  functions: [math]\n  correct_threshold: 0.5\n"
    )
    setup = runner.load_eval_setup(tiny_model_dir, config_file=str(recipe))
    assert setup.prompter.template == "Q: {question}" and setup.correct_threshold == 0.5
    assert setup.run_config == str(recipe)


# ---------------------------------------------------------------------- a torn or edited checkpoint


@pytest.fixture(scope="module")
def trained_checkpoint(tiny_model_dir, tmp_path_factory):
    """The step-1 checkpoint of a real one-step training run on the tiny model, through the CLI."""
    from pathlib import Path

    from regroup.cli import main

    run = tmp_path_factory.mktemp("trained") / "run"
    configs = Path(__file__).resolve().parents[2] / "configs"
    overrides = ["data.num_train=8", "grpo.prompts_per_step=2", "grpo.num_generations=2", "rollout.max_new_tokens=4"]
    overrides += ["train.steps=1", "train.checkpoint_every=1", "train.progress=false", "train.threads=1"]
    overrides += ["diagnostics.diversity_every=0", "diagnostics.grad_conflict_every=0"]
    args = ["train", "--config", str(configs / "grpo.yaml"), f"model.path={tiny_model_dir}", f"run_dir={run}"]
    assert main(args + overrides) == 0
    return run / "checkpoints" / "step-000001"


def _eval_a_copy(checkpoint, tmp_path, capsys, change) -> tuple[int, list[str]]:
    """`regroup eval --model` on a copy of the checkpoint (in a run folder of its own) after `change(copy)`:
    the exit code and the lines it wrote to stderr."""
    import shutil

    from regroup.cli import main

    run = tmp_path / "run"
    shutil.copytree(checkpoint.parent.parent, run)
    copy = run / "checkpoints" / checkpoint.name
    change(copy)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "a", "question": "1+1", "answer": "2"}) + "\n")
    capsys.readouterr()
    code = main(["eval", "--model", str(copy), "--data", str(data), "--out", str(tmp_path / "out"), "--n", "1"])
    return code, capsys.readouterr().err.strip().splitlines()


def _flip_header_byte(folder) -> None:
    """A byte of model.safetensors' JSON header turned into one the header cannot hold (a torn write)."""
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8 + 2] = 0xFF  # after the 8-byte header length: inside the header's JSON
    weights.write_bytes(bytes(data))


def test_eval_of_a_checkpoint_with_a_torn_header_is_one_line(trained_checkpoint, tmp_path, capsys):
    """A corrupt model.safetensors header printed a 34-line SafetensorError traceback: the manifest was not checked."""
    code, lines = _eval_a_copy(trained_checkpoint, tmp_path, capsys, _flip_header_byte)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("checkpoint error: ") and "step-000001" in lines[0]
    assert "model.safetensors does not match its sha256" in lines[0]


def test_eval_of_a_checkpoint_with_a_file_changed_after_its_manifest_is_one_line(trained_checkpoint, tmp_path, capsys):
    def edit_config(folder) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 7}))

    code, lines = _eval_a_copy(trained_checkpoint, tmp_path, capsys, edit_config)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("checkpoint error: ") and "config.json does not match its sha256" in lines[0]


def test_eval_of_a_plain_model_folder_that_does_not_load_is_one_line(trained_checkpoint, tmp_path, capsys):
    """Without a manifest there is nothing to verify: the load error itself is worded, naming the folder."""

    def plain_and_torn(folder) -> None:
        for name in ("manifest.json", "trainer_state.pt", "run_config.json"):
            (folder / name).unlink()
        _flip_header_byte(folder)

    code, lines = _eval_a_copy(trained_checkpoint, tmp_path, capsys, plain_and_torn)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("eval error: --model ") and "step-000001" in lines[0]
    assert "the model could not be loaded: SafetensorError" in lines[0]


def test_eval_verifies_a_checkpoint_of_any_format_that_a_resume_refuses(trained_checkpoint, tmp_path):
    """The weights of an older-format checkpoint are plain safetensors: eval reads them, a resume does not."""
    import shutil

    from regroup.runtime.checkpoint import CheckpointRefused, verify_checkpoint

    copy = tmp_path / "step-000001"
    shutil.copytree(trained_checkpoint, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))
    with pytest.raises(CheckpointRefused, match="older regroup"):
        verify_checkpoint(copy)
    runner.check_model_folder(str(copy))  # passes: every listed file matches its sha256
    (copy / "extra.safetensors").write_bytes(b"planted")
    with pytest.raises(CheckpointRefused, match="extra.safetensors is not listed"):
        runner.check_model_folder(str(copy))
