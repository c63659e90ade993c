"""Clipped PG loss, k3 KL, aggregation and policy_loss composition: hand-computed values (SPEC §1, §2a.4, §2b.3)."""

from __future__ import annotations

import math

import pytest
import torch
from loss_call import call_policy_loss

from regroup.algo.kl import kl_k3
from regroup.algo.loss_inputs import truncated_is_weight
from regroup.algo.losses import aggregate
from regroup.algo.ppo_clip import clipped_pg_loss
from regroup.algo.ratios import clip_ratio, importance_ratio, log_ratio

LOG = math.log


def lt(rows: list[list[float]]) -> torch.Tensor:
    """Log of a nested list of probabilities / ratios, float64."""
    return torch.tensor(rows, dtype=torch.float64).log()


# ---- ratios -------------------------------------------------------------------------------------------


def test_ratio_helpers():
    lp, old = lt([[0.5, 0.2]]), lt([[0.25, 0.4]])
    assert torch.allclose(log_ratio(lp, old), torch.tensor([[LOG(2), LOG(0.5)]], dtype=torch.float64))
    assert torch.allclose(importance_ratio(lp, old), torch.tensor([[2.0, 0.5]], dtype=torch.float64))
    r = torch.tensor([0.5, 0.9, 1.1, 1.5])
    # clip to [1 − 0.2, 1 + 0.28] = [0.8, 1.28]
    assert torch.allclose(clip_ratio(r, 0.2, 0.28), torch.tensor([0.8, 0.9, 1.1, 1.28]))
    with pytest.raises(ValueError, match="shape"):
        log_ratio(lp, old[:, :1])


def test_truncated_is_weight():
    old = torch.tensor([[LOG(0.5), LOG(0.5), LOG(0.2), 0.0]], requires_grad=True)
    beh = torch.tensor([[LOG(0.25), LOG(0.5), LOG(0.4), float("nan")]])
    # π_old/π_beh = 2 -> capped at 1.5; 1; 0.5; NaN behaviour -> 1 (no correction)
    w = truncated_is_weight(old, beh, cap=1.5)
    assert torch.allclose(w, torch.tensor([[1.5, 1.0, 0.5, 1.0]]))
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weight(old, beh, cap=0.0)


# ---- clipped PG loss ----------------------------------------------------------------------------------


