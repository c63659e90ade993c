"""No piece of the API key (any 4 consecutive characters) in any file a judge / rewriter run writes, nor
in anything it prints, when the server quotes the key: in an error body cut at the 300-character limit,
in a malformed body cut at 80 bytes, in a 200 reply, and as the
last 4 characters some APIs echo (`sk-****` + suffix). A key pasted where its variable's NAME belongs
is refused without being printed."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import Answer, FakeOpenAI, Malformed, Status, last_user_message

from regroup.net import ChatClient, DiskCache
from regroup.rephrase import OpenAIRephraser
from regroup.scorers import JudgeScorer, ScoreItem

pytestmark = pytest.mark.reliability

ENV = "REGROUP_TEST_FRAGMENT_KEY"
# Every 4 characters of it hold a capital or a digit next to lowercase: no 4-gram of it occurs in a
# sha256 hex cache key, a prompt, a path or SQLite's own bytes by chance (the control below checks).
KEY = "sk-QzXv9WkPq7JmRt2LbYn8HcFd"
PIECES = sorted({KEY[i : i + 4] for i in range(len(KEY) - 3)})
OPENING = '{"error": {"message": "'  # what precedes the message in the fake's error body


def pieces_in(data: bytes) -> list[str]:
    return [p for p in PIECES if p.encode() in data]


def leaks(folder: Path) -> dict[str, list[str]]:
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and (hit := pieces_in(path.read_bytes())):
            found[str(path.relative_to(folder))] = hit
    return found


CASES = {
    # the key starts 10 characters before the 300-character cut of an error message
    "error_at_300": lambda: Status(500, message="e" * (300 - 10 - len(OPENING)) + KEY + " is not valid"),
    # a malformed body whose 80-byte snippet ends 6 characters into the key
    "malformed_at_80": lambda: Malformed(b'{"oops": "' + b"m" * 64 + KEY.encode() + b'"'),
    # a 200 reply quoting the key (judge: before its score line; rewriter: inside the rewrite)
    "reply_quotes_key": None,
    # an API that masks the key but shows its last four characters
    "suffix_echo": lambda: Status(401, message=f"Incorrect API key provided: sk-Qz**************{KEY[-4:]}"),
}


def responder_for(case: str):
    def respond(body):
        user = last_user_message(body)
        if CASES[case] is not None:
            return CASES[case]()
        if "<problem>" in user:
            q = user.split("<problem>\n", 1)[1].rsplit("\n</problem>", 1)[0]
            return Answer(f"<rewrite>Restated with key {KEY}: {q}</rewrite>")
        return Answer(f"Your key is {KEY}, fine.\nSCORE: 7")

    return respond


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_four_characters_of_the_key_in_any_file_or_output(case, tmp_path, monkeypatch, capfd):
    from regroup.data.load import save_problems
    from regroup.rephrase import run_rephrase
    from regroup.tasks.arithmetic import generate

    monkeypatch.setenv(ENV, KEY)
    run = tmp_path / "run"
    run.mkdir()
    handler = logging.FileHandler(run / "debug.log")
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with FakeOpenAI(api_key=KEY, responder=responder_for(case)) as srv:
            client = ChatClient(srv.base_url, "m", api_key_env=ENV, timeout_s=10, max_retries=1, backoff_s=0.01)
            judge = JudgeScorer(client, DiskCache(run / "cache" / "judge.sqlite"))
            scores = judge.score_batch([ScoreItem("q", f"r{i}", "ref") for i in range(3)])
            rw = OpenAIRephraser(client, DiskCache(run / "cache" / "rw.sqlite"))
            outcomes = rw.rephrase_many([SimpleNamespace(id="a", question="Add 2 and 3.")], 2)
            save_problems(generate(2, seed=0), tmp_path / "in.jsonl")
            summary = run_rephrase(
                str(tmp_path / "in.jsonl"),
                str(run / "aug.jsonl"),
                2,
                "openai",
                base_url=srv.base_url,
                model="m",
                api_key_env=ENV,
                cache_dir=str(run / "cache2"),
                progress=False,
            )
            assert all(r.auth_ok for r in srv.requests)  # the key really went out
            print(scores, outcomes, summary, judge.stats, client.stats)
            logging.getLogger("regroup.test").warning("outcomes %s", outcomes)
        judge.cache.close()
        rw.cache.close()
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        handler.close()

    # the run did meet the hostile replies and stored what came of them
    if case == "reply_quotes_key":
        assert scores == [7.0] * 3 and "***" in (run / "aug.jsonl").read_text()
    else:
        assert scores == [None] * 3 and summary["totals"]["request_failures"] > 0
        failures = DiskCache(run / "cache" / "judge.sqlite").failures()
        assert len(failures) == 3 and all("***" in error for error, _ in failures.values())
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {"debug.log", "judge.sqlite", "rw.sqlite", "rephrase.sqlite", "aug.jsonl.summary.json"} <= {
        p.name for p in files
    }

    out, err = capfd.readouterr()
    assert not pieces_in(out.encode()) and not pieces_in(err.encode())
    assert not leaks(run), leaks(run)

    control = tmp_path / "control"  # the scan itself finds a planted piece
    control.mkdir()
    (control / "x.sqlite").write_bytes(b"\x00" * 100 + KEY[9:13].encode() + b"\x00")
    assert list(leaks(control)) == ["x.sqlite"]


def test_a_key_in_api_key_env_is_refused_without_being_printed(tmp_path, capfd):
    from regroup.cli import main
    from regroup.errors import ConfigError
    from regroup.net.redact import check_key_env_name
    from regroup.train.run_config import load_config

    for field in ("mask.scorer.api_key_env", "ta.api_key_env"):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as info:
            load_config(None, [f"{field}={KEY}"])
        assert not pieces_in(str(info.value).encode())
    with pytest.raises(ValueError, match="api_key_env") as info:
        ChatClient("http://127.0.0.1:9/v1", "m", api_key_env=KEY)
    assert not pieces_in(str(info.value).encode())
    # other key shapes: Bearer, not a variable name, long mixed case with digits; real names pass
    for bad in ("Bearer abc", "my key", "AIzaSyD8xKq2LmP0vWn7RtY", "sk_live_abc"):
        with pytest.raises(ConfigError):
            check_key_env_name(bad, "f")
    for good in ("OPENAI_API_KEY", "MY_JUDGE_KEY_2", "openai_key", None):
        check_key_env_name(good, "f")

    (tmp_path / "in.jsonl").write_text('{"id": "a", "question": "Add 2 and 3.", "answer": "5"}\n')
    code = main(
        [
            "rephrase",
            "--data",
            str(tmp_path / "in.jsonl"),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--rewriter",
            "openai",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--api-key-env",
            KEY,
        ]
    )
    assert code == 2
    code = main(["train", f"mask.scorer.api_key_env={KEY}", f"run_dir={tmp_path / 'run'}"])
    assert code == 2
    out, err = capfd.readouterr()
    assert "looks like an API key" in err and err.count("\n") == 2  # one line each
    assert not pieces_in(out.encode() + err.encode())
    assert not (tmp_path / "run").exists() and not (tmp_path / "o.jsonl").exists()
