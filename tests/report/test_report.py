"""regroup.report: run folders → summary rows, plots and an honest HTML/Markdown page."""

from __future__ import annotations

import html
import json
import math
import re

import pytest
import yaml

from regroup.report import build_report, stats, summarize_runs
from regroup.report.runs import config_diff, flatten, load_run
from regroup.report.smoothing import ema

BASE_CONFIG = {
    "recipe": "grpo",
    "seed": 0,
    "run_dir": None,
    "grpo": {"num_generations": 8, "scale": "group", "beta": 0.0},
    "optim": {"lr": 1e-4},
    "mask": {"enabled": False, "delta": 3.0},
}

ALWAYS = [
    "reward/mean",
    "groups/all_correct_frac",
    "groups/all_wrong_frac",
    "grad_norm",
    "entropy",
    "length/mean",
    "diversity",
]
EXPECTED_PLOTS = [
    "reward",
    "uniform_groups",
    "masked",
    "anchors",
    "grad_norm",
    "entropy",
    "length",
    "diversity",
    "variants",
    "passk",
    "difficulty",
]


def _summary(mean: float, se: float, pass8: float, greedy: float) -> dict:
    return {
        "num_problems": 64,
        "n": 8,
        "pass@k": {"1": mean, "2": (mean + pass8) / 2, "8": pass8},
        "mean@n": mean,
        "stderr": se,
        "greedy": greedy,
        "by_difficulty": {
            "1": {"mean@n": min(1.0, mean + 0.2), "count": 32},
            "2": {"mean@n": max(0.0, mean - 0.2), "count": 32},
        },
    }


def _write_run(
    root,
    name: str,
    config: dict,
    keys: list[str],
    eval_mean: float | None,
    eval_se: float = 0.03,
    steps: int = 30,
    extra_lines: str = "",
) -> str:
    run = root / name
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            rec = {"step": step, "time/step": 2.0}
            for i, key in enumerate(keys):
                if key == "diversity" and step % 10:
                    continue  # logged every 10 steps only, as the trainer does
                rec[key] = 0.3 + 0.01 * step + 0.05 * math.sin(step + i) if key != "grad_norm" else 10.0 ** (step % 5)
            f.write(json.dumps(rec) + "\n")
        f.write(extra_lines)
    if eval_mean is not None:
        (run / "eval").mkdir()
        (run / "eval" / "summary.json").write_text(
            json.dumps(_summary(eval_mean, eval_se, min(1.0, eval_mean + 0.25), eval_mean))
        )
        (run / "eval_before").mkdir()
        (run / "eval_before" / "summary.json").write_text(json.dumps(_summary(0.40, 0.03, 0.6, 0.38)))
    return str(run)


@pytest.fixture
def runs(tmp_path):
    """grpo ×2 seeds (0.50, 0.54), dagrpo 0.53 (within 2 SE of grpo), ta_grpo 0.70 (clearly above)."""
    root = tmp_path / "runs"
    root.mkdir()
    dirs = [
        _write_run(root, "grpo-s0", {**BASE_CONFIG, "seed": 0, "run_dir": "runs/grpo-s0"}, ALWAYS, 0.50),
        _write_run(root, "grpo-s1", {**BASE_CONFIG, "seed": 1, "run_dir": "runs/grpo-s1"}, ALWAYS, 0.54),
        _write_run(
            root,
            "dagrpo",
            {
                **BASE_CONFIG,
                "recipe": "dagrpo",
                "grpo": {**BASE_CONFIG["grpo"], "scale": "none"},
                "mask": {"enabled": True, "delta": 3.0},
            },
            ALWAYS + ["mask/pos_frac", "mask/neg_frac", "anchor/count", "anchor/adv_mean"],
            0.53,
            extra_lines='{"step": 31, "reward/me',
        ),  # a crash left half a line
        _write_run(
            root,
            "ta",
            {**BASE_CONFIG, "recipe": "ta_grpo", "ta": {"num_variants": 3}},
            ALWAYS + [f"variant/acc/{k}" for k in range(4)],
            0.70,
            eval_se=0.02,
        ),
    ]
    return dirs


