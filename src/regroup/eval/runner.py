"""Evaluation: sample n responses per problem, grade them, and summarise as pass@k / mean@n / greedy.

`evaluate` works on an in-memory model and list of problems (the trainer calls it between steps);
`run_eval_cli` loads a saved HF model directory and benchmark files and writes the result files that
`regroup report` reads. Estimators follow SPEC §5: unbiased pass@k `1 − C(n−c, k) / C(n, k)` averaged
over problems, mean@n (average accuracy over all samples) and greedy accuracy.

Summary schema (`EvalResult.summary`, written to `summary.json`)::

    {"num_problems": P, "n": n, "pass@k": {"1": ..., "8": ...}, "mean@n": ..., "stderr": ...,
     "greedy": ... | null, "by_difficulty": {"<difficulty>": {"mean@n": ..., "count": ..., "greedy": ...}},
     "truncated_frac": ..., "settings": {...}}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from regroup.config.fields import read_yaml
from regroup.config.schema import DataConfig, RewardsConfig, RolloutConfig, read_sections, resolve_config_path
from regroup.data.load import FieldMap, load_problems
from regroup.eval.benchmarks import BENCHMARKS, grader_for, load_benchmark, protocol
from regroup.eval.passk import mean_pass_at_k
from regroup.io import write_atomic
from regroup.models.load import configured_model_path, is_adapter_dir, load_for_inference
from regroup.models.memory import check_eval_memory
from regroup.models.prompting import build_prompter, encode_prompt
from regroup.rewards.math_verify import MathAnswerChecker
from regroup.rollout.base import SamplingParams
from regroup.rollout.factory import build_sampler
from regroup.rollout.hf import HFSampler
from regroup.runtime.rundir import read_saved_config
from regroup.tasks import get_task

Grader = Callable[[str, Any], "float | None"]

# A graded score at or above this counts as correct. Rewards are binary in every built-in grader;
# the threshold keeps a partial-credit grader (e.g. 0.3 for a right format) from counting as solved.
CORRECT_THRESHOLD = 0.5

# Label for problems whose `difficulty` is None in `by_difficulty`.
UNKNOWN_DIFFICULTY = "unknown"


@dataclass
class ProblemResult:
    """The graded outcome of one problem."""

    id: Any
    difficulty: Any
    n: int
    """Number of sampled responses."""
    correct: int
    """How many of the n sampled responses were graded correct."""
    greedy_correct: bool | None
    """Whether the greedy (temperature 0) response was correct; None when greedy decoding was off."""
    greedy_response: str | None = None
    """The greedy response text (for reading failures), or None."""
    sample_response: str | None = None
    """The first sampled response text, or None when n = 0."""


@dataclass
class EvalResult:
    """Per-problem results and their summary (see the module docstring for the summary keys)."""

    problems: list[ProblemResult]
    summary: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict: {"summary": ..., "problems": [...]}."""
        return {"summary": self.summary, "problems": [asdict(p) for p in self.problems]}

    def to_json(self, indent: int | None = 2) -> str:
        """The result as a JSON string (summary and per-problem rows)."""
        return json.dumps(self.to_dict(), indent=indent, default=_json_default)


def _json_default(obj: Any) -> Any:
    """Fallback JSON encoding for ids / difficulties that are not plain JSON types (e.g. numpy ints)."""
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def is_correct(score: float | None, threshold: float = CORRECT_THRESHOLD) -> bool:
    """Whether a grader score counts as a solved sample (None — unscoreable — counts as wrong)."""
    if score is None:
        return False
    score = float(score)
    return math.isfinite(score) and score >= threshold


def _check_ks(ks: Sequence[int]) -> list[int]:
    """Validated, sorted, de-duplicated k values."""
    out = sorted({int(k) for k in ks})
    if any(k < 1 for k in out):
        raise ValueError(f"every k in ks must be >= 1, got {list(ks)}")
    return out


