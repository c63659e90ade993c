"""Pure algorithm pieces: tensors in, tensors out (SPEC §1–§3). No I/O or models here.

Importing the package registers every built-in loss piece and advantage estimator (`regroup.config.registry`:
POLICY_LOSSES, KL_ESTIMATORS, LOSS_TERMS, ADV_ESTIMATORS), each in its own module with its knobs.
`loss_config.resolve_loss` looks a run's pieces up once (`loss_spec.LossSpec`); `losses.policy_loss` is the loss's
core, and each modifier (OPSM, the sampler IS weight, anchors, KL, extra terms) lives in a module of its own.
May import `regroup.config` (the registries and the config's section types) and `regroup.errors` only.
"""

from regroup.algo import (  # noqa: F401  (importing each module registers its loss piece)
    cispo,
    entropy,
    gmpo,
    gspo,
    kl,
    luspo,
    ppo_clip,
    sapo,
    vespo,
)
from regroup.algo.advantages import group_advantages, group_reward_stats
from regroup.algo.anchors import plain_anchor_pg_loss, shaped_objective, shaped_pg_loss
from regroup.algo.distinctiveness import distinctiveness_mask, mask_stats
from regroup.algo.kl import kl_k3
from regroup.algo.loss_inputs import build_loss_inputs, sampler_is_weight, truncated_is_weight
from regroup.algo.loss_spec import LossSpec
from regroup.algo.losses import AGG_MODES, TRL_LOSS_TYPES, aggregate, policy_loss
from regroup.algo.ppo_clip import clipped_pg_loss
from regroup.algo.ratios import clip_ratio, importance_ratio, log_ratio

__all__ = [
    "AGG_MODES",
    "LossSpec",
    "TRL_LOSS_TYPES",
    "aggregate",
    "build_loss_inputs",
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
    "sampler_is_weight",
    "shaped_objective",
    "shaped_pg_loss",
    "truncated_is_weight",
]
