"""GRPO in one file: the algorithm regroup's `grpo` recipe runs, written out top to bottom.

Run it from the project root. It takes about 9.5 CPU-minutes (some 5 minutes on two idle cores; it took 19 on two busy
shared ones); the first run also warms up the tiny model, once, into runs/warmup as `regroup train` does:

    .venv/bin/python examples/grpo.py

It trains the built-in tiny model (warmed up by SFT, `regroup.train.warmup`) on the built-in arithmetic
task with the settings of configs/grpo.yaml and prints held-out pass@1 before and after. One step is SPEC §1;
its pieces, in the order below, and where the library keeps each (tests/examples/test_grpo_example.py checks
that one step here gives the library's advantages, loss and gradients on the same samples):

  sample     G responses per question at T = 1                       stages/sampling.py
  reward     the task's grader: 1 right, 0 wrong                      stages/rewarding.py
  advantage  A_i = (R_i - mean_g R) / (std_g R + eps)                 algo/advantages.py (`grpo`)
  ratio      r_t = pi_theta(o_t) / pi_old(o_t)                        algo/ratios.py
  PPO clip   -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)      algo/ppo_clip.py
  KL         beta * k3, k3 = exp(d) - d - 1, d = log pi_ref - log pi_theta    algo/kl.py (beta = 0: off)
  aggregate  the mean over every response token of the batch          algo/losses.py (`token_mean`)

Its siblings examples/dagrpo.py and examples/ta_grpo.py import these pieces and write out what they change.
"""

import copy

import torch
from transformers import AutoModelForCausalLM

from regroup.data.heldout import heldout_problems
from regroup.eval.runner import evaluate
from regroup.models.load import load_tokenizer
from regroup.models.prompting import encode_prompt
from regroup.rollout.base import SamplingParams
from regroup.rollout.hf import HFSampler
from regroup.tasks import get_task
from regroup.train.schedule import lr_lambda
from regroup.train.warmup import ensure_warm_model

# Settings of configs/grpo.yaml (known to raise held-out pass@1 from the warm start).
G = 8  # responses per question (grpo.num_generations)
QUESTIONS_PER_STEP = 16  # grpo.prompts_per_step: 16 x 8 = 128 responses a step
STEPS = 40  # train.steps is 100 in configs/grpo.yaml; measured: pass@1 0.640 -> 0.762 in 40, -> 0.812 in 100
NUM_ITERATIONS = 1  # optimizer steps on each batch of responses; > 1 moves pi_theta away from pi_old
EPS_LOW, EPS_HIGH = 0.2, 0.2  # the PPO clip range [1 - eps_low, 1 + eps_high]
BETA = 0.0  # k3 KL coefficient; > 0 keeps a frozen copy of the starting model as pi_ref
ADV_EPS = 1e-4  # added to the group std (grpo.advantage_estimator_args.eps)
TEMPERATURE, MAX_NEW_TOKENS = 1.0, 48  # rollout.temperature, rollout.max_new_tokens
LR, WARMUP_STEPS, MIN_LR_RATIO, MAX_GRAD_NORM = 1e-4, 10, 0.1, 1.0  # optim.*
SEED = 0


# ------------------------------------------------------------------------------- 1. model and task
def load_warm_model(folder: str = "runs/warmup"):
    """The built-in tiny model after its warm-up SFT (trained into `folder` the first time), and its tokenizer."""
    path = ensure_warm_model(folder)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), load_tokenizer(path)


# ------------------------------------------------------------------------------- 2. sample and reward
def sample_responses(sampler, prompts: list[list[int]], n: int, seed: int) -> list[list[int]]:
    """n responses per prompt, prompt-major (prompt 0's n responses first), as token ids ending with EOS."""
    params = SamplingParams(temperature=TEMPERATURE, top_p=1.0, max_new_tokens=MAX_NEW_TOKENS, n=n)
    return [c.token_ids for c in sampler.generate(prompts, params, seed=seed)]


# ------------------------------------------------------------------------------- 3. group advantages
def group_advantages(rewards: torch.Tensor, G: int, eps: float = ADV_EPS) -> torch.Tensor:
    """rewards [B], groups of G consecutive responses -> advantages [B] (SPEC §1).

    A_i = (R_i - mean_g R) / (std_g R + eps), with the unbiased (n - 1) std of the group. A group whose
    rewards are all equal has no signal: its advantages are exactly 0. Groups here are G rows in a row;
    the library names each sample's group by id, so that its variants can add, pool and drop samples."""
    r = rewards.view(-1, G)  # [num_groups, G]
    mean = r.mean(dim=1, keepdim=True)  # [num_groups, 1]
    std = r.std(dim=1, keepdim=True)  # [num_groups, 1], unbiased
    flat = r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)  # [num_groups, 1]
    advantages = torch.where(flat, torch.zeros_like(r), (r - mean) / (std + eps))  # [num_groups, G]
    return advantages.view(-1)  # [B]


# ------------------------------------------------------------------------------- 4. per-token log-probs
def pad_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> dict:
    """One row per response: its prompt left-padded to P, then the response right-padded to T."""
    P, T = max(len(p) for p in prompts), max(len(r) for r in responses)
    input_ids = torch.full((len(prompts), P + T), pad_id)  # [B, P+T]
    attention_mask = torch.zeros((len(prompts), P + T), dtype=torch.long)  # [B, P+T]
    for row, (p, r) in enumerate(zip(prompts, responses)):
        input_ids[row, P - len(p) : P + len(r)] = torch.tensor(p + r)
        attention_mask[row, P - len(p) : P + len(r)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),  # [B, P+T] positions count real tokens
        "completion_mask": attention_mask[:, P:].float(),  # [B, T] 1 on response tokens: the loss mask
    }


