"""The report's figures: training curves per metric and evaluation plots, one colour per recipe.

Figures are built with `matplotlib.figure.Figure` directly (the Agg canvas, no pyplot global state),
so building a report never opens a window and is safe inside a training process.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from regroup.io import write_atomic
from regroup.report.runs import RunGroup, samples_per_step
from regroup.report.smoothing import ema
from regroup.report.stats import mean_band

# One colour per recipe, in table order; grey is kept for the starting model.
PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
    "#ad494a",
]  # 12: the study's 11 arms each get their own
START_COLOR = "#8a8a8a"
LINESTYLES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
"""Besides its colour, each recipe gets its own dash pattern and marker, and draws a little thinner than the
one before it: two recipes with the same curve (the quick demo's, or two that differ only where the metric
does not see it) still both show, where a solid line on top would hide the one below."""
DPI = 100


@dataclass
class PlotSpec:
    """A training-curve figure: one panel per metric key, drawn only for keys some run logged."""

    name: str
    title: str
    panels: list[tuple[str, str]]
    """(metric key, panel title); a key ending in "*" expands to every logged key with that prefix."""
    description: str
    logy: bool = False


@dataclass
class PlotOutcome:
    """A figure that was drawn (path set) or omitted (note set)."""

    name: str
    title: str
    section: str
    """"training" or "evaluation"."""
    description: str
    path: str | None = None
    """Path relative to the report folder, e.g. "plots/reward.png"."""
    note: str | None = None
    """Why the figure was omitted; for a drawn one, the logged values it could not draw (None: all drawn)."""
    keys: list[str] = field(default_factory=list)


TRAINING_PLOTS = [
    PlotSpec(
        "reward",
        "Reward",
        [("reward/mean", "mean reward")],
        "Mean verifiable reward of the sampled responses at each step.",
    ),
    PlotSpec(
        "heldout",
        "Held-out accuracy during training",
        [("eval/pass@*", "")],
        "pass@k on held-out questions every train.eval_every steps (data.eval_file or the task's held-out set).",
    ),
    PlotSpec(
        "answers",
        "Answers the checker could read",
        [("reward/extracted_frac", "answer extracted"), ("reward/timeout_frac", "grader timed out")],
        "Share of responses with an extractable final answer, and of checks that hit the time limit: a reward "
        "stuck at 0 with few extracted answers is a format problem, not a reasoning one.",
    ),
    PlotSpec(
        "dynamic_sampling",
        "Dynamic sampling",
        [("dynamic/informative_frac", "informative groups (of those sampled)"), ("dynamic/rounds", "extra rounds")],
        "DAPO dynamic sampling: the share of sampled groups with differing rewards, and the extra sampling "
        "rounds needed to fill the batch.",
    ),
    PlotSpec(
        "uniform_groups",
        "Uniform-reward groups",
        [
            ("groups/all_correct_frac", "all correct"),
            ("groups/all_wrong_frac", "all wrong"),
            ("groups/uniform_frac", "all equal (either)"),
        ],
        "Share of groups whose rewards are all equal; such groups have zero advantage and give no gradient.",
    ),
    PlotSpec(
        "masked",
        "Distinctiveness masking",
        [("mask/pos_frac", "positive-advantage samples"), ("mask/neg_frac", "negative-advantage samples")],
        "Masked fractions of positive- and negative-advantage samples (DaGRPO, SPEC §2a).",
    ),
    PlotSpec(
        "anchors",
        "Off-policy anchors",
        [
            ("anchor/count", "anchors per step"),
            ("anchor/adv_mean", "mean anchor advantage"),
            ("anchor/logp_mean", "anchor log-prob per token"),
        ],
        "Anchors (reference solutions) injected into groups, their advantage, and the policy's mean per-token "
        "log-probability of them (DaGRPO, SPEC §2b).",
    ),
    PlotSpec(
        "grad_conflict",
        "Gradient conflict",
        [("grad_conflict/cosine", "cos(positive, negative gradients)")],
        "Cosine between the gradients of the positive- and the negative-advantage samples' losses "
        "(−1 = directly opposed), every diagnostics.grad_conflict_every steps.",
    ),
    PlotSpec(
        "grad_norm",
        "Gradient norm",
        [("grad_norm", "gradient norm")],
        "Gradient norm per step, log scale: spikes show unstable updates.",
        logy=True,
    ),
    PlotSpec(
        "entropy",
        "Entropy",
        [("entropy", "mean token entropy")],
        "Mean per-token entropy of the policy on its own samples; a collapse toward 0 means less exploration.",
    ),
    PlotSpec(
        "length",
        "Response length",
        [("length/mean", "mean length (tokens)"), ("length/truncated_frac", "truncated fraction")],
        "Mean response length and the share of responses cut at max_new_tokens.",
    ),
    PlotSpec(
        "diversity",
        "Response diversity",
        [("diversity", "mean pairwise cosine distance")],
        "Mean pairwise cosine distance of response embeddings within a group (SPEC §3.6).",
    ),
    PlotSpec(
        "kl",
        "KL to the reference",
        [("kl", "KL (k3)")],
        "k3 KL estimate to the frozen reference model (logged only when β > 0).",
    ),
    PlotSpec(
        "variants",
        "Accuracy per rephrasing",
        [("variant/acc/*", "")],
        "Training accuracy on each rephrasing of the question (TA-GRPO; variant 0 is the original).",
    ),
]

EVAL_PLOTS = {"passk": "pass@k curves", "difficulty": "Accuracy by difficulty", "curves": "Learning curves"}


def _save(fig, out_path: str) -> None:
    """Render the figure to memory, then write it atomically (a full disk leaves no torn PNG)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    write_atomic(out_path, buffer.getvalue())


