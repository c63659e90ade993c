"""The gate before any comparison: does RL itself move the model at this budget?

A study that compares GRPO variants where plain GRPO does not learn can only say how the variants behave
when nothing learns. So, before any arm of a real-model study, a pilot registered here (and written to
plan.json before it trains) must show RL moving validation accuracy:

- Dr. GRPO from the SFT start (`studies.real.make_start`), one seed, `steps` optimizer steps of
  `prompts_per_step` questions × G = `num_generations` samples, a constant lr after a `warmup_steps` linear
  warm-up, at each rate of `rates` (one process per rate: they share the start);
- validation pass@1 (`val_problems` rows held out of all training × `val_samples` samples at T = 1) of the
  start and of each rate's checkpoints at `eval_at`;
- **the gate**: the better rate (the larger final gain; ties: the smaller rate) gains at least
  `min_gain` of validation pass@1 at its last checkpoint over the start. Its CI is paired over the
  validation problems (one seed: the problems are the replications; a description, not a test).

If the gate fails, the page says "RL does not learn at this budget, so the comparisons are uninformative"
instead of verdicts. The rows (start and every checkpoint's per-problem counts) go to the kept table of
`studies.table`, so the page is recomputed from runs.jsonl alone.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from regroup.io import write_atomic
from regroup.runtime.checkpoint import list_checkpoints
from regroup.runtime.rundir import claim_run_dir, new_run_dir
from regroup.train.build import build_trainer
from studies.claims import T1
from studies.real import (
    DRGRPO,
    EXAMPLES_DIR,
    REAL_ARMS_BY_NAME,
    RealSettings,
    _wait_for,
    evaluate_real,
    make_start,
    real_arm_config,
    split_train_val,
)
from studies.stats import t_ppf
from studies.table import START, TABLE, counts_of, read_per_problem, read_table, row, write_table

REGIME = "gate"


@dataclass(frozen=True)
class GateSettings:
    """The registered pilot and gate (fixed before it trains; `gate_plan` writes them)."""

    rates: tuple[float, ...] = (1e-4, 2e-4)
    steps: int = 150
    warmup_steps: int = 5
    prompts_per_step: int = 2
    num_generations: int = 8
    """G = 8: with G = 4 57 % of the 30-step study's groups were all wrong (about 1.4 informative a step)."""
    eval_at: tuple[int, ...] = (50, 100, 150)
    val_problems: int = 128
    """The training file's last rows, never trained on: 128 × 4 samples (the 30-step sweep's 32 × 4 could not
    tell two rates apart)."""
    val_samples: int = 4
    min_gain: float = 0.03
    """The gate: +3 points of validation pass@1 for the better rate."""
    seed: int = 0


def gate_real_settings(g: GateSettings, base: RealSettings | None = None) -> RealSettings:
    return replace(
        base or RealSettings(),
        steps=g.steps,
        val_problems=g.val_problems,
        val_samples=g.val_samples,
        eval_problems=g.val_problems,  # evaluate_real's limit: the whole validation split
        seeds=1,
    )


def gate_plan(g: GateSettings, real: RealSettings) -> dict:
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "the gate before any comparison: RL must move validation pass@1 at this budget",
        "pilot": {
            "arm": "Dr. GRPO (" + ", ".join(DRGRPO) + ") from the SFT start, LoRA as examples/smollm2_grpo.yaml",
            **asdict(g),
            "schedule": f"linear warm-up over {g.warmup_steps} steps, then constant",
            "samples_per_step": g.prompts_per_step * g.num_generations,
        },
        "gate": f"the better rate (larger final gain; ties: the smaller) gains >= {100 * g.min_gain:g} points of "
        f"validation pass@1 ({g.val_problems} rows x {g.val_samples} samples at T = 1) at step {max(g.eval_at)} "
        "over the start; its 95 % CI is paired over the validation problems (one seed)",
        "if_it_fails": "publish 'RL does not learn at this budget, so the comparisons are uninformative', not verdicts",
        "real_settings": asdict(real),
    }


