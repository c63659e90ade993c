"""regroup's GMPO and KL estimators == verl 0.9.1's own code on the same tensors (loss, gradient).

verl runs in a venv of its own (`make verl-venv` builds `.venv-verl`: verl --no-deps plus the few packages
its `core_algos` imports; it pins transformers < 5.11, the project's venv has a newer one), through
`tests/_verl_worker.py` in a subprocess, on tensors saved here with torch.save and loaded there with
weights_only. Skipped, saying so, when that venv is absent; `.ci/run` builds it before `make test`.

- GMPO: `policy_loss.loss_mode="geo_mean"` (`compute_policy_loss_geo_mean`) == `regroup.algo.gmpo` through
  `policy_loss(policy="gmpo", agg="seq_mean_token_mean")` (verl takes the mean over responses);
- KL: `kl_penalty(logp, ref, "k1" | "k2" | "low_var_kl" | "k3")` == `regroup.algo.kl` (verl's "k3" is its
  clamped low_var_kl: regroup's k3 equals it where the clamps do not bite).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from loss_call import call_policy_loss

from regroup.algo.kl import kl_k1, kl_k2, kl_k3, kl_low_var

ROOT = Path(__file__).resolve().parents[2]
VERL_PYTHON = Path(os.environ.get("REGROUP_VERL_PYTHON", ROOT / ".venv-verl" / "bin" / "python"))
ATOL = 1e-5
B, T = 6, 7

pytestmark = pytest.mark.skipif(
    not VERL_PYTHON.exists(),
    reason=f"verl's venv is absent ({VERL_PYTHON}); `make verl-venv` builds it (verl 0.9.1 --no-deps and its "
    "core_algos imports)",
)


def run_verl(cases: dict, tmp_path: Path) -> dict:
    """verl's results for `cases` (tensors only), from its own venv."""
    src, dst = tmp_path / "cases.pt", tmp_path / "verl.pt"
    torch.save(cases, src)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": ""}
    out = subprocess.run(
        [str(VERL_PYTHON), str(ROOT / "tests" / "_verl_worker.py"), str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return torch.load(dst, weights_only=True)


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3  # [B, T]
    old = logp + 0.8 * (torch.rand(B, T, generator=g) - 0.5)  # log ratios in ±0.4 and beyond the clip
    lengths = torch.tensor([7, 3, 5, 1, 0, 6])  # one empty response
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # [B, T]
    adv = torch.tensor([1.2, -0.7, 0.0, 0.5, -1.5, 0.9])  # [B]
    return logp, old, mask, adv


GMPO_CASES = {"paper": (0.4, 0.4), "asymmetric": (0.1, 0.3), "tight": (0.05, 0.05)}


def test_gmpo_equals_verl_geo_mean(tmp_path):
    logp, old, mask, adv = _batch(0)
    g = torch.Generator().manual_seed(5)
    adv_tok = torch.randn(B, T, generator=g) * mask  # per-token advantages: verl's sign is per token
    cases, ours = {}, {}
    for name, (lo, hi) in GMPO_CASES.items():
        for kind, a in (("seq", adv), ("tok", adv_tok)):
            a_verl = a.unsqueeze(1) * mask if a.dim() == 1 else a  # verl takes [B, T] (GRPO: A on every token)
            cases[f"{name}-{kind}"] = {
                "kind": "geo_mean",
                "log_prob": logp,
                "old_log_prob": old,
                "advantages": a_verl,
                "response_mask": mask,
                "clip_low": lo,
                "clip_high": hi,
            }
            ours[f"{name}-{kind}"] = (a, lo, hi)
    verl = run_verl(cases, tmp_path)
    clipped_somewhere = False
    for key, (a, lo, hi) in ours.items():
        lp = logp.clone().requires_grad_(True)
        loss, met = call_policy_loss(
            lp,
            old,
            a,
            mask,
            policy="gmpo",
            policy_args={"clip_low": lo, "clip_high": hi},
            agg="seq_mean_token_mean",
            total_tokens=float(mask.sum()),
            total_sequences=B,
            max_completion_length=T,
        )
        loss.backward()
        assert loss.item() == pytest.approx(verl[key]["loss"].item(), abs=ATOL), key
        assert torch.allclose(lp.grad, verl[key]["grad"], atol=ATOL), key
        assert lp.grad.abs().sum() > 0
        # verl's clip fractions are means over the loss tokens; ours over the on-policy ones (the same here)
        assert met["clip/high_frac"].item() == pytest.approx(verl[key]["clipfrac"].item(), abs=ATOL), key
        assert met["clip/low_frac"].item() == pytest.approx(verl[key]["clipfrac_lower"].item(), abs=ATOL), key
        clipped_somewhere |= met["clip/frac"].item() > 0
    assert clipped_somewhere


def test_kl_estimators_equal_verl_kl_penalty(tmp_path):
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(B, T, generator=g) * 3
    ref = logp + torch.randn(B, T, generator=g)
    ref[0, 0], ref[0, 1], ref[1, 0] = logp[0, 0] + 25.0, logp[0, 1] - 25.0, logp[1, 0] + 4.0  # the clamps bite
    weights = torch.rand(B, T, generator=g)  # a weighted sum, so each token's gradient is checked
    ours = {"k1": kl_k1, "k2": kl_k2, "low_var_kl": kl_low_var}
    cases = {k: {"kind": k, "log_prob": logp, "ref_log_prob": ref, "weights": weights} for k in ours}
    moderate = ref.clone()
    moderate[0, 0], moderate[0, 1], moderate[1, 0] = logp[0, 0] + 1.0, logp[0, 1] - 1.0, logp[1, 0] + 0.5
    cases["k3"] = {"kind": "k3", "log_prob": logp, "ref_log_prob": moderate, "weights": weights}
    verl = run_verl(cases, tmp_path)
    for key in cases:
        fn = kl_k3 if key == "k3" else ours[key]
        lp = logp.clone().requires_grad_(True)
        values = fn(lp, cases[key]["ref_log_prob"])  # [B, T]
        (values * weights).sum().backward()
        assert torch.allclose(values.detach(), verl[key]["values"], atol=ATOL), key
        assert torch.allclose(lp.grad, verl[key]["grad"], atol=ATOL), key
    # the clamps are exercised: low_var_kl differs from plain k3 on the extreme tokens
    assert not torch.allclose(kl_low_var(logp, ref), kl_k3(logp, ref))
