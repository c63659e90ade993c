"""configs/paper/: every arm of both papers' main tables validates as written, and trains one step on the
tiny model with only the model, data, reward, scorer and rephraser swapped for local stand-ins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regroup.train.run_config import load_config

PAPER = Path(__file__).resolve().parents[2] / "configs" / "paper"
CONFIGS = sorted(PAPER.glob("*.yaml"))
ARMS = [
    p
    for p in CONFIGS
    if not p.stem.endswith("_base")
    and p.stem not in {"ta_qwen3_1p7b", "ta_qwen3_4b", "ta_llama3p2_1b", "ta_llama3p2_3b"}
]


def test_both_papers_have_every_arm():
    names = {p.stem for p in ARMS}
    assert {
        "dagrpo_grpo",
        "dagrpo_grpo_std",
        "dagrpo_mask_only",
        "dagrpo_mask_pair",
        "dagrpo_anchors_only",
        "dagrpo_both",
    } <= names
    for model in ("qwen3_1p7b", "qwen3_4b", "llama3p2_1b", "llama3p2_3b"):
        assert {f"ta_{model}_grpo", f"ta_{model}_matched", f"ta_{model}_ta_grpo", f"ta_{model}_grpo_steps"} <= names


def _as_written(path: Path, model_dir: str, data_file: str):
    """The config as written, with only its model folder and data file pointed at files that exist here."""
    return load_config(path, [f"model.path={model_dir}", f"data.train_file={data_file}"])


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    row = {
        "question": "What is 1+1?",
        "answer": "2",
        "solution": "1+1=2. \\boxed{2}",
        "variants": ["Add 1 and 1.", "What do 1 and 1 make?", "Compute 1 plus 1."],
    }  # as `regroup rephrase` writes
    path.write_text(json.dumps(row) + "\n")
    return str(path)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_paper_config_validates_as_written(path, tiny_model_dir, data_file):
    cfg = _as_written(path, tiny_model_dir, data_file)
    assert cfg.rewards.functions == ["math"] and cfg.model.dtype == "bfloat16"
    assert cfg.data.prompt_template and "\\boxed{}" in cfg.data.prompt_template
    assert cfg.grpo.num_generations == 8 and cfg.optim.lr == 1e-6 and cfg.rollout.temperature == 1.0


def _chain_text(path: Path) -> str:
    """The comments of a config and of every file it extends."""
    import yaml

    text = path.read_text()
    parent = (yaml.safe_load(text) or {}).get("extends")
    return text + (_chain_text(path.parent / parent) if parent else "")


@pytest.mark.parametrize("path", ARMS, ids=lambda p: p.stem)
def test_paper_arm_names_data_model_hardware_time_and_benchmarks(path):
    text = _chain_text(path)
    for heading in ("Data:", "Model:", "Hardware:", "Expected time per arm:", "Evaluation"):
        assert f"# {heading}" in text, f"{path.name}: no '{heading}' comment in it or the files it extends"
    assert "not measured" in text  # the time is an estimate, and says so


def test_dagrpo_arms_follow_the_paper_and_luffy(tiny_model_dir, data_file):
    arms = {p.stem: _as_written(p, tiny_model_dir, data_file) for p in ARMS if p.stem.startswith("dagrpo_")}
    for name, cfg in arms.items():  # Dr. GRPO, 500 steps, judge with reference, delta 3, 7 + 1 shaped anchors
        expected = ("group", "token_mean") if name == "dagrpo_grpo_std" else ("none", "seq_sum_constant")
        assert (cfg.grpo.adv_scale, cfg.grpo.loss_agg, cfg.grpo.beta, cfg.train.steps) == (*expected, 0.0, 500)
        assert (cfg.mask.scorer.name, cfg.mask.delta, cfg.anchors.count, cfg.anchors.mode) == (
            "judge",
            3.0,
            1,
            "replace",
        )
        assert (cfg.anchors.ratio, cfg.anchors.gamma, cfg.anchors.source) == ("shaped", 0.1, "reference")
        # LUFFY's scripts: 128 questions in 2 mini-batches, no on-policy clip, AdamW (0.9, 0.999), wd 0.01,
        # constant lr, 1024 / 8192 tokens
        assert (cfg.grpo.prompts_per_step, cfg.grpo.mini_batches) == (128, 2)
        assert 1 - cfg.grpo.eps_low < 1.01e-6 and 1 + cfg.grpo.eps_high >= 1e9  # a clip that never binds
        assert (cfg.optim.beta2, cfg.optim.weight_decay, cfg.optim.schedule, cfg.optim.warmup_steps) == (
            0.999,
            0.01,
            "constant",
            0,
        )
        assert (cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens) == (1024, 8192)
    text = (PAPER / "dagrpo_base.yaml").read_text()
    assert "Qwen2.5-Math-7B" in text
    assert all(cfg.grpo.entropy_coef == 0.001 for cfg in arms.values())  # LUFFY's entropy_coeff
    on = {name: (cfg.mask.enabled, cfg.mask.unit, cfg.anchors.enabled) for name, cfg in arms.items()}
    assert on == {
        "dagrpo_grpo": (False, "sample", False),
        "dagrpo_grpo_std": (False, "sample", False),
        "dagrpo_mask_only": (True, "sample", False),
        "dagrpo_mask_pair": (True, "pair", False),
        "dagrpo_anchors_only": (False, "sample", True),
        "dagrpo_both": (True, "sample", True),
    }


def test_ta_grpo_arms_follow_the_authors_scripts(tiny_model_dir, data_file):
    from regroup.train.build import train_steps

    seen = set()
    for p in ARMS:
        if not p.stem.startswith("ta_"):
            continue
        cfg = _as_written(p, tiny_model_dir, data_file)
        arm = next(a for a in ("ta_grpo", "grpo_steps", "matched", "grpo") if p.stem.endswith("_" + a))
        seen.add(arm)
        # run_grpo-*.sh and verl's defaults: KL 0.001 (k3), token mean, 512 / 3072 tokens, 2 mini-batches,
        # AdamW (0.9, 0.999) with weight decay 0.01, advantage epsilon 1e-6, the instruction before the question
        assert (cfg.grpo.beta, cfg.grpo.kl_ratio_correction, cfg.grpo.loss_agg) == (0.001, False, "token_mean")
        assert (cfg.data.max_prompt_tokens, cfg.rollout.max_new_tokens, cfg.grpo.mini_batches) == (512, 3072, 2)
        assert (cfg.optim.beta2, cfg.optim.weight_decay, cfg.grpo.adv_eps) == (0.999, 0.01, 1e-6)
        assert cfg.data.prompt_template.startswith("You FIRST think") and cfg.data.prompt_template.endswith(
            "{question}"
        )
        assert (cfg.ta.n_variants, cfg.ta.rephraser) == (3, "dataset")
        assert cfg.ta.enabled == (arm == "ta_grpo") and cfg.optim.schedule == "cosine"
        # 256 prompt rows per rollout: 256 questions for GRPO, 256 / (N+1) = 64 for the pooled arms
        rows = cfg.grpo.prompts_per_step * (cfg.ta.n_variants + 1 if arm in ("ta_grpo", "matched") else 1)
        assert rows == 256
        rollouts = train_steps(cfg, 7498)
        optimizer_steps = rollouts * cfg.grpo.mini_batches
        assert cfg.optim.warmup_steps == round(0.1 * optimizer_steps)  # 10 % warm-up
        expected = {"grpo": (2, 59), "matched": (2, 235), "ta_grpo": (2, 235), "grpo_steps": (8, 235)}[arm]
        assert (cfg.train.epochs, rollouts) == expected
        if arm == "ta_grpo":
            assert cfg.ta.ratio_anchor == "own"  # the authors' verl fork: each row's own prompt
        # matched sampling: (N+1)·G samples of q0, as many as TA-GRPO generates per question
        assert cfg.grpo.samples_multiplier == (cfg.ta.n_variants + 1 if arm == "matched" else 1)
    assert seen == {"grpo", "matched", "ta_grpo", "grpo_steps"}


LOCAL = [
    "model.dtype=float32",
    "model.gradient_checkpointing=false",
    "data.train_file=null",
    "data.task=arithmetic",
    "data.num_train=16",
    "data.prompt_template=null",
    "data.eval_file=null",
    "rollout.backend=hf",
    "rollout.max_new_tokens=8",
    "grpo.prompts_per_step=2",
    "grpo.num_generations=2",
    "rewards=[task]",
    "mask.scorer.name=step",
    "ta.rephraser=rules",
    "train.steps=1",
    "train.epochs=0",
    "train.checkpoint_every=1",
    "train.progress=false",
    "diagnostics.diversity_every=0",
    "anchors.max_tokens=64",
]  # 8 new tokens cut every reference: the start-up check would refuse the anchor arms


@pytest.fixture
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a loaded 2-core machine: two threads only contend
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("path", ARMS, ids=lambda p: p.stem)
def test_paper_arm_trains_one_step_on_the_tiny_model(path, tiny_model_dir, tmp_path, one_thread):
    from regroup.train.build import build_trainer

    cfg = load_config(path, [f"model.path={tiny_model_dir}", f"run_dir={tmp_path}", *LOCAL])
    build_trainer(cfg, tmp_path, log=lambda m: None).train()
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and "reward/mean" in record
    masked = "mask/pair_frac" if cfg.mask.unit == "pair" else "mask/frac"
    assert (masked in record) == cfg.mask.enabled  # the arm's own mechanisms ran, and only those
    assert ("anchor/count" in record) == cfg.anchors.enabled
    assert ("variant/acc/1" in record) == cfg.ta.enabled
    assert (tmp_path / "checkpoints" / "step-000001").is_dir()
