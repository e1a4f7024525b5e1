"""The intermediate representation of a `.sop` program.

Every node is a pydantic model carrying the `Span` it was written at, so that every later stage
(checker, compiler, engine errors, path reports) can point back at the user's source.
The IR is the single place an SOP's logic lives after parsing; graph, engine, prompt text,
output schema and path list are all derived from it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, PrivateAttr
from pydantic_core import CoreSchema, core_schema

IR_VERSION = 1


_T = TypeVar("_T")



class AnalysisCache:
    """Analyses derived from a scenario. Derived data, not content: two scenarios compare equal whatever
    their caches hold (pydantic compares private attributes)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[object, object]] = {}

    def get_or_build(self, key: str, signature: object, build: Callable[[], _T]) -> _T:
        hit = self._entries.get(key)
        if hit is not None and hit[0] == signature:
            return cast(_T, hit[1])  # stored by `build` for this key
        value = build()
        self._entries[key] = (signature, value)
        return value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnalysisCache)

    def __copy__(self) -> AnalysisCache:
        return AnalysisCache()  # a copied scenario may be edited: it builds its own analyses

    def __deepcopy__(self, memo: dict[int, object]) -> AnalysisCache:
        return AnalysisCache()

    __hash__ = None  # type: ignore[assignment]


class Span:
    """A source region: 1-based line and column, end exclusive. Immutable.

    A slotted class, not a pydantic model: a 100k-stage program holds about a million spans, and a
    model instance with its own `__dict__` costs ~260 bytes where this costs 72 (and half the time to
    build). Models still validate fields typed `Span` (an instance, or a dict of its fields) and
    serialize them as that dict, as they did when it was a model (`__get_pydantic_core_schema__`)."""

    __slots__ = ("file", "line", "col", "end_line", "end_col")
    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __init__(self, file: str = "<string>", line: int = 0, col: int = 0, end_line: int = 0,
                 end_col: int = 0) -> None:
        _span_file(self, file)
        _span_line(self, line)
        _span_col(self, col)
        _span_end_line(self, end_line)
        _span_end_col(self, end_col)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Span is immutable: cannot set {name!r} (use `replace`)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Span is immutable: cannot delete {name!r}")

    def replace(self, **changes: Any) -> Span:
        """A copy with some fields changed (`span.replace(end_col=9)`)."""
        return Span(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "col": self.col, "end_line": self.end_line,
                "end_col": self.end_col}

    def _key(self) -> tuple[str, int, int, int, int]:
        return (self.file, self.line, self.col, self.end_line, self.end_col)

    def __eq__(self, other: object) -> bool:
        if type(other) is not Span:
            return NotImplemented
        return (self.line == other.line and self.col == other.col and self.end_line == other.end_line
                and self.end_col == other.end_col and self.file == other.file)

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Span(file={self.file!r}, line={self.line!r}, col={self.col!r}, end_line={self.end_line!r}, "
                f"end_col={self.end_col!r})")

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def __copy__(self) -> Span:
        return self  # immutable

    def __deepcopy__(self, memo: dict[int, object]) -> Span:
        return self

    def __reduce__(self) -> tuple[type[Span], tuple[str, int, int, int, int]]:
        return (Span, self._key())

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """Validated from an instance or a dict of its fields; serialized as that dict."""
        cs = core_schema

        def field(schema: CoreSchema, default: object) -> Any:
            return cs.typed_dict_field(cs.with_default_schema(schema, default=default), required=False)

        fields = cs.typed_dict_schema({
            "file": field(cs.str_schema(), "<string>"), "line": field(cs.int_schema(), 0),
            "col": field(cs.int_schema(), 0), "end_line": field(cs.int_schema(), 0),
            "end_col": field(cs.int_schema(), 0)}, total=False)
        from_dict = cs.no_info_after_validator_function(lambda d: cls(**d), fields)
        return cs.json_or_python_schema(
            json_schema=from_dict,
            python_schema=cs.union_schema([cs.is_instance_schema(cls), from_dict]),
            serialization=cs.plain_serializer_function_ser_schema(cls.as_dict, return_schema=fields),
        )


_span_file, _span_line, _span_col, _span_end_line, _span_end_col = (
    Span.__dict__[name].__set__ for name in Span.__slots__)  # slot setters: `Span.__setattr__` refuses
NO_SPAN = Span()

_new = object.__new__
_set = object.__setattr__
_FIELDS_SETS: dict[type, set[str]] = {}


