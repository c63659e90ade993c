"""The loss settings of a run config, resolved into one `LossSpec` (and the advantage estimator) and checked
before any model loads.

`loss_spec(cfg)` is the only reader of the loss fields (`grpo.*`, `rollout.tis_cap` / `is_mode` /
`is_min`, `anchors.ratio` / `gamma`); config validation calls it (so a bad name, knob or combination is a
one-line error naming the keys) and the recipe keeps what it returns. `advantage_estimator(cfg)` resolves
`grpo.advantage_estimator` and its knobs for the advantage stage; `loss_spec` checks it too.

Each piece's knobs (`grpo.policy_loss_args`, `kl_estimator_args`, `loss_term_args`,
`advantage_estimator_args`) are checked against the piece's own `Args` by the mechanism that checks the run
config (`regroup.config.registry.parse_args`). A user's piece (`pkg.mod:obj`) is also called once on a tiny dummy
batch here (`check_plugins`), so that a wrong signature or output shape is one line now, not a traceback after the
weights load and the first rollout. Errors are `ConfigError`s.
"""

from __future__ import annotations

from typing import Any

import torch

import regroup.algo  # noqa: F401  (registers the built-in loss pieces and advantage estimators)
from regroup.algo.losses import LossSpec, LossTotals, TermInputs, policy_term
from regroup.config.registry import (
    ADV_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_TERMS,
    POLICY_LOSSES,
    args_class,
    call_piece,
    did_you_mean,
    parse_args,
)
from regroup.config.schema import parse_weighted
from regroup.errors import ConfigError

DUMMY_B, DUMMY_T = 4, 3  # the dummy batch a user's piece is called on: 2 groups of 2 responses, 3 tokens


def _knobs_of(key: str, registry, name: str, given: Any) -> Any:
    """The knobs of the piece `name` of the setting `key`, parsed from `key`_args: ConfigError naming the key."""
    return parse_args(args_class(registry.resolve(key, name)), given, f"{key}_args", name)


def advantage_estimator(cfg) -> tuple[str, Any]:
    """(`grpo.advantage_estimator`, its knobs parsed into its `Args`, or None) — ConfigError naming the key."""
    g = cfg.grpo
    key = "grpo.advantage_estimator"
    return g.advantage_estimator, _knobs_of(key, ADV_ESTIMATORS, g.advantage_estimator, g.advantage_estimator_args)


