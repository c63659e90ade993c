"""A user reward (`rewards=[pkg.mod:obj]`: a function, a `functools.partial` or `lru_cache`, a callable
object) with a deadline: it runs in the reward worker pool (`regroup.rewards.pool`), like the math checker,
and a call that does not return within `timeout_s` is killed and scored None (unscored, counted as
`timeout`), so a reward that never returns cannot hang training.

Each worker imports the reward by its dotted name, isolated (`regroup.rewards.isolated`: never from the
current folder, regroup and the reward's package from the files the parent loaded), in its own process
group (a timeout kills what the reward started too) and under an address-space limit. The response and
`Problem.to_dict()` go as one JSON line, the value comes back as one: nothing is pickled either way;
whatever the reward prints goes to stderr. A timed-out or crashed worker is replaced at once. `workers`
children score a batch (`check_many`) at once.

A number beyond float range (an int such as 10**400) comes back as the largest float, which the reward
stage counts as out of range (`reward/out_of_range`), never an OverflowError. Timeouts are counted
(`reward/timeout`, `reward/timeout_frac`) and, when they keep happening, said in one warning line naming
the deadline: each costs the whole `timeout_s`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from regroup.errors import ConfigError
from regroup.rewards.counts import RewardCounts
from regroup.rewards.isolated import DEFAULT_MEMORY_MB
from regroup.rewards.pool import POOL_COUNTS, WorkerLost, WorkerPool, WorkerStartError, WorkerTimeout

log = logging.getLogger(__name__)

COUNTS = ("checked", "timeout", *POOL_COUNTS)


def _redacted(text: str) -> str:
    """An error text from the worker (the reward's own message) without any API key: it is printed."""
    from regroup.net.redact import redact  # here: the net package loads an HTTP client

    return redact(str(text))


class UserRewardError(ConfigError):
    """A user reward that cannot start, raises, or returns something that cannot be sent back: one line."""


class TimeoutWatch:
    """One warning line when calls keep timing out: in each of `patience` rounds in a row (a batch, or
    `calls_per_round` single calls) at least one call timed out. Any share counts: each timeout costs the
    whole deadline, so 5 % of 128 calls at 30 s is over 3 minutes of waiting a step. Fires once per streak."""

    def __init__(self, name: str, timeout_s: float, patience: int = 3, calls_per_round: int = 16) -> None:
        self.name, self.timeout_s = name, timeout_s
        self.patience, self.calls_per_round = patience, calls_per_round
        self.streak = 0
        self._pending = [0, 0]  # single calls not yet in a round: [calls, timeouts]
        self.warnings: list[str] = []

    def single(self, timed_out: bool) -> None:
        self._pending[0] += 1
        self._pending[1] += int(timed_out)
        if self._pending[0] >= self.calls_per_round:
            calls, timeouts = self._pending
            self._pending = [0, 0]
            self.round(calls, timeouts)

    def round(self, calls: int, timeouts: int) -> None:
        if not calls:
            return
        if not timeouts:
            self.streak = 0
            return
        self.streak += 1
        if self.streak == self.patience:
            line = (
                f"warning: reward {self.name}: {timeouts} of {calls} calls ({timeouts / calls:.0%}) timed out at "
                f"rewards.timeout_s={self.timeout_s:g} in each of the last {self.patience} batches "
                "(reward/timeout_frac); "
                f"each timeout waits the whole deadline (about {timeouts * self.timeout_s:.0f} s in the last batch) "
                "and scores None: make the reward faster, lower rewards.timeout_s, or raise rewards.workers"
            )
            self.warnings.append(line)
            log.warning(line)


class DeadlineReward:
    """`(response, problem) -> float | None` calling `name` ("pkg.mod:obj") in worker processes, at most
    `timeout_s` per call; past it the worker (and its process group) is killed and the call returns None
    (counted as timeout). `workers` children score a batch at once; each may use `memory_mb` MiB of address
    space (0: no limit). A callable object keeps its state per worker process (a killed worker loses it)."""

    def __init__(
        self,
        name: str,
        timeout_s: float,
        startup_timeout_s: float = 120.0,
        workers: int = 1,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"DeadlineReward: timeout_s must be > 0, got {timeout_s}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"DeadlineReward: workers must be an integer >= 1, got {workers!r}")
        if memory_mb < 0:
            raise ValueError(f"DeadlineReward: memory_mb must be >= 0, got {memory_mb}")
        self.name, self.timeout_s, self.startup_timeout_s = name, float(timeout_s), float(startup_timeout_s)
        self.workers, self.memory_mb = workers, int(memory_mb)
        self.__name__ = name
        self._counts = RewardCounts(COUNTS)
        top = name.partition(":")[0].split(".")[0]
        self.pool = WorkerPool(
            ["user", name],
            workers,
            counts=self._counts,
            memory_mb=self.memory_mb,
            startup_timeout_s=self.startup_timeout_s,
            preload=("regroup", top),
        )
        self.timeouts = TimeoutWatch(name, self.timeout_s)

    def pop_counts(self) -> dict[str, int]:
        return self._counts.pop()

    @property
    def stats(self) -> dict[str, int]:
        return self._counts.totals()

    def _call(self, response: str, problem: Any) -> tuple[float | None, bool]:
        """(value, whether the call timed out), in a free worker."""
        try:
            request = {"response": response, "problem": problem.to_dict()}
        except AttributeError as e:  # not a Problem
            raise UserRewardError(f"reward {self.name}: its arguments cannot be sent to the worker ({e})") from None
        self._counts.add("checked")
        try:
            reply = self.pool.call(request, self.timeout_s)
        except (TypeError, ValueError) as e:  # meta that is not JSON
            raise UserRewardError(f"reward {self.name}: its arguments cannot be sent to the worker ({e})") from None
        except WorkerStartError as e:
            raise UserRewardError(f"reward {self.name}: the worker process {_redacted(e.fatal or e.reason)}") from None
        except WorkerTimeout:
            self._counts.add("timeout")
            return None, True
        except WorkerLost:  # the worker crashed, or broke the reply protocol: replaced, the call unscored
            return None, False
        if "error" in reply:
            raise UserRewardError(f"reward {self.name} raised {_redacted(reply['error'])}")
        return reply["value"], False

    def __call__(self, response: str, problem: Any) -> float | None:
        value, timed_out = self._call(response, problem)
        self.timeouts.single(timed_out)
        return value

    def check_many(self, responses: Sequence[str], problems: Sequence[Any]) -> list[float | None]:
        """The rewards of a batch, `workers` calls at a time."""
        if len(responses) != len(problems):
            raise ValueError(f"check_many: {len(responses)} responses for {len(problems)} problems")
        results = self.pool.run_many(lambda pair: self._call(*pair), list(zip(responses, problems)))
        self.timeouts.round(len(results), sum(timed_out for _, timed_out in results))
        return [value for value, _ in results]

    def close(self) -> None:
        self.pool.close()

    def __getstate__(self) -> dict:
        keep = ("name", "timeout_s", "startup_timeout_s", "workers", "memory_mb")
        return {k: getattr(self, k) for k in keep}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, **state)
