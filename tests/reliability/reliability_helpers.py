"""Helpers for the training-run reliability tests: a reward that sometimes cannot score, a phase probe
that records where a `regroup train` process is (so a SIGKILL's landing spot is known), and process
utilities (start a training subprocess, kill it when a trigger fires, read what it logged).

Run as a script it is `regroup train` with the probe attached:

    python tests/reliability/reliability_helpers.py PHASE_FILE train --resume RUN_DIR

Each phase change is one `os.write` of a line `<unix time> <pid> <phase> [<step>]` to PHASE_FILE
(O_APPEND, no Python buffering), so the last line in the file is where the process was when it died.
The probe only observes: it wraps methods and calls them unchanged.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------------------- rewards


def flaky_reward(response: str, problem) -> float | None:
    """A reward that cannot always score: by a hash of the response, 1/6 NaN, 1/6 None, 1/6 +inf,
    1/6 1.0 and 2/6 0.0 (deterministic, so reruns and resumes see the same values)."""
    bucket = int(hashlib.sha256(response.encode("utf-8", "surrogatepass")).hexdigest(), 16) % 6
    return (math.nan, None, math.inf, 1.0, 0.0, 0.0)[bucket]


def is_unscorable(value) -> bool:
    """True for the values a reward may return when it could not score: None, NaN, ±inf."""
    return value is None or not math.isfinite(value)


# ------------------------------------------------------------------------------------ phase probe


def install_probe(phase_file: str | os.PathLike) -> Callable[[str], None]:
    """Wrap the trainer's stages so each writes its phase to `phase_file` before (and some after) running."""
    fd = os.open(os.fspath(phase_file), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pid = os.getpid()

    def mark(phase: str) -> None:
        os.write(fd, f"{time.time():.6f} {pid} {phase}\n".encode())

    mark("imports")
    import regroup.metrics as metrics_mod
    import regroup.trainer as trainer_mod

    T = trainer_mod.Trainer
    init, collect, update, resume, save = T.__init__, T.collect, T.update, T._resume, trainer_mod.save_checkpoint
    log = metrics_mod.MetricsLogger.log

    def p_init(self, *a, **k):
        mark("build")
        init(self, *a, **k)
        mark(f"built {self.step}")

    def p_collect(self, step):
        mark(f"rollout {step + 1}")
        return collect(self, step)

    def p_update(self, samples):
        mark(f"update {self.step + 1}")
        out = update(self, samples)
        mark(f"post-update {self.step + 1}")  # weight sync to the sampler, timing
        return out

    def p_resume(self):
        mark("resume")
        resume(self)
        mark(f"resumed {self.step}")

    def p_save(run_dir, step, *a, **k):
        mark(f"checkpoint {step}")
        out = save(run_dir, step, *a, **k)
        mark(f"between-steps {step}")
        return out

    def p_log(self, step, m):
        mark(f"log {step}")
        return log(self, step, m)

    T.__init__, T.collect, T.update, T._resume = p_init, p_collect, p_update, p_resume
    trainer_mod.save_checkpoint = p_save
    metrics_mod.MetricsLogger.log = p_log
    return mark


def read_phases(phase_file: str | os.PathLike) -> list[tuple[float, int, str]]:
    """(time, pid, phase) of every complete line of a phase file."""
    path = Path(phase_file)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            out.append((float(parts[0]), int(parts[1]), parts[2]))
    return out


def landing(phase: str | None) -> str:
    """The phase name without its step ('update 3' -> 'update'); 'startup' before the probe ran."""
    return "startup" if phase is None else phase.split(" ")[0]


# -------------------------------------------------------------------------------------- processes


def train_args(model_dir, run_dir, recipe: str = "grpo.yaml", *extra: str) -> list[str]:
    """`train --config ... key=value` for a small, single-threaded (so bit-reproducible) run."""
    return [
        "train", "--config", str(CONFIGS / recipe), f"model.path={model_dir}", f"run_dir={run_dir}",
        "data.num_train=64", "grpo.prompts_per_step=4", "grpo.num_generations=4", "rollout.max_new_tokens=16",
        "train.steps=6", "train.checkpoint_every=1", "train.progress=false", "train.threads=1",
        "diagnostics.diversity_every=0", "diagnostics.grad_conflict_every=0", "optim.warmup_steps=1",
        "optim.lr=1e-3", *extra,
    ]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a training subprocess: quiet, one thread, this folder importable."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": os.pathsep.join(p for p in [str(HERE), env.get("PYTHONPATH", "")] if p),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"})
    env.update(extra or {})
    return env


@dataclass
class Proc:
    """A finished (or killed) training subprocess and what it left."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    killed: bool = False
    landed: str | None = None
    """Last phase the probe recorded before the kill (None: not killed, or before any probe line)."""
    tmp_at_kill: list[str] = field(default_factory=list)
    """`.tmp-step-*` folders present right after the kill."""
    seconds: float = 0.0


def start(argv: list[str], out_dir: Path, name: str, probe: Path | None = None, env: dict | None = None):
    """Start `python -m regroup ARGV` (or the probed runner) with stdout/stderr to files in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = ([sys.executable, str(HERE / "reliability_helpers.py"), str(probe)] if probe else [sys.executable, "-m", "regroup"])
    stdout = open(out_dir / f"{name}.out", "w")
    stderr = open(out_dir / f"{name}.err", "w")
    proc = subprocess.Popen(cmd + argv, stdout=stdout, stderr=stderr, env=env or child_env(), cwd=REPO)
    proc._files = (stdout, stderr, out_dir / f"{name}.out", out_dir / f"{name}.err")  # type: ignore[attr-defined]
    proc._t0 = time.monotonic()  # type: ignore[attr-defined]
    return proc


def finish(proc, argv: list[str], timeout: float = 300.0, killed: bool = False, landed=None, tmp=None) -> Proc:
    """Wait for `proc` and collect its outputs."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    for f in proc._files[:2]:
        f.close()
    return Proc(argv, rc, proc._files[2].read_text(), proc._files[3].read_text(), killed, landed, tmp or [],
                time.monotonic() - proc._t0)


def run(argv: list[str], out_dir: Path, name: str, env: dict | None = None, timeout: float = 300.0) -> Proc:
    """Run `python -m regroup ARGV` to the end."""
    return finish(start(argv, out_dir, name, env=env), argv, timeout)


def tmp_folders(run_dir: Path) -> list[str]:
    root = Path(run_dir) / "checkpoints"
    try:
        return sorted(p.name for p in os.scandir(root) if p.name.startswith(".tmp-"))
    except FileNotFoundError:
        return []


def run_and_kill(argv: list[str], out_dir: Path, name: str, run_dir: Path, probe: Path,
                 trigger: Callable[[list[tuple[float, int, str]], list[str], float], bool],
                 delay_s: float = 0.0, timeout: float = 300.0) -> Proc:
    """Start the probed runner and SIGKILL it `delay_s` after `trigger(phases, tmp_folders, elapsed)` first
    holds (polled every millisecond); if it ends first, it is simply collected."""
    before = len(read_phases(probe))
    proc = start(argv, out_dir, name, probe=probe)
    t0 = time.monotonic()
    while proc.poll() is None:
        elapsed = time.monotonic() - t0
        if trigger(read_phases(probe)[before:], tmp_folders(run_dir), elapsed):
            if delay_s:
                time.sleep(delay_s)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            phases = read_phases(probe)[before:]
            return finish(proc, argv, killed=True, landed=phases[-1][2] if phases else None,
                          tmp=tmp_folders(run_dir))
        if elapsed > timeout:
            break
        time.sleep(0.001)
    return finish(proc, argv, timeout)


RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")


def resumed_at(stderr: str) -> tuple[str, int] | None:
    """(checkpoint path, step) of the process's 'resumed from ... at step k' line, if any."""
    m = RESUMED.search(stderr)
    return (m.group(1), int(m.group(2))) if m else None


def main(argv: list[str]) -> int:
    install_probe(argv[0])
    from regroup.cli import main as cli_main

    return cli_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
