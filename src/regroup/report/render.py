"""The report page in HTML (inline CSS, relative image links) and in Markdown, from summary rows,
plot outcomes and findings. No computation happens here beyond formatting."""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape
from typing import Any

import regroup.report.stats as stats
from regroup.report.plots import PlotOutcome
from regroup.report.text import format_value, mean_at, pct, table_ks, wall_time

CSS = """
body{font:15px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
 color:#1d2127;background:#f6f7f9;margin:0}
main{max-width:1180px;margin:0 auto;padding:28px 32px 60px;background:#fff;min-height:100vh;
 box-shadow:0 0 0 1px #e4e7eb}
h1{font-size:26px;margin:0 0 4px} h2{font-size:19px;margin:34px 0 10px;padding-bottom:4px;
 border-bottom:1px solid #e4e7eb} h3{font-size:15px;margin:18px 0 6px}
.meta{color:#5f6b7a;font-size:13px;margin:0 0 8px}
ul.findings{padding-left:20px;margin:8px 0} ul.findings li{margin:4px 0}
table{border-collapse:collapse;font-size:13.5px;margin:8px 0;width:100%}
th,td{padding:6px 9px;border-bottom:1px solid #e9ecef;text-align:right;vertical-align:top}
th{background:#f1f3f5;font-weight:600;white-space:nowrap} tr:hover td{background:#fafbfc}
td.l,th.l{text-align:left} td.num{font-variant-numeric:tabular-nums;white-space:nowrap}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.sd{color:#6b7785;font-size:12px} .note{color:#5f6b7a;font-size:12.5px;margin:4px 0 0}
.chip{display:inline-block;font-size:11.5px;padding:1px 7px;border-radius:9px;margin-left:4px;white-space:nowrap}
.better{background:#e3f4e6;color:#1d6b2c} .worse{background:#fbe4e4;color:#9b2323}
.unclear{background:#eef0f3;color:#4d5866} .base{color:#6b7785;font-style:italic}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f1f3f5;
padding:1px 4px;border-radius:3px}
.diff{font-size:12.5px;text-align:left} .diff div{white-space:nowrap}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:18px;margin-top:10px;grid-auto-flow:dense}
figure.wide{grid-column:1/-1}
figure{margin:0;border:1px solid #e9ecef;border-radius:6px;padding:10px 12px;background:#fff}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{font-size:13px;color:#3f4a57;margin-top:6px} figcaption b{color:#1d2127}
ul.omitted{color:#6b7785;font-size:13px;padding-left:20px}
.notice{background:#fff6e0;border:1px solid #f0d9a0;border-radius:6px;padding:8px 12px;margin:10px 0}
"""

_CHIP = {stats.BETTER: "better", stats.WORSE: "worse", stats.UNCLEAR: "unclear", stats.NO_SE: "unclear"}


def _cell_value(value: float | None, sd: float | None) -> str:
    """A percentage with the std over seeds in small type when there is one."""
    text = pct(value)
    if value is not None and sd is not None:
        text += f' <span class="sd">sd {100 * sd:.1f}</span>'
    return text


OTHER_SET = "other eval set"
"""The Δ cell of a comparison left out because the two sides were evaluated on different sets."""


def _delta_cell(delta: float | None, se: float | None, verdict: str | None, other_set: bool = False) -> str:
    """ "+9.9 ± 3.2" (±2 SE) with a verdict chip, or "—" ("other eval set" for a comparison left out)."""
    if delta is None:
        return OTHER_SET if other_set else "—"
    text = f"{100 * delta:+.1f}" + (f" ± {200 * se:.1f}" if se is not None else "")
    if verdict:
        text += f'<span class="chip {_CHIP[verdict]}">{escape(verdict)}</span>'
    return text


def _swatch(color: str) -> str:
    """A small square in the recipe's plot colour."""
    return f'<span class="sw" style="background:{color}"></span>'


def _mean_header(rows: Sequence[dict[str, Any]]) -> str:
    """ "mean@8" when every evaluated row used the same n, else "mean@n"."""
    names = {mean_at(r) for r in rows if r.get("mean@n") is not None}
    return names.pop() if len(names) == 1 else "mean@n"


