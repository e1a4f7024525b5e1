"""CPU-second budgets for the analyses: the safety net under their deterministic bounds.

The analyses are bounded first by deterministic counts (states, region operations, z3's `rlimit`), so
the same input gives the same answer on any machine. Those counts bound the *number* of operations, not
what one costs: a region that splits into many boxes makes each operation dear, and a random procedure
kept `sop check` busy for minutes within its counts (issue 31). A `CpuBudget` is asked in the same
loops; past it, the analysis stops and says what it did not prove and where. It reads the process's CPU
clock (`time.process_time`), never the wall clock (a loaded machine does not cut work short), and holds
no global state: each analysis makes its own.
"""

from __future__ import annotations

import math
import time

CHECK_CPU_BUDGET = 15.0  # CPU seconds of `sop check`'s analyses (flow, output ranges) before they stop
PATHS_CPU_BUDGET = 15.0  # CPU seconds of path listing and counting (`sop paths`, the path plan of synthesis)
SYNTH_CPU_BUDGET = 20.0  # CPU seconds of `sop synth` before the remaining paths are sampled or skipped


class CpuBudget:
    """A CPU deadline: `out()` once `seconds` of process CPU time have passed since it was made.
    `math.inf` (or a negative) never runs out. Checking is cheap (one clock read)."""

    def __init__(self, seconds: float = math.inf):
        self.seconds = math.inf if seconds is None or seconds < 0 else float(seconds)
        self.start = time.process_time()
        self.deadline = self.start + self.seconds

    def out(self) -> bool:
        return self.deadline != math.inf and time.process_time() > self.deadline

    def left(self) -> float:
        return self.deadline - time.process_time()

    def share(self, fraction: float) -> CpuBudget:
        """A budget for one part of the work: `fraction` of the whole, never past the whole's deadline."""
        part = CpuBudget(self.seconds * fraction)
        part.deadline = min(part.deadline, self.deadline)
        return part

    def describe(self) -> str:
        return f"{self.seconds:g} s of CPU"
