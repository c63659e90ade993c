"""Adapters that run regroup's recipes inside other training stacks.

- `regroup.integrations.trl`: `RegroupGRPOTrainer`, a TRL `GRPOTrainer` subclass in which TRL samples and a
  regroup recipe (its stages and loss) does the rest (needs the optional `trl` dependency; imported only
  when used).
"""
