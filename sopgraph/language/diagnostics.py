"""Compiler-style diagnostics: one record type, one renderer, one root error.

Every user-facing problem with a `.sop` file becomes a `Diagnostic` with a stable code, so that
tools can match on codes and people get `file:line:col`, the source line, a caret and a hint.
"""

from __future__ import annotations

import difflib
import json
import re
import unicodedata
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr

from sopgraph.errors import Error
from sopgraph.language.ir import Scenario, Span, StringType, share_fields_set

Severity = Literal["error", "warning", "info"]

# Stable codes. Never renumber; add new ones at the end of their block.
CODES: dict[str, str] = {
    # syntax and loading
    "E001": "syntax error",
    "E002": "unclosed block",
    "E003": "cannot read file",
    "E004": "include cycle",
    "E005": "invalid character",
    "E006": "expression nested too deeply",
    # names
    "E101": "undefined name",
    "E102": "duplicate declaration",
    "E103": "undefined stage",
    "E104": "undefined action",
    "E105": "undefined subflow or parameter",
    "E106": "unknown attribute",
    "E107": "undefined output",
    "E108": "not a classification field",
    "E109": "bad action arguments",
    "E110": "only system variables are observed",
    "E111": "observed variable read before it is observed",
    "E112": "a retry bound that never fires",
    # types
    "E201": "type mismatch",
    "E202": "value not in the enum",
    "E203": "empty or inverted range",
    "E204": "bad output value",
    "E205": "derived variable cycle",
    # dates, strings, optionals (issue 9 item 5)
    "E210": "invalid date, datetime or duration literal",
    "E211": "bad pattern",
    "E212": "bad optional value or default",
    "E213": "a list position past the end",
    "I210": "no example strings for a pattern",
    # flow
    "E301": "non-exhaustive branching",
    "E302": "cycle in the stage graph",
    "E303": "stage cannot reach an end",
    "E304": "no stages",
    "W301": "overlapping guards",
    "W302": "unreachable stage",
    "W303": "infeasible path",
    "W304": "branch can never be taken",
    "W305": "duplicate match value",
    "W306": "optional value read while it may be missing",
    "W307": "a retry that observes nothing: every round takes the same branches",
    "W308": "a look that nothing can change",
    "W309": "a list position that may be past the end",
    "I301": "flow analysis skipped (program too large)",
    "I302": "flow analysis incomplete (a work budget ran out or a question stayed undecided)",
    "I303": "optional-value analysis incomplete (a work budget ran out or a read stayed undecided)",
    "I304": "output-range check incomplete (its CPU budget ran out; the later assignments were not checked)",
    # hygiene
    "W401": "unused declaration",
    "W402": "missing description",
    # user profiles (NAME.profile.yaml beside a .sop; see sopgraph/cases/profiles.py)
    "E601": "cannot read profile (YAML syntax or file error)",
    "E602": "unknown key in profile",
    "E603": "invalid profile value",
    "E604": "undefined variable in profile",
    "E605": "value not in the variable's domain",
    "E606": "bad condition expression",
    "E607": "intent can never hold",
    "E608": "undefined persona or action in profile",
    "E609": "duplicate name in profile",
    "E610": "profile is for another scenario",
    "W601": "intent reaches no feasible path",
    "W602": "feasible path reached by no intent",
    "W603": "action named in pushes_for is not risky",
    "W604": "strong-intensity intent without pushes_for",
    "I605": "profile check incomplete (its CPU budget ran out; the later paths were not checked)",
    "W403": "repeated entry",
}


class SourceLines:
    """The lines of a source text (`text.split("\n")[i]`: Lark counts only \n as a line break), kept as
    the text and an array of line starts. Why: a split 16 MB file is 725k strings, ~55 MB more at
    the peak of a large check; the starts take 6 MB."""

    def __init__(self, text: str):
        self.text = text
        self.starts = array("q", [0])
        self.starts.extend(m.end() for m in _NEWLINE.finditer(text))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> str:
        if index < 0:
            index += len(self.starts)
        start = self.starts[index]  # IndexError past the end, as a list
        end = self.starts[index + 1] - 1 if index + 1 < len(self.starts) else len(self.text)
        return self.text[start:end]


_NEWLINE = re.compile("\n")


