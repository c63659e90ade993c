"""What a run reports about itself besides the loss: update hooks the trainer runs without knowing them.

- `hooks`: the `UpdateHook` seam (`after_collect` / `before_update` / `after_step`), `build_update_hooks(cfg)`
  and `WatchSignals`, the hook that runs `SignalWatch` (the held-out evaluation is a hook too:
  `regroup.eval.during_training`).
- `signals`: reward diagnostics, group diversity and `SignalWatch`, which says while training when the
  training signal vanishes (uniform groups, unscored rewards, masks that leave no gradient, ...).
- `grad_conflict`: the gradient-conflict probe (costly; off by default).

May import: `algo`, `batch`, `stages.base`, `models.logprobs`. Never the trainer.
"""
