"""The loss variants as pieces: each composes with anchors, DaGRPO weights and the IS weight without
depending on the micro-batch split, trains and resumes exactly, and a user's loss term or policy loss
loads by `pkg.mod:obj`. Equality with the peers' own code: tests/equality/test_trl.py (CISPO, SAPO, the
entropy bonus, the IS modes) and tests/equality/test_verl.py (GMPO, the KL estimators)."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from helpers import CONFIGS, small_config, weights
from loss_call import call_policy_loss

from regroup.algo.losses import LossSpec, rows_with_gradient
from regroup.errors import ConfigError
from regroup.registry import KL_ESTIMATORS, LOSS_TERMS, POLICY_LOSSES
from regroup.train.run_config import load_config

B, T = 8, 7


def test_registries_name_the_built_ins():
    assert {"ppo_clip", "gspo", "cispo", "sapo", "gmpo"} <= set(POLICY_LOSSES.names())
    assert {"k1", "k2", "k3", "low_var_kl"} <= set(KL_ESTIMATORS.names())
    assert "entropy" in LOSS_TERMS.names()
    assert LossSpec(ratio_level="sequence").policy == "gspo"  # the older spelling of GSPO still works
    assert LossSpec(policy="gmpo").policy_ratio_level == "sequence"
    with pytest.raises(ValueError, match="sequence ratio"):
        LossSpec(policy="cispo", ratio_level="sequence")
    with pytest.raises(ValueError, match="did you mean 'sapo'"):
        LossSpec(policy="sappo")


def _case(dtype=torch.float64):
    gen = torch.Generator().manual_seed(3)
    V = 11
    logits = torch.randn(B, T, V, generator=gen, dtype=dtype, requires_grad=True)  # [B, T, V]
    tokens = torch.randint(0, V, (B, T), generator=gen)  # [B, T]
    lengths = torch.tensor([7, 3, 5, 1, 7, 6, 0, 4])
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [B, T]
    with torch.no_grad():
        lp0 = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)  # [B, T]
    old = lp0 + (torch.rand(B, T, generator=gen, dtype=dtype) - 0.5)
    ref = lp0 + (torch.rand(B, T, generator=gen, dtype=dtype) - 0.5)
    anchor = torch.zeros(B, T, dtype=torch.bool)
    anchor[7] = True  # one whole response is a forced anchor (DaGRPO)
    return dict(
        logits=logits,
        tokens=tokens,
        mask=mask,
        old=old,
        ref=ref,
        anchor=anchor,
        adv=torch.tensor([1.2, -0.7, 0.0, 0.5, -1.5, 0.9, -0.3, 2.0], dtype=dtype),
        weight=torch.tensor([1, 1, 0, 1, 0, 1, 1, 1], dtype=dtype),  # DaGRPO mask
        is_token=torch.rand(B, T, generator=gen, dtype=dtype) + 0.5,
        is_seq=torch.rand(B, 1, generator=gen, dtype=dtype) + 0.5,
    )


SPECS = {
    "cispo": dict(policy="cispo", cispo_clip_max=1.2),
    "sapo": dict(policy="sapo"),
    "gmpo": dict(policy="gmpo", gmpo_clip_low=0.1, gmpo_clip_high=0.2),
    "gspo": dict(policy="gspo"),
    "k1": dict(kl="k1", beta=0.05, kl_ratio_correction=True),
    "k2": dict(kl="k2", beta=0.05),
    "low_var_kl": dict(kl="low_var_kl", beta=0.05),
    "entropy": dict(terms=(("entropy", 0.1),)),
}


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_constant"])
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("is_level", ["token", "sequence"])
def test_every_piece_composes_and_is_split_invariant(name, agg, is_level):
    """With anchors, a DaGRPO mask and an IS weight: Σ of 8 micro-batches of one == one of eight (loss and
    gradient), and the masked rows get exactly no gradient."""
    c = _case()
    totals = dict(total_tokens=float(c["mask"].sum()), total_sequences=B, max_completion_length=T)
    is_weight = c["is_token"] if is_level == "token" else c["is_seq"]

    def loss_of(rows: slice) -> torch.Tensor:
        log_probs = torch.log_softmax(c["logits"][rows], -1)  # [b, T, V]
        lp = log_probs.gather(-1, c["tokens"][rows, :, None]).squeeze(-1)  # [b, T]
        entropy = -(log_probs.exp() * log_probs).sum(-1)  # [b, T] differentiable
        loss, _ = call_policy_loss(
            lp,
            c["old"][rows],
            c["adv"][rows],
            c["mask"][rows],
            ref_logps=c["ref"][rows],
            agg=agg,
            sample_weight=c["weight"][rows],
            anchor_token_mask=c["anchor"][rows],
            is_weight=is_weight[rows],
            entropy=entropy,
            **SPECS[name],
            **totals,
        )
        return loss

    full = loss_of(slice(0, B))
    (g_full,) = torch.autograd.grad(full, c["logits"])
    micro_total, g_micro = 0.0, torch.zeros_like(c["logits"])
    for i in range(B):
        li = loss_of(slice(i, i + 1))
        micro_total += li.item()
        g_micro += torch.autograd.grad(li, c["logits"])[0]
    assert micro_total == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(g_micro, g_full, atol=1e-12)
    assert g_full.abs().sum() > 0
    masked = c["weight"] == 0
    assert torch.equal(g_full[masked], torch.zeros_like(g_full[masked]))
    spec = LossSpec(**SPECS[name])
    carries = rows_with_gradient(c["adv"], c["weight"], spec.moves_every_row)
    assert torch.equal(g_full[~carries], torch.zeros_like(g_full[~carries]))


# ---- a user's loss term and policy loss, from a module outside the package ---------------------------------

USER_MODULE = '''
import torch

def logp_square(t):
    """A per-token term [B, T]: the squared log-prob of each loss token."""
    return t.logps ** 2

def ratio_budget(t):
    """A 0-d term with its own normaliser: mean squared log ratio over the batch's loss tokens."""
    d = torch.where(t.on_policy, t.logps - t.old_logps, torch.zeros_like(t.logps))
    return (d ** 2).sum() / t.totals.total_tokens

