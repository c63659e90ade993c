"""regroup.algo == TRL's GRPOTrainer on the same tensors (SPEC §1: "the same settings must give the same loss").

Reference: trl 1.16 `trl/trainer/grpo_trainer.py`:
- advantages: `GRPOTrainer._generate_and_score_completions` (the `scale_rewards` block), called for real
  here with a reward function that returns crafted rewards (None = unscorable);
- loss: `GRPOTrainer._compute_loss` for `loss_type` dapo / grpo / dr_grpo, called for real with crafted
  inputs (old / ref log-probs, advantages, masks), compared to `regroup.algo.losses.policy_loss` on
  log-probs from a plain forward pass of the same model — loss value, every parameter gradient, and the
  clip / KL metrics TRL logs.
Also: accumulation invariance of `policy_loss` (8 micro-batches of 1 == 1 micro-batch of 8).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset
from loss_call import call_policy_loss
from transformers import Qwen3Config, Qwen3ForCausalLM
from trl import GRPOConfig, GRPOTrainer

from regroup.algo.advantages import group_advantages
from regroup.algo.losses import AGG_MODES, TRL_LOSS_TYPES
from regroup.models.tiny import build_tokenizer

B, P, T = 8, 5, 7  # sequences, prompt length, completion length (= max_completion_length)
NUM_GEN = 4
ATOL = 1e-5

# Rewards the reward function hands to TRL, one list per call (None = could not be scored).
_REWARD_QUEUE: list[list[float | None]] = []


def _reward_fn(prompts, completions, **kwargs):  # the signature TRL calls reward functions with
    return _REWARD_QUEUE.pop(0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Qwen3 (hidden 32, 2 layers) and its tokenizer, saved once for all trainers."""
    tok = build_tokenizer()
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path), tok


def _trainer(model_dir, tmp_path_factory, **overrides) -> GRPOTrainer:
    """A real GRPOTrainer over the saved tiny model (β > 0 makes TRL load its own reference copy)."""
    path, tok = model_dir
    kw = dict(
        output_dir=str(tmp_path_factory.mktemp("out")),
        report_to=[],
        use_cpu=True,
        # TRL defaults to bf16=True, which on CPU autocasts TRL's forward to bf16 (logps off by ~1e-3);
        # both sides run in fp32 here so that the comparison is about the algorithm, not the precision.
        bf16=False,
        per_device_train_batch_size=B,
        num_generations=NUM_GEN,
        max_completion_length=T,
        save_strategy="no",
        logging_steps=1,
    )
    kw.update(overrides)
    ds = Dataset.from_dict({"prompt": ["1+1=", "2+3=", "4-1=", "5+5="]})
    trainer = GRPOTrainer(
        model=path, reward_funcs=_reward_fn, args=GRPOConfig(**kw), train_dataset=ds, processing_class=tok
    )
    trainer.model.train()
    # Set by transformers' training loop before each step; _compute_loss reads it.
    trainer.current_gradient_accumulation_steps = kw.get("gradient_accumulation_steps", 1)
    return trainer


# ---- advantages ---------------------------------------------------------------------------------------

REWARD_PATTERNS = {
    # 4 groups of 4: mixed binary, all-correct, one unscored, a single scored sample
    "binary": [1, 0, 0, 1, 1, 1, 1, 1, None, 1, 0, 0, None, None, 1, None],
    # real-valued: mixed, uniform 0.5, one unscored, two-and-two
    "real": [0.3, 0.7, 0.2, 0.9, 0.5, 0.5, 0.5, 0.5, 0.0, 0.25, None, 1.0, 0.1, 0.1, 0.6, 0.6],
}


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("pattern", sorted(REWARD_PATTERNS))
def test_advantages_equal_trl(model_dir, tmp_path_factory, scale, pattern):
    trainer = _trainer(model_dir, tmp_path_factory, scale_rewards=scale)
    rewards = REWARD_PATTERNS[pattern]
    _REWARD_QUEUE.append(list(rewards))
    prompts = ["1+1=", "2+3=", "4-1=", "5+5="]
    batch = [{"prompt": p} for p in prompts for _ in range(NUM_GEN)]  # TRL's RepeatSampler layout
    with torch.no_grad():
        out = trainer._generate_and_score_completions(batch)
    trl_adv = out["advantages"].float()  # [16]

    r = torch.tensor([math.nan if x is None else x for x in rewards], dtype=torch.float32)  # [16]
    gid = torch.arange(len(rewards)) // NUM_GEN  # [16] positional groups, as TRL
    ours = group_advantages(r, gid, scale=scale, eps=1e-4)
    assert torch.allclose(ours, trl_adv, atol=ATOL), (ours, trl_adv)
    assert (trl_adv != 0).any()  # the case is not vacuous
    # regroup groups by id, not position: a shuffled batch with scrambled ids gives the same values
    perm = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(1))
    ours_p = group_advantages(r[perm], (gid * 37 - 11)[perm], scale=scale, eps=1e-4)
    assert torch.allclose(ours_p, trl_adv[perm], atol=ATOL)


