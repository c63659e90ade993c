"""The loss variants as pieces: each composes with anchors, DaGRPO weights and the IS weight without
depending on the micro-batch split, trains and resumes exactly, and a user's loss term or policy loss
loads by `pkg.mod:obj`. Equality with the peers' own code: tests/equality/test_trl.py (CISPO, SAPO, the
entropy bonus, the IS modes) and tests/equality/test_verl.py (GMPO, the KL estimators)."""

from __future__ import annotations

import json
import textwrap
import typing

import pytest
import torch
from helpers import CONFIGS, bounds, small_config, weights
from loss_call import call_policy_loss, loss_spec

from regroup.algo.loss_config import describe_loss, resolve_loss
from regroup.algo.loss_inputs import LossInputs
from regroup.algo.losses import LossTotals, policy_loss, rows_with_gradient
from regroup.config.fields import Knobs, field_docs, leaves
from regroup.config.registry import (
    ADV_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_TERMS,
    POLICY_LOSSES,
    args_class,
    call_piece,
    parse_args,
)
from regroup.errors import ConfigError
from regroup.train.run_config import load_config

B, T = 8, 7


def test_registries_name_the_built_ins():
    assert {"ppo_clip", "gspo", "cispo", "sapo", "gmpo", "vespo", "luspo"} <= set(POLICY_LOSSES.names())
    assert {"k1", "k2", "k3", "low_var_kl"} <= set(KL_ESTIMATORS.names())
    assert "entropy" in LOSS_TERMS.names()
    assert {"grpo", "dr_grpo"} <= set(ADV_ESTIMATORS.names())
    assert loss_spec(policy="gmpo").ratio_level == "sequence"
    assert loss_spec(policy="luspo").ratio_level == "sequence"
    assert loss_spec(policy="vespo").ratio_level == "token"
    with pytest.raises(ValueError, match="did you mean 'sapo'"):
        loss_spec(policy="sappo")


def test_every_built_in_knob_is_typed_bounded_and_documented():
    """Each built-in piece's Args: a frozen `Knobs` model, every knob with a help line, every number bounded on
    both sides (the project's rule for config fields), and its defaults parse back to themselves."""
    seen = 0
    for registry in (POLICY_LOSSES, KL_ESTIMATORS, LOSS_TERMS, ADV_ESTIMATORS):
        for name in registry.names():
            cls = args_class(registry.get(name))
            if cls is None:
                continue
            assert issubclass(cls, Knobs) and cls.model_config.get("frozen"), name
            for key, f, hint in leaves(cls):
                seen += 1
                assert f.description, (name, key)
                if {hint, *typing.get_args(hint)} & {int, float}:
                    limits = bounds(f)
                    assert limits.keys() & {"ge", "gt"} and limits.keys() & {"le", "lt"}, f"{name}.{key} unbounded"
            defaults = {key: f.default for key, f, _ in leaves(cls)}
            assert parse_args(cls, defaults, "k", name) == cls()
    assert seen >= 10


def test_docs_losses_has_a_row_for_every_built_in_and_names_its_knobs():
    text = (CONFIGS.parent / "docs" / "losses.md").read_text()
    for registry in (POLICY_LOSSES, KL_ESTIMATORS, ADV_ESTIMATORS):
        for name in registry.names():
            assert f"`{name}`" in text or f" {name} " in text, name
            cls = args_class(registry.get(name))
            for knob_name, *_ in field_docs(cls) if cls is not None else ():
                assert f"`{knob_name}`" in text, (name, knob_name)


