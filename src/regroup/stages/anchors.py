"""DaGRPO off-policy anchors (SPEC §2b): verified-correct solutions from outside the policy join their
question's group, G_mix = G_on ∪ G_off.

Sources: the data's reference solution (checked by the grader before use; a wrong reference is never
injected, and is counted) and — past the paper — a bounded buffer of the policy's own earlier
verified-correct responses per question ("self"), used when no reference exists.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict

from regroup.batch import Sample
from regroup.config.registry import STAGES
from regroup.config.schema import AnchorConfig
from regroup.rewards import pop_counts
from regroup.stages.base import FIXED_SHAPE_FRONT_ENDS, StepBatch, StepContext


def is_verified(reward, threshold: float) -> bool:
    """The one definition of a verified-correct answer: a finite reward >= `rewards.correct_threshold`."""
    return reward is not None and math.isfinite(reward) and reward >= threshold


class AnchorInjector:
    """Chooses anchors, reserves their slots (mode=replace) and adds them to the step's samples."""

    def __init__(
        self, anchors: AnchorConfig, reward_fn, encode_response, *, correct_threshold: float = 1.0, max_tokens: int = 0
    ):
        self.anchors = anchors
        self.reward_fn = reward_fn
        self.encode_response = encode_response
        self.correct_threshold = correct_threshold
        self.max_tokens = max_tokens
        """Longest anchor in tokens (0: no cap): under a constant normaliser a long anchor would outweigh the group."""
        self._verdict: dict[str, str] = {}
        """question id -> reference verdict (see `reference_verdict`)."""
        self.buffer: OrderedDict[str, list[str]] = OrderedDict()  # question id -> recent correct responses
        self.totals = {"injected": 0, "rejected_reference": 0, "too_long": 0, "from_reference": 0, "from_self": 0}
        self.time_verifying = 0.0
        self.round_mark: tuple[dict, float] | None = None
        """(totals, time_verifying) where the current round's anchor decisions began (see `_begin_round`)."""
        self.held_checks: dict[str, int] = {}
        """The reward's counts from verifying references before sampling (kept off `reward/*`)."""

    # -- sources ---------------------------------------------------------------------------------------
    def reference_verdict(self, problem) -> str:
        """Whether the data's reference can be an anchor, decided once per question: "ok", "missing",
        "too_long" (over `max_tokens`: a cut reference is not a verified solution) or "unverified"
        (reward below `correct_threshold`). Both front-ends ask this one question."""
        if not problem.solution:
            return "missing"
        if problem.id not in self._verdict:
            t0 = time.perf_counter()
            if self.max_tokens and len(self.encode_response(problem.solution)) > self.max_tokens:
                verdict = "too_long"
                self.totals["too_long"] += 1
            else:
                ok = is_verified(self.reward_fn(problem.solution, problem), self.correct_threshold)
                verdict = "ok" if ok else "unverified"
                self.totals["rejected_reference"] += not ok
            self._verdict[problem.id] = verdict
            self.time_verifying += time.perf_counter() - t0
        return self._verdict[problem.id]

    def _reference(self, problem) -> str | None:
        if self.anchors.source == "self":
            return None
        return problem.solution if self.reference_verdict(problem) == "ok" else None

    def _candidates(self, problem) -> list[tuple[str, str]]:
        """(text, source) anchors available for a question, reference first."""
        out = []
        ref = self._reference(problem)
        if ref is not None:
            out.append((ref, "reference"))
        if self.anchors.source in ("self", "both"):
            out.extend((text, "self") for text in reversed(self.buffer.get(problem.id, [])))
        return out[: self.anchors.count]

    # -- the step --------------------------------------------------------------------------------------
    def reserved_slots(self, problems) -> list[int]:
        """On-policy samples of q0 to leave out for anchors that always replace one (7 + 1 for G = 8)."""
        if self.anchors.mode != "replace" or self.anchors.when != "always":
            return [0] * len(problems)
        return [len(self._candidates(p)) for p in problems]

    def inject(
        self, samples: list[Sample], problems, group_ids: list[int], q0_prompts: list[list[int]], reserved: bool = True
    ):
        """Return samples with anchors added, and the step's anchor stats. `reserved`: slots were left out
        before sampling (`ReserveAnchorSlots`); else (the TRL adapter samples every slot) an anchor in
        replace mode takes the place of the last on-policy sample of q0."""
        by_group: dict[int, list[Sample]] = {}
        for s in samples:
            by_group.setdefault(s.group_id, []).append(s)
        out = list(samples)
        injected = 0
        for problem, gid, prompt in zip(problems, group_ids, q0_prompts):
            members = by_group.get(gid, [])
            if self.anchors.when == "no_correct" and any(
                is_verified(s.reward, self.correct_threshold) for s in members
            ):
                continue
            candidates = self._candidates(problem)
            if not candidates:
                continue
            reserved_here = self.anchors.mode == "replace" and self.anchors.when == "always" and reserved
            if self.anchors.mode == "replace" and not reserved_here:
                # Drop the last on-policy samples of q0 to make room (the slot was not reserved up front).
                drop = [s for s in members if s.variant == 0 and not s.is_anchor][-len(candidates) :]
                drop_ids = {id(s) for s in drop}
                out = [s for s in out if id(s) not in drop_ids]
            for text, source in candidates:
                ids = self.encode_response(text)
                out.append(
                    Sample(
                        group_id=gid,
                        question_id=problem.id,
                        variant=0,
                        is_anchor=True,
                        prompt_ids=prompt,
                        ratio_prompt_ids=prompt,
                        response_ids=ids,
                        response_text=text,
                        behaviour_logps=None,
                        truncated=False,
                        reward=self.reward_fn(text, problem),
                        problem=problem,
                    )
                )
                self.totals["from_" + source] += 1
                injected += 1
        self.totals["injected"] += injected
        return out, {"anchor/count": float(injected)}

    def observe(self, samples: list[Sample]) -> None:
        """Keep the policy's own verified-correct answers to q0 as future self-bootstrapped anchors."""
        if self.anchors.source == "reference":
            return
        for s in samples:
            if s.is_anchor or s.variant != 0 or s.truncated or not is_verified(s.reward, self.correct_threshold):
                continue
            kept = self.buffer.setdefault(s.question_id, [])
            if self.max_tokens and len(s.response_ids) > self.max_tokens:
                continue
            if s.response_text not in kept:
                kept.append(s.response_text)
                del kept[: max(0, len(kept) - self.anchors.buffer_size)]
            self.buffer.move_to_end(s.question_id)

    def state_dict(self) -> dict:
        return {"buffer": dict(self.buffer), "reference_verdict": dict(self._verdict), "totals": dict(self.totals)}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = OrderedDict(state.get("buffer", {}))
        self._verdict = dict(state.get("reference_verdict", {}))
        self.totals.update(state.get("totals", {}))