def assign_colors(labels: Sequence[str]) -> dict[str, str]:
    """A fixed colour per label, in order (cycling the palette if there are more labels than colours)."""
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}


@dataclass(frozen=True)
class LineStyle:
    """How one recipe's curves are drawn, besides its colour (see LINESTYLES)."""

    linestyle: str
    marker: str
    linewidth: float
    index: int
    """The recipe's place in the table: its markers sit at steps no other recipe's markers use."""


def assign_styles(labels: Sequence[str]) -> dict[str, LineStyle]:
    """A dash pattern, marker and width per label, in order; widths run from 2.6 down to 1.4."""
    count = len(labels)
    return {
        label: LineStyle(
            LINESTYLES[i % len(LINESTYLES)],
            MARKERS[i % len(MARKERS)],
            2.6 - 1.2 * i / max(1, count - 1),
            i,
        )
        for i, label in enumerate(labels)
    }


def _marks(style: LineStyle, points: int, curves: int) -> tuple[int, int]:
    """matplotlib's markevery (start, every): about 8 markers per curve, and no two curves' markers at one step."""
    every = max(curves, math.ceil(points / 8))
    return style.index % every, every


MAX_PLOTTABLE = 1e300
"""The largest magnitude a curve draws. matplotlib derives an axis from max − min, a margin around it and a tick
spacing, which overflow to inf (and fail the whole figure) for values near the float limit of 1.8e308; within
±1e300 all of these stay finite. A metric value or step beyond it (or NaN, ±inf) is left out of the plot and
named under it (`skipped_points`)."""


def _is_numeric(value: Any) -> bool:
    """An int or float (bool excluded), whatever its size."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[float]:
    """A number a plot can draw: an int/float (bool excluded), finite and within ±MAX_PLOTTABLE."""
    if not _is_numeric(value):
        return False
    try:
        return abs(float(value)) <= MAX_PLOTTABLE  # False for NaN
    except OverflowError:  # an int past the float range
        return False


def _step_of(rec: dict[str, Any], position: int) -> float | None:
    """The record's `step` as a float (its 1-based position in the file when it has none); None when the step
    is a number no axis can show."""
    step = rec.get("step")
    if _is_number(step):
        return float(step)
    return None if _is_numeric(step) else float(position)


def group_series(group: RunGroup, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of a metric for a group: at each step the mean over its runs (seeds) that
    logged a drawable value there (`_is_number`). Records without `step` use their 1-based position."""
    by_step: dict[float, list[float]] = {}
    for run in group.runs:
        for i, rec in enumerate(run.metrics):
            value, step = rec.get(key), _step_of(rec, i + 1)
            if _is_number(value) and step is not None:
                by_step.setdefault(step, []).append(float(value))
    steps = sorted(by_step)
    return steps, [sum(by_step[s]) / len(by_step[s]) for s in steps]


