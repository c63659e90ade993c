"""OpenMP settings for a shared CPU, chosen when regroup is imported (before torch initialises OpenMP).

With OpenMP's default wait policy, a thread that finishes its share of a parallel region spins on its
core until the next one. Beside other CPU-bound processes those spinning threads take the cores the
others need (and wait for threads that were descheduled). `OMP_WAIT_POLICY=PASSIVE` makes waiting
threads sleep instead: beside three busy processes the warm-up's training step took 30.3 s with the
default policy and 3.92 s with PASSIVE (2 threads, 2 cores; BENCHMARKS.md, "Under load").

Only defaults are set: an OMP_WAIT_POLICY already in the environment wins, and `REGROUP_THREADS=off`
leaves everything alone. Child processes (accelerate workers, reward workers) inherit the setting.
"""

from __future__ import annotations

import os


def choose_openmp_settings(environ=os.environ) -> dict[str, str]:
    """Set the OpenMP defaults regroup runs best with; returns what it set (empty when told not to)."""
    if environ.get("REGROUP_THREADS", "").lower() == "off":
        return {}
    chosen = {}
    if "OMP_WAIT_POLICY" not in environ:
        environ["OMP_WAIT_POLICY"] = chosen["OMP_WAIT_POLICY"] = "PASSIVE"
    return chosen
