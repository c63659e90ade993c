"""Runs verl 0.9.1's own loss code on given tensors, in verl's own venv (`make verl-venv`), for
`tests/equality/test_verl.py`: `python _verl_worker.py IN.pt OUT.pt`.

IN holds cases; each case's result (loss or per-token values, and the gradient with respect to the
current log-probs) goes to OUT. Only torch and verl are imported here, never regroup.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace


def main(in_path: str, out_path: str) -> None:
    import torch

    torch.set_num_threads(1)
    from verl.trainer.ppo.core_algos import get_policy_loss_fn, kl_penalty

    cases = torch.load(in_path, weights_only=True)
    results = {}
    for name, case in cases.items():
        log_prob = case["log_prob"].clone().requires_grad_(True)  # [B, T]
        if case["kind"] == "geo_mean":
            config = SimpleNamespace(
                clip_ratio=case["clip_low"], clip_ratio_low=case["clip_low"], clip_ratio_high=case["clip_high"]
            )
            loss, metrics = get_policy_loss_fn("geo_mean")(
                old_log_prob=case["old_log_prob"],
                log_prob=log_prob,
                advantages=case["advantages"],
                response_mask=case["response_mask"],
                config=config,
            )
            loss.backward()
            results[name] = {
                "loss": loss.detach(),
                "grad": log_prob.grad.detach(),
                "clipfrac": torch.tensor(metrics["actor/pg_clipfrac"]),
                "clipfrac_lower": torch.tensor(metrics["actor/pg_clipfrac_lower"]),
            }
        else:  # a kl_penalty estimator: per-token values, gradient of their weighted sum
            kl = kl_penalty(log_prob, case["ref_log_prob"], case["kind"])  # [B, T]
            (kl * case["weights"]).sum().backward()
            results[name] = {"values": kl.detach(), "grad": log_prob.grad.detach()}
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