def loss_spec(cfg, *, ratio_on_original: bool) -> LossSpec:
    """The `LossSpec` of `cfg`, or ConfigError naming the keys of a bad name, knob or combination. Also checks
    the advantage estimator, and calls every user piece once on a dummy batch (`check_plugins`).
    `ratio_on_original`: the recipe takes every ratio on (q0, o) (`regroup.train.recipes.features`, the reader
    of `ta.enabled`)."""
    g, r = cfg.grpo, cfg.rollout
    policy_args = _knobs_of("grpo.policy_loss", POLICY_LOSSES, g.policy_loss, g.policy_loss_args)
    kl_args = _knobs_of("grpo.kl_estimator", KL_ESTIMATORS, g.kl_estimator, g.kl_estimator_args)
    terms = [parse_weighted(t, "grpo.loss_terms") for t in g.loss_terms]
    if g.entropy_coef:
        terms.insert(0, ("entropy", g.entropy_coef))
    names = [name for name, _ in terms]
    for name in g.loss_term_args:
        if name not in names:
            raise ConfigError(
                f"grpo.loss_term_args: {name!r} is not among the loss terms ({', '.join(names) or 'none'})"
                f"{did_you_mean(name, names)}"
            )
    term_args = []
    for name in dict.fromkeys(names):
        term = LOSS_TERMS.resolve("grpo.loss_terms", name)
        parsed = parse_args(args_class(term), g.loss_term_args.get(name), f"grpo.loss_term_args.{name}", name)
        if parsed is not None:
            term_args.append((name, parsed))
    estimator, estimator_args = advantage_estimator(cfg)
    if r.tis_cap > 0 and ratio_on_original:
        raise ConfigError(
            "rollout.tis_cap > 0 with ta.ratio_anchor=original would divide pi_old(o|q0) by the sampler's "
            "pi(o|q_n), a ratio of two different prompts; set rollout.tis_cap=0 or ta.ratio_anchor=own"
        )
    if r.tis_cap > 0 and r.is_min >= r.tis_cap:
        raise ConfigError(f"rollout.is_min ({r.is_min}) must be < rollout.tis_cap ({r.tis_cap})")
    if r.tis_cap == 0 and (r.is_mode != "token_truncate" or r.is_min > 0):
        raise ConfigError(
            "rollout.is_mode / rollout.is_min set the IS correction, which rollout.tis_cap=0 turns off; "
            "set rollout.tis_cap > 0 (e.g. 3)"
        )
    spec = LossSpec(
        eps_low=g.eps_low,
        eps_high=g.eps_high,
        beta=g.beta,
        kl_ratio_correction=g.kl_ratio_correction,
        agg=g.loss_agg,
        anchor_ratio=cfg.anchors.ratio,
        shaping_gamma=cfg.anchors.gamma,
        policy=g.policy_loss,
        policy_args=policy_args,
        kl=g.kl_estimator,
        kl_args=kl_args,
        terms=tuple(terms),
        term_args=tuple(term_args),
        is_mode=r.is_mode,
        is_cap=r.tis_cap,
        is_min=r.is_min,
        off_policy_mask=g.off_policy_mask_threshold,
    )
    check_plugins(spec, estimator, estimator_args)
    return spec


# ---- a user's pieces, called once on a dummy batch -------------------------------------------------------------


def _dummy_batch() -> dict[str, torch.Tensor]:
    """A tiny batch with every case a piece meets: mixed-sign advantages, a padded and an empty response."""
    gen = torch.Generator().manual_seed(0)
    logps = (-torch.rand(DUMMY_B, DUMMY_T, generator=gen) * 2 - 0.1).requires_grad_(True)  # [B, T]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)  # [B, T]
    return {
        "logps": logps,
        "old": logps.detach() + 0.1 * torch.randn(DUMMY_B, DUMMY_T, generator=gen),  # [B, T]
        "ref": logps.detach() - 0.1,  # [B, T]
        "entropy": torch.rand(DUMMY_B, DUMMY_T, generator=gen).requires_grad_(True),  # [B, T]
        "mask": mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),  # [B]
        "rewards": torch.tensor([1.0, 0.0, 1.0, 0.0]),  # [B]
        "group_ids": torch.tensor([0, 0, 1, 1]),  # [B]
    }


def _shape(x: Any) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def _dummy_call(key: str, name: str, fn, what: str) -> Any:
    """`fn()`, any exception turned into one ConfigError line naming `key` and the piece."""
    try:
        return fn()
    except Exception as exc:  # a user's code: whatever it raises, one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(
            f"{key}: {name!r} failed on a dummy batch of {DUMMY_B} responses x {DUMMY_T} tokens "
            f"({what}): {type(exc).__name__}: {first}"
        ) from None


