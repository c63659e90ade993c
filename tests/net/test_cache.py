"""A judge cache on a full disk says "no space left on device" naming the file, not sqlite's
"cannot rollback - no transaction is active", which hides the cause."""

from __future__ import annotations

import errno

import pytest

from regroup.cli import user_error
from regroup.net import DiskCache


def test_full_cache_is_a_one_line_disk_full_error(tmp_path):
    cache = DiskCache(tmp_path / "judge.sqlite")
    cache.put("small", "ok")
    pages = cache._db.execute("PRAGMA page_count").fetchone()[0]
    cache._db.execute(f"PRAGMA max_page_count = {pages + 1}")  # the file cannot grow: SQLITE_FULL
    with pytest.raises(OSError) as info:
        cache.put("big", "x" * 200_000)
    assert info.value.errno == errno.ENOSPC and "judge.sqlite" in str(info.value)
    assert "cannot rollback" not in str(info.value)
    line = user_error(info.value)
    assert line.startswith("error: no space left on device") and "judge.sqlite" in line
    assert cache.get("small") == "ok"  # what was there is intact
    assert "big" not in cache
