"""The raw program of one file (before includes, subflows and names are resolved) and the words of
the language: shared by the Lark parser (`parse`) and its fast path (`fastparse`)."""

from __future__ import annotations

import re
from typing import Any

from sopgraph.language import ir

KEYWORDS = ["scenario", "include", "start", "field", "system", "let", "action", "output", "stage", "subflow", "use", "as", "classify", "match", "when", "otherwise", "do", "and", "or", "not", "in", "true", "false", "case", "count", "min", "max", "bool", "int", "float", "unit", "money", "hidden", "observe", "any", "all", "len", "where"]
# Words with a meaning in one place only (`type X = …`, `up to N times`, the types `date`, `string`, …,
# `X matches "p"`, `list[..n] of T`, `record {…}`): still usable as names.
CONTEXT_KEYWORDS = ["type", "up", "to", "times", "date", "datetime", "duration", "string", "matches", "list",
                    "of", "record", "sum", "for", "open", "affects", "volatile"]
RESERVED = frozenset(KEYWORDS)


# ---------------------------------------------------------------------------------------------
# Raw program (one file) before includes/subflows are resolved


class Subflow(ir.Node):
    name: str
    params: list[str]
    stages: list[ir.Stage]
    uses: list[Use] = []


class Use(ir.Node):
    subflow: str
    instance: str
    bindings: dict[str, ir.Target]


Subflow.model_rebuild()


class Include(ir.Node):
    path: str


class ScenarioHeader(ir.Node):
    name: str
    title: str = ""
    description: str = ""
    meta: list[ir.MetaEntry] = []


class TypeDecl(ir.Node):
    """`type Signal = None | Weak | Good`: an enum (or a record) reused by several declarations."""

    name: str
    type: ir.EnumType | ir.RecordType
    description: str = ""


class StartDecl(ir.Node):
    stage: str


class Program(ir.Node):
    """One parsed file: its top-level items in source order."""

    file: str
    items: list[Any]


def unquote(tok: str) -> str:
    """The value of a STRING or LONG_STRING token (escapes resolved; a long string's edge newlines dropped)."""
    if tok.startswith('"""'):
        return tok[3:-3].strip("\n")
    body = tok[1:-1]
    if "\\" not in body:
        return body  # no escapes: most strings (a stage title each)
    return _ESCAPE.sub(_unescape, body)


_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "t": "\t"}


def _unescape(m: re.Match[str]) -> str:
    return _ESCAPES.get(m.group(1), m.group(1))


def number(text: str, negative: bool = False) -> int | float:
    """The value of a NUMBER token: an int unless it has a decimal point."""
    value: int | float = float(text) if "." in text else int(text)
    return -value if negative else value


def value_meaning(var: ir.Variable, value: Any) -> str | None:
    """What a value means, read from the variable's description when it says `Value = meaning`
    (the convention of field descriptions: "Lost = cannot find the card; Stolen = …")."""
    if not var.description or not isinstance(value, str) or not value:
        return None
    pattern = rf"(?<![\w.]){re.escape(value)}\s*=\s*(.+?)(?:;|\.(?=\s+[A-Z(])|\.?\s*$)"
    match = re.search(pattern, var.description)
    return match.group(1).strip() if match else None
