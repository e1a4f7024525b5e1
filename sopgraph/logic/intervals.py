"""Numeric domains: intervals with open or closed ends and excluded points, over ints or floats, and
exact boundary search under float rounding, and picking a member for a witness (`pick_num`). The arithmetic
the constraint domain (`sopgraph.logic.domain`) builds its boxes from and the guard compiler (`guards`) solves
with; nothing here knows about expressions or scenarios."""

from __future__ import annotations

import math
import random
import struct
import sys
from typing import Any, NamedTuple

INF = math.inf


# ---------------------------------------------------------------------------------------------
# Numeric domains


class NumDom(NamedTuple):
    """A numeric interval with optional open ends and finitely many excluded points.

    `lo`/`hi` are numbers or ±inf. For int variables the bounds are always closed integers and the
    excluded points lie strictly inside."""

    lo: float
    hi: float
    lo_open: bool
    hi_open: bool
    excl: frozenset

    def contains(self, x: float) -> bool:
        if x < self.lo or (x == self.lo and self.lo_open):
            return False
        if x > self.hi or (x == self.hi and self.hi_open):
            return False
        return x not in self.excl

NO_POINTS: frozenset = frozenset()


def int_floor(x: float) -> int:
    return math.floor(x)


def num_norm(lo: float, hi: float, lo_open: bool, hi_open: bool, excl: frozenset,
             is_int: bool) -> NumDom | None:
    """Canonical form of a numeric domain, or None if it is empty."""
    if lo == INF or hi == -INF or lo > hi:
        return None
    if is_int:
        if lo != -INF:
            lo = int_floor(lo) + 1 if (lo_open and float(lo).is_integer()) else math.ceil(lo)
        if hi != INF:
            hi = math.ceil(hi) - 1 if (hi_open and float(hi).is_integer()) else int_floor(hi)
        if lo > hi:
            return None
        if excl:
            pts = set()
            for e in excl:
                if isinstance(e, float) and not e.is_integer():
                    continue
                e = int(e)
                if lo <= e <= hi:
                    pts.add(e)
            while pts and lo in pts:
                pts.discard(lo)
                lo += 1
            while pts and hi in pts:
                pts.discard(hi)
                hi -= 1
            if lo > hi:
                return None
            excl = frozenset(e for e in pts if lo < e < hi)
        return NumDom(lo, hi, False, False, excl)
    if lo == hi and (lo_open or hi_open):
        return None
    if excl:
        keep = set()
        for e in excl:
            if e == lo:
                lo_open = True
            elif e == hi:
                hi_open = True
            elif lo < e < hi:
                keep.add(e)
        if lo == hi and (lo_open or hi_open):
            return None
        excl = frozenset(keep)
    if lo == -INF:
        lo_open = False
    if hi == INF:
        hi_open = False
    return NumDom(lo, hi, lo_open, hi_open, excl)


def num_meet(a: NumDom, b: NumDom, is_int: bool) -> NumDom | None:
    if a is b:
        return a
    if a.lo > b.lo:
        lo, lo_open = a.lo, a.lo_open
    elif a.lo < b.lo:
        lo, lo_open = b.lo, b.lo_open
    else:
        lo, lo_open = a.lo, a.lo_open or b.lo_open
    if a.hi < b.hi:
        hi, hi_open = a.hi, a.hi_open
    elif a.hi > b.hi:
        hi, hi_open = b.hi, b.hi_open
    else:
        hi, hi_open = a.hi, a.hi_open or b.hi_open
    excl = a.excl | b.excl if (a.excl or b.excl) else NO_POINTS
    if (lo == a.lo and hi == a.hi and lo_open == a.lo_open and hi_open == a.hi_open
            and excl == a.excl):
        return a
    return num_norm(lo, hi, lo_open, hi_open, excl, is_int)


def num_subset(a: NumDom, b: NumDom) -> bool:
    """a ⊆ b."""
    if a.lo < b.lo or (a.lo == b.lo and b.lo_open and not a.lo_open):
        return False
    if a.hi > b.hi or (a.hi == b.hi and b.hi_open and not a.hi_open):
        return False
    return all(not a.contains(e) for e in b.excl)


