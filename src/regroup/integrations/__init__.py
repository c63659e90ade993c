"""Adapters that run regroup's recipes inside other training stacks.

- `regroup.integrations.trl`: `RegroupGRPOTrainer`, a TRL `GRPOTrainer` subclass in which TRL samples and a
  regroup recipe (its stages and loss) does the rest (needs the `trl` extra, a TRL version window; imported
  only when used).
- `regroup.integrations.verl`: a verl 0.9.1 plug-in (trainer mode and agent loop "regroup", the recipe's
  loss through `set_loss_fn`) in which verl samples and trains and the recipe does the rest (needs verl;
  loaded by verl itself, through `verl_plugin`, the entry point that logs a failed import at WARNING).
  `verl_helpers` holds its pure parts, `verl_reward` verl's reward function.
- `regroup.integrations.rows`: where each row of a fixed-shape front-end's batch is after the stages.
"""
