"""`run_rephrase`: the offline TA-GRPO augmentation job behind `regroup rephrase` (SPEC §3.1).

Loads a problem set, rephrases every question, writes the set back with `variants` filled, and writes
a summary (`<out>.summary.json`) of what was accepted, rejected, cached and failed per question.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from regroup.data.load import DataError, load_problems, save_problems
from regroup.errors import ConfigError
from regroup.io import write_atomic
from regroup.net import ChatClient, DiskCache
from regroup.net.redact import check_key_env_name, redact
from regroup.rephrase.base import RephraseOutcome, Rephraser
from regroup.rephrase.registry import build_rephraser
from regroup.tasks.arithmetic.render import surface_from_meta


def _chunks(seq: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [seq[i : i + size] for i in range(0, len(seq), size)]


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON (redacted: it quotes server errors) to a temporary file beside `path`, then rename:
    readers never see half a file."""
    write_atomic(path, redact(json.dumps(data, indent=2, ensure_ascii=False)) + "\n")


def _refuse_same_file(data_in: str, out: str) -> None:
    """A ConfigError when `out` is `data_in` itself (same file, or a link to it): rephrasing writes the set
    back with variants, and a row the loader skipped would be gone from the only copy."""
    if str(data_in).startswith("hf:") or not Path(out).exists():
        return
    try:
        same = Path(data_in).exists() and Path(out).samefile(data_in)
    except OSError:
        same = False
    if same:
        raise ConfigError(
            f"--out {out} is the input file --data {data_in}; rephrase writes a new file and never "
            "over its input: choose another --out"
        )


def summarise(outcomes: Sequence[RephraseOutcome]) -> dict[str, Any]:
    """Totals over outcomes: questions, failed questions, accepted / rejected / cached variants,
    request failures."""
    return {
        "questions": len(outcomes),
        "questions_failed": sum(o.failed for o in outcomes),
        "variants_accepted": sum(o.accepted for o in outcomes),
        "variants_rejected": sum(o.rejected for o in outcomes),
        "variants_cached": sum(o.cached for o in outcomes),
        "request_failures": sum(o.request_failures for o in outcomes),
    }


def network_totals(client: ChatClient | None) -> dict[str, int]:
    """The client's retries, Retry-After waits (and how many were capped), deadline hits and oversize
    replies; empty without a client (rules / dataset rewriters)."""
    if client is None:
        return {}
    st = client.stats
    return {
        name: int(st[name])
        for name in ("retries", "retry_after_waits", "retry_after_capped", "deadline_hits", "oversize")
    }


def _check_rules_can_rewrite(problems: Sequence[Any], data_in) -> None:
    """The rules rewriter rewrites the built-in arithmetic task's problems from the structure in their meta;
    refuse other data before anything is rewritten (it used to fail with a traceback at the first row)."""
    lacking = []
    for p in problems:
        try:
            surface_from_meta(p.meta, p.id)
        except (ValueError, TypeError, AttributeError):
            lacking.append(p.id)
    if lacking:
        raise ConfigError(
            f"the rules rewriter only rewrites the built-in arithmetic task's problems (their meta holds "
            f"the structure): {len(lacking)} of {len(problems)} rows of {data_in} have none (first: id "
            f"{lacking[0]!r}); use --rewriter openai --base-url URL --model NAME for other data"
        )


