"""What a resume allows and says: the judge's URL and key variable may change; a checkpoint of a newer format says
"newer" (an older one "older"), and no message names the old `model.name` key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regroup.errors import ConfigError

pytestmark = pytest.mark.reliability


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
