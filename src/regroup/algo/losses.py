"""Per-token policy-gradient loss, KL, aggregation modes, and their composition (SPEC §1, §2a.4, §2b.3).

The loss is composed from named pieces (`regroup.config.registry`), one module each: a policy loss
(`POLICY_LOSSES`: ppo_clip, gspo, cispo, sapo, gmpo, vespo, luspo, or a user's `pkg.mod:obj`), a KL
estimator (`KL_ESTIMATORS`: k1, k2, k3, low_var_kl) and extra terms (`LOSS_TERMS`: entropy, or a user's).
`LossSpec` names them with their knobs; `policy_loss` composes them with anchors, DaGRPO weights, the
sampler IS weight and the off-policy sequence mask, and aggregates.

One signature per kind; a piece that declares knobs (an `Args` dataclass, `regroup.config.registry.takes`) also
gets them as the keyword `args`:
- policy loss `(logps[B, T], old_logps[B, T], advantages[B] or [B, T], mask[B, T], spec) ->
  (per-token loss [B, T], low-clip flags [B, T], high-clip flags [B, T])`; `mask` marks the on-policy
  loss tokens (a sequence-level loss averages over them). An attribute `ratio_level = "sequence"` on
  the function says its ratio is one per response (the KL correction and the ratio metric use it);
  `folds_is_weight = True` says it takes the sampler IS weight as the keyword `is_weight` itself (VESPO)
  instead of having its loss multiplied by it;
- KL estimator `(logps[B, T], ref_logps[B, T]) -> [B, T]`;
- loss term `(TermInputs) -> [B, T]` per-token value (aggregated over the loss tokens with the policy's
  `agg`, or with the term's own `agg` attribute) or a 0-d tensor the term normalised itself (with
  `TermInputs.totals`); `needs_entropy = True` makes the trainer compute a differentiable entropy.

Aggregation normalisers are totals over the WHOLE optimizer batch (all micro-batches, all ranks), passed
in by the caller, so that the sum of micro-batch losses (and so of their gradients) equals the loss of
the full batch, whatever the micro-batch split. With one micro-batch the three modes are TRL's
`loss_type` "dapo", "grpo" and "dr_grpo" (see `TRL_LOSS_TYPES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from regroup.algo.anchors import plain_anchor_pg_loss, shaped_pg_loss
from regroup.algo.gspo import sequence_ratio
from regroup.algo.off_policy_mask import off_policy_mask
from regroup.config.registry import KL_ESTIMATORS, LOSS_TERMS, POLICY_LOSSES, args_class, parse_args

AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_sum_constant")
ANCHOR_RATIOS = ("shaped", "plain")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # `loss_inputs.sampler_is_weight`
# regroup aggregation mode -> the TRL GRPOTrainer `loss_type` that computes the same loss.
TRL_LOSS_TYPES = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_sum_constant": "dr_grpo"}


def aggregate(
    per_token_loss: Tensor,
    loss_mask: Tensor,
    mode: str,
    *,
    total_tokens: float,
    total_sequences: int,
    max_completion_length: int,
) -> Tensor:
    """Reduce a per-token loss [B, T] over its loss tokens to a scalar (SPEC §1 `loss_agg`).

    - `token_mean`: Σ l·m / total_tokens (TRL "dapo", verl "token-mean");
    - `seq_mean_token_mean`: Σ_i [Σ_t l·m / max(Σ_t m, 1)] / total_sequences (TRL "grpo");
    - `seq_sum_constant`: Σ l·m / (total_sequences · max_completion_length) (TRL "dr_grpo").

    `total_tokens` (loss tokens) and `total_sequences` count the whole optimizer batch, including
    sequences whose loss is later zeroed by a DaGRPO mask (SPEC §2a.4: the normaliser is not reduced).
    `total_tokens` is clamped to ≥ 1 as TRL does, so an all-padding batch gives 0, not NaN.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"aggregation mode must be one of {AGG_MODES}, got {mode!r}")
    if per_token_loss.shape != loss_mask.shape:
        raise ValueError(
            f"loss_mask shape {tuple(loss_mask.shape)} does not match per_token_loss {tuple(per_token_loss.shape)}"
        )
    if total_sequences < 1:
        raise ValueError(f"total_sequences must be >= 1, got {total_sequences}")
    if max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
    if total_tokens < 0:
        raise ValueError(f"total_tokens must be >= 0, got {total_tokens}")
    m = loss_mask.bool()  # [B, T]
    # where (not multiply) so a NaN/inf on a padding position cannot leak into the sum.
    masked = torch.where(m, per_token_loss, torch.zeros_like(per_token_loss))  # [B, T]
    if mode == "token_mean":
        return masked.sum() / max(float(total_tokens), 1.0)
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(dim=1) / m.sum(dim=1).clamp(min=1).to(masked.dtype)  # [B]
        return per_seq.sum() / total_sequences
    return masked.sum() / (total_sequences * max_completion_length)


