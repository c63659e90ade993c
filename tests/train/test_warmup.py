"""Warm-up smoke test at a tiny budget (the full warm-up is measured, not tested: see README)."""

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

from regroup.models.tiny import TinyModelConfig
from regroup.train.warmup import (
    BAND,
    WarmupConfig,
    band_advice,
    differences,
    ensure_warm_model,
    in_band,
    read_finished,
    warmup,
)


def test_warmup_writes_an_hf_model_and_its_metrics(tmp_path):
    cfg = WarmupConfig(
        steps=4,
        schedule_steps=10,
        batch_size=8,
        num_train=64,
        num_eval=6,
        eval_samples=2,
        max_new_tokens=8,
        model=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    )
    logged: list[str] = []
    metrics = warmup(tmp_path / "w", cfg, log=logged.append)
    # 4 steps from a random start: far below the band, and the warning says what to change
    assert not metrics["in_band"] and logged[-1].startswith("warning: the warmed-up model is outside the band")
    assert logged[-1].endswith(
        "; the start is too weak: warm up for more steps (regroup warmup --steps N --out DIR, N above the steps used)"
    )
    saved = json.loads((tmp_path / "w" / "warmup_metrics.json").read_text())
    for key in [
        "heldout_pass1",
        "heldout_greedy",
        "group_all_correct",
        "group_all_wrong",
        "group_mixed",
        "seconds",
        "by_difficulty",
        "transform_pass1",
    ]:
        assert key in saved, key
    assert abs(saved["group_all_correct"] + saved["group_all_wrong"] + saved["group_mixed"] - 1) < 1e-9
    assert set(saved["transform_pass1"]) == {"original", "rename", "reorder", "reword"}
    assert saved["in_band"] == in_band(metrics)
    AutoModelForCausalLM.from_pretrained(tmp_path / "w")
    AutoTokenizer.from_pretrained(tmp_path / "w")
    # cached: a second call does not train again
    stamp = (tmp_path / "w" / "warmup_metrics.json").stat().st_mtime_ns
    assert ensure_warm_model(tmp_path / "w", log=lambda m: None) == str(tmp_path / "w")
    assert (tmp_path / "w" / "warmup_metrics.json").stat().st_mtime_ns == stamp
    # what `regroup warmup` and the demo compare before reusing it
    assert read_finished(tmp_path / "w") == saved
    assert differences(saved, cfg) == []
    assert differences(saved, WarmupConfig(**{**cfg.__dict__, "threads": 7})) == []  # speed, not what it trains
    assert differences(saved, WarmupConfig(**{**cfg.__dict__, "steps": 5})) == ["steps 4 (asked 5)"]
    assert differences({"heldout_pass1": 0.5}, cfg) == []  # metrics that do not record their settings


def test_a_warmup_outside_the_band_on_purpose_says_so_instead(tmp_path):
    cfg = WarmupConfig(
        steps=1,
        schedule_steps=10,
        batch_size=4,
        num_train=16,
        num_eval=2,
        eval_samples=1,
        max_new_tokens=4,
        model=TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32),
    )
    logged: list[str] = []
    warmup(tmp_path / "w", cfg, log=logged.append, out_of_band_note="expected with --quick")
    assert logged[-1].endswith("; expected with --quick") and "too weak" not in logged[-1]


def test_band_advice_points_the_way_back_into_the_band():
    ok = {"heldout_pass1": 0.45, "group_mixed": 0.6, "group_all_correct": 0.2, "group_all_wrong": 0.2}
    weak, strong = "the start is too weak", "the start is too strong"
    assert band_advice({**ok, "heldout_pass1": 0.1}).startswith(weak)
    assert band_advice({**ok, "group_all_correct": 0.01}).startswith(weak)  # nothing all right: more SFT
    assert band_advice({**ok, "heldout_pass1": 0.8}).startswith(strong)
    assert band_advice({**ok, "group_all_wrong": 0.01}).startswith(strong)  # nothing all wrong: less SFT
    # mixed groups too few, pass@1 in the band: away from the larger uniform side
    assert band_advice({**ok, "group_mixed": 0.2, "group_all_wrong": 0.5, "group_all_correct": 0.3}).startswith(weak)
    assert band_advice({**ok, "group_mixed": 0.2, "group_all_wrong": 0.3, "group_all_correct": 0.5}).startswith(strong)


def test_band_check():
    ok = {"heldout_pass1": 0.45, "group_mixed": 0.6, "group_all_correct": 0.2, "group_all_wrong": 0.2}
    assert in_band(ok)
    assert not in_band({**ok, "heldout_pass1": 0.7})
    assert not in_band({**ok, "group_all_wrong": 0.01})
    assert BAND["heldout_pass1"] == (0.25, 0.65)
