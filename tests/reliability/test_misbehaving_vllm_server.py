"""A vLLM server that feeds garbage, through `regroup train
rollout.backend=vllm_server` (the CLI in this process, the scripted server of tests/fake_vllm.py on loopback).

Each fault is scripted and replayed. Unchecked, each gave a traceback (`IndexError`, `OverflowError`,
`AttributeError`) or a run that trained on it silently (4,000 tokens for max_new_tokens=8, NaN or missing
log-probs); checked, exit 2 and one `error: vLLM server: ...` line at the first rollout, before any step is
logged or saved. The same server answering well trains (the control). RELIABILITY.md, "A vLLM server
that answers wrongly", cites these tests.
"""

from __future__ import annotations

import pytest
import reliability_helpers as h
from fake_vllm import FakeVLLM, ok_choices

from regroup.cli import main

pytestmark = pytest.mark.reliability

MAX_NEW_TOKENS = 8
VOCAB = 101  # the tiny model's embedding rows


def _choice0(**changes):
    def reply(body):
        choices = sorted(ok_choices(body), key=lambda c: c["index"])
        choices[0].update(changes)
        return {"choices": choices}

    return reply


def _lps(values):
    return {"token_logprobs": values}


# fault -> (reply function, what the one line says)
FAULTS = {
    "id past the vocabulary": (_choice0(token_ids=[10, VOCAB + 900] + [12] * 6), "token id 1001, outside"),
    "negative id": (_choice0(token_ids=[10, -3] + [12] * 6), "token id -3, outside"),
    "id beyond int64": (_choice0(token_ids=[2**64] + [12] * 7), "token id 18446744073709551616, outside"),
    "4000 tokens for max_new_tokens=8": (
        _choice0(token_ids=[11] * 4000, logprobs=_lps([-0.5] * 4000)),
        "has 4000 tokens, more than the max_tokens=8",
    ),
    "a JSON list": (lambda body: [ok_choices(body)], "answered a JSON list, not an object with choices"),
    "choices that are strings": (lambda body: {"choices": ["10 11"] * body["n"]}, "choice 0 is a JSON string"),
    "NaN log-probs": (_choice0(logprobs=_lps([float("nan")] * 8)), "log-prob nan: not a finite number <= 0"),
    "too-short log-probs": (_choice0(logprobs=_lps([-0.1] * 3)), "has 3 log-probs for its 8 tokens"),
    "missing log-probs": (_choice0(logprobs=None), "no logprobs.token_logprobs list"),
    "log-probs above 0": (_choice0(logprobs=_lps([0.7] * 8)), "log-prob 0.7: not a finite"),
}


def _train(model_dir, run, url) -> int:
    return main(
        h.train_args(
            model_dir,
            run,
            "grpo.yaml",
            "rollout.backend=vllm_server",
            f"rollout.vllm_server_url={url}",
            f"rollout.max_new_tokens={MAX_NEW_TOKENS}",
            "train.steps=2",
        )
    )


def _steps_logged(run) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _checkpoints(run) -> list:
    return sorted(p.name for p in (run / "checkpoints").glob("step-*")) if (run / "checkpoints").exists() else []


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_server_feeding_garbage_stops_the_run_in_one_line(tiny_model_dir, tmp_path, capsys, figures, fault):
    reply, says = FAULTS[fault]
    run = tmp_path / "run"
    with FakeVLLM() as srv:
        srv.completion_reply = reply
        code = _train(tiny_model_dir, run, srv.url)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: vLLM server: ") and says in lines[0], err[-2000:]
    assert "Traceback" not in err
    assert _steps_logged(run) == 0 and _checkpoints(run) == []  # nothing trained on it
    figures(f"{fault}: exit {code}, {len(srv.completions())} completion requests, `{lines[0][:150]}`")


def test_a_server_redirecting_elsewhere_gets_no_key_there(tiny_model_dir, tmp_path, capsys, figures, monkeypatch):
    monkeypatch.setenv("REGROUP_TEST_SERVER_KEY", "sk-redirect-test-0123456789")
    run = tmp_path / "run"
    with FakeVLLM(api_key="sk-redirect-test-0123456789") as srv, FakeVLLM() as elsewhere:
        srv.redirect_to = elsewhere.url
        code = main(
            h.train_args(
                tiny_model_dir,
                run,
                "grpo.yaml",
                "rollout.backend=vllm_server",
                f"rollout.vllm_server_url={srv.url}",
                "rollout.vllm_server_api_key_env=REGROUP_TEST_SERVER_KEY",
            )
        )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1, err[-2000:]
    assert f"HTTP 302 redirect to {elsewhere.url}/v1/models: redirects are not followed" in lines[0]
    assert elsewhere.requests == [] and "sk-redirect-test" not in err
    figures(f"302 to another address: exit {code}, {len(elsewhere.requests)} requests reached it, `{lines[0][:150]}`")


def test_the_same_server_answering_well_trains(tiny_model_dir, tmp_path, capsys, figures):
    run = tmp_path / "run"
    with FakeVLLM() as srv:
        code = _train(tiny_model_dir, run, srv.url)
    assert code == 0, capsys.readouterr().err[-2000:]
    assert _steps_logged(run) == 2 and _checkpoints(run)
    figures(f"well-behaved: exit 0, {_steps_logged(run)} steps, {len(srv.completions())} completion requests")
