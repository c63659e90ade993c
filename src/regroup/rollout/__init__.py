"""Rollout backends: sample responses from the current policy."""

from regroup.rollout.base import Completion, SamplingParams

__all__ = ["Completion", "SamplingParams"]
