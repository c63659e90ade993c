"""regroup's `verl.plugins` entry point (`regroup.integrations.verl_plugin`): a plug-in that fails to import
is logged at WARNING with its cause, and a run that names `trainer_mode=regroup` then stops in one line
naming the import error.

Without verl: verl 0.9.1's entry-point loop and trainer registry are reproduced here (the same few lines as
`verl/__init__.py` and `verl/trainer/ppo/v1/trainer_base.py`), and the plug-in's import is broken by a
dependency that cannot import (`sys.modules[name] = None`). With verl's venv (`make verl-venv`): a real
`import verl` with a broken plug-in, in a subprocess.
"""

from __future__ import annotations

import abc
import importlib
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERL_PYTHON = Path(os.environ.get("REGROUP_VERL_PYTHON", ROOT / ".venv-verl" / "bin" / "python"))
PLUGIN = "regroup.integrations.verl_plugin"


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def fake_verl_trainer_registry(monkeypatch) -> types.ModuleType:
    """verl 0.9.1's trainer registry (`verl.trainer.ppo.v1.trainer_base`) as modules in sys.modules."""
    base = types.ModuleType("verl.trainer.ppo.v1.trainer_base")

    class PPOTrainer(abc.ABC):
        def __init__(self, config):
            self.config = config

        @abc.abstractmethod
        def fit(self): ...

    registry: dict = {}

    def register_trainer(name):
        def decorator(cls):
            if not (isinstance(cls, type) and issubclass(cls, PPOTrainer)):
                raise TypeError(f"register_trainer expected a PPOTrainer subclass, got {cls!r}")
            registry[name] = cls
            return cls

        return decorator

    def get_trainer_cls(name):
        try:
            return registry[name]
        except KeyError:
            raise ValueError(f"Unknown trainer '{name}'. Available trainers: {', '.join(sorted(registry))}.") from None

    base.PPOTrainer, base.TRAINER_REGISTRY = PPOTrainer, registry
    base.register_trainer, base.get_trainer_cls = register_trainer, get_trainer_cls
    for name in ("verl", "verl.trainer", "verl.trainer.ppo", "verl.trainer.ppo.v1"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, base.__name__, base)
    return base


def load_entry_point(monkeypatch):
    """What verl 0.9.1 does with each `verl.plugins` entry point on `import verl`: import it, and log a
    failure at DEBUG."""
    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)
    try:
        return importlib.import_module(PLUGIN)
    except Exception as exc:
        logging.getLogger("verl").debug("Failed to load plugin '%s': %s", "regroup", exc)
        return None


def test_the_entry_point_is_the_module_that_reports_a_failed_import():
    assert pyproject()["project"]["entry-points"]["verl.plugins"] == {"regroup": PLUGIN}


def test_a_broken_plugin_warns_with_its_cause_and_the_regroup_trainer_fails_in_one_line(monkeypatch, caplog):
    base = fake_verl_trainer_registry(monkeypatch)
    monkeypatch.delitem(sys.modules, "regroup.integrations.verl", raising=False)
    monkeypatch.setitem(sys.modules, "transfer_queue", None)  # a dependency of the plug-in that cannot import
    with caplog.at_level(logging.DEBUG):
        module = load_entry_point(monkeypatch)
    assert module is not None  # the entry point itself imported: verl's DEBUG line is not the only trace
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == PLUGIN]
    assert len(warnings) == 1
    assert "failed to import" in warnings[0].getMessage() and "transfer_queue" in warnings[0].getMessage()
    assert module.IMPORT_ERROR is not None and "transfer_queue" in module.IMPORT_ERROR
    trainer_cls = base.get_trainer_cls("regroup")  # not verl's "Unknown trainer 'regroup'"
    with pytest.raises(module.PluginImportError) as raised:
        trainer_cls(config={})
    line = str(raised.value)
    assert "\n" not in line
    assert line.startswith("trainer.v1.trainer_mode=regroup: regroup's verl plug-in failed to import (")
    assert "transfer_queue" in line


def test_a_plugin_that_imports_registers_nothing_more_and_logs_no_warning(monkeypatch, caplog):
    base = fake_verl_trainer_registry(monkeypatch)
    monkeypatch.setitem(sys.modules, "regroup.integrations.verl", types.ModuleType("regroup.integrations.verl"))
    with caplog.at_level(logging.DEBUG):
        module = load_entry_point(monkeypatch)
    assert module.IMPORT_ERROR is None
    assert base.TRAINER_REGISTRY == {}  # the real plug-in registers its own trainer when it imports
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_without_verls_trainer_the_warning_still_comes(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "verl", None)  # verl itself absent: no stand-in, verl would fail first
    monkeypatch.delitem(sys.modules, "regroup.integrations.verl", raising=False)
    monkeypatch.setitem(sys.modules, "transfer_queue", None)
    with caplog.at_level(logging.WARNING):
        module = load_entry_point(monkeypatch)
    assert module is not None and "transfer_queue" in module.IMPORT_ERROR
    assert [r.name for r in caplog.records if r.levelno == logging.WARNING] == [PLUGIN]


# --- the real verl 0.9.1 (its own venv, `make verl-venv`) ------------------------------------------------------

BROKEN_IMPORT = r"""
import sys
from importlib.metadata import EntryPoint
import importlib.metadata as md

# regroup as installed: its `verl.plugins` entry point (the project's own, from pyproject.toml)
real_entry_points = md.entry_points
def entry_points(**params):
    if params.get("group") == "verl.plugins":
        return md.EntryPoints([EntryPoint(name="regroup", value=sys.argv[1], group="verl.plugins")])
    return real_entry_points(**params)
md.entry_points = entry_points
sys.modules["transfer_queue"] = None  # a dependency of the plug-in that cannot import: the plug-in is broken
import verl
print("IMPORTED", verl.__version__)
"""


@pytest.mark.skipif(
    not VERL_PYTHON.exists(), reason=f"verl's venv is absent ({VERL_PYTHON}); `make verl-venv` builds it"
)
def test_real_verl_import_with_a_broken_plugin_logs_a_warning_with_the_cause(tmp_path):
    entry = pyproject()["project"]["entry-points"]["verl.plugins"]["regroup"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    command = [str(VERL_PYTHON), "-c", BROKEN_IMPORT, entry]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    warning = [line for line in out.stderr.splitlines() if line.startswith("WARNING:") and "regroup" in line]
    assert len(warning) == 1, out.stderr[-3000:]
    assert "failed to import" in warning[0] and "transfer_queue" in warning[0]
    assert "IMPORTED 0.9.1" in out.stdout  # verl went on without the plug-in, as it does
