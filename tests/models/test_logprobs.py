"""The shared-prefix forward equals the padded forward: log-probs and parameter gradients (fp32)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from regroup.batch import RolloutBatch, Sample, collate
from regroup.models.logprobs import distinct_prompts, response_logps, shared_prefix_supported

# REGROUP_TEST_DEVICE=cuda runs the equality test on a GPU (its SDPA kernels differ from the CPU's);
# benchmarks/gpu_session.sh does so when a session is lent one.
DEVICE = os.environ.get("REGROUP_TEST_DEVICE", "cpu")


def _models():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from regroup.models.tiny import TinyModelConfig, build_model, build_tokenizer

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
    yield (
        "tiny-qwen3-sdpa",
        build_model(
            build_tokenizer(), TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), seed=0
        ),
    )
    torch.manual_seed(0)
    yield "llama-eager", LlamaForCausalLM(LlamaConfig(attn_implementation="eager", **common))
    yield "qwen2-sdpa-bias", Qwen2ForCausalLM(Qwen2Config(**common))


def _sample(prompt, response, ratio_prompt=None, anchor=False, group=0):
    return Sample(
        group_id=group,
        question_id="q",
        variant=0,
        is_anchor=anchor,
        prompt_ids=prompt,
        ratio_prompt_ids=ratio_prompt or prompt,
        response_ids=response,
        response_text="",
    )


def _rand(n, gen):
    return torch.randint(5, 100, (n,), generator=gen).tolist()


def _grpo_samples(gen):
    """Two groups of 3 with prompts of different lengths (left padding) plus a singleton prompt."""
    a, b, c = _rand(9, gen), _rand(5, gen), _rand(7, gen)
    return (
        [_sample(a, _rand(n, gen), group=0) for n in (6, 2, 4)]
        + [_sample(b, _rand(n, gen), group=1) for n in (3, 6, 1)]
        + [_sample(c, _rand(4, gen), group=2)]
    )


def _ta_grpo_samples(gen):
    """TA-GRPO q0 ratios: variants answer their own prompts, every row is scored on q0."""
    q0 = _rand(8, gen)
    return [
        _sample(_rand(6 + k, gen), _rand(2 + (3 * j + k) % 5, gen), ratio_prompt=q0) for k in range(3) for j in range(3)
    ]


def _anchor_samples(gen):
    """DaGRPO: a group's sampled responses plus an off-policy anchor on the same prompt."""
    p = _rand(6, gen)
    return [_sample(p, _rand(n, gen)) for n in (3, 5, 2)] + [_sample(p, _rand(7, gen), anchor=True)]


def _long_anchor_samples(gen):
    """DaGRPO with a reference solution much longer than the sampled responses: two length buckets."""
    p, q = _rand(6, gen), _rand(9, gen)
    return (
        [_sample(p, _rand(n, gen)) for n in (3, 2, 4)]
        + [_sample(p, _rand(20, gen), anchor=True)]
        + [_sample(q, _rand(n, gen), group=1) for n in (1, 4, 3)]
        + [_sample(q, _rand(17, gen), anchor=True, group=1)]
    )


def _logps_and_grads(model, batch, shared, temperature):
    model.zero_grad(set_to_none=True)
    logps, entropy = response_logps(model, batch, temperature, with_entropy=True, shared_prefix=shared)
    mask = batch.completion_mask
    weights = torch.linspace(-1.0, 2.0, mask.numel(), device=mask.device).view_as(
        mask
    )  # any loss: distinct weight per token
    (logps * weights * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach() * mask, entropy * mask, grads


@pytest.mark.parametrize("name, model", list(_models()))
@pytest.mark.parametrize("build", [_grpo_samples, _ta_grpo_samples, _anchor_samples, _long_anchor_samples])
def test_shared_prefix_equals_padded_forward(name, model, build):
    model.to(DEVICE).train()  # the update runs in train mode (dropout is 0 in these configs)
    assert shared_prefix_supported(model)
    gen = torch.Generator().manual_seed(3)
    samples = build(gen)
    batch = collate(
        samples, pad_id=0, completion_length=max(len(s.response_ids) for s in samples) + 2
    )  # +2 all-pad columns
    batch = RolloutBatch(**{k: v.to(DEVICE) for k, v in batch.__dict__.items()})
    for temperature in (1.0, 0.7):
        plain = _logps_and_grads(model, batch, False, temperature)
        shared = _logps_and_grads(model, batch, True, temperature)
        torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=1e-5)
        assert shared[2].keys() == plain[2].keys() and len(plain[2]) == len(list(model.parameters()))
        for n in plain[2]:
            torch.testing.assert_close(shared[2][n], plain[2][n], atol=1e-5, rtol=1e-5, msg=n)


