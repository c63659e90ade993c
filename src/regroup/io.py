"""File writes and reads in a run folder, in one place.

- `write_atomic`: a crash or a full disk leaves either the old file or the new one, never a torn one, and
  never a temporary file behind; a failure names the file that could not be written.
- `append_text`, `read_bytes`, `open_nofollow`: what regroup opens inside a run folder is never followed
  through a symbolic link (`O_NOFOLLOW`): a planted link cannot make a run append to, truncate or read
  another file. A link is refused with a `SymlinkError` naming it.
- `read_file_text`: a file the user names (a config), read only when it is a regular file and only up to a
  limit: /dev/zero or a named pipe is refused before a byte is read, and opening one never waits.
"""

from __future__ import annotations

import codecs
import errno
import os
import stat
import tempfile
from pathlib import Path


class SymlinkError(OSError):
    """A file regroup opens inside a run folder is a symbolic link (never followed)."""


class NotRegularFileError(OSError):
    """A path given as a file is a named pipe, a device or a socket (never read)."""


def _default_mode() -> int:
    """The mode a new file gets from the process umask (0o666 & ~umask), read without changing it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc (macOS): the classic read-and-restore
    os.umask(mask)
    return 0o666 & ~mask


def _write_error(e: OSError, path: Path) -> OSError:
    """The same error, its message naming `path` (a full disk says which file could not be written)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return OSError(e.errno, f"no space left on device while writing {path}")
    return OSError(e.errno, f"{e.strerror or e} while writing {path}")


def write_atomic(path: str | os.PathLike, text: str | bytes) -> None:
    """Write `text` to a unique temporary file beside `path`, fsync it, then rename it over `path`.

    The file gets the mode of the file it replaces, or the umask default for a new one (mkstemp's 0600
    would make every rewritten file private). The rename replaces a symbolic link at `path` itself,
    never its target."""
    path = Path(path)
    try:
        old = os.lstat(path)
        mode = stat.S_IMODE(old.st_mode) if stat.S_ISREG(old.st_mode) else _default_mode()
    except FileNotFoundError:
        mode = _default_mode()
    except OSError as e:
        raise _write_error(e, path) from e
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode("utf-8"))
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)  # never leave the temporary file behind (a full disk would keep it forever)
            except OSError:
                pass
        if isinstance(e, OSError):
            raise _write_error(e, path) from e
        raise


def open_nofollow(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """`os.open` that refuses a symbolic link at `path` (SymlinkError naming it)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.EMLINK and os.path.islink(path)):
            raise SymlinkError(
                errno.ELOOP, f"{path} is a symbolic link; regroup does not follow links inside a run folder (remove it)"
            ) from None
        raise


def append_text(path: str | os.PathLike, text: str) -> os.stat_result:
    """Append `text` to `path` (created if absent, never through a link); returns the file's stat after
    the write. A failure names the file."""
    path = Path(path)
    try:
        fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except SymlinkError:
        raise
    except OSError as e:
        raise _write_error(e, path) from e
    try:
        data = text.encode("utf-8")
        while data:
            written = os.write(fd, data)
            data = data[written:]
        return os.fstat(fd)
    except OSError as e:
        raise _write_error(e, path) from e
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of `path`, never read through a link (FileNotFoundError when absent)."""
    fd = open_nofollow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def read_text(path: str | os.PathLike) -> str:
    return read_bytes(path).decode("utf-8")


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_file_text(path: str | os.PathLike, limit: int, *, follow_links: bool = True) -> str:
    """The UTF-8 text of the regular file `path`, at most its first `limit` characters (a caller that refuses a
    longer file asks for one more than it accepts): at most 4 * `limit` bytes are read. Opened without waiting
    (`O_NONBLOCK`: a named pipe with no writer would block the open) and checked on the open descriptor: a named
    pipe, device or socket is a `NotRegularFileError` naming it and what it is, a folder an `IsADirectoryError`,
    before anything is read. Not UTF-8: `UnicodeDecodeError`. `follow_links=False`: a symbolic link is a
    `SymlinkError` (inside a run folder)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags) if follow_links else open_nofollow(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, f"{path} is a folder, not a file", str(path))
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(errno.EINVAL, f"{path} is {_file_kind(mode)}, not a regular file", str(path))
        chunks, left, ended = [], 4 * limit, False  # a UTF-8 character is at most 4 bytes
        while left > 0 and not ended:
            chunk = os.read(fd, min(left, 1 << 20))
            chunks.append(chunk)
            left, ended = left - len(chunk), not chunk
    finally:
        os.close(fd)
    # Not at the end: a character cut by the byte limit waits for bytes never read (an error still names its byte).
    return codecs.getincrementaldecoder("utf-8")().decode(b"".join(chunks), final=ended)[:limit]
