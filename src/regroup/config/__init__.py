"""Run configuration: what a config may name, and the sections it is made of.

- `fields`: the one way to declare and check a setting, for run-config sections (`Section`) and piece knobs
  (`Knobs`) alike: `F(default, help, ge=, ...)` on pydantic, one-line `ConfigError`s, the help renderer; YAML
  reading and dotted overrides. Imports only `regroup.errors`.
- `registry`: one `Registry` per kind of named piece (stages, losses, rewards, scorers, ...), the `pkg.mod:obj`
  loader and the pieces' knobs (`parse_args`): the names a config may use.
- `schema`: the sections of a `RunConfig`, their bounds and cross-field rules. A leaf: it imports only
  `config.fields` and `regroup.errors`, so anything may import it (tests/test_structure.py).

Whether the named pieces exist and the files a run reads are there is checked a floor up, by
`regroup.train.run_config` (the loader and validator); the loss settings resolve in `train.loss_config`.
"""
