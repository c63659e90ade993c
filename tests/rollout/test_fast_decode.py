"""The lean decoder reproduces the HF forward (prefill and every decode step) and the sampler's output."""

import pytest
import torch

from regroup.models.prompting import encode_prompt
from regroup.rollout.base import SamplingParams
from regroup.rollout.fast_decode import FastDecoder, supports
from regroup.rollout.hf import HFSampler


def _models():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    yield "qwen3", Qwen3ForCausalLM(Qwen3Config(head_dim=8, tie_word_embeddings=True, **common))
    yield "qwen2", Qwen2ForCausalLM(Qwen2Config(**common))
    yield "llama", LlamaForCausalLM(LlamaConfig(**common))


@pytest.mark.parametrize("name, model", list(_models()))
def test_logits_match_hf_forward(name, model):
    model.eval()
    assert supports(model)
    b, p, steps = 3, 7, 5
    ids = torch.randint(2, 101, (b, p + steps))
    attention = torch.ones_like(ids)
    attention[0, :3] = 0  # left padding on two rows
    attention[2, :1] = 0
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits  # [B, P+S, V]
        dec = FastDecoder(model)
        logits, state = dec.start(ids[:, :p], attention[:, :p], positions[:, :p], max_new_tokens=steps)
        torch.testing.assert_close(logits, full[:, p - 1], atol=1e-5, rtol=1e-4)
        for t in range(steps - 1):
            logits = dec.step(ids[:, p + t], positions[:, p + t], state)
            torch.testing.assert_close(logits, full[:, p + t], atol=1e-5, rtol=1e-4)


def test_peft_models_fall_back():
    class Wrapped(torch.nn.Module):
        peft_config = {}
        config = type("C", (), {"model_type": "qwen3"})()

    assert not supports(Wrapped())


def test_sampler_fast_path_equals_hf_path(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from regroup.models.load import load_tokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), load_tokenizer(tiny_model_dir)
    prompts = [encode_prompt(tok, q) for q in ["Mia has 3 cats.", "Tom has 12 apples. He eats 2. How many?"]]
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_new_tokens=12, n=3)
        fast = HFSampler(model, tok, use_fast=True).generate(prompts, params, seed=[4, 5])
        slow = HFSampler(model, tok, use_fast=False).generate(prompts, params, seed=[4, 5])
        assert [c.token_ids for c in fast] == [c.token_ids for c in slow]
        for a, b in zip(fast, slow):
            torch.testing.assert_close(torch.tensor(a.logps), torch.tensor(b.logps), atol=1e-4, rtol=1e-4)


def test_distinct_prompt_rows_in_first_appearance_order():
    from regroup.rollout.hf import distinct_prompt_rows

    assert distinct_prompt_rows([[5, 6], [7], [5, 6], [7], [8]]) == ([[5, 6], [7], [8]], [0, 1, 0, 1, 2])
    assert distinct_prompt_rows([[5, 6], [5, 6]], share=False) == ([[5, 6], [5, 6]], [0, 1])


