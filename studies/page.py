"""The study's page: one self-contained HTML file (plots embedded as data URIs) and the same tables in
Markdown. Formatting only: the numbers come from `studies.claims` and the run folders."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from regroup.io import write_atomic
from regroup.report.render import CSS
from regroup.report.text import wall_time
from studies.claims import (
    ALPHA,
    NOT_RUN,
    T1,
    ArmResult,
    Comparison,
    Verdict,
    compare_pass_at_k,
    confidence_interval,
    effect_note,
    mean_pass_at_k,
    verdict_label,
)
from studies.stats import paired_t_power

_VERDICT_CLASS = {"supported": "better", "contradicted": "worse"}


def fmt_ci(c: Comparison | None, percent: bool = True) -> str:
    """ "+3.1 [+0.4, +5.8]": Δ and its (1 − α) confidence interval, in points when `percent`; "—" without Δ."""
    if c is None or c.delta is None:
        return "—"
    scale, digits = (100.0, 1) if percent else (1.0, 3)
    text = f"{scale * c.delta:+.{digits}f}"
    ci = confidence_interval(c)
    if ci is not None:
        text += f" [{scale * ci[0]:+.{digits}f}, {scale * ci[1]:+.{digits}f}]"
    return text


def fmt_p(p: float | None) -> str:
    if p is None:
        return "—"
    return "< 0.0001" if p < 1e-4 else f"{p:.4f}"


def fmt_value(c: Comparison | None) -> str:
    """An arm's own pass@k in % with ± 1 SE."""
    if c is None or c.delta is None:
        return "—"
    return f"{100 * c.delta:.1f}" + (f" ± {100 * c.se:.1f}" if c.se is not None else "")


def _effect(v: Verdict) -> str:
    e = v.claim.effect
    if e is None:
        return "—"
    e *= v.claim.direction
    shown = f"{100 * e:+.1f} pts" if v.claim.measure.startswith("pass@") else f"{e:+.3f}"
    return shown + effect_note(v.claim)


def primary_rows(verdicts: Sequence[Verdict], power: Sequence[Mapping[str, Any]], scope: str = "") -> list[list[str]]:
    """Cells of the registered-endpoint table: paper, endpoint, regime, measure, difference, the paper's
    effect, power at the registered seeds, seeds run and the power they give (pilot spread), Δ [CI], df,
    p, p (Holm), verdict (whether the CI rules out the paper's effect, scoped to `scope`, or "not detected"
    where the seeds run had under 80 % power at it)."""
    by_text = {r["endpoint"]: r for r in power}
    rows = []
    for v in (v for v in verdicts if v.claim.primary):
        c, claim = v.comparison, v.claim
        r = by_text.get(claim.text, {})
        percent = claim.measure.startswith("pass@")
        ran = c.seeds if c is not None else 0
        level, sd = r.get("level_first_holm_step"), r.get("pilot_sd_per_seed")
        power_value = (
            paired_t_power(claim.effect, sd, ran, level)  # type: ignore[arg-type]
            if level is not None and sd is not None and ran
            else None
        )
        power_run = "—" if power_value is None else f"{100 * power_value:.0f} %"
        rows.append(
            [
                claim.paper,
                claim.text,
                v.regime,
                claim.measure,
                f"{claim.arm} − {claim.against}",
                _effect(v),
                f"{100 * r['power']:.0f} % ({r['seeds']} seeds)" if r else "—",
                f"{ran} ({power_run})",
                fmt_ci(c, percent) + (" pts" if percent and c is not None and c.delta is not None else ""),
                "—" if c is None or c.df is None else f"{c.df:.0f}",
                fmt_p(v.p),
                fmt_p(v.p_adjusted),
                verdict_label(v, power_value, scope),
            ]
        )
    return rows


PRIMARY_HEADER = [
    "paper",
    "registered endpoint",
    "regime",
    "measure",
    "difference",
    "paper's effect",
    "power (registered seeds)",
    "seeds run (power)",
    f"Δ [{100 * (1 - ALPHA):.0f} % CI]",
    "df",
    "p",
    "p (Holm)",
    "verdict",
]


def per_seed_rows(verdicts: Sequence[Verdict]) -> list[list[str]]:
    """Each primary endpoint's per-seed differences (the replications its test is over)."""
    rows = []
    for v in (v for v in verdicts if v.claim.primary and v.comparison is not None):
        percent = v.claim.measure.startswith("pass@")
        scale, digits = (100.0, 1) if percent else (1.0, 3)
        c = v.comparison
        # one seed: its test runs over the problems (per_seed holds those), but the row shows the seed's mean
        diffs = c.per_seed if c.seeds >= 2 or c.delta is None else (c.delta,)
        values = ", ".join(f"{scale * d:+.{digits}f}" for d in diffs)
        rows.append([v.claim.text, v.regime, f"{v.claim.arm} − {v.claim.against}", values or "—"])
    return rows


