"""The lean KV-cached sampler: seeded, batch-independent, EOS handling, logps match a full forward."""

import torch

from regroup.models.prompting import encode_prompt
from regroup.rollout.base import SamplingParams
from regroup.rollout.hf import HFGenerateSampler, HFSampler, _top_p_filter


def _load(path):
    from transformers import AutoModelForCausalLM

    from regroup.models.load import load_tokenizer

    return AutoModelForCausalLM.from_pretrained(path), load_tokenizer(path)


def test_same_seed_same_samples_and_batch_independence(tiny_model_dir):
    model, tok = _load(tiny_model_dir)
    prompts = [encode_prompt(tok, q) for q in ["Mia has 3 cats.", "Tom has 12 apples. He eats 2.", "x"]]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, n=3)
    a = HFSampler(model, tok, batch_size=64).generate(prompts, params, seed=[11, 12, 13])
    b = HFSampler(model, tok, batch_size=3).generate(prompts[1:], params, seed=[12, 13])
    assert [c.token_ids for c in a[3:]] == [c.token_ids for c in b]
    c = HFSampler(model, tok).generate(prompts, params, seed=[11, 12, 99])
    assert [x.token_ids for x in a[:6]] == [x.token_ids for x in c[:6]]
    assert [x.token_ids for x in a[6:]] != [x.token_ids for x in c[6:]]


def test_behaviour_logps_equal_a_full_forward(tiny_model_dir):
    model, tok = _load(tiny_model_dir)
    prompt = encode_prompt(tok, "Ann has 4 pens. She finds 3 more.")
    params = SamplingParams(temperature=0.7, max_new_tokens=10, n=2)
    for comp in HFSampler(model, tok).generate([prompt], params, seed=5):
        ids = torch.tensor([prompt + comp.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(comp.token_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(comp.logps), expected, atol=1e-4, rtol=1e-4)
        assert len(comp.token_ids) == 10 or comp.token_ids[-1] == tok.eos_token_id
        assert comp.truncated == (tok.eos_token_id not in comp.token_ids)


def test_greedy_matches_hf_generate(tiny_model_dir):
    model, tok = _load(tiny_model_dir)
    prompts = [encode_prompt(tok, "Bo has 9 keys."), encode_prompt(tok, "Li has 15 coins. She loses 4.")]
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    ours = HFSampler(model, tok).generate(prompts, params, seed=0)
    ref = HFGenerateSampler(model, tok).generate(prompts, params, seed=0)
    assert [c.token_ids for c in ours] == [c.token_ids for c in ref]


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(_top_p_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7 <= 0.8
    assert torch.isfinite(_top_p_filter(logits, 1.0)).all()


def test_sampling_follows_the_distribution(tiny_model_dir):
    """Gumbel-max sampling: first-token frequencies over many seeds match softmax(logits / T)."""
    model, tok = _load(tiny_model_dir)
    prompt = encode_prompt(tok, "Q")
    params = SamplingParams(temperature=1.0, max_new_tokens=1, n=400)
    comps = HFSampler(model, tok, batch_size=400).generate([prompt], params, seed=3)
    with torch.no_grad():
        probs = model(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in comps]), minlength=probs.numel()).float() / 400
    top = probs.argsort(descending=True)[:3]
    for t in top:  # binomial SE at n=400 is <= 0.025; allow 4 SE
        assert abs(counts[t] - probs[t]) < 0.1
