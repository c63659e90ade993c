"""The API key never leaves its environment variable: a DaGRPO run judged by an LLM and a TA-GRPO run
with an LLM rewriter (both `regroup train` subprocesses against a fake OpenAI-compatible server that
checks the key, and sometimes answers with errors quoting it back) leave the key in no file of their
run folders (logs, metrics.jsonl, config.yaml, checkpoints including trainer_state.pt, caches, tb/),
in nothing they print, and not in the report built from them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_helpers as h
from fake_openai import FakeOpenAI

pytestmark = pytest.mark.reliability

KEY = "sk-test-LEAKCHECK-98765"
KEY_ENV = "REGROUP_SECRET_TEST_KEY"  # must not contain a needle itself
# The whole key, and a recognisable piece of it (a key cut short in an error message still leaks).
NEEDLES = (KEY.encode(), b"LEAKCHECK")


def leaks_in(folder: Path) -> list[str]:
    """Files under `folder` whose bytes contain the key or a recognisable piece of it."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path} ({n!r})" for n in NEEDLES if n in data]
    return found


def test_api_key_in_no_file_output_or_report(tiny_model_dir, tmp_path, figures):
    from regroup.report import build_report

    judge = h.FlakyJudge(h.judge_faults(1.0, echo=KEY), p_fault=0.3, seed=5)
    env = h.child_env({KEY_ENV: KEY})
    common = ("train.steps=2", "train.report_to=[tensorboard]")
    da_dir, ta_dir = tmp_path / "dagrpo", tmp_path / "ta"
    with (
        FakeOpenAI(api_key=KEY, responder=judge) as judge_srv,
        FakeOpenAI(api_key=KEY, responder=h.rewriter_reply) as rw_srv,
    ):
        # Both runs at once (2 cores): a judged DaGRPO run and a TA-GRPO run with the LLM rewriter.
        da_args = h.train_args(
            tiny_model_dir,
            da_dir,
            "dagrpo.yaml",
            *common,
            "mask.scorer.name=judge",
            f"mask.scorer.base_url={judge_srv.base_url}",
            f"mask.scorer.api_key_env={KEY_ENV}",
            "mask.scorer.timeout_s=1.0",
            "mask.scorer.max_retries=1",
        )
        ta_args = h.train_args(
            tiny_model_dir,
            ta_dir,
            "ta_grpo.yaml",
            *common,
            "ta.rephraser=openai",
            f"ta.base_url={rw_srv.base_url}",
            f"ta.api_key_env={KEY_ENV}",
            "grpo.prompts_per_step=2",
        )
        da = h.start(da_args, tmp_path / "out", "dagrpo", env=env)
        ta = h.start(ta_args, tmp_path / "out", "ta", env=env)
        da, ta = h.finish(da, da_args), h.finish(ta, ta_args)
        judged, rewritten = list(judge_srv.requests), list(rw_srv.requests)
    assert da.returncode == 0, da.stderr[-3000:]
    assert ta.returncode == 0, ta.stderr[-3000:]
    # The key was really used (the server checks it), so a leak had every chance to happen.
    assert len(judged) > 0 and all(r.auth_ok for r in judged)
    assert len(rewritten) > 0 and all(r.auth_ok for r in rewritten)
    assert judge.counts["echo_500"] + judge.counts["echo_malformed"] > 0, judge.counts
    assert (da_dir / "cache" / "judge.sqlite").exists() and (ta_dir / "cache" / "rephrase.sqlite").exists()
    assert any((da_dir / "tb").iterdir()) and any((ta_dir / "checkpoints").iterdir())

    report_dir = tmp_path / "report"
    build_report([da_dir, ta_dir], report_dir)
    assert any(report_dir.iterdir())

    files = [p for d in (da_dir, ta_dir, report_dir, tmp_path / "out") for p in d.rglob("*") if p.is_file()]
    assert any(p.name == "trainer_state.pt" for p in files) and any(p.name == "config.yaml" for p in files)
    control = tmp_path / "control"  # the grep itself finds a planted key (a part of it, too)
    control.mkdir()
    (control / "planted.bin").write_bytes(b"\x00\x80" + KEY.encode()[:12] + b"LEAKCHECK\xff")
    assert len(leaks_in(control)) == 1
    leaks = [leak for d in (da_dir, ta_dir, report_dir, tmp_path / "out") for leak in leaks_in(d)]
    assert not leaks, f"the API key leaked into: {leaks}"
    assert KEY_ENV in (da_dir / "config.yaml").read_text()  # the config names the variable, never its value
    figures(
        f"{len(files)} files grepped (2 run folders, report, captured stdout/stderr): key found in none; "
        f"{len(judged)} judge + {len(rewritten)} rewriter requests carried it; judge replies by kind "
        f"{dict(sorted(judge.counts.items()))}"
    )


def test_a_user_reward_error_quoting_the_key_is_printed_without_it(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The reward check before the weights load calls a user reward that raises with the judge's key in its
    message: the one line it prints carries no piece of the key, though no client has read the key yet (and
    this key has no `sk-` shape a pattern would catch)."""
    from regroup.cli import main

    key = "Zq7RkW2mLEAKCHECKPx9LbT4v"
    monkeypatch.setenv(KEY_ENV, key)  # the reward worker inherits the environment
    argv = h.train_args(
        tiny_model_dir,
        tmp_path / "run",
        "dagrpo.yaml",
        "mask.scorer.name=judge",
        "mask.scorer.base_url=http://127.0.0.1:9/v1",  # never reached: the run stops before its first request
        f"mask.scorer.api_key_env={KEY_ENV}",
        "rewards=[_user_rewards:raises_the_key]",
    )
    assert main(argv) == 2
    out = capsys.readouterr()
    printed = out.out + out.err
    assert "raised ValueError: bad credentials" in printed
    assert "LEAKCHECK" not in printed and "Zq7RkW2m" not in printed and "***" in printed
