"""Helpers for the training-run reliability tests: a reward that sometimes cannot score (and a module of
hostile ones, `HOSTILE_REWARDS`), a phase probe that records where a `regroup train` process is (so a
SIGKILL's landing spot is known), and process utilities (start a training subprocess, kill it when a
trigger fires, read what it logged).

Run as a script it is `regroup train` with the probe attached:

    python tests/reliability/reliability_helpers.py PHASE_FILE train --resume RUN_DIR

Each phase change is one `os.write` of a line `<unix time> <pid> <phase> [<step>]` to PHASE_FILE
(O_APPEND, no Python buffering), so the last line in the file is where the process was when it died.
The probe only observes: it wraps methods and calls them unchanged. With REGROUP_PROBE_STOP_AT="<phase>"
in its environment the process freezes itself (SIGSTOP) on entering that phase, for an exact kill.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # tests/fake_openai.py

# ---------------------------------------------------------------------------------------- rewards


def flaky_reward(response: str, problem) -> float | None:
    """A reward that cannot always score: by a hash of the response, 1/6 NaN, 1/6 None, 1/6 +inf,
    1/6 1.0 and 2/6 0.0 (deterministic, so reruns and resumes see the same values)."""
    bucket = int(hashlib.sha256(response.encode("utf-8", "surrogatepass")).hexdigest(), 16) % 6
    return (math.nan, None, math.inf, 1.0, 0.0, 0.0)[bucket]


def coin_reward(response: str, problem) -> float:
    """1.0 or 0.0 by a hash of the response: a learning signal even from an untrained model."""
    return float(int(hashlib.sha256(response.encode("utf-8", "surrogatepass")).hexdigest(), 16) % 2)


def is_unscorable(value) -> bool:
    """True for the values a reward may return when it could not score: None, NaN, ±inf."""
    return value is None or not math.isfinite(value)


HOSTILE_REWARDS = '''
"""User rewards that misbehave, written by the reliability tests' `reward_dir` fixture and named as
hostile_rewards:NAME."""
import functools, os, subprocess, sys, time
from pathlib import Path


def length(response, problem):
    return float(len(response))


def where_regroup(response, problem):
    import regroup
    Path(problem.meta["out"]).write_text(regroup.__file__)
    return 1.0


def _slow(response, problem, seconds=4.0):
    time.sleep(seconds)  # past a 1 s deadline
    return 1.0


slow_partial = functools.partial(_slow, seconds=4.0)


@functools.lru_cache(maxsize=None)
def slow_cached(response, problem):
    return _slow(response, problem)


class SlowObject:
    def __call__(self, response, problem):
        return _slow(response, problem)


slow_object = SlowObject()


def spawns_then_hangs(response, problem):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    Path(problem.meta["out"]).write_text(str(child.pid))
    while True:
        time.sleep(60)


def allocates(response, problem):
    block = bytearray(int(problem.meta["mb"]) << 20)
    return float(len(block) > 0)


def together(response, problem):
    """1.0 when all `n` calls of the batch ran at the same time (each waits, up to 10 s, for the others)."""
    folder = Path(problem.meta["dir"])
    (folder / f"{os.getpid()}-{response}").write_text("")
    for _ in range(200):
        if len(list(folder.iterdir())) >= problem.meta["n"]:
            return 1.0
        time.sleep(0.05)
    return 0.0


def huge(response, problem):
    return 10**400


def hangs(response, problem):
    while True:
        time.sleep(60)


def hangs_on_x(response, problem):
    if "x" in response:
        hangs(response, problem)
    return 1.0
'''
"""A module of hostile user rewards (sleeping past the deadline as a partial, an lru_cache function and a callable
object; starting a child then hanging; allocating; waiting for each other; returning 10**400; hanging), imported as
`hostile_rewards` from the folder of the `reward_dir` fixture (tests/reliability/conftest.py)."""


def problem(**meta):
    """A one-question problem carrying `meta`, which the hostile rewards read."""
    from regroup.tasks.base import Problem

    return Problem(id="q", question="?", answer="1", meta=meta)


# ------------------------------------------------------------------------------------ phase probe

STOP_ENV = "REGROUP_PROBE_STOP_AT"


def install_probe(phase_file: str | os.PathLike) -> Callable[[str], None]:
    """Wrap the trainer's stages so each writes its phase to `phase_file` before (and some after) running."""
    fd = os.open(os.fspath(phase_file), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    pid = os.getpid()
    stop_at = os.environ.get(STOP_ENV)

    def mark(phase: str) -> None:
        os.write(fd, f"{time.time():.6f} {pid} {phase}\n".encode())
        if phase == stop_at:  # freeze here, so the parent's SIGKILL lands exactly at this phase
            os.kill(pid, signal.SIGSTOP)

    mark("imports")
    import regroup.runtime.checkpoint as checkpoint_mod
    import regroup.runtime.metrics as metrics_mod
    import regroup.train.trainer as trainer_mod

    fsync_tree = checkpoint_mod._fsync_tree

    def p_fsync_tree(folder):  # the temporary folder is complete, not yet renamed to its final name
        mark(f"checkpoint-fsync {int(Path(folder).name.split('-')[2])}")
        return fsync_tree(folder)

    checkpoint_mod._fsync_tree = p_fsync_tree

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
        out = resume(self)  # the line saying where the run goes on from, logged by __init__
        mark(f"resumed {self.step}")
        return out

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


def small_overrides(model_dir, run_dir, *extra: str) -> list[str]:
    """Overrides for a small, single-threaded (so bit-reproducible) run of 6 steps, a checkpoint each step."""
    return [
        f"model.path={model_dir}",
        f"run_dir={run_dir}",
        "data.num_train=64",
        "grpo.prompts_per_step=4",
        "grpo.num_generations=4",
        "rollout.max_new_tokens=16",
        "train.steps=6",
        "train.checkpoint_every=1",
        "train.progress=false",
        "train.threads=1",
        "diagnostics.diversity_every=0",
        "diagnostics.grad_conflict_every=0",
        "optim.warmup_steps=1",
        "optim.lr=1e-3",
        *extra,
    ]


def train_args(model_dir, run_dir, recipe: str = "grpo.yaml", *extra: str) -> list[str]:
    """`train --config configs/RECIPE key=value ...` of `small_overrides`."""
    return ["train", "--config", str(CONFIGS / recipe), *small_overrides(model_dir, run_dir, *extra)]


# ------------------------------------------------------------------------------ fake remote services


def _between(text: str, tag: str) -> str:
    m = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.DOTALL)
    return m.group(1) if m else ""


