"""The package's structure: its packages and the import rules between them.

- every module imports on its own, first, in a fresh interpreter state (regroup's modules are dropped from
  sys.modules before each one; torch & co. stay loaded to keep it fast);
- no import cycle between modules, nor between packages, counting the imports inside functions;
- `config/schema.py` is a leaf: it imports only `config.fields`, `errors` and `registry`;
- the package root holds only the modules of ROOT_MODULES;
- every package's `__init__` says what lives there.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import importlib, pkgutil, sys
import regroup
names = sorted(m.name for m in pkgutil.walk_packages(regroup.__path__, "regroup.") if not m.name.endswith("__main__"))
# module -> the optional packages it needs (the verl plug-in: verl and what verl's trainer brings)
optional = {
    "regroup.integrations.trl": ("trl",),
    "regroup.rollout.vllm": ("vllm",),
    "regroup.integrations.verl": ("verl", "transfer_queue", "tensordict", "omegaconf"),
}
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "regroup" or m.startswith("regroup.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in optional.get(name, ()):
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


# -- cycles, counting the imports inside functions -----------------------------------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1] / "src" / "regroup"

KNOWN_CYCLES: list[set[str]] = []  # none left: every cycle, counting function-level imports, fails
UNTANGLED = [
    "regroup.config.schema",
    "regroup.errors",
    "regroup.config.registry",
    "regroup.train.recipes",
    "regroup.runtime.metrics",
    "regroup.net.redact",
    "regroup.rewards",
    "regroup.rewards.math_verify",
    "regroup.scorers.registry",
    "regroup.rephrase.registry",
    "regroup.rephrase.run",
    "regroup.tasks",
    "regroup.stages",
    "regroup.stages.user",
]
"""Modules that must be on no cycle at all, whatever the import's place in the file."""