def share_fields_set(model: BaseModel) -> None:
    """Give `model` the one fields set its class shares, holding every field name. Why: pydantic
    keeps a set per instance (200-700 bytes) of the fields given explicitly, which nothing here
    reads; a 100k-stage program has about a million nodes. Holding every name, the shared set is
    never changed by the `add` pydantic does on assignment; a copied model gets a set of its own."""
    cls = type(model)
    shared = _FIELDS_SETS.get(cls)
    if shared is None:
        shared = _FIELDS_SETS[cls] = set(cls.model_fields)
    _set(model, "__pydantic_fields_set__", shared)


def make_span(file: str, line: int, col: int, end_line: int, end_col: int) -> Span:
    """A `Span` equal to `Span(file, line, col, end_line, end_col)`, built with positional values
    (the parsers make about nine spans per stage)."""
    span = _new(Span)
    _span_file(span, file)
    _span_line(span, line)
    _span_col(span, col)
    _span_end_line(span, end_line)
    _span_end_col(span, end_col)
    return span


class Node(BaseModel):
    """Base of every IR node: a source span and nothing else."""

    model_config = ConfigDict(extra="forbid")

    span: Span = NO_SPAN

    def model_post_init(self, context: Any, /) -> None:
        share_fields_set(self)  # see there: memory of huge programs


# ---------------------------------------------------------------------------------------------
# Types


class EnumType(Node):
    kind: Literal["enum"] = "enum"
    values: list[str]
    alias: str | None = None  # written as the name of a `type NAME = A | B` declaration


class BoolType(Node):
    kind: Literal["bool"] = "bool"


NumKind = Literal["int", "float"]
BinOp = Literal["+", "-", "*", "/"]
CmpOp = Literal["==", "!=", "<", "<=", ">", ">="]
MIRRORED_OP: dict[str, CmpOp] = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
"""`a OP b` says the same as `b MIRRORED_OP[OP] a`."""
LogicOp = Literal["and", "or"]


class NumType(Node):
    """An int or float with an optional interval; `None` bounds are unbounded."""

    kind: NumKind
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, value: float) -> bool:
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return False
        return not (self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)))

    def describe(self) -> str:
        if self.lo is None and self.hi is None:
            return self.kind
        lo = "" if self.lo is None else _fmt_num(self.lo)
        hi = "" if self.hi is None else _fmt_num(self.hi)
        left = "(" if self.lo_open or self.lo is None else "["
        right = ")" if self.hi_open or self.hi is None else "]"
        return f"{self.kind}{left}{lo}..{hi}{right}"


# ---- dates, durations and strings (docs/language.md §4; values in sopgraph/language/scalars.py)

TemporalKind = Literal["date", "datetime", "duration"]


class TimeType(Node):
    """`date`, `datetime` or `duration`. Internally a number of seconds (a date or datetime since
    1970-01-01 UTC), so arithmetic and comparisons are plain number operations."""

    kind: TemporalKind


class StringType(Node):
    """`string`: text compared with `==`/`!=`, `in {…}` and `matches "pattern"`."""

    kind: Literal["string"] = "string"



# ---- structured data: bounded lists and records (see docs/language.md §4) --------------------

LIST_MAX_DEFAULT = 8  # items a `list of T` may hold when its declaration gives no bound
LIST_MAX_LIMIT = 32  # the largest bound a list may declare: analyses expand lists item by item


class ListType(Node):
    """`list[lo..hi] of T`: between `min_len` and `max_len` items of type `item`."""

    kind: Literal["list"] = "list"
    item: VarType
    min_len: int = 0
    max_len: int = LIST_MAX_DEFAULT


class RecordField(Node):
    name: str
    type: VarType
    optional: bool = False  # `note: string?`: the field may be absent or null; test it with `missing(R.note)`


class RecordType(Node):
    """`record { a: bool, b: int }`: named fields, each with its own type (nesting allowed)."""

    kind: Literal["record"] = "record"
    fields: list[RecordField]
    alias: str | None = None  # written as the name of a `type NAME = record {…}` declaration
    open: bool = False  # `record open {…}`: undeclared fields of the data are ignored (declared ones stay strict)

    def field(self, name: str) -> RecordField | None:
        return next((f for f in self.fields if f.name == name), None)


VarType = Annotated[EnumType | BoolType | NumType | TimeType | StringType | ListType | RecordType,
                    Field(discriminator="kind")]