def summarize(results: Sequence[ProblemResult], ks: Sequence[int], greedy: bool) -> dict[str, Any]:
    """Summary statistics of per-problem results: pass@k (k ≤ n), mean@n, its SE, greedy, by difficulty.

    mean@n is the mean over problems of c_i / n; its standard error is the sample standard deviation
    of c_i / n over problems divided by √P (None when P < 2: one problem gives no spread to estimate).
    """
    num = len(results)
    n = results[0].n if results else 0
    if any(r.n != n for r in results):
        raise ValueError("all problems must have the same number of samples n to summarise pass@k")
    summary: dict[str, Any] = {"num_problems": num, "n": n}
    counts = [r.correct for r in results]
    summary["pass@k"] = {
        str(k): float(mean_pass_at_k([(n, c) for c in counts], k)) for k in _check_ks(ks) if k <= n and num
    }
    accs = [c / n for c in counts] if n else []
    summary["mean@n"] = float(sum(accs) / num) if num and n else None
    summary["stderr"] = _stderr(accs)
    if greedy and num:
        summary["greedy"] = float(sum(bool(r.greedy_correct) for r in results) / num)
    else:
        summary["greedy"] = None

    groups: dict[str, list[ProblemResult]] = {}
    for r in results:
        key = UNKNOWN_DIFFICULTY if r.difficulty is None else str(r.difficulty)
        groups.setdefault(key, []).append(r)
    by_diff: dict[str, Any] = {}
    for key in sorted(groups, key=_difficulty_sort_key):
        rows = groups[key]
        by_diff[key] = {
            "mean@n": float(sum(r.correct / n for r in rows) / len(rows)) if n else None,
            "count": len(rows),
            "greedy": float(sum(bool(r.greedy_correct) for r in rows) / len(rows)) if greedy else None,
        }
    summary["by_difficulty"] = by_diff
    return summary


def _difficulty_sort_key(key: str) -> tuple[int, float, str]:
    """Numeric difficulties in numeric order, then the rest alphabetically ("unknown" last)."""
    try:
        return (0, float(key), key)
    except ValueError:
        return (2 if key == UNKNOWN_DIFFICULTY else 1, 0.0, key)


