"""No import cycle: every module of the package imports on its own, first, in a fresh interpreter state
(regroup's modules are dropped from sys.modules before each one; torch & co. stay loaded to keep it fast)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import importlib, pkgutil, sys
import regroup
names = sorted(m.name for m in pkgutil.walk_packages(regroup.__path__, "regroup.") if not m.name.endswith("__main__"))
optional = {"regroup.integrations.trl": "trl", "regroup.rollout.vllm": "vllm"}
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "regroup" or m.startswith("regroup.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == optional.get(name):
            continue
        failed.append(f"{name}: {exc!r}")
    except Exception as exc:
        failed.append(f"{name}: {exc!r}")
print(len(names))
print("\n".join(failed))
"""


def test_every_module_imports_alone():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    count, *failures = out.stdout.strip().splitlines()
    assert int(count) > 60
    assert failures == [], "\n".join(failures)