ScalarType = EnumType | BoolType | NumType | TimeType | StringType
AnyType = EnumType | BoolType | NumType | TimeType | StringType | ListType | RecordType
ListType.model_rebuild()
RecordField.model_rebuild()
RecordType.model_rebuild()


def is_structured(vtype: object) -> bool:
    """Whether a type is a list or a record (its values are JSON arrays / objects)."""
    return isinstance(vtype, (ListType, RecordType))


def _fmt_num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


_VALUE_WORD = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*\Z")  # an enum value that reads as a name


def show_enum_value(value: str) -> str:
    """An enum value as text: bare when it reads as a name (`Calm`), else JSON-quoted (`"5+ times"`),
    so a value with spaces, `|` or `,` cannot be mistaken for several."""
    return value if _VALUE_WORD.match(value) else json.dumps(value, ensure_ascii=False)


def describe_type(vtype: AnyType | None) -> str:
    """Human text for a type, as used in diagnostics and prompts."""
    if vtype is None:
        return "unknown"
    if isinstance(vtype, ListType):
        size = f"at most {vtype.max_len}" if vtype.min_len == 0 else f"{vtype.min_len} to {vtype.max_len}"
        return f"list of {describe_type(vtype.item)} ({size} items)"
    if isinstance(vtype, RecordType):
        if vtype.alias:
            return vtype.alias
        return ("record open { " if vtype.open else "record { ") + ", ".join(f"{f.name}: {describe_type(f.type)}{'?' if f.optional else ''}"
                                       for f in vtype.fields) + " }"
    if isinstance(vtype, EnumType):
        return " | ".join(show_enum_value(v) for v in vtype.values)
    if isinstance(vtype, BoolType):
        return "bool"
    if isinstance(vtype, (TimeType, StringType)):
        return vtype.kind
    return vtype.describe()


# ---------------------------------------------------------------------------------------------
# Expressions

Scalar = bool | int | float | str


class Lit(Node):
    """A literal. `bare` marks an identifier written without quotes that resolved to an enum value."""

    kind: Literal["lit"] = "lit"
    value: Scalar
    bare: bool = False


class Var(Node):
    """A reference to a declared field, system variable or derived variable (or, before
    resolution, any bare identifier)."""

    kind: Literal["var"] = "var"
    name: str


class Unary(Node):
    kind: Literal["unary"] = "unary"
    op: Literal["not", "neg"]
    operand: Expr


class Binary(Node):
    kind: Literal["binary"] = "binary"
    op: BinOp
    left: Expr
    right: Expr


class Compare(Node):
    kind: Literal["compare"] = "compare"
    op: CmpOp
    left: Expr
    right: Expr


class InSet(Node):
    kind: Literal["in"] = "in"
    operand: Expr
    values: list[Lit]
    negated: bool = False


class BoolOp(Node):
    kind: Literal["bool"] = "bool"
    op: LogicOp
    operands: list[Expr]


class Call(Node):
    """`count(...)` counts true conditions; `min`/`max` are numeric."""

    kind: Literal["call"] = "call"
    func: Literal["count", "min", "max"]
    args: list[Expr]


class Get(Node):
    """`Metrics.latency`, `s.flown`: one field of a record value."""

    kind: Literal["get"] = "get"
    base: Expr
    field: str


class Item(Node):
    """The item variable of `any(s in L where …)` (`s`), read inside the condition."""

    kind: Literal["item"] = "item"
    name: str


class Quant(Node):
    """`any(s in L where C)`, `all(…)`, `count(…)`: C for each item `s` of the list L; `sum(V for s in L
    where C)`: the total of V over the items for which C holds (`value` is V; C is `true` without `where`)."""

    kind: Literal["quant"] = "quant"
    func: Literal["any", "all", "count", "sum"]
    var: str
    source: Expr
    cond: Expr
    value: Expr | None = None

    @property
    def every(self) -> bool:
        """Whether the condition keeps every item (`sum(V for x in L)`, written without `where`)."""
        return isinstance(self.cond, Lit) and self.cond.value is True


class Length(Node):
    """`len(L)`: the number of items of a list."""

    kind: Literal["len"] = "len"
    operand: Expr


class Member(Node):
    """`X in L` / `X not in L`: whether a value is one of a list's items."""

    kind: Literal["member"] = "member"
    operand: Expr
    source: Expr
    negated: bool = False