def test_summarize_runs_aggregates_seeds_and_compares_with_hand_values(runs):
    rows = {r["label"]: r for r in summarize_runs(runs)}
    assert list(rows) == ["grpo", "dagrpo", "ta_grpo"]
    g = rows["grpo"]
    assert g["is_baseline"] and g["num_runs"] == 2 and g["seeds"] == [0, 1]
    assert g["mean@n"] == pytest.approx(0.52)
    assert g["mean@n_std"] == pytest.approx(math.sqrt(0.0008))  # std of (0.50, 0.54)
    # eval noise √(0.03² + 0.03²)/2 = 0.02121 beats seed noise 0.02828/√2 = 0.02
    assert g["stderr"] == pytest.approx(math.sqrt(0.0018) / 2)
    assert g["pass@k"][8] == pytest.approx((0.75 + 0.79) / 2)
    assert g["wall_time_s"] == pytest.approx(60.0) and g["steps"] == 30
    d = rows["dagrpo"]
    assert d["delta_baseline"] == pytest.approx(0.01)
    assert d["delta_baseline_se"] == pytest.approx(math.sqrt(0.03**2 + 0.0018 / 4))
    assert d["verdict_baseline"] == stats.UNCLEAR
    assert d["bad_metric_lines"] == 1
    assert ("mask.enabled", False, True) in d["config_diff"]
    assert ("grpo.scale", "group", "none") in d["config_diff"]
    assert all(k not in ("seed", "run_dir", "recipe") for k, _, _ in d["config_diff"])
    t = rows["ta_grpo"]
    assert t["verdict_baseline"] == stats.BETTER
    assert t["delta_start"] == pytest.approx(0.30) and t["verdict_start"] == stats.BETTER
    assert ("ta.num_variants", "(absent)", 3) in t["config_diff"]


def test_build_report_writes_plots_table_diff_and_honest_text(runs, tmp_path):
    out = tmp_path / "report"
    html_path, md_path = build_report(runs, str(out), title="test report")
    html = open(html_path).read()
    md = open(md_path).read()
    for name in EXPECTED_PLOTS:
        assert (out / "plots" / f"{name}.png").stat().st_size > 1000, name
        assert f'src="plots/{name}.png"' in html, name
        assert f"(plots/{name}.png)" in md, name
    # nobody logged kl: no file, a note instead
    assert not (out / "plots" / "kl.png").exists()
    assert "KL to the reference: not logged by any run" in html
    assert "not logged" in md
    for recipe in ("grpo", "dagrpo", "ta_grpo"):
        assert f"<b>{recipe}</b>" in html
    assert "<code>mask.enabled</code>: false → <b>true</b>" in html
    assert "no clear difference" in html
    assert "dagrpo does not beat grpo on this evidence" in html
    assert "ta_grpo beats grpo" in html
    assert "dagrpo beats" not in html
    assert "mean over 2 runs (seeds 0, 1)" in html
    assert "1 unreadable line(s) in metrics.jsonl" in html
    assert "<title>test report</title>" in html
    table = [
        line for line in md.split("## Results")[1].split("## What was run")[0].splitlines() if line.startswith("|")
    ]
    assert len(table) == 2 + 3 and len({line.count(" | ") for line in table if "---" not in line}) == 1
    assert table[1].count("|") == table[0].count("|")
    # a config diff of several settings breaks its cell with a real <br>, not the escaped text "&lt;br&gt;"
    run_rows = [line for line in md.splitlines() if "`mask.enabled`" in line]
    assert run_rows and all("&lt;br&gt;" not in line for line in md.splitlines())
    assert any("**true**<br>" in line or "<br>`mask.enabled`" in line for line in run_rows)


