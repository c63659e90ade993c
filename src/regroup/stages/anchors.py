"""DaGRPO off-policy anchors (SPEC §2b): verified-correct solutions from outside the policy join their
question's group, G_mix = G_on ∪ G_off.

Sources: the data's reference solution (checked by the grader before use; a wrong reference is never
injected, and is counted) and — past the paper — a bounded buffer of the policy's own earlier
verified-correct responses per question ("self"), used when no reference exists.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from regroup.batch import Sample


class AnchorInjector:
    """Chooses anchors, reserves their slots (mode=replace) and adds them to the step's samples."""

    def __init__(self, cfg, reward_fn, encode_response):
        self.cfg = cfg
        self.reward_fn = reward_fn
        self.encode_response = encode_response
        self._reference_ok: dict[str, bool] = {}
        self.buffer: OrderedDict[str, list[str]] = OrderedDict()  # question id -> recent correct responses
        self.totals = {"injected": 0, "rejected_reference": 0, "from_reference": 0, "from_self": 0}

    # -- sources ---------------------------------------------------------------------------------------
    def _reference(self, problem) -> str | None:
        if self.cfg.source == "self" or not problem.solution:
            return None
        if problem.id not in self._reference_ok:
            reward = self.reward_fn(problem.solution, problem)
            ok = reward is not None and math.isfinite(reward) and reward > 0
            self._reference_ok[problem.id] = ok
            if not ok:
                self.totals["rejected_reference"] += 1
        return problem.solution if self._reference_ok[problem.id] else None

    def _candidates(self, problem) -> list[tuple[str, str]]:
        """(text, source) anchors available for a question, reference first."""
        out = []
        ref = self._reference(problem)
        if ref is not None:
            out.append((ref, "reference"))
        if self.cfg.source in ("self", "both"):
            out.extend((text, "self") for text in reversed(self.buffer.get(problem.id, [])))
        return out[: self.cfg.count]

    # -- the step --------------------------------------------------------------------------------------
    def reserved_slots(self, problems) -> list[int]:
        """On-policy samples of q0 to leave out for anchors that always replace one (7 + 1 for G = 8)."""
        if self.cfg.mode != "replace" or self.cfg.when != "always":
            return [0] * len(problems)
        return [len(self._candidates(p)) for p in problems]

    def inject(self, samples: list[Sample], problems, group_ids: list[int], q0_prompts: list[list[int]]):
        """Return samples with anchors added, and the step's anchor stats."""
        by_group: dict[int, list[Sample]] = {}
        for s in samples:
            by_group.setdefault(s.group_id, []).append(s)
        out = list(samples)
        injected = 0
        for problem, gid, prompt in zip(problems, group_ids, q0_prompts):
            members = by_group.get(gid, [])
            if self.cfg.when == "no_correct" and any(s.reward is not None and math.isfinite(s.reward) and s.reward > 0
                                                     for s in members):
                continue
            candidates = self._candidates(problem)
            if not candidates:
                continue
            if self.cfg.mode == "replace" and self.cfg.when == "no_correct":
                # Drop the last on-policy samples of q0 to make room (the slot was not reserved up front).
                drop = [s for s in members if s.variant == 0 and not s.is_anchor][-len(candidates):]
                drop_ids = {id(s) for s in drop}
                out = [s for s in out if id(s) not in drop_ids]
            for text, source in candidates:
                ids = self.encode_response(text)
                out.append(Sample(
                    group_id=gid, question_id=problem.id, variant=0, is_anchor=True,
                    prompt_ids=prompt, ratio_prompt_ids=prompt, response_ids=ids, response_text=text,
                    behaviour_logps=None, truncated=False, reward=self.reward_fn(text, problem), problem=problem,
                ))
                self.totals["from_" + source] += 1
                injected += 1
        self.totals["injected"] += injected
        return out, {"anchor/count": float(injected)}

    def observe(self, samples: list[Sample]) -> None:
        """Keep the policy's own verified-correct answers to q0 as future self-bootstrapped anchors."""
        if self.cfg.source == "reference":
            return
        for s in samples:
            if s.is_anchor or s.variant != 0 or s.truncated or s.reward is None or not math.isfinite(s.reward) or s.reward <= 0:
                continue
            kept = self.buffer.setdefault(s.question_id, [])
            if s.response_text not in kept:
                kept.append(s.response_text)
                del kept[: max(0, len(kept) - self.cfg.buffer_size)]
            self.buffer.move_to_end(s.question_id)

    def state_dict(self) -> dict:
        return {"buffer": dict(self.buffer), "reference_ok": dict(self._reference_ok), "totals": dict(self.totals)}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = OrderedDict(state.get("buffer", {}))
        self._reference_ok = dict(state.get("reference_ok", {}))
        self.totals.update(state.get("totals", {}))