def results_table_html(rows: Sequence[dict[str, Any]], colors: dict[str, str]) -> str:
    """The results table: pass@k, mean@n ± SE, greedy, changes vs start and baseline, steps, wall time."""
    ks = table_ks(rows)
    n_name = _mean_header(rows)
    base = next((r for r in rows if r["is_baseline"]), None)
    head = [
        "<th class=l>recipe</th>",
        "<th>runs</th>",
        *[f"<th>pass@{k}</th>" for k in ks],
        f"<th>{escape(n_name)} ± SE</th>",
        "<th>greedy</th>",
        "<th>Δ vs start (±2 SE)</th>",
        f"<th>Δ vs {escape(base['label']) if base else 'baseline'} (±2 SE)</th>",
        "<th>steps</th>",
        "<th>wall time</th>",
    ]
    body = []
    for r in rows:
        mean = r.get("mean@n")
        mean_txt = pct(mean)
        if mean is not None and r.get("stderr") is not None:
            mean_txt += f" ± {100 * r['stderr']:.1f}"
        if mean is not None and r.get("mean@n_std") is not None:
            mean_txt += f' <span class="sd">sd {100 * r["mean@n_std"]:.1f}</span>'
        passk = r.get("pass@k") or {}
        cells = [
            f"<td class=l>{_swatch(colors[r['label']])}<b>{escape(r['label'])}</b></td>",
            f"<td class=num>{r['num_runs']}</td>",
            *[f"<td class=num>{_cell_value(passk.get(k), (r.get('pass@k_std') or {}).get(k))}</td>" for k in ks],
            f"<td class=num>{mean_txt}</td>",
            f"<td class=num>{_cell_value(r.get('greedy'), r.get('greedy_std'))}</td>",
            "<td class=num>"
            + _delta_cell(
                r.get("delta_start"),
                r.get("delta_start_se"),
                r.get("verdict_start"),
                bool(r.get("eval_sets_mixed") or r.get("start_set_differs")),
            )
            + "</td>",
            (
                '<td class="num base">baseline</td>'
                if r["is_baseline"]
                else "<td class=num>"
                + _delta_cell(
                    r.get("delta_baseline"),
                    r.get("delta_baseline_se"),
                    r.get("verdict_baseline"),
                    bool(r.get("baseline_set_differs")),
                )
                + "</td>"
            ),
            f"<td class=num>{r['steps'] if r.get('steps') is not None else '—'}</td>",
            f"<td class=num>{wall_time(r.get('wall_time_s'))}</td>",
        ]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return "<table><thead><tr>" + "".join(head) + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>"


def runs_table_html(rows: Sequence[dict[str, Any]], colors: dict[str, str]) -> str:
    """What was run: recipe, run folders and seeds, and the config keys that differ from the reference."""
    body = []
    for r in rows:
        if r["diff_against"] is None:
            diff = '<span class="base">reference for the config diff</span>'
        elif not r["config_diff"]:
            diff = f'<span class="base">same settings as {escape(r["diff_against"])}</span>'
        else:
            diff = "".join(
                f"<div><code>{escape(k)}</code>: {escape(format_value(a))} → <b>{escape(format_value(b))}</b></div>"
                for k, a, b in r["config_diff"]
            )
        seeds = ", ".join(escape(str(s)) for s in r["seeds"])
        body.append(
            f"<tr><td class=l>{_swatch(colors[r['label']])}<b>{escape(r['label'])}</b></td>"
            f"<td class=l>{escape(', '.join(r['runs']))}</td><td class=num>{seeds}</td><td class=diff>{diff}</td></tr>"
        )
    return (
        "<table><thead><tr><th class=l>recipe</th><th class=l>run folders</th><th>seeds</th>"
        "<th class=l>config diff (reference → this run)</th></tr></thead><tbody>" + "".join(body) + "</tbody></table>"
    )


def _figures_html(outcomes: Sequence[PlotOutcome], section: str) -> str:
    """Figures of one section (a figure that left values out says which under its caption), followed by the
    notes of the figures that were omitted."""
    figs = [o for o in outcomes if o.section == section and o.path]
    omitted = [o for o in outcomes if o.section == section and not o.path]
    parts = ['<div class="grid">']
    for o in figs:
        # Multi-panel figures and the grouped bars by difficulty need the full width to stay readable.
        wide = ' class="wide"' if len(o.keys) > 1 or o.name in ("difficulty", "curves") else ""
        parts.append(
            f'<figure{wide}><img src="{escape(o.path or "")}" alt="{escape(o.title)}" loading="lazy">'
            f"<figcaption><b>{escape(o.title)}.</b> {escape(o.description or '')}"
            + (f'<p class="note">{escape(o.note)}</p>' if o.note else "")
            + "</figcaption></figure>"
        )
    parts.append("</div>")
    if omitted:
        parts.append('<ul class="omitted">' + "".join(f"<li>{escape(o.note or '')}</li>" for o in omitted) + "</ul>")
    return "".join(parts)