# ---- loss ---------------------------------------------------------------------------------------------


def _crafted_inputs(vocab: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded completions of varied length (one empty), mixed-sign advantages."""
    gen = torch.Generator().manual_seed(123)
    prompt_ids = torch.randint(5, vocab, (B, P), generator=gen)  # [B, P]
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_mask[5, :1] = 0
    prompt_ids[prompt_mask == 0] = pad_id
    completion_ids = torch.randint(5, vocab, (B, T), generator=gen)  # [B, T]
    lengths = torch.tensor([7, 3, 5, 1, 7, 6, 0, 4])
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()  # [B, T]
    completion_ids[completion_mask == 0] = pad_id
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -0.7, 0.0, 0.5, -1.5, 0.9, -0.3, 2.0]),  # [B]
        "num_items_in_batch": completion_mask.sum(),
    }


def _forward_logps(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """log π(completion token | prefix) by a plain forward pass  -> [B, T]."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # [B, P+T]
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # [B, P+T]
    logits = model(input_ids=ids, attention_mask=attn).logits  # [B, P+T, V]
    logits = logits[:, P - 1 : -1].float()  # [B, T] positions that predict the completion tokens
    return torch.log_softmax(logits, dim=-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def _add_old_and_ref(model, inputs):
    """π_old and π_ref log-probs = current ones shifted by noise in ±0.5, so both clip sides are hit."""
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        lp = _forward_logps(model, inputs)  # [B, T]
    inputs["old_per_token_logps"] = lp + (torch.rand(B, T, generator=gen) - 0.5)
    inputs["ref_per_token_logps"] = lp + (torch.rand(B, T, generator=gen) - 0.5)
    return inputs


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def _trl_loss_and_grads(trainer, model_dir, beta: float):
    """The crafted inputs (with old / ref log-probs; no ref when beta is 0), TRL's loss on them and its
    parameter gradients; the model's gradients are zeroed again for the regroup side."""
    model = trainer.model
    inputs = _add_old_and_ref(model, _crafted_inputs(model.config.vocab_size, model_dir[1].pad_token_id))
    if beta == 0.0:
        inputs.pop("ref_per_token_logps")
    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = _grads(model)
    model.zero_grad()
    return inputs, trl_loss, trl_grads


LOSS_CASES = list(
    itertools.product(
        sorted(AGG_MODES),
        [(0.0, False), (0.04, False), (0.04, True)],  # (beta, TRL use_bias_correction_kl)
        [(0.2, None), (0.2, 0.28)],  # (epsilon, epsilon_high)
    )
)


@pytest.mark.parametrize(("agg", "kl", "eps"), LOSS_CASES)
def test_loss_and_gradients_equal_trl(model_dir, tmp_path_factory, agg, kl, eps):
    beta, correction = kl
    eps_low, eps_high = eps
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type=TRL_LOSS_TYPES[agg],
        beta=beta,
        use_bias_correction_kl=correction,
        epsilon=eps_low,
        epsilon_high=eps_high,
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, beta)
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    model.zero_grad()
    mask = inputs["completion_mask"]
    loss, met = call_policy_loss(
        _forward_logps(model, inputs),
        inputs["old_per_token_logps"],
        inputs["advantages"],
        mask,
        ref_logps=inputs.get("ref_per_token_logps"),
        beta=beta,
        eps_low=eps_low,
        eps_high=eps_low if eps_high is None else eps_high,
        agg=agg,
        total_tokens=float(mask.sum()),
        total_sequences=B,
        max_completion_length=T,
        kl_ratio_correction=correction,
    )
    loss.backward()
    ours_grads = _grads(model)

    assert loss.item() == pytest.approx(trl_loss.item(), abs=ATOL)
    for g_ours, g_trl in zip(ours_grads, trl_grads):
        assert torch.allclose(g_ours, g_trl, atol=ATOL)
    assert any(g.abs().sum() > 0 for g in trl_grads)
    # both clip sides are exercised, and the logged fractions agree with TRL's
    assert met["clip/low_frac"].item() > 0 and met["clip/high_frac"].item() > 0
    assert met["clip/low_frac"].item() == pytest.approx(trl_metrics["clip_ratio/low_mean"], abs=ATOL)
    assert met["clip/high_frac"].item() == pytest.approx(trl_metrics["clip_ratio/high_mean"], abs=ATOL)
    if beta != 0.0 and not correction:
        assert met["kl"].item() == pytest.approx(trl_metrics["kl"], abs=ATOL)


@pytest.mark.parametrize("agg", sorted(AGG_MODES))
def test_trl_gradient_accumulation_equals_whole_batch(model_dir, tmp_path_factory, agg):
    """TRL with 2 accumulation steps of 4 sequences == regroup on the 8 at once with the same totals."""
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type=TRL_LOSS_TYPES[agg],
        beta=0.04,
        use_bias_correction_kl=False,
        epsilon_high=0.28,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
    )
    model = trainer.model
    full = _add_old_and_ref(model, _crafted_inputs(model.config.vocab_size, model_dir[1].pad_token_id))
    model.zero_grad()
    trl_total = 0.0
    for half in (slice(0, 4), slice(4, 8)):
        micro = {k: (v if k == "num_items_in_batch" else v[half]) for k, v in full.items()}
        loss = trainer._compute_loss(model, micro)
        loss.backward()
        trl_total += loss.item()
    trl_grads = _grads(model)

    model.zero_grad()
    mask = full["completion_mask"]
    loss, _ = call_policy_loss(
        _forward_logps(model, full),
        full["old_per_token_logps"],
        full["advantages"],
        mask,
        ref_logps=full["ref_per_token_logps"],
        beta=0.04,
        eps_low=0.2,
        eps_high=0.28,
        agg=agg,
        total_tokens=float(mask.sum()),
        total_sequences=B,
        max_completion_length=T,
    )
    loss.backward()
    assert loss.item() == pytest.approx(trl_total, abs=ATOL)
    for g_ours, g_trl in zip(_grads(model), trl_grads):
        assert torch.allclose(g_ours, g_trl, atol=ATOL)


