"""studies.real2: the v2 design's plan, its unseen-chain split, its evaluation streams and its plumbing."""

import json
from dataclasses import replace

import pytest

from studies.real2 import (
    DEFAULT_ARMS,
    HARD,
    QUICK,
    REAL2_ARMS_BY_NAME,
    Real2Settings,
    chain_of,
    eval_seed,
    hard_ids,
    power_plan,
    real2_results,
    summarize_real2,
    unseen_chain_split,
)


def test_the_dry_run_builds_the_plan_with_its_power_and_cost_and_runs_nothing(tmp_path, capsys):
    from studies.cli import main as study_main

    assert study_main(["--real2", "--dry-run", "--out", str(tmp_path)]) == 0
    plan = json.loads(capsys.readouterr().out)
    s = Real2Settings()
    assert not any(tmp_path.iterdir())
    assert [c["protocol"] for c in plan["primaries"]] == [HARD, HARD, "t1"]
    assert [c["measure"] for c in plan["primaries"]] == ["pass@1", "pass@1", "auc/hard"]
    power = plan["power"]
    # the registered seeds are the computed ones, and give >= 80 % at +2.9 at Holm's first step (α/3)
    assert power["seeds_for_80_percent"] == s.registered_seeds == plan["seeds"]["registered"]
    assert power["level_first_holm_step"] == pytest.approx(0.05 / 3)
    assert power["power_at_registered_seeds"]["1.0x sd"] >= 0.8
    assert power["hard_problems"] == int(plan["evaluation"]["hard_stratum"].split()[0])
    cost = plan["cost"]  # 6622 s over 150 x 16 + 2 x 512 samples
    assert cost["seconds_per_sample"] == pytest.approx(6622 / 3424)
    rl = (150 * 16 + 5 * 256 * 4) * 6622 / 3424 / 3600
    assert cost["per_run_hours"]["drgrpo"] == pytest.approx(rl)
    assert cost["design_core_hours"] == pytest.approx(cost["per_seed_core_hours"] * s.registered_seeds)
    assert plan["evaluation"]["checkpoints"]["rl and imitation"] == [0, 25, 50, 100, 150]
    assert study_main(["--real2", "--arms", "nosuch", "--dry-run"]) == 2
    assert study_main(["--real2", "--first-seed", "10", "--seeds", "5", "--dry-run"]) == 2  # past the registered


def test_the_unseen_chain_split_shares_no_chain_or_question_with_training():
    from regroup.data.prepare import arithmetic_boxed

    training = arithmetic_boxed(2000)
    split = unseen_chain_split(training, 256, 2027)
    assert len(split) == 256 and len({p.id for p in split}) == 256
    assert not {chain_of(p) for p in split} & {chain_of(p) for p in training}
    assert not {p.question for p in split} & {p.question for p in training}
    # a chain read from a file row without meta: parsed from the boxed reference solution, the same
    for p in training[:50] + split[:50]:
        assert chain_of(replace(p, meta={})) == chain_of(p)
    hard = hard_ids(split, (3, 4))
    assert 0 < len(hard) < 256 and all(len(chain_of(p)[1]) in (3, 4) for p in split if p.id in hard)


def test_every_run_has_its_own_evaluation_stream():
    seeds = {eval_seed(s, a) for s in range(Real2Settings().registered_seeds) for a in REAL2_ARMS_BY_NAME}
    assert len(seeds) == Real2Settings().registered_seeds * len(REAL2_ARMS_BY_NAME)
    assert eval_seed(3, "drgrpo") == eval_seed(3, "drgrpo") != eval_seed(3, "anchor_no_correct")


def test_the_registered_power_is_stated_from_the_pilot_sd():
    p = power_plan(Real2Settings(), hard_count=144)
    # the 2026-12-02 study's hard-stratum per-seed differences, and two streams' binomial noise on 144 x 4
    assert p["sd_seed_2026_12_02"] == pytest.approx(0.01552, abs=1e-4)
    assert p["sd_used"] ** 2 == pytest.approx(p["sd_seed_2026_12_02"] ** 2 + 2 * p["bernoulli_var_per_sample"] / 576)
    assert p["seeds_for_80_percent_at_sd_seed_only"] <= p["seeds_for_80_percent"]


