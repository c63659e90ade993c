"""Code, deadlines and config under hostile use, each case a reproduction run against the real pieces (real
worker processes, real YAML files, the real CLI on the tiny model); each failed before its fix. A misbehaving
vLLM server is in test_round4_server.py."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reliability_helpers as h

from regroup.cli import main
from regroup.errors import ConfigError
from regroup.tasks.base import Problem

pytestmark = pytest.mark.reliability


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if the policy's weights load: the pre-load checks (inside build_parts) still run."""
    import regroup.models.load
    import regroup.train.build

    def refuse(*a, **k):
        raise AssertionError("the weights were loaded: the error came after the pre-load checks")

    monkeypatch.setattr(regroup.models.load, "load_policy", refuse)
    monkeypatch.setattr(regroup.train.build, "load_policy", refuse)


# =====================================================================================================
# Code, deadlines, config: what a run imports, reward workers, resume, hostile YAML
# =====================================================================================================

REWARDS_MODULE = '''
"""User rewards for test_round4.py (written by its fixture, imported by dotted name r4rewards:NAME)."""
import functools, os, subprocess, sys, time
from pathlib import Path


def length(response, problem):
    return float(len(response))


def where_regroup(response, problem):
    import regroup
    Path(problem.meta["out"]).write_text(regroup.__file__)
    return 1.0


def _slow(response, problem, seconds=4.0):
    time.sleep(seconds)  # past a 1 s deadline
    return 1.0


slow_partial = functools.partial(_slow, seconds=4.0)


@functools.lru_cache(maxsize=None)
def slow_cached(response, problem):
    return _slow(response, problem)


class SlowObject:
    def __call__(self, response, problem):
        return _slow(response, problem)


slow_object = SlowObject()


def spawns_then_hangs(response, problem):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    Path(problem.meta["out"]).write_text(str(child.pid))
    while True:
        time.sleep(60)


def allocates(response, problem):
    block = bytearray(int(problem.meta["mb"]) << 20)
    return float(len(block) > 0)


def together(response, problem):
    """1.0 when all `n` calls of the batch ran at the same time (each waits, up to 10 s, for the others)."""
    folder = Path(problem.meta["dir"])
    (folder / f"{os.getpid()}-{response}").write_text("")
    for _ in range(200):
        if len(list(folder.iterdir())) >= problem.meta["n"]:
            return 1.0
        time.sleep(0.05)
    return 0.0


def huge(response, problem):
    return 10**400


def hangs(response, problem):
    while True:
        time.sleep(60)


def hangs_on_x(response, problem):
    if "x" in response:
        hangs(response, problem)
    return 1.0
'''

MARKER_MODULE = """
from pathlib import Path
Path({marker!r}).write_text("imported")
def fn(response, problem):
    return 1.0
"""


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory):
    """A folder (not the current one) holding r4rewards.py and r4marker.py, put on sys.path."""
    folder = tmp_path_factory.mktemp("r4-rewards")
    (folder / "r4rewards.py").write_text(REWARDS_MODULE)
    (folder / "r4marker.py").write_text(MARKER_MODULE.format(marker=str(folder / "MARKER")))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