# ---- accumulation invariance of policy_loss itself -----------------------------------------------------


@pytest.mark.parametrize("agg", sorted(AGG_MODES))
def test_accumulation_invariance(agg):
    """Σ of gradients over 8 micro-batches of 1 sequence == gradient of 1 micro-batch of 8 (whole-batch totals)."""
    gen = torch.Generator().manual_seed(3)
    V = 11
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64, requires_grad=True)  # [B, T, V]
    tokens = torch.randint(0, V, (B, T), generator=gen)  # [B, T]
    lengths = torch.tensor([7, 3, 5, 1, 7, 6, 0, 4])
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [B, T]
    with torch.no_grad():
        lp0 = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)  # [B, T]
    old = lp0 + (torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.5)
    ref = lp0 + (torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.5)
    adv = torch.tensor([1.2, -0.7, 0.0, 0.5, -1.5, 0.9, -0.3, 2.0], dtype=torch.float64)
    anchor = torch.zeros(B, T, dtype=torch.bool)
    anchor[7] = True  # one whole sequence is a forced anchor
    sample_weight = torch.tensor([1, 1, 0, 1, 0, 1, 1, 1], dtype=torch.float64)  # DaGRPO mask
    is_weight = torch.rand(B, T, generator=gen, dtype=torch.float64) + 0.5
    totals = dict(total_tokens=float(mask.sum()), total_sequences=B, max_completion_length=T)

    def loss_of(rows: slice) -> torch.Tensor:
        lp = torch.log_softmax(logits[rows], -1).gather(-1, tokens[rows, :, None]).squeeze(-1)  # [b, T]
        loss, _ = call_policy_loss(
            lp,
            old[rows],
            adv[rows],
            mask[rows],
            ref_logps=ref[rows],
            beta=0.05,
            agg=agg,
            sample_weight=sample_weight[rows],
            anchor_token_mask=anchor[rows],
            is_weight=is_weight[rows],
            eps_high=0.28,
            **totals,
        )
        return loss

    full = loss_of(slice(0, B))
    (g_full,) = torch.autograd.grad(full, logits)
    micro_total, g_micro = 0.0, torch.zeros_like(logits)
    for i in range(B):
        li = loss_of(slice(i, i + 1))
        micro_total += li.item()
        g_micro += torch.autograd.grad(li, logits)[0]
    assert micro_total == pytest.approx(full.item(), abs=1e-12)
    assert torch.allclose(g_micro, g_full, atol=1e-12)
    assert g_full.abs().sum() > 0
    # a micro-batch-local normaliser would break it: e.g. token_mean over the first 4 rows alone
    if agg == "token_mean":
        local = sum(
            call_policy_loss(
                torch.log_softmax(logits[r], -1).gather(-1, tokens[r, :, None]).squeeze(-1),
                old[r],
                adv[r],
                mask[r],
                agg=agg,
                total_tokens=float(mask[r].sum()),
                total_sequences=4,
                max_completion_length=T,
            )[0].item()
            for r in (slice(0, 4), slice(4, 8))
        )
        whole = call_policy_loss(lp0, old, adv, mask, agg=agg, **totals)[0].item()
        assert abs(local - whole) > 1e-3


