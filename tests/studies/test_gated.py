"""The gated miniature study's verdicts, curves and plan guard, on hand-made tables (studies/gated.py)."""

import json
import math

import pytest

from studies import gated
from studies.claims import T1
from studies.table import START, row

G = gated.GatedSettings(eval_at=(2, 4), rates=(1e-4, 3e-4), min_gain=0.03)


def entry(correct: list[int], n: int) -> dict:
    return {"ids": [f"p{i}" for i in range(len(correct))], "n": n, "correct": correct}


def gate_rows(best_correct: list[int]) -> list[dict]:
    start = row(gated.GATE, START, 0, {T1: entry([1, 1, 0, 2], 4), "step0": entry([1, 1, 0, 2], 4)})
    slow = row(gated.GATE, "grpo_lr0.0001", 0, {T1: entry([1, 2, 0, 2], 4), "step2": entry([1, 1, 1, 2], 4)})
    fast = row(gated.GATE, "grpo_lr0.0003", 0, {T1: entry(best_correct, 4), "step2": entry([2, 1, 0, 2], 4)})
    return [start, slow, fast]


def test_the_gate_takes_the_better_rate_and_its_gain_over_the_start():
    v = gated.gate_verdict(gate_rows([2, 2, 1, 3]), G)
    by_arm = {r["arm"]: r for r in v["rates"]}
    # start pass@1 per problem: 1/4, 1/4, 0, 2/4 -> mean 0.25; 3e-4: 2/4, 2/4, 1/4, 3/4 -> mean 0.5
    assert by_arm["grpo_lr0.0003"]["gain"] == pytest.approx(0.5 - 0.25)
    assert by_arm["grpo_lr0.0001"]["gain"] == pytest.approx(1 / 16)
    assert v["best"]["arm"] == "grpo_lr0.0003" and v["met"]
    # the curve: step 0 (start), the checkpoint, the last step (T1)
    assert by_arm["grpo_lr0.0003"]["curve"] == {0: 0.25, 2: 0.3125, 4: 0.5}
    # every problem gains one correct sample in four: a zero SE, so the CI is the point
    assert by_arm["grpo_lr0.0003"]["ci"] == pytest.approx((0.25, 0.25))


def test_a_failed_gate_says_the_comparisons_are_uninformative_and_runs_none(tmp_path):
    rows = gate_rows([1, 1, 0, 2])  # 3e-4 ends where it started; 1e-4 gains 6.25 points, short of 10
    small = gated.GatedSettings(eval_at=(2, 4), rates=(1e-4, 3e-4), min_gain=0.10)
    v = gated.gate_verdict(rows, small)
    assert v["best"]["arm"] == "grpo_lr0.0001" and not v["met"]
    page = gated.summarize(rows, small, {"primaries": []})
    assert "**failed**" in page and "uninformative" in page and "primaries" not in page.lower()


def test_ties_go_to_the_smaller_rate():
    v = gated.gate_verdict(gate_rows([1, 2, 0, 2]), G)  # both rates gain 1/16
    assert v["best"]["arm"] == "grpo_lr0.0001"


def test_paired_differences_over_seeds():
    x = gated._paired({0: 0.3, 1: 0.5, 2: 0.4}, {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.9})
    diffs = [0.2, 0.3, 0.1]
    sd = math.sqrt(sum((d - 0.2) ** 2 for d in diffs) / 2)
    assert x["delta"] == pytest.approx(0.2) and x["sd"] == pytest.approx(sd) and x["seeds"] == 3
    assert x["ci"][0] == pytest.approx(0.2 - 4.302652729911275 * sd / math.sqrt(3), rel=1e-6)
    assert gated._paired({0: 0.3}, {0: 0.1}) is None


def test_primaries_are_refused_until_the_gate_has_run_and_is_met(tmp_path):
    gated.open_study(tmp_path, G)
    with pytest.raises(ValueError, match="has not finished"):
        gated.gate_met(tmp_path, G)


def test_a_study_folder_keeps_the_design_it_was_started_with(tmp_path):
    with pytest.raises(ValueError, match="no plan.json"):
        gated.open_study(tmp_path, None)
    assert gated.open_study(tmp_path, G) == G
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["design"]["eval_at"] == [2, 4] and plan["primaries"][0]["difference"] == "ta_grpo − grpo_matched"
    assert gated.open_study(tmp_path, G) == G and gated.open_study(tmp_path, None) == G  # plan.json decides
    with pytest.raises(ValueError, match="another design"):
        gated.open_study(tmp_path, gated.GatedSettings(eval_at=(2, 4), seeds=3))


def test_the_first_design_reads_back_from_its_committed_plan():
    from pathlib import Path

    kept = Path(__file__).resolve().parents[2] / "docs" / "results" / "gated-2026-12-04" / "plan.json"
    assert gated.GatedSettings.from_plan(json.loads(kept.read_text())) == gated.DESIGNS["early420-3-4"]


def test_the_registered_plan_powers_both_primaries():
    for design in gated.DESIGNS.values():
        plan = gated.gated_plan(design)
        assert plan["design"]["steps"] == 96
        for p in plan["primaries"]:
            assert p["power"] >= 0.8 and p["seeds_for_power"] <= p["seeds"]


def _anchors_verdict():
    from studies.claims import SUPPORTED, Comparison, Verdict

    c = Comparison(0.0045, 0.00136, 10, 200, 9.0)
    return Verdict(gated.PRIMARIES[1], gated.REGIME, c, SUPPORTED, p=0.009, p_adjusted=0.009, ci=(0.0015, 0.0076))


def _check(two_way, first_machine_p, crossed=(0.0013, 0.0077)):
    return {
        "two_way": two_way,
        "crossed": (0.0045, 0.0014, 8.6, crossed),
        "machines": [("GPU", list(range(7)), {"p": first_machine_p}), ("CPU", [7, 8, 9], {"p": 0.15})],
        "stratified_p": 0.014,
        "heterogeneity_p": 0.82,
    }


def test_a_verdict_the_checks_would_not_carry_is_flagged_next_to_it():
    label = gated.primary_label(_anchors_verdict(), 96, _check((-0.0001, 0.0093), 0.054))
    assert label.startswith("supported, but smaller than +2.9 pts (derived from the paper's figures;")
    assert "it needs seeds 7–9: seeds 0–6 (GPU) alone give p = 0.054; stratified by machine p = 0.014" in label
    assert "machines differ: p = 0.82" in label
    assert label.endswith(
        "two-way bootstrap's 95 % interval, [-0.01, +0.93], includes 0 (the crossed random-effects 95 % interval, "
        "[+0.13, +0.77], does not)"
    )
    both = gated.primary_label(_anchors_verdict(), 96, _check((-0.0001, 0.0093), 0.054, crossed=(-0.0002, 0.009)))
    assert both.endswith("the crossed random-effects 95 % interval, [-0.02, +0.90], include 0")


def test_a_verdict_both_checks_carry_has_no_flag():
    label = gated.primary_label(_anchors_verdict(), 96, _check((0.001, 0.0093), 0.01))
    assert "needs" not in label and "includes 0" not in label and "96 steps" in label