def test_no_baseline_run_and_no_eval_are_said_plainly(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    d = _write_run(root, "only", {**BASE_CONFIG, "recipe": "dagrpo"}, ["reward/mean"], None)
    html_path, _ = build_report([d], str(tmp_path / "rep"))
    html = open(html_path).read()
    assert "No run of the baseline recipe &#x27;grpo&#x27; was given" in html
    assert "dagrpo: no eval/summary.json" in html
    assert "pass@k curves: not logged" in html
    assert "Each recipe ran once" in html
    assert not (tmp_path / "rep" / "plots" / "entropy.png").exists()


def test_stale_plot_of_an_omitted_metric_is_removed(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    d = _write_run(root, "a", BASE_CONFIG, ["reward/mean"], 0.5)
    plots = tmp_path / "rep" / "plots"
    plots.mkdir(parents=True)
    (plots / "entropy.png").write_bytes(b"old")
    build_report([d], str(tmp_path / "rep"))
    assert not (plots / "entropy.png").exists()
    assert (plots / "reward.png").exists()


def test_missing_config_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.yaml"):
        load_run(str(tmp_path / "empty"))


def test_verdict_boundaries_and_group_stderr():
    assert stats.verdict(0.02, 0.01) == stats.UNCLEAR  # exactly 2 SE: not a clear difference
    assert stats.verdict(0.0201, 0.01) == stats.BETTER
    assert stats.verdict(-0.03, 0.01) == stats.WORSE
    assert stats.verdict(0.5, None) == stats.NO_SE
    assert stats.verdict(None, 0.1) is None
    assert stats.group_stderr([0.5], [0.04]) == 0.04
    # seed spread dominates: std(0.4, 0.6) = 0.1414, /√2 = 0.1 > √(2·0.01²)/2 = 0.00707
    assert stats.group_stderr([0.4, 0.6], [0.01, 0.01]) == pytest.approx(0.1)
    assert stats.group_stderr([0.4, 0.6], [0.01, None]) is None
    assert stats.diff_stderr(0.03, 0.04) == pytest.approx(0.05)


def test_ema_is_debiased():
    assert ema([1.0, 3.0], 0.5) == pytest.approx([1.0, 1.75 / 0.75])
    assert ema([2.0, 2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0, 2.0])  # a constant stays put
    assert ema([1.0, 5.0], 0.0) == [1.0, 5.0]
    with pytest.raises(ValueError):
        ema([1.0], 1.0)


def test_flatten_and_config_diff():
    flat = flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "seed": 3, "e": {}})
    assert flat == {"a.b": 1, "a.c.d": [1, 2], "seed": 3, "e": {}}
    assert config_diff({"a.b": 1, "seed": 1}, {"a.b": 2, "seed": 2, "x": 0})[0] == ("a.b", 1, 2)
    assert [k for k, _, _ in config_diff({"a.b": 1, "seed": 1}, {"a.b": 2, "seed": 2, "x": 0})] == ["a.b", "x"]