def reinforce(logps, old_logps, advantages, mask, spec):
    """A user policy loss: plain REINFORCE, -A log pi, with no clipping."""
    loss = -advantages.unsqueeze(1) * logps
    none = torch.zeros_like(mask)
    return loss, none, none
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_loss_terms.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_loss_terms"


def test_user_loss_term_changes_loss_and_gradient_as_specified(user_module):
    c = _case()
    mask = c["mask"]
    lp = torch.log_softmax(c["logits"], -1).gather(-1, c["tokens"][..., None]).squeeze(-1).detach()
    totals = dict(total_tokens=float(mask.sum()), total_sequences=B, max_completion_length=T)

    def run(**kw):
        x = lp.clone().requires_grad_(True)
        loss, met = call_policy_loss(x, c["old"], c["adv"], mask, agg="seq_mean_token_mean", **kw, **totals)
        loss.backward()
        return loss, x.grad, met

    base, g_base, _ = run()
    coef = 0.3
    loss, grad, met = run(terms=((f"{user_module}:logp_square", coef),))
    n_tok = mask.sum(1, keepdim=True).clamp(min=1).to(lp.dtype)  # [B, 1] the policy's agg: per-sequence means
    term = ((lp**2 * mask).sum(1, keepdim=True) / n_tok).sum() / B
    assert loss.item() == pytest.approx(base.item() + coef * term.item(), abs=1e-12)
    assert torch.allclose(grad, g_base + coef * 2 * lp * mask / n_tok / B, atol=1e-12)
    assert met[f"term/{user_module}:logp_square"].item() == pytest.approx(term.item(), abs=1e-12)
    # a 0-d term is added as it is: mean squared log ratio, gradient 2 d / N on on-policy tokens
    loss, grad, _ = run(terms=((f"{user_module}:ratio_budget", coef),))
    d = (lp - c["old"]) * mask
    assert loss.item() == pytest.approx(base.item() + coef * float((d**2).sum() / mask.sum()), abs=1e-12)
    assert torch.allclose(grad, g_base + coef * 2 * d / mask.sum(), atol=1e-12)
    # a user policy loss by dotted path replaces the PG term
    loss, grad, _ = run(policy=f"{user_module}:reinforce")
    assert torch.allclose(grad, -c["adv"][:, None] * mask / n_tok / B, atol=1e-12)


