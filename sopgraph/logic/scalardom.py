"""Dates, durations, strings and optional values in the constraint domain (witnesses, synthesis).

The space keeps a date, datetime or duration variable as an integer number of seconds (the engine's own
form), so comparisons with constants are solved exactly like any integer; this module picks realistic
members (around `REFERENCE`, dates on day boundaries: the day before and after a cut-off), turns them
back into input text for witnesses, and proposes candidate strings for witness search — the literals a
string is compared with and, for `matches`, an example that matches and one that does not (both checked
with `re.fullmatch`; patterns outside the example builder's subset give no such candidates, which the
checker reports as I210). An optional variable's candidates include `None` (missing).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable
from typing import Any

from sopgraph.language import ir, scalars
from sopgraph.logic.engine import Interpreter
from sopgraph.logic.intervals import INF, NO_VALUE, NumDom

DAY = scalars.DAY
REFERENCE = scalars.parse_datetime("2026-01-15T12:00")  # where unconstrained dates are placed
_TYPICAL_DURATION = 3600
_MAX_CANDIDATES = 14


class InternalValues(Interpreter):
    """An interpreter over the space's own values: dates and durations already in seconds."""

    def var(self, name: str) -> Any:
        if name not in self.cache:
            var = self.s.variables.get(name)
            value = self.values.get(name)
            if (var is not None and var.role != "derived" and isinstance(var.type, ir.TimeType)
                    and isinstance(value, (int, float)) and not isinstance(value, bool)):
                self.cache[name] = value
                return value
        return super().var(name)


def snap(kind: str, d: NumDom, x: Any) -> Any:
    """A date on a day boundary inside `d` near `x` (later first); other kinds unchanged."""
    if x is NO_VALUE or kind != "date":
        return x if x is NO_VALUE or d.contains(x) else NO_VALUE
    base = math.floor(x / DAY) * DAY
    for y in (base if base >= x else base + DAY, base, base + DAY, base - DAY):
        if d.contains(y):
            return int(y)
    return NO_VALUE


def typical(kind: str) -> int:
    """Where an unconstrained date, datetime or duration is placed (witnesses and free values in synthesis)."""
    return _TYPICAL_DURATION if kind == "duration" else REFERENCE - (REFERENCE % DAY if kind == "date" else 0)


def pick_time(kind: str, d: NumDom, style: str, rng: random.Random | None) -> Any:
    """One member of a date/datetime/duration domain: its boundary (`boundary`: the cut-off itself, or
    the first day past it), a realistic value (`representative`), or a random one (`rng`)."""
    lo, hi = d.lo, d.hi
    step = DAY if kind != "duration" else _TYPICAL_DURATION
    if rng is not None:
        mid = lo if hi == INF and lo != -INF else hi if lo == -INF and hi != INF else None
        if mid is None:
            mid = (lo + hi) / 2 if lo != -INF else typical(kind)
        x = mid + rng.randint(-30, 30) * step
        got = snap(kind, d, x)
        return got if got is not NO_VALUE else pick_time(kind, d, "representative", None)
    if style == "boundary":
        if lo != -INF:
            x = lo + (1 if d.lo_open else 0)
        elif hi != INF:
            x = hi - (1 if d.hi_open else 0)
        else:
            x = typical(kind)
    elif lo != -INF and hi != INF:
        x = math.floor((lo + hi) / 2)
    elif lo != -INF:
        x = lo + 7 * step
    elif hi != INF:
        x = hi - 7 * step
    else:
        x = typical(kind)
    got = snap(kind, d, x)
    if got is NO_VALUE:  # a narrow domain: its ends
        for y in (lo, hi, lo + 1, hi - 1):
            if math.isfinite(y):
                got = snap(kind, d, y)
                if got is not NO_VALUE:
                    return got
    return got


