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
