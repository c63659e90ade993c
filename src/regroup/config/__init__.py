"""Run configuration: what a config may name, and the sections it is made of.

- `fields`: the one way to declare and check a setting, for sections (`Section`) and piece knobs (`Knobs`) alike;
  one-line `ConfigError`s, the help renderer, the YAML reader and dotted overrides. Imports only `regroup.errors` and
  `regroup.io`.
- `registry`: one `Registry` per kind of named piece, the `pkg.mod:obj` loader and the pieces' knobs (`parse_args`).
- `schema`: the sections of a `RunConfig` and their cross-field rules; a leaf (tests/test_structure.py).

Whether the named pieces exist and the files a run reads are there is checked in the layer above, by
`regroup.train.run_config`; the loss settings resolve, once per run, in `regroup.algo.loss_config`.
"""