def _entry(correct, n=4):
    return {"ids": f"p0..{len(correct) - 1}", "n": n, "correct": correct}


def test_the_summary_judges_the_hard_stratum_and_the_auc(tmp_path):
    s = Real2Settings(eval_at=(50, 150))
    rows = []
    for seed, (gain, wobble) in enumerate([(1, 0), (2, 1), (1, 1)]):
        rows.append(
            {
                "regime": "real2",
                "arm": "drgrpo",
                "seed": seed,
                "evals": {
                    "step0": _entry([0, 0, 2, 2]),
                    "step50": _entry([0, 1, 2, 2]),
                    "step150": _entry([1, wobble, 2, 2]),
                },
            }
        )
        rows.append(
            {
                "regime": "real2",
                "arm": "anchor_no_correct",
                "seed": seed,
                "evals": {
                    "step0": _entry([0, 0, 2, 2]),
                    "step50": _entry([gain, 1, 2, 2]),
                    "step150": _entry([1 + gain, wobble, 2, 2]),
                },
            }
        )
    hard = {"p0", "p1"}
    arms = real2_results(rows, hard, "step150")
    assert set(arms["drgrpo"].protocols[HARD][0]) == hard and len(arms["drgrpo"].per_problem[0]) == 4
    # drgrpo seed 0, hard: 0, .125, .125 at steps 0, 50, 150 -> AUC (50 · .0625 + 100 · .125) / 150
    assert arms["drgrpo"].mechanisms[0]["auc/hard"] == pytest.approx((50 * 0.0625 + 100 * 0.125) / 150)
    text = summarize_real2(rows, hard, s)
    assert "| drgrpo | 3 |" in text and text.count("| primary |") == 3
    primary = next(line for line in text.splitlines() if "(hard-stratum pass@1 at the last step)" in line)
    assert "| 3 |" in primary and "not run" not in primary
    assert "not run" in next(line for line in text.splitlines() if "same injected references" in line)


def test_a_quick_run_records_the_anchors_and_the_imitation_control_trains_on_them(tiny_model_dir, tmp_path):
    """Plumbing on the random tiny model (not evidence): every arm evaluated at the start on its own stream and
    at each checkpoint; the imitation control's updates are the anchor run's injected references."""
    from regroup.data.prepare import prepare
    from studies.real2 import injected_references, keep_real2, real2_rows, run_real2

    boxed = tmp_path / "boxed.jsonl"
    prepare("arithmetic_boxed", str(boxed), limit=16)
    s = replace(QUICK, model_dir=tiny_model_dir, train_file=str(boxed), overrides=("anchors.max_tokens=64",))
    study = run_real2(s, out_root=str(tmp_path / "runs"), log=lambda m: None)
    for arm in DEFAULT_ARMS:
        run = study / f"{arm}-s0"
        steps = [0, *(s.sft480_eval_at if arm == "sft_480" else s.eval_at)]
        assert sorted(int(p.name[len("eval_step") :]) for p in run.glob("eval_step*")) == steps, arm
    per_step = injected_references(study / "anchor_no_correct-s0", s.steps)
    updates = json.loads((study / "sft_imitation-s0" / "sft_metrics.json").read_text())["updates"]
    assert 0 < updates == sum(1 for ids in per_step if ids)
    rows = real2_rows([study])
    assert {r["arm"] for r in rows} == set(DEFAULT_ARMS)
    assert {r["extra"]["eval_seed"] for r in rows} == {eval_seed(0, a) for a in DEFAULT_ARMS}
    kept = keep_real2([study], tmp_path / "kept")
    assert sorted(p.name for p in kept.parent.iterdir()) == ["plan.json", "runs.jsonl"]
