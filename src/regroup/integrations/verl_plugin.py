"""regroup's `verl.plugins` entry point: imports the verl plug-in (`regroup.integrations.verl`), and says so
when that fails.

verl 0.9.1 imports every `verl.plugins` entry point on `import verl`, logs one that fails at DEBUG and goes
on without it: a broken regroup install would surface only later, as verl's "Unknown trainer 'regroup'". So
the entry point is this module, which imports the plug-in itself and, when that raises, logs the cause at
WARNING, keeps it in `IMPORT_ERROR`, and registers a stand-in trainer `regroup` with verl, so that a run that
names `trainer.v1.trainer_mode=regroup` stops in one line naming the import error. Nothing is registered
when the plug-in imports (it registers itself) or when verl's own trainer module does not import (verl then
fails with that error itself).
"""

from __future__ import annotations

import importlib
import logging

log = logging.getLogger(__name__)

PLUGIN = "regroup.integrations.verl"
"""The module that registers regroup's trainer and agent loop with verl."""
NAME = "regroup"
"""The trainer mode the plug-in registers."""
IMPORT_ERROR: str | None = None
"""Why the plug-in did not import ("ExceptionType: message", one line), or None."""


class PluginImportError(ImportError):
    """A run named the `regroup` trainer, but regroup's verl plug-in failed to import."""


def failure_line(cause: str) -> str:
    """The one line a run that names the `regroup` trainer stops with when the plug-in did not import."""
    return (
        f"trainer.v1.trainer_mode={NAME}: regroup's verl plug-in failed to import ({cause}); "
        f"`python -c 'import {PLUGIN}'` shows where"
    )


def load() -> str | None:
    """Import the plug-in; on failure log the cause at WARNING, register the stand-in trainer and return the
    cause (also kept in `IMPORT_ERROR`). None when the plug-in imported."""
    global IMPORT_ERROR
    try:
        importlib.import_module(PLUGIN)
    except Exception as exc:  # any failure: verl would swallow it (at DEBUG)
        IMPORT_ERROR = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        log.warning(
            "regroup's verl plug-in (%s) failed to import: %s; trainer_mode=%s is unavailable",
            PLUGIN,
            IMPORT_ERROR,
            NAME,
        )
        _register_stand_in(IMPORT_ERROR)
        return IMPORT_ERROR
    IMPORT_ERROR = None
    return None


def _register_stand_in(cause: str) -> None:
    """Register a `regroup` trainer with verl that fails, when built, with `failure_line(cause)`."""
    try:
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, PPOTrainer, register_trainer  # verl: optional
    except Exception as exc:  # verl's trainer does not import: its get_trainer_cls fails with that error itself
        log.debug("no stand-in trainer %r: verl's trainer module does not import (%s)", NAME, exc)
        return
    if NAME in TRAINER_REGISTRY:  # the plug-in got as far as registering its trainer before it failed
        return
    line = failure_line(cause)

    class RegroupPluginUnavailable(PPOTrainer):
        """Stands in for regroup's trainer, whose module did not import."""

        def __new__(cls, *args, **kwargs):  # before ABC's check of PPOTrainer's abstract methods
            raise PluginImportError(line)

    register_trainer(NAME)(RegroupPluginUnavailable)


load()
