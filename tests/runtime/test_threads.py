"""OpenMP defaults chosen at `import regroup` (regroup.runtime.threads)."""

from __future__ import annotations

import os
import subprocess
import sys

from regroup.runtime.threads import choose_openmp_settings


def test_passive_wait_policy_by_default():
    environ: dict[str, str] = {}
    assert choose_openmp_settings(environ) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_a_policy_in_the_environment_wins():
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert choose_openmp_settings(environ) == {}
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_regroup_threads_off_leaves_openmp_alone():
    environ = {"REGROUP_THREADS": "Off"}
    assert choose_openmp_settings(environ) == {}
    assert environ == {"REGROUP_THREADS": "Off"}


def test_import_regroup_sets_it_for_the_process_and_its_children():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "REGROUP_THREADS")}
    script = (
        "import os, subprocess, sys\n"
        "import regroup\n"
        "print(os.environ.get('OMP_WAIT_POLICY'))\n"
        "child = 'import os; print(os.environ.get(\"OMP_WAIT_POLICY\"))'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["PASSIVE", "PASSIVE"]
