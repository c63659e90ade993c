"""`available_memory` on CPU: MemAvailable from /proc/meminfo, bounded by a cgroup v2 limit."""

from __future__ import annotations

import pytest

from regroup.models import memory


@pytest.fixture
def files(monkeypatch):
    """The files `available_memory` reads, as {path: text}; a path left out raises OSError."""
    texts: dict[str, str] = {}

    class FakePath:
        def __init__(self, path: str) -> None:
            self.path = path

        def read_text(self) -> str:
            if self.path not in texts:
                raise OSError(f"no {self.path}")
            return texts[self.path]

    monkeypatch.setattr(memory, "Path", FakePath)
    return texts


def test_meminfo_alone(files):
    files["/proc/meminfo"] = "MemTotal: 4096 kB\nMemAvailable: 2048 kB\n"
    assert memory.available_memory() == 2048 * 1024


def test_cgroup_limit_bounds_meminfo(files):
    files["/proc/meminfo"] = "MemAvailable: 2048 kB\n"
    files["/sys/fs/cgroup/memory.max"] = str(1024 * 1024 + 1000)
    files["/sys/fs/cgroup/memory.current"] = "1000"
    assert memory.available_memory() == 1024 * 1024
    files["/sys/fs/cgroup/memory.max"] = "max"
    assert memory.available_memory() == 2048 * 1024


def test_cgroup_alone(files):
    files["/sys/fs/cgroup/memory.max"] = "5000"
    files["/sys/fs/cgroup/memory.current"] = "1000"
    assert memory.available_memory() == 4000
    files.clear()
    assert memory.available_memory() is None


def test_no_memory_available_is_not_unknown(files):
    # MemAvailable 0 is a reading, not "unknown": the cgroup's larger room must not replace it.
    files["/proc/meminfo"] = "MemAvailable: 0 kB\n"
    files["/sys/fs/cgroup/memory.max"] = str(8 * 2**30)
    files["/sys/fs/cgroup/memory.current"] = "0"
    assert memory.available_memory() == 0
