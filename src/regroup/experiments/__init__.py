"""The experiment harness: `regroup demo`, `regroup study` (and `--real`) and the study page. It uses the
library; the library never imports it (tests/test_structure.py checks), so `src/regroup`'s core reads without it."""
