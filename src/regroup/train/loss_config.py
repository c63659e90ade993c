"""The loss settings of a run config, resolved into one `LossSpec` and checked before any model loads.

`loss_spec(cfg)` is the only reader of the loss fields (`grpo.*`, `rollout.tis_cap` / `is_mode` /
`is_min`, `anchors.ratio` / `gamma`); config validation calls it (so a bad name or combination is a
one-line error naming the keys) and the recipe keeps what it returns. Errors are `ValueError`s; the
config turns them into its `ConfigError`.
"""

from __future__ import annotations

from regroup.algo.losses import LossSpec
from regroup.registry import KL_ESTIMATORS, LOSS_TERMS, POLICY_LOSSES, did_you_mean

SEQUENCE_RATIO_POLICIES = ("ppo_clip", "gspo")  # grpo.importance_level=sequence means GSPO's ratio


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


def _check_name(key: str, name: str, registry, what: str) -> None:
    """A built-in name, or a dotted path that imports to a callable."""
    if ":" not in name:
        if name not in registry:
            raise ValueError(
                f"{key}: unknown {what} {name!r}; known: {', '.join(registry.names())} or "
                f"'package.module:function'{did_you_mean(name, registry.names())}"
            )
        return
    try:
        obj = registry.get(name)  # imports it
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    if not callable(obj):
        raise ValueError(f"{key}: {name!r} is not callable")


def loss_spec(cfg, *, ratio_on_original: bool) -> LossSpec:
    """The `LossSpec` of `cfg`, or ValueError naming the keys of a bad name or combination. `ratio_on_original`:
    the recipe takes every ratio on (q0, o) (`regroup.train.recipes.features`, the reader of `ta.enabled`)."""
    g, r = cfg.grpo, cfg.rollout
    _check_name("grpo.policy_loss", g.policy_loss, POLICY_LOSSES, "policy loss")
    _check_name("grpo.kl_estimator", g.kl_estimator, KL_ESTIMATORS, "KL estimator")
    terms = [parse_term_spec(t) for t in g.loss_terms]
    for name, _ in terms:
        _check_name("grpo.loss_terms", name, LOSS_TERMS, "loss term")
    if g.importance_level == "sequence" and g.policy_loss not in SEQUENCE_RATIO_POLICIES:
        raise ValueError(
            f"grpo.importance_level=sequence is GSPO's sequence ratio; grpo.policy_loss={g.policy_loss} "
            "computes its own ratio (set grpo.importance_level=token)"
        )
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
    if g.entropy_coef:
        terms.insert(0, ("entropy", g.entropy_coef))
    policy = "gspo" if g.importance_level == "sequence" and g.policy_loss == "ppo_clip" else g.policy_loss
    return LossSpec(
        eps_low=g.eps_low,
        eps_high=g.eps_high,
        beta=g.beta,
        kl_ratio_correction=g.kl_ratio_correction,
        agg=g.loss_agg,
        anchor_ratio=cfg.anchors.ratio,
        shaping_gamma=cfg.anchors.gamma,
        policy=policy,
        kl=g.kl_estimator,
        cispo_clip_max=g.cispo_clip_max,
        sapo_temperature_pos=g.sapo_temperature_pos,
        sapo_temperature_neg=g.sapo_temperature_neg,
        gmpo_clip_low=g.gmpo_clip_low,
        gmpo_clip_high=g.gmpo_clip_high,
        terms=tuple(terms),
        is_mode=r.is_mode,
        is_cap=r.tis_cap,
        is_min=r.is_min,
    )


def describe_loss(spec: LossSpec) -> str:
    """One line naming the loss's pieces, for `regroup config --stages`."""
    level = spec.policy_ratio_level
    parts = [
        f"policy {spec.policy}",
        f"sequence ({spec.policy.upper()}) ratio" if level == "sequence" else "token ratio",
    ]
    if spec.policy in ("ppo_clip", "gspo"):
        parts.append(f"clip {spec.eps_low}/{spec.eps_high}")
    elif spec.policy == "cispo":
        parts.append(f"weight cap {spec.cispo_clip_max}")
    elif spec.policy == "sapo":
        parts.append(f"temperatures {spec.sapo_temperature_pos}/{spec.sapo_temperature_neg}")
    elif spec.policy == "gmpo":
        parts.append(f"log clip {spec.gmpo_clip_low}/{spec.gmpo_clip_high}")
    parts.append(f"agg {spec.agg}")
    parts.append(f"beta {spec.beta}" + (f" x {spec.kl}" if spec.beta else ""))
    if spec.is_cap > 0:
        parts.append(f"IS {spec.is_mode} [{spec.is_min or '-'}, {spec.is_cap}]")
    parts += [f"+ {coef:g} x {name}" for name, coef in spec.terms]
    parts.append(f"anchors {spec.anchor_ratio}")
    return "loss[" + ", ".join(parts) + "]"
