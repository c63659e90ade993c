"""The project's user-error type, in a leaf module so that any module can raise it without importing the
config (which imports most of the package's piece registries)."""


class ConfigError(ValueError):
    """A configuration problem, found before any compute; the message names the dotted key."""


def import_hint(exc: ImportError, module_name: str) -> str:
    """What to add to "No module named X" when X is the module a config names (`X:obj`), not one it imports:
    the installed `regroup` command does not put the current folder on Python's import path (`python -m`
    does), so a module sitting beside the user is not found unless PYTHONPATH names its folder."""
    import os  # only to word this hint
    import sys  # only to word this hint

    missing = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not missing or module_name.split(".")[0] != missing.split(".")[0]:
        return ""
    top = missing.split(".")[0]
    here = os.getcwd()
    on_path = any(os.path.abspath(p or os.curdir) == here for p in sys.path)
    if not on_path and (os.path.isfile(f"{top}.py") or os.path.isdir(top)):
        return (
            f"; {top} is in the current folder, which is not on Python's import path: "
            "run with PYTHONPATH=. (e.g. PYTHONPATH=. regroup train ...)"
        )
    return "; a module of your own must be importable: put the folder that holds it on PYTHONPATH"