@pytest.mark.parametrize("use_fast", [True, False])
def test_shared_prefill_samples_what_one_prefill_per_row_samples(tiny_model_dir, use_fast, monkeypatch):
    """The trainer's call: one row per sample, a group's rows repeating its prompt, one seed per row."""
    from transformers import AutoModelForCausalLM

    from regroup.models.load import load_tokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), load_tokenizer(tiny_model_dir)
    questions = ["Mia has 3 cats.", "Tom has 12 apples. He eats 2. How many?", "Sum 4 and 5."]
    prompts = [encode_prompt(tok, q) for q in questions for _ in range(4)]  # 3 groups x G = 4
    seeds = list(range(100, 112))
    prefills = []
    original = FastDecoder._forward
    monkeypatch.setattr(
        FastDecoder, "_forward", lambda self, ids, *a: prefills.append(tuple(ids.shape)) or original(self, ids, *a)
    )
    hook = model.get_input_embeddings().register_forward_hook(lambda m, inp, out: prefills.append(tuple(inp[0].shape)))
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=16, n=1)
        shared = HFSampler(model, tok, use_fast=use_fast, shared_prefill=True).generate(prompts, params, seed=seeds)
        per_row = HFSampler(model, tok, use_fast=use_fast, shared_prefill=False).generate(prompts, params, seed=seeds)
    finally:
        hook.remove()
    assert [c.token_ids for c in shared] == [c.token_ids for c in per_row]
    assert len({tuple(c.token_ids) for c in shared}) > 3  # rows of one prompt did draw different samples
    for a, b in zip(shared, per_row):
        torch.testing.assert_close(torch.tensor(a.logps), torch.tensor(b.logps), atol=1e-5, rtol=1e-5)
    prefill_rows = [shape[0] for shape in prefills if shape[1] > 1]  # decode steps feed one position
    assert prefill_rows == [3, 12]  # the shared sampler prefilled 3 distinct prompts, the other 12 rows


@pytest.mark.parametrize("use_fast", [True, False])
def test_dropping_finished_rows_samples_the_same_and_shrinks_the_batch(tiny_model_dir, use_fast, monkeypatch):
    """Rows that ended leave the decode batch; every other row samples exactly what it sampled before."""
    from transformers import AutoModelForCausalLM

    from regroup.models.load import load_tokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(tiny_model_dir), load_tokenizer(tiny_model_dir)
    questions = ["Mia has 3 cats.", "Tom has 12 apples. He eats 2. How many?", "Sum 4 and 5."]
    prompts = [encode_prompt(tok, q) for q in questions for _ in range(8)]  # 3 groups x G = 8
    with torch.no_grad():  # make EOS likely enough that rows end at different steps
        hidden = model(torch.tensor([prompts[1]]), output_hidden_states=True).hidden_states[-1][0].mean(0)  # [H]
        model.lm_head.weight[tok.eos_token_id] += 3.0 * hidden / hidden.pow(2).sum()
    rows_per_call = []
    original = FastDecoder._forward
    monkeypatch.setattr(
        FastDecoder, "_forward", lambda self, ids, *a: rows_per_call.append(tuple(ids.shape)) or original(self, ids, *a)
    )
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, inp, out: rows_per_call.append(tuple(inp[0].shape))
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=24, n=1)
    seeds = list(range(200, 224))
    try:
        kept = HFSampler(model, tok, use_fast=use_fast, drop_finished=False).generate(prompts, params, seed=seeds)
        kept_rows = [shape[0] for shape in rows_per_call if shape[1] == 1]  # decode steps feed one position
        rows_per_call.clear()
        dropped = HFSampler(model, tok, use_fast=use_fast, drop_finished=True).generate(prompts, params, seed=seeds)
        dropped_rows = [shape[0] for shape in rows_per_call if shape[1] == 1]
    finally:
        hook.remove()
    lengths = sorted(len(c.token_ids) for c in kept)
    assert lengths[0] < 12 and lengths[-1] == 24  # some rows ended early, some ran to the limit
    assert [c.token_ids for c in dropped] == [c.token_ids for c in kept]
    assert [c.truncated for c in dropped] == [c.truncated for c in kept]
    for a, b in zip(dropped, kept):
        torch.testing.assert_close(torch.tensor(a.logps), torch.tensor(b.logps), atol=1e-5, rtol=1e-5)
    assert set(kept_rows) == {24} and len(dropped_rows) == len(kept_rows) == 23
    assert dropped_rows == sorted(dropped_rows, reverse=True) and dropped_rows[-1] < 24
    running_at = [sum(len(c.token_ids) > t + 1 for c in kept) for t in range(23)]  # rows that feed step t+1
    assert all(r >= n for r, n in zip(dropped_rows, running_at))  # never drops a row that still runs
