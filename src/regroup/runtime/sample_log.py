"""A few sample completions every K steps, to RUN_DIR/samples.jsonl (and TensorBoard text when on): what
a researcher reads first when the reward will not move (no answer extracted, wrong format, cut off)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from regroup.io import append_text, read_bytes, write_atomic

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
        out.append(
            {
                "step": step,
                "group_id": s.group_id,
                "question_id": s.question_id,
                "variant": s.variant,
                "is_anchor": s.is_anchor,
                "question": (s.question_text or s.problem.question)[:MAX_CHARS],
                "response": s.response_text[:MAX_CHARS],
                "reward": reward,
                "advantage": adv,
                "weight": weight,
                "score": s.score,
                "truncated": s.truncated,
                "answer": getattr(s.problem, "answer", None),
            }
        )
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
        append_text(self.path, "".join(json.dumps(r) + "\n" for r in records))  # never through a link
        if self.tb is not None:
            text = "\n\n".join(f"**reward {r['reward']}, A {r['advantage']}**\n\n    {r['response']}" for r in records)
            self.tb.add_text("samples", text, step)

    def truncate_after(self, step: int) -> None:
        """On resume: keep the records of steps up to the checkpoint's (later ones are logged again, as
        metrics.jsonl's are); a line that is not a record with an integer step (torn by a crash) is dropped."""
        if not self.enabled:
            return
        try:
            data = read_bytes(self.path)
        except FileNotFoundError:
            return
        kept = []
        for raw in data.split(b"\n"):
            try:
                record = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and type(record.get("step")) is int and record["step"] <= step:
                kept.append(raw.decode("utf-8") + "\n")
        write_atomic(self.path, "".join(kept))

    def close(self) -> None:
        pass