def verdict_rows(verdicts: Sequence[Verdict]) -> list[list[str]]:
    """Cells of the verdict table: paper, claim, regime, measure, comparison, Δ [CI], df, n, p, p (Holm), verdict."""
    rows = []
    for v in verdicts:
        c, claim = v.comparison, v.claim
        percent = claim.measure.startswith("pass@")
        delta = fmt_ci(c, percent) + (" pts" if percent and c is not None and c.delta is not None else "")
        if claim.kind == "matches":
            delta += f" (margin −{100 * claim.margin:.0f} pts" if percent else f" (margin −{claim.margin}"  # type: ignore[operator]
            if v.reference_comparison is not None:
                delta += f"; {claim.against} − {claim.reference}: {fmt_ci(v.reference_comparison, percent)}"
            delta += ")"
        size = "—" if c is None else f"{c.seeds} seeds" + (f" × {c.problems} problems" if c.problems else "")
        df = "—" if c is None or c.df is None else f"{c.df:.1f}"
        rows.append(
            [
                claim.paper,
                claim.text,
                v.regime,
                claim.measure,
                f"{claim.arm} − {claim.against}",
                delta,
                df,
                size,
                fmt_p(v.p),
                fmt_p(v.p_adjusted),
                verdict_label(v),
            ]
        )
    return rows


VERDICT_HEADER = [
    "paper",
    "claim",
    "regime",
    "measure",
    "difference",
    f"Δ [{100 * (1 - ALPHA):.0f} % CI]",
    "df",
    "paired over",
    "p",
    "p (Holm)",
    "verdict",
]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with one cell per header column on every line (pipes in cells escaped)."""

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(r) for r in rows])


def _html_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1, classes: Sequence[str | None] | None = None
) -> str:
    head = "".join(f"<th{' class=l' if i < left else ''}>{escape(h)}</th>" for i, h in enumerate(header))
    body = []
    for j, r in enumerate(rows):
        cells = "".join(f"<td class={'l' if i < left else 'num'}>{escape(str(c))}</td>" for i, c in enumerate(r))
        cls = classes[j] if classes else None
        body.append(f"<tr{f' class={cls}' if cls else ''}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def results_rows(
    arms: Sequence[Any],
    results: Mapping[str, ArmResult],
    ks: Sequence[int],
    paper_protocols: Sequence[str] = (),
    baseline: str = "grpo",
) -> list[list[str]]:
    """Per arm: protocol, seeds, pass@k ± SE at T = 1, Δ pass@k vs GRPO [CI] (paired), then pass@1 and
    Δ pass@1 vs GRPO at each paper's decoding settings."""
    rows = []
    for arm in arms:
        if arm.name not in results:
            continue
        r = results[arm.name]
        cells = [arm.name, arm.protocol, str(len(r.per_problem))]
        cells += [fmt_value(mean_pass_at_k(r, k)) for k in ks]
        measured = [(T1, k) for k in ks] + [(p, 1) for p in paper_protocols]
        if baseline in results and arm.name != baseline:
            deltas = [fmt_ci(compare_pass_at_k(r, results[baseline], k, proto)) for proto, k in measured]
        else:
            deltas = ["baseline" if arm.name == baseline else "—"] * len(measured)
        cells += deltas[: len(ks)]
        for i, proto in enumerate(paper_protocols):
            cells += [fmt_value(mean_pass_at_k(r, 1, proto)), deltas[len(ks) + i]]
        rows.append(cells)
    return rows


def results_header(ks: Sequence[int], paper_protocols: Sequence[str] = (), baseline: str = "grpo") -> list[str]:
    ci = f"[{100 * (1 - ALPHA):.0f} % CI]"
    head = (
        ["arm", "protocol", "seeds"]
        + [f"pass@{k} ± SE (T = 1)" for k in ks]
        + [f"Δ pass@{k} vs {baseline} {ci}" for k in ks]
    )
    for proto in paper_protocols:
        head += [f"pass@1 ± SE ({proto} decoding)", f"Δ pass@1 vs {baseline} {ci} ({proto})"]
    return head


