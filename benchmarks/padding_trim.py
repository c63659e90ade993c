"""Does dropping all-padding columns per micro-batch help the update? (logprobs._trim_padding)

    python benchmarks/padding_trim.py

32 samples in 8 groups of 4 (prompts 60..130 positions, responses 8..20 tokens, one group of 48-token
responses, so `collate` pads every row to 48), update forward + backward in 4 micro-batches of 8,
with and without the trimming, alternated; medians over 7 rounds after 1.
"""

import statistics
import time

import torch

import regroup.models.logprobs as L
from regroup.batch import Sample, collate
from regroup.models.tiny import build_model, build_tokenizer

torch.set_num_threads(1)
tok = build_tokenizer()
model = build_model(tok)
model.train()
g = torch.Generator().manual_seed(0)
samples = []
for q in range(8):
    prompt = torch.randint(5, 100, (60 + 10 * q,), generator=g).tolist()  # prompt lengths 60..130
    for j in range(4):
        n = 48 if q == 7 else 8 + 4 * j  # the last group is long: collate pads everyone to 48
        samples.append(Sample(q, "q", 0, False, prompt, prompt, torch.randint(5, 100, (n,), generator=g).tolist(), ""))
batch = collate(samples, tok.pad_token_id)
micro = [batch.select(slice(i, i + 8)) for i in range(0, 32, 8)]
trim = L._trim_padding


def no_trim(b, p, t):
    return b.input_ids, b.attention_mask, b.position_ids, p, t


times = {"trim": [], "no_trim": []}
for _round in range(8):
    for name, fn in (("trim", trim), ("no_trim", no_trim)):
        L._trim_padding = fn
        t0 = time.perf_counter()
        for mb in micro:
            lp, _ = L.response_logps(model, mb, 1.0)
            (lp * mb.completion_mask).sum().backward()
        model.zero_grad(set_to_none=True)
        times[name].append(time.perf_counter() - t0)
for k, v in times.items():
    print(k, f"median {statistics.median(v[1:]):.3f} min {min(v[1:]):.3f} max {max(v[1:]):.3f}")
