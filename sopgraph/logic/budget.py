"""CPU-second budgets for the analyses: the safety net under their deterministic bounds.

The analyses are bounded first by deterministic counts (states, region operations, z3's `rlimit`), so
the same input gives the same answer on any machine. Those counts bound the *number* of operations, not
what one costs: a region that splits into many boxes makes each operation dear, and a random procedure
kept `sop check` busy for minutes within its counts (issue 31). A `CpuBudget` is asked in the same
loops; past it, the analysis stops and says what it did not prove and where. It reads the process's CPU
clock (`time.process_time`), never the wall clock (a loaded machine does not cut work short).

One command has one budget (`--cpu-budget`), shared by all its analyses: each takes a part of it
(`share`, `leaving`) and the parts never run past the whole. A single feasibility question can cost
seconds (one stage with six guards over a list of records asked the solver a thousand times), so an
analysis also makes its budget `active` while it runs: the constraint space then asks it before each
question it has not answered yet (`check_active`) and raises `OutOfCpu`, which the analysis turns into
its located note. Nothing is memoised for a question cut short, so a later analysis with more time
answers it afresh. The active budget is context-local (`contextvars`), set only inside a `with`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Defaults per command (CPU seconds of its analyses, loading and printing not included); docs/performance.md
# lists them. Each is well under 30 s, so that no command spends more than 30 s of CPU on any input.
CHECK_CPU_BUDGET = 20.0  # `sop check`, per FILE: flow (up to 75 %), output ranges, optional reads
FLOW_SHARE = 0.75  # the part of `sop check`'s budget the flow analysis may use (15 s of the default)
RANGES_SHARE = 0.9  # ... the flow analysis and the output-range check together (the rest: optional reads)
LOAD_CPU_BUDGET = 10.0  # the load-time checks of commands that only load (`decide`, `step`, `compile`, ...)
LOAD_SHARE = 0.25  # the part of a command's budget its load-time checks may use when it analyses more
PATHS_CPU_BUDGET = 15.0  # `sop paths`: counting and listing paths (the path plan of synthesis)
SYNTH_CPU_BUDGET = 20.0  # `sop synth` before the remaining paths are sampled or skipped
VALIDATE_CPU_BUDGET = 20.0  # `sop validate`: replaying the rows and searching for edits that explain them


class CpuBudget:
    """A CPU deadline: `out()` once `seconds` of process CPU time have passed since it was made.
    `math.inf` (or a negative) never runs out. Checking is cheap (one clock read)."""

    def __init__(self, seconds: float = math.inf):
        self.seconds = math.inf if seconds is None or seconds < 0 else float(seconds)
        self.start = time.process_time()
        self.deadline = self.start + self.seconds
        self.whole = self.seconds  # the budget this one is a part of (itself, when it is not a part)

    def out(self) -> bool:
        return self.deadline != math.inf and time.process_time() > self.deadline

    def left(self) -> float:
        return self.deadline - time.process_time()

    def share(self, fraction: float) -> CpuBudget:
        """A budget for one part of the work: `fraction` of the whole, never past the whole's deadline."""
        part = CpuBudget(self.seconds * fraction)
        part.deadline = min(part.deadline, self.deadline)
        part.whole = self.whole
        return part

    def leaving(self, fraction: float) -> CpuBudget:
        """A budget for one part that ends once only `fraction` of the whole is left, for the parts after
        it: a part that finishes early leaves its time to them."""
        part = CpuBudget(self.seconds * (1 - fraction))
        part.start = self.start
        part.deadline = self.deadline - self.seconds * fraction if self.seconds != math.inf else math.inf
        part.whole = self.whole
        return part

    def describe(self) -> str:
        if self.whole != self.seconds:
            return f"{self.seconds:g} of {self.whole:g} s of CPU"
        return f"{self.seconds:g} s of CPU"


def budget_of(cpu_budget: float | CpuBudget | None, default: float) -> CpuBudget:
    """A `CpuBudget` from what an entry point was given: a budget as is, seconds, or None (`default`)."""
    if isinstance(cpu_budget, CpuBudget):
        return cpu_budget
    return CpuBudget(default if cpu_budget is None else cpu_budget)


class OutOfCpu(BaseException):  # noqa: N818 - a signal like KeyboardInterrupt, not an error
    """The active budget ran out inside an analysis. A `BaseException`, so that the analyses' own
    `except Exception` guards (an analysis bug must not crash a command) do not swallow it: the analysis
    that made the budget active catches it and says where it stopped."""

    def __init__(self, clock: CpuBudget):
        super().__init__(f"CPU budget ({clock.describe()}) reached")
        self.clock = clock


_ACTIVE: ContextVar[CpuBudget | None] = ContextVar("sopgraph_active_cpu_budget", default=None)


@contextmanager
def active(clock: CpuBudget) -> Iterator[CpuBudget]:
    """Make `clock` the budget the constraint space asks (`check_active`) until the block ends."""
    token = _ACTIVE.set(clock)
    try:
        yield clock
    finally:
        _ACTIVE.reset(token)


def check_active() -> None:
    """Raise `OutOfCpu` when an analysis made a budget active and it ran out (else do nothing)."""
    clock = _ACTIVE.get()
    if clock is not None and clock.out():
        raise OutOfCpu(clock)