def budget_rows(arms: Sequence[Any], planned: Mapping[str, Any], measured: Mapping[str, dict]) -> list[list[str]]:
    rows = []
    for arm in arms:
        if arm.name not in measured:
            continue
        p, m = planned[arm.name], measured[arm.name]
        rows.append(
            [
                arm.name,
                arm.protocol,
                str(p.prompts_per_step),
                str(p.optimizer_steps),
                str(p.distinct_questions),
                str(p.questions_drawn),
                str(p.samples),
                str(m["steps"]),
                f"{m['questions_drawn']:.0f}",
                f"{m['tokens']:.0f}",
                wall_time(m["wall_s"]),
            ]
        )
    return rows


BUDGET_HEADER = [
    "arm",
    "protocol",
    "questions/step",
    "optimizer steps",
    "distinct questions",
    "questions drawn",
    "samples (planned)",
    "steps (measured)",
    "questions drawn (measured, mean/run)",
    "tokens generated (measured, mean/run)",
    "training wall time (measured, mean/run)",
]


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


REGIME_HEADER = [
    "regime",
    "start and questions",
    "all-wrong groups at step 0 (probe)",
    "GRPO all-wrong groups, step 1 (mean over seeds)",
    "sparse condition (≥ threshold)",
    "candidates tried",
]


PROTOCOL_HEADER = ["protocol", "held equal to GRPO", "differs"]


def _protocol_rows(protocols: Mapping[str, tuple[str, str]]) -> list[list[str]]:
    return [[name, same, differs] for name, (same, differs) in protocols.items()]