def skipped_points(groups: Sequence[RunGroup], keys: Sequence[str]) -> list[str]:
    """One description per logged number of `keys` that `group_series` leaves out ("run r1, step 2:
    reward/mean = 1e+308"): a non-finite value, one beyond ±MAX_PLOTTABLE, or any value at such a step."""
    out = []
    for g in groups:
        for run in g.runs:
            for i, rec in enumerate(run.metrics):
                step = _step_of(rec, i + 1)
                for key in keys:
                    value = rec.get(key)
                    if _is_numeric(value) and (step is None or not _is_number(value)):
                        out.append(f"run {run.name}, step {_show(rec.get('step', i + 1))}: {key} = {_show(value)}")
    return out


def _show(number: Any) -> str:
    """A number in at most 6 significant digits; an int past the float range by its digit count."""
    try:
        return f"{number:.6g}"
    except OverflowError:
        return f"an integer of about {int(int(number).bit_length() * math.log10(2)) + 1} digits"


SKIPPED_SHOWN = 5
"""Undrawable points named in a figure's note; more are counted."""


def skipped_note(title: str, skipped: Sequence[str]) -> str | None:
    """The note under a figure that left points out (None when it left none)."""
    if not skipped:
        return None
    shown = "; ".join(skipped[:SKIPPED_SHOWN])
    more = f"; and {len(skipped) - SKIPPED_SHOWN} more" if len(skipped) > SKIPPED_SHOWN else ""
    return (
        f"{title}: {len(skipped)} logged value(s) not drawn (NaN, ±inf, or beyond ±{MAX_PLOTTABLE:g}, where the "
        f"axis cannot be computed): {shown}{more}."
    )


def _expand_keys(spec: PlotSpec, groups: Sequence[RunGroup]) -> list[tuple[str, str]]:
    """The spec's panels with wildcard keys expanded to the logged keys they match (a key counts as logged when
    a run wrote a number for it, drawable or not: an undrawable one is named under the figure)."""
    logged: set[str] = set()
    for g in groups:
        for run in g.runs:
            for rec in run.metrics:
                logged.update(k for k, v in rec.items() if _is_numeric(v) and k != "step")
    panels = []
    for key, title in spec.panels:
        if key.endswith("*"):
            prefix = key[:-1]
            for k in sorted((k for k in logged if k.startswith(prefix)), key=_natural_key):
                panels.append((k, k[len(prefix) :] and f"variant {k[len(prefix) :]}"))
        elif key in logged:
            panels.append((key, title))
    return panels


def _natural_key(text: str) -> tuple:
    """Sort "variant/acc/10" after "variant/acc/2"."""
    tail = text.rsplit("/", 1)[-1]
    return (0, int(tail), text) if tail.isdigit() else (1, 0, text)


def _grid(num_panels: int) -> tuple[int, int]:
    """Rows and columns for a panel count (at most 3 per row)."""
    cols = min(3, num_panels)
    return math.ceil(num_panels / cols), cols