def num_union(a: NumDom, b: NumDom, is_int: bool) -> NumDom | None:
    """a ∪ b when it is one interval (with exclusions), else None."""
    if b.lo < a.lo or (b.lo == a.lo and a.lo_open and not b.lo_open):
        a, b = b, a
    # a starts first; gap if a ends before b starts
    pts = set()
    if is_int:
        if a.hi != INF and b.lo != -INF and a.hi + 1 < b.lo:
            return None
    elif a.hi < b.lo:
        return None
    elif a.hi == b.lo and a.hi_open and b.lo_open:
        pts.add(a.hi)  # (.., x) ∪ (x, ..): one interval without the point x
    if b.hi > a.hi or (b.hi == a.hi and a.hi_open and not b.hi_open):
        hi, hi_open = b.hi, b.hi_open
    else:
        hi, hi_open = a.hi, a.hi_open
    for e in a.excl | b.excl:
        if not a.contains(e) and not b.contains(e):
            pts.add(e)
    return num_norm(a.lo, hi, a.lo_open, hi_open, frozenset(pts), is_int)


def num_complement(d: NumDom) -> list[NumDom]:
    """Pieces (unnormalised for the type) whose union is ℝ minus d."""
    out: list[NumDom] = []
    if d.lo != -INF:
        out.append(NumDom(-INF, d.lo, False, not d.lo_open, NO_POINTS))
    if d.hi != INF:
        out.append(NumDom(d.hi, INF, not d.hi_open, False, NO_POINTS))
    for e in sorted(d.excl):
        out.append(NumDom(e, e, False, False, NO_POINTS))
    return out