def test_knobs_reach_the_loss_and_change_it():
    """`policy_args` given as a mapping is parsed into the loss's Args, and each knob moves the loss."""
    c = _case()
    lp = torch.log_softmax(c["logits"], -1).gather(-1, c["tokens"][..., None]).squeeze(-1).detach()
    totals = dict(total_tokens=float(c["mask"].sum()), total_sequences=B, max_completion_length=T)
    for policy, knobs in (
        ("cispo", {"clip_max": 1.05}),
        ("sapo", {"temperature_pos": 3.0}),
        ("gmpo", {"clip_low": 0.05}),
        ("vespo", {"k_neg": 0.5}),
        ("ppo_clip", {"delta": 1.3}),
        ("gspo", {"delta": 1.01}),
        ("luspo", {"delta": 1.01}),
    ):
        spec = loss_spec(policy=policy, policy_args=knobs)
        assert spec.policy.args == args_class(POLICY_LOSSES.get(policy))(**knobs)
        default, _ = call_policy_loss(lp, c["old"], c["adv"], c["mask"], policy=policy, **totals)
        tuned, _ = call_policy_loss(lp, c["old"], c["adv"], c["mask"], policy=policy, policy_args=knobs, **totals)
        assert abs(default.item() - tuned.item()) > 1e-6, policy


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
    "cispo": dict(policy="cispo", policy_args={"clip_max": 1.2}),
    "sapo": dict(policy="sapo"),
    "gmpo": dict(policy="gmpo", policy_args={"clip_low": 0.1, "clip_high": 0.2}),
    "gspo": dict(policy="gspo"),
    "vespo": dict(policy="vespo"),
    "luspo+delta": dict(policy="luspo", policy_args={"delta": 1.1}),
    "ppo_clip+delta+opsm": dict(policy_args={"delta": 1.1}, off_policy_mask=0.05),
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
    spec = loss_spec(**SPECS[name])
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


# ---- pieces with their own knobs: one module, no registration ----
from regroup.config.fields import F, Knobs
from regroup.config.registry import takes

SEEN = []  # the knobs each call received, for the test to read


class CappedArgs(Knobs):
    cap: float = F(2.0, "The cap on the detached ratio weight.", gt=0.0, le=100.0)
    floor: float = F(0.0, "The floor on it.", ge=0.0, le=1.0)


@takes(CappedArgs)
def capped_reinforce(logps, old_logps, advantages, mask, spec, args):
    """-clamp(r, floor, cap).detach() * A * log pi, with the user's knobs."""
    SEEN.append(("policy", args.cap, args.floor))
    weight = torch.exp(logps - old_logps).clamp(min=args.floor, max=args.cap).detach()
    loss = -weight * advantages.unsqueeze(1) * logps
    none = torch.zeros_like(mask)
    return loss, none, none


class RankArgs(Knobs):
    spread: float = F(1.0, "Advantage of the best response minus the worst's.", gt=0.0, le=10.0)


@takes(RankArgs)
def rank_advantages(rewards, group_ids, args):
    """A user advantage estimator: each group's rewards ranked, centred, scaled to `spread`."""
    SEEN.append(("advantage", args.spread))
    adv = torch.zeros_like(rewards)
    for g in group_ids.unique():
        rows = (group_ids == g).nonzero().squeeze(1)
        r = torch.nan_to_num(rewards[rows], nan=0.0)
        ranks = r.argsort().argsort().to(rewards.dtype)
        if len(rows) > 1 and r.max() > r.min():
            adv[rows] = (ranks / (len(rows) - 1) - 0.5) * args.spread
    return adv


class ScaleArgs(Knobs):
    scale: float = F(1.0, "Multiplies the KL estimate.", gt=0.0, le=10.0)


@takes(ScaleArgs)
def scaled_k1(logps, ref_logps, args):
    return args.scale * (logps - ref_logps)


# ---- broken pieces: each must be refused when the config is checked, in one line ----


def policy_two_args(logps, old_logps):
    return logps, logps, logps


def policy_per_row(logps, old_logps, advantages, mask, spec):
    loss = -advantages * logps.sum(1)  # [B], not [B, T]
    return loss, mask, mask


def policy_detached(logps, old_logps, advantages, mask, spec):
    loss = -(advantages.unsqueeze(1) * logps).detach()
    return loss, torch.zeros_like(mask), torch.zeros_like(mask)


def kl_per_row(logps, ref_logps):
    return (logps - ref_logps).sum(1)  # [B]


def term_no_args():
    return torch.tensor(0.0)


def term_per_row(t):
    return t.logps.sum(1)  # [B]


def advantage_column(rewards, group_ids):
    return rewards.unsqueeze(1)  # [B, 1]