def test_shared_prefix_equals_the_untrimmed_full_forward():
    """Independent of both code paths: one plain HF forward over the whole padded batch."""
    _, model = next(_models())
    samples = _grpo_samples(torch.Generator().manual_seed(1))
    batch = collate(samples, pad_id=0, completion_length=12)
    t = batch.completion_length
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits[:, -t - 1 : -1]  # [B, T, V]
        expected = logits.log_softmax(-1).gather(-1, batch.input_ids[:, -t:, None]).squeeze(-1) * batch.completion_mask
        got, _ = response_logps(model, batch, 1.0)
    torch.testing.assert_close(got * batch.completion_mask, expected, atol=1e-5, rtol=1e-5)
    assert bool((got[:, 8:] == 0).all())  # columns past the longest response were never computed


def test_each_distinct_prompt_is_forwarded_once():
    _, model = next(_models())
    samples = _grpo_samples(torch.Generator().manual_seed(2))
    batch = collate(samples, pad_id=0)
    rows = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, inp, out: rows.append(tuple(inp[0].shape)))
    try:
        response_logps(model, batch, 1.0)
    finally:
        hook.remove()
    p, t = batch.input_ids.shape[1] - batch.completion_length, batch.completion_length
    # 3 distinct prompts once, then the 7 responses without their last token (fed 5, 1, 3 | 2, 5, 0 | 3
    # positions) packed per prompt into lines of 5: [5] [3 1] | [5] [2] | [3]
    assert rows == [(3, p), (5, t - 1)]
    rows.clear()
    hook = model.get_input_embeddings().register_forward_hook(lambda m, inp, out: rows.append(tuple(inp[0].shape)))
    try:
        response_logps(model, batch, 1.0, shared_prefix=False)
    finally:
        hook.remove()
    assert rows == [(7, p + t)]


def test_distinct_prompts_by_content_not_position():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [3, 5, 6], [7, 8, 9]])
    attention = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1]])
    ids[3, 0] = 4  # a different pad token id under the mask is still the same prompt
    first, prompt_of_row = distinct_prompts(ids, attention)
    assert first.tolist() == [0, 1]
    assert prompt_of_row.tolist() == [0, 1, 0, 0, 1]


def test_falls_back_where_not_exact():
    _, model = next(_models())
    model.gradient_checkpointing_enable()
    model.train()
    assert not shared_prefix_supported(model)  # HF disables the cache under checkpointing
    model.eval()
    assert shared_prefix_supported(model)
    model.gradient_checkpointing_disable()
    model.config._attn_implementation = "flash_attention_2"  # takes no 4-D mask for the packed lines
    assert not shared_prefix_supported(model)
    model.config._attn_implementation = "sdpa"
    assert shared_prefix_supported(model)

    class Other(torch.nn.Module):
        config = type("C", (), {"model_type": "gpt2"})()

    assert not shared_prefix_supported(Other())


def test_no_repeated_prompt_uses_one_padded_forward():
    _, model = next(_models())
    gen = torch.Generator().manual_seed(4)
    batch = collate([_sample(_rand(4 + i, gen), _rand(3, gen)) for i in range(3)], pad_id=0)
    calls = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, inp, out: calls.append(inp[0].shape[0]))
    try:
        shared, _ = response_logps(model, batch, 1.0)
    finally:
        hook.remove()
    assert calls == [3]
    plain, _ = response_logps(model, batch, 1.0, shared_prefix=False)
    torch.testing.assert_close(shared, plain)


def test_all_empty_responses_still_give_a_differentiable_result():
    _, model = next(_models())
    gen = torch.Generator().manual_seed(5)
    p = _rand(5, gen)
    batch = collate([_sample(p, []), _sample(p, [])], pad_id=0)
    logps, _ = response_logps(model, batch, 1.0)
    assert logps.shape == (2, 1) and logps.requires_grad
    (logps * batch.completion_mask).sum().backward()  # a zero loss, but no error