def format_number(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        if x == INF:
            return "inf"
        if x == -INF:
            return "-inf"
        return str(int(x)) if x.is_integer() and abs(x) < 1e16 else repr(x)
    return str(x)


def _rounder(x: float, is_open: bool, toward: float) -> tuple[float, bool]:
    """A closed float bound that is the neighbour of a rounder number, as that number open: the exact
    boundary of `Amount * 0.8 >= 1400` is `>= 1750.0000000000002`, which is exactly `> 1750`."""
    if is_open or not isinstance(x, float) or not math.isfinite(x) or x.is_integer():
        return x, is_open
    near = math.nextafter(x, toward)
    return (near, True) if len(format_number(near)) + 3 < len(format_number(x)) else (x, is_open)


def describe_num(d: NumDom, full: NumDom | None = None) -> str:
    """Human text for a numeric domain, omitting bounds equal to the declared type's. Float noise
    from exact boundaries is written as the rounder open bound it equals (`_rounder`)."""
    if d.lo == d.hi:
        text = f"== {format_number(d.lo)}"
    else:
        lo_given = d.lo != -INF and not (full is not None and d.lo == full.lo
                                           and d.lo_open == full.lo_open)
        hi_given = d.hi != INF and not (full is not None and d.hi == full.hi
                                          and d.hi_open == full.hi_open)
        lo, lo_open = _rounder(d.lo, d.lo_open, -INF)
        hi, hi_open = _rounder(d.hi, d.hi_open, INF)
        if lo_given and hi_given:
            left = "(" if lo_open else "["
            right = ")" if hi_open else "]"
            text = f"in {left}{format_number(lo)}..{format_number(hi)}{right}"
        elif lo_given:
            text = f"{'>' if lo_open else '>='} {format_number(lo)}"
        elif hi_given:
            text = f"{'<' if hi_open else '<='} {format_number(hi)}"
        else:
            text = ""
    if d.excl:
        ex = ", ".join(f"!= {format_number(e)}" for e in sorted(d.excl))
        text = f"{text}, {ex}" if text else ex
    return text or "any"


# ---------------------------------------------------------------------------------------------
# Float ordering helpers (exact boundary search under float rounding)

MAX_FLOAT = sys.float_info.max


def float_to_ordinal(x: float) -> int:
    u = struct.unpack("<Q", struct.pack("<d", x))[0]
    if u >> 63:
        return -(u & ((1 << 63) - 1))
    return u


def ordinal_to_float(i: int) -> float:
    if i >= 0:
        return struct.unpack("<d", struct.pack("<Q", i))[0]
    return struct.unpack("<d", struct.pack("<Q", (-i) | (1 << 63)))[0]


def first_true(pred, lo: int, hi: int, hint: int) -> int | None:
    """Smallest index in [lo, hi] where a monotone (False...True) predicate holds, or None."""
    hint = min(max(hint, lo), hi)
    if pred(hint):
        # walk down to a False
        step = 1
        good = hint
        while True:
            j = good - step
            if j <= lo:
                if pred(lo):
                    return lo
                bad = lo
                break
            if not pred(j):
                bad = j
                break
            good = j
            step *= 2
    else:
        step = 1
        bad = hint
        while True:
            j = bad + step
            if j >= hi:
                if not pred(hi):
                    return None
                good = hi
                break
            if pred(j):
                good = j
                break
            bad = j
            step *= 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if pred(mid):
            good = mid
        else:
            bad = mid
    return good


# ---------------------------------------------------------------------------------------------
# Picking members (witnesses)


NO_VALUE = object()  # sentinel: a domain where no member was found (public: witness search and the compiler test for it)


def _nice_above(x: float) -> float:
    """The smallest number of the form {1,2,5}·10^k strictly greater than x (x > 0)."""
    k = math.floor(math.log10(x)) if x > 0 else 0
    for _ in range(3):
        for m in (1, 2, 5):
            v = m * 10.0**k
            if v > x:
                return v
        k += 1
    return x + 1


def pick_num(d: NumDom, is_int: bool, style: str, rng: random.Random | None) -> Any:
    """One member of d for a witness: the boundary, a typical round value (`representative`) or a
    random member with `rng`; `NO_VALUE` if none was found (shared by witness search and the
    guard compiler's affine probes, so both pick the same numbers)."""
    lo, hi = d.lo, d.hi
    if lo == hi:
        return int(lo) if is_int else float(lo)

    def ok(x: float) -> bool:
        return d.contains(x)

    def fix(x: float) -> Any:
        if is_int:
            x = int(round(x)) if math.isfinite(x) else 0
            for step in range(0, 64):
                for y in (x + step, x - step):
                    if ok(y):
                        return y
            return NO_VALUE
        x = float(x)
        if ok(x):
            return x
        for z in (x + 0.5, x - 0.5, (x + hi) / 2 if hi != INF else x + 1, (x + lo) / 2 if lo != -INF else x - 1):
            if math.isfinite(z) and ok(z):
                return float(z)
        return NO_VALUE

    if rng is not None:
        a = lo if lo != -INF else (hi - 1000 if hi != INF else -1000)
        b = hi if hi != INF else a + 1000
        if is_int:
            return fix(rng.randint(int(math.ceil(a)), int(math.floor(b))))
        return fix(rng.uniform(a, b))
    if style == "boundary":
        if lo != -INF:
            if is_int or not d.lo_open:
                return fix(lo)
            step = min(0.01, (hi - lo) / 2) if hi != INF else 0.01
            return fix(lo + step)
        if hi != INF:
            if is_int or not d.hi_open:
                return fix(hi)
            return fix(hi - 0.01)
        return fix(0)
    # representative: a typical value, preferably a round number away from the bounds
    if ok(100):
        return fix(100)
    if hi != INF and hi < 100:
        if lo != -INF:
            mid = (lo + hi) / 2
            return fix(math.floor(mid) if is_int else mid)
        return fix(hi / 2 if hi > 1 else hi - 10)
    if lo != -INF and lo >= 100:
        v = _nice_above(lo)
        if v < hi or (v == hi and not d.hi_open):
            return fix(v)
        return fix((lo + hi) / 2 if is_int is False else (lo + hi) // 2)
    return fix(0)
