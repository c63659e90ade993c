"""DaGRPO sequence-level gradient rectification as a step stage (SPEC §2a): score every sample of the
group (anchors included: the mask is computed over G_mix), then keep only samples that stand apart from
the other side of their group (`unit="sample"`), or drop only the pairwise advantage terms of pairs that
do not stand apart (`unit="pair"`, `algo.distinctiveness.pair_masked_advantages`). The verifiable reward
stays the reward; scores only mask."""

from __future__ import annotations

import math

import torch

from regroup.algo.distinctiveness import distinctiveness_mask, mask_stats, pair_masked_advantages
from regroup.batch import Sample
from regroup.config.registry import STAGES
from regroup.errors import ConfigError
from regroup.scorers.base import ScoreItem, check_score
from regroup.stages.base import StepBatch, StepContext


class ScorerOutputError(ConfigError):
    """A scorer returned something other than one score in [1, 10] (or None) per item: one line, exit 2."""


def checked_scores(scorer, items: list[ScoreItem]) -> list[float | None]:
    """`scorer.score_batch(items)`, refused unless it is one score in [1, 10] or None per item."""
    name = getattr(scorer, "name", None) or type(scorer).__name__
    scores = scorer.score_batch(items)
    try:
        scores = list(scores)
    except TypeError:
        raise ScorerOutputError(f"scorer {name!r} returned {type(scores).__name__}, not a list of scores") from None
    if len(scores) != len(items):
        raise ScorerOutputError(
            f"scorer {name!r} returned {len(scores)} scores for {len(items)} responses "
            "(score_batch must return one score in [1, 10] or None per item)"
        )
    try:
        return [check_score(v, where=f"scorer {name!r}") for v in scores]
    except ValueError as e:
        raise ScorerOutputError(str(e)) from None


def emptied_groups(advantaged: torch.Tensor, keep: torch.Tensor, group_ids: torch.Tensor) -> int:
    """Groups with at least one nonzero-advantage sample [B] whose every such sample the mask dropped."""
    with_signal = set(group_ids[advantaged].tolist())
    still = set(group_ids[advantaged & keep].tolist())
    return len(with_signal - still)


class DistinctivenessMasker:
    """`question="own"` shows the scorer the question a rephrased response answered; "original" shows q0.
    `unit="sample"` masks whole samples (a keep weight); "pair" rewrites the advantages term by term."""

    name = "mask"

    def __init__(self, scorer, delta: float, question: str = "own", unit: str = "sample"):
        if question not in ("own", "original"):
            raise ValueError(f"question must be 'own' or 'original', got {question!r}")
        if unit not in ("sample", "pair"):
            raise ValueError(f"unit must be 'sample' or 'pair', got {unit!r}")
        self.scorer = scorer
        self.delta = delta
        self.question = question
        self.unit = unit

    def score(self, samples: list[Sample]) -> None:
        """Fill `sample.score` (None when the scorer could not score it: never masked, counted)."""
        items = [
            ScoreItem(
                question=(s.question_text if self.question == "own" and s.question_text else s.problem.question),
                response=s.response_text,
                reference=getattr(s.problem, "solution", None),
                problem=s.problem,
            )
            for s in samples
        ]
        for s, score in zip(samples, checked_scores(self.scorer, items)):
            s.score = score

    def mask_from_scores(self, advantages: torch.Tensor, scores: torch.Tensor, group_ids: torch.Tensor):
        """(keep mask [B] bool, metrics) from scores [B] (NaN = unscored). Advantages were computed over the
        full group before masking. The TRL adapter scores on each process and calls this on the gathered batch.

        `mask/frac` counts masked samples among all B (uniform groups, advantage 0, count as kept);
        `mask/advantaged_frac` among the samples with a nonzero advantage (1.0: the mask left no gradient);
        `mask/emptied_groups` the groups with an advantage that the mask left without one (dynamic sampling
        chose its groups before the mask, and does not replace them: see docs/metrics.md)."""
        keep = distinctiveness_mask(advantages, scores, group_ids, self.delta)  # [B] bool
        stats = mask_stats(advantages, keep)
        advantaged = advantages != 0  # [B] NaN compares unequal: never produced by group_advantages
        n_adv = int(advantaged.sum())
        metrics = {
            "mask/pos_frac": stats["frac_pos_masked"],  # masked positives / positives
            "mask/neg_frac": stats["frac_neg_masked"],  # masked negatives / negatives
            "mask/frac": stats["frac_masked"],
            "mask/advantaged_frac": float((advantaged & ~keep).sum()) / n_adv if n_adv else 0.0,
            "mask/emptied_groups": float(emptied_groups(advantaged, keep, group_ids)),
        }
        unscored = torch.isnan(scores)
        metrics["mask/unscored"] = float(unscored.sum())
        metrics["mask/unscored_frac"] = float(unscored.sum()) / max(scores.numel(), 1)
        finite = scores[~unscored]
        if finite.numel():
            metrics["score/mean"] = float(finite.mean())
        for key, value in (getattr(self.scorer, "stats", None) or {}).items():  # a plain scorer may keep none
            metrics[f"scorer/{key}"] = float(value)
        return keep, metrics

    def mask(self, samples: list[Sample], advantages: torch.Tensor, group_ids: torch.Tensor):
        """Score `samples`, then (keep mask [B] bool, metrics)."""
        self.score(samples)
        scores = torch.tensor([math.nan if s.score is None else float(s.score) for s in samples])  # [B]
        return self.mask_from_scores(advantages, scores, group_ids)

    def pair_mask(self, samples: list[Sample], advantages: torch.Tensor, group_ids: torch.Tensor):
        """Score `samples`, then (pair-masked advantages [B], metrics)."""
        self.score(samples)
        scores = torch.tensor([math.nan if s.score is None else float(s.score) for s in samples])  # [B]
        masked, stats = pair_masked_advantages(advantages, scores, group_ids, self.delta)  # [B]
        metrics = {
            "mask/pair_frac": stats["frac_pairs_masked"],
            "mask/adv_removed": stats["adv_l1_removed"],
            "mask/unscored": float(torch.isnan(scores).sum()),
        }
        finite = scores[~torch.isnan(scores)]
        if finite.numel():
            metrics["score/mean"] = float(finite.mean())
        for key, value in self.scorer.stats.items():
            metrics[f"scorer/{key}"] = float(value)
        return masked, metrics

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        advantages = batch.advantages  # [B]
        if advantages is None:
            raise RuntimeError("DistinctivenessMasker runs after the advantages stage (SPEC §2a)")
        group_ids = torch.tensor([s.group_id for s in batch.samples], dtype=torch.long)  # [B]
        if self.unit == "pair":
            batch.advantages, metrics = self.pair_mask(batch.samples, advantages, group_ids)
            return metrics
        keep, metrics = self.mask(batch.samples, advantages, group_ids)
        batch.multiply_weights(keep)
        return metrics


STAGES.register(DistinctivenessMasker.name, DistinctivenessMasker)
