"""Step metrics to RUN_DIR/metrics.jsonl (always), TensorBoard and W&B (when asked)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from regroup.config import write_atomic


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing value is written as null
    return value


class MetricsLogger:
    def __init__(self, run_dir, tensorboard: bool = False, wandb: bool = False, config: dict | None = None, enabled: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self._tb = self._wandb = None
        if not enabled:
            return
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))
        if wandb:
            import wandb as _wandb

            self._wandb = _wandb.init(project=os.environ.get("WANDB_PROJECT", "regroup"), config=config, dir=str(run_dir))

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they will be logged again)."""
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a crash
        write_atomic(self.path, "".join(k + "\n" for k in kept))

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(run_dir) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