@dataclass(frozen=True)
class LossSpec:
    """What the policy loss is made of, decided once by the recipe (the front-ends only fill in tensors).

    - `policy`: the policy-gradient term by `POLICY_LOSSES` name or "pkg.mod:obj" (docs/losses.md), with its
      knobs `policy_args` (its `Args` dataclass, or a mapping that is parsed into it; None: the defaults);
      `eps_low` / `eps_high` are the clip of ppo_clip, gspo and luspo; `policy_ratio_level` is the level of
      the policy's ratio, which the KL correction and the ratio metric use;
    - anchor tokens use `anchor_ratio` ("shaped": −A·p/(p+γ), SPEC §2b.3 / LUFFY; "plain": π_old := sg(π_θ)),
      whatever the policy;
    - KL term: `beta`·`kl` (a `KL_ESTIMATORS` name, default k3, knobs `kl_args`) against the reference,
      times the ratio when `kl_ratio_correction` (TRL's use_bias_correction_kl);
    - extra `terms`: (`LOSS_TERMS` name or "pkg.mod:obj", coefficient) pairs, added as coefficient · term;
      `term_args`: (name, knobs) of the terms that declare knobs;
    - the sampler IS correction (`is_mode`, `is_cap` > 0 turns it on, `is_min` 0: no lower bound), which
      `regroup.algo.loss_inputs.build_loss_inputs` turns into `LossInputs.is_weight`;
    - `off_policy_mask`: OPSM's threshold δ (`regroup.algo.off_policy_mask`; None: off);
    - aggregation: `agg` (token_mean | seq_mean_token_mean | seq_sum_constant) with whole-batch totals.
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    beta: float = 0.0
    kl_ratio_correction: bool = False
    agg: str = "token_mean"
    anchor_ratio: str = "shaped"
    shaping_gamma: float = 0.1
    policy: str = "ppo_clip"
    policy_args: Any = None
    kl: str = "k3"
    kl_args: Any = None
    terms: tuple[tuple[str, float], ...] = ()
    term_args: tuple[tuple[str, Any], ...] = ()
    is_mode: str = "token_truncate"
    is_cap: float = 0.0
    is_min: float = 0.0
    off_policy_mask: float | None = None
    _policy: Any = field(init=False, repr=False, compare=False)
    _kl: Any = field(init=False, repr=False, compare=False)
    _terms: Any = field(init=False, repr=False, compare=False)
    # Facts about the pieces, settled once here (a step reads them in every micro-batch):
    policy_ratio_level: str = field(init=False, repr=False, compare=False)
    """ "sequence" when the policy's ratio is one per response (gspo, gmpo, luspo), else "token"."""
    needs_entropy: bool = field(init=False, repr=False, compare=False)
    """A term reads a differentiable entropy (`LossInputs.entropy`)."""
    moves_every_row: bool = field(init=False, repr=False, compare=False)
    """A term not multiplied by the advantage (β·KL, an extra term) can move a row whose advantage is 0."""

    def __post_init__(self):
        if not (self.eps_low >= 0 and self.eps_high >= 0):  # checked here once, not in each micro-batch's clip
            raise ValueError(f"clip epsilons must be >= 0, got eps_low={self.eps_low}, eps_high={self.eps_high}")
        if self.anchor_ratio not in ANCHOR_RATIOS:
            raise ValueError(f"anchor_ratio must be one of {ANCHOR_RATIOS}, got {self.anchor_ratio!r}")
        if self.agg not in AGG_MODES:
            raise ValueError(f"aggregation mode must be one of {AGG_MODES}, got {self.agg!r}")
        if self.is_mode not in IS_MODES:
            raise ValueError(f"is_mode must be one of {IS_MODES}, got {self.is_mode!r}")
        if self.off_policy_mask is not None and not self.off_policy_mask > 0:
            raise ValueError(f"off_policy_mask must be > 0 (or None: off), got {self.off_policy_mask}")
        # The pieces are looked up once here, not per micro-batch: `_policy`, `_kl` and `_terms` hold the
        # callables with the keywords they take (`args=` for a piece that declares knobs).
        policy = POLICY_LOSSES.get(self.policy)  # ValueError for an unknown name; imports a dotted path
        policy_args = parse_args(args_class(policy), self.policy_args, "policy_args", self.policy)
        object.__setattr__(self, "policy_args", policy_args)
        object.__setattr__(self, "_policy", (policy, _knob_kwargs(policy, policy_args)))
        kl = KL_ESTIMATORS.get(self.kl)
        object.__setattr__(self, "kl_args", parse_args(args_class(kl), self.kl_args, "kl_args", self.kl))
        object.__setattr__(self, "_kl", (kl, _knob_kwargs(kl, self.kl_args)))
        object.__setattr__(self, "terms", tuple((str(n), float(c)) for n, c in self.terms))
        given = dict(self.term_args)
        unknown = set(given) - {name for name, _ in self.terms}
        if unknown:
            raise ValueError(f"term_args names {sorted(unknown)}, which are not among the terms")
        term_args, terms = [], []
        for name, coef in self.terms:
            term = LOSS_TERMS.get(name)
            parsed = parse_args(args_class(term), given.get(name), f"term_args.{name}", name)
            if parsed is not None:
                term_args.append((name, parsed))
            if coef:
                terms.append((name, coef, term, _knob_kwargs(term, parsed)))
        object.__setattr__(self, "term_args", tuple(term_args))
        object.__setattr__(self, "_terms", tuple(terms))
        object.__setattr__(self, "policy_ratio_level", getattr(policy, "ratio_level", "token"))
        object.__setattr__(self, "needs_entropy", any(getattr(t, "needs_entropy", False) for _, _, t, _ in terms))
        object.__setattr__(self, "moves_every_row", self.beta != 0.0 or any(coef for _, coef in self.terms))

    def args_of_term(self, name: str) -> Any:
        """The knobs of the term `name` (None when it has none)."""
        return dict(self.term_args).get(name)