@pytest.fixture
def hostile_cwd(tmp_path, monkeypatch):
    """The current folder holds a json.py that leaves a marker file when imported (and would break json)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = tmp_path / "JSON_PY_RAN"
    (cwd / "json.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.chdir(cwd)
    return marker


def problem(**meta) -> Problem:
    return Problem(id="q", question="?", answer="1", meta=meta)


# -- workers never import from the current folder -----------------------------------------------------


def test_a_json_py_in_the_current_folder_never_runs_in_a_user_reward_worker(reward_dir, hostile_cwd, tmp_path):
    from regroup.rewards.deadline import DeadlineReward

    out = tmp_path / "regroup_file"
    fn = DeadlineReward("r4rewards:where_regroup", timeout_s=30.0)
    try:
        assert fn("r", problem(out=str(out))) == 1.0
    finally:
        fn.close()
    assert not hostile_cwd.exists(), "the worker imported ./json.py"
    import regroup

    assert out.read_text() == regroup.__file__  # the worker runs the parent's regroup (a worktree's, here)


def test_a_json_py_in_the_current_folder_never_runs_in_a_math_verify_worker(hostile_cwd):
    pytest.importorskip("math_verify")
    from regroup.rewards.math_verify import MathAnswerChecker

    with MathAnswerChecker(timeout_s=10.0) as check:
        assert check(r"so \boxed{1}", problem()) == 1.0
    assert not hostile_cwd.exists(), "the math-verify worker imported ./json.py"


def test_a_reward_module_in_the_current_folder_still_loads_from_its_file(tmp_path, monkeypatch, hostile_cwd):
    """`python -m regroup` puts the current folder on the parent's path; the worker loads the reward the
    parent imported from that very file, and still never ./json.py."""
    from regroup.rewards.deadline import DeadlineReward

    cwd = Path.cwd()
    (cwd / "r4here.py").write_text("def fn(response, problem):\n    return 7.0\n")
    monkeypatch.syspath_prepend(str(cwd))
    fn = DeadlineReward("r4here:fn", timeout_s=30.0)
    try:
        assert fn("r", problem()) == 7.0
    finally:
        fn.close()
    assert not hostile_cwd.exists()


# -- one deadline for every callable -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["r4rewards:slow_partial", "r4rewards:slow_cached", "r4rewards:slow_object"])
def test_every_kind_of_callable_gets_the_deadline(reward_dir, name):
    from regroup.rewards import pop_counts
    from regroup.rewards.build import build_reward_fn

    fn = build_reward_fn([name], None, timeout_s=1.0)
    try:
        assert fn("r", problem()) is None  # killed at 1 s, not waited for 4 s in-process
        assert pop_counts(fn)["timeout"] == 1
    finally:
        fn.close()


# -- a timeout kills the reward's own processes --------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def test_a_timed_out_reward_leaves_no_orphans(reward_dir, tmp_path, figures):
    from regroup.rewards.deadline import DeadlineReward

    pids = []
    fn = DeadlineReward("r4rewards:spawns_then_hangs", timeout_s=1.0)
    try:
        for i in range(3):
            out = tmp_path / f"child-{i}"
            assert fn("r", problem(out=str(out))) is None
            pids.append(int(out.read_text()))
    finally:
        fn.close()
        left = [pid for pid in pids if _alive(pid)]
        for pid in left:  # a failing run must not leave them behind either
            os.kill(pid, 9)
    assert left == [], f"{len(left)} of {len(pids)} processes a timed-out reward started are still running"
    figures(f"orphans after 3 timed-out calls that each started a 300 s child: {len(left)} of {len(pids)}")


# -- also seen: a memory limit per reward worker -------------------------------------------------------


def test_a_reward_worker_has_a_memory_limit(reward_dir):
    from regroup.rewards.deadline import DeadlineReward, UserRewardError

    fn = DeadlineReward("r4rewards:allocates", timeout_s=30.0, memory_mb=512)
    try:
        assert fn("r", problem(mb=16)) == 1.0
        with pytest.raises(UserRewardError, match="raised MemoryError"):
            fn("r", problem(mb=2048))
    finally:
        fn.close()


def test_the_memory_limit_is_a_config_key_with_a_default():
    from regroup.train.run_config import load_config

    assert load_config("grpo", []).rewards.worker_memory_mb == 4096
    assert load_config("grpo", ["rewards.worker_memory_mb=0"]).rewards.worker_memory_mb == 0
    with pytest.raises(ConfigError, match="rewards.worker_memory_mb"):
        load_config("grpo", ["rewards.worker_memory_mb=-1"])


# -- calls run concurrently, up to rewards.workers -----------------------------------------------------


def test_reward_calls_run_concurrently_up_to_the_configured_width(reward_dir, tmp_path):
    from regroup.rewards import score_many
    from regroup.rewards.build import build_reward_fn

    fn = build_reward_fn(["r4rewards:together"], None, workers=4, timeout_s=30.0)
    try:
        p = problem(dir=str(tmp_path), n=4)
        assert score_many(fn, ["a", "b", "c", "d"], [p] * 4) == [1.0] * 4
    finally:
        fn.close()
    assert len({name.name.split("-")[0] for name in tmp_path.iterdir()}) == 4  # four worker processes


# -- 10**400 is one line -------------------------------------------------------------------------------


def test_a_reward_returning_10_to_the_400_is_counted_out_of_range_not_an_overflow(reward_dir):
    from regroup.rewards.build import build_reward_fn
    from regroup.stages.rewarding import checked_rewards

    for timeout_s in (30.0, 0.0):  # in a worker, and in-process
        fn = build_reward_fn(["r4rewards:huge"], None, timeout_s=timeout_s)
        try:
            assert checked_rewards([fn("r", problem())], fn)[1] == 1
        finally:
            getattr(fn, "close", lambda: None)()


def test_a_reward_returning_10_to_the_400_is_one_line_before_weights_load(
    reward_dir, tiny_model_dir, tmp_path, capsys, no_weights
):
    args = h.train_args(tiny_model_dir, tmp_path / "run", "grpo.yaml", "rewards=[r4rewards:huge]")
    assert main(args) == 2
    line = h.one_line(capsys)
    assert "beyond float32" in line and "OverflowError" not in line


# -- timeouts are announced ----------------------------------------------------------------------------


def test_sustained_timeouts_are_a_metric_and_one_warning_naming_the_deadline(reward_dir, caplog):
    from regroup.rewards.deadline import DeadlineReward
    from regroup.stages.rewarding import pop_reward_counts

    fn = DeadlineReward("r4rewards:hangs_on_x", timeout_s=0.5)
    shares = []
    try:
        with caplog.at_level("WARNING", logger="regroup.rewards.deadline"):
            for _ in range(4):  # a quarter of each batch times out
                fn.check_many(["a", "b", "c", "x"], [problem()] * 4)
                shares.append(pop_reward_counts(fn)["reward/timeout_frac"])
    finally:
        fn.close()
    assert shares == [0.25] * 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once per streak, at the third batch in a row
    assert "rewards.timeout_s=0.5" in warnings[0] and "1 of 4 calls (25%)" in warnings[0]


def test_the_unscored_warning_blames_the_timeout_not_none_or_nan():
    from regroup.diagnostics.signals import SignalWatch

    watch = SignalWatch(reward_name="rewards=r4rewards:hangs")
    lines = []
    for step in (1, 2, 3):
        lines += watch.observe(step, {"reward/unscored_frac": 1.0, "reward/timeout_frac": 1.0})
    assert len(lines) == 1
    assert "timed out" in lines[0] and "rewards.timeout_s" in lines[0] and "None or NaN" not in lines[0]


def test_the_pre_load_check_fails_when_every_call_times_out(reward_dir, tiny_model_dir, tmp_path, capsys, no_weights):
    args = h.train_args(
        tiny_model_dir, tmp_path / "run", "grpo.yaml", "rewards=[r4rewards:hangs]", "rewards.timeout_s=0.5"
    )
    assert main(args) == 2
    line = h.one_line(capsys)
    assert "timed out at rewards.timeout_s=0.5" in line


# -- what a saved config sends where, and what code it imports -----------------------------------------


def test_a_key_sent_to_a_host_is_named_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch, no_weights):
    from regroup.train.build import build_trainer
    from regroup.train.run_config import load_config

    monkeypatch.setenv("R4_SOME_TOKEN", "the-secret-value")
    cfg = load_config(
        h.CONFIGS / "dagrpo.yaml",
        h.small_overrides(tiny_model_dir, tmp_path / "run")
        + [
            "mask.scorer.name=judge",
            "mask.scorer.base_url=http://judge.example.org:8443/v1",
            "mask.scorer.api_key_env=R4_SOME_TOKEN",
        ],
    )
    said = []
    with pytest.raises(AssertionError, match="weights were loaded"):
        build_trainer(cfg, tmp_path / "run", log=said.append)
    named = [line for line in said if "R4_SOME_TOKEN" in line]
    assert named == [
        "the judge sends the value of $R4_SOME_TOKEN as its key to http://judge.example.org:8443 "
        "(mask.scorer.api_key_env, mask.scorer.base_url)"
    ]
    assert not any("the-secret-value" in line for line in said)


def test_the_vllm_server_key_is_named_too():
    from regroup.train.preflight import announce_keys
    from regroup.train.run_config import load_config

    cfg = load_config(
        "grpo",
        [
            "rollout.backend=vllm_server",
            "rollout.vllm_server_url=http://10.0.0.9:8000",
            "rollout.vllm_server_api_key_env=VK",
        ],
    )
    said = []
    announce_keys(cfg, said.append)
    assert said == [
        "the vLLM server client sends the value of $VK as its key to http://10.0.0.9:8000 "
        "(rollout.vllm_server_api_key_env, rollout.vllm_server_url)"
    ]


def _plant_code(run: Path, spec: str) -> None:
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["rewards"] = {**saved["rewards"], "functions": [spec]}
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))


def test_resume_names_the_code_a_folder_imports_before_importing_it(reward_dir, run_copy, capsys, monkeypatch):
    import regroup.cli as cli

    marker = reward_dir / "MARKER"
    marker.unlink(missing_ok=True)
    sys.modules.pop("r4marker", None)
    _plant_code(run_copy, "r4marker:fn")
    said = []
    monkeypatch.setattr(cli, "_log", lambda line: said.append((line, marker.exists())))
    assert main(["train", "--resume", str(run_copy)]) == 2  # the config no longer matches its checkpoint
    code_lines = [(line, seen) for line, seen in said if "names code" in line]
    assert code_lines == [
        (f"{run_copy / 'config.yaml'} names code that this run imports and runs: rewards.functions=r4marker:fn", False)
    ]


def test_resume_of_a_folder_another_user_wrote_needs_trust_config_code(reward_dir, run_copy, capsys, monkeypatch):
    marker = reward_dir / "MARKER"
    marker.unlink(missing_ok=True)
    sys.modules.pop("r4marker", None)
    _plant_code(run_copy, "r4marker:fn")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(run_copy / "config.yaml").st_uid + 1)
    assert main(["train", "--resume", str(run_copy)]) == 2
    line = h.one_line(capsys)
    assert "belongs to another user" in line and "r4marker:fn" in line and "--trust-config-code" in line
    assert not marker.exists(), "the code was imported before the refusal"
    assert main(["train", "--resume", str(run_copy), "--trust-config-code"]) == 2  # trusted: imported, then the
    assert marker.exists()  # edited config is refused against its checkpoint as before


def test_transformers_loads_with_trust_remote_code_false(tiny_model_dir, monkeypatch):
    import transformers

    from regroup.models import load

    seen = []
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, **kwargs):
            seen.append(kwargs.get("trust_remote_code", "unset"))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    load.load_for_inference(tiny_model_dir)
    assert seen and all(value is False for value in seen), seen


# -- eval reads only what it needs of a run's config ---------------------------------------------------


@pytest.fixture
def foreign_checkpoint(tiny_model_dir, reward_dir, tmp_path):
    """RUN/checkpoints/step-000001 (the tiny model) whose RUN/config.yaml names code, a data file and a
    base model that are not here."""
    import shutil

    run = tmp_path / "foreign"
    step = run / "checkpoints" / "step-000001"
    shutil.copytree(tiny_model_dir, step)
    config = {
        "recipe": "grpo",
        "rewards": ["antigravity:geohash", "r4marker:fn"],
        "data": {"task": "r4marker:fn", "train_file": str(tmp_path / "nowhere.jsonl"), "chat_template": "off"},
        "model": {"path": str(tmp_path / "no-base-model")},
        "mask": {"enabled": True, "scorer": {"name": "r4marker:fn"}},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (reward_dir / "MARKER").unlink(missing_ok=True)
    for name in ("antigravity", "r4marker"):
        sys.modules.pop(name, None)
    return step


def test_eval_of_a_checkpoint_imports_nothing_its_run_names(foreign_checkpoint, reward_dir, tmp_path, capsys):
    data = tmp_path / "bench.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    argv = ["eval", "--model", str(foreign_checkpoint), "--data", str(data), "--out", str(tmp_path / "eval")]
    assert main([*argv, "--n", "1", "--k", "1", "--max-new-tokens", "4", "--no-greedy", "--checker", "task"]) == 0
    assert "antigravity" not in sys.modules and not (reward_dir / "MARKER").exists()


def test_eval_of_a_checkpoint_with_a_bad_prompting_value_is_one_line(foreign_checkpoint, tmp_path, capsys):
    config = yaml.safe_load((foreign_checkpoint.parents[1] / "config.yaml").read_text())
    config["data"]["chat_template"] = 7
    (foreign_checkpoint.parents[1] / "config.yaml").write_text(yaml.safe_dump(config))
    data = tmp_path / "bench.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    assert main(["eval", "--model", str(foreign_checkpoint), "--data", str(data), "--out", str(tmp_path / "e")]) == 2
    line = h.one_line(capsys)
    assert "data.chat_template" in line and "antigravity" not in sys.modules


# -- a longer resume keeps the lr's course -------------------------------------------------------------


def _lr_after_resume(total_before: int, total_after: int, resume_at: int, warmup: int = 1) -> list[float]:
    import torch

    from regroup.train.schedule import lr_lambda

    def make(total):
        param = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([param], lr=1.0)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(warmup, total, "cosine", 0.1))

    opt, sched = make(total_before)
    lrs = [sched.get_last_lr()[0]]
    for _ in range(resume_at):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    state = sched.state_dict()
    opt, sched = make(total_after)
    sched.load_state_dict(state)
    for _ in range(resume_at, total_after):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    return lrs


def test_a_resume_with_more_steps_goes_on_from_the_lr_it_had():
    lrs = _lr_after_resume(8, 12, resume_at=4)
    planned = _lr_after_resume(8, 8, resume_at=4)
    assert lrs[:5] == planned[:5]  # the course up to the resume is the one the run had
    assert all(b <= a for a, b in zip(lrs[4:], lrs[5:]))  # no jump up: it decays from there
    assert lrs[-1] == pytest.approx(0.1) and lrs[5] > planned[5]  # to the floor at the new last step, more slowly


def test_a_resume_of_a_resume_keeps_both_courses():
    import torch

    from regroup.train.schedule import lr_lambda

    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    first = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(1, 12, "cosine", 0.1))
    first.load_state_dict({**first.state_dict(), "lr_lambdas": [{"course": [[0, 8]]}], "last_epoch": 4})
    opt.step()
    first.step()
    state = first.state_dict()
    assert state["lr_lambdas"] == [{"course": [[0, 8], [4, 12]]}]
    second = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(1, 12, "cosine", 0.1))
    second.load_state_dict(state)
    opt.step()
    second.step()
    assert second.get_last_lr()[0] < first.get_last_lr()[0]


def test_resume_with_more_steps_does_not_raise_the_lr_and_says_so(run_copy, capsys, figures):
    """The finished 2-step run (warm-up 1, cosine to 0.1) resumed to 4 steps: the lr stays at the floor it
    had reached (before: it jumped back up to the middle of a new cosine)."""
    before = [json.loads(x)["lr"] for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert main(["train", "--resume", str(run_copy), "train.steps=4"]) == 0
    lrs = [json.loads(x)["lr"] for x in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert lrs[:2] == before and lrs[2] <= lrs[1] and lrs[3] <= lrs[2]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train.steps 2 -> 4")]
    assert len(notes) == 1 and "not re-spread" in notes[0]
    figures(f"lr by step, 2-step run resumed to 4: {[f'{x:.2e}' for x in lrs]}")


# -- nesting, huge numbers, duplicate keys ---------------------------------------------------------------


@pytest.mark.parametrize(
    "override, words",
    [
        ("optim.lr=" + "[" * 30000, "nested more than 32 levels"),
        ("optim.lr=" + "9" * 5000, "out of range"),
        ("optim.lr=" + "9" * 4000, "optim.lr: a 4000-digit number is out of range"),
        ("train.steps=" + "9" * 4000, "train.steps: a 4000-digit integer is out of range"),
        ("optim={lr: 1, lr: 0.5}", "key 'lr' appears twice"),
    ],
)
def test_hostile_overrides_are_one_line(override, words, tmp_path, capsys, no_compute):
    assert main(["train", "--config", str(h.CONFIGS / "grpo.yaml"), f"run_dir={tmp_path / 'r'}", override]) == 2
    line = h.one_line(capsys)
    assert words in line and len(line) < 400


@pytest.mark.parametrize(
    "text, words",
    [
        ("recipe: grpo\noptim: " + "[" * 30000 + "\n", "nested more than 32 levels"),
        ("recipe: grpo\nseed: " + "9" * 5000 + "\n", "out of range"),
        (
            "recipe: grpo\noptim:\n  lr: 1.0e-4\ntrain:\n  steps: 2\noptim:\n  lr: 0.5\n",
            "key 'optim' appears twice (lines 2 and 6)",
        ),
    ],
)
def test_hostile_config_files_are_one_line(text, words, tmp_path, capsys, no_compute):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    assert main(["train", "--config", str(recipe), f"run_dir={tmp_path / 'r'}"]) == 2
    line = h.one_line(capsys)
    assert words in line and str(recipe) in line and len(line) < 400


def test_a_duplicate_key_in_a_saved_config_is_one_line(run_copy, capsys, no_compute):
    saved = run_copy / "config.yaml"
    saved.write_text(saved.read_text() + "optim:\n  lr: 0.5\n")
    assert main(["train", "--resume", str(run_copy)]) == 2
    line = h.one_line(capsys)
    assert "key 'optim' appears twice" in line and str(saved) in line


def test_a_deep_run_config_json_is_a_checkpoint_error(tmp_path):
    from regroup.runtime.checkpoint import CheckpointError, load_run_config

    (tmp_path / "run_config.json").write_text("[" * 30000)
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_run_config(tmp_path)


# -- resume messages -----------------------------------------------------------------------------------


def test_the_judge_url_and_key_variable_may_change_on_resume():
    from regroup.config.schema import check_resume_overrides

    check_resume_overrides(["mask.scorer.base_url=http://127.0.0.1:9/v1", "mask.scorer.api_key_env=OTHER"])
    with pytest.raises(ConfigError) as caught:
        check_resume_overrides(["mask.delta=0.5"])
    assert "optimizer" not in str(caught.value).split(";")[0] or "would not take effect" in str(caught.value)


def test_the_judge_url_change_on_resume_passes_the_checkpoint_check(tmp_path):
    from regroup.runtime.checkpoint import check_resume_config
    from regroup.train.run_config import load_config

    saved = load_config("dagrpo", []).to_dict()
    moved = load_config("dagrpo", ["mask.scorer.base_url=http://127.0.0.1:9/v1", "mask.scorer.api_key_env=K"])
    check_resume_config(tmp_path / "step-000002", saved, moved.to_dict(), "config.yaml")


def _manifest(path: Path, fmt) -> Path:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"step": 1, "format": fmt, "files": {}}))
    return path


def test_a_checkpoint_of_a_newer_format_says_newer(tmp_path):
    from regroup.runtime.checkpoint import FORMAT, CheckpointRefused, read_manifest

    with pytest.raises(CheckpointRefused) as newer:
        read_manifest(_manifest(tmp_path / "new", FORMAT + 1))
    assert "newer regroup" in str(newer.value) and "older" not in str(newer.value)
    with pytest.raises(CheckpointRefused) as older:
        read_manifest(_manifest(tmp_path / "old", None))
    assert "older regroup" in str(older.value)
    for message in (str(newer.value), str(older.value)):
        assert "model.name" not in message and "model.path=PATH" in message


def test_no_message_names_model_name():
    src = Path(__file__).resolve().parents[2] / "src" / "regroup"
    found = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if "model.name " in p.read_text() or "model.name=" in p.read_text()
    ]
    assert found == []


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_killed_parent_leaves_no_reward_worker_behind(reward_dir, tmp_path):
    """SIGKILL of the training process while a reward hangs: the worker and what it started go too."""
    import signal
    import subprocess

    out = tmp_path / "grandchild"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); from regroup.rewards.deadline import DeadlineReward; "
            "from regroup.tasks.base import Problem; "
            "fn = DeadlineReward('r4rewards:spawns_then_hangs', timeout_s=300); "
            "fn('r', Problem('q', '?', '1', meta={'out': sys.argv[2]}))",
            str(reward_dir),
            str(out),
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    try:
        for _ in range(1200):  # the reward has started its child (60 s at most, on a loaded machine)
            if out.exists() and out.read_text():
                break
            time.sleep(0.05)
        grandchild = int(out.read_text())
        workers = [
            int(p)
            for p in subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout.split()
        ]
        assert workers and _alive(grandchild)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        for _ in range(600):  # within 60 s (the worker checks once a second)
            if not any(_alive(pid) for pid in (*workers, grandchild)):
                break
            time.sleep(0.1)
        left = [pid for pid in (*workers, grandchild) if _alive(pid)]
    finally:
        if parent.poll() is None:
            parent.kill()
    for pid in left:
        os.kill(pid, 9)
    assert left == []
