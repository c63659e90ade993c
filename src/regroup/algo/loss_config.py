"""The loss of a run config, resolved once: `resolve_loss(cfg)` looks the named pieces up in their registries
(`regroup.config.registry`: POLICY_LOSSES, KL_ESTIMATORS, LOSS_TERMS, ADV_ESTIMATORS), parses their knobs
(`grpo.policy_loss_args`, `kl_estimator_args`, `loss_term_args`, `advantage_estimator_args`) against each piece's
own `Args`, checks the combinations no single field can, and returns the `LossSpec` and the advantage estimator.

The config check calls it before any model loads and the recipe takes what it returned: one resolution per run. A
user's piece (`pkg.mod:obj`) is also called once on a tiny dummy batch (`check_plugins`), so that a wrong signature
or output shape is one line now, not a traceback after the weights load and the first rollout. Errors are
`ConfigError`s naming the key.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from regroup.algo.loss_spec import LossSpec, Piece
from regroup.algo.loss_terms import TermInputs
from regroup.algo.losses import LossTotals, policy_term
from regroup.config.registry import ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_TERMS, POLICY_LOSSES, did_you_mean
from regroup.config.schema import RunConfig, parse_weighted
from regroup.errors import ConfigError

_RESOLVED: dict[str, tuple[LossSpec, Piece]] = {}
"""Resolutions by the content of the config they came from: the check before the model loads and the recipe share
one (the dummy-batch call of a user's piece runs once per run)."""


def resolve_loss(cfg: RunConfig) -> tuple[LossSpec, Piece]:
    """The `LossSpec` and the advantage estimator of `cfg`, or ConfigError naming the keys of a bad name, knob or
    combination; a user's piece is called once on a dummy batch (`check_plugins`)."""
    key = hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()
    if key not in _RESOLVED:
        if len(_RESOLVED) >= 64:  # a process that checks many configs (tests, a study driver) keeps few
            _RESOLVED.clear()
        _RESOLVED[key] = _resolve(cfg)
    return _RESOLVED[key]


def _resolve(cfg: RunConfig) -> tuple[LossSpec, Piece]:
    g, r = cfg.grpo, cfg.rollout
    weighted = [parse_weighted(t, "grpo.loss_terms") for t in g.loss_terms]
    if g.entropy_coef:
        weighted.insert(0, ("entropy", g.entropy_coef))
    names = [name for name, _ in weighted]
    for name in g.loss_term_args:
        if name not in names:
            raise ConfigError(
                f"grpo.loss_term_args: {name!r} is not among the loss terms ({', '.join(names) or 'none'})"
                f"{did_you_mean(name, names)}"
            )
    pieces = {
        name: Piece.named(
            "grpo.loss_terms", LOSS_TERMS, name, g.loss_term_args.get(name), f"grpo.loss_term_args.{name}"
        )
        for name in dict.fromkeys(names)
    }
    if r.tis_cap > 0 and r.is_min >= r.tis_cap:
        raise ConfigError(f"rollout.is_min ({r.is_min}) must be < rollout.tis_cap ({r.tis_cap})")
    if r.tis_cap == 0 and (r.is_mode != "token_truncate" or r.is_min > 0):
        raise ConfigError(
            "rollout.is_mode / rollout.is_min set the IS correction, which rollout.tis_cap=0 turns off; "
            "set rollout.tis_cap > 0 (e.g. 3)"
        )
    spec = LossSpec(
        # The sections as resolved: a caller that later assigns to `cfg` cannot change a cached resolution.
        grpo=g.model_copy(deep=True),
        rollout=r.model_copy(deep=True),
        anchors=cfg.anchors.model_copy(deep=True),
        policy=Piece.named("grpo.policy_loss", POLICY_LOSSES, g.policy_loss, g.policy_loss_args),
        kl=Piece.named("grpo.kl_estimator", KL_ESTIMATORS, g.kl_estimator, g.kl_estimator_args),
        terms=tuple((pieces[name], coef) for name, coef in weighted if coef),
    )
    estimator = Piece.named(
        "grpo.advantage_estimator", ADV_ESTIMATORS, g.advantage_estimator, g.advantage_estimator_args
    )
    check_plugins(spec, [piece for piece in pieces.values() if ":" in piece.name], estimator)
    return spec, estimator


# ---- a user's pieces, called once on a dummy batch -------------------------------------------------------------

DUMMY_B, DUMMY_T = 4, 3  # the dummy batch a user's piece is called on: 2 groups of 2 responses, 3 tokens


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


def _dummy_call(key: str, name: str, fn: Any, what: str) -> Any:
    """`fn()`, any exception turned into one ConfigError line naming `key` and the piece."""
    try:
        return fn()
    except Exception as exc:  # a user's code: whatever it raises, one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(
            f"{key}: {name!r} failed on a dummy batch of {DUMMY_B} responses x {DUMMY_T} tokens "
            f"({what}): {type(exc).__name__}: {first}"
        ) from None


