"""Step metrics to RUN_DIR/metrics.jsonl (always, the source of the report), and to any experiment tracker
accelerate supports (`train.report_to`: tensorboard, wandb, trackio, mlflow, ...) through its tracker API.

metrics.jsonl is the record the report is built from, so it is guarded:
- a line that is not a JSON object with an integer `step` (a torn last line after a crash, a bad byte, a
  hand edit such as `"step": "4"`) is reported once, naming the file and line, and skipped by readers;
  on resume the file is rewritten keeping only the valid lines up to the checkpoint's step;
- the logger keeps every line it holds for this run; when the file vanishes, is replaced or shrinks
  under it mid-run, it warns and writes the whole history back instead of silently starting over.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from regroup.config.schema import TrainConfig
from regroup.io import append_text, read_bytes, write_atomic


class MetricsFileWarning(UserWarning):
    """A problem with a metrics.jsonl that was handled (a line skipped, the file rewritten)."""


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a missing value is written as null
    return value


def parse_metrics_line(raw: bytes) -> dict | str | None:
    """The step record of one metrics.jsonl line; a reason (str) when it is not one; None for a blank line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 at byte {e.start}"
    if not text.strip():
        return None
    try:
        record = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return "not valid JSON (a torn or edited line)"
    if not isinstance(record, dict):
        return f"not a JSON object but a {type(record).__name__}"
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"'step' is not a non-negative integer: {step!r}"
    return record


def read_metrics_file(path: str | os.PathLike) -> tuple[list[dict], list[tuple[int, str]]]:
    """(step records in file order, (line number, reason) of every line skipped); an absent file is empty."""
    try:
        data = read_bytes(path)  # never through a link
    except FileNotFoundError:
        return [], []
    records, bad = [], []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        parsed = parse_metrics_line(raw)
        if isinstance(parsed, dict):
            records.append(parsed)
        elif parsed is not None:
            bad.append((number, parsed))
    return records, bad


def warn_bad_lines(path, bad: list[tuple[int, str]], action: str = "skipped", warn=None) -> None:
    """One warning per bad line, naming the file and the line."""
    warn = warn or (lambda message: warnings.warn(message, MetricsFileWarning, stacklevel=3))
    for number, reason in bad:
        warn(f"{path} line {number}: {reason}; {action}")


def tracker_names(train_cfg: TrainConfig) -> list[str]:
    """`train.report_to` without repeats."""
    return list(dict.fromkeys(train_cfg.report_to))


def flat_config(config: dict, prefix: str = "") -> dict:
    """A nested config as dotted keys with scalar values (what every tracker's hparams accept)."""
    out = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out


class MetricsLogger:
    """`accelerator` (with `log_with` set when it was built) receives every step's numeric metrics."""

    def __init__(
        self,
        run_dir,
        config: dict | None = None,
        enabled: bool = True,
        warn=None,
        accelerator=None,
        trackers: Sequence[str] = (),
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.warn = warn
        self._lines: list[str] | None = None
        """Every line the file should hold (None until first read or written)."""
        self._identity: tuple[int, int, int] | None = None
        """(device, inode, size) of the file after this logger's last write."""
        self.accelerator = accelerator if trackers else None
        if self.accelerator is not None:
            # every process calls it; accelerate starts the trackers on the main process only
            self.accelerator.init_trackers(os.environ.get("WANDB_PROJECT", "regroup"), config=flat_config(config or {}))

    def tensorboard_writer(self):
        """The TensorBoard SummaryWriter when `tensorboard` is among the trackers (for sample text), else None."""
        if self.accelerator is None or not self.enabled:
            return None
        try:
            return self.accelerator.get_tracker("tensorboard", unwrap=True)
        except (ValueError, KeyError):
            return None

    def _warn(self, message: str) -> None:
        if self.warn is not None:
            self.warn(message)
        else:
            warnings.warn(message, MetricsFileWarning, stacklevel=3)

    def _rewrite(self) -> None:
        write_atomic(self.path, "".join(line + "\n" for line in self._lines or []))
        st = os.lstat(self.path)
        self._identity = (st.st_dev, st.st_ino, st.st_size)

    def _read(self) -> list[dict]:
        records, bad = read_metrics_file(self.path)
        warn_bad_lines(self.path, bad, "dropped", warn=self._warn)
        return records

    def truncate_after(self, step: int) -> None:
        """On resume: keep the valid lines of steps up to the checkpoint's (the later ones will be logged
        again); lines that are not a step record are reported and dropped: the file is repaired."""
        if not self.enabled or not os.path.lexists(self.path):
            return
        self._lines = [json.dumps(r) for r in self._read() if r["step"] <= step]
        self._rewrite()

    def _check_file(self) -> None:
        """Notice a metrics.jsonl that vanished, was replaced or shrank since the last write; restore it."""
        if self._lines is None:  # first write of this logger: adopt what is there
            self._lines = [json.dumps(r) for r in self._read()] if os.path.lexists(self.path) else []
            if os.path.lexists(self.path):
                st = os.lstat(self.path)
                self._identity = (st.st_dev, st.st_ino, st.st_size)
            return
        try:
            st = os.lstat(self.path)
            now = (st.st_dev, st.st_ino, st.st_size)
        except FileNotFoundError:
            now = None
        if now == self._identity:
            return
        moved = self._identity is None or now is not None and now[:2] != self._identity[:2]
        what = "vanished" if now is None else ("was replaced" if moved else "changed size")
        self._warn(f"{self.path} {what} during the run; writing back the {len(self._lines or [])} steps logged so far")
        self._rewrite()

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        line = json.dumps(record)
        self._check_file()
        st = append_text(self.path, line + "\n")  # never through a link; a failure names the file
        if self._lines is None:  # not so: _check_file has adopted the file's lines
            self._lines = []
        self._lines.append(line)
        self._identity = (st.st_dev, st.st_ino, st.st_size)
        if self.accelerator is not None:
            numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
            self.accelerator.log(numeric, step=step)

    def close(self) -> None:
        if self.accelerator is not None:
            self.accelerator.end_training()


def read_metrics(run_dir) -> list[dict]:
    """The valid step records of RUN_DIR/metrics.jsonl (bad lines are skipped with a warning each)."""
    path = Path(run_dir) / "metrics.jsonl"
    records, bad = read_metrics_file(path)
    warn_bad_lines(path, bad)
    return records