# ---- GSPO: sequence-level ratio and clip against TRL's importance_sampling_level="sequence" ---------------


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean"])
@pytest.mark.parametrize(("beta", "correction"), [(0.0, False), (0.04, False), (0.04, True)])
def test_gspo_sequence_ratio_equals_trl(model_dir, tmp_path_factory, agg, beta, correction):
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type=TRL_LOSS_TYPES[agg],
        beta=beta,
        importance_sampling_level="sequence",
        epsilon=0.2,
        epsilon_high=0.28,
        use_bias_correction_kl=correction,
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, beta)

    model.zero_grad()
    mask = inputs["completion_mask"]
    loss, met = call_policy_loss(
        _forward_logps(model, inputs),
        inputs["old_per_token_logps"],
        inputs["advantages"],
        mask,
        ref_logps=inputs.get("ref_per_token_logps"),
        beta=beta,
        eps_low=0.2,
        eps_high=0.28,
        agg=agg,
        policy="gspo",
        kl_ratio_correction=correction,
        total_tokens=float(mask.sum()),
        total_sequences=B,
        max_completion_length=T,
    )
    loss.backward()
    assert loss.item() == pytest.approx(trl_loss.item(), abs=ATOL)
    for g_ours, g_trl in zip(_grads(model), trl_grads):
        assert torch.allclose(g_ours, g_trl, atol=ATOL)
    # not vacuous: the crafted old log-probs move the sequence ratios away from 1
    assert abs(met["ratio/mean"].item() - 1.0) > 1e-3


# ---- CISPO, SAPO, entropy bonus, sampler IS modes: against TRL's own code -------------------------------


def _ours(model, inputs, **kw):
    """regroup's policy_loss on the crafted inputs (one micro-batch: the totals are this batch's)."""
    mask = inputs["completion_mask"]
    return call_policy_loss(
        _forward_logps(model, inputs),
        inputs["old_per_token_logps"],
        inputs["advantages"],
        mask,
        ref_logps=inputs.get("ref_per_token_logps"),
        total_tokens=float(mask.sum()),
        total_sequences=B,
        max_completion_length=T,
        **kw,
    )


def _assert_equal_to_trl(model, trl_loss, trl_grads, loss):
    loss.backward()
    assert loss.item() == pytest.approx(trl_loss.item(), abs=ATOL)
    for g_ours, g_trl in zip(_grads(model), trl_grads):
        assert torch.allclose(g_ours, g_trl, atol=ATOL)
    assert any(g.abs().sum() > 0 for g in trl_grads)


@pytest.mark.parametrize(("beta", "correction"), [(0.0, False), (0.04, False), (0.04, True)])
def test_cispo_equals_trl(model_dir, tmp_path_factory, beta, correction):
    """TRL loss_type="cispo" (ε_max = epsilon_high; its normaliser is dapo's: token_mean)."""
    cap = 1.2  # inside the crafted ratios' range [e^-0.5, e^0.5], so the cap truncates some tokens
    trainer = _trainer(
        model_dir, tmp_path_factory, loss_type="cispo", beta=beta, epsilon_high=cap, use_bias_correction_kl=correction
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, beta)
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    loss, met = _ours(
        model,
        inputs,
        policy="cispo",
        policy_args={"clip_max": cap},
        beta=beta,
        kl_ratio_correction=correction,
        agg="token_mean",
    )
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)
    assert met["clip/high_frac"].item() > 0
    assert met["clip/high_frac"].item() == pytest.approx(trl_metrics["cispo_clip_ratio"], abs=ATOL)


@pytest.mark.parametrize(("tau_pos", "tau_neg"), [(1.0, 1.05), (2.0, 0.5)])
@pytest.mark.parametrize(("beta", "correction"), [(0.0, False), (0.04, True)])
def test_sapo_equals_trl(model_dir, tmp_path_factory, tau_pos, tau_neg, beta, correction):
    """TRL loss_type="sapo" (its normaliser is grpo's: seq_mean_token_mean)."""
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type="sapo",
        beta=beta,
        sapo_temperature_pos=tau_pos,
        sapo_temperature_neg=tau_neg,
        use_bias_correction_kl=correction,
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, beta)
    loss, _ = _ours(
        model,
        inputs,
        policy="sapo",
        policy_args={"temperature_pos": tau_pos, "temperature_neg": tau_neg},
        beta=beta,
        kl_ratio_correction=correction,
        agg="seq_mean_token_mean",
    )
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)


def _forward_logps_and_entropy(model, inputs):
    """Log-probs and the differentiable entropy [B, T] through regroup's own `_token_logps` (the trainer's)."""
    from regroup.models.logprobs import _token_logps

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)  # [B, P+T]
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)  # [B, P+T]
    logits = model(input_ids=ids, attention_mask=attn).logits[:, P - 1 : -1]  # [B, T, V]
    return _token_logps(logits, inputs["completion_ids"], 1.0, "grad")


