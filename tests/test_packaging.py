"""The shipped recipes are package data: a wheel install (no checkout, another working folder) finds them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_install_finds_its_recipes(tmp_path):
    import shutil

    wheels, site, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
    # build from a copy: setuptools leaves build/ beside the sources it builds
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    wheel = next(wheels.glob("regroup_rl-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    script = (
        "import regroup, regroup.experiments.demo as d; from regroup.train.run_config import load_config\n"
        f"assert regroup.__file__.startswith({str(site)!r}), regroup.__file__\n"
        "cfg = load_config('dagrpo_ta'); assert cfg.recipe == 'dagrpo_ta' and cfg.ta.enabled and cfg.anchors.enabled\n"
        "assert (d.CONFIG_DIR / 'grpo.yaml').is_file() and (d.CONFIG_DIR / 'paper' / 'dagrpo_both.yaml').is_file()\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