def test_clipped_pg_loss_values_and_flags():
    # ratios r = 0.5, 1.0, 1.5 on each row (old logp 0), εl = εh = 0.2 -> clip range [0.8, 1.2]
    # A = +1: loss = −min(r, clip r) = −[0.5, 1.0, 1.2]; high-clipped only at r = 1.5
    # A = −1: loss = −min(−r, −clip r) = max(r, clip r) = [0.8, 1.0, 1.5]; low-clipped only at r = 0.5
    # A =  0: loss 0, no flags
    logps = lt([[0.5, 1.0, 1.5]] * 3)
    old = torch.zeros_like(logps)
    adv = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64)
    loss, low, high = clipped_pg_loss(logps, old, adv, 0.2, 0.2)
    exp = torch.tensor([[-0.5, -1.0, -1.2], [0.8, 1.0, 1.5], [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(loss, exp, atol=1e-12)
    assert low.tolist() == [[False] * 3, [True, False, False], [False] * 3]
    assert high.tolist() == [[False, False, True], [False] * 3, [False] * 3]


def test_clipped_pg_loss_asymmetric_clip_and_gradient():
    # εh = 0.28: r = 1.25 with A = 2 is inside [0.8, 1.28] -> loss −2.5, gradient −A·r = −2.5 w.r.t. logp
    # r = 1.5 with A = 2 is clipped -> loss −2·1.28 = −2.56, gradient 0
    logps = lt([[1.25, 1.5]]).requires_grad_()
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, _, high = clipped_pg_loss(logps, old, torch.tensor([2.0], dtype=torch.float64), 0.2, 0.28)
    assert torch.allclose(loss, torch.tensor([[-2.5, -2.56]], dtype=torch.float64))
    assert high.tolist() == [[False, True]]
    loss.sum().backward()
    assert torch.allclose(logps.grad, torch.tensor([[-2.5, 0.0]], dtype=torch.float64))


def test_kl_k3():
    # logp = log .5, ref = log .25: d = ref − logp = log .5 = −0.693147
    # e^d − d − 1 = .5 + .693147 − 1 = .193147
    kl = kl_k3(lt([[0.5, 0.3]]), lt([[0.25, 0.3]]))
    assert torch.allclose(kl, torch.tensor([[0.5 + LOG(2) - 1, 0.0]], dtype=torch.float64), atol=1e-12)
    assert abs(kl[0, 0].item() - 0.193147) < 1e-6


# ---- aggregation --------------------------------------------------------------------------------------

L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
M = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


def test_aggregate_modes():
    # masked tokens: 1, 2 | 4   -> Σ = 7, 3 tokens, 2 sequences, max length 3
    kw = dict(total_tokens=3, total_sequences=2, max_completion_length=3)
    assert aggregate(L, M, "token_mean", **kw).item() == pytest.approx(7 / 3)
    # per-sequence means: (1+2)/2 = 1.5, 4/1 = 4 -> (1.5 + 4)/2 = 2.75
    assert aggregate(L, M, "seq_mean_token_mean", **kw).item() == pytest.approx(2.75)
    assert aggregate(L, M, "seq_sum_constant", **kw).item() == pytest.approx(7 / 6)


def test_aggregate_uses_whole_batch_totals():
    # this micro-batch is part of a batch of 10 tokens / 5 sequences: Σ/10, (1.5+4)/5, 7/(5·3)
    kw = dict(total_tokens=10, total_sequences=5, max_completion_length=3)
    assert aggregate(L, M, "token_mean", **kw).item() == pytest.approx(0.7)
    assert aggregate(L, M, "seq_mean_token_mean", **kw).item() == pytest.approx(1.1)
    assert aggregate(L, M, "seq_sum_constant", **kw).item() == pytest.approx(7 / 15)


def test_aggregate_ignores_nan_on_padding_and_empty_rows():
    l2 = L.clone()
    l2[0, 2] = float("nan")
    l2[1, 1] = float("inf")
    m2 = M.clone()
    m2[1] = False  # an empty sequence counts 0 (its token count is clamped to 1)
    kw = dict(total_tokens=2, total_sequences=2, max_completion_length=3)
    assert aggregate(l2, m2, "token_mean", **kw).item() == pytest.approx(1.5)
    assert aggregate(l2, m2, "seq_mean_token_mean", **kw).item() == pytest.approx(0.75)
    kw0 = dict(total_tokens=0, total_sequences=2, max_completion_length=3)
    assert aggregate(L, torch.zeros_like(M), "token_mean", **kw0).item() == 0.0


def test_aggregate_errors():
    kw = dict(total_tokens=3, total_sequences=2, max_completion_length=3)
    with pytest.raises(ValueError, match="aggregation mode"):
        aggregate(L, M, "sum", **kw)
    with pytest.raises(ValueError, match="total_sequences"):
        aggregate(L, M, "token_mean", total_tokens=3, total_sequences=0, max_completion_length=3)
    with pytest.raises(ValueError, match="loss_mask shape"):
        aggregate(L, M[:, :2], "token_mean", **kw)


# ---- policy_loss composition --------------------------------------------------------------------------

KW = dict(total_tokens=4, total_sequences=2, max_completion_length=3)


def _two_rows():
    # row 0: A = +1, ratios 1.5 (clipped high -> 1.2), 1.0, 0.9 ; row 1: A = −1, ratio 0.5 (clipped low -> .8)
    # then two padding tokens -> mask [[1,1,1],[1,0,0]]
    logps = lt([[1.5, 1.0, 0.9], [0.5, 1.0, 1.0]])
    old = torch.zeros_like(logps)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    return logps, old, adv, mask


def test_policy_loss_plain_grpo_and_metrics():
    logps, old, adv, mask = _two_rows()
    # per-token: row 0: −1.2, −1.0, −0.9 ; row 1: +0.8  -> Σ = −2.3, / 4 tokens = −0.575
    loss, met = call_policy_loss(logps, old, adv, mask, **KW)
    assert loss.item() == pytest.approx(-0.575)
    assert met["pg_loss"].item() == pytest.approx(-0.575)
    # clip: high at (0,0), low at (1,0): 1/4 each; ratio mean (1.5 + 1 + .9 + .5)/4 = 0.975
    assert met["clip/high_frac"].item() == pytest.approx(0.25)
    assert met["clip/low_frac"].item() == pytest.approx(0.25)
    assert met["clip/frac"].item() == pytest.approx(0.5)
    assert met["ratio/mean"].item() == pytest.approx(0.975)
    assert met["ratio/mean"].n.item() == 4 and "anchor/logp_mean" not in met
    assert "kl" not in met and "anchor/prob_mean" not in met
    # seq_mean_token_mean: row means (−3.1/3, 0.8) -> (−1.03333 + 0.8)/2 = −0.116667
    loss2, _ = call_policy_loss(logps, old, adv, mask, agg="seq_mean_token_mean", **KW)
    assert loss2.item() == pytest.approx((-3.1 / 3 + 0.8) / 2)


def test_policy_loss_sample_weight_keeps_normaliser():
    logps, old, adv, mask = _two_rows()
    # DaGRPO mask drops row 1: Σ = −3.1 but still / 4 tokens (normaliser not reduced) = −0.775
    loss, _ = call_policy_loss(logps, old, adv, mask, sample_weight=torch.tensor([1.0, 0.0]), **KW)
    assert loss.item() == pytest.approx(-0.775)
    loss_s, _ = call_policy_loss(
        logps, old, adv, mask, sample_weight=torch.tensor([0.0, 1.0]), agg="seq_mean_token_mean", **KW
    )
    assert loss_s.item() == pytest.approx(0.8 / 2)


def test_policy_loss_kl_term_and_weight():
    logps, old, adv, mask = _two_rows()
    ref = logps.detach() + LOG(0.5)  # ref − logp = log .5 everywhere -> k3 = .5 + log 2 − 1 = 0.193147
    k3 = 0.5 + LOG(2) - 1
    loss, met = call_policy_loss(logps, old, adv, mask, ref_logps=ref, beta=0.1, **KW)
    assert loss.item() == pytest.approx(-0.575 + 0.1 * k3)
    assert met["kl"].item() == pytest.approx(k3)
    assert met["pg_loss"].item() == pytest.approx(-0.575)
    # sample weight 0 on row 1 removes its PG and its KL token: (−3.1 + 3·0.1·k3)/4
    loss_w, _ = call_policy_loss(
        logps, old, adv, mask, ref_logps=ref, beta=0.1, sample_weight=torch.tensor([1.0, 0.0]), **KW
    )
    assert loss_w.item() == pytest.approx((-3.1 + 0.3 * k3) / 4)
    # TRL's use_bias_correction_kl: k3 · ratio; ratios of loss tokens 1.5, 1, .9, .5 -> Σ = 3.9
    loss_c, _ = call_policy_loss(logps, old, adv, mask, ref_logps=ref, beta=0.1, kl_ratio_correction=True, **KW)
    assert loss_c.item() == pytest.approx((-2.3 + 0.1 * k3 * 3.9) / 4)


def test_policy_loss_is_weight_only_on_pg_on_policy_tokens():
    logps, old, adv, mask = _two_rows()
    ref = logps.detach() + LOG(0.5)
    k3 = 0.5 + LOG(2) - 1
    w = torch.tensor([[2.0, 1.0, 1.0], [0.5, 1.0, 1.0]], dtype=torch.float64)
    # PG tokens: −1.2·2, −1, −.9, .8·.5 = −2.4 − 1.9 + .4 = −3.9; KL not weighted: + .1·k3·4
    loss, met = call_policy_loss(logps, old, adv, mask, ref_logps=ref, beta=0.1, is_weight=w, **KW)
    assert loss.item() == pytest.approx((-3.9 + 0.4 * k3) / 4)
    assert met["is_weight/mean"].item() == pytest.approx((2 + 1 + 1 + 0.5) / 4)


def test_policy_loss_anchor_tokens_shaped_and_excluded_from_metrics():
    logps, old, adv, mask = _two_rows()
    anchor = torch.zeros_like(mask)
    anchor[1, 0] = True  # row 1 token 0 is a forced anchor token: p = 0.5, A = −1
    old = old.clone()
    old[1, 0] = float("nan")  # π_old undefined for anchors: whatever is stored must not leak
    lp = logps.clone().requires_grad_()
    # anchor loss: −A·p/(p+γ) = 0.5/0.6 = 0.833333; others as before: −3.1 -> (−3.1 + 0.833333)/4
    loss, met = call_policy_loss(lp, old, adv, mask, anchor_token_mask=anchor, shaping_gamma=0.1, **KW)
    assert loss.item() == pytest.approx((-3.1 + 0.5 / 0.6) / 4)
    # metrics over on-policy tokens only: row 0 ratios 1.5, 1, .9 -> mean 1.13333, high clip 1/3, low 0
    assert met["ratio/mean"].item() == pytest.approx(3.4 / 3)
    assert met["clip/high_frac"].item() == pytest.approx(1 / 3)
    assert met["clip/low_frac"].item() == 0.0
    assert met["ratio/mean"].n.item() == 3 and met["anchor/logp_mean"].n.item() == 1
    assert met["anchor/prob_mean"].item() == pytest.approx(0.5)
    loss.backward()
    assert torch.isfinite(lp.grad).all()
    # d/dlogp of −A·p/(p+γ) = −A·γ·p/(p+γ)² = 0.1·0.5/0.36 = 0.138889, divided by total_tokens 4
    assert lp.grad[1, 0].item() == pytest.approx(0.1 * 0.5 / 0.36 / 4)


def test_policy_loss_anchor_plain_ratio():
    logps, old, adv, mask = _two_rows()
    anchor = torch.zeros_like(mask)
    anchor[1, 0] = True
    lp = logps.clone().requires_grad_()
    # plain: value −A·1 = 1, gradient −A = 1 (divided by 4 tokens)
    loss, _ = call_policy_loss(lp, old, adv, mask, anchor_token_mask=anchor, anchor_ratio="plain", **KW)
    assert loss.item() == pytest.approx((-3.1 + 1.0) / 4)
    loss.backward()
    assert lp.grad[1, 0].item() == pytest.approx(0.25)


def test_policy_loss_errors():
    logps, old, adv, mask = _two_rows()
    with pytest.raises(ValueError, match="ref_logps"):
        call_policy_loss(logps, old, adv, mask, beta=0.1, **KW)
    with pytest.raises(ValueError, match="anchors.ratio"):
        call_policy_loss(logps, old, adv, mask, anchor_ratio="luffy", **KW)
    with pytest.raises(ValueError, match="sample_weight"):
        call_policy_loss(logps, old, adv, mask, sample_weight=torch.ones(3), **KW)
    with pytest.raises(ValueError, match="advantages"):
        call_policy_loss(logps, old, torch.ones(3), mask, **KW)


def test_rows_with_gradient_hand_cases():
    from regroup.algo.losses import rows_with_gradient

    adv = torch.tensor([0.0, 1.5, -0.5, 0.0, float("nan")])
    weight = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    assert rows_with_gradient(adv, None, 0.0).tolist() == [False, True, True, False, True]
    assert rows_with_gradient(adv, weight, 0.0).tolist() == [False, False, True, False, True]
    # beta != 0: the KL term moves every row that is not masked, whatever its advantage
    assert rows_with_gradient(adv, weight, 0.04).tolist() == [True, False, True, False, True]
    per_token = torch.tensor([[0.0, 0.0], [0.0, 2.0]])  # [B, T] advantages: one non-zero token is enough
    assert rows_with_gradient(per_token, None, 0.0).tolist() == [False, True]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_sum_constant"])
@pytest.mark.parametrize("case", ["ppo", "anchor_shaped", "anchor_plain", "gspo", "kl"])
def test_rows_without_gradient_get_exactly_zero_gradient(agg, case):
    """What `rows_with_gradient` promises the trainer: the loss's gradient on every row it rejects is 0."""
    from regroup.algo.losses import rows_with_gradient

    g = torch.Generator().manual_seed(3)
    b, t = 6, 5
    logps = (-torch.rand(b, t, generator=g) * 3).requires_grad_(True)  # [B, T]
    old = logps.detach() + 0.3 * torch.randn(b, t, generator=g)  # ratios far from 1: clipping happens
    adv = torch.tensor([0.0, 1.0, -1.0, 0.0, 2.0, -0.5])
    weight = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    mask = torch.ones(b, t)
    mask[0, 3:] = 0
    kw = dict(sample_weight=weight, total_tokens=float(mask.sum()), total_sequences=b, max_completion_length=t, agg=agg)
    beta = 0.0
    if case.startswith("anchor"):
        anchor = torch.zeros(b, t, dtype=torch.bool)
        anchor[[0, 1, 4]] = True
        kw.update(anchor_token_mask=anchor, anchor_ratio=case.split("_")[1])
    if case == "gspo":
        kw.update(policy="gspo")
    if case == "kl":
        beta = 0.1
        kw.update(beta=beta, ref_logps=logps.detach() - 0.2, kl_ratio_correction=True)
    loss, _ = call_policy_loss(logps, old, adv, mask, **kw)
    loss.backward()
    carries = rows_with_gradient(adv, weight, beta)
    assert torch.equal(logps.grad[~carries], torch.zeros_like(logps.grad[~carries]))
    assert bool((logps.grad[carries].abs().sum(1) > 0).all())  # and the rows it keeps do move