class FlakyJudge:
    """Responder for `FakeOpenAI`: a judge whose replies end `SCORE: k` (9 for a response that is the
    reference solution itself, else a hash of the response, 1-10), except that a seeded fraction
    `p_fault` of requests misbehave, taking the kinds of `faults` (kind name -> action) in turn, so any
    run with as many faults as kinds has met each kind (a random kind could miss one). Counts what it did."""

    def __init__(self, faults: dict, p_fault: float = 0.5, seed: int = 0):
        self.faults = faults
        self.p_fault = p_fault
        self._rng = random.Random(seed)
        self._turn = 0
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    @staticmethod
    def score_of(response: str, reference: str) -> int:
        if response == reference:
            return 9
        return int(hashlib.sha256(response.encode()).hexdigest(), 16) % 10 + 1

    def __call__(self, body: dict):
        from fake_openai import Answer, last_user_message

        with self._lock:
            kind = "answer"
            if self._rng.random() < self.p_fault:
                kinds = sorted(self.faults)
                kind, self._turn = kinds[self._turn % len(kinds)], self._turn + 1
            self.counts[kind] += 1
        if kind != "answer":
            return self.faults[kind]
        user = last_user_message(body)
        score = self.score_of(_between(user, "response"), _between(user, "reference_solution"))
        return Answer(f"The final answer and the steps were checked.\nSCORE: {score}")