def advantage_three_args(rewards, group_ids, extra):
    return rewards
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
    terms = resolve_loss(cfg)[0].terms
    assert [(term.name, coef) for term, coef in terms] == [("entropy", 0.01), (f"{user_module}:logp_square", 0.5)]
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
    ("override", "match"),
    [
        ("grpo.policy_loss=my_loss_terms:policy_two_args", "grpo.policy_loss: .*failed on a dummy batch.*TypeError"),
        ("grpo.policy_loss=my_loss_terms:policy_per_row", "grpo.policy_loss: .*its loss must be a \\[B, T\\]"),
        ("grpo.policy_loss=my_loss_terms:policy_detached", "grpo.policy_loss: .*no gradient"),
        ("grpo.kl_estimator=my_loss_terms:kl_per_row", "grpo.kl_estimator: .*must return a \\[B, T\\]"),
        ("grpo.loss_terms=[my_loss_terms:term_no_args*0.1]", "grpo.loss_terms: .*failed on a dummy batch.*TypeError"),
        ("grpo.loss_terms=[my_loss_terms:term_per_row]", "grpo.loss_terms: .*must return a \\[B, T\\]"),
        (
            "grpo.advantage_estimator=my_loss_terms:advantage_column",
            "grpo.advantage_estimator: .*must return a \\[B\\]",
        ),
        (
            "grpo.advantage_estimator=my_loss_terms:advantage_three_args",
            "grpo.advantage_estimator: .*failed on a dummy batch.*TypeError",
        ),
    ],
)
def test_a_broken_plugin_piece_is_one_line_before_any_model_loads(user_module, override, match):
    """Each kind of plug-in piece is called once on a dummy batch when the config is checked (otherwise a
    wrong signature or shape would surface as a traceback after the first rollout)."""
    extra = ["grpo.beta=0.1"] if "kl_estimator" in override else []
    with pytest.raises(ConfigError, match=match) as err:
        load_config(CONFIGS / "grpo.yaml", [override, *extra])
    assert "\n" not in str(err.value)


