"""Dates, datetimes, durations and string patterns: how their values are written, read and matched.

One module so that the parser (literals), the checker (patterns), both engine forms (input values,
outputs) and the constraint domain (witnesses) agree on one representation:

- a **date** or **datetime** is an `int` of seconds since 1970-01-01T00:00:00 UTC (a date is its
  midnight, UTC); a **duration** is a number of seconds. Arithmetic and comparisons are then plain
  number operations, identical in the interpreter and the generated engine.
- values are written as text at the boundaries: dates `2026-11-23`, datetimes
  `2026-11-23T10:00[:00][Z|+01:00]` (no offset means UTC; fractions of a second are dropped),
  durations `"90 days"`, `"1 day 6 hours"` or ISO 8601 `P1DT6H`.
- a pattern is a Python regular expression used with `re.fullmatch`; `pattern_problem` refuses
  patterns whose matching time can explode (nested unbounded repeats, overlapping alternatives under
  a repeat, back-references), and strings longer than `MAX_STRING` are refused as inputs, so every
  match is bounded. `pattern_examples` builds a matching and a non-matching string from the pattern
  for witnesses, verified with `re.fullmatch`.
"""

from __future__ import annotations

import datetime as dt
import re
from functools import lru_cache
from re import _parser as sre_parse  # the regex parser (Python 3.11+): the only door to a pattern's structure
from typing import Any

from sopgraph.errors import Error

DAY = 86_400
MAX_STRING = 1000  # longest string input accepted (bounds the cost of every pattern match)
MAX_PATTERN = 200  # longest pattern accepted in a `matches` test

UNITS: dict[str, int] = {"second": 1, "minute": 60, "hour": 3600, "day": DAY, "week": 7 * DAY}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME_RE = re.compile(r"(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d{1,9})?)?)?"
                          r"(Z|[+-]\d{2}:?\d{2})?")
_PART_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(second|minute|hour|day|week)s?\s*")
_ISO_DURATION = re.compile(r"P(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?")
DURATION_PATTERN = (r"^\s*(\d+(\.\d+)?\s*(second|minute|hour|day|week)s?\s*)+$"
                    r"|^P(\d+W)?(\d+D)?(T(\d+H)?(\d+M)?(\d+S)?)?$")

TemporalKind = str  # "date" | "datetime" | "duration"


class ValueProblem(Error, ValueError):
    """A value that is not of its declared kind; the message says what was expected."""


def unit_seconds(unit: str) -> int:
    """Seconds in one `unit` (`days`, `hour`, ...)."""
    return UNITS[unit[:-1] if unit.endswith("s") else unit]


def parse_date(text: Any) -> int:
    """`YYYY-MM-DD` → seconds at its midnight (UTC)."""
    if not isinstance(text, str) or not _DATE_RE.fullmatch(text):
        raise ValueProblem("is not a date (write YYYY-MM-DD, e.g. \"2026-11-23\")")
    try:
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise ValueProblem("is not a date of the calendar") from None
    return (day - dt.date(1970, 1, 1)).days * DAY


def parse_datetime(text: Any) -> int:
    """An ISO 8601 date and time (or a date: its midnight) → seconds since the epoch (UTC)."""
    match = _DATETIME_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueProblem("is not a datetime (write YYYY-MM-DDTHH:MM[:SS], optionally with Z or +HH:MM)")
    day, hh, mm, ss, zone = match.groups()
    try:
        stamp = dt.datetime.fromisoformat(day).replace(hour=int(hh or 0), minute=int(mm or 0),
                                                       second=int(ss or 0))
        if zone and zone != "Z":
            sign = 1 if zone[0] == "+" else -1
            digits = zone[1:].replace(":", "")
            offset = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
            stamp = stamp.replace(tzinfo=dt.timezone(sign * offset))
        else:
            stamp = stamp.replace(tzinfo=dt.UTC)
    except ValueError:
        raise ValueProblem("is not a datetime of the calendar") from None
    return int((stamp - _EPOCH).total_seconds())


