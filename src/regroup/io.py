"""Atomic file writes, in one place: a crash or a full disk leaves either the old file or the new one,
never a torn one, and never a temporary file behind."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str | bytes) -> None:
    """Write `text` to a unique temporary file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w", **({} if isinstance(text, bytes) else {"encoding": "utf-8"})) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)  # never leave the temporary file behind (a full disk would keep it forever)
        except OSError:
            pass
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(e.errno, f"no space left on device while writing {path}") from e
        raise