class Weighted(Node):
    """`count(2: A, 1: B)`: the sum of the weights of the true conditions."""

    kind: Literal["wcount"] = "wcount"
    weights: list[int | float]
    args: list[Expr]


class CaseArm(Node):
    when: Expr
    then: Expr


class CaseExpr(Node):
    """`case when C -> V ... otherwise V`: the first arm whose condition holds gives the value."""

    kind: Literal["case"] = "case"
    arms: list[CaseArm]
    otherwise: Expr


# ---- dates, durations, strings, optionals (docs/language.md §7)


class TimeLit(Node):
    """A date, datetime or duration constant: `date("2026-11-23")`, `datetime("…")`, `24 hours`.
    `value` is in seconds (see TimeType); `text` is how it was written."""

    kind: Literal["time"] = "time"
    unit: TemporalKind
    value: int | float
    text: str


class Func(Node):
    """A built-in function written by name: `abs(x)`, `days_between(a, b)`, `missing(X)`."""

    kind: Literal["func"] = "func"
    name: str
    args: list[Expr]


class Matches(Node):
    """`X matches "pattern"`: the whole string `X` matches the regular expression."""

    kind: Literal["matches"] = "matches"
    operand: Expr
    pattern: str
    pattern_span: Span = NO_SPAN


class ListLit(Node):
    """`[Billing, Network when NoSignal]`: the value of a list output (docs/language.md §5.4). Each item is
    kept when its condition holds (`conds[i]`; `true` for an item written without `when`)."""

    kind: Literal["listlit"] = "listlit"
    items: list[Expr]
    conds: list[Expr]

    @property
    def value(self) -> list[Scalar]:
        """The items of a constant list (an output default), each once, in written order."""
        out: list[Scalar] = []
        for item in self.items:
            if isinstance(item, Lit) and item.value not in out:
                out.append(item.value)
        return out


class Index(Node):
    """`Legs[0]`: the item at a position of a list (0 is the first). Reading past the end fails the run
    like reading a missing value (docs/language.md §7); `first(L)` and `last(L)` are `Func`s."""

    kind: Literal["index"] = "index"
    base: Expr
    index: int


FUNCTIONS = ("abs", "days_between", "missing", "first", "last")  # names a `Func` may call (dates are literals)
POSITIONS = ("first", "last")  # `first(L)`, `last(L)`: an item of a list by its position


Expr = Annotated[
    Lit | Var | Unary | Binary | Compare | InSet | BoolOp | Call | CaseExpr | TimeLit | Func | Matches | Get | Item
    | Quant | Length | Member | Weighted | ListLit | Index,
    Field(discriminator="kind"),
]

for _model in (Unary, Binary, Compare, InSet, BoolOp, Call, CaseArm, CaseExpr, Func, Matches, Get, Quant, Length,
               Member, Weighted, ListLit, Index):
    _model.model_rebuild()


# ---------------------------------------------------------------------------------------------
# Declarations

Role = Literal["field", "system", "derived"]


class Variable(Node):
    """A classification field (inferred by the agent), a system variable (from the backend) or a
    derived variable (computed from the others)."""

    name: str
    role: Role
    type: VarType | None = None
    description: str = ""
    unit: str | None = None
    money: bool = False
    hidden: bool = False
    expr: Expr | None = None
    observed: bool = False  # some stage observes it: its input is a list, one value per look
    volatile: bool = False  # `volatile`: changes on its own, every look may differ whatever the actions
    optional: bool = False  # `T?`: may be missing from the input; test it with `missing(X)`
    default: Lit | TimeLit | None = None  # `= value`: used when the input leaves it out


ACTION_ATTRIBUTES = ("escalation", "moves_money", "irreversible", "ends_dialogue")


class ActionParam(Node):
    """A typed parameter of an action (`action Pay(amount: float[0..))`)."""

    name: str
    type: VarType


class Action(Node):
    name: str
    description: str = ""
    params: list[ActionParam] = Field(default_factory=list)
    attributes: list[str] = Field(default_factory=list)
    attribute_spans: list[Span] = Field(default_factory=list)
    # `affects X, Y`: the observed variables the action can change; a look at one of them sees a new
    # value only after such an action (docs/language.md §6.5)
    affects: list[str] = Field(default_factory=list)
    affects_spans: list[Span] = Field(default_factory=list)

    @property
    def risky(self) -> bool:
        """Risky actions are the ones whose wrong use is a catastrophic failure."""
        return "moves_money" in self.attributes or "irreversible" in self.attributes