def _knob_kwargs(piece: Any, args: Any) -> dict[str, Any]:
    """The keywords a piece is called with: `args=` its knobs when it declares them (`config.registry.takes`)."""
    return {"args": args} if args_class(piece) is not None else {}


@dataclass
class LossInputs:
    """The tensors of one micro-batch the loss reads besides the log-probs."""

    advantages: Tensor  # [B] or [B, T]
    loss_mask: Tensor  # [B, T] 1 on response tokens
    ref_logps: Tensor | None = None  # [B, T] frozen reference (needed when beta != 0)
    sample_weight: Tensor | None = None  # [B] masks and weights (normaliser NOT reduced)
    anchor_token_mask: Tensor | None = None  # [B, T] forced off-policy (anchor) tokens
    is_weight: Tensor | None = None  # [B, T] or [B, 1] detached IS weight of sampler mismatch
    entropy: Tensor | None = None  # [B, T] differentiable policy entropy (when spec.needs_entropy)
    sampler_logps: Tensor | None = None  # [B, T] behaviour log-probs for OPSM (None: π_old stands in)


@dataclass(frozen=True)
class LossTotals:
    """Whole-optimizer-batch normalisers (all micro-batches, all processes)."""

    total_tokens: float
    total_sequences: int
    max_completion_length: int


@dataclass(frozen=True)
class TermInputs:
    """What an extra loss term (`LOSS_TERMS`) may read for one micro-batch."""

    logps: Tensor  # [B, T] differentiable
    old_logps: Tensor  # [B, T] π_old (π_θ, detached, on anchor and padding tokens)
    advantages: Tensor  # [B] or [B, T]
    loss_mask: Tensor  # [B, T] bool
    on_policy: Tensor  # [B, T] bool: loss tokens sampled from π_old (not anchors)
    entropy: Tensor | None  # [B, T] differentiable when the term needs_entropy
    ref_logps: Tensor | None  # [B, T]
    totals: LossTotals


