"""The report's sentences: what the numbers show, and no more.

A change is called better or worse only when it exceeds 2 standard errors; otherwise the text says
"no clear difference" and, for a variant against the baseline, that it does not beat the baseline.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import regroup.report.stats as stats


def pct(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage string ("56.6"), or "—" when missing."""
    return "—" if value is None else f"{100 * value:.{digits}f}"


def pts(delta: float, se: float | None) -> str:
    """A change in percentage points with its ±2·SE half-width ("+9.9 ± 3.2 pts")."""
    if se is None:
        return f"{100 * delta:+.1f} pts"
    return f"{100 * delta:+.1f} ± {200 * se:.1f} pts"


def mean_at(row: dict[str, Any]) -> str:
    """The name of the row's average-accuracy metric, e.g. "mean@8"."""
    n = row.get("n") or row.get("start_n")
    return f"mean@{n}" if n else "mean@n"


def findings(rows: Sequence[dict[str, Any]], baseline: str | None) -> list[str]:
    """Plain-text statements about the results, each backed by a number in the table."""
    out: list[str] = []
    base = next((r for r in rows if r["is_baseline"]), None)
    if baseline is not None and base is None:
        out.append(
            f"No run of the baseline recipe '{baseline}' was given, so no change against a baseline is reported."
        )
    out += eval_set_warnings(rows)  # first: they say which comparisons below are left out, and why
    evaluated = [r for r in rows if r.get("mean@n") is not None]
    # Headline first: each variant against the baseline, then each recipe against its starting model.
    for r in evaluated:
        if base is None or r is base or r.get("delta_baseline") is None:
            continue
        label, metric = r["label"], mean_at(r)
        b, d, se, v = base["label"], r["delta_baseline"], r["delta_baseline_se"], r["verdict_baseline"]
        if v == stats.BETTER:
            out.append(f"{label} beats {b}: {metric} {pts(d, se)} (more than 2 SE).")
        elif v == stats.WORSE:
            out.append(f"{label} is worse than {b}: {metric} {pts(d, se)}; it does not beat {b}.")
        elif v == stats.UNCLEAR:
            out.append(
                f"{label} vs {b}: {metric} {pts(d, se)} — no clear difference (within 2 SE); "
                f"{label} does not beat {b} on this evidence."
            )
        else:
            out.append(
                f"{label} vs {b}: {metric} {pts(d, None)}, but no standard error is available, so no claim either way."
            )
    for r in evaluated:
        if r.get("delta_start") is None:
            continue
        label, metric = r["label"], mean_at(r)
        change = (
            f"{metric} {pct(r['start_mean@n'])}% → {pct(r['mean@n'])}% ({pts(r['delta_start'], r['delta_start_se'])})"
        )
        out.append(
            {
                stats.BETTER: f"{label} improved on the starting model: {change}.",
                stats.WORSE: f"{label} is worse than the starting model: {change}.",
                stats.UNCLEAR: f"{label}: no clear difference from the starting model (within 2 SE): {change}.",
                stats.NO_SE: f"{label} vs the starting model: {change}; no standard error is available, "
                f"so no claim either way.",
            }[r["verdict_start"]]
        )
    for r in rows:
        if r.get("mean@n") is None:
            out.append(f"{r['label']}: no eval/summary.json, so no accuracy is reported for it; {eval_command(r)}")
    if rows and all(r["num_runs"] == 1 for r in rows):
        out.append(
            "Each recipe ran once (one seed): seed-to-seed variation is not measured, so the ± figures "
            "cover only the sampling noise of the evaluation."
        )
    for r in rows:
        if r["num_runs"] > 1:
            seeds = ", ".join(str(s) for s in r["seeds"])
            out.append(
                f"{r['label']}: mean over {r['num_runs']} runs (seeds {seeds}); 'sd' is the standard "
                f"deviation over them."
            )
        if r["num_evaluated"] and r["num_evaluated"] < r["num_runs"]:
            out.append(
                f"{r['label']}: only {r['num_evaluated']} of {r['num_runs']} runs have an evaluation; "
                f"accuracy averages those."
            )
        if r.get("skipped_nonfinite"):
            out.append(
                f"{r['label']}: {r['skipped_nonfinite']:g} update(s) skipped for non-finite values (skipped_nonfinite)."
            )
        if r.get("bad_metric_lines"):
            out.append(f"{r['label']}: {r['bad_metric_lines']} unreadable line(s) in metrics.jsonl were ignored.")
    return out


def eval_command(row: dict[str, Any]) -> str:
    """The commands that write the evaluation a row lacks, for its first run folder and newest checkpoint."""
    run = (row.get("run_dirs") or ["RUN"])[0]
    folder = os.path.join(run, "checkpoints")
    saved = sorted(
        (int(name[len("step-") :]), name)
        for name in (os.listdir(folder) if os.path.isdir(folder) else ())
        if name.startswith("step-") and name[len("step-") :].isdigit()
    )
    model = os.path.join(folder, saved[-1][1] if saved else "step-N")
    return (
        f"`regroup eval --model {model} --data FILE --out {os.path.join(run, 'eval')}` writes it "
        "(FILE for the built-in task: `regroup data prepare arithmetic_heldout --out FILE`)."
    )


def eval_set_warnings(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence for each comparison left out because the two sides were evaluated on different sets."""
    out = []
    base = next((r for r in rows if r["is_baseline"]), None)
    for r in rows:
        if r.get("eval_sets_mixed"):
            out.append(
                f"{r['label']}: its runs were evaluated on different sets ({'; '.join(r['eval_sets_mixed'])}): "
                "their mean mixes them, and no change is reported for it."
            )
        elif r.get("start_set_differs"):
            out.append(
                f"{r['label']}: its evaluation and its starting model's (eval_before/) used different sets, "
                "so no change from the start is reported."
            )
        if r.get("baseline_set_differs") and base is not None:
            out.append(
                f"{r['label']} and {base['label']} were evaluated on different sets ({r['eval_set']} against "
                f"{base['eval_set']}{', or other problems' if r['eval_set'] == base['eval_set'] else ''}), so they "
                "are not compared; evaluate both on the same problems and samples."
            )
    return out


def format_value(value: Any) -> str:
    """A config value for the diff: JSON-like, short."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "null"
    return str(value)


def wall_time(seconds: float | None) -> str:
    """Seconds as "12.3 s", "4 min 30 s" or "1 h 02 min"; "—" when unknown."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def table_ks(rows: Sequence[dict[str, Any]]) -> list[int]:
    """The pass@k columns of the results table: all k if at most three, else 1 and the two largest."""
    ks = sorted({k for r in rows for k in (r.get("ks") or [])})
    if len(ks) <= 3:
        return ks
    return sorted({ks[0], *ks[-2:]})
