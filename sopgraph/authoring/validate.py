"""`sop validate`: hold an SOP against labelled historic decisions and say where and why it disagrees.

Each row is decided by the engine; mismatches are grouped by the stage where the engine's route and
the expected outcome part ways (the deepest stage on the route from which another branch can still
reach the expected action). For each group a bounded search tries the nearest edits of that stage
(threshold shifts, `<` vs `<=`, flipped comparisons, arm order, enum values moved between match
arms, and the same edits inside the `let`s the stage reads) and reports how many rows each fixes and
how many it breaks. Columns are mapped to variables with types: numbers with units ("120 CNY"),
booleans written as text, enum values in any case, dates (days until `--now`), and dotted paths into
JSON columns (`--map Amount=order.amount`).
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import io
import itertools
import json
import math
import os
import re
import shlex
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, Field

from sopgraph.errors import Error
from sopgraph.language import ir, scalars
from sopgraph.language.fmt import print_node, show_expr
from sopgraph.logic.budget import VALIDATE_CPU_BUDGET, CpuBudget, budget_of
from sopgraph.logic.engine import NOW, DecideError, Decision, Interpreter, interpret

DEFAULT_BUDGET = 300  # candidate edits tried per mismatch group
THRESHOLDS_PER_COMPARISON = 12  # nearest observed values tried as a new threshold
MAX_ROWS = 200_000
NOW_EXAMPLE = "2026-11-23T10:00"
MAX_DATA_BYTES = 256 * 1024 * 1024  # a data file larger than this is refused
MAX_NUMBER_CELL = 100  # characters: a longer cell is not read as a number (`¥1,200.50`, `30 days` are short)


class ValidateError(Error):
    """Bad input data or options (a message for the user, not a traceback)."""


# ---------------------------------------------------------------------------------------------
# Reading rows and typed column mapping


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV (header line), JSON Lines or JSON array file (SAGE's test vectors are one), as
    dicts; `_line` holds the line where the row starts."""
    text = _read_text(path)
    rows: list[dict[str, Any]] = []
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json") and text.lstrip().startswith("["):
        rows = _json_array_rows(text, path)
    elif path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 may be inside a string
            if not line.strip():
                continue
            obj, end = _json_value(line, _BLANK.match(line).end(), path, lineno)  # type: ignore[union-attr]
            if line[end:].strip():
                raise ValidateError(f"{path}:{lineno}: unexpected text after the JSON object")
            if not isinstance(obj, dict):
                raise ValidateError(f"{path}:{lineno}: expected a JSON object per line")
            obj["_line"] = lineno
            rows.append(obj)
    else:
        rows = _csv_rows(text, path)
    if len(rows) > MAX_ROWS:
        raise ValidateError(f"{path}: {len(rows)} rows; at most {MAX_ROWS} are validated at once")
    return rows


def _read_text(path: Path) -> str:
    """The whole data file as text, read with bounds: a regular file of at most `MAX_DATA_BYTES`
    (a FIFO, a directory or `/dev/zero` is refused in one line instead of blocking or filling memory)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as exc:
        raise ValidateError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ValidateError(f"cannot read {path}: not a regular file (a device, pipe or directory)")
    if info.st_size > MAX_DATA_BYTES:
        os.close(fd)
        raise ValidateError(f"{path} is too large ({info.st_size:,} bytes; at most {MAX_DATA_BYTES:,})")
    with os.fdopen(fd, "rb") as fh:
        try:
            raw = fh.read(MAX_DATA_BYTES + 1)
        except OSError as exc:
            raise ValidateError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_DATA_BYTES:  # the file grew while it was read
        raise ValidateError(f"{path} is too large (more than {MAX_DATA_BYTES:,} bytes)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ValidateError(f"{path}:{line}: not UTF-8 text (byte {exc.start})") from None


def _csv_rows(text: str, path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV text under its header line; a cell over the csv module's field limit (often a
    quote that is never closed, swallowing the rest of the file) is an error naming the line and column,
    not a traceback. The limit is left as it is: it is process-wide state."""
    rows: list[dict[str, Any]] = []
    reader = csv.DictReader(io.StringIO(text, newline=""))
    done = 0  # the last line of the last row read: a failing row starts after it
    try:
        if not reader.fieldnames:
            raise ValidateError(f"{path}: no header line")
        done = reader.line_num
        for row in reader:
            row = {k: v for k, v in row.items() if k is not None}
            row["_line"] = done = reader.line_num
            rows.append(row)
            if len(rows) > MAX_ROWS:
                raise ValidateError(f"{path}: more than {MAX_ROWS} rows; at most {MAX_ROWS} are validated at once")
    except csv.Error as exc:
        raise ValidateError(_csv_problem(text, path, done + 1, exc)) from None
    return rows


def _csv_problem(text: str, path: Path, line: int, exc: csv.Error) -> str:
    """Where a CSV read failed (the line the row starts on, and for an overlong cell its column), and why
    in words."""
    if "field larger than field limit" not in str(exc):
        return f"{path}:{line}: cannot read the CSV: {exc}"
    limit = csv.field_size_limit()
    start = 0
    for _ in range(line - 1):
        start = text.find("\n", start) + 1
    column, size, quoted = 1, 0, False
    for ch in itertools.islice(text, start, None):  # the column where a cell outgrows the limit
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            column, size = column + 1, 0
            continue
        size += 1
        if size > limit:
            break
    return (f"{path}:{line}: column {column}: a cell longer than {limit:,} characters, the most a CSV cell may "
            "hold (a quote `\"` that is never closed makes the rest of the file one cell)")


_JSON = json.JSONDecoder()
_BLANK = re.compile(r"\s*")


def _json_value(text: str, pos: int, path: Path, lineno: int) -> tuple[Any, int]:
    try:
        return _JSON.raw_decode(text, pos)
    except RecursionError:
        raise ValidateError(f"{path}:{lineno}: invalid JSON: nested too deeply") from None
    except ValueError as exc:
        raise ValidateError(f"{path}:{lineno}: invalid JSON: {exc}") from None


def _json_array_rows(text: str, path: Path) -> list[dict[str, Any]]:
    """The objects of a top-level JSON array, each with the line it starts on (read one object at a
    time, so an error names its line)."""
    rows: list[dict[str, Any]] = []
    pos = _BLANK.match(text).end() + 1  # type: ignore[union-attr]  # past the `[`
    lineno, counted = 1, 0
    while True:
        pos = _BLANK.match(text, pos).end()  # type: ignore[union-attr]
        lineno += text.count("\n", counted, pos)
        counted = pos
        if pos >= len(text):
            raise ValidateError(f"{path}:{lineno}: the JSON array is not closed with `]`")
        if text[pos] == "]" and not rows:
            break
        obj, pos = _json_value(text, pos, path, lineno)
        if not isinstance(obj, dict):
            raise ValidateError(f"{path}:{lineno}: expected a JSON object per array item")
        obj["_line"] = lineno
        rows.append(obj)
        if len(rows) > MAX_ROWS:
            raise ValidateError(f"{path}: more than {MAX_ROWS} rows; at most {MAX_ROWS} are validated at once")
        pos = _BLANK.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith(",", pos):
            pos += 1
            continue
        if text.startswith("]", pos):
            break
        lineno += text.count("\n", counted, pos)
        raise ValidateError(f"{path}:{lineno}: expected `,` or `]` after an array item")
    rest = text[pos + 1:]
    if rest.strip():
        lineno += text.count("\n", counted, pos)
        raise ValidateError(f"{path}:{lineno}: unexpected text after the JSON array")
    return rows


_NUMBER = re.compile(r"^\s*(?P<pre>[^\d+\-.]*?)\s*(?P<num>[+-]?(?:\d[\d,_]*)?\.?\d+(?:[eE][+-]?\d+)?)"
                     r"\s*(?P<unit>[^\d]*?)\s*$")
_TRUE = {"true", "yes", "y", "t", "1", "on"}
_FALSE = {"false", "no", "n", "f", "0", "off"}
_NOT_APPLICABLE = {"none", "null", "n/a", "na", "-", "—", "nan"}
def _blank(value: Any) -> bool:
    """An empty cell (`""` in a CSV, `null` in JSON) or one that says "not applicable" (`N/A`, `-`)."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", *_NOT_APPLICABLE))


_DATE = re.compile(r"^\s*(\d{4}-\d{2}-\d{2})(?:[T ][\d:.]+Z?)?\s*$")


def _loads(text: str) -> Any:
    """JSON in a cell; too deep a nesting is a ValueError like any other bad JSON (not a RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _shown(value: Any, limit: int = 60) -> str:
    """A cell as quoted in a message, cut short (a cell may be megabytes long)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 5] + "…" + text[-4:]


def _lookup(row: Mapping[str, Any], column: str) -> Any:
    """A column, or a dotted path into a JSON column / nested JSON Lines object."""
    if column in row:
        return row[column]
    head, _, rest = column.partition(".")
    if not rest or head not in row:
        return None
    value = row[head]
    if isinstance(value, str):
        try:
            value = _loads(value)
        except ValueError:
            return None
    for part in rest.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def convert(value: Any, vtype: Any, *, unit: str | None = None, now: dt.date | None = None,
            what: str = "value") -> Any:
    """A cell as a value of the variable's type; `None` for an empty cell. Raises ValueError."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str) and value.strip().lower() in _NOT_APPLICABLE and not ir.is_structured(vtype) \
            and not isinstance(vtype, ir.StringType) \
            and not (isinstance(vtype, ir.EnumType) and value.strip().lower() in {v.lower() for v in vtype.values}):
        return None  # how spreadsheets write "no value" (an enum value of that name wins)
    if isinstance(vtype, ir.BoolType):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(f"{what} {_shown(value)} is not a boolean (yes/no, true/false, 1/0)")
    if isinstance(vtype, ir.EnumType):
        text = str(value).strip()
        if text in vtype.values:
            return text
        folded = {_fold(v): v for v in vtype.values}
        if _fold(text) in folded:  # `calm`, `not received`, `not-received` for `NotReceived`
            return folded[_fold(text)]
        raise ValueError(f"{what} {_shown(value)} is not one of {' | '.join(vtype.values)}")
    if isinstance(vtype, ir.NumType):
        return _number(value, vtype, unit, now, what)
    if ir.is_structured(vtype) and isinstance(value, str):  # a list or record cell is written as JSON
        try:
            return _loads(value)
        except ValueError:
            raise ValueError(f"{what} {_shown(value)} is not JSON (a list is written [..], a record {{..}})") from None
    return value


def _number(value: Any, vtype: ir.NumType, unit: str | None, now: dt.date | None, what: str) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{what} {_shown(value)} is not a number")
    if isinstance(value, (int, float)):
        num: float = value
    else:
        text = str(value).strip()
        if len(text) > MAX_NUMBER_CELL:  # never a number; and the patterns below need not be tried on it
            raise ValueError(f"{what} {_shown(value)} is not a number")
        date = _DATE.match(text)
        if date:
            if now is None:
                raise ValueError(f"{what} {_shown(text)} is a date: give --now (e.g. --now 2024-06-30) to count "
                                 "days from it")
            return (now - dt.date.fromisoformat(date.group(1))).days
        m = _NUMBER.match(text)
        if not m:
            raise ValueError(f"{what} {_shown(value)} is not a number")
        written = (m.group("pre") + " " + m.group("unit")).strip()
        if written and unit and _unit_key(written) != _unit_key(unit):
            raise ValueError(f"{what} {_shown(value)} is in {_shown(written)}, the variable is in {unit!r}")
        num = float(m.group("num").replace(",", "").replace("_", ""))
    if vtype.kind == "int" and float(num).is_integer():
        return int(num)
    return num


_UNIT_ALIASES = {"¥": "cny", "元": "cny", "rmb": "cny", "yuan": "cny", "$": "usd", "us$": "usd", "€": "eur",
                 "£": "gbp", "d": "day", "h": "hour", "hr": "hour", "min": "minute", "mo": "month"}


def _unit_key(unit: str) -> str:
    """Units compared loosely: case, a plural `s` and common symbols (¥ = CNY, € = EUR) do not matter."""
    key = unit.strip().lower()
    key = _UNIT_ALIASES.get(key, key)
    return key[:-1] if key.endswith("s") and len(key) > 3 else key


class ColumnPlan(BaseModel):
    """Which column feeds which variable, and which columns hold the expected outputs and path."""

    inputs: dict[str, str]
    expect: dict[str, str]
    found: list[str] = Field(default_factory=list)  # outputs whose column was found by name, not named
    path: str | None = None  # the column holding the expected stage path, if any


PATH_COLUMNS = ("expected_path", "path")


def _fold(text: str) -> str:
    """A name as spreadsheets write it: `Account frozen`, `account_frozen`, `ACCOUNT-FROZEN` all fold to
    `accountfrozen`, as `AccountFrozen` does."""
    return re.sub(r"[\s_\-]+", "", str(text)).lower()


class _Columns:
    """The data's column names indexed once for lookups by name (a JSON file may have any number)."""

    def __init__(self, columns: Sequence[str], nested: Mapping[str, Sequence[str]]):
        self.names = set(columns)
        self.folded: dict[str, str] = {}
        for c in columns:
            self.folded.setdefault(_fold(c), c)
        self.nested = nested
        self.nested_folded: dict[str, list[str]] = {}
        for k in nested:
            self.nested_folded.setdefault(_fold(k), []).append(k)

    def by_name(self, name: str) -> str | None:
        """The column named like `name` (exact, then ignoring case, spaces, `_` and `-`), else the key of
        that name in the one nested object that has it (SAGE's vectors keep values under `classification`
        and `system`)."""
        if name in self.names:
            return name
        if _fold(name) in self.folded:
            return self.folded[_fold(name)]
        for key in (name, *(k for k in self.nested_folded.get(_fold(name), ()) if k != name)):
            parents = self.nested.get(key, ())
            if len(parents) == 1:
                return f"{parents[0]}.{key}"
        return None


def _listed(columns: Sequence[str], limit: int = 30) -> str:
    """Column names for a message, the first `limit` of them."""
    more = f", … ({len(columns) - limit} more)" if len(columns) > limit else ""
    return ", ".join(columns[:limit]) + more


_ACTION_WORDS = ("action", "decision", "outcome", "resolution")


def _action_like(columns: Sequence[str], taken: set[str]) -> str | None:
    """The one column a business log names like the decided action (`action taken`, `Final action`,
    `decision`, `outcome`), or None when there is none or more than one. A word of the name must start
    with one of those words (`Transaction date` is no action column)."""
    def named(column: str) -> bool:
        return any(w.lower().startswith(a) for w in _words(column) for a in _ACTION_WORDS)
    like = [c for c in columns if c not in taken and named(c)]
    return like[0] if len(like) == 1 else None


def plan_columns(scenario: ir.Scenario, columns: Sequence[str], expect: Mapping[str, str],
                 mapping: Mapping[str, str], nested: Mapping[str, Sequence[str]] | None = None) -> ColumnPlan:
    """Variables read their own column (by name, see `_by_name`) unless `--map` says otherwise.
    Without `--expect`, the expected Action (and any output) come from columns named like them."""
    index = _Columns(columns, nested or {})
    wanted = dict(expect)
    found: list[str] = []
    if not expect:
        for name in ("Action", *scenario.outputs):
            column = index.by_name(name)
            if column is not None:
                wanted[name] = column
                found.append(name)
    if not expect and "Action" not in wanted:
        column = _action_like(columns, set(wanted.values()))
        if column is not None:
            wanted["Action"] = column
            found.append("Action")
    if "Action" not in wanted:
        raise ValidateError("give --expect Action=COLUMN (the column holding the decided action; no column "
                            "is named Action, and no one column is named like it: `action taken`, `decision`, "
                            f"`outcome`; columns: {_listed(columns)})")
    for name in wanted:
        if name != "Action" and name not in scenario.outputs:
            raise ValidateError(f"--expect {name}=...: `{name}` is not an output of the SOP "
                                f"(outputs: Action{''.join(', ' + o for o in scenario.outputs)})")
    inputs: dict[str, str] = {}
    for var in scenario.variables.values():
        if var.role == "derived":
            continue
        column = mapping.get(var.name) or index.by_name(var.name)
        if column is not None:
            inputs[var.name] = column
    for name in mapping:
        if name not in scenario.variables or scenario.variables[name].role == "derived":
            inputs_named = [v.name for v in scenario.variables.values() if v.role != "derived"]
            raise ValidateError(f"--map {name}=...: `{name}` is not a field or system variable of the SOP"
                                + _did_you_mean(similar_columns(name, inputs_named)))
    for name, column in [*mapping.items(), *wanted.items()]:
        if column.split(".")[0] not in index.names and column not in index.names:
            raise ValidateError(f"column `{column}` (for {name}) is not in the data"
                                + _did_you_mean(similar_columns(column, columns))
                                + f"; columns: {_listed(columns)}")
    path = next((c for c in PATH_COLUMNS if c in index.names and c not in inputs.values()), None)
    return ColumnPlan(inputs=inputs, expect=wanted, found=found, path=path)


# ---------------------------------------------------------------------------------------------
# Deciding rows


class RowResult(BaseModel):
    line: int
    values: dict[str, Any]
    expected: dict[str, Any]
    path: list[str] = Field(default_factory=list)
    finals: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    expected_path: list[str] | None = None
    needs: str | None = None  # the input the route stopped at, missing from the row (`path` ends at its stage)

    @property
    def ok(self) -> bool:
        return self.error is None and all(_same(self.finals.get(k), v) for k, v in self.expected.items())


MISSING_LABEL = "(missing)"  # the confusion row of rows whose expected action is empty
TOLERANCE = 0.01  # numbers agree within this (labelled money is usually rounded to cents)


def _same(got: Any, want: Any, tolerance: float = TOLERANCE) -> bool:
    if isinstance(got, (int, float)) and isinstance(want, (int, float)) and not isinstance(got, bool):
        return math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=tolerance + 1e-9)
    if isinstance(got, list) and isinstance(want, list) and all(isinstance(x, str) for x in [*got, *want]):
        return set(got) == set(want)  # a list output (`list of A | B`) is a set: order and repeats do not count
    return got == want


def reference_time(now: str | dt.date | None) -> tuple[str | None, dt.date | None]:
    """`--now` as the program's `now` (datetime text, as `sop decide --now` takes it: a date, or a date and
    time in any of `scalars.parse_datetime`'s forms) and as the day that date cells count to (UTC)."""
    if now is None:
        return None, None
    if isinstance(now, dt.date) and not isinstance(now, dt.datetime):
        return now.isoformat(), now
    text = now.isoformat() if isinstance(now, dt.datetime) else str(now).strip()
    try:
        seconds = scalars.parse_datetime(text)
    except scalars.ValueProblem as exc:
        raise ValidateError(f"--now {now!r} {exc}") from None
    return text, dt.date(1970, 1, 1) + dt.timedelta(days=seconds // scalars.DAY)


def prepare_rows(scenario: ir.Scenario, rows: Sequence[Mapping[str, Any]], plan: ColumnPlan,
                 now: dt.date | None, now_text: str | None = None) -> list[RowResult]:
    """Typed values and expectations for every row; conversion problems become row errors. `now` is the
    day date cells count to, `now_text` the program's `now` (see `reference_time`)."""
    out: list[RowResult] = []
    actions = {_fold(a): a for a in scenario.actions}
    for row in rows:
        line = int(row.get("_line", 0))
        values: dict[str, Any] = {}
        expected: dict[str, Any] = {}
        problems: list[str] = []
        for name, column in plan.inputs.items():
            var = scenario.variables[name]
            try:
                converted = (_looks(_lookup(row, column), var, now, column) if var.observed else
                             convert(_lookup(row, column), var.type, unit=var.unit, now=now,
                                     what=f"column `{column}`:"))
            except ValueError as exc:
                problems.append(str(exc))
                continue
            if converted is not None:
                values[name] = converted
        for name, column in plan.expect.items():
            raw = _lookup(row, column)
            if _blank(raw) and name != "Action" and name in plan.found:
                continue  # an output column found by name, blank here: that output is not compared
            if name == "Action":  # an action written as the log writes it (`reissue`, `open dispute`)
                text = "" if raw is None else str(raw).strip()
                if _fold(text) in actions or not _blank(raw):
                    expected[name] = actions.get(_fold(text), text)
                else:  # a row without a label: named as such, never a blank class of its own
                    problems.append(f"column `{column}`: no expected action (the cell is empty)")
                continue
            try:
                expected[name] = _no_value(convert(raw, scenario.outputs[name].type, what=f"column `{column}`:"),
                                           scenario.outputs[name].type)
            except ValueError as exc:
                problems.append(str(exc))
        if now_text is not None and NOW in scenario.variables and NOW not in plan.inputs:
            values[NOW] = now_text  # `--now` is the program's `now` too (as for `sop decide --now`)
        result = RowResult(line=line, values=values, expected=expected,
                           error="; ".join(problems) if problems else None)
        if plan.path is not None:
            result.expected_path = _stage_list(row.get(plan.path))
        out.append(result)
    return out


def _no_value(value: Any, vtype: Any) -> Any:
    """An expected output cell left empty means "no value": the output's own `none` when its type has one
    (`output Plan: A | B | none = none`), else null."""
    if value is None and isinstance(vtype, ir.EnumType):
        return next((v for v in vtype.values if v.lower() == "none"), None)
    return value


def _stage_list(value: Any) -> list[str] | None:
    """An expected path: a JSON list of stage ids, or text with the ids separated by commas, spaces or
    arrows (`s1 -> s2`); `None` when the cell is empty."""
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str) and value.strip():
        if value.strip().startswith("["):
            try:
                parsed = _loads(value)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                return [str(v) for v in parsed]
        return [p for p in re.split(r"(?:->|[\s,;>→])+", value) if p]
    return None


def _looks(value: Any, var: ir.Variable, now: dt.date | None, column: str) -> list[Any] | None:
    """An observed variable's cell: a list of values, one per look (JSON `[..]` in a text cell), or
    one value, which is the first and only look."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = _loads(value)
        except ValueError:
            raise ValueError(f"column `{column}`: {_shown(value)} is not JSON (the looks are written [..])") from None
    items = value if isinstance(value, list) else [value]
    looks = [convert(v, var.type, unit=var.unit, now=now, what=f"column `{column}` (look {k}):")
             for k, v in enumerate(items, 1)]
    return [v for v in looks if v is not None] or None  # empty cells are no looks


def decide_rows(scenario: ir.Scenario, rows: list[RowResult]) -> None:
    """Decide every row whose cells converted, a missing input taken as unknown (`decide_unknown`). A row
    that stops for one is decided as far as it goes: its `path` ends at the stage that needed it and
    `needs` names the input, so that a wrong route into a stage whose column the data lacks (the log
    fills it only where that route was really taken) can still be placed and explained. An output that
    cannot be computed without the missing input is `UNKNOWN`: the row fails only if it expects it."""
    for row in rows:
        if row.error is not None:  # the row's cells did not convert
            continue
        found = decide_unknown(scenario, row.values)
        if found.decision is not None:
            row.path, row.finals, row.error = found.decision.path, found.decision.finals, None
            open_outputs = [k for k in row.expected if row.finals.get(k) == UNKNOWN]
            if found.stopped is not None and open_outputs and row.finals.get("Action") == row.expected.get("Action"):
                row.error, row.needs = _row_error(found.stopped), found.stopped.variable  # a data gap
            continue
        assert found.stopped is not None  # no decision without its reason
        row.error, row.path, row.finals = _row_error(found.stopped), [], {}
        if _lacks(found.stopped, row.values):
            row.path = _route_to(found.scenario, str(found.stopped.stage), row.values)
            row.needs = found.stopped.variable


UNKNOWN = "(unknown)"  # an output the row's values cannot decide (it reads an input the row lacks)


class Unknowns(NamedTuple):
    """What `decide_unknown` found: the decision (None when the row stops), the engine's reason (for the
    stop; with a decision, for the first output left unknown, else the first stage settled), and the SOP
    with the stages settled so far."""

    decision: Decision | None
    stopped: DecideError | None
    scenario: ir.Scenario


def decide_unknown(scenario: ir.Scenario, values: Mapping[str, Any]) -> Unknowns:
    """The engine's decision, with an input the row lacks taken as unknown: a stage that stops for it
    goes on by the branch that every value of it would choose (`when Team == Tech and Severity > 5`
    is false for severity 3, whatever the team), and only where the branch depends on it does the row
    stop. Outputs and arguments of the branch taken that read it are left out: those outputs are
    `UNKNOWN` in the decision's finals (the action itself is known)."""
    current = scenario
    first: DecideError | None = None
    unknown: set[str] = set()
    for _ in range(2 * len(scenario.stages) + 2):  # each round settles a stage or strips its target
        try:
            decision = interpret(current, values)
        except DecideError as exc:
            settled = _settle(current, exc, values) if _lacks(exc, values) else None
            if settled is None:
                return Unknowns(None, exc, current)
            current, stripped = settled
            if first is None or (stripped and not unknown):
                first = exc  # the reason to give: the first stop, or the first that leaves an output unknown
            unknown |= stripped
            continue
        if unknown:
            decision.finals.update({k: UNKNOWN for k in unknown if k in decision.finals})
        return Unknowns(decision, first, current)
    return Unknowns(None, first, current)  # not reached: every round removes an unknown read


