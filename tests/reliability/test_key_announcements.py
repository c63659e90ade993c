"""Every client that will send an API key (the judge, the rewriter, the vLLM server client) is named, with the
variable and the host, before the weights load: a saved config chooses both, so the user sees where a key goes
before any request. The key's value is never printed."""

from __future__ import annotations

import pytest
import reliability_helpers as h

pytestmark = pytest.mark.reliability


def test_a_key_sent_to_a_host_is_named_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch, no_weights):
    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    monkeypatch.setenv("JUDGE_TOKEN_VARIABLE", "the-secret-value")
    cfg = load_config(
        h.CONFIGS / "dagrpo.yaml",
        h.small_overrides(tiny_model_dir, tmp_path / "run")
        + [
            "mask.scorer.name=judge",
            "mask.scorer.base_url=http://judge.example.org:8443/v1",
            "mask.scorer.api_key_env=JUDGE_TOKEN_VARIABLE",
        ],
    )
    said = []
    with pytest.raises(AssertionError, match="weights were loaded"):
        build_trainer(cfg, tmp_path / "run", log=said.append)
    named = [line for line in said if "JUDGE_TOKEN_VARIABLE" in line]
    assert named == [
        "the judge sends the value of $JUDGE_TOKEN_VARIABLE as its key to http://judge.example.org:8443 "
        "(mask.scorer.api_key_env, mask.scorer.base_url)"
    ]
    assert not any("the-secret-value" in line for line in said)


def test_the_vllm_server_key_is_named_too():
    from regroup.train.preflight import announce_keys
    from regroup.train.run_config import load_config

    cfg = load_config(
        "grpo",
        [
            "rollout.backend=vllm_server",
            "rollout.vllm_server_url=http://10.0.0.9:8000",
            "rollout.vllm_server_api_key_env=VK",
        ],
    )
    said = []
    announce_keys(cfg, said.append)
    assert said == [
        "the vLLM server client sends the value of $VK as its key to http://10.0.0.9:8000 "
        "(rollout.vllm_server_api_key_env, rollout.vllm_server_url)"
    ]