def rate_arm(lr: float) -> str:
    return f"drgrpo_lr{lr:g}"


def pilot_overrides(g: GateSettings, lr: float) -> list[str]:
    return [
        *DRGRPO,
        f"grpo.prompts_per_step={g.prompts_per_step}",
        f"grpo.num_generations={g.num_generations}",
        f"optim.warmup_steps={g.warmup_steps}",
        "optim.schedule=constant",
        f"train.checkpoint_every={math.gcd(*g.eval_at)}",
        f"train.keep_checkpoints={max(g.eval_at) // math.gcd(*g.eval_at)}",  # every evaluated step stays on disk
        f"optim.lr={lr}",
    ]


def run_gate(g: GateSettings, real: RealSettings, rates: tuple[float, ...], out_root: str, log=print) -> Path:
    """This process's rates of the pilot (the first rate's process makes the start and evaluates it; the
    others wait for it), each checkpoint of `eval_at` evaluated on the validation split."""
    for path in (real.model_dir, real.train_file):
        if not Path(path).exists():
            raise FileNotFoundError(f"the gate needs {path} (see studies/README.md, the real-model study)")
    study_dir = new_run_dir(out_root, "gate")
    write_atomic(study_dir / "plan.json", json.dumps(gate_plan(g, real), indent=2, default=str))
    start_dir = Path(real.start_dir) if real.start_dir else Path(out_root) / "gate-start"
    train_file, val_file = split_train_val(real, study_dir / "data")
    prompt = str(EXAMPLES_DIR / "smollm2_grpo.yaml")
    if g.rates[0] in rates:
        start = make_start(real, start_dir, train_file, val_file, log)
        evaluate_real(start, real, val_file, study_dir / "start", prompt, g.val_samples)
    else:
        _wait_for(start_dir / "sft_start.json", real, "the SFT start", log)
        start = str(start_dir / "model")
    grpo = REAL_ARMS_BY_NAME["grpo"]
    for lr in rates:
        run_dir = study_dir / f"{rate_arm(lr)}-s{g.seed}"
        cfg = real_arm_config(
            replace(grpo, extra=tuple(pilot_overrides(g, lr))), real, g.seed, run_dir, start, train_file, None
        )
        t0 = time.perf_counter()
        with claim_run_dir(run_dir, "fresh", log=log):
            build_trainer(cfg, run_dir, log=log).train()
        for checkpoint in list_checkpoints(run_dir):
            step = int(checkpoint.name.rpartition("-")[2])
            if step in g.eval_at:
                out = run_dir / f"eval_step{step}"
                summary = evaluate_real(
                    str(checkpoint), real, val_file, out, str(run_dir / "config.yaml"), real.val_samples
                )
                log(f"gate {rate_arm(lr)} step {step}: validation pass@1 {summary['pass@1']}")
        write_atomic(run_dir / "timing.json", json.dumps({"seconds": time.perf_counter() - t0}))
    return study_dir


def gate_rows(study_dirs: list[Path]) -> list[dict]:
    """The kept table: the start's validation counts and each rate's counts at every evaluated step."""
    rows = []
    for d in study_dirs:
        start = next(iter(sorted(d.glob("start/*/per_problem.jsonl"))), None)
        if start is not None:
            rows.append(row(REGIME, START, 0, {T1: read_per_problem(start)}))
        for run_dir in sorted(d.glob("drgrpo_lr*-s*")):
            evals = {}
            for f in sorted(run_dir.glob("eval_step*/*/per_problem.jsonl")):
                evals[f"step{int(f.parent.parent.name[len('eval_step') :])}"] = read_per_problem(f)
            if evals:
                name, _, seed = run_dir.name.rpartition("-s")
                rows.append(row(REGIME, name, int(seed), evals))
    return rows