def _lacks(exc: DecideError, values: Mapping[str, Any]) -> bool:
    """Whether the engine stopped at a stage because an input is missing from `values`."""
    return exc.variable is not None and exc.stage is not None and values.get(exc.variable) is None


def _settle(scenario: ir.Scenario, exc: DecideError, values: Mapping[str, Any]
            ) -> tuple[ir.Scenario, set[str]] | None:
    """A copy of the SOP in which the stage that stopped goes straight to the branch its guards choose
    whatever the missing input is, that branch's outputs and arguments that read it left out (their
    names returned), or None when the choice depends on it. Not for procedures that observe (a look
    depends on the route so far) or stages with bounded arms (a count depends on it too)."""
    stage = scenario.stages[str(exc.stage)]
    if stage.observe or any(b.limit is not None for b in stage.branches) \
            or any(v.observed for v in scenario.variables.values()):
        return None
    it = Interpreter(scenario, values)
    it.stage = stage.id
    for branch in stage.branches:
        fires = True if branch.guard is None else _known(it, branch.guard, 0)
        if fires is None:
            return None
        if fires:
            target, stripped = _strip(it, branch.target)
            if stage.kind == "goto" and branch.guard is None and target is branch.target:
                return None  # settled already: what stops it is not in this stage's choice
            going = branch.model_copy(update={"guard": None, "values": [], "target": target})
            settled = stage.model_copy(update={"kind": "goto", "branches": [going], "subject": None})
            return scenario.model_copy(update={"stages": {**scenario.stages, stage.id: settled}}), stripped
    return None