def test_same_recipe_with_different_settings_gets_two_labelled_rows(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    a = _write_run(root, "lr-a", BASE_CONFIG, ["reward/mean"], 0.5)
    b = _write_run(root, "lr-b", {**BASE_CONFIG, "optim": {"lr": 3e-4}}, ["reward/mean"], 0.6)
    rows = summarize_runs([a, b])
    assert [r["label"] for r in rows] == ["grpo [lr-a]", "grpo [lr-b]"]
    assert rows[1]["config_diff"] == [("optim.lr", 1e-4, 3e-4)]
    assert rows[1]["delta_baseline"] == pytest.approx(0.1)


def test_paired_standard_error_uses_per_problem_results(tmp_path):
    """Two single runs on the same 4 problems: the Δ SE is the SE of the per-problem differences."""
    import json as _json
    import math as _math

    import yaml as _yaml

    from regroup.report import summarize_runs
    from regroup.report.stats import paired_diff_stderr

    # per-problem accuracies; differences b − a = [0.5, 0.25, 0.5, 0.25]: mean 0.375, std 0.1443, SE 0.0722
    acc_a = {"p1": 0.25, "p2": 0.5, "p3": 0.0, "p4": 0.75}
    acc_b = {"p1": 0.75, "p2": 0.75, "p3": 0.5, "p4": 1.0}
    expected = _math.sqrt(((0.125**2) * 4) / 3) / 2
    assert abs(paired_diff_stderr(acc_b, acc_a) - expected) < 1e-12
    assert paired_diff_stderr(acc_b, {"p1": 0.0}) is None  # different problem sets: no pairing

    dirs = []
    for recipe, acc in (("grpo", acc_a), ("ta_grpo", acc_b)):
        d = tmp_path / recipe
        (d / "eval").mkdir(parents=True)
        (d / "config.yaml").write_text(
            _yaml.safe_dump({"recipe": recipe, "seed": 0, "ta": {"enabled": recipe != "grpo"}})
        )
        mean = sum(acc.values()) / 4
        (d / "eval" / "summary.json").write_text(
            _json.dumps(
                {"num_problems": 4, "n": 4, "mean@n": mean, "stderr": 0.2, "pass@k": {"1": mean}, "greedy": 0.5}
            )
        )
        (d / "eval" / "per_problem.jsonl").write_text(
            "".join(_json.dumps({"id": k, "n": 4, "correct": int(v * 4)}) + "\n" for k, v in acc.items())
        )
        dirs.append(str(d))
    rows = {r["recipe"]: r for r in summarize_runs(dirs, baseline="grpo")}
    ta = rows["ta_grpo"]
    assert abs(ta["delta_baseline"] - 0.375) < 1e-12
    assert ta["delta_baseline_paired"] and abs(ta["delta_baseline_se"] - expected) < 1e-12
    assert ta["verdict_baseline"] == "better"  # 0.375 > 2 x 0.072; unpaired (√(0.2²+0.2²) = 0.28) would say unclear


def _md_results_table(md: str) -> list[list[str]]:
    """The cells of each line of report.md's results table (outer pipes stripped)."""
    block = md.split("## Results")[1].split("## What was run")[0]
    return [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        for line in block.splitlines()
        if line.startswith("|")
    ]


def test_markdown_table_without_any_eval_has_one_cell_per_header(tmp_path):
    # No run has eval/summary.json, so there is no pass@k column: the header must not grow an empty cell.
    root = tmp_path / "runs"
    root.mkdir()
    dirs = [
        _write_run(root, "grpo", BASE_CONFIG, ["reward/mean"], None),
        _write_run(root, "dagrpo", {**BASE_CONFIG, "recipe": "dagrpo"}, ["reward/mean"], None),
    ]
    _, md_path = build_report(dirs, str(tmp_path / "rep"))
    table = _md_results_table(open(md_path).read())
    header, separator, *body = table
    assert "" not in header
    assert header[:2] == ["recipe", "runs"] and not any(c.startswith("pass@") for c in header)
    assert len(body) == 2
    assert {len(row) for row in table} == {len(header)}
    assert separator[0] == "---" and all(c == "---:" for c in separator[1:])


def test_training_axes_have_integer_step_ticks_and_labels():
    from matplotlib.figure import Figure

    from regroup.report.plots import label_step_axes

    ax = Figure().subplots()
    ax.plot([1, 2, 3], [0.1, 0.5, 0.2])  # left alone, matplotlib ticks this at 1.0, 1.25, 1.5, ...
    label_step_axes(ax, "mean reward")
    ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert ax.get_xlabel() == "optimizer step" and ax.get_ylabel() == "mean reward"


def test_eval_during_training_answers_and_dynamic_sampling_are_drawn(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    keys = ["reward/mean", "eval/pass@1", "eval/pass@4", "reward/extracted_frac", "dynamic/informative_frac"]
    run = _write_run(root, "grpo", {**BASE_CONFIG, "seed": 0, "run_dir": "runs/grpo"}, keys, None)
    out = tmp_path / "report"
    html_path, _ = build_report([run], str(out), title="t")
    html = open(html_path).read()
    for name in ("heldout", "answers", "dynamic_sampling"):
        assert (out / "plots" / f"{name}.png").stat().st_size > 1000, name
        assert f'src="plots/{name}.png"' in html, name


@pytest.mark.parametrize("panels", [1, 3])
def test_legend_of_many_long_labels_stays_inside_the_figure(panels):
    """11 study arms above one half-width panel once ran past the figure's right edge."""
    from regroup.report.plots import _legend, _new_figure

    fig, axes = _new_figure(1, panels)
    labels = [
        "grpo",
        "grpo_data",
        "grpo_dynamic",
        "grpo_matched",
        "ta_grpo",
        "ta_grpo_eqsamples",
        "ta_grpo_rename",
        "dagrpo_mask",
        "dagrpo_anchor",
        "dagrpo",
        "dagrpo_ta",
    ]
    handles = [axes[0].plot([1, 2], [i, i + 1])[0] for i in range(len(labels))]
    _legend(fig, handles, labels)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    legend = fig.legends[0].get_window_extent(renderer)
    assert legend.x0 >= 0 and legend.x1 <= fig.bbox.width, (legend, fig.bbox.width)


def _write_checkpoint_evals(run: str, curve: dict[int, float]) -> None:
    """eval_step<N>/ folders as `regroup eval --out` writes them (one benchmark)."""
    from pathlib import Path

    for step, value in curve.items():
        folder = Path(run) / f"eval_step{step}"
        (folder / "val").mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"rows": [{"benchmark": "val", "mean@n": value}]}))
        (folder / "val" / "summary.json").write_text(json.dumps(_summary(value, 0.03, min(1.0, value + 0.2), value)))


