"""Training and held-out questions as `tasks.base.Problem`s.

- `load`: rows from JSONL / JSON / Parquet / CSV files, HF dataset folders and `hf:` specs, mapped by a
  `FieldMap`; written back with `save_problems`.
- `prepare`: `regroup data prepare`, turning a public data set into regroup's row format.
- `heldout`: the held-out evaluation set of a run (generated or from `data.eval_file`).

May import: `regroup.io`, `regroup.errors`, `regroup.config.schema`, `tasks`, `rewards` (answer
extraction). Never the trainer, the runtime or the front-ends.
"""