def _strip(it: Interpreter, target: ir.Target) -> tuple[ir.Target, set[str]]:
    """The target without the output assignments and action arguments that cannot be computed from the
    row (the target itself when all can), and the outputs left out."""
    def computable(assign: ir.OutputAssign) -> bool:
        try:
            it.eval(assign.value)
        except DecideError:
            return False
        return True

    outputs = [a for a in target.outputs if computable(a)]
    args = [a for a in target.args if computable(a)]
    steps = [c.model_copy(update={"args": [a for a in c.args if computable(a)]}) for c in target.steps]
    if len(outputs) == len(target.outputs) and len(args) == len(target.args) \
            and all(len(a.args) == len(b.args) for a, b in zip(steps, target.steps, strict=True)):
        return target, set()
    stripped = {a.name for a in target.outputs} - {a.name for a in outputs}
    return target.model_copy(update={"outputs": outputs, "args": args, "steps": steps}), stripped


_STOP = "\x00stop"  # the action of a stage cut short (no action can be named so)


def _route_to(scenario: ir.Scenario, stage_id: str, values: Mapping[str, Any]) -> list[str]:
    """The route of `values` up to `stage_id`, where the engine stopped for a missing value: the engine
    decides a copy of the SOP in which that stage ends at once (the same semantics, never re-implemented).
    Empty when that decision fails anyway."""
    stage = scenario.stages[stage_id]
    stop = ir.Branch(guard=None, target=ir.Target(kind="action", action=_STOP))
    cut = stage.model_copy(update={"kind": "goto", "branches": [stop], "observe": [], "subject": None})
    try:
        path = interpret(scenario.model_copy(update={"stages": {**scenario.stages, stage_id: cut}}), values).path
    except DecideError:
        return []
    return path if path and path[-1] == stage_id else []