def parse_duration(text: Any) -> int | float:
    """`"90 days"`, `"1 day 6 hours"`, `"PT24H"` → seconds."""
    if isinstance(text, str) and text.strip():
        iso = _ISO_DURATION.fullmatch(text.strip())
        if iso is not None and text.strip() != "P" and not text.strip().endswith("T"):
            weeks, days, hours, minutes, seconds = (int(g or 0) for g in iso.groups())
            return (((weeks * 7 + days) * 24 + hours) * 60 + minutes) * 60 + seconds
        pos, total = 0, 0.0
        while pos < len(text):
            part = _PART_RE.match(text, pos)
            if part is None or part.end() == pos:
                break
            total += float(part.group(1)) * UNITS[part.group(2)]
            pos = part.end()
        if pos == len(text):
            return int(total) if total.is_integer() else total
    raise ValueProblem('is not a duration (write e.g. "24 hours", "90 days", "1 day 6 hours" or "PT24H")')


PARSERS = {"date": parse_date, "datetime": parse_datetime, "duration": parse_duration}


def parse_temporal(kind: TemporalKind, value: Any) -> int | float:
    """An input value of a `date`, `datetime` or `duration` variable in its internal form."""
    return PARSERS[kind](value)


def format_temporal(kind: TemporalKind, seconds: int | float) -> str:
    """The internal form back as text (outputs, action arguments, witnesses, prompts)."""
    if kind == "duration":
        return format_duration(seconds)
    stamp = _EPOCH + dt.timedelta(seconds=seconds)
    if kind == "date":
        return stamp.date().isoformat()
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def format_duration(seconds: int | float) -> str:
    """Seconds in the largest unit that divides them: `172800` → `2 days`."""
    sign = "-" if seconds < 0 else ""
    rest = abs(seconds)
    for unit in ("week", "day", "hour", "minute"):
        size = UNITS[unit]
        if rest and rest % size == 0:
            n = int(rest // size)
            return f"{sign}{n} {unit}{'' if n == 1 else 's'}"
    secs: int | float = int(rest) if float(rest).is_integer() else rest
    return f"{sign}{secs} second{'' if secs == 1 else 's'}"


def days_between(a: int | float, b: int | float) -> int | float:
    """Days from `a` to `b` (negative when `b` is earlier): whole for two dates."""
    diff = b - a
    return diff // DAY if diff % DAY == 0 else diff / DAY


# ---------------------------------------------------------------------------------------------
# Patterns


@lru_cache(maxsize=512)
def compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def matches(pattern: str, value: Any) -> bool:
    """`value matches pattern`: the whole string matches (both engine forms call this)."""
    return compiled(pattern).fullmatch(value) is not None


_UNBOUNDED = sre_parse.MAXREPEAT
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _items(seq: Any) -> list[tuple[str, Any]]:
    return [(str(op), av) for op, av in seq]


def _has_repeat(seq: Any, unbounded_only: bool = True) -> bool:
    for op, av in _items(seq):
        if op in _REPEATS and (av[1] == _UNBOUNDED or not unbounded_only or av[1] > 1):
            return True
        if any(_has_repeat(sub) for sub in _subsequences(op, av)):
            return True
    return False


def _subsequences(op: str, av: Any) -> list[Any]:
    if op in _REPEATS:
        return [av[2]]
    if op == "SUBPATTERN":
        return [av[-1]]
    if op == "BRANCH":
        return list(av[1])
    if op in ("ASSERT", "ASSERT_NOT"):
        return [av[1]]
    if op == "ATOMIC_GROUP":
        return [av]
    return []


def _single_char(seq: Any) -> bool:
    items = _items(seq)
    return len(items) == 1 and items[0][0] in ("LITERAL", "IN", "ANY", "NOT_LITERAL")


def _risky(seq: Any, under_repeat: bool) -> str | None:
    for op, av in _items(seq):
        if op in ("GROUPREF", "GROUPREF_EXISTS"):
            return "back-references are not supported"
        if op in ("ASSERT", "ASSERT_NOT"):
            return "look-ahead and look-behind are not supported"
        if op in _REPEATS:
            unbounded = av[1] == _UNBOUNDED or av[1] > 50
            if unbounded and under_repeat:
                return "a repeat inside a repeat can take exponential time to match"
            if unbounded and _has_repeat(av[2]):
                return "a repeat inside a repeat can take exponential time to match"
            problem = _risky(av[2], under_repeat or unbounded)
            if problem:
                return problem
            continue
        if op == "BRANCH" and under_repeat and not all(_single_char(b) for b in av[1]):
            return "alternatives of several characters inside a repeat can take exponential time to match"
        for sub in _subsequences(op, av):
            problem = _risky(sub, under_repeat)
            if problem:
                return problem
    return None


def pattern_problem(pattern: str) -> tuple[str, str] | None:
    """Why `pattern` cannot be used in `matches` (message, hint), or None when it can."""
    if len(pattern) > MAX_PATTERN:
        return (f"the pattern is longer than {MAX_PATTERN} characters",
                "split the test into several `matches` conditions")
    try:
        tree = sre_parse.parse(pattern)
    except re.error as exc:
        return f"invalid pattern: {exc.msg}", "patterns are Python regular expressions, e.g. \"^[A-Z]{3}-\\d{5}$\""
    problem = _risky(tree, False)
    if problem:
        return problem, "write a simpler pattern: a repeat of single characters or classes, e.g. `[A-Z0-9]+`"
    return None


# ---- example strings for witnesses


class OutsideSubset(Error):
    """The pattern uses a construct the example builder does not cover."""


_CATEGORY_CHARS = {"CATEGORY_DIGIT": "0", "CATEGORY_WORD": "a", "CATEGORY_SPACE": " ",
                   "CATEGORY_NOT_DIGIT": "a", "CATEGORY_NOT_WORD": "-", "CATEGORY_NOT_SPACE": "a"}


def _class_char(av: Any) -> str:
    items = _items(av)
    if items and items[0][0] == "NEGATE":
        for ch in "aA0-_ x":
            if compiled("[^" + "".join(_class_source(items[1:])) + "]").fullmatch(ch):
                return ch
        raise OutsideSubset("negated class")
    for op, val in items:
        if op == "LITERAL":
            return chr(val)
        if op == "RANGE":
            return chr(val[0])
        if op == "CATEGORY":
            return _CATEGORY_CHARS.get(str(val), "a")
    raise OutsideSubset("empty class")


def _class_source(items: list[tuple[str, Any]]) -> list[str]:
    out: list[str] = []
    for op, val in items:
        if op == "LITERAL":
            out.append(re.escape(chr(val)))
        elif op == "RANGE":
            out.append(re.escape(chr(val[0])) + "-" + re.escape(chr(val[1])))
        elif op == "CATEGORY":
            out.append({"CATEGORY_DIGIT": r"\d", "CATEGORY_WORD": r"\w", "CATEGORY_SPACE": r"\s",
                        "CATEGORY_NOT_DIGIT": r"\D", "CATEGORY_NOT_WORD": r"\W",
                        "CATEGORY_NOT_SPACE": r"\S"}.get(str(val), ""))
        else:
            raise OutsideSubset(op)
    return out


def _example(seq: Any, extra: int) -> str:
    """A string matching `seq`: each repeat taken `min + extra` times (capped by its max)."""
    out: list[str] = []
    for op, av in _items(seq):
        if op == "LITERAL":
            out.append(chr(av))
        elif op == "NOT_LITERAL":
            out.append("a" if av != ord("a") else "b")
        elif op == "ANY":
            out.append("a")
        elif op == "IN":
            out.append(_class_char(av))
        elif op in _REPEATS:
            lo, hi = av[0], av[1]
            n = lo + extra if hi == _UNBOUNDED else min(hi, lo + extra)
            out.append(_example(av[2], extra) * n)
        elif op == "SUBPATTERN":
            out.append(_example(av[-1], extra))
        elif op == "BRANCH":
            out.append(_example(av[1][0], extra))
        elif op == "AT":
            continue
        else:
            raise OutsideSubset(op)
    return "".join(out)


@lru_cache(maxsize=512)
def pattern_examples(pattern: str) -> tuple[str | None, str | None]:
    """(a string that matches, a string that does not), each verified with `re.fullmatch`; None
    for one that could not be built. Raises `OutsideSubset` when the pattern uses constructs the
    builder does not know (then say so rather than guess)."""
    tree = sre_parse.parse(pattern)
    rx = compiled(pattern)
    good: str | None = None
    for extra in (1, 0, 2):
        candidate = _example(tree, extra)
        if rx.fullmatch(candidate):
            good = candidate
            break
    bad: str | None = None
    seeds = [good or "", "", "a", "0"]
    for cand in [*(s + "!" for s in seeds), *(s[:-1] for s in seeds if s), "!", "zz-00", "A" * 3]:
        if len(cand) <= MAX_STRING and not rx.fullmatch(cand):
            bad = cand
            break
    return good, bad