class Output(Node):
    """An extra final output besides `Action` (e.g. SAGE's PLAN)."""

    name: str
    type: VarType
    default: Lit | ListLit | None = None  # a list output's default is a list of values (`= []`)
    description: str = ""


# ---------------------------------------------------------------------------------------------
# Stages


class OutputAssign(Node):
    name: str
    value: Expr


class ActionCall(Node):
    """One action carried out on the way (`do Reboot(mode = Soft) -> check`): name and arguments.
    A for-each step (`for f in Fees where f.refundable do Refund(fee_id = f.id) -> next`) carries the
    action out once per item of `source` for which `cond` holds, in list order, the item variable
    `each` in scope in `cond` and the arguments."""

    action: str
    args: list[OutputAssign] = Field(default_factory=list)
    each: str | None = None
    source: Expr | None = None
    cond: Expr | None = None

    def exprs(self) -> list[Any]:
        """Every expression of the call: the list and condition of a for-each step, then the arguments."""
        head = [] if self.source is None else [self.source] if self.cond is None else [self.source, self.cond]
        return head + [a.value for a in self.args]


class Target(Node):
    """Where a branch goes: another stage, or a leaf that ends the SOP with an action.
    `steps` are the actions carried out first, in order (mid-flow actions that then go on);
    `args` are the arguments of the final action of a leaf."""

    kind: Literal["stage", "action"]
    stage: str | None = None
    action: str | None = None
    outputs: list[OutputAssign] = Field(default_factory=list)
    steps: list[ActionCall] = Field(default_factory=list)
    args: list[OutputAssign] = Field(default_factory=list)

    def describe(self) -> str:
        if self.kind == "stage":
            assert self.stage is not None  # a stage target always names its stage
            end = self.stage
        else:
            end = f"do {self.action}"
        if not self.steps:
            return end
        return " -> ".join([*(f"for {c.each} in {show(c.source)} do {c.action}" if c.each else f"do {c.action}"
                              for c in self.steps), end])


class Branch(Node):
    """One ordered arm. `guard is None` means `otherwise` (or the single arm of `-> target`).
    For `match` arms, `values` holds the arm's values and `guard` the equivalent membership test."""

    guard: Expr | None = None
    target: Target
    values: list[Lit] = Field(default_factory=list)
    limit: int | None = None  # `up to N times`: fires at most N times along one path
    ordered: bool = False  # written `otherwise when`: meant to apply only where the earlier arms do not


class Stage(Node):
    id: str
    title: str = ""
    text: str = ""
    classify: list[str] = Field(default_factory=list)
    observe: list[str] = Field(default_factory=list)  # variables looked at anew on entering
    kind: Literal["goto", "match", "when"]
    subject: Expr | None = None
    branches: list[Branch]
    origin: str | None = None  # the `use` instance a stage was inlined from


class MetaEntry(Node):
    key: str
    value: str