def run_rephrase(
    data_in: str,
    out: str,
    n: int,
    rewriter: str,
    *,
    base_url: str | None = None,
    model: str | None = None,
    api_key_env: str | None = "OPENAI_API_KEY",
    cache_dir: str | None = None,
    concurrency: int = 16,
    progress: bool = True,
    temperature: float = 0.7,
    seed: int = 0,
    skip_bad_rows: bool = False,
    timeout_s: float = 60.0,
    log=None,
) -> dict[str, Any]:
    """Add up to `n` variants to every question of `data_in` with `rewriter` ("rules", "openai",
    "dataset" or "package.module:object"), save the set to `out`, and return the summary that is
    also written to `out + ".summary.json"`.

    `base_url`, `model`, `api_key_env`, `concurrency`, `temperature` and `timeout_s` (the total deadline
    of one request, retries included) configure the openai rewriter; its retries, capped Retry-After
    waits, deadline hits and oversize replies are in the summary's `totals`;
    `cache_dir` keeps its answers (`<cache_dir>/rephrase.sqlite`) so a rerun only asks for what is
    missing; `seed` seeds the rules rewriter.

    `out` must not be `data_in` (the set is never written over its input). A malformed row raises the
    DataError naming it, unless `skip_bad_rows`: then each skipped row goes to `log` (one line each) and
    into the summary.
    """
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n (variants per question) must be an integer >= 0, got {n!r}")

    if rewriter == "openai":
        check_key_env_name(api_key_env, "--api-key-env")  # before anything is read or printed
        if not timeout_s > 0:
            raise ConfigError(f"--timeout must be > 0 seconds, got {timeout_s}")
        if not base_url or not model:
            raise ConfigError(
                "rewriter 'openai' needs --base-url and --model "
                "(e.g. --base-url https://api.openai.com/v1 --model gpt-4-turbo)"
            )
    _refuse_same_file(data_in, out)
    t0 = time.monotonic()
    try:
        loaded = load_problems(data_in, skip_bad_rows=skip_bad_rows)
    except DataError as e:
        if e.row is None:
            raise
        raise DataError(
            e.path, e.row, e.field, f"{e.message} (pass --skip-bad-rows to leave malformed rows out of {out})"
        ) from None
    for skipped in loaded.skipped:
        (log or (lambda line: print(line, file=sys.stderr)))(f"skipped malformed row: {skipped}")
    problems = list(loaded.problems)
    if rewriter == "rules":
        _check_rules_can_rewrite(problems, data_in)

    cache: DiskCache | None = None
    client: ChatClient | None = None
    if rewriter == "openai":
        assert base_url and model  # refused with a ConfigError above, before anything was read
        client = ChatClient(
            base_url,
            model,
            api_key_env=api_key_env,
            concurrency=concurrency,
            temperature=temperature,
            timeout_s=timeout_s,
        )
        if cache_dir is not None:
            cache = DiskCache(Path(cache_dir) / "rephrase.sqlite")
        rephraser: Rephraser = build_rephraser("openai", client=client, cache=cache)
        # enough requests per chunk to keep every connection busy, few enough for a live progress bar
        chunk = max(1, (8 * concurrency) // max(1, n))
    elif rewriter == "rules":
        rephraser = build_rephraser("rules", seed=seed)
        chunk = 256
    else:
        rephraser = build_rephraser(rewriter)
        chunk = 256

    outcomes: list[RephraseOutcome] = []
    try:
        bar = tqdm(total=len(problems), unit="q", desc=f"rephrase ({rewriter})", disable=not progress, file=sys.stderr)
        with bar:
            for part in _chunks(problems, chunk):
                got = rephraser.rephrase_many(part, n)
                if len(got) != len(part):
                    raise RuntimeError(f"rewriter {rewriter!r} returned {len(got)} outcomes for {len(part)} problems")
                outcomes.extend(got)
                bar.update(len(part))
                bar.set_postfix(accepted=sum(o.accepted for o in outcomes), rejected=sum(o.rejected for o in outcomes))
    finally:
        if cache is not None:
            cache.close()

    augmented = [dataclasses.replace(p, variants=tuple(o.variants)) for p, o in zip(problems, outcomes, strict=True)]
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    save_problems(augmented, out_path)

    summary: dict[str, Any] = {
        "data_in": str(data_in),
        "out": str(out_path),
        "rewriter": rewriter,
        "n": n,
        "model": model if rewriter == "openai" else None,
        "skipped_rows": len(loaded.skipped),
        "skipped_examples": [str(e) for e in loaded.skipped[:10]],
        "totals": {**summarise(outcomes), **network_totals(client)},
        "client": client.stats if client is not None else None,
        "wall_s": round(time.monotonic() - t0, 3),
        "per_question": [o.to_dict() for o in outcomes],
    }
    _write_json_atomic(Path(str(out_path) + ".summary.json"), summary)
    return summary