_MAX_KNOWN_DEPTH = 64  # `let`s followed when deciding a guard three-valued; deeper ones are evaluated whole


def _known(it: Interpreter, expr: Any, depth: int) -> bool | None:
    """A condition in three-valued logic: True or False when every value of the missing inputs gives
    that, None when it depends on them (`false and unknown` is false, `true or unknown` is true)."""
    if depth < _MAX_KNOWN_DEPTH:
        if isinstance(expr, ir.BoolOp):
            parts = [_known(it, e, depth + 1) for e in expr.operands]
            stop = expr.op == "or"  # the value that decides the whole: true for `or`, false for `and`
            if stop in parts:
                return stop
            return None if None in parts else not stop
        if isinstance(expr, ir.Unary) and expr.op == "not":
            inner = _known(it, expr.operand, depth + 1)
            return None if inner is None else not inner
        var = it.s.variables.get(expr.name) if isinstance(expr, ir.Var) else None
        if var is not None and var.role == "derived" and var.expr is not None:
            return _known(it, var.expr, depth + 1)
    try:
        return bool(it.eval(expr))
    except DecideError:
        return None


_WHERE = re.compile(r" \((?:needed )?at [^()]*\)$")


def _row_error(exc: DecideError) -> str:
    """The engine's reason a row cannot be decided, in this command's words: a missing `now` is given
    with `--now` here (the engine's message names `sop decide`)."""
    if exc.variable == NOW and exc.message.startswith(f"missing value for `{NOW}`"):
        where = _WHERE.search(exc.message)
        return (f"missing value for `{NOW}`{where.group(0) if where else ''}: the program reads the current "
                f"time, which is never taken from the clock; give it with --now {NOW_EXAMPLE} "
                f"(or --map {NOW}=COLUMN)")
    return exc.message


# ---------------------------------------------------------------------------------------------
# Where a route and the expectation part ways


def _reachable_actions(scenario: ir.Scenario) -> dict[str, set[str]]:
    """Stage id → actions reachable from it (fixed point; cycles allowed)."""
    reach: dict[str, set[str]] = {sid: set() for sid in scenario.stages}
    changed = True
    while changed:
        changed = False
        for sid, stage in scenario.stages.items():
            acts = reach[sid]
            before = len(acts)
            for branch in stage.branches:
                t = branch.target
                if t.kind == "action" and t.action:
                    acts.add(t.action)
                elif t.stage in reach:
                    acts |= reach[t.stage]
            changed |= len(acts) != before
    return reach


