"""Reading run folders (config.yaml, metrics.jsonl, eval summaries) and grouping seeds of one recipe.

A run folder is what the trainer writes; the report reads only these files, never terminal output:
`config.yaml` (resolved config, top-level `recipe` and `seed`), `metrics.jsonl` (one JSON object per
step), `eval/summary.json` and `eval_before/summary.json` (see `regroup.eval.runner`), and, where a study
evaluated several checkpoints, `eval_step<N>/` (one evaluation folder per step N; step 0: the start).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from regroup.runtime.metrics import read_metrics_file, warn_bad_lines
from regroup.runtime.rundir import flatten, read_saved_config

# Config keys that identify a run or only change bookkeeping: they are left out of the config diff
# and do not split runs of one recipe into separate rows (seeds of one recipe are aggregated). Older runs'
# config.yaml may still hold the removed train.tensorboard / train.wandb switches.
BOOKKEEPING_KEYS = frozenset(
    {
        "recipe",
        "seed",
        "run_dir",
        "train.progress",
        "train.report_to",
        "train.tensorboard",
        "train.wandb",
        "train.threads",
        "train.checkpoint_every",
        "train.keep_checkpoints",
    }
)


@dataclass
class RunData:
    """Everything the report uses from one run folder."""

    path: str
    name: str
    """The folder's base name; in a report, as many of its parent folders as it takes to tell it from the other
    runs of the report (`group_runs`: two demos' `grpo-s0` become `demo-A/grpo-s0` and `demo-B/grpo-s0`)."""
    config: dict[str, Any]
    flat_config: dict[str, Any]
    """`config` flattened to dotted keys ("optim.lr")."""
    recipe: str
    seed: Any
    metrics: list[dict[str, Any]]
    """Step records in file order."""
    bad_metric_lines: int = 0
    """Lines of metrics.jsonl that were not a JSON object (e.g. a half-written last line after a crash)."""
    eval: dict[str, Any] | None = None
    eval_before: dict[str, Any] | None = None
    per_problem: dict[str, float] | None = None
    """Per-problem accuracy (correct / n) by problem id from eval/per_problem.jsonl, when present."""
    per_problem_before: dict[str, float] | None = None
    """The same for the starting model (eval_before/per_problem.jsonl)."""
    checkpoint_evals: dict[int, float] = field(default_factory=dict)
    """step -> pass@1 (mean@n) of each evaluated checkpoint (`eval_step<N>/` folders): the learning curve."""


def read_per_problem(path: str) -> dict[str, float] | None:
    """{problem id: correct / n} from a per_problem.jsonl written by the evaluation, or None."""
    if not os.path.exists(path):
        return None
    out: dict[str, float] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
                out[str(row["id"])] = float(row["correct"]) / float(row["n"])
            except (ValueError, KeyError, TypeError, ZeroDivisionError):
                return None  # an unreadable file gives no pairing rather than a wrong one
    return out or None


@dataclass
class RunGroup:
    """Runs of one recipe with the same settings apart from their seed: one table row, one colour."""

    label: str
    recipe: str
    runs: list[RunData] = field(default_factory=list)


def _read_json(path: str) -> dict[str, Any] | None:
    """A JSON object from `path`, or None when the file is absent."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, found {type(data).__name__}")
    return data


def read_metrics(path: str) -> tuple[list[dict[str, Any]], int]:
    """Step records of a metrics.jsonl and the count of unreadable lines (absent file: no records).

    A line that is not a JSON object with an integer `step` (half a line after a crash, a bad byte, a
    hand edit) is skipped with one warning naming the file and the line; the rest of the file is used.
    """
    records, bad = read_metrics_file(path)
    warn_bad_lines(path, bad)
    return records, len(bad)


def load_run(path: str) -> RunData:
    """Read one run folder; config.yaml is required, everything else is optional."""
    cfg_path = os.path.join(path, "config.yaml")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"run folder not found: {path}")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"not a run folder: {path} has no config.yaml")
    config = read_saved_config(cfg_path)  # invalid YAML or not a mapping: a ConfigError naming the file
    recipe = config.get("recipe")
    if isinstance(recipe, dict):  # tolerate `recipe: {name: ...}`
        recipe = recipe.get("name")
    name = os.path.basename(os.path.normpath(path))
    metrics, bad = read_metrics(os.path.join(path, "metrics.jsonl"))
    return RunData(
        path=path,
        name=name,
        config=config,
        flat_config=flatten(config),
        recipe=str(recipe) if recipe is not None else name,
        seed=config.get("seed"),
        metrics=metrics,
        bad_metric_lines=bad,
        **dict(zip(("eval", "per_problem"), read_eval_dir(os.path.join(path, "eval")))),
        **dict(zip(("eval_before", "per_problem_before"), read_eval_dir(os.path.join(path, "eval_before")))),
        checkpoint_evals=read_checkpoint_evals(path),
    )


_EVAL_STEP = re.compile(r"^eval_step(\d+)$")


def read_checkpoint_evals(path: str) -> dict[int, float]:
    """step -> pass@1 (the summary's mean@n, else its pass@1) of every `eval_step<N>/` folder of a run."""
    out: dict[int, float] = {}
    for entry in sorted(os.listdir(path)):
        m = _EVAL_STEP.match(entry)
        if m is None or not os.path.isdir(os.path.join(path, entry)):
            continue
        summary, _ = read_eval_dir(os.path.join(path, entry))
        if summary is None:
            continue
        value = summary.get("mean@n")
        if not isinstance(value, (int, float)):
            value = (summary.get("pass@k") or {}).get("1", summary.get("pass@1"))
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[int(m.group(1))] = float(value)
    return dict(sorted(out.items()))


def samples_per_step(run: RunData) -> int | None:
    """On-policy samples a step draws (grpo.prompts_per_step × grpo.num_generations × grpo.samples_multiplier),
    None when the config does not say."""
    c = run.flat_config
    prompts, generations = c.get("grpo.prompts_per_step"), c.get("grpo.num_generations")
    if not isinstance(prompts, int) or not isinstance(generations, int):
        return None
    multiplier = c.get("grpo.samples_multiplier", 1)
    return prompts * generations * (multiplier if isinstance(multiplier, int) and multiplier > 0 else 1)


def read_eval_dir(folder: str) -> tuple[dict[str, Any] | None, dict[str, float] | None]:
    """(summary, per-problem accuracy) of an evaluation folder, in either layout:

    - the trainer's / demo's: `summary.json` is one set's summary, `per_problem.jsonl` beside it;
    - `regroup eval --out FOLDER`: `summary.json` is {"model", "settings", "rows"} with one folder per
      benchmark holding that benchmark's summary.json and per_problem.jsonl. One benchmark: its summary and
      per-problem results. Several: the "average" row (mean over benchmarks) and no per-problem pairing.
    """
    summary = _read_json(os.path.join(folder, "summary.json"))
    if summary is None or not isinstance(summary.get("rows"), list):
        return summary, read_per_problem(os.path.join(folder, "per_problem.jsonl"))
    benches = [r for r in summary["rows"] if isinstance(r, dict) and r.get("benchmark") != "average"]
    if len(benches) == 1 and isinstance(benches[0].get("benchmark"), str):
        bench_dir = os.path.join(folder, os.path.basename(benches[0]["benchmark"]))
        bench = _read_json(os.path.join(bench_dir, "summary.json"))
        if bench is not None:
            return bench, read_per_problem(os.path.join(bench_dir, "per_problem.jsonl"))
    average = next((r for r in summary["rows"] if isinstance(r, dict) and r.get("benchmark") == "average"), None)
    if average is None:
        return None, None
    ks = sorted(
        int(key[len("pass@") :]) for key in average if key.startswith("pass@") and key[len("pass@") :].isdigit()
    )
    return {
        "num_problems": average.get("num_problems"),
        "n": average.get("n"),
        "mean@n": average.get("mean@n"),
        "stderr": average.get("stderr"),
        "greedy": average.get("greedy"),
        "pass@k": {str(k): average[f"pass@{k}"] for k in ks if average.get(f"pass@{k}") is not None},
    }, None


def _settings_key(run: RunData) -> str:
    """The run's config without bookkeeping keys, as a canonical string (equal for seeds of one setting)."""
    kept = {k: v for k, v in run.flat_config.items() if k not in BOOKKEEPING_KEYS}
    return json.dumps(kept, sort_keys=True, default=str)


def distinct_names(paths: list[str]) -> list[str]:
    """For each path, its shortest tail of folders (`grpo-s0`, `demo-A/grpo-s0`, ...) that no other path
    shares; a path given twice keeps its full tail."""
    parts = [os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths]
    names = []
    for i, mine in enumerate(parts):
        for depth in range(1, len(mine) + 1):
            tail = mine[-depth:]
            if all(other[-depth:] != tail for j, other in enumerate(parts) if j != i and other != mine):
                break
        names.append("/".join(p for p in tail if p))
    return names


def group_runs(runs: list[RunData], baseline: str | None = None) -> list[RunGroup]:
    """Group runs by (recipe, non-bookkeeping settings); baseline recipe first, then first-seen order.

    Runs are first named apart (`distinct_names`). Two groups of one recipe (e.g. an lr sweep) get their run
    folder names in their labels.
    """
    for run, name in zip(runs, distinct_names([r.path for r in runs])):
        run.name = name
    groups: dict[tuple[str, str], RunGroup] = {}
    for run in runs:
        key = (run.recipe, _settings_key(run))
        groups.setdefault(key, RunGroup(label=run.recipe, recipe=run.recipe)).runs.append(run)
    ordered = list(groups.values())
    per_recipe: dict[str, int] = {}
    for g in ordered:
        per_recipe[g.recipe] = per_recipe.get(g.recipe, 0) + 1
    for g in ordered:
        if per_recipe[g.recipe] > 1:
            g.label = f"{g.recipe} [{', '.join(r.name for r in g.runs)}]"
    ordered.sort(key=lambda g: 0 if baseline is not None and g.recipe == baseline else 1)
    return ordered


@dataclass(frozen=True)
class EvalSet:
    """What an evaluation was run on: its problem count, samples per problem and, when its per-problem
    results are there, the problem ids. Accuracies on different sets are not compared."""

    num_problems: Any
    n: Any
    ids: frozenset[str] | None = None

    def same_as(self, other: EvalSet) -> bool:
        if (self.num_problems, self.n) != (other.num_problems, other.n):
            return False
        return self.ids is None or other.ids is None or self.ids == other.ids

    def describe(self) -> str:
        return f"{self.num_problems} problems × {self.n} samples"


def eval_set(summary: dict[str, Any] | None, per_problem: dict[str, float] | None) -> EvalSet | None:
    """The EvalSet of an evaluation summary (None: no evaluation)."""
    if summary is None:
        return None
    return EvalSet(summary.get("num_problems"), summary.get("n"), frozenset(per_problem) if per_problem else None)


def _same(a: Any, b: Any) -> bool:
    """Equality that treats two NaNs as equal and 1 == 1.0."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


MISSING = object()


def config_diff(base: dict[str, Any], other: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, base value, other value) for every dotted key whose value differs (MISSING if absent),
    bookkeeping keys excluded, sorted by key."""
    out = []
    for key in sorted(set(base) | set(other)):
        if key in BOOKKEEPING_KEYS:
            continue
        a, b = base.get(key, MISSING), other.get(key, MISSING)
        if not _same(a, b):
            out.append((key, a, b))
    return out
