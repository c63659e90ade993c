"""Every table and verdict on the results pages is recomputed from the kept records (docs/results/NAME/:
plan.json, regimes.json, runs.jsonl) alone: the summarize step's output stands in the page, line for line."""

from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _block_in_page(generated: str, page: str) -> None:
    """The generated lines stand in the page in the same order, contiguously (blank lines aside)."""
    want = [line for line in generated.splitlines() if line.strip()]
    have = [line for line in page.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(have) if line == want[0]), None)
    assert start is not None, f"the page lacks the summary's first line: {want[0][:120]}"
    mismatch = [(w, h) for w, h in zip(want, have[start : start + len(want)]) if w != h]
    assert not mismatch and len(have) - start >= len(want), mismatch[:3]


def test_the_miniature_study_page_is_its_kept_table_summarized(tmp_path):
    from studies.miniature import summarize_study

    summarize_study([RESULTS / "study-2026-12-03"], tmp_path, log=lambda _: None)
    generated = (tmp_path / "study.md").read_text().split("\n", 1)[1]  # the page has its own title
    _block_in_page(generated, (RESULTS / "study-2026-12-03.md").read_text())


def test_the_real_model_study_page_is_its_kept_table_summarized():
    from studies.real import summarize_real

    generated = summarize_real([RESULTS / "real-study-2026-12-02"])
    _block_in_page(generated, (RESULTS / "real-study-2026-12-02.md").read_text())


@pytest.mark.parametrize(
    "name",
    ["study-2026-12-03", "real-study-2026-12-02", "gate-2026-12-04", "gated-2026-12-04", "gated-warm4-2026-12-04"],
)
def test_a_results_folder_keeps_its_plan_and_one_table_only(name):
    kept = sorted(p.name for p in (RESULTS / name).iterdir())
    allowed = (["plan.json", "regimes.json", "runs.jsonl"], ["plan.json", "runs.jsonl"])
    assert kept in (*allowed, ["plan.json", "regime.json", "runs.jsonl"]), kept


def test_the_gate_page_is_its_kept_table_summarized():
    from studies.gate import summarize_gate

    _block_in_page(summarize_gate([RESULTS / "gate-2026-12-04"]), (RESULTS / "gate-2026-12-04.md").read_text())


@pytest.mark.parametrize("name", ["gated-2026-12-04", "gated-warm4-2026-12-04"])
def test_the_gated_study_pages_are_their_kept_tables_summarized(name, tmp_path):
    import json

    from studies import gated
    from studies.table import read_table

    kept = RESULTS / name
    g = gated.open_study(kept, None)
    generated = gated.summarize(read_table(kept / "runs.jsonl"), g, json.loads((kept / "plan.json").read_text()))
    _block_in_page(generated, (RESULTS / "gated-2026-12-04.md").read_text())


def test_the_gated_page_prints_the_primaries_crossed_intervals_recomputed_from_its_kept_table():
    """The two-way (seeds × problems) bootstrap of each primary, recomputed here from runs.jsonl with its own
    pass@k and the problems in the file's order (another resampling stream than the summary's, so the ends
    agree to Monte Carlo error, a few hundredths of a point), and its crossed random-effects interval stand
    in the page's robustness row."""
    import json
    from math import comb

    import numpy as np

    from studies.stats import crossed_anova_interval, crossed_bootstrap, percentile_interval

    def pass_at(n: int, c: int, k: int) -> float:
        return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)

    rows = [json.loads(line) for line in (RESULTS / "gated-warm4-2026-12-04" / "runs.jsonl").open()]

    def matrix(arm: str, k: int) -> np.ndarray:
        runs = sorted((r for r in rows if r["regime"] == "hard" and r["arm"] == arm), key=lambda r: r["seed"])
        return np.array([[pass_at(r["evals"]["t1"]["n"], c, k) for c in r["evals"]["t1"]["correct"]] for r in runs])

    page = (RESULTS / "gated-2026-12-04.md").read_text()
    for arm, against, k in (("ta_grpo", "grpo_matched", 32), ("dagrpo_anchor_nc", "grpo_drgrpo", 1)):
        diffs = 100 * (matrix(arm, k) - matrix(against, k))
        lo, hi = percentile_interval(crossed_bootstrap(diffs, 100_000, seed=1))
        line = next(x for x in page.splitlines() if x.startswith(f"| {arm} − {against}, pass@{k} | "))
        printed = line.split(" | ")[4].strip("[]").split(", ")
        assert [float(v) for v in printed] == pytest.approx([lo, hi], abs=0.06), (printed, lo, hi)
        assert float(line.split(" | ")[1]) == pytest.approx(diffs.mean(), abs=0.005)
        # the crossed random-effects interval does not resample: it is the same to the printed digit
        _, _, df, (lo, hi) = crossed_anova_interval(diffs)
        assert line.split(" | ")[7] == f"[{lo:+.2f}, {hi:+.2f}] ({df:.0f}) |"
