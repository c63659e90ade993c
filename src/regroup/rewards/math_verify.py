"""A math answer checker that cannot hang: the last \\boxed{...} (or text after a marker) compared with the
problem's answer by math-verify, in the reward worker pool (`regroup.rewards.pool`), where a check past its
time is killed and its worker replaced.

Why processes: math-verify's own timeout uses SIGALRM, which only works in the main thread, and
cannot interrupt C code (sympy evaluating 9^{9^{9^9}} sits in one big-integer power). A killed child
always stops. The worker's own alarm ends a pure-Python hang without a restart; the kill is for the rest.

What bounds hostile answers: each check gets `timeout_s`; `workers` checks run at once
(`check_many`); and identical (gold, answer) pairs in one `check_many` batch are checked once, so 20
copies of one hostile box cost one timeout. Finished outcomes (not timeouts, which may come from a
loaded machine) are also remembered across calls.
Timeouts are counted apart from wrong answers (`pop_counts()`), though both score 0.0.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from regroup.config.registry import REWARDS
from regroup.rewards.counts import RewardCounts
from regroup.rewards.isolated import DEFAULT_MEMORY_MB
from regroup.rewards.pool import POOL_COUNTS, WorkerLost, WorkerPool, WorkerStartError, WorkerTimeout

__all__ = ["CHECK_COUNTS", "MathAnswerChecker", "extract_boxed", "extract_after_marker"]

# What `MathAnswerChecker.pop_counts()` reports. Every check is exactly one of too_long, no_answer,
# correct, wrong, timeout, error; `extracted` counts the checks where an answer was found; `cached`
# the checks answered from the remembered outcome of an identical (gold, answer) pair; then the pool's
# counts (`regroup.rewards.pool.POOL_COUNTS`): `restarts` the worker processes replaced (killed when stuck,
# or found dead), `protocol_errors` and `forked_returns` what broke the reply protocol.
CHECK_COUNTS = (
    "checked",
    "extracted",
    "no_answer",
    "too_long",
    "correct",
    "wrong",
    "timeout",
    "error",
    "cached",
    *POOL_COUNTS,
)

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
    """The content of the LAST complete `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces balanced.

    Also reads the brace-less form `\\boxed 5`. Linear in len(text): matching braces are found in one
    pass, so a long response full of unbalanced boxes cannot make it slow.
    """
    if not isinstance(text, str):
        return None
    close: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            close[stack.pop()] = i
    starts = sorted((i, cmd) for cmd in _BOX_COMMANDS for i in _find_all(text, cmd))
    for at, cmd in reversed(starts):
        j = at + len(cmd)
        if j < len(text) and text[j] == "{":
            if j in close:
                return text[j + 1 : close[j]].strip()
            continue  # never closed: try an earlier box
        if j < len(text) and text[j] == " ":
            token = text[j:].strip().split(maxsplit=1)
            if token:
                return token[0].rstrip("$.,")
    return None


def _find_all(text: str, needle: str) -> list[int]:
    out, at = [], text.find(needle)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + 1)
    return out


def extract_after_marker(text: str, marker: str) -> str | None:
    """The first non-empty line after the LAST `marker` in `text` (trailing full stop removed), or None."""
    if not isinstance(text, str) or not marker:
        return None
    at = text.rfind(marker)
    if at < 0:
        return None
    for line in text[at + len(marker) :].splitlines():
        line = line.strip().rstrip(".").strip()
        if line:
            return line
    return None


def _start_error(e: WorkerStartError) -> RuntimeError:
    return RuntimeError(f"math-verify worker {e.reason}" + (f": {e.fatal}" if e.fatal else ""))


class MathAnswerChecker:
    """Reward `(response, problem) -> 1.0 | 0.0`: is the response's final answer `problem.answer`?

    The answer is the text after the last `marker` when `marker` is set and present, else the content
    of the last `\\boxed{...}`. It is compared with `problem.answer` by `math_verify.parse` /
    `math_verify.verify` (so `\\boxed{1/2}` matches "0.5" and `\\frac{1}{2}`).

    Never hangs or raises on a response: one longer than `max_chars` scores 0.0 unparsed; parse +
    verify get `timeout_s` of wall time in a worker (an alarm there, then a kill from here after a
    short grace); timeouts, errors and crashes score 0.0 and are counted as such (`pop_counts()`,
    `stats`), never as wrong answers. `workers` processes check in parallel: `check_many` spreads a
    batch over them, and threads calling the checker share them. The last `memo_size` finished outcomes
    (correct, wrong, error; not timeouts) are remembered by (gold, answer). Safe after a fork (the child
    starts its own workers). Each worker is isolated, in its own process group, with `memory_mb` MiB of
    address space (`regroup.rewards.isolated`). Raises RuntimeError only if a worker process cannot start.
    """

    def __init__(
        self,
        marker: str | None = None,
        timeout_s: float = 2.0,
        max_chars: int = 20000,
        startup_timeout_s: float = 60.0,
        workers: int = 1,
        memo_size: int = 4096,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"MathAnswerChecker: timeout_s must be > 0, got {timeout_s}")
        if max_chars < 1:
            raise ValueError(f"MathAnswerChecker: max_chars must be >= 1, got {max_chars}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"MathAnswerChecker: workers must be an integer >= 1, got {workers!r}")
        if memo_size < 0:
            raise ValueError(f"MathAnswerChecker: memo_size must be >= 0, got {memo_size}")
        if memory_mb < 0:
            raise ValueError(f"MathAnswerChecker: memory_mb must be >= 0 (0: no limit), got {memory_mb}")
        self.marker = marker
        self.timeout_s = float(timeout_s)
        self.max_chars = int(max_chars)
        self.startup_timeout_s = float(startup_timeout_s)
        self.workers = workers
        self.memo_size = int(memo_size)
        self.memory_mb = int(memory_mb)
        # Grace after the worker's own alarm before the kill: the alarm handles pure-Python hangs
        # without a restart; the kill is for C code the alarm cannot interrupt.
        self.grace_s = min(1.0, 0.2 + 0.25 * self.timeout_s)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._counts = RewardCounts(CHECK_COUNTS)
        self.pool = WorkerPool(
            ["math"],
            self.workers,
            counts=self._counts,
            memory_mb=self.memory_mb,
            startup_timeout_s=self.startup_timeout_s,
            quiet=True,
        )
        self._memo: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._memo_lock = threading.Lock()

    # -- counts ----------------------------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """Counts since creation (keys: `CHECK_COUNTS`)."""
        return self._counts.totals()

    def pop_counts(self) -> dict[str, int]:
        """Counts since the previous call (keys: `CHECK_COUNTS`), for per-step logs."""
        return self._counts.pop()

    # -- extraction ------------------------------------------------------------------------------

    def extract(self, response: str) -> str | None:
        """The answer text this checker would compare, or None."""
        if self.marker:
            found = extract_after_marker(response, self.marker)
            if found is not None:
                return found
        return extract_boxed(response)

    # -- checking --------------------------------------------------------------------------------

    def __call__(self, response: str, problem: Any) -> float:
        """1.0 if the response's final answer equals `problem.answer` (math-verify), else 0.0."""
        pair = self._prepare(response, problem)
        if pair is None:
            return 0.0
        outcome, cached = self._outcome(*pair)
        return self._score(outcome, cached)

    def check_many(self, responses: Sequence[str], problems: Sequence[Any]) -> list[float]:
        """`[self(r, p) for r, p in zip(responses, problems)]`, with the distinct (gold, answer) pairs
        checked `workers` at a time; identical pairs are checked once."""
        if len(responses) != len(problems):
            raise ValueError(f"check_many: {len(responses)} responses for {len(problems)} problems")
        pairs = [self._prepare(r, p) for r, p in zip(responses, problems)]
        distinct = list(dict.fromkeys(p for p in pairs if p is not None))
        found = dict(zip(distinct, self.pool.run_many(lambda pair: self._outcome(*pair), distinct)))
        scores, seen = [], set()
        for pair in pairs:
            if pair is None:
                scores.append(0.0)
                continue
            outcome, cached = found[pair]
            scores.append(self._score(outcome, cached or pair in seen))  # a repeat in the batch is served
            seen.add(pair)
        return scores

    def _prepare(self, response: Any, problem: Any) -> tuple[str, str] | None:
        """(gold, answer) to check, or None when the response is settled without math-verify (counted)."""
        self._counts.add("checked")
        if not isinstance(response, str):
            self._counts.add("error")
            return None
        if len(response) > self.max_chars:
            self._counts.add("too_long")
            return None
        pred = self.extract(response)
        if pred is None or not pred.strip():
            self._counts.add("no_answer")
            return None
        self._counts.add("extracted")
        gold = getattr(problem, "answer", None)
        if gold is None or len(str(gold)) > self.max_chars:
            self._counts.add("error")
            return None
        return str(gold), pred

    def _score(self, outcome: str, cached: bool) -> float:
        self._counts.add(outcome)
        if cached:
            self._counts.add("cached")
        return 1.0 if outcome == "correct" else 0.0

    def _outcome(self, gold: str, pred: str) -> tuple[str, bool]:
        """("correct" | "wrong" | "timeout" | "error", whether it was remembered)."""
        key = (gold, pred)
        with self._memo_lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key], True
        outcome = self._verify(gold, pred)
        if self.memo_size and outcome != "timeout":
            # A timeout is not remembered: it may come from a loaded machine, not from the answer.
            with self._memo_lock:
                self._memo[key] = outcome
                while len(self._memo) > self.memo_size:
                    self._memo.popitem(last=False)
        return outcome, False

    def _verify(self, gold: str, pred: str) -> str:
        request = {"gold": gold, "pred": pred, "budget": self.timeout_s}  # the worker's own alarm
        try:
            reply = self.pool.call(request, self.timeout_s + self.grace_s)  # then a kill, after a short grace
        except WorkerTimeout:
            return "timeout"  # stuck where the alarm cannot reach: killed
        except WorkerLost:
            return "error"  # this input crashed the worker (e.g. a C stack overflow), or it broke the protocol
        except WorkerStartError as e:
            raise _start_error(e) from None
        if reply.get("timeout"):
            return "timeout"
        if "error" in reply:
            return "error"
        return "correct" if reply.get("ok") else "wrong"

    def warm_up(self) -> None:
        """Start every worker now and wait until each is ready (imported and warmed by one check), so
        no timed check pays for a start."""
        try:
            self.pool.warm_up()
        except WorkerStartError as e:
            raise _start_error(e) from None

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        self.pool.close()

    def __enter__(self) -> MathAnswerChecker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Processes, locks and queues do not pickle; the copy starts its own workers when first called.
        keep = ("marker", "timeout_s", "max_chars", "startup_timeout_s", "workers", "memo_size", "grace_s", "memory_mb")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"memory_mb": DEFAULT_MEMORY_MB, **state})
        self._init_runtime()

    def __repr__(self) -> str:
        return (
            f"MathAnswerChecker(marker={self.marker!r}, timeout_s={self.timeout_s}, max_chars={self.max_chars}, "
            f"workers={self.workers})"
        )


@REWARDS.register("math")
def build_math_reward(
    task: Any, *, workers: int = 1, correct_threshold: float = 1.0, memory_mb: int = DEFAULT_MEMORY_MB
) -> MathAnswerChecker:
    """`rewards=[math]`: math-verify on the response's final answer, `workers` checker processes of at
    most `memory_mb` MiB of address space each."""
    return MathAnswerChecker(workers=workers, memory_mb=memory_mb)