def test_learning_curves_are_drawn_with_a_band_over_seeds(tmp_path):
    from regroup.report.plots import group_curve
    from regroup.report.runs import group_runs, samples_per_step

    root = tmp_path / "runs"
    root.mkdir()
    cfg = {**BASE_CONFIG, "grpo": {**BASE_CONFIG["grpo"], "prompts_per_step": 2}}
    a0 = _write_run(root, "grpo-s0", {**cfg, "seed": 0}, ["reward/mean"], 0.5)
    a1 = _write_run(root, "grpo-s1", {**cfg, "seed": 1}, ["reward/mean"], 0.5)
    b = _write_run(root, "dagrpo", {**cfg, "recipe": "dagrpo"}, ["reward/mean"], 0.5)
    _write_checkpoint_evals(a0, {0: 0.40, 50: 0.50, 100: 0.60})
    _write_checkpoint_evals(a1, {0: 0.40, 50: 0.40, 100: 0.50})
    _write_checkpoint_evals(b, {0: 0.40, 100: 0.70})
    runs = [load_run(d) for d in (a0, a1, b)]
    assert runs[0].checkpoint_evals == {0: 0.40, 50: 0.50, 100: 0.60}
    assert samples_per_step(runs[0]) == 16  # 2 questions × G = 8
    groups = {g.label: g for g in group_runs(runs, "grpo")}
    curve = group_curve(groups["grpo"])
    # step 0: 0.4 twice (no spread); step 50: 0.5 and 0.4, mean 0.45, sd 0.0707, SE 0.05, t_{.975, 1} = 12.706
    assert curve[0] == (0, pytest.approx(0.40), pytest.approx(0.40), pytest.approx(0.40))
    assert curve[1][1] == pytest.approx(0.45) and curve[1][2] == pytest.approx(0.45 - 12.706 * 0.05)
    assert group_curve(groups["dagrpo"])[1] == (100, 0.70, None, None)  # one seed: no band
    out = tmp_path / "rep"
    html_path, md_path = build_report([a0, a1, b], str(out))
    assert (out / "plots" / "curves.png").stat().st_size > 1000
    assert 'src="plots/curves.png"' in open(html_path).read() and "(plots/curves.png)" in open(md_path).read()
    # runs without checkpoint evaluations: a note, no file
    plain = _write_run(root, "plain", cfg, ["reward/mean"], 0.5)
    html_path, _ = build_report([plain], str(tmp_path / "rep2"))
    assert "Learning curves: no run evaluated 2 or more checkpoints" in open(html_path).read()
    assert not (tmp_path / "rep2" / "plots" / "curves.png").exists()


def _as_read(markdown: str) -> str:
    """report.md's text as a reader of the rendered page sees it: backslash escapes and HTML entities resolved."""
    return html.unescape(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown))