@pytest.mark.parametrize("agg", sorted(AGG_MODES))
@pytest.mark.parametrize("coef", [0.05, 1.0])
def test_entropy_bonus_equals_trl(model_dir, tmp_path_factory, agg, coef):
    """TRL's entropy_coef: loss − c · mean token entropy, whatever the loss type's normaliser."""
    trainer = _trainer(
        model_dir, tmp_path_factory, loss_type=TRL_LOSS_TYPES[agg], beta=0.0, entropy_coef=coef, epsilon_high=0.28
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, 0.0)
    model.zero_grad()
    logps, entropy = _forward_logps_and_entropy(model, inputs)
    assert entropy.requires_grad
    mask = inputs["completion_mask"]
    loss, met = call_policy_loss(
        logps,
        inputs["old_per_token_logps"],
        inputs["advantages"],
        mask,
        entropy=entropy,
        eps_high=0.28,
        agg=agg,
        terms=(("entropy", coef),),
        total_tokens=float(mask.sum()),
        total_sequences=B,
        max_completion_length=T,
    )
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)
    # the bonus is there: without it the loss differs by c · mean H
    h = (entropy.detach() * mask).sum() / mask.sum()
    assert met["term/entropy"].item() == pytest.approx(-h.item(), abs=ATOL)
    without, _ = call_policy_loss(
        logps,
        inputs["old_per_token_logps"],
        inputs["advantages"],
        mask,
        eps_high=0.28,
        agg=agg,
        total_tokens=float(mask.sum()),
        total_sequences=B,
        max_completion_length=T,
    )
    assert (loss - without).item() == pytest.approx(-coef * h.item(), abs=ATOL)


IS_CASES = [
    (mode, cap, floor)
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    for cap, floor in ((3.0, None), (1.5, 0.5))
]


@pytest.mark.parametrize(("mode", "cap", "floor"), IS_CASES)
def test_sampler_is_modes_equal_trl(model_dir, tmp_path_factory, mode, cap, floor):
    """TRL's vllm_importance_sampling_mode: its own weight computation (`_generate_and_score_completions`,
    with the vLLM generation replaced by crafted completions and sampler log-probs) and its loss with
    that weight, against `sampler_is_weight` and `policy_loss(is_weight=...)`."""
    from regroup.algo.loss_inputs import sampler_is_weight

    trainer = _trainer(model_dir, tmp_path_factory, loss_type="dapo", epsilon_high=0.28)
    trainer.use_vllm = True  # only the IS branches read it once _generate is replaced
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = mode
    trainer.vllm_importance_sampling_clip_max = cap
    trainer.vllm_importance_sampling_clip_min = floor
    model = trainer.model
    crafted = _crafted_inputs(model.config.vocab_size, model_dir[1].pad_token_id)
    lengths = crafted["completion_mask"].sum(1).tolist()
    prompt_lists = [row[m.bool()].tolist() for row, m in zip(crafted["prompt_ids"], crafted["prompt_mask"])]
    completion_lists = [row[:n].tolist() for row, n in zip(crafted["completion_ids"], lengths)]
    with torch.no_grad():
        true_lp = _forward_logps(model, crafted)  # [B, T]
    gen = torch.Generator().manual_seed(11)
    sampler = true_lp + torch.randn(B, T, generator=gen)  # a sampler that disagrees per token
    sampler_lists = [row[:n].tolist() for row, n in zip(sampler, lengths)]
    sampler_lists[0][2] = None  # a token the sampler could not score (TRL: ratio 1)
    trainer._generate = lambda prompts: (prompt_lists, completion_lists, None, ["x"] * B, sampler_lists, {}, None, None)
    _REWARD_QUEUE.append([1, 0, 0, 1, 1, 0.5, 0, 1, 0, 0, 1, 1, 0, 1, 0, 0][:B])
    prompts = ["1+1=", "2+3="]
    with torch.no_grad():
        out = trainer._generate_and_score_completions([{"prompt": p} for p in prompts for _ in range(NUM_GEN)])
    mask = out["completion_mask"]
    assert torch.equal(mask, crafted["completion_mask"])
    sampler_t = torch.tensor(sampler.tolist())
    sampler_t[0, 2] = float("nan")
    sampler_t[mask == 0] = 0.0
    ours_w = sampler_is_weight(out["old_per_token_logps"], sampler_t, mask, mode, cap, floor)
    trl_w = out["importance_sampling_ratio"]
    assert ours_w.shape == trl_w.shape
    assert torch.allclose(ours_w, trl_w, atol=ATOL)
    # not vacuous: some weights are capped / zeroed, some kept unequal to 1
    assert bool((trl_w == (cap if "truncate" in mode else 0.0)).any()) and bool(((trl_w - 1).abs() > 1e-3).any())

    # the loss with that weight: ratios moved off 1 as in the other cases
    inputs = {
        k: out[k]
        for k in (
            "prompt_ids",
            "prompt_mask",
            "completion_ids",
            "completion_mask",
            "advantages",
            "num_items_in_batch",
            "importance_sampling_ratio",
        )
    }
    inputs["advantages"] = crafted["advantages"]
    inputs["old_per_token_logps"] = out["old_per_token_logps"] + (torch.rand(B, T, generator=gen) - 0.5)
    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = _grads(model)
    model.zero_grad()
    loss, met = _ours(model, inputs, eps_high=0.28, agg="token_mean", is_weight=ours_w)
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)


