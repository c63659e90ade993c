"""What a run leaves on disk and how it uses the machine.

- `rundir`: claiming, locking and reading run folders; `checkpoint`: checkpoints of tensors and plain
  values (loaded `weights_only=True`), resume checks; `sharded`: FSDP / DDP-aware state gathering;
- `metrics`: JSONL metrics and trackers; `sample_log`: `samples.jsonl`;
- `threads`: OpenMP settings at import; `cpu_memory`: giving freed memory back to the OS.

May import: the package root's `errors`, `io` and `batch`, and `config` (`fields`, `schema`). Never a model, a stage
or the trainer.
"""