def time_candidates(kind: str, d: NumDom, style: str, rng: random.Random | None,
                    consts: Iterable[float]) -> list[Any]:
    """Candidates for witness search: the picks, the constants a condition names (and a day or a
    second around them), and the reference moment moved by those constants."""
    raw: list[Any] = [pick_time(kind, d, style, rng), pick_time(kind, d, "boundary", None),
                      pick_time(kind, d, "representative", None)]
    center = typical(kind)
    for c in consts:
        offset = kind != "duration" and abs(c) < 20 * 365 * DAY  # for a date: a duration or a difference
        if not offset:  # a moment (a date literal), or a duration for a duration
            raw += [c, c + DAY, c - DAY, c + 1, c - 1]
        else:  # move the reference by it (`0` of `at >= LostAt` is no date in 1970)
            raw += [center - c, center + c, center - c + 1, center - c - 1]
    raw += [center, center - DAY, center + DAY, center - 2 * DAY, center + 2 * DAY]
    if kind == "duration":
        raw += [0, DAY, 1]
    out: list[Any] = []
    for x in raw:
        if x is NO_VALUE or isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            continue
        y = snap(kind, d, int(x))
        if y is not NO_VALUE and y not in out:
            out.append(y)
        if len(out) >= _MAX_CANDIDATES:
            break
    return out


_STRING_KINDS: tuple[tuple[tuple[str, ...], tuple[str, str]], ...] = (
    (("email", "e-mail", "e mail"), ("alex.morgan@example.com", "sam.lee@example.org")),
    (("phone", "mobile", "telephone"), ("+44 7700 900123", "+44 7700 900456")),
    (("postcode", "post code", "zip"), ("LS1 4AP", "YO1 7HH")),
    (("address",), ("12 Harbour Street, Leeds", "4 Mill Lane, York")),
    (("reference", "ref", "id", "number", "code", "order", "ticket", "tracking", "account"), ("REF-20417", "REF-38852")),
    (("name",), ("Alex Morgan", "Sam Lee")),
    (("reason", "comment", "note", "message", "description", "text"), ("the item arrived damaged", "I changed my mind")),
)


_TELLING = {"email", "e-mail", "e mail", "phone", "mobile", "telephone", "postcode", "post code", "address",
            "reference"}


def string_samples(name: str, description: str = "") -> tuple[str, str]:
    """Two different values a string variable plausibly holds, from the words of its name and description
    (`GivenEmail` → e-mail addresses, `OrderRef` → references): what a case's customer and backend say
    must read as such (a simulated user giving "text" as an e-mail address is no test of an agent);
    ("text", "other text") when nothing says what it is. Deterministic."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).replace("_", " ").lower()
    words = set(re.findall(r"[a-z]+(?:-[a-z]+)?", spaced))
    phrase = f" {spaced} {' '.join(description.lower().split()[:12])} "
    for keys, samples in _STRING_KINDS:  # the name first, then the first words of the description
        if any(k in words or (" " in k and k in phrase) for k in keys):
            return samples
    for keys, samples in _STRING_KINDS:  # the description: only words that cannot mean anything else
        if any(k in _TELLING and re.search(rf"\b{re.escape(k)}\b", phrase) for k in keys):
            return samples
    return "text", "other text"


def string_candidates(name: str, preds: Iterable[Any], first: str, other: str = "other text") -> list[str]:
    """Strings worth trying for `name`: `first`, the literals of the conditions and, for each
    `matches`, an example that matches the pattern and one that does not; then `other`."""
    out: list[str] = [first]
    for pred in preds:
        stack = [pred]
        while stack:
            e = stack.pop()
            if isinstance(e, ir.Matches) and isinstance(e.operand, ir.Var) and e.operand.name == name:
                try:
                    good, bad = scalars.pattern_examples(e.pattern)
                except (scalars.OutsideSubset, ValueError):
                    good = bad = None
                out += [x for x in (good, bad) if x is not None]
            elif isinstance(e, ir.Lit) and isinstance(e.value, str):
                out.append(e.value)
            stack.extend(ir.children(e))
    out += [other]
    unique = list(dict.fromkeys(out))
    return unique[:_MAX_CANDIDATES]


def describe_time(kind: str, d: NumDom) -> str:
    """A date/datetime/duration domain as text: `after 2026-01-01`, `at most 2 days`."""
    if d.lo == d.hi:
        return scalars.format_temporal(kind, d.lo)
    parts = []
    if d.lo != -INF:
        parts.append(("after " if d.lo_open else "from ") + scalars.format_temporal(kind, d.lo))
    if d.hi != INF:
        parts.append(("before " if d.hi_open else "up to ") + scalars.format_temporal(kind, d.hi))
    return ", ".join(parts) or "any"


def to_input(kinds: dict[str, str], values: dict[str, Any]) -> dict[str, Any]:
    """A witness in the engine's input form: dates and durations as text."""
    out = dict(values)
    for name, kind in kinds.items():
        v = out.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = scalars.format_temporal(kind, v)
    return out