def check_plugins(spec: LossSpec, user_terms: list[Piece], estimator: Piece) -> None:
    """Call each user piece (`pkg.mod:obj`) of the loss and the advantage estimator once on a dummy batch, and check
    its output: ConfigError naming the key for a wrong signature, shape or a loss without gradient. Built-ins are
    not called (their tests are)."""
    d = _dummy_batch()
    shape = (DUMMY_B, DUMMY_T)
    if ":" in spec.policy.name:
        sig = "(logps, old_logps, advantages, mask, spec) -> (loss, low_clip, high_clip), each [B, T]"
        out = _dummy_call(
            "grpo.policy_loss",
            spec.policy.name,
            lambda: policy_term(d["logps"], d["old"], d["advantages"], d["mask"], spec, None),
            sig,
        )
        if not out[0].requires_grad:
            raise ConfigError(
                f"grpo.policy_loss: {spec.policy.name!r} returned a loss with no gradient with respect to logps "
                "(detached?), so it would train nothing"
            )
    if ":" in spec.kl.name:
        value = _dummy_call(
            "grpo.kl_estimator",
            spec.kl.name,
            lambda: spec.kl.fn(d["logps"], d["ref"], **spec.kl.kwargs),
            "(logps, ref_logps) -> [B, T]",
        )
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
            raise ConfigError(
                f"grpo.kl_estimator: {spec.kl.name!r} must return a [B, T] = {shape} tensor, got {_shape(value)}"
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
    for term in user_terms:
        value = _dummy_call(
            "grpo.loss_terms",
            term.name,
            lambda term=term: term.fn(t_in, **term.kwargs),
            "(TermInputs) -> [B, T] or a 0-d tensor",
        )
        if not isinstance(value, torch.Tensor) or (value.dim() != 0 and tuple(value.shape) != shape):
            raise ConfigError(
                f"grpo.loss_terms: {term.name!r} must return a [B, T] = {shape} or a 0-d tensor, got {_shape(value)}"
            )
    if ":" in estimator.name:
        value = _dummy_call(
            "grpo.advantage_estimator",
            estimator.name,
            lambda: estimator.fn(d["rewards"], d["group_ids"], **estimator.kwargs),
            "(rewards[B], group_ids[B]) -> advantages[B]",
        )
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (DUMMY_B,):
            raise ConfigError(
                f"grpo.advantage_estimator: {estimator.name!r} must return a [B] = ({DUMMY_B},) tensor, "
                f"got {_shape(value)}"
            )
        if not value.is_floating_point():
            raise ConfigError(f"grpo.advantage_estimator: {estimator.name!r} must return floats, got {value.dtype}")


def describe_loss(spec: LossSpec) -> str:
    """One line naming the loss's pieces and their knobs, for `regroup config --stages`."""
    g, r = spec.grpo, spec.rollout
    parts = [
        f"policy {spec.policy.name}" + _knobs(spec.policy.args),
        f"sequence ({spec.policy.name.upper()}) ratio" if spec.ratio_level == "sequence" else "token ratio",
    ]
    if spec.policy.name in ("ppo_clip", "gspo", "luspo"):
        parts.append(f"clip {g.eps_low}/{g.eps_high}")
    parts.append(f"agg {g.loss_agg}")
    parts.append(f"beta {g.beta}" + (f" x {spec.kl.name}{_knobs(spec.kl.args)}" if g.beta else ""))
    if r.tis_cap > 0:
        parts.append(f"IS {r.is_mode} [{r.is_min or '-'}, {r.tis_cap}]")
    if g.off_policy_mask_threshold is not None:
        parts.append(f"OPSM {g.off_policy_mask_threshold}")
    parts += [f"+ {coef:g} x {term.name}{_knobs(term.args)}" for term, coef in spec.terms]
    parts.append(f"anchors {spec.anchors.ratio}")
    return "loss[" + ", ".join(parts) + "]"


def _knobs(args: Any) -> str:
    """`(k=v, ...)` of a piece's knobs (a `Knobs` model), "" for none."""
    values = ", ".join(f"{k}={v}" for k, v in (vars(args) if args is not None else {}).items())
    return f"({values})" if values else ""