def judge_faults(timeout_s: float, echo: str | None = None) -> dict:
    """One of each fault the judge client must survive (and, with `echo`, errors quoting a secret)."""
    from fake_openai import Answer, Drop, Malformed, Partial, RateLimit, Slow, Status

    faults = {
        "http_500": Status(500),
        "http_503": Status(503),
        "http_429": RateLimit(0.05),
        "timeout": Slow(timeout_s + 0.3, Answer("SCORE: 1")),
        "malformed": Malformed(),
        "partial": Partial(),
        "drop": Drop(),
        "garbage": Answer("I would rather not give a score."),
    }
    if echo:
        faults["echo_500"] = Status(500, message=f"invalid request (Authorization: Bearer {echo})")
        faults["echo_malformed"] = Malformed(body=f"<html>Bearer {echo}".encode())
    return faults


def rewriter_reply(body: dict):
    """Responder for `FakeOpenAI`: a valid rewrite (the problem behind a style-specific lead-in, no digits
    added) of the problem in a rewriter request."""
    from fake_openai import Answer, last_user_message

    user = last_user_message(body)
    style = user.split("\n", 1)[0].removeprefix("Transformation:").split()[:3]
    return Answer(f"<rewrite>In other words ({' '.join(style)}): {_between(user, 'problem')}</rewrite>")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a training subprocess: quiet, one thread, this folder importable."""
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(p for p in [str(HERE), env.get("PYTHONPATH", "")] if p),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_VERBOSITY": "error",
            "TQDM_DISABLE": "1",
        }
    )
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
    """This process's `.tmp-step-*` / `.trash-*` folders on disk right after the kill."""
    seconds: float = 0.0


def start(argv: list[str], out_dir: Path, name: str, probe: Path | None = None, env: dict | None = None):
    """Start `python -m regroup ARGV` (or the probed runner) with stdout/stderr to files in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if probe:
        cmd = [sys.executable, str(HERE / "reliability_helpers.py"), str(probe)]
    else:
        cmd = [sys.executable, "-m", "regroup"]
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
    return Proc(
        argv,
        rc,
        proc._files[2].read_text(),
        proc._files[3].read_text(),
        killed,
        landed,
        tmp or [],
        time.monotonic() - proc._t0,
    )


def run(argv: list[str], out_dir: Path, name: str, env: dict | None = None, timeout: float = 300.0) -> Proc:
    """Run `python -m regroup ARGV` to the end."""
    return finish(start(argv, out_dir, name, env=env), argv, timeout)


def tmp_folders(run_dir: Path) -> list[str]:
    """Names of the `.tmp-*` / `.trash-*` folders now in RUN_DIR/checkpoints."""
    root = Path(run_dir) / "checkpoints"
    try:
        return sorted(p.name for p in os.scandir(root) if p.name.startswith((".tmp-", ".trash-")))
    except FileNotFoundError:
        return []


def run_and_kill(
    argv: list[str],
    out_dir: Path,
    name: str,
    run_dir: Path,
    probe: Path,
    trigger: Callable[[list[tuple[float, int, str]], list[str], float], bool],
    delay_s: float = 0.0,
    timeout: float = 300.0,
    stop_at: str | None = None,
) -> Proc:
    """Start the probed runner and SIGKILL it `delay_s` after `trigger(phases, tmp_folders, elapsed)` first
    holds (polled every millisecond); if it ends first, it is simply collected. `phases` and `tmp_folders`
    are this process's own (a killed predecessor's temporary folder stays until the next save). With
    `stop_at` the child freezes itself (SIGSTOP) on entering that phase, so a trigger on it kills it there."""
    proc = start(argv, out_dir, name, probe=probe, env=child_env({STOP_ENV: stop_at} if stop_at else None))
    suffix = f"-{proc.pid}"

    def own_phases():
        return [p for p in read_phases(probe) if p[1] == proc.pid]

    def own_tmp():
        return [t for t in tmp_folders(run_dir) if t.endswith(suffix)]

    t0 = time.monotonic()
    while proc.poll() is None:
        elapsed = time.monotonic() - t0
        if trigger(own_phases(), own_tmp(), elapsed):
            if delay_s:
                time.sleep(delay_s)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            phases = own_phases()
            return finish(proc, argv, killed=True, landed=phases[-1][2] if phases else None, tmp=own_tmp())
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


def one_line(capsys) -> str:
    """The one line the command wrote to stderr (progress bars of model loading aside)."""
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "it/s]" not in line]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]