def render_html(
    title: str,
    rows: Sequence[dict[str, Any]],
    outcomes: Sequence[PlotOutcome],
    found: Sequence[str],
    colors: dict[str, str],
    generated: str,
    run_dirs: Sequence[str],
    notes: Sequence[str] = (),
) -> str:
    """The whole report page; `notes` are shown first, above the findings."""
    legend = (
        "Accuracies in %. mean@n ± one standard error over problems (several seeds: the larger of "
        "evaluation and seed noise). Δ columns: change of mean@n in percentage points ± 2 SE — paired over "
        "problems when both sides are single runs with per-problem results on the same problems, else unpaired; "
        "within 2 SE is marked 'no clear difference'. 'sd': standard deviation over seeds. Wall time: sum of "
        "logged time/step."
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{escape(title)}</title><style>{CSS}</style></head>
<body><main>
<h1>{escape(title)}</h1>
<p class="meta">{len(run_dirs)} run folder(s) · {len(rows)} recipe setting(s) · generated {escape(generated)}</p>
{"".join(f'<p class="notice">{escape(n)}</p>' for n in notes)}
<h2>What the results show</h2>
<ul class="findings">{"".join(f"<li>{escape(s)}</li>" for s in found)}</ul>
<h2>Results</h2>
{results_table_html(rows, colors)}
<p class="note">{escape(legend)}</p>
<h2>What was run</h2>
{runs_table_html(rows, colors)}
<h2>Evaluation</h2>
{_figures_html(outcomes, "evaluation")}
<h2>Training</h2>
<p class="note">Bold line: exponential moving average; faint line: the raw per-step value (mean over seeds).</p>
{_figures_html(outcomes, "training")}
<p class="meta" style="margin-top:30px">Runs: {escape(", ".join(run_dirs))}</p>
</main></body></html>
"""


_MD_SPECIAL = re.compile(r"[\\`*{}\[\]()#+\-.!|~]|_+")
"""The characters with a meaning in CommonMark or GitHub's Markdown (emphasis, code, links and images, headings,
lists, tables, strikethrough) other than `<`, `>` and `&`, which become HTML entities. Underscores are matched as
runs: a run between two letters or digits ("ta_grpo") cannot open or close emphasis (CommonMark's flanking rule)
and is left as it is, so names stay searchable in the file."""


def _md_special(match: re.Match[str]) -> str:
    """A backslash before each character of the match, except an underscore run inside a word."""
    text, start, end = match.string, match.start(), match.end()
    inside_word = (
        match.group().startswith("_")
        and 0 < start
        and end < len(text)
        and text[start - 1].isalnum()
        and text[end].isalnum()
    )
    return match.group() if inside_word else "".join("\\" + c for c in match.group())


def _md_escape(text: Any) -> str:
    """Text from run folders (recipe names, paths, config values, findings that quote them) as inert Markdown
    that reads as the same characters: `&`, `<` and `>` as HTML entities (Markdown passes raw HTML such as
    `<script>` and autolinks such as `<http://x>` through), every other Markdown special character
    backslash-escaped (so `![t](http://host/t.png)` shows as text instead of fetching an image, and a pipe
    cannot break a table cell), and line breaks as spaces (a text cannot end a table row or start a heading)."""
    return _MD_SPECIAL.sub(_md_special, escape(" ".join(str(text).splitlines()), quote=False))


def _md_own_text(text: str) -> str:
    """The caller's own text (the title, the notes the demo passes): HTML special characters as entities and the
    pipe escaped, its Markdown left to work (it is not read from a run folder)."""
    return escape(str(text), quote=False).replace("|", "\\|")


def _md_code_cell(text: Any) -> str:
    """Text from a run folder as a Markdown code span inside a table cell (shown verbatim: nothing inside a code
    span is Markdown or HTML), fenced by one backtick more than the longest run of backticks in it; `|` escaped,
    which GitHub's tables read as a pipe of the cell even inside a code span."""
    flat = " ".join(str(text).splitlines()).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", flat)), default=0) + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


def render_markdown(
    title: str,
    rows: Sequence[dict[str, Any]],
    outcomes: Sequence[PlotOutcome],
    found: Sequence[str],
    generated: str,
    run_dirs: Sequence[str],
    notes: Sequence[str] = (),
) -> str:
    """The same report as Markdown, images by relative path; `notes` first, as quoted paragraphs."""
    ks = table_ks(rows)
    n_name = _mean_header(rows)
    base = next((r for r in rows if r["is_baseline"]), None)
    lines = [
        f"# {_md_own_text(title)}",
        "",
        f"{len(run_dirs)} run folder(s) · {len(rows)} recipe setting(s) · generated {generated}",
        "",
        *[line for n in notes for line in (f"> **{_md_own_text(n)}**", "")],
        "## What the results show",
        "",
    ]
    lines += [f"- {_md_escape(s)}" for s in found]
    # Built as a list so that no k column (runs without an evaluation) leaves no empty header cell.
    header = [
        "recipe",
        "runs",
        *[f"pass@{k}" for k in ks],
        f"{_md_escape(n_name)} ± SE",
        "greedy",
        "Δ vs start (±2 SE)",
        f"Δ vs {_md_escape(base['label']) if base else 'baseline'} (±2 SE)",
        "steps",
        "wall time",
    ]
    lines += ["", "## Results", "", "| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for r in rows:
        passk = r.get("pass@k") or {}
        sd = r.get("pass@k_std") or {}
        mean = pct(r.get("mean@n"))
        if r.get("mean@n") is not None and r.get("stderr") is not None:
            mean += f" ± {100 * r['stderr']:.1f}"
        if r.get("mean@n_std") is not None:
            mean += f" (sd {100 * r['mean@n_std']:.1f})"

        def delta(d: float | None, se: float | None, v: str | None, other_set: bool = False) -> str:
            if d is None:
                return OTHER_SET if other_set else "—"
            return f"{100 * d:+.1f}" + (f" ± {200 * se:.1f}" if se is not None else "") + (f" ({v})" if v else "")

        cells = [
            f"**{_md_escape(r['label'])}**",
            str(r["num_runs"]),
            *[pct(passk.get(k)) + (f" (sd {100 * sd[k]:.1f})" if sd.get(k) is not None else "") for k in ks],
            mean,
            pct(r.get("greedy")),
            delta(
                r.get("delta_start"),
                r.get("delta_start_se"),
                r.get("verdict_start"),
                bool(r.get("eval_sets_mixed") or r.get("start_set_differs")),
            ),
            "baseline"
            if r["is_baseline"]
            else delta(
                r.get("delta_baseline"),
                r.get("delta_baseline_se"),
                r.get("verdict_baseline"),
                bool(r.get("baseline_set_differs")),
            ),
            str(r["steps"]) if r.get("steps") is not None else "—",
            wall_time(r.get("wall_time_s")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Accuracies in %; Δ in percentage points ± 2 SE; within 2 SE = no clear difference.",
        "",
        "## What was run",
        "",
        "| recipe | run folders | seeds | config diff (reference → this run) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        if r["diff_against"] is None:
            diff = "reference for the config diff"
        elif not r["config_diff"]:
            diff = f"same settings as {_md_escape(r['diff_against'])}"
        else:
            # each change escaped on its own, joined by a raw <br>: the one line break a Markdown table cell has
            diff = "<br>".join(
                f"{_md_code_cell(k)}: {_md_escape(format_value(a))} → **{_md_escape(format_value(b))}**"
                for k, a, b in r["config_diff"]
            )
        lines.append(
            f"| {_md_escape(r['label'])} | {_md_escape(', '.join(r['runs']))} | "
            f"{_md_escape(', '.join(str(s) for s in r['seeds']))} | {diff} |"
        )
    for section, heading in (("evaluation", "Evaluation"), ("training", "Training")):
        lines += ["", f"## {heading}", ""]
        for o in outcomes:
            if o.section != section:
                continue
            if o.path:
                # the figures' titles and captions are this package's own text (plots.TRAINING_PLOTS), not a run's:
                # HTML-escaping them would show "β &gt; 0" to a reader of the .md file
                lines += [f"![{o.title}]({o.path})", "", f"*{o.title}.* {o.description}", ""]
                if o.note:  # values the figure could not draw, named with their run
                    lines += [_md_escape(o.note), ""]
        omitted = [o for o in outcomes if o.section == section and not o.path]
        lines += [f"- {_md_escape(o.note or '')}" for o in omitted]
    lines += ["", f"Runs: {_md_escape(', '.join(run_dirs))}", ""]
    return "\n".join(lines)
