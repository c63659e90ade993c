"""The studies: the papers' claims tested under registered plans, beside the library (as verl's recipe/).

- `miniature`: the built-in task and tiny model, two regimes, 25 registered seeds (`make study`);
- `real`: SmolLM2-135M with LoRA from an SFT start (`python -m studies --real`);
- `claims` (the claims as data and their verdicts), `stats` (scipy's t, statsmodels' Holm, the sign-flip
  test, power), `table` (the kept per-run table), `records` (what a results page keeps), `page`, `cli`.

It imports regroup's public names only; `src/regroup` never imports it (tests/test_structure.py checks).
Its statistics need the `study` extra (scipy, statsmodels).
"""