def rows_with_gradient(advantages: Tensor, sample_weight: Tensor | None, every_row: float | bool) -> Tensor:
    """[B] bool: the rows whose `policy_loss` term can have a non-zero gradient.

    The policy term of a row is multiplied by its advantage (PG, anchor shaping, GSPO, every registered
    policy loss), and all of it by its sample weight; the normalisers count every row whatever its
    terms (SPEC §2a.4). `every_row` is non-zero when the loss has a term that is not multiplied by the
    advantage (β·KL, an entropy bonus, a user term: `LossSpec.moves_every_row`; a float β is accepted).
    So a row with weight 0 (a DaGRPO mask), or with advantage 0 on every token when `every_row` is 0
    (a uniform group), adds exactly nothing to the gradient, and leaving it out of the forward changes
    no parameter. A NaN advantage or weight counts as non-zero, so the NaN guard still sees it.
    """
    if every_row:
        carries = torch.ones(advantages.shape[0], dtype=torch.bool, device=advantages.device)  # [B]
    else:
        carries = advantages.reshape(advantages.shape[0], -1).ne(0).any(dim=1)  # [B]
    if sample_weight is not None:
        carries = carries & sample_weight.ne(0)  # [B]
    return carries


def policy_term(
    logps: Tensor, old_eff: Tensor, advantages: Tensor, on_policy: Tensor, spec: LossSpec, is_weight: Tensor | None
):
    """The spec's policy loss, its outputs checked (a user's loss must return [B, T] tensors). A policy
    that `folds_is_weight` gets `is_weight` itself; the caller multiplies the others' loss by it."""
    policy, kwargs = spec._policy
    extra = {"is_weight": is_weight} if getattr(policy, "folds_is_weight", False) else {}
    out = policy(logps, old_eff, advantages, on_policy, spec, **kwargs, **extra)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise ValueError(
            f"policy loss {spec.policy!r} must return (loss, low_clip, high_clip), got {type(out).__name__}"
        )
    for part, what in zip(out, ("loss", "low-clip flags", "high-clip flags")):
        if not isinstance(part, Tensor) or part.shape != logps.shape:
            raise ValueError(f"policy loss {spec.policy!r}: its {what} must be a [B, T] = {tuple(logps.shape)} tensor")
    return out


def _ratio(logps: Tensor, old_eff: Tensor, on_policy: Tensor, level: str) -> Tensor:
    """The policy's importance ratio: per token [B, T] or GSPO's per response [B, 1]."""
    if level == "sequence":
        return sequence_ratio(logps, old_eff, on_policy)  # [B, 1]
    return torch.exp(logps - old_eff)  # [B, T]