class Scenario(Node):
    """A whole program after includes are merged and subflows inlined."""

    ir_version: int = IR_VERSION
    name: str
    title: str = ""
    description: str = ""
    meta: dict[str, str] = Field(default_factory=dict)
    variables: dict[str, Variable] = Field(default_factory=dict)
    actions: dict[str, Action] = Field(default_factory=dict)
    outputs: dict[str, Output] = Field(default_factory=dict)
    stages: dict[str, Stage] = Field(default_factory=dict)
    start: str | None = None
    files: list[str] = Field(default_factory=list)
    source_hash: str = ""
    _engine: object = PrivateAttr(default=None)  # the compiled engine, built on first use
    # analyses built from this scenario (constraint space, path explorer); see `cached_analysis`
    _analyses: AnalysisCache = PrivateAttr(default_factory=lambda: AnalysisCache())

    def cached_analysis(self, key: str, signature: object, build: Callable[[], _T]) -> _T:
        """The analysis `key` built by `build()`, reused while `signature` (what it was built from) is
        unchanged, so an in-place edit of the IR gets a fresh one. It lives as long as the scenario."""
        return self._analyses.get_or_build(key, signature, build)

    @property
    def fields(self) -> list[Variable]:
        return [v for v in self.variables.values() if v.role == "field"]

    @property
    def system_vars(self) -> list[Variable]:
        return [v for v in self.variables.values() if v.role == "system"]

    @property
    def derived(self) -> list[Variable]:
        return [v for v in self.variables.values() if v.role == "derived"]

    @property
    def money_variable(self) -> str | None:
        """The variable summed for revenue at risk: `meta money`, else the first `money` variable."""
        if "money" in self.meta:
            return self.meta["money"]
        for var in self.variables.values():
            if var.money:
                return var.name
        return None

    def actions_with(self, attribute: str) -> list[str]:
        return [a.name for a in self.actions.values() if attribute in a.attributes]

    @property
    def step_actions(self) -> list[str]:
        """Actions carried out only on the way (never as a final action)."""
        steps: dict[str, None] = {}
        finals: set[str] = set()
        for stage in self.stages.values():
            for b in stage.branches:
                target = b.target
                if target.steps:
                    steps.update(dict.fromkeys(c.action for c in target.steps))
                if target.kind == "action" and target.action:
                    finals.add(target.action)
        return [a for a in steps if a in self.actions and a not in finals]

    @property
    def final_actions(self) -> list[str]:
        """Actions a path can end in (every declared action but the step-only ones)."""
        steps = set(self.step_actions)
        return [a for a in self.actions if a not in steps]

    @property
    def traced(self) -> bool:
        """Whether the program carries out actions on the way or gives actions arguments: its
        decisions then carry the action trace in outputs that used to show only the final action."""
        return any(b.target.steps or b.target.args for st in self.stages.values() for b in st.branches)

    @property
    def observed(self) -> list[str]:
        """Variables some stage observes: their input is a list, one value per look."""
        seen: dict[str, None] = {}
        for stage in self.stages.values():
            for name in stage.observe:
                seen.setdefault(name, None)
        return list(seen)

    @property
    def procedural(self) -> bool:
        """Whether the program observes values or bounds branches (it is then analysed unrolled)."""
        for st in self.stages.values():
            if st.observe:
                return True
            for b in st.branches:
                if b.limit is not None:
                    return True
        return False


# ---------------------------------------------------------------------------------------------
# Unparsing: expressions back to `.sop` syntax (edge labels, prompts, diagnostics)

_PREC = {"or": 1, "and": 2, "not": 3, "compare": 4, "in": 4, "+": 5, "-": 5, "*": 6, "/": 6,
         "neg": 7}


def show_value(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _fmt_num(value)
    return str(value)


def show(expr: object, parent: int = 0) -> str:
    """Render an expression in `.sop` syntax with minimal parentheses."""
    text, prec = _show(expr)
    return f"({text})" if prec < parent else text


def _show(e: object) -> tuple[str, int]:
    if isinstance(e, Lit):
        if isinstance(e.value, str) and (not e.bare or not _VALUE_WORD.match(e.value)):
            return quote_string(e.value), 9
        return show_value(e.value), 9
    if isinstance(e, Var):
        return e.name, 9
    if isinstance(e, Unary):
        if e.op == "not":
            return "not " + show(e.operand, 3), 3
        return "-" + show(e.operand, 7), 7
    if isinstance(e, Binary):
        p = _PREC[e.op]
        return f"{show(e.left, p)} {e.op} {show(e.right, p + 1)}", p
    if isinstance(e, Compare):
        return f"{show(e.left, 5)} {e.op} {show(e.right, 5)}", 4
    if isinstance(e, InSet):
        values = ", ".join(show(v) for v in e.values)
        kw = "not in" if e.negated else "in"
        return f"{show(e.operand, 5)} {kw} {{{values}}}", 4
    if isinstance(e, BoolOp):
        p = _PREC[e.op]
        return f" {e.op} ".join(show(o, p + 1) for o in e.operands), p
    if isinstance(e, Call):
        return f"{e.func}({', '.join(show(a) for a in e.args)})", 9
    if isinstance(e, CaseExpr):
        arms = " ".join(f"when {show(a.when)} -> {show(a.then)}" for a in e.arms)
        return f"case {{ {arms} otherwise -> {show(e.otherwise)} }}", 9
    if isinstance(e, TimeLit):
        return show_time(e), 9
    if isinstance(e, Func):
        return f"{e.name}({', '.join(show(a) for a in e.args)})", 9
    if isinstance(e, Matches):
        return f"{show(e.operand, 5)} matches {quote(e.pattern)}", 4
    return _show_data(e)


def _show_data(e: object) -> tuple[str, int]:
    """Lists, records and weighted counts in `.sop` syntax."""
    if isinstance(e, Get):
        return f"{show(e.base, 9)}.{e.field}", 9
    if isinstance(e, Item):
        return e.name, 9
    if isinstance(e, Quant):
        if e.func == "sum":
            where = "" if e.every else f" where {show(e.cond)}"
            return f"sum({show(e.value)} for {e.var} in {show(e.source, 5)}{where})", 9
        return f"{e.func}({e.var} in {show(e.source, 5)} where {show(e.cond)})", 9
    if isinstance(e, Length):
        return f"len({show(e.operand)})", 9
    if isinstance(e, Member):
        kw = "not in" if e.negated else "in"
        return f"{show(e.operand, 5)} {kw} {show(e.source, 5)}", 4
    if isinstance(e, Weighted):
        args = ", ".join(f"{_fmt_num(w)}: {show(a)}" for w, a in zip(e.weights, e.args, strict=True))
        return f"count({args})", 9
    if isinstance(e, ListLit):
        return "[" + ", ".join(show_list_item(i, c, show) for i, c in zip(e.items, e.conds, strict=True)) + "]", 9
    if isinstance(e, Index):
        return f"{show(e.base, 9)}[{e.index}]", 9
    return str(e), 9


def show_list_item(item: Any, cond: Any, shown: Callable[[Any], str]) -> str:
    """One item of a list literal: `A`, or `A when C` (an item kept only when `C` holds)."""
    if isinstance(cond, Lit) and cond.value is True:
        return shown(item)
    return f"{shown(item)} when {shown(cond)}"


_STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}
_TO_ESCAPE = re.compile(r'[\\"\n\t]')


