"""Adapters that put regroup's algorithm pieces inside other training stacks.

- `regroup.integrations.trl`: `RegroupGRPOTrainer`, a TRL `GRPOTrainer` subclass with DaGRPO masks and
  anchors and TA-GRPO pooling (needs the optional `trl` dependency; imported only when used).
"""