def test_pack_rows_first_fit_decreasing_within_a_prompt():
    from regroup.models.logprobs import pack_rows

    # prompt 0: 5 | 3 + 2 | 1 ; prompt 1: 4 + 1 (never beside prompt 0's rows) ; a row of 0 feeds nothing
    place, line_prompt = pack_rows([3, 5, 1, 2, 4, 0, 1], [0, 0, 0, 0, 1, 1, 1], width=5)
    assert line_prompt == [0, 0, 0, 1]
    assert place == [(1, 0), (0, 0), (2, 0), (1, 3), (3, 0), (-1, 0), (3, 4)]
    place, line_prompt = pack_rows([2, 2, 2], [0, 0, 0], width=6)
    assert place == [(0, 0), (0, 2), (0, 4)] and line_prompt == [0]
    with pytest.raises(ValueError, match="line width"):
        pack_rows([7], [0], width=6)


def test_pack_rows_never_overlaps_and_keeps_prompts_apart():
    import random

    from regroup.models.logprobs import pack_rows

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 40)
        lengths = [rng.randint(0, 30) for _ in range(n)]
        prompts = [rng.randint(0, 4) for _ in range(n)]
        width = max(max(lengths), 1)
        place, line_prompt = pack_rows(lengths, prompts, width)
        used: dict[int, set[int]] = {}
        for i, ((line, offset), length) in enumerate(zip(place, lengths)):
            if length == 0:
                assert line == -1
                continue
            assert line_prompt[line] == prompts[i] and 0 <= offset and offset + length <= width
            slots = set(range(offset, offset + length))
            assert not slots & used.get(line, set())  # no two rows share a slot
            used.setdefault(line, set()).update(slots)
        assert sorted(used) == list(range(len(line_prompt)))  # no empty line
        # first-fit leaves at most one line of a prompt half full or less
        for prompt in set(prompts):
            total = sum(n for n, p in zip(lengths, prompts) if p == prompt)
            assert line_prompt.count(prompt) <= max(1, 2 * math.ceil(total / width))


def test_rows_beside_a_long_anchor_share_lines():
    _, model = next(_models())
    batch = collate(_long_anchor_samples(torch.Generator().manual_seed(6)), pad_id=0)
    rows = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, inp, out: rows.append(tuple(inp[0].shape)))
    try:
        response_logps(model, batch, 1.0)
    finally:
        hook.remove()
    p = batch.input_ids.shape[1] - batch.completion_length
    # 2 prompts once; rows feed 2 1 3 19 | 0 3 2 16 positions: lines of 19 hold [19] [3 2 1] | [16 3] [2]
    assert rows == [(2, p), (4, 19)]


def test_order_by_prompt_puts_a_groups_rows_and_anchor_together():
    from regroup.models.logprobs import order_by_prompt

    a, b = [5, 6], [7]
    rows = [
        _sample(a, [1]),
        _sample(b, [2]),
        _sample(a, [3]),
        _sample(b, [4]),
        _sample(a, [9], anchor=True),
        _sample(b, [8], anchor=True),
    ]
    ordered = order_by_prompt(rows)
    assert [s.response_ids[0] for s in ordered] == [1, 3, 9, 2, 4, 8]
    assert sorted(map(id, ordered)) == sorted(map(id, rows))  # the same samples, none lost


def test_auto_shared_prefix_is_on_for_cpu_only_and_explicit_values_win():
    from regroup.errors import ConfigError
    from regroup.models.logprobs import use_shared_prefix
    from regroup.train.run_config import load_config

    assert use_shared_prefix("auto", "cpu") and use_shared_prefix("auto", torch.device("cpu"))
    assert not use_shared_prefix("auto", "cuda:0")  # no GPU needed: only the device type is read
    assert use_shared_prefix(True, "cuda") and not use_shared_prefix(False, "cpu")
    assert load_config(None, []).grpo.shared_prefix == "auto"
    assert load_config(None, ["grpo.shared_prefix=false"]).grpo.shared_prefix is False
    for bad in ("grpo.shared_prefix=1", "grpo.shared_prefix=sometimes"):
        with pytest.raises(ConfigError, match="grpo.shared_prefix"):
            load_config(None, [bad])
