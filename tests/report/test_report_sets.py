"""What a report must not do: compare accuracies measured on different evaluation sets, give two runs one
name, hide one recipe's curve under another's, or leave a reader without the command that fills a gap."""

from __future__ import annotations

import html
import json
import re

import yaml

from regroup.report import build_report, summarize_runs

CONFIG = {"recipe": "grpo", "seed": 0, "grpo": {"num_generations": 8}, "optim": {"lr": 1e-4}}


def _as_read(markdown: str) -> str:
    """report.md's text as a reader of the rendered page sees it: backslash escapes and HTML entities resolved."""
    return html.unescape(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown))


def _run(folder, config: dict, problems: int | None, n: int = 8, mean: float = 0.5, ids: str = "p", metrics=None):
    """A run folder; `problems` evaluated problems (None: no evaluation), per-problem ids `{ids}{i}`."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    records = metrics or [{"step": s, "reward/mean": 0.1 * s} for s in range(1, 4)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if problems is not None:
        for sub, value in (("eval", mean), ("eval_before", 0.3)):
            (folder / sub).mkdir()
            summary = {"num_problems": problems, "n": n, "mean@n": value, "stderr": 0.02, "pass@k": {"1": value}}
            (folder / sub / "summary.json").write_text(json.dumps(summary))
            rows = [{"id": f"{ids}{i}", "n": n, "correct": round(value * n)} for i in range(problems)]
            (folder / sub / "per_problem.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def test_a_quick_and_a_full_demo_run_are_named_apart_and_not_compared(tmp_path):
    """The README's `regroup report runs/demo-*/grpo-s0` matched a quick and a full demo: it printed
    "grpo [grpo-s0] beats grpo [grpo-s0]: mean@8 +74.4" across two different evaluation sets."""
    quick = _run(tmp_path / "demo-a" / "grpo-s0", {**CONFIG, "train": {"steps": 3}}, 32, n=4, mean=0.1)
    full = _run(tmp_path / "demo-b" / "grpo-s0", {**CONFIG, "train": {"steps": 50}}, 200, n=8, mean=0.84)
    warned: list[str] = []
    html, md = build_report([quick, full], str(tmp_path / "rep"), warn=warned.append)
    rows = summarize_runs([quick, full])
    assert [r["label"] for r in rows] == ["grpo [demo-a/grpo-s0]", "grpo [demo-b/grpo-s0]"]
    assert rows[1]["delta_baseline"] is None and rows[1]["baseline_set_differs"]
    assert rows[0]["delta_start"] is not None  # each against its own start: the same set
    expected = (
        "grpo [demo-b/grpo-s0] and grpo [demo-a/grpo-s0] were evaluated on different sets (200 problems × 8 "
        "samples against 32 problems × 4 samples), so they are not compared"
    )
    assert len(warned) == 1 and warned[0].startswith(expected)
    text = _as_read(open(md).read())
    assert expected in text and "beats" not in text and "other eval set" in text
    assert "grpo [demo-b/grpo-s0]" in open(html).read()


def test_the_same_counts_on_other_problems_are_not_compared_either(tmp_path):
    a = _run(tmp_path / "a", CONFIG, 16, ids="train-")
    b = _run(tmp_path / "b", {**CONFIG, "recipe": "dagrpo"}, 16, ids="held-", mean=0.9)
    rows = {r["recipe"]: r for r in summarize_runs([a, b])}
    assert rows["dagrpo"]["delta_baseline"] is None and rows["dagrpo"]["baseline_set_differs"]
    c = _run(tmp_path / "c", {**CONFIG, "recipe": "dagrpo"}, 16, ids="train-", mean=0.9)
    rows = {r["recipe"]: r for r in summarize_runs([a, c])}
    assert abs(rows["dagrpo"]["delta_baseline"] - 0.4) < 1e-12  # the same problems: compared


def test_seeds_evaluated_on_different_sets_are_flagged_and_not_compared_with_their_start(tmp_path):
    s0 = _run(tmp_path / "s0", CONFIG, 32, n=4)
    s1 = _run(tmp_path / "s1", {**CONFIG, "seed": 1}, 200, n=8)
    warned: list[str] = []
    build_report([s0, s1], str(tmp_path / "rep"), warn=warned.append)
    (row,) = summarize_runs([s0, s1])
    assert row["eval_sets_mixed"] == ["32 problems × 4 samples", "200 problems × 8 samples"]
    assert row["delta_start"] is None
    assert warned and "its runs were evaluated on different sets" in warned[0]


def test_a_run_without_an_evaluation_is_given_the_command_that_writes_one(tmp_path):
    run = tmp_path / "grpo-run"
    _run(run, CONFIG, None)
    for step in (2, 10):
        (run / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    _, md = build_report([str(run)], str(tmp_path / "rep"))
    assert (
        f"grpo: no eval/summary.json, so no accuracy is reported for it; `regroup eval --model "
        f"{run}/checkpoints/step-000010 --data FILE --out {run}/eval` writes it"
    ) in _as_read(open(md).read())


def test_the_markdown_captions_read_as_written(tmp_path):
    """report.md showed "logged only when β &gt; 0" under the KL figure."""
    run = _run(tmp_path / "r", CONFIG, None, metrics=[{"step": s, "kl": 0.01 * s} for s in range(1, 5)])
    _, md = build_report([run], str(tmp_path / "rep"))
    text = open(md).read()
    assert "(logged only when β > 0)." in text and "&gt;" not in text


def test_two_recipes_with_the_same_curve_both_show(tmp_path):
    """In reward.png one recipe's curve hid another's: the same values, drawn on top, in one solid style."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_rgb

    from regroup.report.plots import TRAINING_PLOTS, assign_colors, training_figure
    from regroup.report.runs import group_runs, load_run

    same = [{"step": s, "reward/mean": 0.3 + 0.02 * s + 0.05 * (s % 3)} for s in range(1, 31)]
    runs = [
        load_run(_run(tmp_path / name, {**CONFIG, "recipe": name}, None, metrics=same))
        for name in ("grpo", "grpo_matched")
    ]
    groups = group_runs(runs, "grpo")
    colors = assign_colors([g.label for g in groups])
    spec = next(s for s in TRAINING_PLOTS if s.name == "reward")
    fig, _ = training_figure(spec, groups, colors)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].astype(float) / 255  # [H, W, 3]
    box = fig.axes[0].get_window_extent()  # the panel alone: the legend above shows both colours anyway
    height = image.shape[0]
    panel = image[int(height - box.y1) : int(height - box.y0), int(box.x0) : int(box.x1)]
    for label, color in colors.items():
        close = (np.abs(panel - np.array(to_rgb(color))).max(axis=-1) < 0.08).sum()
        assert close > 50, f"{label}'s curve shows in only {close} pixels of the panel"