def _new_figure(rows: int, cols: int) -> tuple[Figure, list]:
    """A figure with rows×cols axes, sized so each panel is readable."""
    fig = Figure(figsize=(4.3 * cols, 3.0 * rows + 0.45), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, [ax for row in axes for ax in row]


def _style(ax) -> None:
    """Light grid, no top/right spines."""
    ax.grid(True, alpha=0.25, linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=8)


def label_step_axes(ax, ylabel: str) -> None:
    """x: "optimizer step" with integer ticks only (a step 2.5 does not exist); y: what is plotted."""
    ax.set_xlabel("optimizer step", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend(fig: Figure, handles: list, labels: list[str], max_cols: int = 5) -> None:
    """One legend above all panels, so every panel keeps its full width; rows wrap at `max_cols`, or
    sooner when the longest label would push a row past the figure's edge (11 study arms on a
    single-panel figure did)."""
    if handles:
        chars_per_row = fig.get_figwidth() * 72 / (9 * 0.6)  # ~0.6 em per character at fontsize 9
        per_label = max(len(label) for label in labels) + 5  # the line handle and the gap
        cols = max(1, min(len(labels), max_cols, int(chars_per_row // per_label)))
        fig.legend(handles, labels, loc="outside upper center", ncols=cols, fontsize=9, frameon=False)


def _training_plot(
    spec: PlotSpec, groups: Sequence[RunGroup], colors: dict[str, str], out_path: str
) -> list[str] | None:
    """Draw one training figure; return the metric keys drawn, or None when no run logged any."""
    drawn = training_figure(spec, groups, colors)
    if drawn is None:
        return None
    fig, keys = drawn
    _save(fig, out_path)
    return keys


def training_figure(
    spec: PlotSpec, groups: Sequence[RunGroup], colors: dict[str, str]
) -> tuple[Figure, list[str]] | None:
    """One training figure and the metric keys on it (None when no run logged any)."""
    panels = _expand_keys(spec, groups)
    if not panels:
        return None
    styles = assign_styles([g.label for g in groups])
    fig, axes = _new_figure(*_grid(len(panels)))
    handles: dict[str, Any] = {}
    for ax, (key, title) in zip(axes, panels):
        for g in groups:
            steps, values = group_series(g, key)
            if not steps:
                continue
            color, style = colors[g.label], styles[g.label]
            if spec.logy:
                values = [max(v, 1e-12) for v in values]  # a log axis cannot show 0
            if len(values) > 2:
                ax.plot(steps, values, color=color, alpha=0.22, linewidth=0.8, linestyle=style.linestyle)
                if spec.logy:
                    # Smooth in log space so one spike does not lift the whole curve.
                    smooth = [10**s for s in ema([math.log10(v) for v in values])]
                else:
                    smooth = ema(values)
                (line,) = ax.plot(
                    steps,
                    smooth,
                    color=color,
                    linewidth=style.linewidth,
                    linestyle=style.linestyle,
                    marker=style.marker,
                    markersize=4,
                    markevery=_marks(style, len(steps), len(groups)),
                )
            else:
                (line,) = ax.plot(
                    steps,
                    values,
                    color=color,
                    linewidth=style.linewidth,
                    linestyle=style.linestyle,
                    marker=style.marker,
                    markersize=7 - 3 * style.index / max(1, len(groups) - 1),  # the one below shows around it
                )
            handles.setdefault(g.label, line)
        if spec.logy:
            ax.set_yscale("log")
        ax.set_title(title or key, fontsize=10)
        label_step_axes(ax, title or key)
        _style(ax)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    # A single half-width panel has room for about three labels per row.
    _legend(fig, list(handles.values()), list(handles), max_cols=3 if len(panels) == 1 else 5)
    return fig, [k for k, _ in panels]


def _passk_plot(rows: Sequence[dict[str, Any]], colors: dict[str, str], out_path: str) -> bool:
    """pass@k against k (log₂ axis) per recipe, plus the starting model dashed; False if no data."""
    drawn = [r for r in rows if r.get("pass@k")]
    if not drawn:
        return False
    fig, (ax,) = _new_figure(1, 1)
    fig.set_size_inches(6.0, 3.8)
    all_ks: set[int] = set()
    start = next((r for r in rows if r.get("start_pass@k") and r.get("is_baseline")), None) or next(
        (r for r in rows if r.get("start_pass@k")), None
    )
    if start is not None:
        ks = sorted(start["start_pass@k"])
        all_ks.update(ks)
        ax.plot(
            ks,
            [start["start_pass@k"][k] for k in ks],
            color=START_COLOR,
            linestyle="--",
            marker="o",
            markersize=3,
            linewidth=1.4,
            label="starting model",
        )
    styles = assign_styles([r["label"] for r in rows])
    for r in drawn:
        ks = sorted(r["pass@k"])
        all_ks.update(ks)
        yerr = [r["pass@k_std"].get(k) or 0.0 for k in ks] if r.get("num_evaluated", 1) > 1 else None
        style = styles[r["label"]]
        ax.errorbar(
            ks,
            [r["pass@k"][k] for k in ks],
            yerr=yerr,
            color=colors[r["label"]],
            marker=style.marker,
            markersize=4,
            linestyle=style.linestyle,
            linewidth=style.linewidth,
            capsize=3,
            label=r["label"],
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(all_ks), [str(k) for k in sorted(all_ks)])
    ax.set_xlabel("k (samples)", fontsize=9)
    ax.set_ylabel("pass@k", fontsize=9)
    ax.set_ylim(0, 1.02)
    _style(ax)
    ax.legend(fontsize=8, frameon=False)
    _save(fig, out_path)
    return True


def _difficulty_sort(key: str) -> tuple:
    """Numeric difficulty levels in numeric order, others after."""
    try:
        return (0, float(key), key)
    except ValueError:
        return (1, 0.0, key)


def _difficulty_plot(rows: Sequence[dict[str, Any]], colors: dict[str, str], out_path: str) -> bool:
    """Grouped bars: mean@n per difficulty level, one bar per recipe (plus the start); False if no data."""
    series: list[tuple[str, str, dict[str, float], Any]] = []
    start = next((r for r in rows if r.get("start_by_difficulty") and r.get("is_baseline")), None) or next(
        (r for r in rows if r.get("start_by_difficulty")), None
    )
    if start is not None:
        series.append(("starting model", START_COLOR, start["start_by_difficulty"], "//"))
    for r in rows:
        if r.get("by_difficulty"):
            series.append((r["label"], colors[r["label"]], r["by_difficulty"], None))
    if not any(s[0] != "starting model" for s in series):
        return False
    levels = sorted({lvl for _, _, d, _ in series for lvl in d}, key=_difficulty_sort)
    counts: dict[str, int] = {}
    for r in rows:
        counts.update(r.get("by_difficulty_count") or {})
    fig, (ax,) = _new_figure(1, 1)
    fig.set_size_inches(max(5.0, 1.1 * len(levels) * max(1, len(series)) * 0.45 + 2.5), 3.8)
    width = 0.8 / len(series)
    for i, (label, color, values, hatch) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(levels))]
        ys = [values.get(lvl, float("nan")) for lvl in levels]
        ax.bar(
            xs,
            ys,
            width=width * 0.95,
            color=color if hatch is None else "white",
            edgecolor=color,
            hatch=hatch,
            label=label,
            linewidth=1.0,
        )
    ax.set_xticks(range(len(levels)), [f"{lvl}\n({counts[lvl]} problems)" if lvl in counts else lvl for lvl in levels])
    ax.set_xlabel("difficulty", fontsize=9)
    ax.set_ylabel("mean@n", fontsize=9)
    ax.set_ylim(0, 1.02)
    _style(ax)
    ax.legend(fontsize=8, frameon=False, ncols=min(len(series), 4))
    _save(fig, out_path)
    return True


def group_curve(group: RunGroup) -> list[tuple[int, float, float | None, float | None]]:
    """[(step, mean pass@1 over the group's seeds, 95 % lo, hi)] at every evaluated checkpoint of its runs (the
    runs that evaluated it; no band where only one did)."""
    steps = sorted({s for run in group.runs for s in run.checkpoint_evals})
    return [(s, *mean_band([r.checkpoint_evals[s] for r in group.runs if s in r.checkpoint_evals])) for s in steps]


def _curves_plot(groups: Sequence[RunGroup], colors: dict[str, str], out_path: str) -> bool:
    """pass@1 against step (and against samples seen, when every drawn recipe's config gives its samples per
    step) for each recipe whose runs evaluated 2+ checkpoints (eval_stepN folders): the mean over seeds, a
    95 % t band where 2+ seeds evaluated a step; False if no run did."""
    drawn = [g for g in groups if any(len(r.checkpoint_evals) >= 2 for r in g.runs)]
    if not drawn:
        return False
    per_step: dict[str, int] = {}
    for g in drawn:
        sizes = {samples_per_step(r) for r in g.runs}
        size = sizes.pop() if len(sizes) == 1 else None
        if size:
            per_step[g.label] = size
    panels = 2 if len(per_step) == len(drawn) else 1
    fig, axes = _new_figure(1, panels)
    fig.set_size_inches(6.0 * panels, 3.8)
    styles = assign_styles([g.label for g in groups])
    for col, ax in enumerate(axes):
        for g in drawn:
            points = group_curve(g)
            scale = per_step[g.label] if col == 1 else 1
            xs = [scale * p[0] for p in points]
            style = styles[g.label]
            ax.plot(
                xs,
                [p[1] for p in points],
                color=colors[g.label],
                marker=style.marker,
                markersize=4,
                linestyle=style.linestyle,
                linewidth=style.linewidth,
                label=f"{g.label} ({len(g.runs)} seed{'s' if len(g.runs) != 1 else ''})",
            )
            band = [(x, p) for x, p in zip(xs, points) if p[2] is not None]
            if band:
                ax.fill_between(
                    [x for x, _ in band],
                    [p[2] for _, p in band],
                    [p[3] for _, p in band],
                    color=colors[g.label],
                    alpha=0.15,
                    linewidth=0,
                )
        ax.set_xlabel("samples seen" if col == 1 else "step", fontsize=9)
        ax.set_ylabel("pass@1", fontsize=9)
        _style(ax)
        ax.legend(fontsize=8, frameon=False)
    _save(fig, out_path)
    return True


def make_plots(
    groups: Sequence[RunGroup], rows: Sequence[dict[str, Any]], plot_dir: str, colors: dict[str, str]
) -> list[PlotOutcome]:
    """Draw every figure into `plot_dir`; an unlogged metric yields an outcome with a note, no file.

    A stale PNG of an omitted figure (from an earlier report in the same folder) is removed, so the
    folder never shows a plot the page does not.
    """
    os.makedirs(plot_dir, exist_ok=True)
    rel = os.path.basename(os.path.normpath(plot_dir))
    outcomes: list[PlotOutcome] = []
    for spec in TRAINING_PLOTS:
        path = os.path.join(plot_dir, f"{spec.name}.png")
        keys = _training_plot(spec, groups, colors, path)
        out = PlotOutcome(spec.name, spec.title, "training", spec.description)
        if keys is None:
            wanted = ", ".join(f"`{k}`" for k, _ in spec.panels)
            out.note = f"{spec.title}: not logged by any run ({wanted}); plot omitted."
            _remove(path)
        else:
            out.path, out.keys = f"{rel}/{spec.name}.png", keys
            out.note = skipped_note(spec.title, skipped_points(groups, keys))
        outcomes.append(out)

    for name, draw, desc, missing in (
        (
            "passk",
            lambda path: _passk_plot(rows, colors, path),
            "pass@k from each recipe's final evaluation (mean over seeds, bars: std); dashed grey: the starting model.",
            "not logged — no run has eval/summary.json with pass@k",
        ),
        (
            "difficulty",
            lambda path: _difficulty_plot(rows, colors, path),
            "mean@n per difficulty level of the evaluation set; hatched grey: the starting model.",
            "not logged — no run's eval/summary.json has by_difficulty",
        ),
        (
            "curves",
            lambda path: _curves_plot(groups, colors, path),
            "pass@1 at each evaluated checkpoint (eval_stepN folders) against step and samples seen: the mean over "
            "seeds, shaded: its 95 % t band over seeds.",
            "no run evaluated 2 or more checkpoints (eval_stepN folders)",
        ),
    ):
        path = os.path.join(plot_dir, f"{name}.png")
        out = PlotOutcome(name, EVAL_PLOTS[name], "evaluation", desc)
        if draw(path):
            out.path = f"{rel}/{name}.png"
        else:
            out.note = f"{EVAL_PLOTS[name]}: {missing}; plot omitted."
            _remove(path)
        outcomes.append(out)
    return outcomes


def _remove(path: str) -> None:
    """Delete a file if it exists."""
    if os.path.exists(path):
        os.remove(path)
