"""The study's page: one self-contained HTML file (plots embedded as data URIs) and the same tables in
Markdown. Formatting only: the numbers come from `regroup.report.claims` and the run folders."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from regroup.io import write_atomic
from regroup.report.claims import ArmResult, Comparison, Verdict, compare_pass_at_k, mean_pass_at_k
from regroup.report.render import CSS
from regroup.report.text import wall_time

_VERDICT_CLASS = {"supported": "better", "not supported": "worse"}


def fmt_comparison(c: Comparison | None, percent: bool = True) -> str:
    """"+3.1 ± 2.4" (± 2 SE), in points when `percent`; "—" when there is no difference."""
    if c is None or c.delta is None:
        return "—"
    scale = 100.0 if percent else 1.0
    text = f"{scale * c.delta:+.{1 if percent else 3}f}"
    if c.se is not None:
        text += f" ± {2 * scale * c.se:.{1 if percent else 3}f}"
    return text


def fmt_value(c: Comparison | None) -> str:
    """An arm's own pass@k in % with ± 1 SE."""
    if c is None or c.delta is None:
        return "—"
    return f"{100 * c.delta:.1f}" + (f" ± {100 * c.se:.1f}" if c.se is not None else "")


def verdict_rows(verdicts: Sequence[Verdict]) -> list[list[str]]:
    """Cells of the verdict table: paper, claim, regime, measure, comparison, Δ ± 2 SE, n, verdict."""
    rows = []
    for v in verdicts:
        c, claim = v.comparison, v.claim
        percent = claim.measure.startswith("pass@")
        delta = fmt_comparison(c, percent) + (" pts" if percent and c is not None and c.delta is not None else "")
        if v.reference_comparison is not None:
            delta += f" (vs {claim.reference}: {claim.against} {fmt_comparison(v.reference_comparison, percent)})"
        size = "—" if c is None else f"{c.seeds} seeds" + (f" × {c.problems} problems" if c.problems else "")
        rows.append([claim.paper, claim.text, v.regime, claim.measure, f"{claim.arm} − {claim.against}", delta, size,
                     v.verdict])
    return rows


VERDICT_HEADER = ["paper", "claim", "regime", "measure", "difference", "Δ ± 2 SE", "paired over", "verdict"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with one cell per header column on every line (pipes in cells escaped)."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(r) for r in rows])


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1,
                classes: Sequence[str | None] | None = None) -> str:
    head = "".join(f"<th{' class=l' if i < left else ''}>{escape(h)}</th>" for i, h in enumerate(header))
    body = []
    for j, r in enumerate(rows):
        cells = "".join(f"<td class={'l' if i < left else 'num'}>{escape(str(c))}</td>" for i, c in enumerate(r))
        cls = classes[j] if classes else None
        body.append(f"<tr{f' class={cls}' if cls else ''}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def results_rows(arms: Sequence[Any], results: Mapping[str, ArmResult], ks: Sequence[int],
                 baseline: str = "grpo") -> list[list[str]]:
    """Per arm: protocol, pass@k ± SE (over problems and seeds), Δ pass@k vs GRPO ± 2 SE (paired)."""
    rows = []
    for arm in arms:
        if arm.name not in results:
            continue
        r = results[arm.name]
        cells = [arm.name, arm.protocol, str(len(r.per_problem))]
        cells += [fmt_value(mean_pass_at_k(r, k)) for k in ks]
        if baseline in results and arm.name != baseline:
            cells += [fmt_comparison(compare_pass_at_k(r, results[baseline], k)) for k in ks]
        else:
            cells += ["baseline" if arm.name == baseline else "—"] * len(ks)
        rows.append(cells)
    return rows


def results_header(ks: Sequence[int]) -> list[str]:
    return (["arm", "protocol", "seeds"] + [f"pass@{k} ± SE" for k in ks]
            + [f"Δ pass@{k} vs grpo ± 2 SE" for k in ks])


def budget_rows(arms: Sequence[Any], planned: Mapping[str, Any], measured: Mapping[str, dict]) -> list[list[str]]:
    rows = []
    for arm in arms:
        if arm.name not in measured:
            continue
        p, m = planned[arm.name], measured[arm.name]
        rows.append([arm.name, arm.protocol, str(p.prompts_per_step), str(p.optimizer_steps), str(p.distinct_questions),
                     str(p.questions_drawn), str(p.samples), str(m["steps"]), f"{m['questions_drawn']:.0f}",
                     f"{m['tokens']:.0f}", wall_time(m["wall_s"])])
    return rows


BUDGET_HEADER = ["arm", "protocol", "questions/step", "optimizer steps", "distinct questions", "questions drawn",
                 "samples (planned)", "steps (measured)", "questions drawn (measured, mean/run)",
                 "tokens generated (measured, mean/run)",
                 "training wall time (measured, mean/run)"]


def mechanism_rows(arms: Sequence[Any], results: Mapping[str, ArmResult], keys: Sequence[str]) -> list[list[str]]:
    """Per arm, each mechanism metric's mean over training, averaged over seeds ("—": not logged)."""
    rows = []
    for arm in arms:
        if arm.name not in results:
            continue
        per_seed = results[arm.name].mechanisms
        cells = [arm.name]
        for key in keys:
            values = [m[key] for m in per_seed.values() if key in m]
            cells.append(f"{sum(values) / len(values):.3f}" if values else "—")
        rows.append(cells)
    return rows