# ---- VESPO, LUSPO, the two-sided clip (delta) and the off-policy sequence mask (OPSM): TRL 1.16's own code ----

VESPO_KNOBS = {"defaults": {}, "tuned": {"k_pos": 1.0, "lambda_pos": 5.0, "k_neg": 2.0, "lambda_neg": 1.0}}


@pytest.mark.parametrize("knobs", sorted(VESPO_KNOBS))
@pytest.mark.parametrize(("beta", "correction"), [(0.0, False), (0.04, False), (0.04, True)])
def test_vespo_equals_trl(model_dir, tmp_path_factory, knobs, beta, correction):
    """TRL loss_type="vespo" (token-level log ratios, its normaliser is dapo's: token_mean)."""
    given = VESPO_KNOBS[knobs]
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type="vespo",
        beta=beta,
        use_bias_correction_kl=correction,
        **{f"vespo_{k}": v for k, v in given.items()},
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, beta)
    trl_phi = trainer._metrics["train"]["vespo/phi_seq_mean"][-1]
    loss, _ = _ours(
        model, inputs, policy="vespo", policy_args=given, beta=beta, kl_ratio_correction=correction, agg="token_mean"
    )
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)
    assert abs(trl_phi - 1.0) > 1e-2  # not vacuous: the crafted ratios move φ away from 1


def test_vespo_folds_the_sampler_is_weight_into_w_as_trl(model_dir, tmp_path_factory):
    """With an IS weight, TRL's vespo puts log IS into w and does not multiply the loss by it; so does regroup."""
    trainer = _trainer(model_dir, tmp_path_factory, loss_type="vespo")
    model = trainer.model
    inputs = _add_old_and_ref(model, _crafted_inputs(model.config.vocab_size, model_dir[1].pad_token_id))
    inputs.pop("ref_per_token_logps")
    gen = torch.Generator().manual_seed(5)
    is_weight = (torch.rand(B, T, generator=gen) + 0.5) * inputs["completion_mask"]  # [B, T]
    is_weight[inputs["completion_mask"] == 0] = 1.0  # TRL's ratio is 1 on padding
    inputs["importance_sampling_ratio"] = is_weight
    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = _grads(model)
    model.zero_grad()
    loss, _ = _ours(model, inputs, policy="vespo", agg="token_mean", is_weight=is_weight)
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)
    # not vacuous: without the weight the loss is another
    model.zero_grad()
    plain, _ = _ours(model, inputs, policy="vespo", agg="token_mean")
    assert abs(plain.item() - trl_loss.item()) > 1e-4


@pytest.mark.parametrize("delta", [None, 1.05])
@pytest.mark.parametrize("eps", [(0.2, None), (0.2, 0.28)])
def test_luspo_equals_trl(model_dir, tmp_path_factory, delta, eps):
    """TRL loss_type="luspo" with importance_sampling_level="sequence" (its setup) and β = 0: GSPO's loss
    scaled by each response's length, summed per response, averaged over responses."""
    eps_low, eps_high = eps
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type="luspo",
        importance_sampling_level="sequence",
        epsilon=eps_low,
        epsilon_high=eps_high,
        delta=delta,
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, 0.0)
    loss, met = _ours(
        model,
        inputs,
        policy="luspo",
        policy_args={"delta": delta},
        eps_low=eps_low,
        eps_high=eps_low if eps_high is None else eps_high,
        agg="seq_mean_token_mean",
    )
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)
    assert abs(met["ratio/mean"].item() - 1.0) > 1e-3
    # not vacuous: GSPO (without the length) is another loss
    model.zero_grad()
    gspo, _ = _ours(model, inputs, policy="gspo", policy_args={"delta": delta}, agg="seq_mean_token_mean")
    assert abs(gspo.item() - trl_loss.item()) > 1e-3


