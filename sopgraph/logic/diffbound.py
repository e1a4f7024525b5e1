"""Difference constraints `x - y <= k` over integer variables (dates, datetimes, durations, ints), decided exactly.

Guards that compare two dates (`BookedAt > now - 24 hours`, `Departure < BookingDate + 2 days`), two
durations or two int variables (`Used > Allowance + 5`) compile to literals "x_p - x_q <= k" (see
`atoms.AtomCompiler.difference`). A conjunction of such literals plus per-variable intervals is a
difference-bound system: it is feasible iff its constraint graph has no negative cycle, and a closed
system (Floyd–Warshall) can be solved one variable at a time without backtracking. That makes feasibility
exact and witnesses immediate, where a witness search would guess among candidate dates.

Dates are whole days: a `date` variable only takes multiples of 86,400 s. Every integer solution then has
date-to-date (and date-to-origin) differences that are multiples of a day, so those bounds are rounded down
to whole days and the system closed again until nothing changes; the dates are assigned first (within the
tightened date bounds a whole day always exists), then every other variable (any integer in its closed
interval). "Empty" is claimed only on a negative cycle, which is sound; a bounded number of tightening
rounds keeps it terminating (past them: "unknown", and the caller falls back to its search).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

INF = math.inf
DAY = 86_400
MAX_VARS = 48  # variables of one system (closure is cubic)
MAX_ROUNDS = 16  # day-tightening rounds

Constraint = tuple[int, int, int]  # (p, q, k): x_p - x_q <= k


def _close(d: list[list[float]]) -> bool:
    """Shortest paths in place; False on a negative cycle."""
    n = len(d)
    for m in range(n):
        dm = d[m]
        for a in range(n):
            dam = d[a][m]
            if dam == INF:
                continue
            da = d[a]
            for b in range(n):
                v = dam + dm[b]
                if v < da[b]:
                    da[b] = v
    return all(d[a][a] >= 0 for a in range(n))


def _tighten(d: list[list[float]], whole: list[int]) -> bool:
    """Round bounds between whole-day nodes down to whole days; True if something changed."""
    changed = False
    for a in whole:
        for b in whole:
            v = d[a][b]
            if a != b and v != INF:
                t = math.floor(v / DAY) * DAY
                if t != v:
                    d[a][b] = t
                    changed = True
    return changed


def _add_edge(d: list[list[float]], a: int, b: int, w: float) -> None:
    """Incremental closure after tightening x_a - x_b <= w (d[a][b] is the bound on x_a - x_b)."""
    n = len(d)
    if w >= d[a][b]:
        return
    d[a][b] = w
    col_a = [d[i][a] for i in range(n)]
    row_b = d[b]
    for i in range(n):
        ia = col_a[i]
        if ia == INF:
            continue
        di = d[i]
        for j in range(n):
            v = ia + w + row_b[j]
            if v < di[j]:
                di[j] = v


def solve(variables: Iterable[int], constraints: Iterable[Constraint], bounds: Mapping[int, tuple[float, float]],
          dates: set[int], pick: Callable[[int, float, float], Any]) -> tuple[str, dict[int, int] | None]:
    """("empty", None) when no integer assignment (dates on whole days) satisfies the constraints and the
    closed `bounds` (lo, hi); ("sat", values) with one chosen by `pick(var, lo, hi)` (which returns an int
    inside, or None); ("unknown", None) past the size or rounding bounds, or when `pick` found nothing."""
    order = sorted(set(variables), key=lambda v: (v not in dates, v))
    if len(order) > MAX_VARS:
        return "unknown", None
    node = {v: i + 1 for i, v in enumerate(order)}  # node 0 is the origin (value 0, a whole day)
    n = len(order) + 1
    d: list[list[float]] = [[0.0 if a == b else INF for b in range(n)] for a in range(n)]
    for p, q, k in constraints:
        a, b = node[p], node[q]
        if k < d[a][b]:
            d[a][b] = k
    for v in order:
        lo, hi = bounds.get(v, (-INF, INF))
        i = node[v]
        if hi < d[i][0]:
            d[i][0] = hi
        if -lo < d[0][i]:
            d[0][i] = -lo
    whole = [0] + [node[v] for v in order if v in dates]
    if not _close(d):
        return "empty", None
    for _ in range(MAX_ROUNDS):
        if not _tighten(d, whole):
            break
        if not _close(d):
            return "empty", None
    else:
        return "unknown", None
    values: dict[int, int] = {}
    for v in order:
        i = node[v]
        lo, hi = -d[0][i], d[i][0]
        if lo > hi:
            return "unknown", None
        x = pick(v, lo, hi)
        if x is None or not lo <= x <= hi or (v in dates and x % DAY):
            return "unknown", None
        values[v] = int(x)
        _add_edge(d, i, 0, x)
        _add_edge(d, 0, i, -x)
        if d[i][i] < 0 or d[0][0] < 0:
            return "unknown", None
    return "sat", values


def holds(values: Mapping[int, Any], constraints: Iterable[Constraint]) -> bool:
    """Whether an assignment satisfies every constraint (a check of `solve`'s answers)."""
    return all(values[p] - values[q] <= k for p, q, k in constraints)
