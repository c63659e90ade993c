"""Warm-up smoke test at a tiny budget (the full warm-up is measured, not tested: see README)."""

import json

from transformers import AutoModelForCausalLM, AutoTokenizer

from regroup.models.tiny import TinyModelConfig
from regroup.train.warmup import BAND, WarmupConfig, ensure_warm_model, in_band, warmup


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
    metrics = warmup(tmp_path / "w", cfg, log=lambda m: None)
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


def test_band_check():
    ok = {"heldout_pass1": 0.45, "group_mixed": 0.6, "group_all_correct": 0.2, "group_all_wrong": 0.2}
    assert in_band(ok)
    assert not in_band({**ok, "heldout_pass1": 0.7})
    assert not in_band({**ok, "group_all_wrong": 0.01})
    assert BAND["heldout_pass1"] == (0.25, 0.65)