DELTA_CASES = [
    (agg, kl, 1.4) for agg in sorted(AGG_MODES) for kl in [(0.0, False), (0.04, True)]
]  # δ = 1.4 > 1 + ε_high (TRL's advice), below the crafted ratios' top e^0.5


@pytest.mark.parametrize(("agg", "kl", "delta"), DELTA_CASES)
def test_ppo_clip_delta_equals_trl(model_dir, tmp_path_factory, agg, kl, delta):
    """TRL's `delta` (INTELLECT-2's two-sided clip) with loss_type dapo / grpo / dr_grpo."""
    beta, correction = kl
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type=TRL_LOSS_TYPES[agg],
        beta=beta,
        use_bias_correction_kl=correction,
        epsilon_high=0.28,
        delta=delta,
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, beta)
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    loss, met = _ours(
        model,
        inputs,
        policy_args={"delta": delta},
        eps_high=0.28,
        beta=beta,
        kl_ratio_correction=correction,
        agg=agg,
    )
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)
    assert met["clip/high_frac"].item() == pytest.approx(trl_metrics["clip_ratio/high_mean"], abs=ATOL)
    # not vacuous: the cap changes the loss
    model.zero_grad()
    uncapped, _ = _ours(model, inputs, eps_high=0.28, beta=beta, kl_ratio_correction=correction, agg=agg)
    assert abs(uncapped.item() - trl_loss.item()) > 1e-4


def test_gspo_delta_equals_trl(model_dir, tmp_path_factory):
    """`delta` on GSPO's sequence ratio (TRL clamps its (B, 1) coef_1 the same way)."""
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type="grpo",
        importance_sampling_level="sequence",
        epsilon_high=0.28,
        delta=1.05,
    )
    model = trainer.model
    inputs, trl_loss, trl_grads = _trl_loss_and_grads(trainer, model_dir, 0.0)
    loss, _ = _ours(model, inputs, policy="gspo", policy_args={"delta": 1.05}, eps_high=0.28, agg="seq_mean_token_mean")
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)
    model.zero_grad()
    uncapped, _ = _ours(model, inputs, policy="gspo", eps_high=0.28, agg="seq_mean_token_mean")
    assert abs(uncapped.item() - trl_loss.item()) > 1e-4


OPSM_CASES = {
    # (TRL loss_type, regroup policy and agg, beta, use the sampler's own log-probs)
    "dapo": ("dapo", "ppo_clip", "token_mean", 0.0, False),
    "grpo+sampler": ("grpo", "ppo_clip", "seq_mean_token_mean", 0.0, True),
    "sapo+kl": ("sapo", "sapo", "seq_mean_token_mean", 0.04, False),
    "cispo+sampler+kl": ("cispo", "cispo", "token_mean", 0.04, True),
}


@pytest.mark.parametrize("case", sorted(OPSM_CASES))
def test_off_policy_sequence_mask_equals_trl(model_dir, tmp_path_factory, case):
    """TRL's off_policy_mask_threshold (OPSM, `get_off_policy_mask`): a response with A < 0 whose mean
    KL(sampler || π_θ) exceeds δ loses its policy term; the KL term stays."""
    loss_type, policy, agg, beta, with_sampler = OPSM_CASES[case]
    threshold = 0.05
    overrides = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type=loss_type,
        beta=beta,
        use_bias_correction_kl=False,
        off_policy_mask_threshold=threshold,
        **overrides,
    )
    model = trainer.model
    inputs = _add_old_and_ref(model, _crafted_inputs(model.config.vocab_size, model_dir[1].pad_token_id))
    if beta == 0.0:
        inputs.pop("ref_per_token_logps")
    sampler = None
    if with_sampler:
        gen = torch.Generator().manual_seed(9)
        sampler = inputs["old_per_token_logps"] + 0.3 * torch.randn(B, T, generator=gen)  # [B, T]
        sampler[0, 1] = float("nan")  # a token the sampler could not score: no KL evidence (TRL)
        inputs["sampling_per_token_logps"] = sampler
    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = _grads(model)
    model.zero_grad()
    kw = {"policy_args": {"clip_max": 5.0}} if policy == "cispo" else {}
    loss, met = _ours(
        model, inputs, policy=policy, agg=agg, beta=beta, off_policy_mask=threshold, sampler_logps=sampler, **kw
    )
    _assert_equal_to_trl(model, trl_loss, trl_grads, loss)
    assert 0.0 < met["off_policy/masked_frac"].item() < 1.0  # some responses dropped, not all
    model.zero_grad()
    unmasked, _ = _ours(model, inputs, policy=policy, agg=agg, beta=beta, **kw)
    assert abs(unmasked.item() - trl_loss.item()) > 1e-4


# ---- the loss inputs of a real Trainer.update: pi_old, the IS weight, OPSM's sampler log-probs ------------

