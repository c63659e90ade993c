"""The event loop the network calls run on: one asyncio loop per process, on a daemon thread.

The clients are called from plain threads (a training step, a thread pool) but do their HTTP on httpx2's
async client, where cancelling a task ends a request wherever it waits; that is what bounds a whole call.
Hand-written because no library does it for a long-lived, never-closed loop: anyio's blocking portal runs
its loop on a thread that the interpreter joins at exit, so a process that never closed it would hang there.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _forget_after_fork() -> None:
    """A forked child has the parent's loop object but not its thread: it starts its own on first use."""
    global _lock, _loop
    _lock, _loop = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_after_fork)


def event_loop() -> asyncio.AbstractEventLoop:
    """This process's network loop, started on first use."""
    global _loop
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="regroup-net", daemon=True).start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the network loop and wait for its result here (its exception is raised here). If this
    thread is interrupted while waiting (Ctrl-C), the coroutine is cancelled too."""
    future = asyncio.run_coroutine_threadsafe(coro, event_loop())
    try:
        return future.result()
    finally:
        future.cancel()  # a no-op once it has finished