def token_logps(model, batch: dict, temperature: float = TEMPERATURE) -> torch.Tensor:
    """log pi(o_t | prompt, o_<t) of every response token -> [B, T] (0 weight on padding via the mask)."""
    T = batch["completion_mask"].shape[1]
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits  # [B, P+T, V]
    logits = logits[:, -T - 1 : -1].float() / temperature  # [B, T, V]: position t-1 predicts response token t
    targets = batch["input_ids"][:, -T:]  # [B, T]
    return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]


# ------------------------------------------------------------------------------- 5. the loss
def clipped_token_loss(logps, old_logps, advantages, eps_low: float, eps_high: float) -> torch.Tensor:
    """PPO-clip per token, -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = pi_theta / pi_old -> [B, T]."""
    ratio = torch.exp(logps - old_logps)  # [B, T]
    adv = advantages.unsqueeze(1)  # [B, 1]: one advantage per response, on each of its tokens
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # [B, T]
    return -torch.min(ratio * adv, clipped * adv)  # [B, T]


def k3_kl(logps, ref_logps) -> torch.Tensor:
    """k3 estimate of KL(pi_theta || pi_ref) per token, exp(d) - d - 1 with d = log pi_ref - log pi_theta -> [B, T]."""
    d = ref_logps - logps  # [B, T]
    return torch.exp(d) - d - 1.0  # [B, T]


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, eps_low, eps_high, beta) -> torch.Tensor:
    """GRPO's loss (SPEC §1): PPO clip plus beta * k3, averaged over every response token of the batch.

    logps [B, T] differentiable; old_logps [B, T] pi_old; ref_logps [B, T] pi_ref (None when beta = 0);
    advantages [B]; mask [B, T] 1 on response tokens."""
    per_token = clipped_token_loss(logps, old_logps, advantages, eps_low, eps_high)  # [B, T]
    if beta != 0.0:
        per_token = per_token + beta * k3_kl(logps, ref_logps)  # [B, T]
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)  # token mean: long responses weigh more


# ------------------------------------------------------------------------------- 6. evaluation
def pass_at_1(model, tokenizer, task, problems, n: int = 4) -> float:
    """Held-out pass@1: the share of correct answers among n samples per question at T = 1."""
    result = evaluate(model, tokenizer, problems, task.grade, n=n, ks=(1,), max_new_tokens=MAX_NEW_TOKENS,
                      temperature=1.0, greedy=False, batch_size=256, seed=SEED, progress=False)  # fmt: skip
    return result.summary["pass@k"]["1"]


# ------------------------------------------------------------------------------- 7. the loop
def setup():
    """The warm model, the task's training and held-out questions, the sampler, the optimizer and its schedule."""
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    model, tokenizer = load_warm_model()
    model.train()
    task = get_task("arithmetic")
    questions = task.generate(STEPS * QUESTIONS_PER_STEP, seed=1234)  # data.seed
    heldout = heldout_problems(task, 256, 999, questions)  # data.eval_seed; never a training question
    sampler = HFSampler(model, tokenizer)  # samples with the live weights of `model`
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.0)
    lr_factor = lr_lambda(WARMUP_STEPS, STEPS * NUM_ITERATIONS, "cosine", MIN_LR_RATIO)  # linear warm-up, cosine
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    return model, tokenizer, task, questions, heldout, sampler, optimizer, schedule


def optimizer_step(model, optimizer, schedule, loss) -> None:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    schedule.step()


def main() -> None:
    model, tokenizer, task, questions, heldout, sampler, optimizer, schedule = setup()
    reference = copy.deepcopy(model).eval().requires_grad_(False) if BETA > 0 else None  # pi_ref, frozen
    print(f"held-out pass@1 before: {pass_at_1(model, tokenizer, task, heldout):.3f}")

    for step in range(STEPS):
        problems = questions[step * QUESTIONS_PER_STEP : (step + 1) * QUESTIONS_PER_STEP]
        prompts = [encode_prompt(tokenizer, p.question) for p in problems]
        responses = sample_responses(sampler, prompts, G, seed=SEED * 1_000_003 + step)  # B = 16 x 8
        row_prompts = [p for p in prompts for _ in range(G)]  # [B] each response's own prompt
        row_problems = [p for p in problems for _ in range(G)]  # [B]
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        rewards = torch.tensor([task.grade(t, p) for t, p in zip(texts, row_problems)])  # [B]
        advantages = group_advantages(rewards, G)  # [B]
        batch = pad_batch(row_prompts, responses, tokenizer.pad_token_id)
        mask = batch["completion_mask"]  # [B, T]
        with torch.no_grad():  # pi_old (and pi_ref) are fixed for this batch
            old_logps = token_logps(model, batch)  # [B, T]
            ref_logps = token_logps(reference, batch) if reference is not None else None  # [B, T]

        for _ in range(NUM_ITERATIONS):
            logps = token_logps(model, batch)  # [B, T] with gradient
            loss = grpo_loss(logps, old_logps, ref_logps, advantages, mask, EPS_LOW, EPS_HIGH, BETA)
            optimizer_step(model, optimizer, schedule, loss)
        if step % 10 == 0 or step == STEPS - 1:
            print(f"step {step + 1:3d}  reward {rewards.mean():.3f}  loss {loss.item():+.4f}", flush=True)

    print(f"held-out pass@1 after:  {pass_at_1(model, tokenizer, task, heldout):.3f}")


if __name__ == "__main__":
    main()
