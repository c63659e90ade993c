"""Anchor-token shaping f(p) = p/(p+γ) (SPEC §2b.3, LUFFY): values and autograd vs the analytic derivative."""

from __future__ import annotations

import math

import pytest
import torch

from regroup.algo.anchors import plain_anchor_pg_loss, shaped_objective, shaped_pg_loss


def test_shaped_objective_values():
    # p = .1, γ = .1 -> .5 ; p = .9 -> .9/1.0 = .9 ; p = 1 -> 1/1.1 ; p = .01, γ = .5 -> .01/.51
    lp = torch.tensor([math.log(0.1), math.log(0.9), 0.0], dtype=torch.float64)
    assert torch.allclose(shaped_objective(lp, 0.1), torch.tensor([0.5, 0.9, 1 / 1.1], dtype=torch.float64))
    assert shaped_objective(torch.tensor(math.log(0.01)).double(), 0.5).item() == pytest.approx(0.01 / 0.51)


def test_shaped_objective_extremes_are_finite():
    lp = torch.tensor([-1e4, -100.0, 0.0], requires_grad=True)
    f = shaped_objective(lp, 0.1)
    assert f[0].item() == 0.0 and torch.isfinite(f).all()
    f.sum().backward()
    assert torch.isfinite(lp.grad).all()


def test_shaped_loss_gradient_matches_analytic():
    # d/dlogp [−A·p/(p+γ)] = −A·γ·p/(p+γ)²
    p = torch.tensor([[0.01, 0.1, 0.5, 0.95]], dtype=torch.float64)
    adv = torch.tensor([1.7], dtype=torch.float64)
    for gamma in (0.1, 0.5):
        lp = p.log().requires_grad_()
        loss = shaped_pg_loss(lp, adv, gamma)
        assert torch.allclose(loss, -1.7 * p / (p + gamma), atol=1e-12)
        loss.sum().backward()
        assert torch.allclose(lp.grad, -1.7 * gamma * p / (p + gamma) ** 2, atol=1e-12)
    # hand value: p = .1, γ = .1, A = 1.7: −1.7·.1·.1/.04 = −0.425
    lp = torch.tensor([[math.log(0.1)]], dtype=torch.float64, requires_grad=True)
    shaped_pg_loss(lp, adv, 0.1).sum().backward()
    assert lp.grad.item() == pytest.approx(-0.425)


def test_shaping_boosts_low_probability_tokens_relative_to_plain():
    # plain gradient w.r.t. logp is −A for every token; shaped is −A·γp/(p+γ)², largest at p = γ
    p = torch.tensor([[0.05, 0.1, 0.9]], dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    lp = p.log().requires_grad_()
    plain = plain_anchor_pg_loss(lp, adv)
    assert torch.allclose(plain, -torch.ones_like(p))
    plain.sum().backward()
    assert torch.allclose(lp.grad, -torch.ones_like(p))
    lp2 = p.log().requires_grad_()
    shaped_pg_loss(lp2, adv, 0.1).sum().backward()
    g = -lp2.grad[0]
    assert g[1] > g[0] and g[1] > g[2]  # peak of γp/(p+γ)² is at p = γ: 0.25 there
    assert g[1].item() == pytest.approx(0.25)


def test_per_token_advantages_accepted():
    lp = torch.tensor([[math.log(0.1), math.log(0.1)]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    assert torch.allclose(shaped_pg_loss(lp, adv, 0.1), torch.tensor([[-0.5, 1.0]], dtype=torch.float64))


@pytest.mark.parametrize("gamma", ["0", "-0.1"])
def test_gamma_must_be_positive(gamma):
    """γ > 0 is checked once, where it is declared (`anchors.gamma`), before the loss ever sees it."""
    from regroup.config.fields import check
    from regroup.config.schema import RunConfig
    from regroup.errors import ConfigError

    with pytest.raises(ConfigError, match="anchors.gamma must be .*> 0"):
        check(RunConfig, {"anchors": {"gamma": float(gamma)}})