def import_graph(root=ROOT) -> dict[str, set[str]]:
    """regroup module -> the regroup modules it imports anywhere in its file (top level or in a function)."""
    import ast

    files = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def owner(name: str) -> str | None:  # `regroup.a.b.func` -> the module `regroup.a.b`
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[name] = {m for m in map(owner, targets) if m and m != name and m.startswith("regroup")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_by_hand():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_imports_inside_functions(tmp_path):
    pkg = tmp_path / "regroup"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from regroup.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from regroup import a\n    return a\n")
    assert cycles(import_graph(pkg)) == [{"regroup.a", "regroup.b"}]


def _imports(path):
    """(module, imported name or None) of every import statement in a file, function-level ones included."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def test_the_library_never_imports_the_studies():
    """The study harness lives beside the package (studies/, like verl's recipe/): src/regroup reads, installs
    and imports without it, and its demo is the only experiment left inside."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "regroup"
    reaching = sorted(
        str(f.relative_to(src)) for f in src.rglob("*.py") if any(m.split(".")[0] == "studies" for m, _ in _imports(f))
    )
    assert reaching == [], reaching
    assert sorted(p.name for p in (src / "experiments").glob("*.py")) == ["__init__.py", "demo.py"]


def test_no_module_imports_another_packages_private_name():
    """A leading underscore means "this package's own": another package goes through a public name."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "regroup"
    found = []
    for f in src.rglob("*.py"):
        parts = f.relative_to(src).parts
        own = parts[0] if len(parts) > 1 else None  # a top-level module is its own package
        for module, name in _imports(f):
            path = module.split(".") + ([name] if name else [])
            if path[0] != "regroup" or len(path) < 2 or path[1] == own:
                continue
            if any(p.startswith("_") and not p.startswith("__") for p in path[1:]):
                found.append(f"{'/'.join(parts)}: {'.'.join(path)}")
    assert sorted(found) == [], found


def test_the_studies_use_regroups_public_names_only():
    from pathlib import Path

    studies = Path(__file__).resolve().parents[1] / "studies"
    private = sorted(
        f"{f.name}: {module}.{name}"
        for f in studies.glob("*.py")
        for module, name in _imports(f)
        if module.startswith("regroup") and (name or "").startswith("_") or "._" in module
    )
    assert private == [], private


def test_no_new_import_cycle_counting_function_level_imports():
    found = cycles(import_graph())
    assert [c for c in found if c not in KNOWN_CYCLES] == [], "new import cycles"
    on_a_cycle = sorted(m for c in found for m in c if m in UNTANGLED)
    assert on_a_cycle == [], on_a_cycle


def function_level_imports(root=ROOT) -> list[tuple[str, int, str, bool]]:
    """(file, line, statement, has a comment) for every import inside a function of the package."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for func in [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    line = lines[node.lineno - 1]
                    found.append((str(path.relative_to(root)), node.lineno, line.strip(), "#" in line))
    return sorted(set(found))


def test_every_import_inside_a_function_says_why():
    """Function-level imports are kept for optional or heavy dependencies only, each with its reason on its line
    (the rest sit at the top of their module, where the cycle check sees them too)."""
    silent = [f"{f}:{n}: {s}" for f, n, s, commented in function_level_imports() if not commented]
    assert silent == [], "\n".join(silent)


# -- packages -----------------------------------------------------------------------------------------------

ROOT_MODULES = {"__init__", "__main__", "cli", "errors", "io", "batch"}
"""The only modules of `src/regroup/` itself: the command line (cli) and what every package may import."""
CONFIG_LEAF_MAY_IMPORT = {"regroup.config", "regroup.config.fields", "regroup.errors", "regroup.config.registry"}


def test_config_schema_is_a_leaf():
    graph = import_graph()
    assert graph["regroup.config.schema"] <= CONFIG_LEAF_MAY_IMPORT, sorted(graph["regroup.config.schema"])
    assert graph["regroup.config.fields"] <= {"regroup.errors", "regroup.io", "regroup.config.registry"}, sorted(
        graph["regroup.config.fields"]
    )


def test_the_package_root_holds_only_its_listed_modules():
    loose = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ROOT_MODULES)
    assert loose == [], f"modules at the package root that belong in a package: {loose}"


def package_of(module: str) -> str:
    """`regroup.train.trainer` -> `regroup.train`; a module of the package root counts as a package of its own."""
    return ".".join(module.split(".")[:2])


def test_no_cycle_between_packages():
    """With each package drawn as one node, the import graph still has no cycle: a package never imports one
    that imports it back, whatever the modules involved."""
    packages: dict[str, set[str]] = {}
    for module, deps in import_graph().items():
        packages.setdefault(package_of(module), set()).update(
            package_of(d) for d in deps if package_of(d) != package_of(module)
        )
    assert cycles(packages) == []


def test_every_package_says_what_lives_there():
    bare = sorted(
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("__init__.py")
        if not __import__("ast").get_docstring(__import__("ast").parse(p.read_text(encoding="utf-8")))
    )
    assert bare == [], f"packages whose __init__ has no docstring: {bare}"


# -- the run config's type -----------------------------------------------------------------------------------


def untyped_cfg(root=ROOT) -> list[str]:
    """`file:line cfg: annotation` of every function parameter and annotated class field named `cfg` whose
    annotation is missing, `object` or `Any` (a run config without its type), in `root`."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # a lambda's type comes from its context
                a = node.args
                named = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]
                typed = [(arg.arg, arg.annotation, arg.lineno) for arg in named]
            elif isinstance(node, ast.ClassDef):
                typed = [
                    (s.target.id, s.annotation, s.lineno)
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                ]
            else:
                continue
            for name, annotation, line in typed:
                text = ast.unparse(annotation).strip("'\"") if annotation is not None else None
                if name == "cfg" and text in (None, "object", "Any", "typing.Any"):
                    found.append((rel, line, text))
    return [f"{rel}:{line} cfg: {text}" for rel, line, text in sorted(found)]


def test_the_untyped_cfg_finder_by_hand(tmp_path):
    (tmp_path / "a.py").write_text(
        "from typing import Any\n"
        "def f(cfg, x): ...\n"
        "def g(x, *, cfg: Any): ...\n"
        "def h(cfg: RunConfig): ...\n"
        "class P:\n    cfg: object\n    other: object\n"
        "class Q:\n    cfg: 'RunConfig'\n"
    )
    assert untyped_cfg(tmp_path) == ["a.py:2 cfg: None", "a.py:3 cfg: Any", "a.py:6 cfg: object"]


def test_every_run_config_parameter_is_typed():
    """A parameter or field named `cfg` holds the run config and says so: `RunConfig`, from
    `regroup.config.schema`, a leaf that any module may import without a cycle."""
    untyped = untyped_cfg()
    assert untyped == [], "\n".join(untyped)
