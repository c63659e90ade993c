"""Training questions in a seeded order, epoch by epoch, with a position that checkpoints save."""

from __future__ import annotations

import random


class QuestionStream:
    """Every process builds the same stream from the same seed and takes its own slice of each batch."""

    def __init__(self, problems: list, seed: int):
        if not problems:
            raise ValueError("no training problems")
        self.problems = problems
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 7919 + epoch).shuffle(order)
        return order

    def next_batch(self, size: int) -> list:
        out: list = []
        while len(out) < size:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            out.append(self.problems[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