def parting_stage(scenario: ir.Scenario, row: RowResult, reach: Mapping[str, set[str]]) -> str:
    """The deepest stage on the route from which a branch not taken can reach the expected action;
    the leaf stage when only outputs differ; "-" when no stage on the route can reach it."""
    stages = parting_stages(scenario, row, reach)
    return stages[0] if stages else "-"


def parting_stages(scenario: ir.Scenario, row: RowResult, reach: Mapping[str, set[str]]) -> list[str]:
    """Every stage on the route where another branch could still lead to the expected action,
    deepest first (the leaf alone when only outputs differ)."""
    want = row.expected.get("Action")
    if want is None or want == row.finals.get("Action"):
        return row.path[-1:]
    found: list[str] = []
    for i in range(len(row.path) - 1, -1, -1):
        stage = scenario.stages[row.path[i]]
        nxt = row.path[i + 1] if i + 1 < len(row.path) else None
        for branch in stage.branches:
            t = branch.target
            taken = (t.kind == "stage" and t.stage == nxt) or (nxt is None and t.kind == "action"
                                                                and t.action == row.finals.get("Action"))
            if taken:
                continue
            if (t.kind == "action" and t.action == want) or (t.kind == "stage" and want in reach.get(
                    str(t.stage), set())):
                found.append(stage.id)
                break
    return found


# ---------------------------------------------------------------------------------------------
# Candidate edits


class Candidate(BaseModel):
    """One edit of the SOP and what it does to the data."""

    stage: str
    where: str  # "stage s6" or "let Eligible"
    kind: str  # threshold | operator | flip | arm-order | match-value | drop
    before: str
    after: str
    fixes: int = 0
    breaks: int = 0
    broken_lines: list[int] = Field(default_factory=list)  # the data lines of the first few broken rows
    group_size: int = 0
    groups: list[int] = Field(default_factory=list)  # the groups (1-based) this same edit explains rows of

    @property
    def key(self) -> tuple[str, str, str]:
        """The edit itself: the same key in two groups is one edit of the SOP."""
        return self.where, self.before, self.after

    def edit_text(self) -> str:
        if self.kind == "arm-order":
            return f"`{self.after}` above `{self.before}`"
        return f"`{self.after}` instead of `{self.before}`"

    def describe(self) -> str:
        edit = self.edit_text()
        broken = ""
        if self.breaks:
            lines = ", ".join(map(str, self.broken_lines)) + (" ..." if self.breaks > len(self.broken_lines) else "")
            broken = (f" (breaks 1 matching row: line {lines})" if self.breaks == 1
                      else f" (breaks {self.breaks} matching rows: lines {lines})")
        return f"{edit} at {self.where} explains {self.fixes}/{self.group_size}{broken}"


Edit = Callable[[ir.Scenario], ir.Scenario]
_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "!=", "!=": "=="}
_STRICT = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}


def _bool_ops(expr: Any) -> Iterator[ir.BoolOp]:
    if isinstance(expr, ir.BoolOp):
        yield expr
    for child in ir.children(expr):
        yield from _bool_ops(child)


def _drop_edits(op: ir.BoolOp) -> Iterator[tuple[str, str, str, Any]]:
    """(kind, before, after, new node): the `and`/`or` without one of its conditions (`Tier == Medium`
    for `Tier == Medium and Mood == Distressed`): a condition the SOP adds that the decisions do not
    follow, or one they follow that the SOP lacks (an `or` too wide)."""
    before = show_expr(op)
    for i in range(len(op.operands)):
        rest = op.operands[:i] + op.operands[i + 1:]
        new = rest[0] if len(rest) == 1 else op.model_copy(update={"operands": rest})
        yield "drop", before, show_expr(new), new


def _compares(expr: Any) -> Iterator[ir.Compare]:
    if isinstance(expr, ir.Compare):
        yield expr
    for child in ir.children(expr):
        yield from _compares(child)


def _vars_read(expr: Any, scenario: ir.Scenario, seen: set[str]) -> None:
    if isinstance(expr, ir.Var) and expr.name not in seen:
        seen.add(expr.name)
        var = scenario.variables.get(expr.name)
        if var is not None and var.expr is not None:
            _vars_read(var.expr, scenario, seen)
    for child in ir.children(expr):
        _vars_read(child, scenario, seen)


def _assignments(target: ir.Target) -> list[ir.OutputAssign]:
    """A target's output assignments and action arguments (those of the actions on the way too)."""
    return [*target.outputs, *target.args, *(a for step in target.steps for a in step.args)]


def _sites(scenario: ir.Scenario, stage: ir.Stage) -> list[tuple[str, Any]]:
    """Expressions an edit at `stage` may touch: its guards and the `let`s they read, then its output
    assignments and action arguments and the `let`s only they read (a wrong amount is decided there)."""
    sites: list[tuple[str, Any]] = [(f"stage {stage.id}", b.guard) for b in stage.branches
                                    if b.guard is not None and not b.values]
    seen: set[str] = set()
    for b in stage.branches:
        if b.guard is not None:
            _vars_read(b.guard, scenario, seen)
    for name in sorted(seen):
        var = scenario.variables.get(name)
        if var is not None and var.expr is not None:
            sites.append((f"let {name}", var.expr))
    by_guards = set(seen)
    for b in stage.branches:
        for assign in _assignments(b.target):
            sites.append((f"stage {stage.id} ({assign.name} = …)", assign.value))
            _vars_read(assign.value, scenario, seen)
    for name in sorted(seen - by_guards):
        var = scenario.variables.get(name)
        if var is not None and var.expr is not None:
            sites.append((f"let {name}", var.expr))
    return sites


def _replace_compare(scenario: ir.Scenario, target: Any, new: Any) -> ir.Scenario:
    """A copy of the scenario with one expression node (a comparison, an `and`/`or`) replaced (matched by
    identity)."""
    def rebuild(e: Any) -> Any:
        if e is target:
            return new
        if isinstance(e, ir.Unary):
            return e.model_copy(update={"operand": rebuild(e.operand)})
        if isinstance(e, (ir.Binary, ir.Compare)):
            return e.model_copy(update={"left": rebuild(e.left), "right": rebuild(e.right)})
        if isinstance(e, ir.BoolOp):
            return e.model_copy(update={"operands": [rebuild(o) for o in e.operands]})
        if isinstance(e, (ir.Call, ir.Func)):
            return e.model_copy(update={"args": [rebuild(a) for a in e.args]})
        if isinstance(e, ir.Matches):
            return e.model_copy(update={"operand": rebuild(e.operand)})
        if isinstance(e, ir.CaseExpr):
            arms = [a.model_copy(update={"when": rebuild(a.when), "then": rebuild(a.then)}) for a in e.arms]
            return e.model_copy(update={"arms": arms, "otherwise": rebuild(e.otherwise)})
        return e

    def assigned(assigns: list[ir.OutputAssign]) -> list[ir.OutputAssign]:
        return [a.model_copy(update={"value": rebuild(a.value)}) for a in assigns]

    def retarget(t: ir.Target) -> ir.Target:
        if not (t.outputs or t.args or t.steps):
            return t
        steps = [c.model_copy(update={"args": assigned(c.args)}) for c in t.steps]
        return t.model_copy(update={"outputs": assigned(t.outputs), "args": assigned(t.args), "steps": steps})

    stages = {sid: s.model_copy(update={"branches": [b.model_copy(update={"guard": rebuild(b.guard),
                                                                          "target": retarget(b.target)})
                                                      for b in s.branches]})
              for sid, s in scenario.stages.items()}
    variables = {n: (v.model_copy(update={"expr": rebuild(v.expr)}) if v.expr is not None else v)
                 for n, v in scenario.variables.items()}
    return scenario.model_copy(update={"stages": stages, "variables": variables})


