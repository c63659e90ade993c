"""TA-GRPO (SPEC §3) as what it changes in examples/grpo.py, with the settings of configs/ta_grpo.yaml.

- Variants (§3.1; stages/rephrasing.py): each question q0 gets N answer-preserving rephrasings q1..qN (the
  task's rules), and G responses are sampled for each of the N + 1 prompts (stages/sampling.py).
- One pooled group (§3.2, §3.3): the (N + 1) * G responses of a question form ONE group, so the advantage is
  grpo.group_advantages over groups of (N + 1) * G: every response is compared with all variants' responses.
- Every ratio on q0 (§3.4, ta.ratio_anchor: original): each response's log-probs, under pi_theta, pi_old and
  pi_ref alike, are taken with q0 as the prompt, whichever prompt it answered.
- beta = 0.001: the k3 KL against a frozen copy of the starting model. The loss is grpo.grpo_loss unchanged.

Run: .venv/bin/python examples/ta_grpo.py (as long as examples/grpo.py). Pinned to the library's `ta_grpo`
recipe by tests/examples/test_ta_grpo_example.py.
"""

import copy
import random

import grpo
import torch

from regroup.models.prompting import encode_prompt

N = 3  # ta.n_variants
QUESTIONS_PER_STEP = 4  # 4 questions x 4 prompts x 8 = 128 responses, as many as grpo.py
BETA = 0.001


def ratio_prompts(q0_prompts: list[list[int]], group_size: int) -> list[list[int]]:
    """The prompt every response's log-probs are taken on: its question's q0, for all group_size responses."""
    return [q0 for q0 in q0_prompts for _ in range(group_size)]


def main() -> None:
    model, tokenizer, task, questions, heldout, sampler, optimizer, schedule = grpo.setup()
    reference = copy.deepcopy(model).eval().requires_grad_(False)  # pi_ref
    K = (N + 1) * grpo.G  # responses in a question's pooled group
    print(f"held-out pass@1 before: {grpo.pass_at_1(model, tokenizer, task, heldout):.3f}")
    for step in range(grpo.STEPS):
        drawn = questions[step * QUESTIONS_PER_STEP : (step + 1) * QUESTIONS_PER_STEP]
        variants = [task.rephrase(p, N, random.Random(f"{grpo.SEED}:{p.id}")) for p in drawn]  # as the rules
        # A question with fewer than N distinct rephrasings (rare) is left out here; the library trains it
        # with the variants it has, in a smaller group.
        problems = [p for p, v in zip(drawn, variants) if len(v) == N]
        texts = [t for p, v in zip(drawn, variants) if len(v) == N for t in [p.question, *v]]  # q0, q1..qN each
        responses = grpo.sample_responses(sampler, [encode_prompt(tokenizer, t) for t in texts], grpo.G, seed=step)
        row_problems = [p for p in problems for _ in range(K)]  # [B], B = questions x K; graded against q0
        answers = tokenizer.batch_decode(responses, skip_special_tokens=True)
        rewards = torch.tensor([task.grade(a, p) for a, p in zip(answers, row_problems)])  # [B]
        advantages = grpo.group_advantages(rewards, K)  # [B] over the pooled group
        q0_prompts = [encode_prompt(tokenizer, p.question) for p in problems]
        batch = grpo.pad_batch(ratio_prompts(q0_prompts, K), responses, tokenizer.pad_token_id)
        with torch.no_grad():
            old_logps, ref_logps = grpo.token_logps(model, batch), grpo.token_logps(reference, batch)  # [B, T]
        logps = grpo.token_logps(model, batch)
        loss = grpo.grpo_loss(logps, old_logps, ref_logps, advantages, batch["completion_mask"],
                              grpo.EPS_LOW, grpo.EPS_HIGH, BETA)  # fmt: skip
        grpo.optimizer_step(model, optimizer, schedule, loss)
        if step % 10 == 0:
            print(f"step {step + 1:3d}  reward {rewards.mean():.3f}  loss {loss.item():+.4f}", flush=True)
    print(f"held-out pass@1 after:  {grpo.pass_at_1(model, tokenizer, task, heldout):.3f}")


if __name__ == "__main__":
    main()