class Diagnostic(BaseModel):
    """One problem found in a program."""

    code: str
    severity: Severity
    message: str
    span: Span | None = None
    hint: str | None = None
    witness: dict[str, Any] | None = None
    notes: list[str] = Field(default_factory=list)
    # witness keys whose values are free text (`string` variables): shown quoted, so `Ref="text"` is not
    # read as an enum value; set by the checker, which knows the types (`mark_text_values`)
    _text_keys: frozenset[str] = PrivateAttr(default=frozenset())

    def model_post_init(self, context: Any, /) -> None:
        share_fields_set(self)  # a huge program can have 100k diagnostics (see `share_fields_set`)

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def render(self, sources: dict[str, str] | None = None, *,
               split: dict[str, SourceLines] | None = None) -> str:
        """Render like rustc: header, source line, caret, hint. `split` caches each source's lines
        between calls (see `render_all`): rendering k diagnostics of a large file splits it once,
        not k times."""
        span = self.span
        where = f"{span}: " if span and span.line else ""
        lines = [f"{where}{self.severity}[{self.code}]: {self.message}"]
        text = (sources or {}).get(span.file) if span else None
        if text is not None and span and span.line:
            src_lines = split.get(span.file) if split is not None else None
            if src_lines is None:
                src_lines = SourceLines(text)
                if split is not None:
                    split[span.file] = src_lines
            line, col = span.line, span.col
            if 0 < line <= len(src_lines):
                width = span.end_col - col if span.end_line == line and span.end_col > col else 1
                gutter = f"{line:>4} | "
                shown, caret = _source_and_caret(src_lines[line - 1].replace("\t", " "), col - 1, width)
                lines.append(gutter + shown)
                lines.append(" " * len(gutter) + caret)
        if self.witness:
            shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False) if k in self._text_keys else _show(v)}"
                              for k, v in self.witness.items())
            lines.append(f"  = example: {shown}")
        for note in self.notes:
            lines.append(f"  = note: {note}")
        if self.hint:
            lines.append(f"  = hint: {self.hint}")
        return "\n".join(lines)


SOURCE_WIDTH = 160  # characters of a source line shown under a diagnostic; a longer one is cut around the caret