def _observed(scenario: ir.Scenario, expr: Any, rows: Sequence[RowResult]) -> list[float]:
    """Distinct numeric values `expr` takes on the rows (rows that cannot evaluate it are skipped)."""
    seen: set[float] = set()
    for row in rows:
        try:
            value = Interpreter(scenario, row.values).eval(expr)
        except (DecideError, TypeError, KeyError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seen.add(value)
    return sorted(seen)


def _round_between(lo: float, hi: float) -> float | None:
    """The roundest number strictly between `lo` and `hi` (a multiple of the largest power of ten,
    or five times one, that fits), or None when they are too close."""
    for k in range(12, -7, -1):
        for step in (5 * 10.0 ** k, 10.0 ** k):
            x = math.floor(lo / step + 1) * step
            if lo < x < hi:
                return float(int(x)) if step >= 1 else round(x, 6)
    return None


def _compare_edits(scenario: ir.Scenario, where: str, cmp: ir.Compare, rows: Sequence[RowResult],
                   context: Sequence[RowResult] = ()) -> Iterator[tuple[str, str, str, ir.Compare]]:
    """(kind, before, after, new node) for one comparison: operator tweaks, then threshold shifts."""
    before = show_expr(cmp)
    if cmp.op in _STRICT:
        new = cmp.model_copy(update={"op": _STRICT[cmp.op]})
        yield "operator", before, show_expr(new), new
    new = cmp.model_copy(update={"op": _FLIP[cmp.op]})
    yield "flip", before, show_expr(new), new
    lit_side = "right" if isinstance(cmp.right, ir.Lit) else "left" if isinstance(cmp.left, ir.Lit) else None
    if lit_side is None or cmp.op in ("==", "!="):
        return
    lit: ir.Lit = getattr(cmp, lit_side)
    if isinstance(lit.value, bool) or not isinstance(lit.value, (int, float)):
        return
    other = cmp.left if lit_side == "right" else cmp.right
    observed = _observed(scenario, other, rows)
    here = float(lit.value)
    # a round number between a mismatched row's value and the neighbouring value of any row splits
    # the rows as the value itself does, and reads better (`> 90`, not `>= 92.41666666666667`)
    mine = set(observed)
    every = sorted(mine | set(_observed(scenario, other, context)))
    between = [x for a, b in itertools.pairwise(every)
               if (a in mine or b in mine) and (x := _round_between(a, b)) is not None
               and _significant_digits(_num(x)) < min(_significant_digits(_num(a)), _significant_digits(_num(b)))]

    def nearest(xs: list[float]) -> list[float]:
        return sorted(xs, key=lambda v: (abs(v - here), v))[:THRESHOLDS_PER_COMPARISON]

    values = list(dict.fromkeys(nearest(observed) + nearest(between)))
    for value in values:
        if value == lit.value:
            continue
        value = int(value) if float(value).is_integer() and isinstance(lit.value, int) else value
        for op in dict.fromkeys([cmp.op, _STRICT[cmp.op]]):
            new = cmp.model_copy(update={"op": op, lit_side: lit.model_copy(update={"value": value})})
            yield "threshold", before, show_expr(new), new


def _arm_edits(scenario: ir.Scenario, stage: ir.Stage) -> Iterator[tuple[str, str, str, Edit]]:
    """Moving a guarded arm one place up, and moving a match value to another arm."""
    for i in range(1, len(stage.branches)):
        a, b = stage.branches[i - 1], stage.branches[i]
        if stage.kind != "when" or a.guard is None or b.guard is None:
            continue
        order = stage.branches[: i - 1] + [b, a] + stage.branches[i + 1:]

        def edit(s: ir.Scenario, order: list[ir.Branch] = order) -> ir.Scenario:
            new_stage = s.stages[stage.id].model_copy(update={"branches": order})
            return s.model_copy(update={"stages": {**s.stages, stage.id: new_stage}})
        yield "arm-order", _source(a), _source(b), edit
    if stage.kind != "match":
        return
    for i, src in enumerate(stage.branches):
        for value in src.values:
            for j, dst in enumerate(stage.branches):
                if i == j or not dst.values:
                    continue
                yield ("match-value", f"{show_expr(value)} -> {_source(src.target)}",
                       f"{show_expr(value)} -> {_source(dst.target)}", _move_value(stage.id, i, j, value))


def _source(node: ir.Branch | ir.Target) -> str:
    """An arm or a target as `.sop` text, as `sop fmt` writes it (an action name with spaces quoted,
    arguments and outputs included), so that a suggested edit can be pasted into the file."""
    return " ".join(line.text.strip() for line in print_node(node, 0))


def _move_value(stage_id: str, i: int, j: int, value: ir.Lit) -> Edit:
    def edit(s: ir.Scenario) -> ir.Scenario:
        stage = s.stages[stage_id]
        branches = list(stage.branches)
        for k, delta in ((i, -1), (j, 1)):
            b = branches[k]
            vals = [v for v in b.values if v.value != value.value] if delta < 0 else [*b.values, value]
            subject = stage.subject if stage.subject is not None else ir.Lit(value=False)
            guard = ir.InSet(operand=subject, values=vals) if vals else ir.Lit(value=False)
            branches[k] = b.model_copy(update={"values": vals, "guard": guard})
        new_stage = stage.model_copy(update={"branches": branches})
        return s.model_copy(update={"stages": {**s.stages, stage_id: new_stage}})
    return edit


def candidate_edits(scenario: ir.Scenario, stage_id: str, rows: Sequence[RowResult],
                    context: Sequence[RowResult] = ()) -> Iterator[tuple[Candidate, Edit]]:
    """Edits at one stage for the mismatched `rows`; `context` (the other rows reaching the stage)
    places round thresholds between a mismatched row's value and its neighbours."""
    stage = scenario.stages[stage_id]
    for where, expr in _sites(scenario, stage):
        for cmp in _compares(expr):
            for kind, before, after, new in _compare_edits(scenario, where, cmp, rows, context):
                def edit(s: ir.Scenario, cmp: ir.Compare = cmp, new: ir.Compare = new) -> ir.Scenario:
                    return _replace_compare(s, cmp, new)
                yield Candidate(stage=stage_id, where=where, kind=kind, before=before, after=after), edit
        for op in _bool_ops(expr):
            for kind, before, after, node in _drop_edits(op):
                def drop(s: ir.Scenario, op: ir.BoolOp = op, node: Any = node) -> ir.Scenario:
                    return _replace_compare(s, op, node)
                yield Candidate(stage=stage_id, where=where, kind=kind, before=before, after=after), drop
    for kind, before, after, arm_edit in _arm_edits(scenario, stage):
        yield Candidate(stage=stage_id, where=f"stage {stage_id}", kind=kind, before=before, after=after), arm_edit


def _score(scenario: ir.Scenario, rows: Sequence[RowResult], group: Sequence[RowResult]) -> tuple[int, list[int]]:
    """(rows of the group fixed, data lines of the matching rows broken) by an edited scenario."""
    fixed = sum(1 for r in group if _row_ok(scenario, r))
    broken = [r.line for r in rows if r.ok and not _row_ok(scenario, r)]
    return fixed, broken


def _row_ok(scenario: ir.Scenario, row: RowResult) -> bool:
    """Whether the (edited) SOP decides the row as expected, a missing input taken as unknown as in
    `decide_rows` (an expected output left unknown is not a match)."""
    d = decide_unknown(scenario, row.values).decision
    return d is not None and all(_same(d.finals.get(k), v) for k, v in row.expected.items())


def search(scenario: ir.Scenario, stage_ids: Sequence[str], group: Sequence[RowResult],
           rows: Sequence[RowResult], budget: int = DEFAULT_BUDGET,
           keep: int = 3, clock: CpuBudget | None = None) -> tuple[list[Candidate], int, bool]:
    """The best single edits at the given stages (deepest first, sharing one budget):
    (candidates ranked by fixes minus breaks, edits tried, budget hit: `budget` edits, or `clock` out)."""
    found: list[Candidate] = []
    tried = 0
    seen: set[tuple[str, str, str]] = set()
    reaching = {sid: [r for r in rows if sid in r.path] for sid in stage_ids}
    for stage_id, cand, edit in ((sid, c, e) for sid in stage_ids
                                 for c, e in candidate_edits(scenario, sid, group, reaching[sid])):
        affected = reaching[stage_id]
        key = (cand.where, cand.before, cand.after)
        if key in seen:
            continue
        seen.add(key)
        if tried >= budget or (clock is not None and clock.out()):
            return _best(found, keep), tried, True
        tried += 1
        try:
            edited = edit(scenario)
        except (ValueError, TypeError):
            continue
        scope = rows if cand.where.startswith("let ") else affected
        cand.fixes, broken = _score(edited, scope, group)
        cand.breaks, cand.broken_lines = len(broken), broken[:5]
        cand.group_size = len(group)
        if cand.fixes:
            found.append(cand)
    return _best(found, keep), tried, False


def _best(found: list[Candidate], keep: int) -> list[Candidate]:
    """Most rows explained net of rows broken; among equals the smallest kind of edit first."""
    return sorted(found, key=lambda c: (-(c.fixes - c.breaks), -c.fixes, _KIND_RANK.get(c.kind, 9), c.where,
                                        _significant_digits(c.after), c.after))[:keep]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _significant_digits(text: str) -> int:
    """How many significant digits the numbers of an edit have: among equals, the roundest first."""
    return sum(len(n.replace(".", "").strip("0")) for n in re.findall(r"\d+(?:\.\d+)?", text))


_KIND_RANK = {"operator": 0, "flip": 1, "arm-order": 2, "match-value": 2, "drop": 2, "threshold": 3}


# ---------------------------------------------------------------------------------------------
# The report


class Group(BaseModel):
    stage: str
    expected: str
    decided: str
    rows: list[int]
    candidates: list[Candidate] = Field(default_factory=list)
    tried: int = 0
    budget_hit: bool = False
    out_of_time: bool = False  # the search stopped at the command's CPU budget (`budget_hit` too)
    stopped: list[str] = Field(default_factory=list)  # where rows that lack a value stopped (`stage (Var)`)


def _mismatch_labels(row: RowResult, want: str, got: str) -> tuple[str, str]:
    """The expected and decided labels of a row that disagrees: the Actions, and when they are the same,
    the outputs that differ (`Plan (Installments 6)` against `Plan (Installments 3)`)."""
    if want != got:
        return want, got
    differ = [k for k, v in row.expected.items() if k != "Action" and not _same(row.finals.get(k), v)]
    if not differ:
        return want, got
    return (f"{want} ({', '.join(f'{k} {row.expected[k]}' for k in differ)})",
            f"{got} ({', '.join(f'{k} {row.finals.get(k)}' for k in differ)})")


class Report(BaseModel):
    file: str
    data: str
    total: int
    correct: int
    accuracy: float
    labels: list[str]
    confusion: dict[str, dict[str, int]]  # expected → decided → count
    errors: list[dict[str, Any]]
    groups: list[Group]
    unmapped: list[str]
    suggest: dict[str, list[str]] = Field(default_factory=dict)  # unmapped variable -> columns named like it
    expect: dict[str, str] = Field(default_factory=dict)  # output -> the column holding its expected value
    found: list[str] = Field(default_factory=list)  # outputs whose column was found by name
    path_column: str | None = None
    paths_compared: int = 0  # decided rows with an expected path
    paths_agree: int = 0
    path_mismatches: list[dict[str, Any]] = Field(default_factory=list)  # line, expected, decided
    stages: list[str] = Field(default_factory=list)  # the SOP's stage ids (to name unknown ones)


def _wrong_way(row: RowResult, reach: Mapping[str, set[str]]) -> bool:
    """Whether a row that stopped for a missing value took a wrong way before: no value of what it lacks
    could lead from where it stopped to the expected action (a data gap is only an error when it could)."""
    want = row.expected.get("Action")
    return (row.needs is not None and bool(row.path) and want is not None
            and want not in reach.get(row.path[-1], set()))


def _link_shared(groups: Sequence[Group]) -> None:
    """The same edit found for several groups is one fix: each copy lists every group it explains."""
    where: dict[tuple[str, str, str], list[int]] = {}
    for number, g in enumerate(groups, 1):
        for c in g.candidates:
            where.setdefault(c.key, []).append(number)
    for g in groups:
        for c in g.candidates:
            c.groups = where[c.key]


def row_columns(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], dict[str, list[str]]]:
    """The rows' columns, and each key of nested objects with the columns holding it (one pass): what
    `plan_columns` maps variables to (`sop validate`, and `sop synth --like` reading rows the same way)."""
    columns = sorted({k for r in rows for k in r if k != "_line"})
    inside: dict[str, set[str]] = {}
    for r in rows:
        for column, value in r.items():
            if isinstance(value, dict):
                for name in value:
                    inside.setdefault(name, set()).add(column)
    return columns, {name: sorted(inside[name]) for name in sorted(inside)}


