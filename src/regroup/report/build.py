"""`build_report`: run folders in, `report.html` + `report.md` + `plots/*.png` out."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable, Sequence

from regroup.io import write_atomic
from regroup.report.plots import assign_colors, make_plots
from regroup.report.render import render_html, render_markdown
from regroup.report.runs import group_runs, load_run
from regroup.report.summary import summarize_groups
from regroup.report.text import eval_set_warnings, findings


def build_report(
    run_dirs: Sequence[str],
    out_dir: str,
    *,
    title: str = "regroup report",
    baseline: str | None = "grpo",
    notes: Sequence[str] = (),
    warn: Callable[[str], None] | None = None,
) -> tuple[str, str]:
    """Write a report comparing the given run folders; return (html_path, md_path).

    Runs of one recipe with different seeds become one row (mean and std over seeds). `baseline` is
    the recipe every other one is compared with (None: no baseline comparison). Runs evaluated on different
    sets are not compared; each comparison left out is said on the page and through `warn`. `notes` are shown
    first, above the findings (the quick demo says it is a smoke run). Only config.yaml, metrics.jsonl, eval/
    and eval_before/ of each run are read.
    """
    if not run_dirs:
        raise ValueError("build_report needs at least one run folder")
    runs = [load_run(d) for d in run_dirs]
    groups = group_runs(runs, baseline)
    rows = summarize_groups(groups, baseline)
    colors = assign_colors([g.label for g in groups])
    os.makedirs(out_dir, exist_ok=True)
    outcomes = make_plots(groups, rows, os.path.join(out_dir, "plots"), colors)
    found = findings(rows, baseline)
    if warn is not None:
        for line in eval_set_warnings(rows):
            warn(line)
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dirs = [str(d) for d in run_dirs]
    html_path = os.path.join(out_dir, "report.html")
    md_path = os.path.join(out_dir, "report.md")
    write_atomic(html_path, render_html(title, rows, outcomes, found, colors, generated, dirs, notes))
    write_atomic(md_path, render_markdown(title, rows, outcomes, found, generated, dirs, notes))
    return html_path, md_path