def _source_and_caret(src: str, start: int, width: int) -> tuple[str, str]:
    """The source line as shown and the caret line under it (`start`: the 0-based character where the
    span starts, `width`: its characters on this line). A line longer than `SOURCE_WIDTH` (a profile
    condition of 5,000 `not`s is one line) is shown as the part around the caret with `… ` / ` …` at
    the cut ends; the caret stays under the same characters."""
    width = max(1, min(width, max(1, len(src) - start)))
    cut_left = cut_right = ""
    if len(src) > SOURCE_WIDTH:
        lo = max(0, min(start - SOURCE_WIDTH // 3, len(src) - SOURCE_WIDTH))
        hi = lo + SOURCE_WIDTH
        cut_left, cut_right = ("… " if lo > 0 else ""), (" …" if hi < len(src) else "")
        src, start = src[lo:hi], start - lo
        width = max(1, min(width, len(src) - start))
    lead, marked = cut_left + src[:start], src[start:start + width]
    if src.isascii():  # one column per character (most lines); on screen, wide (CJK) characters take two
        caret = " " * len(lead) + "^" * max(1, len(marked))
    else:
        caret = " " * _columns(lead) + "^" * max(1, _columns(marked))
    return cut_left + src + cut_right, caret


QUOTE_MAX = 120  # characters of user text (a condition, an expression, a value) quoted in a message


def clip(text: str, limit: int = QUOTE_MAX) -> str:
    """User text as a message quotes it: on one line, and at most `limit` characters, its start and its
    end with ` … ` between. Every message that quotes a condition, an expression or a value the user
    wrote goes through here: a condition of 5,000 `not`s quoted whole made a 20,000-character
    message. The span (and the caret under the source line) still says exactly where the problem is."""
    if "\n" in text or "\r" in text:
        text = _LINE_BREAKS.sub(" ", text)
    if len(text) <= limit:
        return text
    keep = max(2, limit - 3)
    head = keep * 2 // 3  # the start reads first: it says what the text is
    start, end = text[:head], text[len(text) - (keep - head):]
    if (cut := start.rfind(" ", max(0, head - 16))) > 0:  # cut between words when one ends near the cut
        start = start[:cut]
    if 0 <= (cut := end.find(" ", 0, 16)) < len(end) - 1:
        end = end[cut + 1:]
    return start.rstrip() + " … " + end.lstrip()


_LINE_BREAKS = re.compile(r"[ \t]*[\r\n]+[ \t]*")


def _columns(text: str) -> int:
    """Terminal columns of `text`: East Asian wide and full-width characters take two."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def text_names(scenario: Scenario) -> frozenset[str]:
    """The scenario's variables whose values are free text (`string`): quoted when an example shows them."""
    return frozenset(n for n, v in scenario.variables.items() if isinstance(v.type, StringType))


def mark_text_values(diagnostics: list[Diagnostic], scenario: Scenario) -> None:
    """Tell each diagnostic with an example which of its values are free text (see `_text_keys`)."""
    names: frozenset[str] | None = None
    for d in diagnostics:
        if d.witness:
            names = text_names(scenario) if names is None else names
            if not names.isdisjoint(d.witness):
                object.__setattr__(d, "__pydantic_private__", {**(d.__pydantic_private__ or {}), "_text_keys": names})


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:  # a missing optional value, as an input gives it
        return "null"
    if isinstance(value, (list, dict)):  # a list or record value, as it is written in an input
        return json.dumps(value, ensure_ascii=False)
    return str(value)


class SopError(Error):
    """Problems in a user's program: it carries diagnostics, never a traceback; `code` is the first
    error's code (the first diagnostic's when none is an error)."""

    def __init__(self, diagnostics: Sequence[Diagnostic], sources: dict[str, str] | None = None):
        self.diagnostics = list(diagnostics)
        self.sources = sources or {}
        first = next((d for d in self.diagnostics if d.is_error), self.diagnostics[0] if self.diagnostics else None)
        self.code = first.code if first is not None else None
        super().__init__(self.render())

    def render(self) -> str:
        return "\n\n".join(render_all(self.diagnostics, self.sources))


def render_all(diagnostics: Iterable[Diagnostic], sources: dict[str, str] | None = None) -> Iterator[str]:
    """Each diagnostic rendered, each source split into lines once for all of them (thousands of
    warnings on a large profile must not re-split the file for each: linear, not quadratic)."""
    split: dict[str, SourceLines] = {}
    for diag in diagnostics:
        yield diag.render(sources, split=split)


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A 'did you mean' hint for a misspelt name, or None when nothing is close."""
    pool = list(candidates)
    match = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    if not match:
        lowered = {c.lower(): c for c in pool}
        if name.lower() in lowered:
            match = [lowered[name.lower()]]
    return f"did you mean `{match[0]}`?" if match else None


_new = object.__new__
_set = object.__setattr__


def _diagnostic(code: str, severity: Severity, message: str, span: Span | None, hint: str | None,
                kw: dict[str, Any]) -> Diagnostic:
    """`Diagnostic(...)`; built without validation when every value already has its field's type and
    nothing else is given (the commonest case: a large file has 100k warnings, ~2 us each to validate).
    The result is equal to the validated one: the same values, defaults and shared fields set."""
    if (kw or type(code) is not str or type(message) is not str or (span is not None and type(span) is not Span)
            or (hint is not None and type(hint) is not str)):
        return Diagnostic(code=code, severity=severity, message=message, span=span, hint=hint, **kw)
    diag = _new(Diagnostic)
    _set(diag, "__dict__", {"code": code, "severity": severity, "message": message, "span": span, "hint": hint,
                            "witness": None, "notes": []})
    _set(diag, "__pydantic_extra__", None)
    _set(diag, "__pydantic_private__", _DEFAULT_PRIVATE)  # shared: 100k diagnostics, one dict
    share_fields_set(diag)
    return diag


# the private attributes with their defaults, as `__init__` sets them; shared by the diagnostics built
# above, which is safe because private attributes are only ever replaced whole (`mark_text_values`)
_DEFAULT_PRIVATE = {name: attr.get_default() for name, attr in Diagnostic.__private_attributes__.items()}


def error(code: str, message: str, span: Span | None, hint: str | None = None, **kw: Any) -> Diagnostic:
    return _diagnostic(code, "error", message, span, hint, kw)


def warning(code: str, message: str, span: Span | None, hint: str | None = None, **kw: Any) -> Diagnostic:
    return _diagnostic(code, "warning", message, span, hint, kw)


def info(code: str, message: str, span: Span | None, hint: str | None = None, **kw: Any) -> Diagnostic:
    return _diagnostic(code, "info", message, span, hint, kw)


def sort_key(diag: Diagnostic) -> tuple:
    span = diag.span or Span()
    return (span.file, span.line, span.col, diag.code, diag.message)
