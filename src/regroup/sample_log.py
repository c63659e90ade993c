"""A few sample completions every K steps, to RUN_DIR/samples.jsonl (and TensorBoard text when on): what
a researcher reads first when the reward will not move (no answer extracted, wrong format, cut off)."""

from __future__ import annotations

import json
import math
from pathlib import Path

PER_STEP = 4
MAX_CHARS = 2000


def sample_records(step: int, batch, limit: int = PER_STEP) -> list[dict]:
    """One record per sample of the first groups (the first `limit` samples, then the first anchor)."""
    chosen = list(batch.samples[:limit])
    chosen += [s for s in batch.samples[limit:] if s.is_anchor][:1]
    index = {id(s): i for i, s in enumerate(batch.samples)}
    out = []
    for s in chosen:
        i = index[id(s)]
        adv = None if batch.advantages is None else float(batch.advantages[i])
        weight = None if batch.weights is None else float(batch.weights[i])
        reward = s.reward if s.reward is None or math.isfinite(s.reward) else None
        out.append({
            "step": step, "group_id": s.group_id, "question_id": s.question_id, "variant": s.variant,
            "is_anchor": s.is_anchor, "question": (s.question_text or s.problem.question)[:MAX_CHARS],
            "response": s.response_text[:MAX_CHARS], "reward": reward, "advantage": adv, "weight": weight,
            "score": s.score, "truncated": s.truncated, "answer": getattr(s.problem, "answer", None),
        })
    return out


class SampleLog:
    def __init__(self, run_dir, every: int, enabled: bool = True, tb_writer=None):
        self.path = Path(run_dir) / "samples.jsonl"
        self.every = every
        self.enabled = enabled and every > 0
        self.tb = tb_writer

    def maybe_log(self, step: int, batch) -> None:
        if not self.enabled or (step != 1 and step % self.every):
            return
        records = sample_records(step, batch)
        with open(self.path, "a") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
        if self.tb is not None:
            text = "\n\n".join(f"**reward {r['reward']}, A {r['advantage']}**\n\n    {r['response']}" for r in records)
            self.tb.add_text("samples", text, step)

    def close(self) -> None:
        pass
