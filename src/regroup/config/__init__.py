"""Run configuration: what a config may name, and the sections it is made of.

- `registry`: one `Registry` per kind of named piece (stages, losses, rewards, scorers, ...) and the
  `pkg.mod:obj` loader: the names a config may use. Imports nothing of regroup.
- `fields`: the `F(default, help, ge=, le=)` field helper, YAML reading, dotted overrides (imports only
  `regroup.errors` and `config.registry`).
- `schema`: the sections of a `RunConfig`, their bounds and cross-field rules. A leaf: it imports only
  `config.fields`, `config.registry` and `regroup.errors`, so anything may import it (tests/test_structure.py).

Whether the named pieces exist and the files a run reads are there is checked a floor up, by
`regroup.train.run_config` (the loader and validator); the loss settings resolve in `train.loss_config`.
"""
