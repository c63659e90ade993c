"""The code a config names is imported only where the user asked for it: a resume lists it before importing it and
refuses a folder another user wrote unless `--trust-config-code`; `eval` of a checkpoint imports nothing its run
names; transformers never runs a model's own code. Each case uses a module that leaves a marker file on import."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import reliability_helpers as h
import yaml

from regroup.cli import main

pytestmark = pytest.mark.reliability

MARKER_MODULE = """
from pathlib import Path
Path({marker!r}).write_text("imported")
def fn(response, problem):
    return 1.0
"""


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory):
    """A folder (not the current one) holding import_marker.py, put on sys.path: importing it writes
    FOLDER/MARKER."""
    folder = tmp_path_factory.mktemp("import-marker")
    (folder / "import_marker.py").write_text(MARKER_MODULE.format(marker=str(folder / "MARKER")))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def _plant_code(run: Path, spec: str) -> None:
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["rewards"] = {**saved["rewards"], "functions": [spec]}
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))


def test_resume_names_the_code_a_folder_imports_before_importing_it(marker_dir, run_copy, capsys, monkeypatch):
    import regroup.cli as cli

    marker = marker_dir / "MARKER"
    marker.unlink(missing_ok=True)
    sys.modules.pop("import_marker", None)
    _plant_code(run_copy, "import_marker:fn")
    said = []
    monkeypatch.setattr(cli, "_log", lambda line: said.append((line, marker.exists())))
    assert main(["train", "--resume", str(run_copy)]) == 2  # the config no longer matches its checkpoint
    code_lines = [(line, seen) for line, seen in said if "names code" in line]
    assert code_lines == [
        (
            f"{run_copy / 'config.yaml'} names code that this run imports and runs: rewards.functions=import_marker:fn",
            False,
        )
    ]


def test_resume_of_a_folder_another_user_wrote_needs_trust_config_code(marker_dir, run_copy, capsys, monkeypatch):
    marker = marker_dir / "MARKER"
    marker.unlink(missing_ok=True)
    sys.modules.pop("import_marker", None)
    _plant_code(run_copy, "import_marker:fn")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(run_copy / "config.yaml").st_uid + 1)
    assert main(["train", "--resume", str(run_copy)]) == 2
    line = h.one_line(capsys)
    assert "belongs to another user" in line and "import_marker:fn" in line and "--trust-config-code" in line
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
def foreign_checkpoint(tiny_model_dir, marker_dir, tmp_path):
    """RUN/checkpoints/step-000001 (the tiny model) whose RUN/config.yaml names code, a data file and a
    base model that are not here."""
    import shutil

    run = tmp_path / "foreign"
    step = run / "checkpoints" / "step-000001"
    shutil.copytree(tiny_model_dir, step)
    config = {
        "recipe": "grpo",
        "rewards": ["antigravity:geohash", "import_marker:fn"],
        "data": {"task": "import_marker:fn", "train_file": str(tmp_path / "nowhere.jsonl"), "chat_template": "off"},
        "model": {"path": str(tmp_path / "no-base-model")},
        "mask": {"enabled": True, "scorer": {"name": "import_marker:fn"}},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (marker_dir / "MARKER").unlink(missing_ok=True)
    for name in ("antigravity", "import_marker"):
        sys.modules.pop(name, None)
    return step


def test_eval_of_a_checkpoint_imports_nothing_its_run_names(foreign_checkpoint, marker_dir, tmp_path, capsys):
    data = tmp_path / "bench.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    argv = ["eval", "--model", str(foreign_checkpoint), "--data", str(data), "--out", str(tmp_path / "eval")]
    assert main([*argv, "--n", "1", "--k", "1", "--max-new-tokens", "4", "--no-greedy", "--checker", "task"]) == 0
    assert "antigravity" not in sys.modules and not (marker_dir / "MARKER").exists()


def test_eval_of_a_checkpoint_with_a_bad_prompting_value_is_one_line(foreign_checkpoint, tmp_path, capsys):
    config = yaml.safe_load((foreign_checkpoint.parents[1] / "config.yaml").read_text())
    config["data"]["chat_template"] = 7
    (foreign_checkpoint.parents[1] / "config.yaml").write_text(yaml.safe_dump(config))
    data = tmp_path / "bench.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    assert main(["eval", "--model", str(foreign_checkpoint), "--data", str(data), "--out", str(tmp_path / "e")]) == 2
    line = h.one_line(capsys)
    assert "data.chat_template" in line and "antigravity" not in sys.modules