def _begin_round(inj: AnchorInjector) -> None:
    """Mark the injector's totals where this round's anchor decisions start."""
    inj.round_mark = (dict(inj.totals), inj.time_verifying)


def _end_round(inj: AnchorInjector) -> dict[str, float]:
    """What the anchor stages decided since `_begin_round` (ReserveAnchorSlots, or this InjectAnchors call
    when nothing reserved): in replace mode the references are verified before sampling, so counting only
    InjectAnchors' own call would read 0. The reward's counts from verifying references are taken off
    here, so `reward/*` counts on-policy samples only."""
    totals, verifying = inj.round_mark or (dict(inj.totals), inj.time_verifying)
    inj.round_mark = None
    checks = pop_counts(inj.reward_fn)
    return {
        "anchor/too_long": float(inj.totals["too_long"] - totals["too_long"]),
        "anchor/rejected_reference": float(inj.totals["rejected_reference"] - totals["rejected_reference"]),
        "anchor/reward_checks": float(checks.get("checked", 0)),
        "time/anchor_verify": inj.time_verifying - verifying,
    }


class ReserveAnchorSlots:
    """Before sampling: leave one q0 slot per anchor that will replace an on-policy sample (7 + 1)."""

    name = "anchor_slots"

    def __init__(self, injector: AnchorInjector):
        self.injector = injector

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        _begin_round(self.injector)
        batch.reserved = self.injector.reserved_slots(batch.problems)
        self.injector.held_checks = pop_counts(self.injector.reward_fn)  # references checked: not on-policy
        return {}


class InjectAnchors:
    """After rewarding: add verified anchors to their question's group (SPEC §2b), then remember the
    policy's own verified answers for `anchors.source=self|both`. Checkpointed: the self-anchor buffer."""

    name = "anchors"
    round_totals = ("anchor/too_long", "anchor/rejected_reference", "anchor/reward_checks", "time/anchor_verify")
    """What each dynamic-sampling round's anchor decisions cost, summed over the rounds (`stages.base.merge_rounds`)."""

    def __init__(self, injector: AnchorInjector):
        self.injector = injector

    def unsupported_by(self, front_end: str) -> str | None:
        if front_end in FIXED_SHAPE_FRONT_ENDS and self.injector.anchors.mode != "replace":
            return (
                f"anchors.mode={self.injector.anchors.mode}: an added anchor grows its group, and the {front_end} "
                "batch has a fixed shape; use anchors.mode=replace"
            )
        return None

    def __call__(self, batch: StepBatch, ctx: StepContext) -> dict[str, float]:
        inj = self.injector
        t0 = time.perf_counter()
        if inj.round_mark is None:
            _begin_round(inj)
        encode = ctx.encode_prompt
        if encode is None:
            raise RuntimeError("InjectAnchors needs StepContext.encode_prompt (the front-end's prompt encoder)")
        q0_prompts = [encode(p.question) for p in batch.problems]
        batch.samples, metrics = inj.inject(
            batch.samples, batch.problems, batch.group_ids, q0_prompts, reserved=batch.reserved is not None
        )
        inj.observe(batch.samples)
        metrics.update(_end_round(inj))
        metrics["anchor/reward_checks"] += inj.held_checks.get("checked", 0)
        inj.held_checks = {}
        metrics["time/anchors"] = time.perf_counter() - t0
        return metrics

    def state_dict(self) -> dict:
        return self.injector.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.injector.load_state_dict(state)


STAGES.register(ReserveAnchorSlots.name, ReserveAnchorSlots)
STAGES.register(InjectAnchors.name, InjectAnchors)
