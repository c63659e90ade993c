"""One summary row per recipe (seeds aggregated): accuracy, change vs the start and vs the baseline."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import regroup.report.stats as stats
from regroup.report.runs import MISSING, EvalSet, RunData, RunGroup, config_diff, eval_set, group_runs, load_run


def _finite(value: Any) -> bool:
    """Whether a metric value is a finite number (not None, NaN, inf, or a string)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def wall_time_s(run: RunData) -> float | None:
    """Training wall time of a run: the sum of its logged `time/step` (None if never logged)."""
    times = [m["time/step"] for m in run.metrics if _finite(m.get("time/step"))]
    return float(sum(times)) if times else None


def last_step(run: RunData) -> int | None:
    """The largest `step` in a run's metrics (None with no metrics)."""
    steps = [m["step"] for m in run.metrics if _finite(m.get("step"))]
    return int(max(steps)) if steps else None


def _common_ks(summaries: Sequence[dict[str, Any]]) -> list[int]:
    """The k values whose pass@k every summary has, sorted."""
    sets = [{int(k) for k in (s.get("pass@k") or {})} for s in summaries]
    return sorted(set.intersection(*sets)) if sets else []


def _eval_block(summaries: Sequence[dict[str, Any]], prefix: str = "") -> dict[str, Any]:
    """Means (and std over runs) of the eval summaries of several runs of one setting."""
    out: dict[str, Any] = {}
    if not summaries:
        return out
    ks = _common_ks(summaries)
    out[prefix + "ks"] = ks
    out[prefix + "pass@k"] = {k: stats.mean([float(s["pass@k"][str(k)]) for s in summaries]) for k in ks}
    out[prefix + "pass@k_std"] = {k: stats.std([float(s["pass@k"][str(k)]) for s in summaries]) for k in ks}
    means = [float(s["mean@n"]) for s in summaries if s.get("mean@n") is not None]
    if len(means) == len(summaries):
        out[prefix + "mean@n"] = stats.mean(means)
        out[prefix + "mean@n_std"] = stats.std(means)
        out[prefix + "stderr"] = stats.group_stderr(means, [s.get("stderr") for s in summaries])
    greedy = [s.get("greedy") for s in summaries]
    if all(g is not None for g in greedy):
        out[prefix + "greedy"] = stats.mean([float(g) for g in greedy])  # type: ignore[arg-type]
        out[prefix + "greedy_std"] = stats.std([float(g) for g in greedy])  # type: ignore[arg-type]
    ns = {s.get("n") for s in summaries}
    out[prefix + "n"] = ns.pop() if len(ns) == 1 else None
    by: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for s in summaries:
        for d, row in (s.get("by_difficulty") or {}).items():
            if row.get("mean@n") is not None:
                by.setdefault(str(d), []).append(float(row["mean@n"]))
                counts[str(d)] = int(row.get("count", 0))
    out[prefix + "by_difficulty"] = {d: stats.mean(v) for d, v in by.items()}
    out[prefix + "by_difficulty_count"] = counts
    return out


def _jsonable(value: Any) -> Any:
    """A config value for the diff, with a key absent on one side shown as "(absent)"."""
    return "(absent)" if value is MISSING else value


