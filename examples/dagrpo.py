"""DaGRPO (SPEC §2) as what it changes in examples/grpo.py, with the settings of configs/dagrpo.yaml.

- Anchors (§2b; algo/anchors.py, stages/anchors.py): the reference solution (the library checks it with the
  grader and its length; every built-in one passes) replaces one of the G samples (G - 1 + 1). Its tokens were
  forced, not sampled, so they get -A * p / (p + gamma), p = pi_theta(token) (LUFFY's shaping: no ratio, no clip).
- Distinctiveness mask (§2a; algo/distinctiveness.py, stages/masking.py): a positive response is kept only if
  its step score beats every negative one of its group by delta, a negative one only if every positive one
  beats it by delta. A masked response's loss is multiplied by 0; it still counts in the normaliser.
- Dr. GRPO advantages (no std division) and the constant normaliser B * max_new_tokens; beta = 0.

Run: .venv/bin/python examples/dagrpo.py. Pinned to the `dagrpo` recipe by tests/examples/test_dagrpo_example.py.
"""

import math

import grpo
import torch

from regroup.models.prompting import encode_prompt, encode_response

G, DELTA, GAMMA = grpo.G, 3.0, 0.1  # grpo.num_generations, mask.delta, anchors.gamma


def dr_grpo_advantages(rewards: torch.Tensor, G: int) -> torch.Tensor:
    """A_i = R_i - mean_g R, groups of G in a row -> [B] (a uniform group: exactly 0)."""
    r = rewards.view(-1, G)  # [num_groups, G]
    flat = r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)  # [num_groups, 1]
    return torch.where(flat, torch.zeros_like(r), r - r.mean(dim=1, keepdim=True)).view(-1)  # [B]


def distinctiveness_keep(advantages, scores, G: int, delta: float = DELTA) -> torch.Tensor:
    """Keep mask [B] bool from advantages [B] and step scores [B] (1-10); a side whose other side is empty keeps."""
    A, S = advantages.view(-1, G), scores.view(-1, G).double()  # [num_groups, G]
    best_negative = torch.where(A < 0, S, -math.inf).amax(dim=1, keepdim=True)  # [num_groups, 1]
    worst_positive = torch.where(A > 0, S, math.inf).amin(dim=1, keepdim=True)  # [num_groups, 1]
    keep = torch.ones_like(A, dtype=torch.bool)  # A = 0: kept (it has no gradient anyway)
    keep = torch.where(A > 0, S - best_negative >= delta - 1e-6, keep)  # 1e-6: a gap of exactly delta keeps
    keep = torch.where(A < 0, worst_positive - S >= delta - 1e-6, keep)
    return keep.view(-1)  # [B]


def dagrpo_loss(logps, old_logps, advantages, mask, is_anchor, keep, eps_low, eps_high, gamma, max_new_tokens):
    """PPO clip on sampled rows, -A * p / (p + gamma) on anchor rows (is_anchor [B]), times keep [B],
    summed over response tokens and divided by the constant B * max_new_tokens (seq_sum_constant)."""
    p = logps.exp()  # [B, T]
    anchor_loss = -advantages.unsqueeze(1) * p / (p + gamma)  # [B, T]
    sampled_loss = grpo.clipped_token_loss(logps, old_logps, advantages, eps_low, eps_high)  # [B, T]
    per_token = torch.where(is_anchor.unsqueeze(1), anchor_loss, sampled_loss) * keep.unsqueeze(1)  # [B, T]
    return (per_token * mask).sum() / (len(mask) * max_new_tokens)


def main() -> None:
    model, tokenizer, task, questions, heldout, sampler, optimizer, schedule = grpo.setup()
    print(f"held-out pass@1 before: {grpo.pass_at_1(model, tokenizer, task, heldout):.3f}")
    for step in range(grpo.STEPS):
        problems = questions[step * grpo.QUESTIONS_PER_STEP : (step + 1) * grpo.QUESTIONS_PER_STEP]
        prompts = [encode_prompt(tokenizer, p.question) for p in problems]
        sampled = grpo.sample_responses(sampler, prompts, G - 1, seed=step)  # G - 1 per question
        responses = [r for i, p in enumerate(problems) for r in [*sampled[i * (G - 1) : (i + 1) * (G - 1)],
                                                                 encode_response(tokenizer, p.solution)]]  # fmt: skip
        is_anchor = torch.tensor([j == G - 1 for _ in problems for j in range(G)])  # [B] the last of each group
        row_problems = [p for p in problems for _ in range(G)]  # [B]
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        rewards = torch.tensor([task.grade(t, p) for t, p in zip(texts, row_problems)])  # [B]
        advantages = dr_grpo_advantages(rewards, G)  # [B]
        scores = torch.tensor([task.step_score(t, p) for t, p in zip(texts, row_problems)])  # [B]
        keep = distinctiveness_keep(advantages, scores, G)  # [B]
        batch = grpo.pad_batch([p for p in prompts for _ in range(G)], responses, tokenizer.pad_token_id)
        logps = grpo.token_logps(model, batch)  # [B, T]
        old_logps = logps.detach()  # one update per batch: pi_old is pi_theta (ratio 1, as the library takes it)
        loss = dagrpo_loss(logps, old_logps, advantages, batch["completion_mask"], is_anchor, keep,
                           grpo.EPS_LOW, grpo.EPS_HIGH, GAMMA, grpo.MAX_NEW_TOKENS)  # fmt: skip
        grpo.optimizer_step(model, optimizer, schedule, loss)
        if step % 10 == 0:
            print(f"step {step + 1:3d}  reward {rewards[~is_anchor].mean():.3f}  kept {keep.float().mean():.2f}")
    print(f"held-out pass@1 after:  {grpo.pass_at_1(model, tokenizer, task, heldout):.3f}")


if __name__ == "__main__":
    main()