def validate(scenario: ir.Scenario, rows: Sequence[Mapping[str, Any]], *, expect: Mapping[str, str],
             mapping: Mapping[str, str] | None = None, now: str | dt.date | None = None,
             budget: int = DEFAULT_BUDGET, file: str = "", data: str = "",
             cpu_budget: float | CpuBudget = VALIDATE_CPU_BUDGET) -> Report:
    """Decide every row, compare, group the mismatches and search explaining edits. `now` is `--now`:
    the program's `now` and the day that dates in numeric columns count to. The edit search stops at
    `cpu_budget` (CPU seconds, or the command's `CpuBudget`): the group where it stopped says so, later
    groups are not searched; every row is still decided and compared."""
    clock = budget_of(cpu_budget, VALIDATE_CPU_BUDGET)
    now_text, today = reference_time(now)
    columns, nested = row_columns(rows)
    plan = plan_columns(scenario, columns, expect, mapping or {}, nested)
    results = prepare_rows(scenario, rows, plan, today, now_text)
    decide_rows(scenario, results)
    reach = _reachable_actions(scenario)
    confusion: dict[str, dict[str, int]] = {}
    errors: list[dict[str, Any]] = []
    buckets: dict[tuple[str, str, str], list[RowResult]] = {}
    routes: dict[tuple[str, str, str], list[str]] = {}
    for row in results:
        want = str(row.expected["Action"]) if "Action" in row.expected else MISSING_LABEL
        wrong_way = _wrong_way(row, reach)
        got = f"(needs {row.needs})" if wrong_way else "(error)" if row.error else str(row.finals.get("Action"))
        confusion.setdefault(want, {}).setdefault(got, 0)
        confusion[want][got] += 1
        if row.error and not wrong_way:
            errors.append({"line": row.line, "error": row.error})
        elif not row.ok:
            stages = parting_stages(scenario, row, reach)
            key = (stages[0] if stages else "-", *_mismatch_labels(row, want, got))
            buckets.setdefault(key, []).append(row)
            route = routes.setdefault(key, [])
            route += [sid for sid in stages if sid not in route]
    groups: list[Group] = []
    for (stage, want, got), members in sorted(buckets.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        group = Group(stage=stage, expected=want, decided=got, rows=[r.line for r in members],
                      stopped=sorted({f"{r.path[-1]} ({r.needs})" for r in members if r.needs and r.path}))
        if stage != "-":
            group.candidates, group.tried, group.budget_hit = search(scenario, routes[(stage, want, got)],
                                                                     members, results, budget, clock=clock)
            group.out_of_time = group.budget_hit and clock.out()
        groups.append(group)
    _link_shared(groups)
    correct = sum(1 for r in results if r.ok)
    labels = sorted({*confusion, *(g for row in confusion.values() for g in row)})
    unmapped = [v.name for v in scenario.variables.values()  # an optional or defaulted one may be left out
                if v.role != "derived" and v.name not in plan.inputs and not v.optional and v.default is None
                and not (v.name == "now" and now is not None)]
    used = {*plan.inputs.values(), *plan.expect.values(), plan.path}
    free = [c for c in columns if c not in used]
    suggest = {name: close for name in unmapped if name != NOW and (close := similar_columns(name, free))}
    compared = [r for r in results if r.expected_path is not None and r.error is None]
    mismatches = [{"line": r.line, "expected": r.expected_path, "decided": r.path}
                  for r in compared if r.expected_path != r.path]
    return Report(file=file, data=data, total=len(results), correct=correct,
                  accuracy=correct / len(results) if results else 0.0, labels=labels, confusion=confusion,
                  errors=errors, groups=groups, unmapped=unmapped, suggest=suggest, expect=plan.expect,
                  found=plan.found,
                  path_column=plan.path, paths_compared=len(compared),
                  paths_agree=len(compared) - len(mismatches), path_mismatches=mismatches,
                  stages=sorted(scenario.stages) if mismatches else [])


def render_text(report: Report, *, max_rows: int = 10) -> str:
    out = [f"{report.data}: {report.correct}/{report.total} rows agree with {report.file} "
           f"(accuracy {report.accuracy:.1%})"]
    if report.found:
        out.append("expected finals read from " + ", ".join(f"`{report.expect[n]}` ({n})" for n in report.found)
                   + " (found by name; --expect OUTPUT=COLUMN chooses)")
    columns = [n for n in report.unmapped if n != NOW]
    if columns:
        out.append(f"no column for: {', '.join(columns)} (rows that need them fail; use --map VAR=COLUMN)")
        for name in columns:
            if report.suggest.get(name):
                maps = " or ".join(f"--map {_shell_word(f'{name}={c}')}" for c in report.suggest[name])
                out.append(f"  did you mean {maps}?")
    if NOW in report.unmapped:
        out.append(f"no value for `{NOW}`, the program's reference time (never the clock): give --now "
                   f"{NOW_EXAMPLE} (or --map {NOW}=COLUMN); rows that read it fail")
    if report.path_column is not None:
        out.append(f"paths: {report.paths_agree}/{report.paths_compared} decided rows follow the stage path in "
                   f"`{report.path_column}`")
        for m in report.path_mismatches[:max_rows]:
            unknown = [s for s in m["expected"] if s not in report.stages]
            out.append(f"  line {m['line']}: expected {' → '.join(m['expected']) or '(empty)'}, "
                       f"decided {' → '.join(m['decided'])}"
                       + (f" ({', '.join(f'`{s}`' for s in unknown)} not a stage)" if unknown else ""))
        if len(report.path_mismatches) > max_rows:
            out.append(f"  ... {len(report.path_mismatches) - max_rows} more (--format json lists all)")
    out += ["", "confusion (rows: expected, columns: decided)"]
    cols = report.labels
    head = max([len("expected \\ decided"), *(len(c) for c in cols)]) + 2
    widths = [len(c) + 2 for c in cols]
    out.append("expected \\ decided".ljust(head) + "".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for want in cols:
        if want in report.confusion:
            counts = [str(report.confusion[want].get(c, 0) or ".") for c in cols]
            out.append(want.ljust(head) + "".join(n.rjust(w) for n, w in zip(counts, widths, strict=True)))
    if report.errors:
        count = len(report.errors)
        out += ["", f"{count} row{'' if count == 1 else 's'} could not be decided:"]
        for err in report.errors[:max_rows]:
            out.append(f"  line {err['line']}: {err['error']}")
        reasons = Counter(e["error"].split(" (")[0] for e in report.errors)
        if len(report.errors) > max_rows:
            out.append("  ... most common: " + "; ".join(f"{n}x {r}" for r, n in reasons.most_common(3)))
    for number, g in enumerate(report.groups, 1):
        lines = ", ".join(str(n) for n in g.rows[:max_rows]) + (" ..." if len(g.rows) > max_rows else "")
        where = f"at stage {g.stage}" if g.stage != "-" else "no stage on the route can reach the expected action"
        rows = "1 row" if len(g.rows) == 1 else f"{len(g.rows)} rows"
        out += ["", f"{number}. {rows} expected {g.expected}, decided {g.decided}: parting {where} "
                    f"({Path(report.data).name} line{'s' if len(g.rows) > 1 else ''} {lines})"]
        if g.stopped:
            out.append(f"  the route stops at {', '.join(g.stopped)}: a value these rows lack, but none of its "
                       f"values leads to {g.expected} from there")
        for c in g.candidates:
            out.append(f"  - {_shared(c, number)}")
        if g.stage != "-" and not g.candidates and not g.out_of_time:
            out.append(f"  no single edit of {g.stage} explains these rows ({g.tried} tried)")
        if g.out_of_time:
            out.append(f"  (search stopped at its CPU budget at stage {g.stage} after {g.tried} candidate edits; "
                       "raise --cpu-budget)")
        elif g.budget_hit:
            out.append(f"  (search stopped at the budget of {g.tried} candidate edits; raise --budget)")
    return "\n".join(out) + "\n"


def _shared(c: Candidate, number: int) -> str:
    """A candidate line: in full in the first group it explains, naming the other groups it explains too;
    in those, a reference to the first (one edit of the SOP, printed once)."""
    others = [n for n in c.groups if n != number]
    if not others:
        return c.describe()
    if c.groups[0] == number:
        return f"{c.describe()}; the same edit explains rows of group{'s' if len(others) > 1 else ''} " \
               f"{', '.join(map(str, others))}"
    return f"the edit of group {c.groups[0]} at {c.where} explains {c.fixes}/{c.group_size} here"


_MAX_SUGGEST = 5000  # columns compared for a did-you-mean (a JSON file may have any number of keys)
_MAX_NAME = 200  # longer column names are never suggested


def similar_columns(name: str, columns: Sequence[str], limit: int = 2) -> list[str]:
    """Columns named like a variable that found no column of its own: by the folded names (case, spaces,
    `_` and `-` ignored) with difflib, or sharing a word of four letters or more (`OutageFound` and
    `outage_detected`), closest first."""
    want = _fold(name)
    words = {w.lower() for w in _words(name) if len(w) >= 4}
    scored = []
    for column in itertools.islice((c for c in columns if len(c) <= _MAX_NAME), _MAX_SUGGEST):
        ratio = difflib.SequenceMatcher(None, want, _fold(column)).ratio()
        shared = words & {w.lower() for w in _words(column)}
        if ratio >= 0.6 or shared:
            scored.append((-(ratio + 0.2 * len(shared)), column))
    return [c for _, c in sorted(scored)[:limit]]


def _did_you_mean(names: Sequence[str]) -> str:
    return f" (did you mean {' or '.join(f'`{n}`' for n in names)}?)" if names else ""


def _words(name: str) -> list[str]:
    """The words of a name: `OutageFound` → Outage, Found; `outage_detected` → outage, detected."""
    return re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)


def _shell_word(text: str) -> str:
    """`text` quoted for a shell when it needs it (a column with spaces: `--map 'Reason=Reason given'`)."""
    return shlex.quote(text)


def parse_pairs(pairs: Sequence[str], option: str) -> dict[str, str]:
    """`A=B` options into a dict (a clear message for a malformed one)."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, column = pair.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ValidateError(f"{option} {pair!r}: write NAME=COLUMN")
        out[name.strip()] = column.strip()
    return out
