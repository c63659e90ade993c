"""The examples and `library_step` (one library step captured through public seams) import by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "examples"))  # the examples import each other by name, as when run as scripts
sys.path.insert(0, str(HERE))

from library_step import run_library_step  # noqa: E402


@pytest.fixture
def capture_step(tiny_model_dir, tmp_path):
    """`capture_step(recipe, *overrides)` -> `library_step.LibraryStep`."""
    return lambda recipe, *overrides: run_library_step(tiny_model_dir, tmp_path / "run", recipe, list(overrides))
