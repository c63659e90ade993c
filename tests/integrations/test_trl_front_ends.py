"""One implementation behind both front-ends: every recipe both support, on one batch, gives the same advantages,
weights, loss and gradients through the TRL adapter and through the native trainer.

TRL samples one generation batch (`RegroupGRPOTrainer._generate_and_score_completions`, for real); the native
`Trainer` then gets the very same completions from a replay sampler (keyed by prompt ids, so the prompts
must tokenize alike too), runs its recipe's stages on the same questions and group ids, and updates. The
rewards are one `rewards.functions` entry on both sides (`plugins.noisy_reward_mod7`: mixed groups from a random
model). Compared: per sample (matched by group, variant, anchor flag and token ids) advantage and weight;
the loss; every parameter's gradient (TRL's `_compute_loss` backward vs the native update's, before any
optimizer step).
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch

pytest.importorskip("trl")
import plugins  # tests/plugins.py

from regroup.errors import ConfigError
from regroup.integrations.trl import RegroupGRPOTrainer, grpo_args
from regroup.models.tiny import build_tokenizer
from regroup.rollout.base import Completion
from regroup.stages.base import StepBatch, run_stages
from regroup.tasks import get_task
from regroup.train.build import build_trainer
from regroup.train.run_config import load_config

TASK = get_task("arithmetic")
PROBLEMS = [p for p in TASK.generate(64, 0) if len(p.solution) <= 20][:4]  # references fit 24 tokens (+ eos)
TOL = 1e-6


MASKS = ["mask.scorer.name=plugins:LengthScorer", "mask.delta=2"]
COMMON = [
    "rollout.max_new_tokens=24",
    "grpo.shared_prefix=false",
    "rewards.functions=[plugins:noisy_reward_mod7]",
    "data.num_train=8",
    "diagnostics.diversity_every=0",
    "diagnostics.grad_conflict_every=0",
    "train.progress=false",
]
# recipe file, overrides, questions per generation batch
CASES = {
    "grpo": ("grpo", ["grpo.num_generations=4"], 4),
    "grpo_matched": ("grpo_matched", ["grpo.num_generations=2", "grpo.samples_multiplier=2"], 4),
    "ta_grpo": ("ta_grpo", ["grpo.num_generations=2"], 2),
    "dagrpo": ("dagrpo", ["grpo.num_generations=4", *MASKS], 4),
    "dagrpo_no_correct": ("dagrpo", ["grpo.num_generations=4", "anchors.when=no_correct", *MASKS], 4),
    "dagrpo_ta": ("dagrpo_ta", ["grpo.num_generations=2", *MASKS], 2),
    "dagrpo_mask_only": ("dagrpo_mask_only", ["grpo.num_generations=4", *MASKS], 4),
    "gspo": ("grpo", ["grpo.num_generations=4", "grpo.policy_loss=gspo", "grpo.beta=0.01"], 4),
    # the registered loss variants and the pair mask: one loss, whichever front-end runs it
    "cispo": ("grpo", ["grpo.num_generations=4", "grpo.policy_loss=cispo", "grpo.policy_loss_args.clip_max=1.2"], 4),
    "sapo_low_var_kl": (
        "grpo",
        ["grpo.num_generations=4", "grpo.policy_loss=sapo", "grpo.beta=0.01", "grpo.kl_estimator=low_var_kl"],
        4,
    ),
    "gmpo_anchors": ("dagrpo", ["grpo.num_generations=4", "grpo.policy_loss=gmpo", *MASKS], 4),
    # TRL's own off-policy sequence mask and two-sided clip, passed through GRPOConfig as the recipe sets them
    "opsm_delta": (
        "grpo",
        ["grpo.num_generations=4", "grpo.off_policy_mask_threshold=0.5", "grpo.policy_loss_args.delta=1.5"],
        4,
    ),
    "entropy_bonus": ("grpo", ["grpo.num_generations=4", "grpo.entropy_coef=0.01"], 4),
    "pair_mask": ("dagrpo_mask_only", ["grpo.num_generations=4", "mask.unit=pair", *MASKS], 4),
    "overlong": (
        "grpo",
        [
            "grpo.num_generations=4",
            "overlong.soft_punish=true",
            "overlong.filter=true",
            "overlong.buffer=8",
            "grpo.loss_agg=seq_mean_token_mean",
        ],
        4,
    ),
}


class ReplaySampler:
    """The native sampler interface, answering each prompt with the completions TRL sampled for it, in order."""

    def __init__(self, samples):
        self.queue = defaultdict(list)
        for s in samples:
            self.queue[tuple(s.prompt_ids)].append(s)

    def generate(self, prompts, params, seed=None):
        out = []
        for i, ids in enumerate(prompts):
            s = self.queue[tuple(ids)].pop(0)
            out.append(
                Completion(
                    prompt_index=i,
                    token_ids=list(s.response_ids),
                    text=s.response_text,
                    logps=None,
                    truncated=s.truncated,
                )
            )
        return out

    def sync_weights(self, model):
        pass


def _per_sample(batch):
    """(group, variant, anchor, token ids) -> sorted (advantage, weight) pairs of a step batch."""
    weights = batch.weights if batch.weights is not None else torch.ones(len(batch.samples))
    rows = defaultdict(list)
    for s, a, w in zip(batch.samples, batch.advantages.tolist(), weights.tolist()):
        rows[(s.group_id, s.variant, s.is_anchor, tuple(s.response_ids))].append((a, w))
    return {k: sorted(v) for k, v in rows.items()}


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_front_ends_agree_on_one_batch(tiny_model_dir, tmp_path, case):
    name, overrides, questions = CASES[case]
    cfg = load_config(name, [*COMMON, *overrides, f"model.path={tiny_model_dir}"])
    tok = build_tokenizer()
    group = cfg.grpo.num_generations * cfg.grpo.samples_multiplier * ((cfg.ta.n_variants + 1) if cfg.ta.enabled else 1)
    args = grpo_args(
        cfg,
        output_dir=str(tmp_path / "trl"),
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        per_device_train_batch_size=questions * group,
        max_steps=1,
        save_strategy="no",
        learning_rate=1e-4,
    )
    trl = RegroupGRPOTrainer(
        model=tiny_model_dir, args=args, regroup_config=cfg, problems=PROBLEMS, processing_class=tok
    )

    # TRL: one real generation batch through the adapter, then its loss and gradients.
    trl.model.train()
    trl.current_gradient_accumulation_steps = 1
    rows = next(iter(trl.get_train_dataloader()))
    out = trl._generate_and_score_completions(rows)
    sampled = list(trl._local_samples)  # what TRL sampled, before anchors took rows
    tb = trl.regroup_last_batch
    trl.model.zero_grad()
    trl_loss = trl._compute_loss(trl.model, out)
    trl_loss.backward()
    trl_grads = _grads(trl.accelerator.unwrap_model(trl.model))

    # Native: the same questions, group ids and completions through the native trainer's stages and update.
    native = build_trainer(cfg, tmp_path / "native", log=lambda *a: None)
    native.ctx.sampler = native.sampler = ReplaySampler(sampled)
    firsts = {}
    for s in sampled:
        firsts.setdefault(s.group_id, s.problem)
    nb = StepBatch(step=0, problems=list(firsts.values()), group_ids=list(firsts))
    stage_metrics = run_stages(native.recipe.stages, nb, native.ctx)
    captured = {}

    def capture(loss_total):  # the native update's optimizer step, minus the step
        captured["loss"] = loss_total
        captured["grads"] = _grads(native.acc.unwrap_model(native.model))
        native.optimizer.zero_grad(set_to_none=True)
        return {"loss": loss_total}

    native._optimizer_step = capture
    native.update(nb)

    assert sum(len(q) for q in ReplaySampler(sampled).queue.values()) == len(sampled)
    ours, theirs = _per_sample(nb), _per_sample(tb)
    assert ours.keys() == theirs.keys()
    for key in ours:
        for (a1, w1), (a2, w2) in zip(ours[key], theirs[key]):
            assert math.isclose(a1, a2, abs_tol=TOL) and w1 == w2, (key, a1, a2, w1, w2)
    assert (nb.advantages != 0).any()  # not 0 == 0
    assert (nb.weights is None) == (tb.weights is None)
    assert math.isclose(captured["loss"], float(trl_loss), rel_tol=1e-6, abs_tol=TOL), (
        captured["loss"],
        float(trl_loss),
    )
    assert captured["grads"].keys() == trl_grads.keys() and trl_grads
    worst = max(float((captured["grads"][k] - trl_grads[k]).abs().max()) for k in trl_grads)
    assert worst <= TOL, worst
    assert native.recipe.loss == trl.recipe.loss  # one LossSpec (GSPO: ratio_level="sequence" on both)
    if "anchors" in native.recipe.names:
        assert any(s.is_anchor for s in tb.samples)
    if "mask" in native.recipe.names and cfg.mask.unit == "sample":
        assert (tb.weights == 0).any() and (tb.weights == 1).any()  # some masked, some kept
    if "mask" in native.recipe.names and cfg.mask.unit == "pair":  # pair terms move advantages, not weights
        assert tb.weights is None and stage_metrics["mask/pair_frac"] > 0
    if case == "overlong":
        assert tb.weights is not None and (tb.weights == 0).any()  # some response was cut and filtered


def test_trl_refuses_what_its_batch_cannot_do(tiny_model_dir, tmp_path):
    tok = build_tokenizer()

    def build(name, *overrides, **trl):
        cfg = load_config(name, [*COMMON, "grpo.num_generations=2", *overrides, f"model.path={tiny_model_dir}"])
        args = grpo_args(
            cfg,
            **{
                **dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, per_device_train_batch_size=8),
                **trl,
            },
        )
        return RegroupGRPOTrainer(
            model=tiny_model_dir, args=args, regroup_config=cfg, problems=PROBLEMS, processing_class=tok
        )

    with pytest.raises(ConfigError, match=r"^dynamic_sampling\.enabled: .*trl front-end"):
        build("grpo", "dynamic_sampling.enabled=true")
    with pytest.raises(ConfigError, match=r"^anchors\.mode=add"):
        build("dagrpo", "anchors.mode=add")
    with pytest.raises(ConfigError, match=r"GRPOConfig\.epsilon_high=0\.28 disagrees with grpo\.eps_high"):
        build("grpo", epsilon_high=0.28)
    with pytest.raises(ConfigError, match=r"GRPOConfig\.loss_type='cispo'"):
        build("grpo", loss_type="cispo")
    with pytest.raises(ConfigError, match=r"GRPOConfig\.delta=2\.0 disagrees with grpo\.policy_loss_args\.delta"):
        build("grpo", delta=2.0)
    with pytest.raises(ConfigError, match=r"GRPOConfig\.off_policy_mask_threshold=0\.5 disagrees with grpo\.off_"):
        build("grpo", off_policy_mask_threshold=0.5)
    with pytest.raises(ConfigError, match=r"GRPOConfig\.top_entropy_quantile"):
        build("grpo", top_entropy_quantile=0.2)
    with pytest.raises(ConfigError, match=r"ta\.n_variants=3: .* multiple of N\+1 = 4"):
        build("ta_grpo", per_device_train_batch_size=6)
    cfg = load_config("grpo", [*COMMON, "grpo.num_generations=2"])
    args = grpo_args(cfg, output_dir=str(tmp_path), use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match="takes no reward_funcs: the reward is the recipe's"):
        RegroupGRPOTrainer(
            model=tiny_model_dir, args=args, regroup_config=cfg, reward_funcs=[plugins.noisy_reward_mod7]
        )