def summarize_groups(groups: Sequence[RunGroup], baseline: str | None = "grpo") -> list[dict[str, Any]]:
    """Summary rows of already-loaded run groups (see `summarize_runs`)."""
    base_group = next((g for g in groups if baseline is not None and g.recipe == baseline), None)
    diff_ref = base_group or (groups[0] if groups else None)
    rows: list[dict[str, Any]] = []
    first_set: dict[str, EvalSet | None] = {}  # by label: the set each row's accuracy was measured on
    for g in groups:
        evaluated = [r for r in g.runs if r.eval is not None]
        befores = [r.eval_before for r in g.runs if r.eval_before is not None]
        walls = [w for w in (wall_time_s(r) for r in g.runs) if w is not None]
        steps = [s for s in (last_step(r) for r in g.runs) if s is not None]
        row: dict[str, Any] = {
            "label": g.label,
            "recipe": g.recipe,
            "is_baseline": g is base_group,
            "run_dirs": [r.path for r in g.runs],
            "runs": [r.name for r in g.runs],
            "seeds": [r.seed for r in g.runs],
            "num_runs": len(g.runs),
            "num_evaluated": len(evaluated),
            "steps": max(steps) if steps else None,
            "wall_time_s": stats.mean(walls) if len(walls) == len(g.runs) else None,
            "bad_metric_lines": sum(r.bad_metric_lines for r in g.runs),
            "skipped_nonfinite": sum(
                float(m["skipped_nonfinite"]) for r in g.runs for m in r.metrics if _finite(m.get("skipped_nonfinite"))
            ),
            "diff_against": diff_ref.label if diff_ref is not None and g is not diff_ref else None,
            "config_diff": (
                [
                    (k, _jsonable(a), _jsonable(b))
                    for k, a, b in config_diff(diff_ref.runs[0].flat_config, g.runs[0].flat_config)
                ]
                if diff_ref is not None and g is not diff_ref
                else []
            ),
        }
        sets = _eval_sets(evaluated)
        first_set[g.label] = sets[0] if sets else None
        row["eval_set"] = sets[0].describe() if sets else None
        row["eval_sets_mixed"] = [s.describe() for s in sets] if len(sets) > 1 else None
        row["start_set_differs"] = any(_start_differs(r) for r in evaluated)
        row.update(_eval_block([r.eval for r in evaluated]))  # type: ignore[misc]
        for k, v in (row.get("pass@k") or {}).items():
            row[f"pass@{k}"] = v
        row.update(_eval_block(befores, prefix="start_"))
        mean_now, mean_start = row.get("mean@n"), row.get("start_mean@n")
        comparable = not row["eval_sets_mixed"] and not row["start_set_differs"]
        row["delta_start"] = (
            mean_now - mean_start if mean_now is not None and mean_start is not None and comparable else None
        )
        paired = (
            stats.paired_diff_stderr(g.runs[0].per_problem, g.runs[0].per_problem_before) if len(g.runs) == 1 else None
        )
        row["delta_start_se"] = (
            (paired if paired is not None else stats.diff_stderr(row.get("stderr"), row.get("start_stderr")))
            if row["delta_start"] is not None
            else None
        )
        row["delta_start_paired"] = paired is not None
        row["verdict_start"] = stats.verdict(row["delta_start"], row["delta_start_se"])
        rows.append(row)

    base_row = next((r for r in rows if r["is_baseline"]), None)
    groups_by_label = {g.label: g for g in groups}
    for row in rows:
        mine, theirs = first_set[row["label"]], first_set[base_row["label"]] if base_row is not None else None
        row["baseline_set_differs"] = bool(
            row is not base_row
            and mine is not None
            and theirs is not None
            and base_row is not None
            and (row["eval_sets_mixed"] or base_row["eval_sets_mixed"] or not mine.same_as(theirs))
        )
        if (
            base_row is None
            or row is base_row
            or row.get("mean@n") is None
            or base_row.get("mean@n") is None
            or row["baseline_set_differs"]  # accuracies on different problems are not compared
        ):
            row["delta_baseline"] = row["delta_baseline_se"] = row["verdict_baseline"] = None
            continue
        row["delta_baseline"] = row["mean@n"] - base_row["mean@n"]
        paired = None
        if row["num_runs"] == 1 and base_row["num_runs"] == 1:
            paired = stats.paired_diff_stderr(
                groups_by_label[row["label"]].runs[0].per_problem,
                groups_by_label[base_row["label"]].runs[0].per_problem,
            )
        row["delta_baseline_se"] = (
            paired if paired is not None else stats.diff_stderr(row.get("stderr"), base_row.get("stderr"))
        )
        row["delta_baseline_paired"] = paired is not None
        row["verdict_baseline"] = stats.verdict(row["delta_baseline"], row["delta_baseline_se"])
    return rows


def _eval_sets(runs: Sequence[RunData]) -> list[EvalSet]:
    """The distinct evaluation sets of the runs' eval/ (first seen first)."""
    out: list[EvalSet] = []
    for run in runs:
        found = eval_set(run.eval, run.per_problem)
        if found is not None and not any(found.same_as(s) for s in out):
            out.append(found)
    return out


def _start_differs(run: RunData) -> bool:
    """Whether a run's evaluation and its starting model's (eval_before/) were run on different sets."""
    now, start = eval_set(run.eval, run.per_problem), eval_set(run.eval_before, run.per_problem_before)
    return now is not None and start is not None and not now.same_as(start)


def summarize_runs(run_dirs: Sequence[str], *, baseline: str | None = "grpo") -> list[dict[str, Any]]:
    """One row per recipe setting (seeds of one recipe aggregated into mean and std over seeds).

    Each row has: label, recipe, is_baseline, runs, seeds, num_runs, steps, wall_time_s, ks,
    pass@k ({k: mean}) and flat `pass@<k>`, pass@k_std, mean@n, mean@n_std, stderr (SE of the
    row's mean@n, `stats.group_stderr`), greedy, by_difficulty; the same with a `start_` prefix
    from eval_before; delta_start / delta_start_se / verdict_start; delta_baseline /
    delta_baseline_se / verdict_baseline (vs the `baseline` recipe); config_diff [(key, base, this)]
    against the baseline's config (or the first run's when no baseline run is given).
    """
    runs = [load_run(d) for d in run_dirs]
    return summarize_groups(group_runs(runs, baseline), baseline)