def test_plugin_knobs_are_checked_like_built_ins(user_module):
    base = ["grpo.policy_loss=my_loss_terms:capped_reinforce"]
    cfg = load_config(CONFIGS / "grpo.yaml", [*base, "grpo.policy_loss_args.cap=1.5"])
    policy = resolve_loss(cfg)[0].policy
    assert (policy.args.cap, policy.args.floor) == (1.5, 0.0)
    for bad, match in (
        ("grpo.policy_loss_args.cap=0", "grpo.policy_loss_args.cap must be a finite number > 0"),
        ("grpo.policy_loss_args.caps=3", "unknown knob 'caps' of my_loss_terms:capped_reinforce.*did you mean 'cap'"),
        ("grpo.policy_loss_args.floor=[1]", "grpo.policy_loss_args.floor: expected a number"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(CONFIGS / "grpo.yaml", [*base, bad])
    with pytest.raises(ConfigError, match="grpo.kl_estimator_args.scale must be"):
        load_config(
            CONFIGS / "grpo.yaml", ["grpo.kl_estimator=my_loss_terms:scaled_k1", "grpo.kl_estimator_args.scale=11"]
        )
    with pytest.raises(ConfigError, match="grpo.advantage_estimator_args: unknown knob 'spred'"):
        load_config(
            CONFIGS / "grpo.yaml",
            ["grpo.advantage_estimator=my_loss_terms:rank_advantages", "grpo.advantage_estimator_args.spred=2"],
        )


def test_plugin_pieces_with_knobs_train_two_steps(tiny_model_dir, tmp_path, user_module):
    """A policy loss, a KL estimator and an advantage estimator with their own knobs, from a module written in
    tmp_path, train 2 steps; every call received the knobs the config gave."""
    import importlib

    from regroup.train.build import build_trainer

    module = importlib.import_module(user_module)
    cfg = small_config(
        tiny_model_dir,
        tmp_path / "run",
        "grpo.yaml",
        "rewards=[_dist_worker:digit_reward]",
        "train.steps=2",
        "grpo.prompts_per_step=2",
        "rollout.max_new_tokens=8",
        "grpo.num_iterations=2",
        f"grpo.policy_loss={user_module}:capped_reinforce",
        "grpo.policy_loss_args={cap: 1.5, floor: 0.5}",
        "grpo.beta=0.05",
        f"grpo.kl_estimator={user_module}:scaled_k1",
        "grpo.kl_estimator_args.scale=0.5",
        f"grpo.advantage_estimator={user_module}:rank_advantages",
        "grpo.advantage_estimator_args.spread=2.0",
    )
    trainer = build_trainer(cfg, tmp_path / "run", log=lambda m: None)
    module.SEEN.clear()  # the config check's dummy calls are not training
    before = weights(trainer.model)
    last = trainer.train()
    assert trainer.step == 2 and last["skipped_nonfinite"] == 0.0
    after = weights(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    policy_calls = [c for c in module.SEEN if c[0] == "policy"]
    advantage_calls = [c for c in module.SEEN if c[0] == "advantage"]
    assert policy_calls and set(policy_calls) == {("policy", 1.5, 0.5)}
    assert len(advantage_calls) == 2 and set(advantage_calls) == {("advantage", 2.0)}  # once per step
    assert "my_loss_terms:capped_reinforce(cap=1.5, floor=0.5)" in describe_loss(trainer.recipe.loss)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        # the old flat keys are gone (0.1.0: nothing to migrate), each refused in one line
        (["grpo.importance_level=sequence"], "unknown config key grpo.importance_level"),
        (["grpo.cispo_clip_max=2"], "unknown config key grpo.cispo_clip_max"),
        (["grpo.adv_scale=none"], "unknown config key grpo.adv_scale"),
        (["grpo.policy_loss=gmpoo"], "grpo.policy_loss: unknown policy loss 'gmpoo'.*did you mean 'gmpo'"),
        (["grpo.kl_estimator=k4"], "grpo.kl_estimator: unknown KL estimator 'k4'"),
        (["grpo.loss_terms=[entropy*lots]"], "grpo.loss_terms: 'entropy\\*lots'"),
        (["rollout.tis_cap=2", "rollout.is_min=2"], "rollout.is_min .* must be < rollout.tis_cap"),
        (["rollout.is_mode=sequence_mask"], "rollout.tis_cap=0 turns off"),
        (["ta.enabled=true", "rollout.tis_cap=2", "rollout.is_mode=sequence_truncate"], "ta.ratio_anchor=original"),
        # knobs: out of bounds, unknown (with a suggestion), wrong type, on a piece without knobs, not a mapping
        (
            ["grpo.policy_loss=cispo", "grpo.policy_loss_args.clip_max=0"],
            "grpo.policy_loss_args.clip_max must be a finite number > 0 and <= 1e",
        ),
        (
            ["grpo.policy_loss=sapo", "grpo.policy_loss_args.temperature_neg=-1"],
            "grpo.policy_loss_args.temperature_neg must be",
        ),
        (["grpo.policy_loss_args.delta=0.5"], "grpo.policy_loss_args.delta must be a finite number > 1"),
        (["grpo.policy_loss_args.delta=.inf"], "grpo.policy_loss_args.delta must be a finite number"),
        (
            ["grpo.policy_loss=cispo", "grpo.policy_loss_args.clip_maxx=2"],
            "grpo.policy_loss_args: unknown knob 'clip_maxx' of cispo.*did you mean 'clip_max'",
        ),
        (
            ["grpo.policy_loss=cispo", "grpo.policy_loss_args.clip_max=lots"],
            "grpo.policy_loss_args.clip_max: expected a number",
        ),
        (["grpo.policy_loss_args=5"], "grpo.policy_loss_args: expected a mapping"),
        (["grpo.kl_estimator_args.clamp=3"], "grpo.kl_estimator_args: k3 takes no knobs"),
        (
            ["grpo.advantage_estimator=dr_grpo", "grpo.advantage_estimator_args.eps=1e-6"],
            "grpo.advantage_estimator_args: dr_grpo takes no knobs",
        ),
        (["grpo.advantage_estimator_args.scale=none"], "grpo.advantage_estimator_args.scale: must be one of"),
        (["grpo.advantage_estimator=drgrpo"], "grpo.advantage_estimator: .*did you mean 'dr_grpo'"),
        (["grpo.loss_term_args.entropy.x=1"], "grpo.loss_term_args: 'entropy' is not among the loss terms"),
        (["grpo.off_policy_mask_threshold=0"], "grpo.off_policy_mask_threshold must be"),
    ],
)
def test_bad_loss_settings_are_refused_before_any_model_loads(overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_config(CONFIGS / "grpo.yaml", overrides)
    assert "\n" not in str(err.value)  # one line


def test_variants_compose_with_ta_q0_ratios_and_dagrpo_masks():
    """The combinations that make sense load (the ones that do not are refused above)."""
    for recipe in ("ta_grpo.yaml", "dagrpo.yaml", "dagrpo_ta.yaml"):
        for policy in ("ppo_clip", "gspo", "cispo", "sapo", "gmpo", "vespo", "luspo"):
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
    "cispo": ("grpo.yaml", "grpo.policy_loss=cispo", "grpo.policy_loss_args.clip_max=1.05", "grpo.num_iterations=2"),
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
    # TRL 1.16's additions: VESPO with the off-policy sequence mask, LUSPO with the two-sided clip
    "vespo+opsm": (
        "grpo.yaml",
        "grpo.policy_loss=vespo",
        "grpo.policy_loss_args.k_neg=2.5",
        "grpo.off_policy_mask_threshold=0.01",
        "grpo.num_iterations=2",
    ),
    "luspo+delta+batch_std": (
        "grpo.yaml",
        "grpo.policy_loss=luspo",
        "grpo.policy_loss_args.delta=1.5",
        "grpo.loss_agg=seq_mean_token_mean",
        "grpo.advantage_estimator_args.scale=batch",
        "grpo.num_iterations=2",
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


def test_the_one_file_examples_of_docs_extending_work(tmp_path, monkeypatch):
    """docs/extending.md's built-in loss file and user advantage-estimator file, written out as they stand in
    the docs, load, take their knobs from the config, and compute (training with such pieces:
    test_plugin_pieces_with_knobs_train_two_steps)."""
    import re

    from regroup.stages.advantages import GroupAdvantages

    text = (CONFIGS.parent / "docs" / "extending.md").read_text()
    blocks = {m.group(1): m.group(0) for m in re.finditer(r"# (\S+\.py)\n.*?(?=```)", text, re.S)}
    (tmp_path / "docs_my_loss.py").write_text(blocks["src/regroup/algo/my_loss.py"])
    (tmp_path / "docs_rank_adv.py").write_text(blocks["my_pkg/rank_adv.py"])
    monkeypatch.syspath_prepend(str(tmp_path))
    import docs_my_loss  # noqa: F401  (registers "my_loss" as a built-in would)

    try:
        cfg = load_config(
            CONFIGS / "grpo.yaml",
            [
                "grpo.policy_loss=my_loss",
                "grpo.policy_loss_args.cap=1.5",
                "grpo.advantage_estimator=docs_rank_adv:rank_advantages",
                "grpo.advantage_estimator_args.spread=2.0",
            ],
        )
        with pytest.raises(ConfigError, match="grpo.policy_loss_args.cap must be"):
            load_config(CONFIGS / "grpo.yaml", ["grpo.policy_loss=my_loss", "grpo.policy_loss_args.cap=0"])
        spec, estimator = resolve_loss(cfg)
        assert spec.policy.args.cap == 1.5
        c = _case()
        lp = torch.log_softmax(c["logits"], -1).gather(-1, c["tokens"][..., None]).squeeze(-1)
        totals = LossTotals(total_tokens=float(c["mask"].sum()), total_sequences=B, max_completion_length=T)
        loss, met = policy_loss(lp, c["old"], LossInputs(c["adv"], c["mask"]), spec, totals)
        loss.backward()
        assert c["logits"].grad.abs().sum() > 0 and met["clip/high_frac"].item() > 0  # the cap bites somewhere
        stage = GroupAdvantages(estimator)
        adv = call_piece(
            stage.estimator.fn, stage.estimator.args, torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1])
        )
        assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]  # spread 2 over a mixed group; a uniform group gets 0
    finally:
        POLICY_LOSSES._items.pop("my_loss", None)  # the registry is process-wide; leave it as the package made it
