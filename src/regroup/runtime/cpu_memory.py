"""Keep freed memory in the process on a CPU (glibc): the allocator settings a CPU training step wants.

glibc's malloc serves large blocks with mmap and hands small-heap tops back to the OS as soon as they
are freed. A training step on a CPU allocates and frees the same activation, KV-cache and gradient
buffers (megabytes each) every micro-batch and every decode step, so each step pays to map, fault in
and zero them again. On the tiny model's DaGRPO / GRPO pair (`benchmarks/overhead.py --steps 16`,
2 threads) that was 1.75–1.82 million minor page faults per run; with the settings below 0.22–0.24
million, and in paired runs the step took 0–12 % less (noisy; BENCHMARKS.md). jemalloc and tcmalloc do
the same by design; this reaches it without preloading a library.

The settings (mallopt): blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap, and
the heap is not trimmed below 1 GiB of free space. Peak memory is unchanged — what is freed stays
mapped for the next micro-batch rather than being returned and faulted in again. Other C libraries
(musl, macOS) have no mallopt: nothing is changed there. `train.keep_cpu_memory=false` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 1 << 30  # free heap kept before trimming, bytes
MMAP_THRESHOLD = 32 << 20  # glibc's HEAP_MAX_SIZE / 2 on 64-bit: larger values are refused


def keep_freed_memory() -> bool:
    """Apply the settings above to this process; True when the C library took them."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
