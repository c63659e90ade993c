"""What a run's loss is made of: `LossSpec`, the config sections that set it and its pieces, and `Piece`, a named
piece with its parsed knobs. `regroup.algo.loss_config.resolve_loss` builds one from a run config, once per run.

The settings are the config's own typed fields, declared and bounded once in `regroup.config.schema`; a `LossSpec`
holds those sections themselves (as resolved), so `spec.grpo.eps_low` is the config's own typed field, with no
field-by-field copy to keep in step:
- `grpo`: the policy loss and its knobs, the clip ε_low / ε_high, β and the KL estimator, `kl_ratio_correction`,
  `loss_agg`, the extra terms, OPSM's δ (`off_policy_mask_threshold`);
- `rollout`: the sampler IS correction (`tis_cap`, `is_mode`, `is_min`);
- `anchors`: how anchor tokens are trained (`ratio`, `gamma`).

One signature per kind of piece; a piece that declares knobs (an `Args`, `regroup.config.registry.takes`) also gets
them as the keyword `args`:
- policy loss `(logps[B, T], old_logps[B, T], advantages[B] or [B, T], mask[B, T], spec) ->
  (per-token loss [B, T], low-clip flags [B, T], high-clip flags [B, T])`; `mask` marks the on-policy loss tokens.
  An attribute `ratio_level = "sequence"` says its ratio is one per response (the KL correction and the ratio
  metric use it); `folds_is_weight = True` says it takes the sampler IS weight as the keyword `is_weight` (VESPO)
  instead of having its loss multiplied by it;
- KL estimator `(logps[B, T], ref_logps[B, T]) -> [B, T]`;
- loss term `(TermInputs) -> [B, T]` or a 0-d tensor (`regroup.algo.loss_terms`);
- advantage estimator `(rewards[B], group_ids[B]) -> advantages[B]` (`regroup.algo.advantages`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from regroup.config.registry import Registry, args_class, parse_args
from regroup.config.schema import AnchorConfig, GRPOConfig, RolloutConfig


class Piece(NamedTuple):
    """A named piece looked up in its registry, with its knobs parsed into its `Args` (None: it has none); call it
    as `piece.fn(*inputs, **piece.kwargs)` (`kwargs` holds `args=` for a piece that declares knobs)."""

    name: str
    fn: Any
    args: Any
    kwargs: dict[str, Any]

    @classmethod
    def named(cls, key: str, registry: Registry, name: str, given: Any, args_key: str = "") -> Piece:
        """The piece `name` of the setting `key`, its knobs parsed from `args_key` (default `key`_args): ConfigError
        naming the key."""
        fn = registry.resolve(key, name)
        knobs = args_class(fn)
        args = parse_args(knobs, given, args_key or f"{key}_args", name)
        return cls(name, fn, args, {"args": args} if knobs is not None else {})


@dataclass(frozen=True)
class LossSpec:
    """The loss of a run: the config sections that set it, and its pieces looked up once (`resolve_loss`)."""

    grpo: GRPOConfig
    rollout: RolloutConfig
    anchors: AnchorConfig
    policy: Piece
    kl: Piece
    terms: tuple[tuple[Piece, float], ...] = ()
    """The extra terms with a non-zero coefficient, each added as coefficient · term."""
    # Facts about the pieces, settled once here (a step reads them in every micro-batch):
    ratio_level: str = field(init=False)
    """ "sequence" when the policy's ratio is one per response (gspo, gmpo, luspo), else "token"."""
    folds_is_weight: bool = field(init=False)
    """The policy takes the sampler IS weight itself (VESPO) instead of being multiplied by it."""
    needs_entropy: bool = field(init=False)
    """A term reads a differentiable entropy (`LossInputs.entropy`)."""
    moves_every_row: bool = field(init=False)
    """A term not multiplied by the advantage (β·KL, an extra term) can move a row whose advantage is 0."""

    def __post_init__(self) -> None:
        facts = {
            "ratio_level": getattr(self.policy.fn, "ratio_level", "token"),
            "folds_is_weight": getattr(self.policy.fn, "folds_is_weight", False),
            "needs_entropy": any(getattr(term.fn, "needs_entropy", False) for term, _ in self.terms),
            "moves_every_row": self.grpo.beta != 0.0 or bool(self.terms),
        }
        for name, value in facts.items():
            object.__setattr__(self, name, value)
