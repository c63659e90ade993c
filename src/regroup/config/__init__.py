"""Run configuration.

- `fields`: the `F(default, help, ge=, le=)` field helper, YAML reading, dotted overrides (imports only
  `regroup.errors` and `regroup.registry`).
- `schema`: the sections of a `RunConfig`, their bounds and cross-field rules. A leaf: it imports only
  `config.fields`, `regroup.errors` and `regroup.registry`, so anything may import it (a test checks).
- `loss`: the loss settings resolved into one `algo.losses.LossSpec`.
- `loader`: reading, checking and writing a whole config. It checks the named pieces against their
  registries (rewards, scorers, rephrasers, tasks, stages, loss pieces) and the files a run reads, so it
  sits above those packages; nothing below it imports it.
"""