def test_user_term_in_the_config_is_checked_and_shown(user_module, capsys):
    from regroup.cli import main

    cfg = load_config(
        CONFIGS / "grpo.yaml", [f"grpo.loss_terms=[{user_module}:logp_square*0.5]", "grpo.entropy_coef=0.01"]
    )
    from regroup.train.recipes import loss_spec

    assert loss_spec(cfg).terms == (("entropy", 0.01), (f"{user_module}:logp_square", 0.5))
    assert (
        main(
            [
                "config",
                "--stages",
                "--config",
                str(CONFIGS / "grpo.yaml"),
                f"grpo.loss_terms=[{user_module}:logp_square*0.5]",
                "grpo.policy_loss=cispo",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"+ 0.5 x {user_module}:logp_square" in out and "policy cispo" in out
    with pytest.raises(ConfigError, match="grpo.loss_terms: .*no attribute"):
        load_config(CONFIGS / "grpo.yaml", [f"grpo.loss_terms=[{user_module}:missing]"])
    with pytest.raises(ConfigError, match="grpo.loss_terms: cannot import module 'no_such_pkg.mod'"):
        load_config(CONFIGS / "grpo.yaml", ["grpo.loss_terms=[no_such_pkg.mod:fn*0.1]"])


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["grpo.policy_loss=cispo", "grpo.importance_level=sequence"],
            "grpo.importance_level=sequence .*grpo.policy_loss=cispo",
        ),
        (["grpo.policy_loss=gmpoo"], "grpo.policy_loss: unknown policy loss 'gmpoo'.*did you mean 'gmpo'"),
        (["grpo.kl_estimator=k4"], "grpo.kl_estimator: unknown KL estimator 'k4'"),
        (["grpo.loss_terms=[entropy*lots]"], "grpo.loss_terms: 'entropy\\*lots'"),
        (["rollout.tis_cap=2", "rollout.is_min=2"], "rollout.is_min .* must be < rollout.tis_cap"),
        (["rollout.is_mode=sequence_mask"], "rollout.tis_cap=0 turns off"),
        (["ta.enabled=true", "rollout.tis_cap=2", "rollout.is_mode=sequence_truncate"], "ta.ratio_anchor=original"),
        (["grpo.cispo_clip_max=0"], "grpo.cispo_clip_max must be"),
        (["grpo.sapo_temperature_neg=-1"], "grpo.sapo_temperature_neg must be"),
    ],
)
def test_bad_loss_settings_are_refused_before_any_model_loads(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(CONFIGS / "grpo.yaml", overrides)


def test_variants_compose_with_ta_q0_ratios_and_dagrpo_masks():
    """The combinations that make sense load (the ones that do not are refused above)."""
    for recipe in ("ta_grpo.yaml", "dagrpo.yaml", "dagrpo_ta.yaml"):
        for policy in ("ppo_clip", "gspo", "cispo", "sapo", "gmpo"):
            load_config(
                CONFIGS / recipe,
                [
                    f"grpo.policy_loss={policy}",
                    "grpo.entropy_coef=0.01",
                    "grpo.beta=0.01",
                    "grpo.kl_estimator=low_var_kl",
                ],
            )


# ---- each variant trains and resumes exactly ----------------------------------------------------------------

RESUME_CASES = {
    "cispo": ("grpo.yaml", "grpo.policy_loss=cispo", "grpo.cispo_clip_max=1.05", "grpo.num_iterations=2"),
    "sapo+ta_q0": ("ta_grpo.yaml", "grpo.policy_loss=sapo", "grpo.num_iterations=2"),
    # anchors verified by the digit reward (threshold 0.01); delta 0 keeps the random model's rows, which
    # the step scorer's delta 3 would all mask (the masks' composition is test_every_piece_composes_...)
    "gmpo+dagrpo": (
        "dagrpo.yaml",
        "grpo.policy_loss=gmpo",
        "grpo.num_iterations=2",
        "anchors.max_tokens=64",
        "rewards.correct_threshold=0.01",
        "mask.delta=0",
    ),
    # the added terms together: entropy bonus, verl's low_var_kl against the reference, a user's term
    "entropy+low_var_kl+user_term": (
        "grpo.yaml",
        "grpo.entropy_coef=0.05",
        "grpo.beta=0.05",
        "grpo.kl_estimator=low_var_kl",
        "grpo.loss_terms=[my_loss_terms:logp_square*0.01]",
    ),
    "is_sequence_mask": (
        "grpo.yaml",
        "rollout.tis_cap=1.5",
        "rollout.is_mode=sequence_mask",
        "rollout.is_min=0.5",
        "grpo.num_iterations=2",
    ),
}


@pytest.mark.parametrize("case", sorted(RESUME_CASES))
def test_each_variant_trains_and_resumes_exactly(tiny_model_dir, tmp_path, user_module, case):
    from regroup.train.build import build_trainer
    from regroup.train.trainer import Trainer

    recipe, *extra = RESUME_CASES[case]
    extra = (
        *extra,
        "rewards=[_dist_worker:digit_reward]",
        "train.steps=2",
        "train.checkpoint_every=1",
        "grpo.prompts_per_step=2",
        "rollout.max_new_tokens=8",
    )  # mixed groups from a random model, kept small

    def build(run: str, resume: bool = False) -> Trainer:
        return build_trainer(
            small_config(tiny_model_dir, tmp_path / run, recipe, *extra),
            tmp_path / run,
            resume=resume,
            log=lambda m: None,
        )

    straight = build("a")
    last = straight.train()
    assert last["skipped_nonfinite"] == 0.0
    crashed = build("b")
    crashed.logger.log(1, crashed.train_step(0))
    crashed.step = 1
    crashed.save()
    resumed = build("b", resume=True)
    assert resumed.step == 1
    resumed.train()
    a, b = weights(straight.model), weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    lines = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert any(line["grad_norm"] > 0 for line in lines)  # the weights moved: the comparison is not vacuous