def write_study_page(
    study_dir: Path,
    s: Any,
    arms: Sequence[Any],
    regimes: Sequence[Any],
    results: Mapping[str, Mapping[str, ArmResult]],
    verdicts: Sequence[Verdict],
    budgets: Mapping[str, Mapping[str, dict]],
    seconds: float,
    *,
    planned: Mapping[str, Any],
    protocols: Mapping[str, tuple[str, str]],
    mechanisms: Sequence[str],
    primaries: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Write study_dir/study.html (self-contained) and study_dir/study.md; return the HTML path. The study
    hands over its content (each arm's planned budget, the protocols, the mechanism metrics): the page
    knows no study."""
    ks = s.ks
    exploratory = [v for v in verdicts if not v.claim.primary and v.verdict != NOT_RUN]
    not_run = sum(1 for v in verdicts if not v.claim.primary and v.verdict == NOT_RUN)
    vrows = verdict_rows(exploratory)
    classes = [_VERDICT_CLASS.get(v.verdict) for v in exploratory]
    scope = (
        f"for the tiny model at {s.steps} steps of {s.prompts_per_step} questions × G = {s.num_generations}"
        if all(hasattr(s, k) for k in ("steps", "prompts_per_step", "num_generations"))
        else ""
    )
    prows = primary_rows(verdicts, primaries, scope)
    pclasses = [_VERDICT_CLASS.get(v.verdict) for v in verdicts if v.claim.primary]
    srows = per_seed_rows(verdicts)
    intro = (
        f"{s.seeds} seeds per arm registered (the seeds each arm finished are in its tables); GRPO: "
        f"{s.questions} distinct questions × {s.epochs} epochs = {s.steps} steps "
        f"of {s.prompts_per_step} questions × G = {s.num_generations}; evaluation: {s.eval_problems} unseen questions "
        "from the training generator × "
        f"{s.eval_samples} samples at T = 1 for the arms of a pass@k (k > 1) endpoint, {s.pass1_eval_samples} for "
        "the others"
        + (
            f", and × {s.paper_eval_samples} samples at each of "
            f"{', '.join(s.paper_protocols)} decoding (regroup.eval.benchmarks.DECODING)"
            if s.paper_protocols
            else ""
        )
        + f". Arm runs: {wall_time(seconds)} of one core (training and evaluation, summed over runs)."
    )
    note = (
        f"pass@k in % ± 1 SE over seeds. Δ in percentage points with its {100 * (1 - ALPHA):.0f} % confidence "
        "interval (t with the df shown; unadjusted). The test: the paired t-test over seeds (each seed's mean "
        "difference over the evaluation problems is one replication; S − 1 df); at a zero SE the exact sign-flip "
        "test over seeds (p >= 2^(1−S)); Δ = 0 on every seed is a tie. p (Holm): adjusted over the registered "
        "primary endpoints of the same paper only; a primary is 'supported' or 'contradicted' only when p (Holm) "
        f"< {ALPHA}; 'inconclusive' means this study could not tell, and says whether its CI rules out the "
        "paper's effect for this model, step count and dose only, or, where the seeds run had under 80 % power at "
        "it, that the effect was not detected; 'supported' says when its CI lies below the paper's effect (a real "
        "gain, smaller than claimed). Power: of the paired t-test at Holm's first-step level α/m, at the paper's "
        "effect, from the pilot spread registered in plan.json (not this run's). Exploratory claims: raw p and CI "
        "only, never "
        "'supported' ('matches' claims: twice the smaller of the non-inferiority-and-gain p and the falls-short "
        "p). Endpoints, effects, seeds and arms were fixed in code and written to plan.json before any arm trained."
    )
    explore_note = f"Exploratory claims whose arms did not run in a regime: {not_run} (listed in plan.json)."
    html = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>regroup study</title><style>{CSS}"
        "tr.better td{background:#f1faf2} tr.worse td{background:#fdf1f1}</style></head><body><main>",
        "<h1>regroup study: the papers' claims at the tiny model's scale</h1>",
        f"<p class=meta>{escape(intro)}</p>",
        "<h2>Regimes</h2>",
        _html_table(REGIME_HEADER, _regime_rows(regimes, s.sparse_min_all_wrong), left=2),
        "<h2>Protocols</h2>",
        _html_table(PROTOCOL_HEADER, _protocol_rows(protocols), left=3),
        "<h2>Registered primary endpoints</h2>",
        _html_table(PRIMARY_HEADER, prows, left=5, classes=pclasses),
        f"<p class=note>{escape(note)}</p>",
        "<h3>Per-seed differences of the primary endpoints</h3>",
        _html_table(["endpoint", "regime", "difference", "per seed (seed order)"], srows, left=3),
        "<h2>Exploratory comparisons</h2>",
        _html_table(VERDICT_HEADER, vrows, left=5, classes=classes),
        f"<p class=note>{escape(explore_note)}</p>",
    ]
    md = [
        "# regroup study: the papers' claims at the tiny model's scale",
        "",
        intro,
        "",
        "## Regimes",
        "",
        markdown_table(REGIME_HEADER, _regime_rows(regimes, s.sparse_min_all_wrong)),
        "",
        "## Protocols",
        "",
        markdown_table(PROTOCOL_HEADER, _protocol_rows(protocols)),
        "",
        "## Registered primary endpoints",
        "",
        markdown_table(PRIMARY_HEADER, prows),
        "",
        note,
        "",
        "### Per-seed differences of the primary endpoints",
        "",
        markdown_table(["endpoint", "regime", "difference", "per seed (seed order)"], srows),
        "",
        "## Exploratory comparisons",
        "",
        markdown_table(VERDICT_HEADER, vrows),
        "",
        explore_note,
        "",
    ]
    for regime in regimes:
        name = regime.name
        res = results.get(name, {})
        baseline = "grpo" if "grpo" in res else "grpo_drgrpo"  # the mid regime runs Dr. GRPO as its control
        rrows = results_rows(arms, res, ks, s.paper_protocols, baseline)
        brows = budget_rows(arms, planned, budgets.get(name, {}))
        mrows = mechanism_rows(arms, res, mechanisms)
        html += [
            f"<h2>{escape(name)} regime</h2>",
            f"<p class=meta>{escape(regime.description)}</p>",
            "<h3>Results on unseen questions from the training generator</h3>",
            _html_table(results_header(ks, s.paper_protocols, baseline), rrows, left=2),
            "<h3>Budgets per protocol</h3>",
            _html_table(BUDGET_HEADER, brows, left=2),
            "<h3>Mechanisms (mean over training steps, then over seeds)</h3>",
            _html_table(["arm", *mechanisms], mrows),
            '<div class="grid">',
        ]
        plots = sorted((study_dir / name / "plots").glob("*.png"))
        for p in plots:
            wide = (
                ' class="wide"' if p.stem not in ("passk", "reward", "grad_norm", "entropy", "diversity", "kl") else ""
            )
            html.append(
                f'<figure{wide}><img src="{_embedded(p)}" alt="{escape(p.stem)}"><figcaption><b>{escape(name)}: '
                f"{escape(p.stem)}</b> (per-step mean over seeds)</figcaption></figure>"
            )
        html.append("</div>")
        md += [
            f"## {name} regime",
            "",
            regime.description,
            "",
            markdown_table(results_header(ks, s.paper_protocols, baseline), rrows),
            "",
            "Budgets per protocol:",
            "",
            markdown_table(BUDGET_HEADER, brows),
            "",
            "Mechanisms (mean over training, then seeds):",
            "",
            markdown_table(["arm", *mechanisms], mrows),
            "",
        ]
        if (study_dir / name / "report.html").is_file():  # drawn from the raw run folders, not from a kept table
            md += [f"Plots: {name}/report.html (and embedded in study.html).", ""]
    html.append("</main></body></html>")
    write_atomic(study_dir / "study.md", "\n".join(md))
    out = study_dir / "study.html"
    write_atomic(out, "\n".join(html))
    return out