UPDATE_CASES = {
    # (rollout.is_mode, rollout.tis_cap, rollout.is_min or None)
    "token_truncate": ("token_truncate", 1.5, None),
    "sequence_mask": ("sequence_mask", 2.0, 0.5),
}


@pytest.mark.parametrize("case", sorted(UPDATE_CASES))
def test_loss_inputs_of_a_trainer_update_equal_trl(model_dir, tmp_path_factory, case):
    """A real `Trainer.update` (one prompt x 8 responses, the sampler's log-probs off by noise, one token it
    could not score, the sampler IS correction and OPSM on) makes TRL's parameter gradient: TRL computes
    pi_old and the IS weight in `_generate_and_score_completions` (vLLM replaced by the same completions and
    sampler log-probs) and the loss in `_compute_loss` with `sampling_per_token_logps` (OPSM)."""
    from helpers import CONFIGS

    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    mode, cap, floor = UPDATE_CASES[case]
    threshold = 0.08
    path, tok = model_dir
    run = tmp_path_factory.mktemp("run")
    cfg = load_config(
        CONFIGS / "grpo.yaml",
        [
            f"model.path={path}", f"run_dir={run}", "data.num_train=8", "grpo.prompts_per_step=1",
            "grpo.num_generations=8", f"rollout.max_new_tokens={T}", "train.steps=1", "train.progress=false",
            "grpo.eps_high=0.28", f"rollout.tis_cap={cap}", f"rollout.is_mode={mode}", f"rollout.is_min={floor or 0}",
            f"grpo.off_policy_mask_threshold={threshold}", "optim.max_grad_norm=1e9",
            "diagnostics.grad_conflict_every=0", "diagnostics.diversity_every=0",
        ],
    )  # fmt: skip
    ours = build_trainer(cfg, run, log=lambda m: None)
    batch, _ = ours.collect(0)
    samples = batch.samples
    assert len(samples) == 8 and len({tuple(s.ratio_prompt_ids) for s in samples}) == 1  # one prompt: no padding
    gen = torch.Generator().manual_seed(3)
    for i, s in enumerate(samples):
        s.reward = float(i % 3 == 0)  # mixed rewards: both signs of advantage
        noise = 0.4 * torch.randn(len(s.behaviour_logps), generator=gen) + (0.3 if i % 2 else 0.0)
        s.behaviour_logps = [x + float(n) for x, n in zip(s.behaviour_logps, noise)]
    samples[1].behaviour_logps[0] = math.nan  # a token the sampler could not score (TRL: ratio 1, KL evidence 0)
    batch.advantages = None
    next(s for s in ours.recipe.stages if s.name == "advantages")(batch, ours.ctx)
    grads: list[list[torch.Tensor]] = []
    ours.optimizer.optimizer.register_step_pre_hook(lambda *_: grads.append(_grads(ours.model)))  # accelerate's inner
    metrics = ours.update(batch)
    assert len(grads) == 1

    trainer = _trainer(
        model_dir,
        tmp_path_factory,
        loss_type="dapo",
        epsilon_high=0.28,
        num_generations=8,
        off_policy_mask_threshold=threshold,
    )
    trainer.use_vllm = True  # only the IS branches read it once _generate is replaced
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = mode
    trainer.vllm_importance_sampling_clip_max = cap
    trainer.vllm_importance_sampling_clip_min = floor
    sampler_lists = [[None if math.isnan(x) else x for x in s.behaviour_logps] for s in samples]
    completions = (
        [s.ratio_prompt_ids for s in samples],
        [s.response_ids for s in samples],
        None,
        ["x"] * 8,
        sampler_lists,
        {},
        None,
        None,
    )
    trainer._generate = lambda prompts: completions
    _REWARD_QUEUE.append([0.0] * 8)
    with torch.no_grad():
        out = trainer._generate_and_score_completions([{"prompt": "1+1="}] * 8)
    keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "num_items_in_batch")
    keys += ("old_per_token_logps", "importance_sampling_ratio", "sampling_per_token_logps")
    inputs = {k: out[k] for k in keys}
    inputs["advantages"] = batch.advantages  # regroup's (in sample order), so that only the loss is compared
    model = trainer.model
    model.zero_grad()
    trainer._compute_loss(model, inputs).backward()
    trl_grads = _grads(model)
    for g_ours, g_trl in zip(grads[0], trl_grads):
        assert torch.allclose(g_ours, g_trl, atol=ATOL)
    assert any(g.abs().sum() > 0 for g in trl_grads)
    # not vacuous: OPSM dropped some responses, and the IS weight is not 1 everywhere
    assert 0.0 < metrics["off_policy/masked_frac"] < 1.0
    w = out["importance_sampling_ratio"]
    assert bool(((w - 1).abs() > 1e-3).any())
