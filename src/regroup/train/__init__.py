"""The training loop and what it is built from.

- `recipes`: a run config -> `Recipe` (ordered stages + `LossSpec`); the one reader of feature flags.
- `build`: everything a `Trainer` needs from a config (model, sampler, hooks, schedule, problems).
- `trainer`: draw questions -> run the recipe's stages -> update with the loss -> hooks -> checkpoint.
  It orchestrates and never asks which algorithm it runs.
- `row_balance`: which rows a mini-batch forwards, the same count on every process.
- `preflight`: checks before any weights load (memory, keys, prompts, references, user rewards).
- `data_stream`, `schedule`: the question stream and the learning-rate schedule.
- `warmup`: the built-in tiny model's supervised warm-up.

May import anything below it; only `integrations`, `experiments` and `cli` import it.
"""
