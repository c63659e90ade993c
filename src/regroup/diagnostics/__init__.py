"""What a run reports about itself besides the loss: update hooks the trainer runs without knowing them.

- `hooks`: the `UpdateHook` seam (`after_collect` / `before_update` / `after_step`), `build_update_hooks(cfg)`
  and `WatchSignals`, the hook that runs `SignalWatch` (the held-out evaluation is a hook too:
  `regroup.eval.during_training`).
- `signals`: reward diagnostics, group diversity and `SignalWatch`, which says while training when the
  training signal vanishes (uniform groups, unscored rewards, masks that leave no gradient, ...).
- `grad_conflict`: the gradient-conflict probe and its hook (costly: by default every 10 steps, and only
  when the measured parameters are small, `hooks.default_conflict_every`).

May import: `algo`, `batch`, `stages.base`, `models.logprobs`. Never the trainer.
"""
