"""Garbage-collector and allocator settings for the `sop` process and for benchmarks, never for library calls.

Why here and not in the stages: pausing or retuning the collector changes the whole process (every
thread, every other library), so library code must not do it. The CLI entry point applies
`tune_gc_for_cli` once; `sop check` runs under `batch_gc` and, as the process, loads under
`build_then_freeze`; benchmarks may use `no_cyclic_gc`.
benchmarks/bench_gc.py prints the gain.
"""

from __future__ import annotations

import ctypes
import gc
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager

CLI_GC_THRESHOLD = (50_000, 20, 20)
"""Young-generation threshold for the CLI: parsing, checking and a run allocate many short-lived
objects next to a large long-lived IR (and litellm's tables); with Python's default (700) every
full collection rescans them far more often than it finds cycles."""


def tune_gc_for_cli() -> None:
    """Raise the collection thresholds and freeze what is already loaded (the `sop` process only)."""
    gc.freeze()
    gc.set_threshold(*CLI_GC_THRESHOLD)


MALLOC_TRIM_THRESHOLD = 64 << 20
MALLOC_MMAP_THRESHOLD = 32 << 20
"""glibc's allocator settings for the CLI. Why: every solver question gets a z3 context of its own (for
answers that depend on the question alone, `logic.solver`), which allocates ~16 MB; with glibc's defaults, once
the process holds a loaded program the allocator handed that memory back to the system when the context was
freed, and the next context faulted every page in again: 4,000 page faults, ~8 ms of system time per question,
over a third of `sop check` on a list-of-records SOP. Kept: at most 64 MB of freed memory."""


def tune_malloc_for_cli() -> bool:
    """Keep freed memory in the `sop` process (glibc only; elsewhere nothing changes). True when applied."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        return bool(libc.mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD)) and bool(
            libc.mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD))
    except (OSError, AttributeError):  # pragma: no cover - a libc without mallopt
        return False


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector (benchmarks only: it is process-wide and not thread-safe)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


BATCH_GC_THRESHOLD = (CLI_GC_THRESHOLD[0], 10_000, 10_000)
"""`sop check`'s collector: young collections as in the CLI, older ones (practically) never. Why: a
check builds one large structure (the IR: ten million objects for 100k stages) that lives until the
process exits; each older collection re-walked every object that survived the young ones (about a
second per million on a 100k-stage check) and found next to nothing. Young cycles are still
collected, and the parsers and passes make few (no recursive closures)."""


@contextmanager
def batch_gc() -> Iterator[None]:
    """Collect only the young generation while the block runs (CLI commands only: process-wide)."""
    before = gc.get_threshold()
    gc.set_threshold(*BATCH_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)


@contextmanager
def build_then_freeze() -> Iterator[None]:
    """Run a block that builds one large structure living until the process ends (`sop check`'s loading: the IR,
    ten million objects for 100k stages) without the cyclic collector, then freeze what exists (CLI only:
    process-wide). Why: each object that survives a young collection was walked once by it (~1 s of a 100k-stage
    check), and a frozen object is never walked again; the loading makes next to no cycles (84 unreachable
    objects on 100k stages), so nothing is left to collect. Objects made while it runs stay uncollected by the
    cyclic collector (reference counting still frees them)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
