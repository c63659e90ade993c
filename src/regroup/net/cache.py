"""A crash-safe, thread-safe persistent key → JSON cache for remote answers (judge scores, rewrites).

Backed by SQLite in WAL mode: every `put` is one transaction, so a process killed mid-write leaves
either the old or the new row, never a torn one. Failures are kept in a separate table and are never
returned by `get`, so a rerun asks the remote service again. Every value and error is redacted
(`regroup.net.redact`) on its way in: what a server sent back may quote the API key.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from regroup.net.redact import clip, redact

_MISSING = object()

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS failures (key TEXT PRIMARY KEY, error TEXT NOT NULL, count INTEGER NOT NULL,"
    " last REAL NOT NULL)",
)


def cache_key(*parts: Any) -> str:
    """sha256 hex digest of the canonical JSON (sorted keys, no spaces, UTF-8) of `parts`.

    Equal parts give equal keys across processes and Python versions; any change in any part (a model
    name, a prompt version, one character of a question) gives a different key.
    """
    try:
        canonical = json.dumps(list(parts), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except TypeError as exc:
        raise TypeError(f"cache key parts must be JSON-serialisable: {exc}") from None
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class DiskCache:
    """Persistent key → JSON value store in one SQLite file (WAL mode), safe across threads and processes.

    `path` is the database file; a directory (existing, or given with a trailing slash) gets
    `cache.sqlite` inside it. Parent folders are created.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 30.0) -> None:
        p = Path(path)
        if p.is_dir() or str(path).endswith(("/", os.sep)):
            p = p / "cache.sqlite"
        p.parent.mkdir(parents=True, exist_ok=True)
        self.path = p
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._open()

    def _open(self) -> None:
        try:
            conn = sqlite3.connect(
                str(self.path), timeout=self._timeout_s, check_same_thread=False, isolation_level=None
            )
            # WAL: readers never block the writer and a killed writer leaves the file consistent.
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL is durable against process crashes (the case we guard); only power loss can lose
            # the last transactions, which are then simply recomputed.
            conn.execute("PRAGMA synchronous=NORMAL")
            for stmt in _SCHEMA:
                conn.execute(stmt)
        except sqlite3.DatabaseError as exc:
            raise RuntimeError(f"cannot open cache database {self.path}: {exc}") from exc
        self._conn = conn

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"cache {self.path} is closed")
        return self._conn

    # -- answers ---------------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        """The JSON value stored under `key`, or `default` when absent (or unreadable)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM answers WHERE key = ?", (key,)).fetchone()
        if row is None:
            return default
        try:
            return json.loads(row[0])
        except json.JSONDecodeError:
            # Cannot happen through `put`; treat a hand-damaged row as a miss rather than crash a run.
            return default

    def put(self, key: str, value: Any) -> None:
        """Store `value` (JSON-serialisable, redacted) under `key` in one transaction; clears a recorded failure."""
        data = redact(json.dumps(value, ensure_ascii=False, sort_keys=True))
        now = time.time()
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.execute(
                        "INSERT OR REPLACE INTO answers (key, value, created) VALUES (?, ?, ?)", (key, data, now)
                    )
                    db.execute("DELETE FROM failures WHERE key = ?", (key,))
                    db.execute("COMMIT")
                except BaseException:
                    self._rollback(db)
                    raise
            except sqlite3.Error as exc:
                raise self._storage_error(exc) from None

    @staticmethod
    def _rollback(db: sqlite3.Connection) -> None:
        """Roll back if a transaction is still open: on SQLITE_FULL sqlite has already rolled back, and a
        second ROLLBACK's "cannot rollback - no transaction is active" would hide "disk is full"."""
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def _storage_error(self, exc: sqlite3.Error) -> Exception:
        """A full disk as OSError(ENOSPC) naming the cache file (one line from the CLI); else the error, named."""
        if "full" in str(exc).lower():
            return OSError(errno.ENOSPC, f"no space left on device: cache {self.path} ({exc})", str(self.path))
        return sqlite3.OperationalError(f"cache {self.path}: {exc}")

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0])

    def items(self) -> list[tuple[str, Any]]:
        """All (key, value) pairs; rows that do not parse as JSON are skipped."""
        with self._lock:
            rows = self._db.execute("SELECT key, value FROM answers").fetchall()
        out: list[tuple[str, Any]] = []
        for key, raw in rows:
            try:
                out.append((key, json.loads(raw)))
            except json.JSONDecodeError:
                continue
        return out

    # -- failures (kept apart: never served as answers) -------------------------------------------
    def record_failure(self, key: str, error: str) -> None:
        """Note that computing `key` failed with `error` (counted); `get` still reports a miss."""
        with self._lock:
            try:
                self._db.execute(
                    "INSERT INTO failures (key, error, count, last) VALUES (?, ?, 1, ?) "
                    "ON CONFLICT(key) DO UPDATE SET error = excluded.error, count = count + 1, last = excluded.last",
                    (key, clip(error, 2000), time.time()),
                )
            except sqlite3.Error as exc:
                raise self._storage_error(exc) from None

    def failures(self) -> dict[str, tuple[str, int]]:
        """Recorded failures: key → (last error, how many times)."""
        with self._lock:
            rows = self._db.execute("SELECT key, error, count FROM failures").fetchall()
        return {k: (e, int(c)) for k, e, c in rows}

    # -- lifecycle ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> DiskCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DiskCache(path={str(self.path)!r})"

    # A connection cannot be pickled; a copy reopens the same file.
    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path), "timeout_s": self._timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = Path(state["path"])
        self._timeout_s = state["timeout_s"]
        self._lock = threading.Lock()
        self._conn = None
        self._open()
