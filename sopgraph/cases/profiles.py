"""User profiles: who talks to the agent, what they want, and how hard they push — without code.

A profile is a YAML file beside a scenario (`<name>.profile.yaml`). It declares the scenario's user intents
(each with the field values and system conditions it implies), optionally personas, adversarial-intensity
descriptions, per-variable hints (`user_knows`, plausible `values`) and languages. Everything but the intents
has shipped defaults (`sopgraph/data/personas.yaml`), and the intents themselves are optional: a scenario with
only its `.sop` still synthesizes (every path then gets a generated intent).

Bad input never raises a traceback: every problem becomes a `Diagnostic` located at `file:line:col` of the
offending key or value (the YAML is composed to keep each node's position).
"""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from sopgraph.cases.patterns import random_match
from sopgraph.cases.profilefile import PROFILE_SUFFIX, profile_path_for, sop_path_for  # noqa: F401 - re-exported
from sopgraph.language import ir, scalars
from sopgraph.language.compile import reads
from sopgraph.language.diagnostics import (
    CODES,
    Diagnostic,
    SopError,
    clip,
    did_you_mean,
    error,
    sort_key,
    warning,
)
from sopgraph.language.parse import parse_text, resolve_expression
from sopgraph.logic import domain
from sopgraph.logic.checker import condition_type_errors
from sopgraph.logic.lower import LowerError, analysis_form, lower_condition, structured
from sopgraph.logic.unroll import UnrollError
from sopgraph.records import INTENSITIES, Intensity, Persona

PROFILE_VERSION = 1

# Stable diagnostic codes of profiles (E6xx errors, W6xx warnings). Never renumber.
PROFILE_CODES: dict[str, str] = {code: text for code, text in CODES.items() if code[1] == "6"}

Scalar = bool | int | float | str
ConditionValue = Scalar | list[Scalar] | None  # None (YAML `null`): the optional variable is missing


# ---------------------------------------------------------------------------------------------
# The file format (what users write). Every model forbids unknown keys.


MAX_WEIGHT = 1e6  # intent/persona weights are relative; larger ones only overflow sums


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class IntentSpec(_Strict):
    """One user intent as written in the profile."""
    description: str = Field("", description="What the user wants, in words the user simulator is given.")
    intensity: Intensity = Field("zero", description="Default adversarial intensity (used by `--intensity intent`).")
    requires: dict[str, ConditionValue] = Field(
        default_factory=dict,
        description="variable → value, list of values, or a condition in .sop syntax (`> 0`, `in {A, B}`, "
                    "or a whole expression). All must hold.")
    excludes: dict[str, ConditionValue] = Field(
        default_factory=dict, description="variable → value(s) or condition that must NOT hold.")
    when: str | list[str] | None = Field(
        None, description="Extra condition(s) in .sop expression syntax, for constraints across variables.")
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT, allow_inf_nan=False,
                          description="Relative weight when intents are balanced.")
    pushes_for: list[str] = Field(
        default_factory=list,
        description="Risky actions an adversarial user with this intent pushes for, most plausible first; "
                    "an explicit empty list means this user pushes for none.")


class PersonaSpec(Persona):
    """A persona as written in a profile or the library (a `Persona` plus selection hints)."""
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT, allow_inf_nan=False)
    intensities: list[Intensity] | None = Field(
        None, description="Intensities this persona fits; omitted = all.")

    def to_persona(self) -> Persona:
        return Persona(**self.model_dump(include=set(Persona.model_fields)))


class VariableSpec(_Strict):
    """Per-variable hints for synthesis."""
    user_knows: bool | None = Field(
        None, description="System variables only: whether the customer knows this fact (default: false).")
    values: list[Scalar] | None = Field(
        None, description="Plausible values to draw from when the variable is free (e.g. typical fees); they "
                          "also prove the paths, and cases keep them as listed.")
    examples: list[Scalar] | None = Field(
        None, description="Example values; each case draws one where its decision leaves the variable free.")
    pattern: str | None = Field(
        None, description="Strings only: each case gets a fresh string of this pattern (`AC-[0-9]{6}`).")
    min: float | str | None = Field(
        None, description="Numbers, dates, datetimes: the lowest value a case draws (a date as text).")
    max: float | str | None = Field(
        None, description="Numbers, dates, datetimes: the highest value a case draws (a date as text).")
    distribution: Literal["uniform", "log-uniform", "normal"] | None = Field(
        None, description="How values between `min` and `max` are drawn (default uniform; `normal` is centred "
                          "between them, `log-uniform` suits amounts spanning orders of magnitude).")

    @field_validator("min", "max", mode="before")
    @classmethod
    def _dates_as_text(cls, value: Any) -> Any:
        """YAML reads an unquoted `2026-01-31` as a date: the same bound as the quoted text."""
        return value.isoformat() if isinstance(value, dt.date) else value


class Generator(BaseModel):
    """How a variable's value is drawn for each case where its decision leaves it free: declared in the
    profile (`examples`, `pattern`, `min`/`max`) or fitted from real rows (`sop synth --like`). Numbers and
    moments are in the engine's form (dates and datetimes as seconds)."""
    examples: list[Scalar] = Field(default_factory=list)
    weights: list[float] = Field(default_factory=list)  # one per example (empty: equally likely)
    pattern: str | None = None
    lo: float | None = None
    hi: float | None = None
    distribution: Literal["uniform", "log-uniform", "normal"] = "uniform"
    quantiles: list[float] = Field(default_factory=list)  # fitted: values at equal steps of probability
    decimals: int | None = None  # numbers: rounded to this many decimals (None: the type's own rule)
    step: int | None = None  # dates, datetimes, durations: drawn to a whole number of these seconds (a day, a minute)
    source: str = "profile"


class ProfileFile(_Strict):
    """The top level of `<scenario>.profile.yaml`."""
    scenario: str | None = Field(None, description="Scenario name; must match the .sop when given.")
    version: int = Field(PROFILE_VERSION, description="Profile format version.")
    description: str = ""
    intents: dict[str, IntentSpec] = Field(default_factory=dict)
    personas: list[str | PersonaSpec] | None = Field(
        None, description="Library persona names and/or inline personas; omitted = the whole library.")
    intensities: dict[Intensity, str] = Field(
        default_factory=dict, description="Behaviour descriptions overriding the shipped ones.")
    variables: dict[str, VariableSpec] = Field(default_factory=dict)
    languages: list[str] | None = Field(None, description="Languages to mix; omitted = each persona's own.")


class Library(_Strict):
    """The shipped defaults (`sopgraph/data/personas.yaml`)."""
    personas: list[PersonaSpec]
    intensities: dict[Intensity, str]


def profile_json_schema() -> dict[str, Any]:
    """JSON Schema of the profile file (for `sop schema profile` and editors)."""
    schema = ProfileFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "sopgraph user profile (<scenario>.profile.yaml)"
    return schema


# ---------------------------------------------------------------------------------------------
# The resolved profile (checked against a scenario)


class Condition(BaseModel):
    """One constraint of an intent: `expr` must evaluate to `truth`."""
    model_config = ConfigDict(arbitrary_types_allowed=True)

    expr: ir.Expr
    truth: bool = True
    text: str  # human form, e.g. `Penalty > 0` or `not (CreditLevel == High)`
    span: ir.Span = ir.NO_SPAN


class Intent(BaseModel):
    name: str
    description: str = ""
    intensity: Intensity = "zero"
    conditions: list[Condition] = Field(default_factory=list)
    weight: float = 1.0
    pushes_for: list[str] = Field(default_factory=list)
    pushes_declared: bool = False  # `pushes_for` written (even `[]`): synthesis must not guess a push
    span: ir.Span = ir.NO_SPAN
    generated: bool = False

    def describe_conditions(self) -> str:
        return "; ".join(c.text for c in self.conditions) or "no conditions"


class Profile(BaseModel):
    """A profile resolved against one scenario; what `synth` consumes."""
    scenario: str
    file: str | None = None
    description: str = ""
    intents: dict[str, Intent] = Field(default_factory=dict)
    personas: list[PersonaSpec]
    intensities: dict[str, str]
    user_knows: dict[str, bool]  # every system variable
    sample_values: dict[str, list[Scalar]] = Field(default_factory=dict)
    generators: dict[str, Generator] = Field(default_factory=dict)  # per variable (see `Generator`)
    languages: list[str] | None = None
    intents_span: ir.Span | None = None  # where `intents:` is written (diagnostics about coverage)
    sources: dict[str, str] = Field(default_factory=dict, exclude=True)


# ---------------------------------------------------------------------------------------------
# Library


def library_path() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "personas.yaml"


@lru_cache(maxsize=1)
def library() -> Library:
    """The shipped persona library and intensity descriptions (validated once)."""
    data = yaml.safe_load(library_path().read_text(encoding="utf-8"))
    return Library.model_validate(data)


# ---------------------------------------------------------------------------------------------
# YAML with positions


