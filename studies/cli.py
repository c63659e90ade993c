"""`python -m studies` (or `make study`): run, resume or summarize a study.

    python -m studies --dry-run                      # the registered plan and the cost estimate; runs nothing
    python -m studies --first-seed 0 --seeds 13      # this process's share of the registered seeds
    python -m studies --resume runs/study-...        # continue a stopped miniature study in its folder
    python -m studies --summarize runs/study-A runs/study-B --out DIR [--keep docs/results/NAME]
    python -m studies --real ...                     # the real-model study (SmolLM2-135M, LoRA): hours
    python -m studies --real2 --dry-run              # the v2 design where RL moves the model: plan and cost

User errors end in one line and exit 2 (`--debug`: the traceback), as in `regroup`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from regroup.cli import user_error
from regroup.errors import ConfigError


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _count(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m studies",
        description="The papers' claims under registered plans: the miniature study (the built-in task, two "
        "regimes, 25 seeds) or the real-model study (--real). See studies/README.md.",
    )
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    p.add_argument("--quick", action="store_true", help="a few-minute plumbing version (not evidence)")
    p.add_argument("--out", default="runs", help="the folder the study folder is made in (default: runs)")
    p.add_argument("--arms", default=None, help="comma-separated subset of the arms (default: the registered arms)")
    p.add_argument("--real", action="store_true", help="the real-model study (SmolLM2-135M, LoRA): hours")
    p.add_argument(
        "--real2",
        action="store_true",
        help="the real-model v2 study (studies/real2.py): the gate's budget, unseen-chain evaluation, curves, the "
        "imitation control; days of one core",
    )
    p.add_argument(
        "--gate",
        action="store_true",
        help="the registered pilot before any real-model comparison: does Dr. GRPO gain >= 3 points of validation "
        "pass@1 in 150 steps (studies/gate.py)",
    )
    p.add_argument(
        "--gated",
        metavar="STUDY_DIR",
        nargs="?",
        const="",
        default=None,
        help="the miniature study behind a gate (studies/gated.py) in STUDY_DIR: with --rates, the gate's runs; "
        "else the primaries' runs (--first-seed/--seeds/--arms), refused until the gate is met; "
        "`--gated --summarize DIR` prints the page of a study folder or its kept records",
    )
    p.add_argument(
        "--design",
        default=None,
        help="--gated: the registered design a new study folder starts with (studies/gated.py DESIGNS; default: "
        "the latest); a folder with a plan.json keeps its own",
    )
    p.add_argument(
        "--rates",
        default=None,
        help="--gate, --gated: the learning rates this process runs, comma-separated (default: all; one process "
        "per rate)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan (arms, claims, estimate); run nothing")
    p.add_argument(
        "--seeds",
        type=_count(1),
        default=None,
        help="seeds this process runs (--real: seeds per arm; the miniature study: its share of the registered seeds)",
    )
    p.add_argument(
        "--first-seed",
        type=_count(0),
        default=None,
        help="the first seed (split one study over processes; join them with --summarize)",
    )
    p.add_argument("--length", type=_count(1), default=None, help="--real: rollout.max_new_tokens (default 40)")
    p.add_argument(
        "--summarize",
        nargs="+",
        metavar="DIR",
        default=None,
        help="join these study folders (split over processes), or a kept record folder, into one page: --real "
        "prints its tables; the miniature study writes study.html/.md and runs.jsonl under --out",
    )
    p.add_argument(
        "--resume",
        metavar="STUDY_DIR",
        default=None,
        help="continue a stopped miniature study in its folder, under its plan.json: finished runs are kept, a run "
        "stopped part-way is moved to STUDY_DIR/unfinished/ and run again",
    )
    p.add_argument(
        "--keep",
        metavar="RECORDS",
        default=None,
        help="with --summarize: write the plan and the kept table (runs.jsonl, one row per regime, arm and seed) "
        "into RECORDS, which --summarize reads as it reads the folders (studies.records)",
    )
    return p


def run(args) -> int:
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip()) if args.arms else None
    if args.keep is not None and not args.summarize:
        raise ConfigError("--keep: only with --summarize DIR...")
    if args.summarize:
        missing = [d for d in args.summarize if not Path(d).is_dir()]
        if missing:
            raise ConfigError(f"--summarize: no such study folder {missing}")
    if args.gate:
        return _gate(args)
    if args.gated is not None:
        return _gated(args, arms)
    if args.real2:
        return _real2(args, arms)
    if args.real:
        return _real(args, arms)
    if args.length is not None:
        raise ConfigError("--length: only with --real")
    from studies.miniature import (  # heavy (transformers, matplotlib): after every argument is checked
        ARMS_BY_NAME,
        QUICK,
        StudySettings,
        estimate_seconds,
        resumable_study,
        run_study,
        study_plan,
        summarize_study,
    )

    if args.resume is not None:  # a stopped miniature study, under its own plan: nothing else may change it
        flags = (("--quick", args.quick), ("--arms", args.arms), ("--seeds", args.seeds))
        flags += (("--first-seed", args.first_seed), ("--summarize", args.summarize), ("--dry-run", args.dry_run))
        given = [flag for flag, value in flags if value not in (None, False)]
        if given:
            raise ConfigError(f"--resume: the study's plan.json sets what it runs; drop {', '.join(given)}")
        resumable_study(Path(args.resume))  # every check before any model loads
        html = run_study(log=_log, resume=args.resume)
        print(f"study: {html}\n       {html.with_suffix('.md')}")
        return 0
    if args.summarize:  # join a (split) miniature study's folders, or its kept records, into one page
        dirs = [Path(d) for d in args.summarize]
        missing = [str(d) for d in dirs if not (d / "plan.json").is_file() or not (d / "regimes.json").is_file()]
        if missing:
            raise ConfigError(f"--summarize: not a started study folder (plan.json, regimes.json): {missing}")
        out = Path(args.out)
        html = summarize_study(dirs, out, log=_log)
        if args.keep is not None:
            from studies.records import keep_records
            from studies.table import TABLE, read_table

            keep_records(dirs, Path(args.keep), read_table(out / TABLE), log=_log)
        print(f"study: {html}\n       {html.with_suffix('.md')}")
        return 0
    unknown = [a for a in arms or () if a not in ARMS_BY_NAME]
    if unknown:
        raise ConfigError(f"--arms: unknown study arm(s) {unknown}; available: {', '.join(ARMS_BY_NAME)}")
    s = replace(QUICK if args.quick else StudySettings(), arms=arms)
    if args.seeds is not None or args.first_seed is not None:  # this process's share of the registered seeds
        first = args.first_seed or 0
        count = args.seeds if args.seeds is not None else s.seeds - first
        if first + count > s.seeds:
            raise ConfigError(f"--first-seed {first} --seeds {count}: past the {s.seeds} registered seeds")
        s = replace(s, split=(first, count))
    if args.dry_run:
        chosen = [ARMS_BY_NAME[n] for n in arms] if arms else None
        print(json.dumps(study_plan(s, chosen), indent=2, default=str))
        mine = estimate_seconds(replace(s, seeds=len(s.run_seeds), split=None), chosen)
        _log(f"estimated wall time of this process on one core: {mine / 60:.0f} min (a cost model, not a measurement)")
        return 0
    html = run_study(quick=args.quick, out_root=args.out, log=_log, settings=s)
    print(f"study: {html}\n       {html.with_suffix('.md')}")
    return 0


def _real(args, arms) -> int:
    if args.resume is not None:
        raise ConfigError(
            "--resume: the miniature study only (continue `--real` with --first-seed/--seeds for the seeds it has "
            "not finished: the SFT start and the sweep are reused)"
        )
    from studies.real import (  # heavy, as above
        REAL_ARMS_BY_NAME,
        RealSettings,
        real_arm_config,
        real_plan,
        run_real_study,
        study_table,
        summarize_real,
    )

    unknown = [a for a in arms or () if a not in REAL_ARMS_BY_NAME]
    if unknown:
        raise ConfigError(f"--arms: unknown real-model arm(s) {unknown}; available: {', '.join(REAL_ARMS_BY_NAME)}")
    if args.summarize:  # join (split) real-model studies, or their kept records, into one table
        dirs = [Path(d) for d in args.summarize]
        if args.keep is not None:
            from studies.records import keep_records

            keep_records(dirs, Path(args.keep), study_table(dirs), log=_log)
        print(summarize_real(dirs))
        return 0
    settings = {k: v for k, v in (("seeds", args.seeds), ("first_seed", args.first_seed), ("length", args.length))}
    s = RealSettings(arms=arms, **{k: v for k, v in settings.items() if v is not None})
    if args.dry_run:  # every arm's config validates, before any model loads
        for name in arms or REAL_ARMS_BY_NAME:
            real_arm_config(REAL_ARMS_BY_NAME[name], s, 0, Path(args.out) / "dry-run")
        chosen = [REAL_ARMS_BY_NAME[n] for n in arms or REAL_ARMS_BY_NAME]
        print(json.dumps(real_plan(s, chosen), indent=2, default=str))
        return 0
    print(f"real-model study: {run_real_study(s, out_root=args.out, log=_log)}")
    return 0


def _gate(args) -> int:
    from studies.gate import GateSettings, gate_plan, gate_real_settings, keep_gate, run_gate, summarize_gate

    g = GateSettings()
    if args.summarize:
        dirs = [Path(d) for d in args.summarize]
        if args.keep is not None:
            keep_gate(dirs, Path(args.keep))
        print(summarize_gate(dirs, g))
        return 0
    rates = g.rates
    if args.rates:
        try:
            rates = tuple(float(r) for r in args.rates.split(","))
        except ValueError:
            raise ConfigError(f"--rates: expected comma-separated numbers, got {args.rates!r}") from None
        unknown = [r for r in rates if r not in g.rates]
        if unknown:
            raise ConfigError(f"--rates: {unknown} are not registered rates ({', '.join(f'{r:g}' for r in g.rates)})")
    real = gate_real_settings(g)
    if args.dry_run:
        print(json.dumps(gate_plan(g, real), indent=2, default=str))
        return 0
    print(f"gate: {run_gate(g, real, rates, args.out, log=_log)}")
    return 0


def _gated(args, arms) -> int:
    from studies import gated

    design = args.design or list(gated.DESIGNS)[-1]
    if design not in gated.DESIGNS:
        raise ConfigError(f"--design: {design!r} is not a registered design ({', '.join(gated.DESIGNS)})")
    if args.dry_run:
        print(json.dumps(gated.gated_plan(gated.DESIGNS[design]), indent=2))
        return 0
    if args.summarize:  # the study folder, or its kept records (plan.json + runs.jsonl)
        from studies.table import TABLE, read_table

        if len(args.summarize) != 1:
            raise ConfigError("--gated --summarize: one folder (a study folder or its kept records)")
        study = Path(args.summarize[0])
        g = gated.open_study(study, None)
        kept = study / TABLE
        rows = read_table(kept) if kept.is_file() else gated.gated_rows(study, g)
        if args.keep is not None:
            gated.keep(study, Path(args.keep), g)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        body = gated.summarize(rows, g, json.loads((study / "plan.json").read_text()), out)
        (out / "gated.md").write_text(body + "\n")
        print(body)
        return 0
    if not args.gated:
        raise ConfigError("--gated: name the study folder (STUDY_DIR)")
    study = Path(args.gated)
    g = gated.open_study(study, gated.DESIGNS[args.design] if args.design else None)
    unknown = [a for a in arms or () if a not in g.arms]
    if unknown:
        raise ConfigError(f"--arms: {unknown} are not this study's arms ({', '.join(g.arms)})")
    if args.rates:
        try:
            rates = tuple(float(r) for r in args.rates.split(","))
        except ValueError:
            raise ConfigError(f"--rates: expected comma-separated numbers, got {args.rates!r}") from None
        if any(r not in g.rates for r in rates):
            raise ConfigError(
                f"--rates: {args.rates} are not the gate's rates ({', '.join(f'{r:g}' for r in g.rates)})"
            )
        gated.run_gate(g, study, rates, log=_log)
        return 0
    lr = gated.gate_met(study, g)
    first = args.first_seed or 0
    count = args.seeds if args.seeds is not None else g.seeds - first
    if first + count > g.seeds:
        raise ConfigError(f"--first-seed {first} --seeds {count}: past the {g.seeds} registered seeds")
    gated.run_primaries(g, study, lr, list(range(first, first + count)), list(arms or g.arms), log=_log)


def _real2(args, arms) -> int:
    if args.resume is not None or args.length is not None:
        raise ConfigError("--real2: no --resume or --length (continue it with --first-seed/--seeds)")
    from studies.real2 import (
        QUICK,
        REAL2_ARMS_BY_NAME,
        Real2Settings,
        _split,
        hard_ids,
        keep_real2,
        real2_plan,
        run_real2,
        summarize_real2,
        table_rows,
    )

    unknown = [a for a in arms or () if a not in REAL2_ARMS_BY_NAME]
    if unknown:
        raise ConfigError(f"--arms: unknown v2 arm(s) {unknown}; available: {', '.join(REAL2_ARMS_BY_NAME)}")
    s = QUICK if args.quick else Real2Settings()
    if arms:
        s = replace(s, arms=arms)
    if args.summarize:
        dirs = [Path(d) for d in args.summarize]
        if args.keep is not None:
            keep_real2(dirs, Path(args.keep))
        print(summarize_real2(table_rows(dirs), set(hard_ids(_split(s), s.hard_steps)), s))
        return 0
    if args.seeds is not None or args.first_seed is not None:
        first = args.first_seed or 0
        count = args.seeds if args.seeds is not None else s.registered_seeds - first
        if first + count > s.registered_seeds:
            raise ConfigError(f"--first-seed {first} --seeds {count}: past the {s.registered_seeds} registered seeds")
        s = replace(s, first_seed=first, seeds=count)
    if args.dry_run:
        plan = real2_plan(s)
        print(json.dumps(plan, indent=2, default=str))
        cost, power = plan["cost"], plan["power"]
        _log(
            f"v2: {power['seeds_for_80_percent']} seeds for 80 % power at +2.9 (sd {100 * power['sd_used']:.2f} pts, "
            f"level {power['level_first_holm_step']:.4f}); registered {s.registered_seeds}; "
            f"{cost['per_seed_core_hours']:.1f} core-hours a seed, {cost['design_core_hours']:.0f} for the design "
            f"at the gate's load ({cost['design_core_hours_at_light_load']:.0f} at its lightest); this process "
            f"{cost['this_process_core_hours']:.0f} (a cost model, not a measurement)"
        )
        return 0
    print(f"real2: {run_real2(s, out_root=args.out, log=_log)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except Exception as exc:
        line = user_error(exc)
        if line is None or args.debug:
            raise
        _log(line)
        return 2