def _embedded(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _regime_rows(regimes: Sequence[Any], threshold: float) -> list[list[str]]:
    rows = []
    for r in regimes:
        tried = "; ".join(f"{p['description']}: {100 * p['all_wrong']:.0f} %" for p in r.probes)
        met = "—" if r.name == "mid" else ("yes" if (r.all_wrong or 0) >= threshold else "NO: the condition is not met")
        step1 = "—" if r.grpo_step1_all_wrong is None else f"{100 * r.grpo_step1_all_wrong:.0f} %"
        rows.append([r.name, r.description, f"{100 * (r.all_wrong or 0):.0f} %", step1, met, tried])
    return rows


REGIME_HEADER = ["regime", "start and questions", "all-wrong groups at step 0 (probe)",
                 "GRPO all-wrong groups, step 1 (mean over seeds)", f"sparse condition (≥ threshold)", "candidates tried"]


PROTOCOL_HEADER = ["protocol", "held equal to GRPO", "differs"]


def _protocol_rows(protocols: Mapping[str, tuple[str, str]]) -> list[list[str]]:
    return [[name, same, differs] for name, (same, differs) in protocols.items()]


def write_study_page(study_dir: Path, s: Any, arms: Sequence[Any], regimes: Sequence[Any],
                     results: Mapping[str, Mapping[str, ArmResult]], verdicts: Sequence[Verdict],
                     budgets: Mapping[str, Mapping[str, dict]], seconds: float, *, planned: Mapping[str, Any],
                     protocols: Mapping[str, tuple[str, str]], mechanisms: Sequence[str]) -> Path:
    """Write study_dir/study.html (self-contained) and study_dir/study.md; return the HTML path. The study
    hands over its content (each arm's planned budget, the protocols, the mechanism metrics): the page
    knows no study."""
    ks = s.ks
    vrows = verdict_rows(verdicts)
    classes = [_VERDICT_CLASS.get(v.verdict) for v in verdicts]
    intro = (f"{s.seeds} seeds per arm; GRPO: {s.questions} distinct questions × {s.epochs} epochs = {s.steps} steps "
             f"of {s.prompts_per_step} questions × G = {s.num_generations}; held-out: {s.eval_problems} problems × "
             f"{s.eval_samples} samples at T = 1. Measured study time: {wall_time(seconds)}.")
    note = ("pass@k in % ± 1 SE over problems and seeds; Δ in percentage points ± 2 SE, paired over problems and "
            "seeds (SE = √(var over seeds of the per-seed mean / S + var over problems of the per-problem mean / P)). "
            "A verdict is 'supported' or 'not supported' only beyond 2 SE in either direction.")
    html = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>regroup study</title><style>{CSS}"
            "tr.better td{background:#f1faf2} tr.worse td{background:#fdf1f1}</style></head><body><main>",
            "<h1>regroup study: the papers' claims at the tiny model's scale</h1>", f"<p class=meta>{escape(intro)}</p>",
            "<h2>Regimes</h2>", _html_table(REGIME_HEADER, _regime_rows(regimes, s.sparse_min_all_wrong), left=2),
            "<h2>Protocols</h2>", _html_table(PROTOCOL_HEADER, _protocol_rows(protocols), left=3),
            "<h2>Verdicts</h2>", _html_table(VERDICT_HEADER, vrows, left=5, classes=classes),
            f"<p class=note>{escape(note)}</p>"]
    md = ["# regroup study: the papers' claims at the tiny model's scale", "", intro, "", "## Regimes", "",
          markdown_table(REGIME_HEADER, _regime_rows(regimes, s.sparse_min_all_wrong)), "", "## Protocols", "",
          markdown_table(PROTOCOL_HEADER, _protocol_rows(protocols)), "", "## Verdicts", "",
          markdown_table(VERDICT_HEADER, vrows), "", note, ""]
    for regime in regimes:
        name = regime.name
        res = results.get(name, {})
        rrows = results_rows(arms, res, ks)
        brows = budget_rows(arms, planned, budgets.get(name, {}))
        mrows = mechanism_rows(arms, res, mechanisms)
        html += [f"<h2>{escape(name)} regime</h2>", f"<p class=meta>{escape(regime.description)}</p>",
                 "<h3>Held-out results</h3>", _html_table(results_header(ks), rrows, left=2),
                 "<h3>Budgets per protocol</h3>", _html_table(BUDGET_HEADER, brows, left=2),
                 "<h3>Mechanisms (mean over training steps, then over seeds)</h3>",
                 _html_table(["arm", *mechanisms], mrows), '<div class="grid">']
        plots = sorted((study_dir / name / "plots").glob("*.png"))
        for p in plots:
            wide = ' class="wide"' if p.stem not in ("passk", "reward", "grad_norm", "entropy", "diversity", "kl") else ""
            html.append(f'<figure{wide}><img src="{_embedded(p)}" alt="{escape(p.stem)}"><figcaption><b>{escape(name)}: '
                        f"{escape(p.stem)}</b> (per-step mean over seeds)</figcaption></figure>")
        html.append("</div>")
        md += [f"## {name} regime", "", regime.description, "", markdown_table(results_header(ks), rrows), "",
               "Budgets per protocol:", "", markdown_table(BUDGET_HEADER, brows), "",
               "Mechanisms (mean over training, then seeds):", "", markdown_table(["arm", *mechanisms], mrows), "",
               f"Plots: {name}/report.html (and embedded in study.html).", ""]
    html.append("</main></body></html>")
    write_atomic(study_dir / "study.md", "\n".join(md))
    out = study_dir / "study.html"
    write_atomic(out, "\n".join(html))
    return out