def _pass1(entry) -> dict[str, float]:
    return {i: c / n for i, (c, n) in counts_of(entry).items()}


def gate_verdict(rows: list[dict], g: GateSettings) -> dict:
    """The curve of every rate, its final gain over the start with a 95 % CI paired over the problems, and
    whether the gate is met."""
    start = next((r for r in rows if r["arm"] == START), None)
    if start is None:
        raise ValueError("the gate's table has no start row")
    base = _pass1(start["evals"][T1])
    last = f"step{max(g.eval_at)}"
    rates = []
    for r in rows:
        if r["arm"] == START:
            continue
        curve = {k: sum(v.values()) / len(v) for k, v in ((k, _pass1(e)) for k, e in r["evals"].items())}
        final = _pass1(r["evals"][last]) if last in r["evals"] else None
        gain = se = None
        if final is not None:
            diffs = [final[i] - base[i] for i in base]
            gain = sum(diffs) / len(diffs)
            var = sum((x - gain) ** 2 for x in diffs) / (len(diffs) - 1)
            se = math.sqrt(var / len(diffs))
        rates.append({"arm": r["arm"], "curve": curve, "gain": gain, "se": se, "problems": len(base)})
    finished = [r for r in rates if r["gain"] is not None]
    best = max(finished, key=lambda r: (r["gain"], -float(r["arm"][len("drgrpo_lr") :])), default=None)
    half = None if best is None else t_ppf(0.975, best["problems"] - 1) * best["se"]
    return {
        "start": sum(base.values()) / len(base),
        "rates": rates,
        "best": best,
        "ci": None if best is None else (best["gain"] - half, best["gain"] + half),
        "met": None if best is None else best["gain"] >= g.min_gain,
    }


def summarize_gate(study_dirs: list[Path], g: GateSettings = GateSettings()) -> str:
    """Markdown: the gate's verdict and every rate's validation curve (from a kept table where a folder has one)."""
    kept = [d for d in study_dirs if (d / TABLE).is_file()]
    rows = [r for d in kept for r in read_table(d / TABLE)] + gate_rows([d for d in study_dirs if d not in kept])
    v = gate_verdict(rows, g)
    steps = [f"step{s}" for s in g.eval_at]
    lines = [
        f"Start: validation pass@1 {100 * v['start']:.1f} % ({v['rates'][0]['problems'] if v['rates'] else 0} "
        f"problems × {g.val_samples} samples).",
        "",
        "| arm | " + " | ".join(f"pass@1 at step {s[4:]}" for s in steps) + " | gain at the last step [95 % CI] |",
        "|---|" + "---|" * (len(steps) + 1),
    ]
    for r in v["rates"]:
        cells = [f"{100 * r['curve'][s]:.1f} %" if s in r["curve"] else "—" for s in steps]
        gain = "—" if r["gain"] is None else f"{100 * r['gain']:+.1f} ± {100 * r['se']:.1f}"
        lines.append(f"| {r['arm']} | " + " | ".join(cells) + f" | {gain} |")
    if v["met"] is None:
        verdict = "not decided: no rate has reached its last checkpoint"
    elif v["met"]:
        lo, hi = v["ci"]
        gain = f"{100 * v['best']['gain']:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        verdict = f"**met**: {v['best']['arm']} gains {gain} (gate: {100 * g.min_gain:+.0f})"
    else:
        lo, hi = v["ci"]
        verdict = (
            f"**failed**: the better rate, {v['best']['arm']}, gains {100 * v['best']['gain']:+.1f} points "
            f"[{100 * lo:+.1f}, {100 * hi:+.1f}] (gate: {100 * g.min_gain:+.0f}). RL does not learn at this "
            "budget, so the comparisons are uninformative."
        )
    return "\n".join(lines + ["", f"Gate: {verdict}"])


def keep_gate(study_dirs: list[Path], dest: Path) -> Path:
    return write_table(gate_rows(study_dirs), dest / TABLE)