def policy_loss(
    logps: Tensor,
    old_logps: Tensor,
    inputs: LossInputs,
    spec: LossSpec,
    totals: LossTotals,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The full GRPO / DaGRPO / TA-GRPO policy loss of one micro-batch, aggregated with whole-batch totals.

    Per loss token (`loss_mask` True):
    - on-policy token: the spec's policy loss (PPO-clip on the token ratio, SPEC §1; GSPO; CISPO; SAPO;
      GMPO; VESPO; LUSPO; a user's), times OPSM's keep mask when `spec.off_policy_mask` is set (against
      `sampler_logps`, else π_old), times `is_weight` (sampler IS correction, [B, T] or [B, 1]) when given
      (a policy that `folds_is_weight`, VESPO, uses it inside its own weight instead);
    - anchor token (`anchor_token_mask` True, forced off-policy expert token): `−A·p/(p+γ)` with
      `anchor_ratio="shaped"` (SPEC §2b.3, LUFFY, no clipping), or `−A·exp(logp − sg(logp))` with "plain";
    - plus `beta · KL(π_θ ‖ π_ref)` (the spec's estimator, default k3) on every loss token when `beta != 0`
      (requires `ref_logps`); with `kl_ratio_correction=True` the KL term is multiplied by the
      (differentiable) ratio π_θ/π_old of the policy's level, which is TRL's `use_bias_correction_kl=True`
      (its default since TRL 1.x; SPEC §1 is plain k3);
    - all of it times `sample_weight[i]` (DaGRPO distinctiveness mask as 0/1 float; SPEC §2a.4), while the
      normaliser (the totals) is NOT reduced for masked samples;
    - plus, for each `(term, c)` of `spec.terms`, c · the term (per-token terms times `sample_weight` too,
      aggregated over the loss tokens).

    Returns `(loss, metrics)`; metrics are detached 0-d tensors, means over THIS micro-batch:
    `pg_loss` (the aggregated policy-gradient part, without KL), `clip_low_frac`, `clip_high_frac`,
    `clip_frac` (low or high), `ratio_mean` (over on-policy loss tokens only; anchor tokens excluded;
    0 when there are none), `n_onpolicy_tokens`, `n_anchor_tokens`, `n_loss_tokens` (counts, so that
    micro-batch means can be combined exactly), `anchor_prob_mean` (mean p over anchor tokens; only when
    `anchor_token_mask` is given), `kl_mean` (mean KL estimate over loss tokens; only when `ref_logps` is
    given), `is_weight_mean` (over on-policy loss tokens; only when `is_weight` is given), and
    `off_policy_masked_frac` (on-policy tokens OPSM dropped; only when it is on), and
    `term/<name>` (each extra term's aggregated value before its coefficient).
    """
    advantages, loss_mask = inputs.advantages, inputs.loss_mask
    ref_logps, sample_weight, is_weight = inputs.ref_logps, inputs.sample_weight, inputs.is_weight
    anchor_token_mask = inputs.anchor_token_mask
    beta, anchor_ratio, agg = spec.beta, spec.anchor_ratio, spec.agg
    if logps.shape != old_logps.shape or logps.shape != loss_mask.shape:
        raise ValueError(
            f"logps {tuple(logps.shape)}, old_logps {tuple(old_logps.shape)} and loss_mask "
            f"{tuple(loss_mask.shape)} must have the same [B, T] shape"
        )
    if beta != 0.0 and ref_logps is None:
        raise ValueError(f"beta={beta} needs ref_logps (log-probs of the frozen reference model)")
    mask = loss_mask.bool()  # [B, T]
    anchor = torch.zeros_like(mask) if anchor_token_mask is None else anchor_token_mask.bool()  # [B, T]
    if anchor.shape != mask.shape:
        raise ValueError(f"anchor_token_mask shape {tuple(anchor.shape)} does not match loss_mask {tuple(mask.shape)}")
    on_policy = mask & ~anchor  # [B, T]
    if advantages.shape not in ((logps.shape[0],), logps.shape):
        raise ValueError(f"advantages shape {tuple(advantages.shape)} must be [B] or [B, T] = {tuple(logps.shape)}")

    # π_old is undefined on anchor and padding tokens; use π_θ there (ratio 1) so that whatever the
    # caller stored cannot produce inf/NaN in the unselected branch (0·inf = NaN in backward).
    old_eff = torch.where(on_policy, old_logps, logps.detach())  # [B, T]
    level = spec.policy_ratio_level  # [B, T] ratios or one per response
    if is_weight is not None and is_weight.shape not in (mask.shape, (mask.shape[0], 1)):
        raise ValueError(f"is_weight shape {tuple(is_weight.shape)} must be [B, T] = {tuple(mask.shape)} or [B, 1]")
    is_w = None if is_weight is None else is_weight.detach()
    folds = getattr(spec._policy[0], "folds_is_weight", False)
    pg, is_low, is_high = policy_term(logps, old_eff, advantages, on_policy, spec, is_w)  # [B, T] x3
    keep = None
    if spec.off_policy_mask is not None:  # OPSM: drop far-off-policy responses with A < 0 (DeepSeek-V3.2 eq. 9)
        sampler = old_eff if inputs.sampler_logps is None else inputs.sampler_logps
        keep = off_policy_mask(advantages, logps, sampler, on_policy, spec.off_policy_mask)  # [B, 1] or [B, T]
        pg = pg * keep  # [B, T]
    if is_w is not None and not folds:
        pg = torch.where(on_policy, pg * is_w, pg)  # [B, T]
    if anchor_token_mask is not None:
        if anchor_ratio == "shaped":
            anchor_loss = shaped_pg_loss(logps, advantages, spec.shaping_gamma)  # [B, T]
        else:
            anchor_loss = plain_anchor_pg_loss(logps, advantages)  # [B, T]
        pg = torch.where(anchor, anchor_loss, pg)  # [B, T]

    weight = None
    if sample_weight is not None:
        if sample_weight.shape != (logps.shape[0],):
            raise ValueError(f"sample_weight must be [B={logps.shape[0]}], got {tuple(sample_weight.shape)}")
        weight = sample_weight.to(pg.dtype).unsqueeze(1)  # [B, 1]
        pg = pg * weight  # [B, T]

    per_token = pg
    kl = None
    if ref_logps is not None:
        kl_fn, kl_kwargs = spec._kl
        kl = kl_fn(logps, ref_logps, **kl_kwargs)  # [B, T]
        if beta != 0.0:
            kl_term = beta * kl  # [B, T]
            if spec.kl_ratio_correction:
                # Unbiased reverse-KL gradient from π_old samples (DeepSeek-V3.2; TRL use_bias_correction_kl).
                # The correction uses the ratio of the policy's level (GSPO: the sequence ratio, as TRL).
                kl_term = kl_term * _ratio(logps, old_eff, on_policy, level)  # [B, T]
            if weight is not None:
                kl_term = kl_term * weight  # [B, T]
            per_token = per_token + kl_term

    def reduce(values: Tensor, mode: str) -> Tensor:
        """`aggregate` over the loss tokens with the whole-batch totals."""
        return aggregate(
            values,
            mask,
            mode,
            total_tokens=totals.total_tokens,
            total_sequences=totals.total_sequences,
            max_completion_length=totals.max_completion_length,
        )

    loss = reduce(per_token, agg)

    term_values: dict[str, Tensor] = {}
    if spec._terms:
        t_in = TermInputs(
            logps=logps,
            old_logps=old_eff,
            advantages=advantages,
            loss_mask=mask,
            on_policy=on_policy,
            entropy=inputs.entropy,
            ref_logps=ref_logps,
            totals=totals,
        )
        for name, coef, term, kwargs in spec._terms:
            value = term(t_in, **kwargs)
            if not isinstance(value, Tensor) or (value.dim() != 0 and value.shape != mask.shape):
                raise ValueError(f"loss term {name!r} must return a [B, T] = {tuple(mask.shape)} or a 0-d tensor")
            if value.dim() != 0:
                if weight is not None:
                    value = value * weight  # [B, T]
                value = reduce(value, getattr(term, "agg", agg))
            loss = loss + coef * value
            term_values[name] = value.detach()

    with torch.no_grad():
        ratio = _ratio(logps.detach(), old_eff, on_policy, level).expand_as(logps)  # [B, T]
        n_on = on_policy.sum()
        denom = n_on.clamp(min=1).to(logps.dtype)

        def on_mean(x: Tensor) -> Tensor:
            return torch.where(on_policy, x.to(logps.dtype), torch.zeros_like(logps)).sum() / denom

        metrics: dict[str, Tensor] = {
            "pg_loss": reduce(pg.detach(), agg),
            "clip_low_frac": on_mean(is_low),
            "clip_high_frac": on_mean(is_high),
            "clip_frac": on_mean(is_low | is_high),
            "ratio_mean": on_mean(ratio),
            "n_onpolicy_tokens": n_on.to(logps.dtype),
            "n_anchor_tokens": (mask & anchor).sum().to(logps.dtype),
            "n_loss_tokens": mask.sum().to(logps.dtype),
        }
        if anchor_token_mask is not None:
            am = mask & anchor
            p = torch.where(am, logps.detach().exp(), torch.zeros_like(logps))
            metrics["anchor_prob_mean"] = p.sum() / am.sum().clamp(min=1).to(logps.dtype)
        if kl is not None:
            k = torch.where(mask, kl.detach(), torch.zeros_like(kl))
            metrics["kl_mean"] = k.sum() / mask.sum().clamp(min=1).to(logps.dtype)
        if is_weight is not None:
            metrics["is_weight_mean"] = on_mean(is_weight.detach().expand_as(logps))
        if keep is not None:
            metrics["off_policy_masked_frac"] = on_mean(1.0 - keep.expand_as(logps))
        for name, value in term_values.items():
            metrics[f"term/{name}"] = value
    return loss, metrics
