"""Pure algorithm pieces: tensors in, tensors out (SPEC §1–§3). No I/O, models, or config here.

Importing the package registers every built-in loss piece (`regroup.registry`: POLICY_LOSSES,
KL_ESTIMATORS, LOSS_TERMS), each where it is defined; `losses.policy_loss` looks them up by name.
"""

from regroup.algo import cispo, entropy, gmpo, kl, sapo  # noqa: F401  (register the built-in loss pieces)
from regroup.algo.advantages import group_advantages, group_reward_stats
from regroup.algo.anchors import plain_anchor_pg_loss, shaped_objective, shaped_pg_loss
from regroup.algo.distinctiveness import distinctiveness_mask, mask_stats
from regroup.algo.kl import kl_k3
from regroup.algo.losses import (
    AGG_MODES,
    TRL_LOSS_TYPES,
    aggregate,
    clipped_pg_loss,
    policy_loss,
)
from regroup.algo.ratios import clip_ratio, importance_ratio, log_ratio, truncated_is_weight

__all__ = [
    "AGG_MODES",
    "TRL_LOSS_TYPES",
    "aggregate",
    "clip_ratio",
    "clipped_pg_loss",
    "distinctiveness_mask",
    "group_advantages",
    "group_reward_stats",
    "importance_ratio",
    "kl_k3",
    "log_ratio",
    "mask_stats",
    "plain_anchor_pg_loss",
    "policy_loss",
    "shaped_objective",
    "shaped_pg_loss",
    "truncated_is_weight",
]