@pytest.mark.parametrize(
    ("lines", "named"),
    [
        (['{"step": 2, "reward/mean": 1e308}'], "step 2: reward/mean = 1e+308"),  # the one point of its run
        (['{"step": 2, "reward/mean": -1e308}', '{"step": 3, "reward/mean": 1e308}'], "step 2: reward/mean = -1e+308"),
        (['{"step": 2, "reward/mean": 1' + "0" * 400 + "}"], "step 2: reward/mean = an integer of about 401 digits"),
        (['{"step": 2, "reward/mean": Infinity}', '{"step": 3, "reward/mean": NaN}'], "step 3: reward/mean = nan"),
        (['{"step": 1' + "0" * 308 + ', "reward/mean": 0.5}'], "step 1e+308: reward/mean = 0.5"),
    ],
    ids=["one-huge-point", "huge-range", "huge-int", "non-finite", "huge-step"],
)
def test_a_value_no_axis_can_show_is_left_out_and_named(tmp_path, lines, named):
    """A run whose reward/mean held one point of 1e308 failed the whole report ("arange: cannot compute length")."""
    root = tmp_path / "runs"
    root.mkdir()
    good = _write_run(root, "grpo", BASE_CONFIG, ["reward/mean", "entropy"], 0.5)
    bad = root / "huge"
    bad.mkdir()
    (bad / "config.yaml").write_text(yaml.safe_dump({**BASE_CONFIG, "recipe": "dagrpo"}))
    (bad / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    html_path, md_path = build_report([good, str(bad)], str(tmp_path / "rep"))
    assert (tmp_path / "rep" / "plots" / "reward.png").stat().st_size > 1000
    assert (tmp_path / "rep" / "plots" / "entropy.png").stat().st_size > 1000  # the other plots render too
    page, md = open(html_path).read(), _as_read(open(md_path).read())
    for text in (page, md):
        assert f"Reward: {len(lines)} logged value(s) not drawn" in text
        assert f"run huge, {named}" in text
        assert "Entropy: " not in text.replace("Entropy: not logged", "")  # nothing of entropy was left out


def test_a_plotted_value_within_the_limit_is_drawn_and_not_named(tmp_path):
    """±1e300 is drawn (the limit is inclusive); the bound sits below where the axis math overflows."""
    run = tmp_path / "edge"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(BASE_CONFIG))
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": -1e300}\n{"step": 2, "reward/mean": 1e300}\n')
    html_path, _ = build_report([str(run)], str(tmp_path / "rep"))
    assert (tmp_path / "rep" / "plots" / "reward.png").exists()
    assert "not drawn" not in open(html_path).read()


def test_report_md_shows_markdown_from_a_run_folder_as_text(tmp_path):
    """A recipe label `![t](http://host/t.png)` rendered as an image fetched from outside, `[c](...)` as a link."""
    image, link = "![t](http://host/t.png)", "[c](http://c.example/x)"
    root = tmp_path / "runs"
    root.mkdir()
    base = _write_run(root, "grpo", BASE_CONFIG, ["reward/mean"], 0.5)
    other = _write_run(
        root,
        "odd_name",
        {**BASE_CONFIG, "recipe": image, "optim": {"lr": link}, "seed": "*s* `x` | # _y_"},
        ["reward/mean"],
        0.6,
    )
    html_path, md_path = build_report([base, other], str(tmp_path / "rep"))
    raw = open(md_path).read()
    # the report's own figures are its only images, each on a line of its own
    own = [line for line in raw.splitlines() if not re.fullmatch(r"!\[[\w@ ]+\]\(plots/\w+\.png\)", line)]
    assert not any("![" in line or "](" in line for line in own)
    assert "[c]" not in raw and "<b>" not in raw
    assert "\\!\\[t\\]\\(http://host/t\\.png\\)" in raw  # escaped, character for character
    assert "\\[c\\]\\(http://c\\.example/x\\)" in raw
    assert "\\*s\\* \\`x\\` \\| \\# \\_y\\_" in raw  # the seed: emphasis, code, a pipe and a heading mark
    assert "odd_name" in raw  # an underscore inside a word cannot start emphasis and is kept as it is
    read = _as_read(raw)
    assert f"**{image}**" in read and link in read and "*s* `x` | # _y_" in read
    page = open(html_path).read()  # the HTML page was safe already: the label as escaped text
    assert "<b>![t](http://host/t.png)</b>" in page and '<img src="http' not in page