def _stderr(values: Sequence[float]) -> float | None:
    """Standard error of the mean of `values` (sample std / √len), None for fewer than 2 values."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var / len(values))


def evaluate(
    model,
    tokenizer,
    problems: Sequence[Any],
    grader: Grader,
    *,
    n: int = 8,
    ks: Sequence[int] = (1, 8),
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    greedy: bool = True,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = True,
    sampler=None,
    prompter=None,
    correct_threshold: float = CORRECT_THRESHOLD,
) -> EvalResult:
    """Sample `n` responses per problem (and one greedy one), grade them, and summarise (SPEC §5).

    `grader(response_text, problem)` returns a score; ≥ `correct_threshold` counts as correct, None as
    wrong. `batch_size` bounds the number of sequences per generate call. `sampler` defaults to
    `HFSampler(model, tokenizer)`; pass another backend (same `generate` interface) to reuse it.
    `prompter` (regroup.models.prompting.Prompter) formats the questions as in training; None: the
    tokenizer's chat template around the bare question.
    The model's train/eval mode is restored afterwards.
    """
    if n < 1:
        raise ValueError(f"n (samples per problem) must be >= 1, got {n}")
    if not problems:
        raise ValueError("evaluate needs at least one problem; got an empty list")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ks = _check_ks(ks)
    if sampler is None:
        sampler = HFSampler(model, tokenizer, batch_size=batch_size)

    prompts = [
        prompter.encode(p.question) if prompter is not None else encode_prompt(tokenizer, p.question) for p in problems
    ]
    correct = [0] * len(problems)
    first_text: list[str | None] = [None] * len(problems)
    greedy_ok: list[bool | None] = [None] * len(problems)
    greedy_text: list[str | None] = [None] * len(problems)
    truncated = 0

    sample_params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, n=n)
    greedy_params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens, n=1)
    per_call = max(1, batch_size // n)  # prompts per sampled call, so a call holds ≤ batch_size sequences
    total = len(problems) * (n + (1 if greedy else 0))

    was_training = getattr(model, "training", False)
    bar = _progress_bar(total, progress)
    try:
        for start in range(0, len(prompts), per_call):
            chunk = prompts[start : start + per_call]
            # One seed per problem, so results depend neither on what ran before nor on batch_size.
            seeds = [seed * 1_000_003 + start + j for j in range(len(chunk))]
            for comp in sampler.generate(chunk, sample_params, seed=seeds):
                i = start + comp.prompt_index
                if first_text[i] is None:
                    first_text[i] = comp.text
                correct[i] += int(is_correct(grader(comp.text, problems[i]), correct_threshold))
                truncated += int(comp.truncated)
            bar.update(len(chunk) * n)
        if greedy:
            for start in range(0, len(prompts), batch_size):
                chunk = prompts[start : start + batch_size]
                for comp in sampler.generate(chunk, greedy_params, seed=None):
                    i = start + comp.prompt_index
                    greedy_text[i] = comp.text
                    greedy_ok[i] = is_correct(grader(comp.text, problems[i]), correct_threshold)
                bar.update(len(chunk))
    finally:
        bar.close()
        if was_training and hasattr(model, "train"):
            model.train()

    results = [
        ProblemResult(
            id=p.id,
            difficulty=getattr(p, "difficulty", None),
            n=n,
            correct=correct[i],
            greedy_correct=greedy_ok[i],
            greedy_response=greedy_text[i],
            sample_response=first_text[i],
        )
        for i, p in enumerate(problems)
    ]
    settings = {
        "n": n,
        "ks": ks,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "greedy": greedy,
        "seed": seed,
        "correct_threshold": correct_threshold,
    }
    if prompter is not None:
        settings["prompt"] = prompter.describe()
    summary = summarize(results, ks, greedy)
    summary["truncated_frac"] = truncated / (len(problems) * n) if problems else None
    summary["settings"] = settings
    return EvalResult(problems=results, summary=summary, settings=settings)


def _progress_bar(total: int, enabled: bool):
    """A tqdm bar over generated sequences (a silent stand-in when disabled)."""
    return tqdm(total=total, desc="eval", unit="seq", disable=not enabled, leave=False)


# ---------------------------------------------------------------- saved model × benchmark files


def _bench_name(path: str, taken: set[str]) -> str:
    """A benchmark name from its file / folder name, made unique among `taken`."""
    base = os.path.basename(os.path.normpath(path))
    for ext in (".jsonl", ".json", ".parquet"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    name, i = base or "bench", 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def make_grader(checker: str, task: str, answer_marker: str | None = None) -> Grader:
    """The grading function for `checker`: the named task's grader, or the math-verify checker (the
    last `\\boxed{}`, or the text after `answer_marker` when given; SPEC §5)."""
    if checker == "task":
        return get_task(task).grade
    if checker == "math":
        return MathAnswerChecker(marker=answer_marker)
    raise ValueError(f"checker must be 'task' or 'math', got {checker!r}")


def _row(bench: str, summary: dict[str, Any], ks: Sequence[int]) -> dict[str, Any]:
    """One flat table row of a benchmark summary."""
    row: dict[str, Any] = {"benchmark": bench, "num_problems": summary["num_problems"], "n": summary["n"]}
    for k in ks:
        row[f"pass@{k}"] = summary["pass@k"].get(str(k))
    row["mean@n"] = summary["mean@n"]
    row["stderr"] = summary["stderr"]
    row["greedy"] = summary["greedy"]
    return row


def average_row(rows: Sequence[dict[str, Any]], label: str = "average") -> dict[str, Any]:
    """The unweighted mean over benchmarks of every metric (as the papers' tables average).

    The SE of the average is √(Σ SE_b²) / B (benchmarks are independent samples); a metric missing
    from any benchmark is left None rather than averaged over a subset.
    """
    out: dict[str, Any] = {"benchmark": label, "num_problems": sum(r["num_problems"] for r in rows)}
    out["n"] = rows[0]["n"] if rows and all(r["n"] == rows[0]["n"] for r in rows) else None
    keys = [k for k in rows[0] if k not in ("benchmark", "num_problems", "n", "stderr")] if rows else []
    for key in keys:
        vals = [r.get(key) for r in rows]
        known = [v for v in vals if v is not None]
        out[key] = None if len(known) < len(vals) else float(sum(known) / len(vals))
    ses = [r["stderr"] for r in rows if r.get("stderr") is not None]
    out["stderr"] = None if not rows or len(ses) < len(rows) else math.sqrt(sum(s * s for s in ses)) / len(rows)
    return out


@dataclass
class EvalSet:
    """One benchmark to run: its problems, grader and sampling settings."""

    name: str
    problems: list
    grader: Grader
    n: int
    ks: list[int]
    temperature: float
    top_p: float
    source: str
    skipped: int = 0


@dataclass
class EvalSetup:
    """What `regroup eval` evaluates with: the model, its tokenizer, the run's prompting and threshold."""

    model: Any
    tokenizer: Any
    prompter: Any
    correct_threshold: float
    run_config: str | None
    """The config.yaml the prompting was read from (the model is a regroup checkpoint), or None."""


def run_config_path(model_path: str) -> str | None:
    """RUN/config.yaml when `model_path` is a regroup checkpoint folder RUN/checkpoints/step-N, else None."""
    folder = os.path.abspath(model_path)
    parent = os.path.dirname(folder)
    candidate = os.path.join(os.path.dirname(parent), "config.yaml")
    return candidate if os.path.basename(parent) == "checkpoints" and os.path.isfile(candidate) else None


EVAL_SECTIONS = ("data", "rewards", "model")
"""What an evaluation reads of a run's config."""


class ModelLoadError(ValueError):
    """The model folder could not be loaded (torn weights, a broken config.json): one line naming the folder."""


def check_model_folder(model_path: str) -> None:
    """A regroup checkpoint (a folder with a manifest.json) must verify as a resume's does before any of it is
    read: every listed file present with its sha256, no unlisted file or link (`verify_checkpoint`), so a torn
    or edited checkpoint is a CheckpointError naming the file. Any checkpoint format: only the weights are read.
    A plain Hugging Face folder has no manifest and is not checked here."""
    from regroup.runtime.checkpoint import MANIFEST, verify_checkpoint  # heavy (torch): when a model is loaded

    if os.path.lexists(os.path.join(model_path, MANIFEST)):
        verify_checkpoint(Path(model_path), any_format=True)


def _load_model(model_path: str, dtype: str, device: str | None, base_path: str | None):
    """`load_for_inference`, its failure on the folder's files (a corrupt safetensors header, a config.json
    that does not parse, weights of the wrong shape) worded as one ModelLoadError."""
    from safetensors import SafetensorError  # the weights reader's own error type (not an OSError)

    try:
        return load_for_inference(model_path, dtype=dtype, device=device, base_path=base_path)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        cause = " ".join(str(exc).split())[:300] or "no detail"
        raise ModelLoadError(
            f"--model {model_path}: the model could not be loaded: {type(exc).__name__}: {cause}"
        ) from exc


def load_eval_setup(
    model_path: str,
    *,
    dtype: str = "float32",
    device: str | None = None,
    system_prompt: str | None = None,
    prompt_template: str | None = None,
    chat_template: str | None = None,
    correct_threshold: float | None = None,
    config_file: str | None = None,
) -> EvalSetup:
    """Load `model_path` (HF folder or regroup checkpoint, full or LoRA) with the prompting of its run.

    For a checkpoint, `data.system_prompt` / `prompt_template` / `chat_template` and
    `rewards.correct_threshold` come from the run's config.yaml (or from `config_file`, a recipe or
    run config, e.g. to evaluate the starting model as the run will prompt it); explicit arguments
    override them. Only those sections (and `model`, for a LoRA checkpoint's base) are read
    (`EVAL_SECTIONS`): nothing the config names is imported, and none of its files need to exist.
    A checkpoint is verified against its manifest first (`check_model_folder`); a folder that does not load is
    a ModelLoadError.
    """
    if not os.path.isdir(model_path):
        raise FileNotFoundError(f"model directory not found: {model_path}")
    check_model_folder(model_path)  # before anything in it is read
    cfg_path = config_file or run_config_path(model_path)
    sections = None
    if config_file is not None:
        sections = read_sections(read_yaml(resolve_config_path(config_file)), str(config_file), *EVAL_SECTIONS)
    elif cfg_path:
        sections = read_sections(read_saved_config(cfg_path), cfg_path, *EVAL_SECTIONS)
    data_cfg = sections["data"] if sections else DataConfig()
    base_path = None
    if sections and sections["model"].path and is_adapter_dir(model_path):
        base_path = configured_model_path(sections["model"])  # a LoRA checkpoint's base (GGUF: the cached conversion)
    model, tokenizer = _load_model(model_path, dtype, device, base_path)
    for key, value in (
        ("system_prompt", system_prompt),
        ("prompt_template", prompt_template),
        ("chat_template", chat_template),
    ):
        if value is not None:
            setattr(data_cfg, key, value)
    builtin = sections is not None and not sections["model"].path
    prompter = build_prompter(data_cfg, tokenizer, builtin_model=builtin)
    if correct_threshold is None:
        correct_threshold = (sections["rewards"] if sections else RewardsConfig()).correct_threshold
    return EvalSetup(model, tokenizer, prompter, correct_threshold, cfg_path)


def build_eval_sampler(backend: str, model, tokenizer, batch_size: int, max_new_tokens: int):
    """The generation backend for evaluation: hf (default) or vllm (`rollout.backend` of the trainer)."""
    if backend not in ("hf", "vllm"):
        raise ValueError(f"--backend must be hf or vllm, got {backend!r}")
    sampler = build_sampler(
        RolloutConfig(
            backend="vllm" if backend == "vllm" else "hf", batch_size=batch_size, max_new_tokens=max_new_tokens
        ),
        model,
        tokenizer,
    )
    if backend == "vllm":
        # The engine loads the folder the model came from: for a LoRA checkpoint that is the base model,
        # so the merged weights being evaluated are pushed once.
        sampler.sync_weights(model)
    return sampler


def run_eval_cli(
    model_path: str,
    data_files: Sequence[str],
    out_dir: str,
    *,
    n: int = 8,
    ks: Sequence[int] = (1, 8),
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    question_field: str = "question",
    answer_field: str = "answer",
    checker: str = "task",
    task: str = "arithmetic",
    answer_marker: str | None = None,
    greedy: bool = True,
    batch_size: int = 64,
    seed: int = 0,
    limit: int | None = None,
    skip_bad_rows: bool = False,
    device: str | None = None,
    progress: bool = True,
    dtype: str = "float32",
    backend: str = "hf",
    prompt: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Evaluate a saved HF causal LM (or regroup checkpoint) on benchmark files; write per-benchmark
    and overall results.

    Writes `out_dir/<bench>/per_problem.jsonl`, `out_dir/<bench>/summary.json`, `out_dir/summary.json`
    ({"model", "settings", "rows"}: one row per benchmark plus an "average" row) and
    `out_dir/summary.md`. `checker="task"` grades with `get_task(task).grade`; `checker="math"` with
    math-verify (`answer_marker`: text marking the final answer, else the last `\\boxed{}`). `limit`
    keeps the first `limit` problems of each file. `prompt` overrides the prompting (system_prompt,
    prompt_template, chat_template, correct_threshold) read from a checkpoint's run. Returns the rows.
    """
    if not data_files:
        raise ValueError("run_eval_cli needs at least one benchmark file in data_files")
    ks = _check_ks(ks)
    if not os.path.isdir(model_path):
        raise FileNotFoundError(f"model directory not found: {model_path}")
    grader = make_grader(checker, task, answer_marker)
    try:
        sets: list = []
        taken: set[str] = set()
        for path in data_files:
            loaded = load_problems(
                path, fields=FieldMap(question=question_field, answer=answer_field), skip_bad_rows=skip_bad_rows
            )
            problems = list(loaded.problems)[:limit] if limit is not None else list(loaded.problems)
            if not problems:
                raise ValueError(f"no usable problems in {path} (skipped {len(loaded.skipped)} bad rows)")
            sets.append(
                EvalSet(
                    _bench_name(path, taken),
                    problems,
                    grader,
                    n,
                    list(ks),
                    temperature,
                    top_p,
                    os.path.abspath(path),
                    len(loaded.skipped),
                )
            )
        check_eval_memory(
            model_path,
            n=max(n, 1),
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            problems=sum(len(s.problems) for s in sets),
            device=device,
        )
        setup = load_eval_setup(model_path, dtype=dtype, device=device, **(prompt or {}))
        settings = {"checker": checker, "task": task if checker == "task" else None, "answer_marker": answer_marker}
        return evaluate_sets(
            setup,
            sets,
            out_dir,
            model_path=model_path,
            max_new_tokens=max_new_tokens,
            greedy=greedy,
            batch_size=batch_size,
            seed=seed,
            limit=limit,
            progress=progress,
            backend=backend,
            settings=settings,
            checker_stats=grader,
        )
    finally:
        close = getattr(grader, "close", None)
        if callable(close):
            close()  # the math checker runs a worker process


def run_bench_cli(
    model_path: str,
    benches: Sequence[str],
    out_dir: str,
    *,
    paper: str = "dagrpo",
    n: int | None = None,
    ks: Sequence[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    max_new_tokens: int = 512,
    greedy: bool = False,
    batch_size: int = 64,
    seed: int = 0,
    limit: int | None = None,
    device: str | None = None,
    dtype: str = "float32",
    backend: str = "hf",
    bench_files: dict[str, str] | None = None,
    prompt: dict[str, Any] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Evaluate on named benchmarks (`regroup.eval.benchmarks`), each with the sampling protocol of
    `paper` ("dagrpo" or "ta_grpo") unless n / ks / temperature / top_p are given. `bench_files`
    maps a benchmark name to a local file or folder standing in for the hub. Writes the same files
    as `run_eval_cli`; returns the rows (one per benchmark plus the average)."""
    if paper not in ("dagrpo", "ta_grpo"):
        raise ValueError(f"--protocol must be dagrpo or ta_grpo, got {paper!r}")
    unknown = sorted(set(bench_files or {}) - set(BENCHMARKS))
    if unknown:
        raise ValueError(f"--bench-file names unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    checker = MathAnswerChecker()
    try:
        sets = []
        for name in benches:
            bench = BENCHMARKS[name]
            problems, origin, skipped = load_benchmark(name, (bench_files or {}).get(name), limit)
            proto = protocol(bench, paper)
            bench_n = n if n is not None else proto.n
            bench_ks = [k for k in (ks if ks is not None else proto.ks) if k <= bench_n] or [1]
            sets.append(
                EvalSet(
                    name,
                    problems,
                    grader_for(bench, checker),
                    bench_n,
                    _check_ks(bench_ks),
                    proto.temperature if temperature is None else temperature,
                    proto.top_p if top_p is None else top_p,
                    origin,
                    skipped,
                )
            )
        check_eval_memory(
            model_path,
            n=max(s.n for s in sets),
            batch_size=batch_size,
            max_new_tokens=max_new_tokens,
            problems=sum(len(s.problems) for s in sets),
            device=device,
        )
        setup = load_eval_setup(model_path, dtype=dtype, device=device, **(prompt or {}))
        return evaluate_sets(
            setup,
            sets,
            out_dir,
            model_path=model_path,
            max_new_tokens=max_new_tokens,
            greedy=greedy,
            batch_size=batch_size,
            seed=seed,
            limit=limit,
            progress=progress,
            backend=backend,
            settings={"protocol": paper},
            checker_stats=checker,
        )
    finally:
        checker.close()


def evaluate_sets(
    setup: EvalSetup,
    sets: Sequence[EvalSet],
    out_dir: str,
    *,
    model_path: str,
    max_new_tokens: int,
    greedy: bool,
    batch_size: int,
    seed: int,
    limit: int | None,
    progress: bool,
    backend: str,
    settings: dict[str, Any],
    checker_stats=None,
) -> list[dict[str, Any]]:
    """Evaluate every set with one loaded model; write per-set files, summary.json and summary.md."""
    sampler = build_eval_sampler(backend, setup.model, setup.tokenizer, batch_size, max_new_tokens)
    os.makedirs(out_dir, exist_ok=True)
    all_ks = sorted({k for s in sets for k in s.ks})
    rows: list[dict[str, Any]] = []
    for es in sets:
        result = evaluate(
            setup.model,
            setup.tokenizer,
            es.problems,
            es.grader,
            n=es.n,
            ks=es.ks,
            temperature=es.temperature,
            top_p=es.top_p,
            max_new_tokens=max_new_tokens,
            greedy=greedy,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
            sampler=sampler,
            prompter=setup.prompter,
            correct_threshold=setup.correct_threshold,
        )
        result.summary["source"] = es.source
        result.summary["skipped_rows"] = es.skipped
        bench_dir = os.path.join(out_dir, es.name)
        os.makedirs(bench_dir, exist_ok=True)
        write_atomic(
            os.path.join(bench_dir, "per_problem.jsonl"),
            "".join(json.dumps(asdict(p), default=_json_default) + "\n" for p in result.problems),
        )
        _write_json(os.path.join(bench_dir, "summary.json"), result.summary)
        rows.append(_row(es.name, result.summary, all_ks))

    rows.append(average_row(rows))
    uniform = {key: getattr(sets[0], key) for key in ("n", "temperature", "top_p")} if sets else {}
    for key in list(uniform):
        if any(getattr(s, key) != uniform[key] for s in sets):
            uniform[key] = "per benchmark"
    settings = {
        **uniform,
        "ks": all_ks,
        "max_new_tokens": max_new_tokens,
        **settings,
        "greedy": greedy,
        "seed": seed,
        "limit": limit,
        "backend": backend,
        "correct_threshold": setup.correct_threshold,
        "prompt": setup.prompter.describe(),
        "run_config": setup.run_config,
        "per_benchmark": {s.name: {"n": s.n, "ks": s.ks, "temperature": s.temperature, "top_p": s.top_p} for s in sets},
    }
    top: dict[str, Any] = {"model": os.path.abspath(model_path), "settings": settings, "rows": rows}
    if isinstance(getattr(checker_stats, "stats", None), dict):
        top["checker_stats"] = dict(checker_stats.stats)  # timeouts etc. of math-verify
    _write_json(os.path.join(out_dir, "summary.json"), top)
    write_atomic(os.path.join(out_dir, "summary.md"), format_markdown(rows) + "\n")
    return rows


def _write_json(path: str, obj: Any) -> None:
    """Write JSON atomically, so a reader never sees half a file."""
    write_atomic(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width terminal table of result rows: accuracies in percent, mean@n as "mean ± SE"."""
    if not rows:
        return "(no results)"
    metric_keys = [k for k in rows[0] if k.startswith("pass@")]
    headers = ["benchmark", "problems", *metric_keys, "mean@n ± SE", "greedy"]
    body = []
    for r in rows:
        mean, se = r.get("mean@n"), r.get("stderr")
        mean_txt = _pct(mean) + (f" ± {100 * se:.1f}" if mean is not None and se is not None else "")
        body.append(
            [
                str(r["benchmark"]),
                str(r.get("num_problems", "")),
                *[_pct(r.get(k)) for k in metric_keys],
                mean_txt,
                _pct(r.get("greedy")),
            ]
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(headers), "  ".join("-" * w for w in widths)]
    for r, b in zip(rows, body):
        if r["benchmark"] == "average" and len(rows) > 1:
            out.append("  ".join("-" * w for w in widths))
        out.append(line(b))
    return "\n".join(out)


def _pct(value: float | None) -> str:
    """A fraction as a percentage with one decimal, or "-" when missing."""
    return "-" if value is None else f"{100 * value:.1f}"


def format_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The result rows as a Markdown table: accuracies in percent, mean@n as "mean ± SE"."""
    if not rows:
        return "(no results)"
    metric_keys = [k for k in rows[0] if k.startswith("pass@")]
    headers = ["benchmark", "problems", "n", *metric_keys, "mean@n ± SE", "greedy"]
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        mean, se = r.get("mean@n"), r.get("stderr")
        mean_txt = _pct(mean) + (f" ± {100 * se:.1f}" if mean is not None and se is not None else "")
        name = f"**{r['benchmark']}**" if r["benchmark"] == "average" else str(r["benchmark"])
        cells = [
            name,
            str(r.get("num_problems", "")),
            "-" if r.get("n") is None else str(r["n"]),
            *[_pct(r.get(k)) for k in metric_keys],
            mean_txt,
            _pct(r.get("greedy")),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)