class _Doc:
    """Plain data from YAML plus the position of every key and value, addressed by path tuples."""
    def __init__(self, file: str):
        self.file = file
        self.key_marks: dict[tuple, yaml.Mark] = {}
        self.value_marks: dict[tuple, tuple[yaml.Mark, yaml.Mark, str | None]] = {}
        self.duplicates: list[tuple[tuple, yaml.Mark]] = []
        # condition text → its parsed, name-resolved expression (see `parse_expression`'s `memo`)
        self.expressions: dict[str, Any] = {}

    def span(self, path: tuple, *, key: bool = False) -> ir.Span:
        """Span of the key (if `key`) or of the value at `path`, falling back to the nearest parent."""
        p = tuple(path)
        while True:
            if key and p in self.key_marks:
                m = self.key_marks[p]
                return ir.Span(file=self.file, line=m.line + 1, col=m.column + 1, end_line=m.line + 1,
                               end_col=m.column + 1 + len(str(p[-1])))
            if p in self.value_marks:
                start, end, _ = self.value_marks[p]
                end_col = end.column + 1 if end.line == start.line else start.column + 2
                return ir.Span(file=self.file, line=start.line + 1, col=start.column + 1,
                               end_line=start.line + 1, end_col=end_col)
            if p in self.key_marks:
                m = self.key_marks[p]
                return ir.Span(file=self.file, line=m.line + 1, col=m.column + 1)
            if not p:
                return ir.Span(file=self.file, line=1, col=1)
            p = p[:-1]

    def quoted(self, path: tuple) -> bool:
        entry = self.value_marks.get(tuple(path))
        return bool(entry and entry[2] in ("'", '"'))

    def walk(self, node: yaml.Node, path: tuple) -> None:
        style = getattr(node, "style", None) or None  # libyaml gives plain scalars "", PyYAML None
        self.value_marks[path] = (node.start_mark, node.end_mark, style)
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
                sub = path + (key,)
                if key in seen:
                    self.duplicates.append((sub, key_node.start_mark))
                seen.add(key)
                self.key_marks[sub] = key_node.start_mark
                self.walk(value_node, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.walk(item, path + (i,))


MAX_PROFILE_BYTES = 4 * 1024 * 1024  # a profile larger than this is refused before parsing
MAX_YAML_DEPTH = 64  # nesting of mappings/sequences
MAX_YAML_ALIASES = 200  # `*alias` uses: sharing is fine, a billion-laughs document is not
MAX_YAML_NODES = 500_000  # nodes once aliases are expanded (what validation walks)


class _YamlTooBig(Exception):
    """The document breaks one of the safe-loading limits; `str()` says which."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with limits on nesting depth and alias uses (checked while composing,
    so a deep or exploding document fails fast instead of recursing or allocating without end)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _YamlTooBig(f"more than {MAX_YAML_ALIASES} aliases (`*name`)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _YamlTooBig(f"nested more than {MAX_YAML_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(node: yaml.Node, limit: int) -> int:
    """Nodes in the document with aliases expanded (stops counting past `limit`)."""
    count = 0
    stack = [node]
    while stack and count <= limit:
        n = stack.pop()
        count += 1
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack += (k, v)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return count


def decode_profile(data: bytes, file: str) -> tuple[str | None, list[Diagnostic]]:
    """Profile bytes as text, or a located E601 naming the encoding problem (never a traceback)."""
    if len(data) > MAX_PROFILE_BYTES:
        return None, [error("E601", f"the profile is too large ({len(data):,} bytes; at most "
                                    f"{MAX_PROFILE_BYTES:,})", ir.Span(file=file))]
    try:
        return data.decode("utf-8"), []
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return None, [error("E601", f"the profile is not UTF-8 text (byte 0x{data[exc.start]:02x})",
                            ir.Span(file=file, line=line, col=col), "save the file as UTF-8")]


def read_profile_text(path: str | Path) -> tuple[str | None, list[Diagnostic]]:
    """Read a profile file safely (size limit first, encoding errors named)."""
    file = str(path)
    try:
        p = Path(path)
        if p.stat().st_size > MAX_PROFILE_BYTES:
            return None, [error("E601", f"the profile is too large ({p.stat().st_size:,} bytes; at most "
                                        f"{MAX_PROFILE_BYTES:,})", ir.Span(file=file))]
        with p.open("rb") as fh:
            data = fh.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        return None, [error("E601", f"cannot read profile: {exc.strerror or exc}", ir.Span(file=file))]
    return decode_profile(data, file)


def _load_bounded(loader: Any) -> tuple[Any, Any]:
    """(root node, plain data) of a document, within the node limit (the loader enforces depth and aliases)."""
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise _YamlTooBig(f"its aliases expand to more than {MAX_YAML_NODES:,} nodes")
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return node, data


_CLoader: Any = getattr(yaml, "CSafeLoader", None)  # libyaml, when PyYAML was built with it

_MAP_TAG, _SEQ_TAG, _STR_TAG = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:str"
_SCALAR_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "timestamp", "binary"))
_KEY_TAGS = frozenset(("tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"))  # `<<` and `=` keys
_NO_KEY = object()


class _Unsupported(Exception):
    """Something the one-pass loader leaves to the composing loader: a YAML error, a broken limit, a merge
    key, a tag other than the plain scalars' and the default mapping/sequence, a non-scalar key, a
    duplicate anchor or an alias of an unfinished node. That loader then loads or reports it as always."""


class _Frame:
    """A mapping or sequence being built: its data, path, start and, for a mapping, the pending key."""
    __slots__ = ("is_map", "data", "path", "start", "anchor", "log_at", "size_at", "seen", "key", "raw")

    def __init__(self, is_map: bool, data: Any, path: tuple, start: Any, anchor: str | None, log_at: int,
                 size_at: int) -> None:
        self.is_map, self.data, self.path, self.start, self.anchor = is_map, data, path, start, anchor
        self.log_at, self.size_at = log_at, size_at
        self.seen: set[str] = set()
        self.key: Any = _NO_KEY
        self.raw = ""


class _Anchor:
    """A finished anchored node: its data, and what an alias of it repeats: the node count, and the marks
    recorded under it (a scalar: its own; a collection: `log[start:end]`, paths relative to `plen`)."""
    __slots__ = ("data", "scalar", "raw", "tag", "marks", "size", "plen", "start", "end")

    def __init__(self, data: Any, scalar: bool, raw: str = "", tag: str = "", marks: tuple = (), size: int = 1,
                 plen: int = 0, start: int = 0, end: int = 0) -> None:
        self.data, self.scalar, self.raw, self.tag, self.marks = data, scalar, raw, tag, marks
        self.size, self.plen, self.start, self.end = size, plen, start, end


class _OnePassLoader:
    """Plain data and the `_Doc` positions of one YAML document, built in one flat pass over a parser's
    events (libyaml's C parser when present): the safe-loading limits (depth, aliases, nodes with aliases
    expanded) are enforced while building, and the result is exactly what composing the document,
    constructing it with PyYAML's safe constructor and `_Doc.walk` give, ~3x faster on a large profile.
    Anything else raises `_Unsupported` (see there)."""

    def __init__(self, events: Any, file: str) -> None:
        self.get_event = events.get_event
        self.doc = _Doc(file)
        self.resolver = Resolver()
        self.constructor = SafeConstructor()
        self.stack: list[_Frame] = []
        self.anchors: dict[str, _Anchor | None] = {}  # None: a collection still being built
        self.log: list[tuple] = []  # marks recorded in anchored collections, in `_Doc.walk` order
        self.size = self.aliases = 0
        self.tags: dict[str, str] = {}  # plain scalar text → its resolved tag, for this document
        self.open_anchors = 0  # anchored collections being built: only their marks are logged
        self.root: Any = None

    def load(self) -> tuple[Any, _Doc]:
        get, stack = self.get_event, self.stack
        if self.resolver.yaml_path_resolvers or type(get()) is not yaml.StreamStartEvent:
            raise _Unsupported("path resolvers")  # (registered by some library: the composer applies them)
        event = get()
        if type(event) is yaml.StreamEndEvent:
            return None, self.doc
        if type(event) is not yaml.DocumentStartEvent:
            raise _Unsupported("no document")
        while True:
            event = get()
            kind = type(event)
            if kind is yaml.ScalarEvent:
                self._scalar(event)
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                self._start(event, kind is yaml.MappingStartEvent)
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                self._end(event)
            elif kind is yaml.AliasEvent:
                self._alias(event)
            else:
                raise _Unsupported(f"unexpected {kind.__name__}")
            if not stack:
                break
        if type(get()) is not yaml.DocumentEndEvent or type(get()) is not yaml.StreamEndEvent:
            raise _Unsupported("more than one document")
        return self.root, self.doc

    def _record(self, entry: tuple) -> None:
        """Apply one mark to the document (as `_Doc.walk` would) and log it while an anchor is open."""
        what, path, mark = entry[0], entry[1], entry[2]
        if what == "v":
            self.doc.value_marks[path] = (mark, entry[3], entry[4])
        elif what == "k":
            self.doc.key_marks[path] = mark
        else:
            self.doc.duplicates.append((path, mark))
        if self.open_anchors:
            self.log.append(entry)

    def _count(self, nodes: int) -> None:
        self.size += nodes
        if self.size > MAX_YAML_NODES:
            raise _Unsupported("too many nodes")

    def _value_path(self) -> tuple | None:
        """The path of the node starting now, or None when it is a mapping key."""
        if not self.stack:
            return ()
        top = self.stack[-1]
        if not top.is_map:
            return top.path + (len(top.data),)
        return None if top.key is _NO_KEY else top.path + (top.raw,)

    def _put(self, value: Any) -> None:
        """Store a value at the position `_value_path` named."""
        if not self.stack:
            self.root = value
            return
        top = self.stack[-1]
        if top.is_map:
            top.data[top.key] = value
            top.key = _NO_KEY
        else:
            top.data.append(value)

    def _key(self, value: Any, raw: str, tag: str, mark: Any) -> None:
        """A mapping key (a scalar, or an alias of one): its mark and, when repeated, a duplicate."""
        if tag in _KEY_TAGS:
            raise _Unsupported("merge key")
        top = self.stack[-1]
        path = top.path + (raw,)
        if raw in top.seen:
            self._record(("d", path, mark))
        top.seen.add(raw)
        self._record(("k", path, mark))
        top.key, top.raw = value, raw

    def _scalar(self, event: Any) -> None:
        """A scalar: the hot path (most events), so `_count`, `_value_path`, `_put` and `_record` are inlined."""
        stack = self.stack
        if len(stack) >= MAX_YAML_DEPTH:
            raise _Unsupported("too deep")
        self.size += 1
        if self.size > MAX_YAML_NODES:
            raise _Unsupported("too many nodes")
        text, tag = event.value, event.tag
        if tag is None or tag == "!":
            if event.implicit[0]:
                tag = self.tags.get(text)
                if tag is None:
                    tag = self.tags[text] = self.resolver.resolve(yaml.ScalarNode, text, event.implicit)
            else:
                tag = _STR_TAG  # what `resolve` gives a quoted or block scalar (no path resolvers)
        if tag == _STR_TAG:
            value: Any = text
        elif tag in _SCALAR_TAGS:
            node = yaml.ScalarNode(tag, text, event.start_mark, event.end_mark, style=event.style)
            value = self.constructor.yaml_constructors[tag](self.constructor, node)
        else:
            raise _Unsupported(f"tag {tag}")
        start, end, style = event.start_mark, event.end_mark, event.style or None
        if event.anchor is not None:
            if event.anchor in self.anchors:
                raise _Unsupported("duplicate anchor")
            self.anchors[event.anchor] = _Anchor(value, True, text, tag, (start, end, style))
        if not stack:
            self._record(("v", (), start, end, style))
            self.root = value
            return
        top = stack[-1]
        if top.is_map:
            if top.key is _NO_KEY:  # a key: `_key` inlined
                if tag in _KEY_TAGS:
                    raise _Unsupported("merge key")
                path = top.path + (text,)
                if text in top.seen:
                    self._record(("d", path, start))
                top.seen.add(text)
                self.doc.key_marks[path] = start
                if self.open_anchors:
                    self.log.append(("k", path, start))
                top.key, top.raw = value, text
                return
            path = top.path + (top.raw,)
            top.data[top.key] = value
            top.key = _NO_KEY
        else:
            path = top.path + (len(top.data),)
            top.data.append(value)
        self.doc.value_marks[path] = (start, end, style)
        if self.open_anchors:
            self.log.append(("v", path, start, end, style))

    def _alias(self, event: Any) -> None:
        self.aliases += 1
        if self.aliases > MAX_YAML_ALIASES:
            raise _Unsupported("too many aliases")
        anchor = self.anchors.get(event.anchor)
        if anchor is None:
            raise _Unsupported("undefined alias, or an alias inside its own anchor")
        self._count(anchor.size)
        path = self._value_path()
        if path is None:
            if not anchor.scalar:
                raise _Unsupported("a collection as a key")
            self._key(anchor.data, anchor.raw, anchor.tag, anchor.marks[0])
            return
        if anchor.scalar:
            self._record(("v", path) + anchor.marks)
        else:
            plen = anchor.plen
            for entry in self.log[anchor.start:anchor.end]:
                self._record((entry[0], path + entry[1][plen:]) + entry[2:])
        self._put(anchor.data)

    def _start(self, event: Any, is_map: bool) -> None:
        if len(self.stack) >= MAX_YAML_DEPTH:
            raise _Unsupported("too deep")
        self._count(1)
        tag = event.tag
        if tag is not None and tag != "!" and tag != (_MAP_TAG if is_map else _SEQ_TAG):
            raise _Unsupported(f"tag {tag}")
        path = self._value_path()
        if path is None:
            raise _Unsupported("a collection as a key")
        data: Any = {} if is_map else []
        self._put(data)
        if event.anchor is not None:
            if event.anchor in self.anchors:
                raise _Unsupported("duplicate anchor")
            self.anchors[event.anchor] = None
            self.open_anchors += 1
        self.stack.append(_Frame(is_map, data, path, event.start_mark, event.anchor, len(self.log), self.size - 1))

    def _end(self, event: Any) -> None:
        frame = self.stack.pop()
        if frame.key is not _NO_KEY:
            raise _Unsupported("a key without a value")
        # `_Doc.walk` records a collection before its items; no item shares its path, so recording it
        # last leaves the same marks (and the anchor's log starts at its first item).
        self._record(("v", frame.path, frame.start, event.end_mark, None))
        if frame.anchor is not None:
            self.open_anchors -= 1
            self.anchors[frame.anchor] = _Anchor(frame.data, False, size=self.size - frame.size_at,
                                                 plen=len(frame.path), start=frame.log_at, end=len(self.log))


def _load_one_pass(text: str, file: str, parser: Any = None) -> tuple[Any, _Doc] | None:
    """The document's data and positions from `_OnePassLoader` over libyaml's events (PyYAML's own parser
    without libyaml; `parser`: a loader class, for tests), or None when it is unsupported or has an error:
    the composing bounded loader then loads or reports it exactly as it always has."""
    events = None
    try:
        events = (parser or _CLoader or yaml.SafeLoader)(text)  # the pure reader checks characters here
        return _OnePassLoader(events, file).load()
    except (_Unsupported, yaml.YAMLError, ValueError, OverflowError, RecursionError):
        return None
    finally:
        if events is not None:
            events.dispose()


def _load_yaml(text: str, file: str) -> tuple[Any, _Doc, list[Diagnostic]]:
    doc = _Doc(file)
    if len(text) > MAX_PROFILE_BYTES:
        return None, doc, [error("E601", f"the profile is too large (more than {MAX_PROFILE_BYTES:,} "
                                         "characters)", ir.Span(file=file))]
    fast = _load_one_pass(text, file)
    if fast is not None:
        data, doc = fast
        return data, doc, _duplicate_diagnostics(doc)
    try:
        node, data = _load_bounded(_BoundedLoader(text))
    except _YamlTooBig as exc:
        return None, doc, [error("E601", f"the profile is too complex to load: {exc}", ir.Span(file=file),
                                 "write a plain mapping of intents, personas and variables")]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        span = ir.Span(file=file, line=mark.line + 1, col=mark.column + 1) if mark else ir.Span(file=file)
        problem = exc.problem or "invalid YAML"
        msg = f"invalid YAML: {problem}" + (f" ({exc.context})" if exc.context else "")
        return None, doc, [error("E601", msg, span)]
    except yaml.YAMLError as exc:  # pragma: no cover - defensive
        return None, doc, [error("E601", f"invalid YAML: {exc}", ir.Span(file=file))]
    except (ValueError, OverflowError, RecursionError) as exc:
        # e.g. a 5,000-digit integer (Python's int-from-text limit) or a date out of range
        return None, doc, [error("E601", f"invalid YAML value: {clip(str(exc), 200)}", ir.Span(file=file))]
    if node is not None:
        doc.walk(node, ())
    return data, doc, _duplicate_diagnostics(doc)


def _duplicate_diagnostics(doc: _Doc) -> list[Diagnostic]:
    return [error("E609", f"duplicate key `{clip(str(p[-1]))}`", ir.Span(file=doc.file, line=m.line + 1, col=m.column + 1),
                  "a later entry would silently replace the earlier one; keep one")
            for p, m in doc.duplicates]


# ---------------------------------------------------------------------------------------------
# Pydantic errors → located diagnostics


_MODEL_AT: dict[str, type[BaseModel]] = {"intents": IntentSpec, "variables": VariableSpec, "personas": PersonaSpec}


def _model_for(loc: tuple) -> type[BaseModel]:
    """The model whose keys apply at `loc` (the parent of an unknown key)."""
    if not loc:
        return ProfileFile
    top = loc[0]
    if top in ("intents", "variables") and len(loc) == 2:
        return _MODEL_AT[top]
    if top == "personas" and len(loc) >= 2:
        return PersonaSpec
    return ProfileFile


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union-branch tags (`str`, `PersonaSpec`, `list[...]`) from an error location."""
    out = []
    for part in loc:
        if isinstance(part, str) and (part in ("str", "bool", "int", "float", "PersonaSpec")
                                      or part.startswith(("list[", "union[", "function-"))):
            continue
        out.append(part)
    return tuple(out)


def _where(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "the top level"


def _validation_diagnostics(exc: ValidationError, doc: _Doc) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    seen: set[tuple] = set()
    for err in exc.errors():
        loc = _clean_loc(tuple(err.get("loc", ())))
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            key = loc[-1] if loc else "?"
            parent = loc[:-1]
            if ("extra", loc) in seen:
                continue
            seen.add(("extra", loc))
            fields = list(_model_for(parent).model_fields)
            hint = did_you_mean(str(key), fields) or f"allowed keys here: {', '.join(fields)}"
            diags.append(error("E602", f"unknown key `{clip(str(key))}` in {_where(parent)}", doc.span(loc, key=True), hint))
            continue
        if (kind, loc) in seen:
            continue
        seen.add((kind, loc))
        if loc and loc[0] == "personas" and len(loc) == 2 and kind in ("string_type", "model_type"):
            if isinstance(err.get("input"), dict) or ("persona", loc) in seen:
                continue  # the mapping branch reports the specific problem
            seen.add(("persona", loc))
            diags.append(error("E603", f"persona entry {_where(loc)} must be a library persona name or a "
                                       "mapping with at least `name`", doc.span(loc)))
            continue
        msg = err.get("msg", "invalid value")
        suggestion = None
        given = err.get("input")
        if kind == "literal_error" and isinstance(given, str):
            suggestion = did_you_mean(given, INTENSITIES)
        if kind == "missing":
            diags.append(error("E603", f"missing required key `{loc[-1]}` in {_where(loc[:-1])}",
                               doc.span(loc[:-1])))
            continue
        diags.append(error("E603", f"{_where(loc)}: {msg}", doc.span(loc), suggestion))
    return diags


# ---------------------------------------------------------------------------------------------
# Conditions: YAML values → IR expressions


_TRAILING = re.compile(r"^missing `->` before `(.+)`$")
_PLAIN_VALUE = re.compile(r"^[^\W\d][\w+\-.]*$")
_OPERATOR_PREFIX = re.compile(r"^\s*(==|!=|<=|>=|<|>|not\s+in\b|in\b)")


def _lit(value: Scalar, bare: bool, span: ir.Span) -> ir.Lit:
    return ir.Lit(value=value, bare=bare and isinstance(value, str), span=span)


def parse_expression(text: str, scenario: ir.Scenario, span: ir.Span, *, quoted: bool = False,
                     memo: dict[str, Any] | None = None) -> tuple[ir.Expr | None, list[Diagnostic]]:
    """Parse a condition in `.sop` expression syntax and resolve its names against the scenario.

    Syntax errors are reported at the YAML scalar's position (shifted by the column inside it).
    `memo` (one per profile) keeps each text's parsed expression: a profile of 20,000 intents repeats
    the same few conditions (`> 0`) and parsing costs far more than relocating a copy."""
    hit = memo.get(text) if memo is not None else None
    if hit is not None:
        expr = _relocate(hit, span)
        return expr, _check_names(expr, scenario, span, text)
    wrapper = "stage __profile_condition {\nwhen " + text + "\n-> do __x\n}\n"
    try:
        program = parse_text(wrapper, file=span.file)
    except SopError as exc:
        diags = []
        shift = span.col + (1 if quoted else 0)
        shown = clip(text)
        for d in exc.diagnostics:
            if d.span is not None and d.span.line == 2:
                col = shift + max(0, d.span.col - 6)
                message, hint = f"bad condition `{shown}`: {d.message}", d.hint
                extra = _TRAILING.match(d.message)
                if extra:  # the `.sop` parser's branch hints mean nothing in a profile value
                    message = f"bad condition `{shown}`: unexpected `{extra.group(1)}` after the condition"
                    hint = ("a condition is a value (`Calm`), a list of values, or a comparison such as "
                            "`> 48` or `in {1, 2}`, in `.sop` expression syntax; write numbers without units")
            else:  # the error is past the end of the condition
                col = shift + len(text)
                message, hint = f"incomplete condition `{shown}`", "something is missing at its end"
            at = ir.Span(file=span.file, line=span.line, col=col, end_line=span.line, end_col=col + 1)
            diags.append(error("E606", message, at, hint))
        return None, diags
    stage = next(item for item in program.items if isinstance(item, ir.Stage))
    expr = stage.branches[0].guard
    assert expr is not None
    unit = _unit_on_number(expr, scenario)
    if unit is not None:  # `Fee > 48 hours` reads as a duration now; a number has no unit
        at = ir.Span(file=span.file, line=span.line, col=span.col, end_line=span.line, end_col=span.col + 1)
        return None, [error("E606", f"bad condition `{clip(text)}`: unexpected `{unit}` after the condition", at,
                            "a condition is a value (`Calm`), a list of values, or a comparison such as "
                            "`> 48` or `in {1, 2}`, in `.sop` expression syntax; write numbers without units")]
    resolved = _resolve(expr, scenario)
    if memo is not None:
        memo[text] = resolved
    expr = _relocate(resolved, span)
    return expr, _check_names(expr, scenario, span, text)


def _unit_on_number(expr: Any, scenario: ir.Scenario) -> str | None:
    """The unit of a duration compared with a number variable (`Fee > 48 hours`), if any."""
    if isinstance(expr, ir.Compare):
        for side, other in ((expr.left, expr.right), (expr.right, expr.left)):
            var = scenario.variables.get(other.name) if isinstance(other, ir.Var) else None
            if isinstance(side, ir.TimeLit) and var is not None and isinstance(var.type, ir.NumType):
                return side.text.split()[-1]
    return None


def _resolve(expr: Any, scenario: ir.Scenario) -> Any:
    """Names resolved as the loader resolves a program's: bare identifiers that are not variables become
    enum-value literals, dotted names field accesses (`Insurance.active`), item variables of
    `any`/`all`/`count(… where …)` items (the expression is a fresh parse, updated in place)."""
    return resolve_expression(expr, scenario.variables)


def _relocate(expr: Any, span: ir.Span) -> Any:
    """Give every node of a parsed condition the YAML scalar's span (the wrapper's spans mean nothing)."""
    kind = type(expr)
    if kind is ir.Var or kind is ir.Lit:  # the common shapes first (`X == v`): no isinstance chain
        return _copied(expr, {"span": span})
    if kind is ir.Compare:
        left, right = expr.left, expr.right
        return _copied(expr, {"span": span,
                              "left": _copied(left, {"span": span}) if type(left) is ir.Var else _relocate(left, span),
                              "right": _copied(right, {"span": span}) if type(right) is ir.Lit
                              else _relocate(right, span)})
    updates: dict[str, Any] = {"span": span}
    if isinstance(expr, ir.Unary):
        updates["operand"] = _relocate(expr.operand, span)
    elif isinstance(expr, (ir.Binary, ir.Compare)):
        updates["left"] = _relocate(expr.left, span)
        updates["right"] = _relocate(expr.right, span)
    elif isinstance(expr, ir.InSet):
        updates["operand"] = _relocate(expr.operand, span)
        updates["values"] = [_relocate(v, span) for v in expr.values]
    elif isinstance(expr, ir.BoolOp):
        updates["operands"] = [_relocate(o, span) for o in expr.operands]
    elif isinstance(expr, (ir.Call, ir.Func)):
        updates["args"] = [_relocate(a, span) for a in expr.args]
    elif isinstance(expr, ir.Matches):
        updates["operand"] = _relocate(expr.operand, span)
    elif isinstance(expr, ir.CaseExpr):
        updates["arms"] = [ir.CaseArm(when=_relocate(a.when, span), then=_relocate(a.then, span), span=span)
                           for a in expr.arms]
        updates["otherwise"] = _relocate(expr.otherwise, span)
    return _copied(expr, updates)


_new = object.__new__
_set = object.__setattr__


def _copied(node: Any, updates: dict[str, Any]) -> Any:
    """`node.model_copy(update=updates)` for an IR node (no extra or private fields), without pydantic's
    generic copy: relocating the conditions of 20,000 intents copies ~100,000 nodes."""
    cls = type(node)
    copy = _new(cls)
    values = node.__dict__.copy()
    values.update(updates)
    _set(copy, "__dict__", values)
    _set(copy, "__pydantic_fields_set__", _ALL_FIELDS.get(cls) or _all_fields(cls))
    _set(copy, "__pydantic_extra__", None)
    _set(copy, "__pydantic_private__", None)
    return copy


_ALL_FIELDS: dict[type, set[str]] = {}


def _all_fields(cls: type[BaseModel]) -> set[str]:
    """The fields set every copy of an IR node class shares: all its field names (`ir.share_fields_set`)."""
    names = _ALL_FIELDS[cls] = set(cls.model_fields)
    return names


_DEFAULTS: dict[type, list[tuple[str, Any, Any]]] = {}


def _defaults(cls: type[BaseModel]) -> list[tuple[str, Any, Any]]:
    """(name, default, default factory) of each field of `cls`, in declaration order."""
    out = _DEFAULTS[cls] = [(name, f.default, f.default_factory) for name, f in cls.model_fields.items()]
    return out


def _constructed(cls: type[Any], **values: Any) -> Any:
    """`cls.model_construct(**values)` for the profile's own records (no private or extra fields, no
    `model_post_init`): fields in declaration order, defaults for the rest, the given names as fields set.
    Pydantic's generic one costs more than the rest of resolving an intent."""
    data: dict[str, Any] = {}
    for name, default, factory in _DEFAULTS.get(cls) or _defaults(cls):
        if name in values:
            data[name] = values[name]
        elif factory is not None:
            data[name] = factory()
        else:
            data[name] = default
    obj = _new(cls)
    _set(obj, "__dict__", data)
    _set(obj, "__pydantic_fields_set__", set(values))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def _enum_of(expr: Any, scenario: ir.Scenario) -> ir.EnumType | None:
    if isinstance(expr, ir.Var):
        var = scenario.variables.get(expr.name)
        if var is not None and isinstance(var.type, ir.EnumType):
            return var.type
    return None


def _enum_values(vtype: Any) -> list[str]:
    """The enum values of a type, those of list items and record fields included (`t.channel == Atm`)."""
    if isinstance(vtype, ir.EnumType):
        return list(vtype.values)
    if isinstance(vtype, ir.ListType):
        return _enum_values(vtype.item)
    if isinstance(vtype, ir.RecordType):
        return [v for f in vtype.fields for v in _enum_values(f.type)]
    return []


def _check_names(expr: Any, scenario: ir.Scenario, span: ir.Span, text: str) -> list[Diagnostic]:
    """Bare names must be enum values of the variable they are compared with (or of some enum)."""
    diags: list[Diagnostic] = []
    all_values = {v for var in scenario.variables.values() for v in _enum_values(var.type)}
    checked: set[int] = set()

    def bad(lit: ir.Lit, pool: Iterable[str], context: str) -> None:
        hint = did_you_mean(str(lit.value), pool)
        value, shown = clip(str(lit.value)), clip(text)
        diags.append(error("E604" if context == "name" else "E605",
                           f"`{value}` in condition `{shown}` is not a variable or a value"
                           if context == "name" else
                           f"`{value}` is not a value of `{context}` (condition `{shown}`)", span, hint))

    def walk(e: Any) -> None:
        if isinstance(e, ir.Compare):
            for a, b in ((e.left, e.right), (e.right, e.left)):
                enum = _enum_of(a, scenario)
                if (enum is not None and isinstance(a, ir.Var)  # only a Var has an enum
                        and isinstance(b, ir.Lit) and isinstance(b.value, str)):
                    checked.add(id(b))
                    if b.value not in enum.values:
                        bad(b, enum.values, a.name)
        if isinstance(e, ir.InSet):
            enum = _enum_of(e.operand, scenario)
            if enum is not None and isinstance(e.operand, ir.Var):
                for v in e.values:
                    checked.add(id(v))
                    if isinstance(v.value, str) and v.value not in enum.values:
                        bad(v, enum.values, e.operand.name)
        if isinstance(e, ir.Lit) and e.bare and id(e) not in checked and e.value not in all_values:
            bad(e, list(scenario.variables) + sorted(all_values), "name")
        for child in ir.children(e):
            walk(child)

    walk(expr)
    return diags


def _value_condition(var: ir.Variable, value: Any, span: ir.Span) -> tuple[ir.Expr | None, Diagnostic | None]:
    """`var: value` or `var: [values]` → `var == value` / `var in {values}` after a domain check."""
    values = value if isinstance(value, list) else [value]
    if not values:
        return None, error("E603", f"empty list of values for `{var.name}`", span)
    lits: list[ir.Lit] = []
    for v in values:
        problem = _domain_problem(var, v)
        if problem is not None:
            return None, error("E605", problem[0], span, problem[1])
        if isinstance(var.type, ir.NumType) and var.type.kind == "int" and isinstance(v, float):
            v = int(v)
        lits.append(_lit(v, True, span))
    ref = ir.Var(name=var.name, span=span)
    if len(lits) == 1:
        return ir.Compare(op="==", left=ref, right=lits[0], span=span), None
    return ir.InSet(operand=ref, values=lits, span=span), None


def _time_values(var: ir.Variable, value: Any, span: ir.Span) -> ir.Expr | None:
    """`Due: "2026-06-05"` (or a list of such) → `Due == date("2026-06-05")`: a value of a date,
    datetime or duration variable, written as text; None when it is not one (then it is a condition)."""
    assert isinstance(var.type, ir.TimeType)
    kind = var.type.kind
    texts = value if isinstance(value, list) else [value]
    lits = []
    for text in texts:
        try:
            seconds = scalars.parse_temporal(kind, str(text).strip())
        except scalars.ValueProblem:
            return None
        lits.append(ir.TimeLit(unit=kind, value=seconds, text=str(text).strip(), span=span))
    if not lits:
        return None
    ref = ir.Var(name=var.name, span=span)
    compares: list[ir.Expr] = [ir.Compare(op="==", left=ref, right=lit, span=span) for lit in lits]
    return compares[0] if len(compares) == 1 else ir.BoolOp(op="or", operands=compares, span=span)


def _has_value(vtype: Any, text: str) -> bool:
    """Whether `text` is itself a value of the type (a string, or an enum with such a value)."""
    return isinstance(vtype, ir.StringType) or (isinstance(vtype, ir.EnumType) and text in vtype.values)


def _domain_problem(var: ir.Variable, value: Any) -> tuple[str, str | None] | None:
    """A (message, hint) if `value` is outside the variable's domain."""
    vtype = var.type
    shown = clip(ir.show_value(value) if isinstance(value, (bool, int, float, str)) else repr(value))
    if isinstance(vtype, ir.TimeType):
        try:
            scalars.parse_temporal(vtype.kind, value)
        except scalars.ValueProblem as exc:
            return f"`{shown}` for `{var.name}` {exc}", "or write a condition such as `> \"2026-01-31\"`"
        return None
    if isinstance(vtype, ir.StringType) and not isinstance(value, str):
        return f"`{var.name}` is a string; quote the value (`\"{shown}\"`)", None
    if isinstance(vtype, ir.EnumType):
        if not isinstance(value, str) or value not in vtype.values:
            return (f"`{shown}` is not a value of `{var.name}` ({' | '.join(vtype.values)})",
                    did_you_mean(str(value), vtype.values))
        return None
    if isinstance(vtype, ir.BoolType):
        if not isinstance(value, bool):
            return f"`{var.name}` is a bool; use true or false, not `{shown}`", None
        return None
    if isinstance(vtype, ir.NumType):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"`{var.name}` is a number ({vtype.describe()}); `{shown}` is not", None
        if vtype.kind == "int" and isinstance(value, float) and not value.is_integer():
            return f"`{var.name}` is an int; `{shown}` is not an integer", None
        if not vtype.contains(value):
            return f"`{shown}` is outside the range of `{var.name}` ({vtype.describe()})", None
    return None


def _negate_text(text: str) -> str:
    return f"not ({text})"


# ---------------------------------------------------------------------------------------------
# Loading and checking


def default_profile(scenario: ir.Scenario) -> Profile:
    """The profile of a scenario that has only its `.sop`: no intents, the library personas."""
    profile, diags = parse_profile("{}\n", scenario, file="<default profile>")
    assert profile is not None, diags
    return profile


def load_profile(path: str | Path, scenario: ir.Scenario, *, text: str | None = None) -> Profile:
    """Load and check a profile against its scenario; raises `SopError` with every error found."""
    file = str(path)
    if text is None:
        text, problems = read_profile_text(path)
        if text is None:
            raise SopError(problems) from None
    profile, diags = parse_profile(text, scenario, file=file)
    errors = [d for d in diags if d.is_error]
    if errors or profile is None:
        raise SopError(errors or diags, {file: text})
    return profile


def profile_for(sop_path: str | Path, scenario: ir.Scenario) -> Profile:
    """The profile beside a `.sop` file, or the default profile when there is none."""
    path = profile_path_for(sop_path)
    if path.is_file():
        return load_profile(path, scenario)
    return default_profile(scenario)



def _now_after_listed_dates(scenario: ir.Scenario, sample_values: dict[str, list[Scalar]]) -> None:
    """When the profile lists dates (`LastPayment: {values: ["2026-05-01"]}`) but no `now`, cases take
    `now` a day after the latest of them wherever their path allows: left to the example search, `now`
    could come before the listed dates, and a dialogue about a payment made "in the future" misleads
    agents and judges alike. A listed `now` is kept as written."""
    now = scenario.variables.get("now")
    if now is None or "now" in sample_values or not isinstance(now.type, ir.TimeType) \
            or now.type.kind not in ("date", "datetime"):
        return
    latest: int | None = None
    for name, values in sample_values.items():
        var = scenario.variables.get(name)
        if var is None or not isinstance(var.type, ir.TimeType) or var.type.kind not in ("date", "datetime"):
            continue
        for value in values:
            try:
                seconds = int(scalars.parse_temporal(var.type.kind, value))
            except (ValueError, TypeError):
                continue
            latest = seconds if latest is None else max(latest, seconds)
    if latest is not None:
        day = scalars.unit_seconds("day")
        moment = (latest // day + 1) * day + (day // 2 if now.type.kind == "datetime" else 0)
        sample_values["now"] = [scalars.format_temporal(now.type.kind, moment)]


def parse_profile(text: str, scenario: ir.Scenario, *, file: str = "<profile>"
                  ) -> tuple[Profile | None, list[Diagnostic]]:
    """Parse and check profile text; returns the profile (None on errors) and every diagnostic."""
    data, doc, diags = _load_yaml(text, file)
    if diags and data is None:
        return None, diags
    if data is None:
        data = {}
    if not isinstance(data, dict):
        diags.append(error("E603", "a profile must be a YAML mapping (keys such as `intents:`, `personas:`)",
                           doc.span(())))
        return None, diags
    spec, more = _validate_partially(data, doc)
    diags += more
    if spec is None:
        return None, sorted(diags, key=sort_key)
    profile, more = _resolve_profile(spec, doc, scenario, file, structural_errors=bool(diags))
    diags += more
    profile.sources = {file: text}
    if any(d.is_error for d in diags):
        return None, sorted(diags, key=sort_key)
    return profile, sorted(diags, key=sort_key)


def _validate_partially(data: dict, doc: _Doc) -> tuple[ProfileFile | None, list[Diagnostic]]:
    """Validate the file; on errors, drop each offending entry (one intent, persona, variable or top-level
    key) and validate again, so that the semantic checks still run on everything else and the user sees
    all problems at once."""
    diags: list[Diagnostic] = []
    data = dict(data)
    for _ in range(50):
        try:
            return ProfileFile.model_validate(data), diags
        except ValidationError as exc:
            diags += _validation_diagnostics(exc, doc)
            drops: set[tuple] = set()
            for err in exc.errors():
                loc = tuple(err.get("loc", ()))
                if not loc:
                    return None, diags
                if loc[0] in ("intents", "variables", "personas") and len(loc) >= 2:
                    drops.add(loc[:2])
                else:
                    drops.add(loc[:1])
            for loc in sorted(drops, key=lambda x: (len(x), str(x)), reverse=True):
                container = data.get(loc[0]) if len(loc) == 2 else data
                if len(loc) == 1:
                    data.pop(loc[0], None)
                elif isinstance(container, dict):
                    data[loc[0]] = {k: v for k, v in container.items() if k != loc[1]}
                elif isinstance(container, list):
                    data[loc[0]] = [v if i != loc[1] else None for i, v in enumerate(container)]
            if isinstance(data.get("personas"), list):
                data["personas"] = [v for v in data["personas"] if v is not None] or None
    return None, diags  # pragma: no cover - each round removes at least one entry


def known_by_default(var: ir.Variable) -> bool:
    """Whether the simulated customer knows a system variable when no profile says (`user_knows`): never. A
    system value is the backend's (an account's plan, a fee list, what a look reports after an action); a
    customer who "knew" them repeated the backend's values, a list of fee records as raw JSON, and handed
    the agent what the SOP makes it look up. The profile says which ones a customer sees (`user_knows: true`:
    an order's status on the tracking page, whether they paid)."""
    del var  # the rule holds for every system variable; kept as a function so callers state what they ask
    return False


def _resolve_profile(spec: ProfileFile, doc: _Doc, scenario: ir.Scenario, file: str,
                     structural_errors: bool = False) -> tuple[Profile, list[Diagnostic]]:
    diags: list[Diagnostic] = []
    if spec.scenario is not None and spec.scenario != scenario.name:
        diags.append(error("E610", f"this profile is for scenario `{spec.scenario}`, but the .sop declares "
                                   f"`{scenario.name}`", doc.span(("scenario",)),
                           "rename one of them, or pair the profile with the right .sop"))
    lib = library()

    # intensities
    intensities: dict[str, str] = {k: lib.intensities[k] for k in INTENSITIES}
    intensities.update({k: v for k, v in spec.intensities.items()})

    # personas
    personas: list[PersonaSpec] = []
    by_name = {p.name: p for p in lib.personas}
    if spec.personas is None:
        personas = list(lib.personas)
    else:
        for i, entry in enumerate(spec.personas):
            if isinstance(entry, str):
                if entry not in by_name:
                    diags.append(error("E608", f"unknown persona `{clip(entry)}`", doc.span(("personas", i)),
                                       did_you_mean(entry, by_name)
                                       or f"library personas: {', '.join(by_name)}"))
                    continue
                personas.append(by_name[entry])
            else:
                personas.append(entry)
        names: set[str] = set()
        for i, p in enumerate(personas):
            if p.name in names:
                diags.append(error("E609", f"persona `{p.name}` is listed twice", doc.span(("personas", i))))
            names.add(p.name)
        if not personas and not diags and not structural_errors:
            diags.append(error("E603", "`personas:` is empty; omit it to use the library",
                               doc.span(("personas",))))

    # variables
    user_knows = {v.name: known_by_default(v) for v in scenario.system_vars}
    sample_values: dict[str, list[Scalar]] = {}
    generators: dict[str, Generator] = {}
    for name, vspec in spec.variables.items():
        var = scenario.variables.get(name)
        if var is None or var.role == "derived":
            diags.append(_undefined_var(name, scenario, doc.span(("variables", name), key=True),
                                        roles=("field", "system")))
            continue
        if vspec.user_knows is not None:
            if var.role != "system":
                diags.append(error("E603", f"`user_knows` applies to system variables; `{name}` is a "
                                           "classification field (the user always knows their own situation)",
                                   doc.span(("variables", name, "user_knows"), key=True)))
            else:
                user_knows[name] = vspec.user_knows
        if vspec.values is not None:
            ok: list[Scalar] = []
            for i, v in enumerate(vspec.values):
                problem = _domain_problem(var, v)
                if problem is not None:
                    diags.append(error("E605", problem[0], doc.span(("variables", name, "values", i)),
                                       problem[1]))
                else:
                    ok.append(int(v) if isinstance(var.type, ir.NumType) and var.type.kind == "int"
                              and isinstance(v, float) else v)
            if not vspec.values:
                diags.append(error("E603", f"empty `values` for `{name}`", doc.span(("variables", name))))
            sample_values[name] = ok
        generator, more = _generator(var, vspec, doc)
        diags += more
        if generator is not None:
            generators[name] = generator
    _now_after_listed_dates(scenario, sample_values)

    # intents
    intents: dict[str, Intent] = {}
    entries: dict[tuple, tuple[Any, str]] = {}  # see `_resolve_intent`
    judged: dict[str, list[tuple[str, str | None]]] = {}  # see `_typed_and_unobserved`
    lowerable = structured(scenario)
    for name, ispec in spec.intents.items():
        intent, more = _resolve_intent(name, ispec, doc, scenario, entries, lowerable, judged)
        diags += more
        intents[name] = intent

    profile = Profile(scenario=scenario.name, file=file, description=spec.description, intents=intents,
                      personas=personas, intensities=intensities, user_knows=user_knows,
                      sample_values=sample_values, generators=generators, languages=spec.languages,
                      intents_span=doc.span(("intents",), key=True) if ("intents",) in doc.key_marks else None)
    if not any(d.is_error for d in diags) and not structural_errors:
        diags += _impossible_intents(scenario, profile)
    return profile, diags


def _generator(var: ir.Variable, spec: VariableSpec, doc: _Doc) -> tuple[Generator | None, list[Diagnostic]]:
    """The variable's declared generator (`examples`, `pattern`, `min`/`max`, `distribution`), checked
    against its type and domain; None when it declares none or only wrong ones (each a located error)."""
    diags: list[Diagnostic] = []
    at = ("variables", var.name)
    vtype = var.type
    out = Generator()
    if spec.examples is not None:
        if not spec.examples:
            diags.append(error("E603", f"empty `examples` for `{var.name}`", doc.span((*at, "examples"))))
        for i, v in enumerate(spec.examples):
            problem = _domain_problem(var, v)
            if problem is not None:
                diags.append(error("E605", problem[0], doc.span((*at, "examples", i)), problem[1]))
            else:
                out.examples.append(v)
    if spec.pattern is not None:
        problem = _pattern_problem(var, spec.pattern)
        if problem is not None:
            diags.append(error("E603", problem[0], doc.span((*at, "pattern")), problem[1]))
        else:
            out.pattern = spec.pattern
    bounds: dict[str, float] = {}
    for key in ("min", "max"):
        raw = getattr(spec, key)
        if raw is None:
            continue
        value, problem = _bound(var, raw)
        if problem is not None:  # outside the domain (E605), or on a type without a range (E603)
            code = "E605" if isinstance(vtype, ir.NumType | ir.TimeType) else "E603"
            diags.append(error(code, problem[0], doc.span((*at, key)), problem[1]))
        elif value is not None:
            bounds[key] = value
    if (spec.min is None) != (spec.max is None):
        diags.append(error("E603", f"`{var.name}` needs both `min` and `max` to draw between them",
                           doc.span((*at, "min" if spec.min is not None else "max"), key=True)))
    elif len(bounds) == 2:
        if bounds["min"] > bounds["max"]:
            diags.append(error("E603", f"`min` of `{var.name}` is above its `max`", doc.span((*at, "min"))))
        elif spec.distribution == "log-uniform" and bounds["min"] <= 0:
            diags.append(error("E603", "`log-uniform` needs a `min` above 0", doc.span((*at, "distribution")),
                               "use `uniform`, or raise `min`"))
        else:
            out.lo, out.hi = bounds["min"], bounds["max"]
            out.distribution = spec.distribution or "uniform"
    elif spec.distribution is not None:
        diags.append(error("E603", "`distribution` shapes the draw between `min` and `max`; give both",
                           doc.span((*at, "distribution"), key=True)))
    if out.examples or out.pattern is not None or out.lo is not None:
        return out, diags
    return None, diags


def _pattern_problem(var: ir.Variable, pattern: str) -> tuple[str, str | None] | None:
    if not isinstance(var.type, ir.StringType):
        return f"`pattern` applies to strings; `{var.name}` is not one", "use `examples` or `min`/`max`"
    if len(pattern) > scalars.MAX_PATTERN:
        return f"the pattern is longer than {scalars.MAX_PATTERN} characters", None
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"`{pattern}` is not a regular expression ({exc})", None
    if random_match(pattern, random.Random(0)) is None:
        return (f"cannot make strings of `{clip(pattern)}` (negated classes, look-arounds and back-references are "
                "not supported)", "write the form with literals, classes like [A-Z0-9] and repeats like {6}")
    return None


def _bound(var: ir.Variable, raw: float | str) -> tuple[float | None, tuple[str, str | None] | None]:
    """A `min`/`max` in the engine's form, or the problem with it."""
    vtype = var.type
    if isinstance(vtype, ir.NumType):
        if isinstance(raw, str | bool):
            return None, (f"`{var.name}` is a number; `{clip(str(raw))}` is not", None)
        if not vtype.contains(raw):
            return None, (f"`{ir.show_value(raw)}` is outside the range of `{var.name}` ({vtype.describe()})", None)
        return float(raw), None
    if isinstance(vtype, ir.TimeType):
        try:
            return float(scalars.parse_temporal(vtype.kind, raw if vtype.kind == "duration" or isinstance(raw, str)
                                                else str(raw))), None
        except (scalars.ValueProblem, TypeError, ValueError) as exc:
            return None, (f"`{raw}` for `{var.name}` {exc}", 'write a date as text, e.g. "2026-01-31"')
    return None, (f"`min`/`max` apply to numbers, dates and durations; `{var.name}` is not one",
                  "use `examples`")


def _undefined_var(name: str, scenario: ir.Scenario, span: ir.Span,
                   roles: tuple[str, ...] = ("field", "system", "derived")) -> Diagnostic:
    pool = [v.name for v in scenario.variables.values() if v.role in roles]
    hint = did_you_mean(name, pool) or (f"variables: {', '.join(pool)}" if pool else None)
    return error("E604", f"`{clip(name)}` is not a variable of scenario `{scenario.name}`", span, hint)


def _resolve_intent(name: str, spec: IntentSpec, doc: _Doc, scenario: ir.Scenario,
                    entries: dict[tuple, tuple[Any, str]] | None = None, lowerable: bool = True,
                    judged: dict[str, list[tuple[str, str | None]]] | None = None
                    ) -> tuple[Intent, list[Diagnostic]]:
    """One intent checked and resolved. `entries` (one per profile) keeps the condition of each
    `requires`/`excludes` entry that had no problem, by variable, value and quoting: a profile of 20,000
    intents repeats a few hundred, and a repeat is the kept condition moved to its own span.
    `lowerable`: whether the scenario has lists or records (`_check_lowerable`)."""
    diags: list[Diagnostic] = []
    conditions: list[Condition] = []
    base = ("intents", name)
    memo = entries if entries is not None else {}
    for section, truth in (("requires", True), ("excludes", False)):
        for var_name, value in getattr(spec, section).items():
            val_path = base + (section, var_name)
            var = scenario.variables.get(var_name) or _field_path(var_name, scenario)
            if var is None:
                diags.append(_undefined_var(var_name, scenario, doc.span(val_path, key=True)))
                continue
            if ir.is_structured(var.type):
                diags.append(error("E605", f"`{var_name}` is a {'list' if isinstance(var.type, ir.ListType) else 'record'}"
                                           "; an entry constrains one value", doc.span(val_path, key=True),
                                   "name one of its fields (`Insurance.active: true`), or write a condition "
                                   "under `when:` (`any(s in Segments where s.flown)`, `len(Segments) >= 2`)"))
                continue
            span = doc.span(val_path)
            # a record field (`Insurance.active`) is resolved per entry: its field access keeps node spans
            key = (var_name, _value_key(value), doc.quoted(val_path)) if var_name in scenario.variables else None
            hit = memo.get(key) if key is not None else None
            if hit is not None:
                expr, text = _relocate(hit[0], span), hit[1]
            else:
                before = len(diags)
                expr, text = _entry_condition(var, value, doc, val_path, scenario, diags, span)
                if expr is None:
                    continue
                if var_name not in scenario.variables:  # a record field: `Insurance.active` as a field access
                    expr = _as_field_access(expr, var_name, scenario)
                elif key is not None and len(diags) == before:
                    memo[key] = (expr, text)
            conditions.append(_constructed(Condition, expr=expr, truth=truth,
                                           text=text if truth else _negate_text(text), span=span))
    whens = [spec.when] if isinstance(spec.when, str) else list(spec.when or [])
    for i, cond in enumerate(whens):
        path = base + ("when",) + ((i,) if isinstance(spec.when, list) else ())
        span = doc.span(path)
        expr, more = parse_expression(cond, scenario, span, quoted=doc.quoted(path), memo=doc.expressions)
        diags += more
        if expr is not None and not more:
            conditions.append(Condition(expr=expr, truth=True, text=ir.show(expr), span=span))
    problems = _typed_and_unobserved(conditions, scenario, {} if judged is None else judged)
    diags += problems
    if lowerable and not problems:
        diags += _check_lowerable(conditions, scenario)
    for i, action in enumerate(spec.pushes_for):
        span = doc.span(base + ("pushes_for", i))
        if action not in scenario.actions:
            diags.append(error("E608", f"`{clip(action)}` is not an action of scenario `{scenario.name}`", span,
                               did_you_mean(action, scenario.actions)))
        elif not scenario.actions[action].risky:
            diags.append(warning("W603", f"`{action}` is not risky (no moves_money / irreversible); "
                                         "adversarial users only push for risky actions", span))
    # the values were validated by `IntentSpec` (and the conditions built here): no second validation
    intent = _constructed(Intent, name=name, description=spec.description, intensity=spec.intensity,
                          conditions=conditions, weight=spec.weight, pushes_for=list(spec.pushes_for),
                          pushes_declared="pushes_for" in spec.model_fields_set, span=doc.span(base, key=True))
    return intent, diags


def _value_key(value: Any) -> tuple:
    """A hashable key telling apart every value a `requires`/`excludes` entry can hold (`1`, `1.0`,
    `true` and `"1"` differ)."""
    if isinstance(value, list):
        return (list, tuple(_value_key(v) for v in value))
    return (type(value), value)


def _field_path(name: str, scenario: ir.Scenario) -> ir.Variable | None:
    """A dotted record field written as a key (`Insurance.active`, `Metrics.cpu.load`): a stand-in
    variable of the field's type, or None when the name is no such field."""
    head, *fields = name.split(".")
    root = scenario.variables.get(head)
    if root is None or not fields or root.role == "derived":
        return None
    vtype: Any = root.type
    for field in fields:
        if not isinstance(vtype, ir.RecordType):
            return None
        match = next((f for f in vtype.fields if f.name == field), None)
        if match is None:
            return None
        vtype = match.type
    return ir.Variable(name=name, role=root.role, type=vtype, span=root.span)


def _as_field_access(expr: Any, name: str, scenario: ir.Scenario) -> Any:
    """`Insurance.active == true` built on the stand-in variable, re-resolved as a field access."""
    def swap(e: Any) -> Any:
        if isinstance(e, ir.Var) and e.name == name:
            return ir.Var(name=name, span=e.span)  # a fresh node: resolution rewrites it in place
        if isinstance(e, ir.Compare):
            return e.model_copy(update={"left": swap(e.left), "right": swap(e.right)})
        if isinstance(e, ir.InSet):
            return e.model_copy(update={"operand": swap(e.operand)})
        return e
    return resolve_expression(swap(expr), scenario.variables)


def _check_lowerable(conditions: list[Condition], scenario: ir.Scenario) -> list[Diagnostic]:
    """Conditions over lists and records must have a plain form (synthesis reasons on it): a list or
    record used as one value is E606, located at the condition."""
    out: list[Diagnostic] = []
    if not structured(scenario):
        return out
    try:
        form = analysis_form(scenario)
    except UnrollError:
        return []  # the .sop's own checker reports this
    plain = form.scenario.variables
    for cond in conditions:
        try:
            low = lower_condition(form, cond.expr)
        except LowerError as exc:
            out.append(error("E606", f"bad condition `{clip(cond.text)}`: {exc}", cond.span,
                             "test a list's items with `any`/`all`/`count(x in L where …)` or `len(L)`, and a "
                             "record's fields with dots (`Insurance.active`)"))
            continue
        stack = [low]
        while stack:
            e = stack.pop()
            if isinstance(e, ir.Var) and e.name not in plain:
                out.append(error("E606", f"bad condition `{clip(cond.text)}`: `{e.name}` is a list or record, not "
                                         "one value", cond.span,
                                 "test a list's items with `any`/`all`/`count(x in L where …)` or `len(L)`, "
                                 "and a record's fields with dots (`Insurance.active`)"))
                break
            stack.extend(ir.children(e))
    return out


_WRITTEN_DATE = re.compile(r'(?<!")\b\d{4}-\d{2}-\d{2}\b(?!")')  # a date written bare in a condition


def _typed_and_unobserved(conditions: list[Condition], scenario: ir.Scenario,
                          memo: dict[str, list[tuple[str, str | None]]]) -> list[Diagnostic]:
    """E606 for a condition that reads an observed variable or is badly typed. Conditions repeat
    (a large profile has a few hundred distinct ones), so each text is judged once per profile
    (`memo`: condition text → problems)."""
    out: list[Diagnostic] = []
    for cond in conditions:
        problems = memo.get(cond.text)
        if problems is None:
            problems = memo[cond.text] = _condition_problems(cond, scenario)
        out += [error("E606", f"bad condition `{clip(cond.text)}`: {message}", cond.span, hint)
                for message, hint in problems]
    return out


def _condition_problems(cond: Condition, scenario: ir.Scenario) -> list[tuple[str, str | None]]:
    observed = sorted(n for n in reads(cond.expr) if n in scenario.variables and scenario.variables[n].observed)
    if observed:
        return [(f"`{observed[0]}` is observed (a new value at every look), so an intent cannot constrain it",
                 "constrain the values that lead to the looks instead; paths that differ only in looks get "
                 "generated intents")]
    dated = _WRITTEN_DATE.search(cond.text)
    return [(d.message, f'write a date as `date("{dated.group(0)}")`' if dated else d.hint)
            for d in condition_type_errors(scenario, cond.expr)]


def lowered_intents(scenario: ir.Scenario, intents: dict[str, Intent]) -> tuple[ir.Scenario, dict[str, Intent]]:
    """The program the analyses run on (lists and records lowered to plain variables) and the intents
    with their conditions in its terms; unchanged for a program without lists or records."""
    if not structured(scenario):
        return scenario, intents
    form = analysis_form(scenario)
    out: dict[str, Intent] = {}
    for name, intent in intents.items():
        conds = [c.model_copy(update={"expr": lower_condition(form, c.expr)}) for c in intent.conditions]
        out[name] = intent.model_copy(update={"conditions": conds})
    return form.scenario, out


def _entry_condition(var: ir.Variable, value: Any, doc: _Doc, path: tuple, scenario: ir.Scenario,
                     diags: list[Diagnostic], span: ir.Span | None = None) -> tuple[ir.Expr | None, str]:
    """One `requires`/`excludes` entry → (expression, text) (`span`: the value's, `doc.span(path)`)."""
    if span is None:
        span = doc.span(path)
    if value is None or (value == "missing" and not _has_value(var.type, "missing")):
        if not var.optional:
            diags.append(error("E605", f"`{var.name}` is not optional: it is never missing", span,
                               f"declare it optional in the .sop (`{var.name}: TYPE?`), or give a value"))
            return None, ""
        return ir.Func(name="missing", args=[ir.Var(name=var.name, span=span)], span=span), f"missing({var.name})"
    if isinstance(var.type, ir.TimeType) and (timed := _time_values(var, value, span)) is not None:
        return timed, ir.show(timed)
    if isinstance(value, str) and isinstance(var.type, ir.NumType):
        try:  # a quoted number ("100") is a value, not a condition
            number = float(value)
        except ValueError:
            pass
        else:
            value = int(number) if number.is_integer() and var.type.kind == "int" else number
    if isinstance(value, str) and not _PLAIN_VALUE.match(value.strip()):
        text = value.strip()
        if _OPERATOR_PREFIX.match(text):
            text = f"{var.name} {text}"
        expr, more = parse_expression(text, scenario, span, quoted=doc.quoted(path), memo=doc.expressions)
        diags.extend(more)
        return (expr if not more else None), text
    if isinstance(value, str) and isinstance(var.type, (ir.BoolType, ir.NumType)):
        # a bare word for a non-enum variable: `true`/`false` quoted, or an expression like `Fee`
        expr, more = parse_expression(f"{var.name} == {value}", scenario, span, quoted=doc.quoted(path),
                                      memo=doc.expressions)
        if not more and isinstance(var.type, ir.BoolType) and value in ("true", "false"):
            return expr, f"{var.name} == {value}"
        problem = _domain_problem(var, value)
        diags.append(error("E605", problem[0] if problem else f"bad value for `{var.name}`", span,
                           problem[1] if problem else None))
        return None, ""
    if isinstance(value, list):
        for i, v in enumerate(value):
            problem = _domain_problem(var, v)
            if problem is not None:
                diags.append(error("E605", problem[0], doc.span(path + (i,)), problem[1]))
                return None, ""
    expr, diag = _value_condition(var, value, span)
    if diag is not None:
        diags.append(diag)
        return None, ""
    return expr, ir.show(expr)


def _impossible_intents(scenario: ir.Scenario, profile: Profile) -> list[Diagnostic]:
    """Intents whose own conditions contradict each other (no assignment satisfies them)."""
    diags: list[Diagnostic] = []
    try:
        scenario, intents = lowered_intents(scenario, profile.intents)
    except (UnrollError, LowerError):
        return diags
    space = domain.space_for(scenario)
    possible: dict[tuple, bool] = {}  # conditions_key → can hold
    prefixes: dict[tuple, list[Any]] = {}
    for intent in intents.values():
        if not intent.conditions:
            continue
        key = conditions_key(intent)
        if key not in possible:
            possible[key] = bool(shared_intent_region(scenario, intent, key, [space.full], None, prefixes,
                                                      space=space))
        if not possible[key]:
            diags.append(error("E607", f"intent `{clip(intent.name)}` can never hold: its conditions contradict "
                                       f"each other or the variables' domains ({clip(intent.describe_conditions())})",
                               intent.span, "remove or relax one of its requires/excludes/when entries"))
    return diags


def _expr_key(expr: Any) -> Any:
    """A hashable key equal for structurally equal expressions (spans ignored). A node kind it does not
    know gets its own identity as key: never shared, so never wrong."""
    kind = type(expr)  # the shapes of `requires` entries first, by exact type (subclasses: below)
    if kind is ir.Var:
        return ("v", expr.name)
    if kind is ir.Lit:
        return ("l", type(expr.value).__name__, expr.value, expr.bare)
    if kind is ir.Compare:
        return (expr.kind, expr.op, _expr_key(expr.left), _expr_key(expr.right))
    if isinstance(expr, ir.Var):
        return ("v", expr.name)
    if isinstance(expr, ir.Lit):
        return ("l", type(expr.value).__name__, expr.value, expr.bare)
    if isinstance(expr, (ir.Compare, ir.Binary)):
        return (expr.kind, expr.op, _expr_key(expr.left), _expr_key(expr.right))
    if isinstance(expr, ir.InSet):
        return ("in", expr.negated, _expr_key(expr.operand), tuple(_expr_key(v) for v in expr.values))
    if isinstance(expr, ir.BoolOp):
        return ("bool", expr.op, tuple(_expr_key(o) for o in expr.operands))
    if isinstance(expr, ir.Unary):
        return ("unary", expr.op, _expr_key(expr.operand))
    if isinstance(expr, ir.Call):
        return ("call", expr.func, tuple(_expr_key(a) for a in expr.args))
    return ("id", id(expr))


def conditions_key(intent: Intent) -> tuple:
    """Equal for intents whose conditions are the same (in the same order): such intents have the same
    region everywhere, so matching computes it once for all of them (a profile of 20,000 intents
    repeats a few hundred condition sets)."""
    return tuple((c.truth, _expr_key(c.expr)) for c in intent.conditions)


def shared_intent_region(scenario: ir.Scenario, intent: Intent, key: tuple, boxes: list[Any], at: Any,
                         memo: dict[tuple, list[Any]], *, space: domain.Space) -> list[Any]:
    """`intent_region(scenario, intent, boxes, space=space)`, keeping in `memo` the boxes after each
    prefix of the intent's conditions, under (`at`, that prefix of `key` = `conditions_key(intent)`):
    intents that begin with the same conditions constrain them once (20,000 intents over a dozen paths
    were ~60,000 constraints). `at` names `boxes`: the same `at`, the same boxes."""
    for k, cond in enumerate(intent.conditions):
        slot = (at, key[:k + 1])
        hit = memo.get(slot)
        if hit is None:
            hit = []
            for box in boxes:
                hit += domain.constrain(scenario, box, cond.expr, cond.truth, space=space)
            memo[slot] = hit
        boxes = hit
        if not boxes:
            break
    return list(boxes)


def intent_region(scenario: ir.Scenario, intent: Intent, boxes: list[Any], *,
                  space: domain.Space | None = None) -> list[Any]:
    """The part of `boxes` (a union of domain boxes) where every condition of the intent holds
    (`space`: the scenario's `domain.space_for`, fetched once by callers matching many intents)."""
    sp = space if space is not None else domain.space_for(scenario)
    for cond in intent.conditions:
        nxt: list[Any] = []
        for box in boxes:
            nxt += domain.constrain(scenario, box, cond.expr, cond.truth, space=sp)
        boxes = nxt
        if not boxes:
            break
    return boxes