def quote_string(value: str) -> str:
    """A string literal as written in `.sop`: the exact inverse of the parser's unquoting
    (`program.unquote`), so the text shown in labels, diagnostics and `sop fmt` reads back as the same
    value. The language has escapes for the quote, the backslash, the line break and the tab; any
    other character is written as it is (a STRING holds any character but a raw line break)."""
    if not _TO_ESCAPE.search(value):
        return f'"{value}"'  # most strings: nothing to escape
    return '"' + _TO_ESCAPE.sub(lambda m: _STRING_ESCAPES[m.group()], value) + '"'


_PATTERN_PIECE = re.compile(r'\\(.)|(\\)\Z|(")|(\n)', re.S)


def quote(text: str) -> str:
    """A pattern as written in `.sop`: its text as is (`\\d` stays `\\d`, the regex escapes are the
    user's), quotes escaped. The parser keeps a pattern's text but for `\\"`, which becomes `"`; this is
    its inverse on every text it gives. A text it cannot give (built in code) is still written so that it
    reads back as one token matching the same strings: an escaped quote as `\\"` (a regex `\\"` is `"`),
    a line break as `\\n`, a lone backslash at the end doubled."""
    if '"' not in text and "\\" not in text and "\n" not in text:
        return f'"{text}"'

    def piece(m: re.Match[str]) -> str:
        pair, lone, quote_mark, _ = m.groups()
        if pair is not None:
            return '\\"' if pair == '"' else ("\\n" if pair == "\n" else m.group())
        if lone is not None:
            return "\\\\"
        return '\\"' if quote_mark is not None else "\\n"

    return '"' + _PATTERN_PIECE.sub(piece, text) + '"'


def show_time(e: TimeLit) -> str:
    if e.unit == "duration":
        return e.text
    return f'{e.unit}("{e.text}")'


def show_call(action: str, args: list[OutputAssign]) -> str:
    """`do Reset(mode = Soft)` as written (without `do`)."""
    if not args:
        return action
    return f"{action}({', '.join(f'{a.name} = {show(a.value)}' for a in args)})"


EACH_WRITTEN = "#each"  # in an analysis form, the argument holding a for-each step as written (see `lower`)


def show_step(call: ActionCall) -> str:
    """A step as written, without `do`: `Reset(mode = Soft)`, or the head of a for-each step and its call
    (`for f in Fees where f.ok do Refund(id = f.id)`)."""
    if call.each is None:
        if call.args and call.args[0].name == EACH_WRITTEN and isinstance(call.args[0].value, Lit):
            return str(call.args[0].value.value)
        return show_call(call.action, call.args)
    where = "" if call.cond is None else f" where {show(call.cond)}"
    return f"for {call.each} in {show(call.source, 5)}{where} do {show_call(call.action, call.args)}"


