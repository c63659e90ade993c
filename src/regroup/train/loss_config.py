"""The loss settings of a run config, resolved into one `LossSpec` (and the advantage estimator) and checked
before any model loads.

`loss_spec(cfg)` is the only reader of the loss fields (`grpo.*`, `rollout.tis_cap` / `is_mode` /
`is_min`, `anchors.ratio` / `gamma`); config validation calls it (so a bad name, knob or combination is a
one-line error naming the keys) and the recipe keeps what it returns. `advantage_estimator(cfg)` resolves
`grpo.advantage_estimator` and its knobs for the advantage stage; `loss_spec` checks it too.

Each piece's knobs (`grpo.policy_loss_args`, `kl_estimator_args`, `loss_term_args`,
`advantage_estimator_args`) are parsed against the piece's own `Args` dataclass (`regroup.config.registry.parse_args`).
A user's piece (`pkg.mod:obj`) is also called once on a tiny dummy batch here (`check_plugins`), so that a
wrong signature or output shape is one line now, not a traceback after the weights load and the first
rollout. Errors are `ValueError`s; the config turns them into its `ConfigError`.
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

DUMMY_B, DUMMY_T = 4, 3  # the dummy batch a user's piece is called on: 2 groups of 2 responses, 3 tokens


def parse_term_spec(spec: str) -> tuple[str, float]:
    """`"name"` or `"name*coefficient"` (the name may be `pkg.mod:obj`) -> (name, coefficient)."""
    name, star, coef = str(spec).rpartition("*") if "*" in str(spec) else (str(spec), "", "1")
    name = name.strip()
    try:
        value = float(coef)
    except ValueError:
        raise ValueError(f"grpo.loss_terms: {spec!r}: the coefficient after '*' must be a number") from None
    if not name:
        raise ValueError(f"grpo.loss_terms: {spec!r} names no term")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"grpo.loss_terms: {spec!r}: the coefficient must be finite")
    return name, value


def _piece(key: str, name: str, registry, what: str) -> Any:
    """A built-in, or a dotted path that imports to a callable; ValueError naming `key`."""
    if ":" not in name:
        if name not in registry:
            raise ValueError(
                f"{key}: unknown {what} {name!r}; known: {', '.join(registry.names())} or "
                f"'package.module:function'{did_you_mean(name, registry.names())}"
            )
        return registry.get(name)
    try:
        obj = registry.get(name)  # imports it
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    except Exception as exc:  # the user's module failed while importing
        raise ValueError(f"{key}: importing {name!r} failed: {type(exc).__name__}: {exc}") from None
    if not callable(obj):
        raise ValueError(f"{key}: {name!r} is not callable")
    try:
        args_class(obj)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    return obj


def _args(key: str, piece: Any, given: Any, name: str) -> Any:
    """The piece's knobs parsed from the user's mapping under `key` (None for a piece without knobs)."""
    return parse_args(args_class(piece), given, key, name)


def advantage_estimator(cfg) -> tuple[str, Any]:
    """(`grpo.advantage_estimator`, its knobs parsed into its `Args`, or None) — ValueError naming the key."""
    g = cfg.grpo
    fn = _piece("grpo.advantage_estimator", g.advantage_estimator, ADV_ESTIMATORS, "advantage estimator")
    args = _args("grpo.advantage_estimator_args", fn, g.advantage_estimator_args, g.advantage_estimator)
    return g.advantage_estimator, args


def loss_spec(cfg, *, ratio_on_original: bool) -> LossSpec:
    """The `LossSpec` of `cfg`, or ValueError naming the keys of a bad name, knob or combination. Also checks
    the advantage estimator, and calls every user piece once on a dummy batch (`check_plugins`).
    `ratio_on_original`: the recipe takes every ratio on (q0, o) (`regroup.train.recipes.features`, the reader
    of `ta.enabled`)."""
    g, r = cfg.grpo, cfg.rollout
    policy = _piece("grpo.policy_loss", g.policy_loss, POLICY_LOSSES, "policy loss")
    policy_args = _args("grpo.policy_loss_args", policy, g.policy_loss_args, g.policy_loss)
    kl = _piece("grpo.kl_estimator", g.kl_estimator, KL_ESTIMATORS, "KL estimator")
    kl_args = _args("grpo.kl_estimator_args", kl, g.kl_estimator_args, g.kl_estimator)
    terms = [parse_term_spec(t) for t in g.loss_terms]
    if g.entropy_coef:
        terms.insert(0, ("entropy", g.entropy_coef))
    if not isinstance(g.loss_term_args, dict):
        raise ValueError(f"grpo.loss_term_args: expected a mapping of term name: knobs, got {g.loss_term_args!r}")
    names = [name for name, _ in terms]
    for name in g.loss_term_args:
        if name not in names:
            raise ValueError(
                f"grpo.loss_term_args: {name!r} is not among the loss terms ({', '.join(names) or 'none'})"
                f"{did_you_mean(name, names)}"
            )
    term_args = []
    for name in dict.fromkeys(names):
        term = _piece("grpo.loss_terms", name, LOSS_TERMS, "loss term")
        parsed = _args(f"grpo.loss_term_args.{name}", term, g.loss_term_args.get(name), name)
        if parsed is not None:
            term_args.append((name, parsed))
    estimator, estimator_args = advantage_estimator(cfg)
    if r.tis_cap > 0 and ratio_on_original:
        raise ValueError(
            "rollout.tis_cap > 0 with ta.ratio_anchor=original would divide pi_old(o|q0) by the sampler's "
            "pi(o|q_n), a ratio of two different prompts; set rollout.tis_cap=0 or ta.ratio_anchor=own"
        )
    if r.tis_cap > 0 and r.is_min >= r.tis_cap:
        raise ValueError(f"rollout.is_min ({r.is_min}) must be < rollout.tis_cap ({r.tis_cap})")
    if r.tis_cap == 0 and (r.is_mode != "token_truncate" or r.is_min > 0):
        raise ValueError(
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
    """`fn()`, any exception turned into one ValueError line naming `key` and the piece."""
    try:
        return fn()
    except Exception as exc:  # a user's code: whatever it raises, one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(
            f"{key}: {name!r} failed on a dummy batch of {DUMMY_B} responses x {DUMMY_T} tokens "
            f"({what}): {type(exc).__name__}: {first}"
        ) from None


def check_plugins(spec: LossSpec, estimator: str, estimator_args: Any) -> None:
    """Call each user piece (`pkg.mod:obj`) of `spec` and the advantage estimator once on a dummy batch, and
    check its output: ValueError naming the key for a wrong signature, shape or a loss without gradient.
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
            raise ValueError(
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
            raise ValueError(
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
            raise ValueError(
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
            raise ValueError(
                f"grpo.advantage_estimator: {estimator!r} must return a [B] = ({DUMMY_B},) tensor, got {_shape(value)}"
            )
        if not value.is_floating_point():
            raise ValueError(f"grpo.advantage_estimator: {estimator!r} must return floats, got {value.dtype}")


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
    """`(k=v, ...)` of a piece's knobs, "" for none."""
    if args is None or not hasattr(args, "__dataclass_fields__"):
        return ""
    values = ", ".join(f"{k}={getattr(args, k)}" for k in args.__dataclass_fields__)
    return f"({values})" if values else ""