def check_plugins(spec: LossSpec, estimator: str, estimator_args: Any) -> None:
    """Call each user piece (`pkg.mod:obj`) of `spec` and the advantage estimator once on a dummy batch, and
    check its output: ConfigError naming the key for a wrong signature, shape or a loss without gradient.
    Built-ins are not called (their tests are)."""
    d = _dummy_batch()
    shape = (DUMMY_B, DUMMY_T)
    if ":" in spec.policy:
        sig = "(logps, old_logps, advantages, mask, spec) -> (loss, low_clip, high_clip), each [B, T]"
        out = _dummy_call(
            "grpo.policy_loss",
            spec.policy,
            lambda: policy_term(d["logps"], d["old"], d["advantages"], d["mask"], spec, None),
            sig,
        )
        if not out[0].requires_grad:
            raise ConfigError(
                f"grpo.policy_loss: {spec.policy!r} returned a loss with no gradient with respect to logps "
                "(detached?), so it would train nothing"
            )
    if ":" in spec.kl:
        kl_fn = KL_ESTIMATORS.get(spec.kl)
        value = _dummy_call(
            "grpo.kl_estimator",
            spec.kl,
            lambda: call_piece(kl_fn, spec.kl_args, d["logps"], d["ref"]),
            "(logps, ref_logps) -> [B, T]",
        )
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            raise ConfigError(
                f"grpo.kl_estimator: {spec.kl!r} must return a [B, T] = {shape} tensor, got {_shape(value)}"
            )
    totals = LossTotals(total_tokens=float(d["mask"].sum()), total_sequences=DUMMY_B, max_completion_length=DUMMY_T)
    t_in = TermInputs(
        logps=d["logps"],
        old_logps=d["old"],
        advantages=d["advantages"],
        loss_mask=d["mask"],
        on_policy=d["mask"],
        entropy=d["entropy"],
        ref_logps=d["ref"],
        totals=totals,
    )
    for name, _ in spec.terms:
        if ":" not in name:
            continue
        term = LOSS_TERMS.get(name)
        value = _dummy_call(
            "grpo.loss_terms",
            name,
            lambda term=term, name=name: call_piece(term, spec.args_of_term(name), t_in),
            "(TermInputs) -> [B, T] or a 0-d tensor",
        )
        if not isinstance(value, torch.Tensor) or (value.dim() != 0 and tuple(value.shape) != shape):
            raise ConfigError(
                f"grpo.loss_terms: {name!r} must return a [B, T] = {shape} or a 0-d tensor, got {_shape(value)}"
            )
    if ":" in estimator:
        est = ADV_ESTIMATORS.get(estimator)
        value = _dummy_call(
            "grpo.advantage_estimator",
            estimator,
            lambda: call_piece(est, estimator_args, d["rewards"], d["group_ids"]),
            "(rewards[B], group_ids[B]) -> advantages[B]",
        )
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (DUMMY_B,):
            raise ConfigError(
                f"grpo.advantage_estimator: {estimator!r} must return a [B] = ({DUMMY_B},) tensor, got {_shape(value)}"
            )
        if not value.is_floating_point():
            raise ConfigError(f"grpo.advantage_estimator: {estimator!r} must return floats, got {value.dtype}")


def describe_loss(spec: LossSpec) -> str:
    """One line naming the loss's pieces and their knobs, for `regroup config --stages`."""
    level = spec.policy_ratio_level
    parts = [
        f"policy {spec.policy}" + _knobs(spec.policy_args),
        f"sequence ({spec.policy.upper()}) ratio" if level == "sequence" else "token ratio",
    ]
    if spec.policy in ("ppo_clip", "gspo", "luspo"):
        parts.append(f"clip {spec.eps_low}/{spec.eps_high}")
    parts.append(f"agg {spec.agg}")
    parts.append(f"beta {spec.beta}" + (f" x {spec.kl}{_knobs(spec.kl_args)}" if spec.beta else ""))
    if spec.is_cap > 0:
        parts.append(f"IS {spec.is_mode} [{spec.is_min or '-'}, {spec.is_cap}]")
    if spec.off_policy_mask is not None:
        parts.append(f"OPSM {spec.off_policy_mask}")
    parts += [f"+ {coef:g} x {name}{_knobs(spec.args_of_term(name))}" for name, coef in spec.terms]
    parts.append(f"anchors {spec.anchor_ratio}")
    return "loss[" + ", ".join(parts) + "]"


def _knobs(args: Any) -> str:
    """`(k=v, ...)` of a piece's knobs (a `Knobs` model or a dataclass), "" for none."""
    values = ", ".join(f"{k}={v}" for k, v in (vars(args) if args is not None else {}).items())
    return f"({values})" if values else ""