def branch_label(stage: Stage, branch: Branch) -> str:
    """The guard of a branch as a short label: match values, a condition, or `otherwise`."""
    if stage.kind == "match" and branch.values:
        return ", ".join(show(v) for v in branch.values)
    if branch.guard is None:
        first = bool(stage.branches) and branch is stage.branches[0]
        return "otherwise" if stage.kind != "goto" and not first else ""
    return show(branch.guard)


def _case_children(expr: CaseExpr) -> list[Any]:
    out: list[Any] = []
    for arm in expr.arms:
        out += [arm.when, arm.then]
    return out + [expr.otherwise]


_CHILDREN: dict[type, Callable[[Any], list[Any]]] = {
    Unary: lambda e: [e.operand],
    Binary: lambda e: [e.left, e.right],
    Compare: lambda e: [e.left, e.right],
    InSet: lambda e: [e.operand, *e.values],
    BoolOp: lambda e: list(e.operands),
    Call: lambda e: list(e.args),
    Func: lambda e: list(e.args),
    Matches: lambda e: [e.operand],
    CaseExpr: _case_children,
    Get: lambda e: [e.base],
    Quant: lambda e: [e.source, e.cond] if e.value is None else [e.source, e.cond, e.value],
    Length: lambda e: [e.operand],
    Member: lambda e: [e.operand, e.source],
    Weighted: lambda e: list(e.args),
    ListLit: lambda e: [*e.items, *e.conds],
    Index: lambda e: [e.base],
}
_LEAVES = frozenset((Lit, Var, Item, TimeLit))


def children(expr: Any) -> list[Any]:
    """Direct sub-expressions of an expression node (the one child-walker every pass uses).
    Dispatched on the exact type (passes call it for every node of every expression: a chain of
    isinstance tests cost seconds on a 100k-stage program); a subclass takes the isinstance path."""
    kind = type(expr)
    if kind in _LEAVES:
        return []
    walk = _CHILDREN.get(kind)
    if walk is not None:
        return walk(expr)
    return _children_of_subclass(expr)


_NODE_FIELDS = ("operand", "left", "right", "otherwise", "base", "source", "cond", "value")


def map_children(expr: Any, fn: Callable[[Any], Any]) -> Any:
    """`expr` with `fn` applied to each direct sub-expression (`children`'s rebuilding counterpart, for
    passes that rename or rewrite): a copy when something is rebuilt, `expr` itself for a leaf. The
    values of an `in { ... }` set are literals and stay as they are."""
    update: dict[str, Any] = {}
    for key in _NODE_FIELDS:
        sub = getattr(expr, key, None)
        if isinstance(sub, Node):
            update[key] = fn(sub)
    for key in ("operands", "args", "items", "conds"):
        subs = getattr(expr, key, None)
        if isinstance(subs, list):
            update[key] = [fn(s) for s in subs]
    if isinstance(expr, CaseExpr):
        update["arms"] = [a.model_copy(update={"when": fn(a.when), "then": fn(a.then)}) for a in expr.arms]
    return expr.model_copy(update=update) if update else expr


def _children_of_subclass(expr: Any) -> list[Any]:
    if isinstance(expr, Unary):
        return [expr.operand]
    if isinstance(expr, (Binary, Compare)):
        return [expr.left, expr.right]
    if isinstance(expr, InSet):
        return [expr.operand, *expr.values]
    if isinstance(expr, BoolOp):
        return list(expr.operands)
    if isinstance(expr, Call):
        return list(expr.args)
    if isinstance(expr, Func):
        return list(expr.args)
    if isinstance(expr, Matches):
        return [expr.operand]
    if isinstance(expr, CaseExpr):
        out: list[Any] = []
        for arm in expr.arms:
            out += [arm.when, arm.then]
        return out + [expr.otherwise]
    if isinstance(expr, Get):
        return [expr.base]
    if isinstance(expr, Quant):
        return [expr.source, expr.cond] if expr.value is None else [expr.source, expr.cond, expr.value]
    if isinstance(expr, Length):
        return [expr.operand]
    if isinstance(expr, Member):
        return [expr.operand, expr.source]
    if isinstance(expr, Weighted):
        return list(expr.args)
    if isinstance(expr, ListLit):
        return [*expr.items, *expr.conds]
    if isinstance(expr, Index):
        return [expr.base]
    return []
