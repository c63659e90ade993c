"""Event counters a reward function keeps for per-step logs (`reward/extracted_frac`, `reward/timeouts`):
`pop()` returns the counts since the previous pop and zeroes them; `totals()` keeps counting since creation."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable


class RewardCounts:
    """Thread-safe counters over fixed `keys` (every key is always reported, zero included)."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.keys = tuple(keys)
        self._since_pop: Counter[str] = Counter()
        self._total: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        if name not in self.keys:
            raise KeyError(f"unknown reward count {name!r}; known: {self.keys}")
        with self._lock:
            self._since_pop[name] += n
            self._total[name] += n

    def pop(self) -> dict[str, int]:
        """The counts since the previous `pop`, then zero them."""
        with self._lock:
            out = {k: self._since_pop[k] for k in self.keys}
            self._since_pop.clear()
        return out

    def totals(self) -> dict[str, int]:
        """The counts since creation."""
        with self._lock:
            return {k: self._total[k] for k in self.keys}

    # A lock does not pickle: a copy starts from zero.
    def __getstate__(self) -> dict:
        return {"keys": self.keys}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["keys"])