MAX_TEXT_VALUES = 256  # literals of one string variable analysed as a finite domain (beyond: witness search)


def finite_strings(scenario: ir.Scenario) -> dict[str, tuple[str, ...]]:
    """String variables the analyses can treat as a finite domain, with its values: every literal the
    program compares the variable with, and one value equal to none of them ("any other text").

    Why: a string read only through `==`, `!=` and `in {…}` against quoted literals can only tell
    those literals and "something else" apart, so a domain of the literals plus one other value
    decides every such condition exactly (issue 31: left to witness search, a membership over a few
    dozen literals left hundreds of feasibility questions open). A variable with any other read
    (`matches`, a comparison with another variable, a derived copy, a `match` subject) keeps the
    witness search. Passing it as an action argument or output reads its value only, which any member
    of the domain supplies. The other value is listed first: a witness that does not care about the
    variable gets the same plausible sample (`string_samples`) as before."""
    names = {n for n, v in scenario.variables.items()
             if v.role != "derived" and isinstance(v.type, ir.StringType)}
    if not names:
        return {}
    literals: dict[str, dict[str, None]] = {n: {} for n in names}
    bad: set[str] = set()

    def lit_text(e: Any) -> str | None:
        return e.value if isinstance(e, ir.Lit) and isinstance(e.value, str) else None

    def walk(e: Any) -> None:
        if e is None:
            return
        if isinstance(e, ir.Var):
            if e.name in names:
                bad.add(e.name)
            return
        if isinstance(e, ir.Compare) and e.op in ("==", "!="):
            for a, b in ((e.left, e.right), (e.right, e.left)):
                if isinstance(a, ir.Var) and a.name in names and lit_text(b) is not None:
                    literals[a.name][lit_text(b) or ""] = None
                    return
        if isinstance(e, ir.InSet) and isinstance(e.operand, ir.Var) and e.operand.name in names:
            texts = [lit_text(v) for v in e.values]
            if all(t is not None for t in texts):
                literals[e.operand.name].update(dict.fromkeys(t or "" for t in texts))
                return
        if isinstance(e, ir.Func) and e.name == "missing":
            return
        for c in ir.children(e):
            walk(c)

    def value(e: Any) -> None:  # an argument or output: a bare string variable only gives its value
        if not (isinstance(e, ir.Var) and e.name in names):
            walk(e)

    for v in scenario.variables.values():
        if v.role == "derived":
            walk(v.expr)
    for st in scenario.stages.values():
        if st.kind != "match":  # a match's arms carry the equivalent membership tests as guards
            walk(st.subject)
        for b in st.branches:
            walk(b.guard)
            t = b.target
            for a in [*t.outputs, *t.args, *(x for step in t.steps for x in step.args)]:
                value(a.value)
    out: dict[str, tuple[str, ...]] = {}
    for n in sorted(names - bad):
        lits = list(literals[n])  # in the order the program first mentions them
        if not lits or len(lits) > MAX_TEXT_VALUES:
            continue
        first, second = string_samples(n, scenario.variables[n].description)
        other = next(x for x in (first, second, "other text", *(f"other text {i}" for i in range(len(lits) + 1)))
                     if x not in literals[n])
        out[n] = (other, *lits)
    return out
