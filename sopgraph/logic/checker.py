"""Static checks: an ordered tuple of pure passes over a loaded scenario.

Each pass is a function `(scenario, graph) -> list[Diagnostic]`; `check` runs them in order and
collects every diagnostic before anyone fails, so a user sees all problems of a file at once.
A pass may name error-code prefixes that block it (`Pass.blocked_by`): the flow analysis, for
example, only makes sense once names and types are clean, and would otherwise drown the real
problem in consequences of it.

The one deliberate side effect: the type pass records the inferred type of each derived variable
on `Variable.type`, so later stages (flow analysis, prompts, the engine's callers) can use it.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import BaseModel, Field

from sopgraph.language import ir
from sopgraph.language.compile import START, Topology, topology
from sopgraph.language.diagnostics import (
    Diagnostic,
    SopError,
    clip,
    did_you_mean,
    error,
    mark_text_values,
    sort_key,
    warning,
)
from sopgraph.language.parse import MAX_DEPTH, load_source
from sopgraph.logic import domain, procheck
from sopgraph.logic.budget import CHECK_CPU_BUDGET, FLOW_SHARE, RANGES_SHARE, CpuBudget, budget_of
from sopgraph.logic.datacheck import (
    DataTyping,
    Lazy,
    Sym,
    Ty,
    add_bound,
    all_bounded,
    as_float,
    bool_of,
    kind_of,
    length_facts,
    mul_bounds,
    num_of,
    quote_list,
    span_or,
)
from sopgraph.logic.flow import flow_diagnostics
from sopgraph.logic.lower import structured
from sopgraph.logic.optcheck import optional_read_diagnostics
from sopgraph.logic.ranges import has_checked_outputs, output_range_diagnostics
from sopgraph.logic.scalarcheck import ScalarTyping, check_scalars

if TYPE_CHECKING:
    import networkx as nx

StageGraph: TypeAlias = "Topology | nx.DiGraph"
"""What the passes get as the stage graph: `compile.topology`'s structure (what `check` builds), or a
compiled `nx.DiGraph`; the passes read only `succ`, `pred` and `in`."""
PassFn = Callable[[ir.Scenario, StageGraph], list[Diagnostic]]
BudgetedFn = Callable[[ir.Scenario, StageGraph, CpuBudget], list[Diagnostic]]


@dataclass(frozen=True)
class Pass:
    """One static check. It is skipped when an earlier pass reported an error whose code starts
    with one of `blocked_by` (its findings would only be consequences of that error). An analysis that
    can run long also has `budgeted`: `check` then calls it with its part of the check's CPU budget, which
    leaves `share` (a fraction of the whole) for it when the passes before it run (`run` is the same
    analysis within its default budget, for callers that run one pass alone)."""
    name: str
    run: PassFn
    blocked_by: tuple[str, ...] = ()
    budgeted: BudgetedFn | None = None
    share: float = 0.0


# ---------------------------------------------------------------------------------------------
# Helpers

_SUGGEST_BUDGET = 400  # did-you-mean lookups per check; keeps pathological inputs fast


class _Suggester:
    """`did_you_mean` with a budget, so ten thousand typos against ten thousand names stay fast."""
    def __init__(self) -> None:
        self.left = _SUGGEST_BUDGET

    def __call__(self, name: str, candidates: Iterable[str]) -> str | None:
        if self.left <= 0:
            return None
        self.left -= 1
        pool = [c for c in candidates if abs(len(c) - len(name)) <= max(3, len(name) // 2)]
        return did_you_mean(name, pool)


# ---------------------------------------------------------------------------------------------
# Pass 1: declarations (ranges, enum values, action attributes, classify lists, the entry)


def _range_empty(t: ir.NumType) -> bool:
    """True when no value (no integer, for int) lies in the declared interval."""
    if t.lo is None or t.hi is None:
        return False
    if t.kind == "int":
        lo = math.floor(t.lo) + 1 if (t.lo_open and float(t.lo).is_integer()) else math.ceil(t.lo)
        hi = math.ceil(t.hi) - 1 if (t.hi_open and float(t.hi).is_integer()) else math.floor(t.hi)
        return lo > hi
    return t.lo > t.hi or (t.lo == t.hi and (t.lo_open or t.hi_open))


def _check_data_decl(owner: str, vtype: Any, span: ir.Span) -> list[Diagnostic]:
    """A list's length bounds (E203) and a record's field names (E102), then their inner types."""
    out: list[Diagnostic] = []
    if isinstance(vtype, ir.ListType):
        where = span_or(vtype.span, span)
        if vtype.max_len > ir.LIST_MAX_LIMIT:
            out.append(error("E203", f"the list `{owner}` may hold {vtype.max_len} items; lists hold at most "
                             f"{ir.LIST_MAX_LIMIT}", where,
                             f"write a smaller bound, e.g. `list[..{ir.LIST_MAX_LIMIT}] of ...` (the analyses "
                             "expand lists item by item)"))
        if vtype.min_len > vtype.max_len or vtype.min_len < 0:
            out.append(error("E203", f"the length range of `{owner}` is empty: {vtype.min_len} to "
                             f"{vtype.max_len} items", where, "write the lower bound first, e.g. `list[1..4] of ...`"))
        out += _check_type_decl(f"{owner}[]", vtype.item, span)
    elif isinstance(vtype, ir.RecordType):
        seen: set[str] = set()
        for field in vtype.fields:
            if field.name in seen:
                out.append(error("E102", f"field `{field.name}` of `{owner}` is declared twice",
                                 span_or(field.span, span), "rename one of them"))
            seen.add(field.name)
            if "." in field.name:
                out.append(error("E001", f"record field `{field.name}` contains a dot", span_or(field.span, span),
                                 "a field name is one word; nest records for structure"))
            out += _check_type_decl(f"{owner}.{field.name}", field.type, span)
    return out


def _scalar_only(owner: str, vtype: Any, span: ir.Span) -> list[Diagnostic]:
    """Outputs and action parameters carry one value: no lists or records (E201); an output may be a list
    of enum values."""
    if not ir.is_structured(vtype):
        return []
    hint = "use an enum, bool, int or float"
    if owner.startswith("output "):
        hint += "; a list output holds enum values: `list of A | B | C`"
    return [error("E201", f"`{owner}` is {kind_of(vtype)}; outputs and action parameters hold one value",
                  span_or(vtype.span, span), hint)]


def _enum_list(vtype: Any) -> bool:
    """`list of A | B`: the type of a list output (a set of enum values, docs/language.md §5.4)."""
    return isinstance(vtype, ir.ListType) and isinstance(vtype.item, ir.EnumType)


def _check_type_decl(owner: str, vtype: Any, span: ir.Span) -> list[Diagnostic]:
    out: list[Diagnostic] = _check_data_decl(owner, vtype, span)
    if isinstance(vtype, ir.NumType) and _range_empty(vtype):
        inverted = vtype.lo is not None and vtype.hi is not None and vtype.lo > vtype.hi
        what = "inverted" if inverted else "empty"
        out.append(error("E203", f"the range of `{owner}` is {what}: {vtype.describe()} contains no value",
                         span_or(vtype.span, span),
                         "write the lower bound first, e.g. `int[1..5]`" if inverted
                         else "widen the range or close its bounds, e.g. `int[1..2]`"))
    if isinstance(vtype, ir.EnumType):
        seen: set[str] = set()
        for value in vtype.values:
            if value in seen:
                out.append(error("E102", f"enum value `{value}` of `{owner}` is listed twice",
                                 span_or(vtype.span, span), "remove the repeated value"))
            seen.add(value)
            out += _quoted_value_problems(owner, value, span_or(vtype.span, span))
    return out


ENUM_VALUE_MAX = 200  # characters of a quoted enum value (prompts and schemas list every value)


def _quoted_value_problems(owner: str, value: str, span: ir.Span) -> list[Diagnostic]:
    """A quoted enum value (`"5+ times"`) is compared exactly: no empty, padded, multi-line or huge one (E005)."""
    shown = clip(ir.show_enum_value(value))
    if not value.strip():
        problem = "is empty"
    elif value != value.strip():
        problem = "starts or ends with a space"
    elif any(ord(c) < 32 or ord(c) == 127 for c in value):
        problem = "contains a control character (a line break or tab)"
    elif len(value) > ENUM_VALUE_MAX:
        problem = f"is longer than {ENUM_VALUE_MAX} characters"
    else:
        return []
    return [error("E005", f"enum value {shown} of `{owner}` {problem}", span,
                  "an enum value is compared exactly: write it on one line, without spaces at its ends")]


def check_declarations(scenario: ir.Scenario, graph: StageGraph) -> list[Diagnostic]:
    """Ranges (E203), repeated enum values, action attributes (E106), classify lists, the entry."""
    out: list[Diagnostic] = []
    suggest = _Suggester()
    for declared in scenario.variables.values():
        if declared.role != "derived":
            out += _check_type_decl(declared.name, declared.type, declared.span)
    for output in scenario.outputs.values():
        out += _check_type_decl(output.name, output.type, output.span)
        if not _enum_list(output.type):  # a list of enum values is an output's one structured type
            out += _scalar_only(f"output {output.name}", output.type, output.span)
    for action in scenario.actions.values():
        for param in action.params:  # lists and records too (docs/language.md §5.5)
            out += _check_type_decl(f"parameter {param.name} of {action.name}", param.type, param.span)
        seen: set[str] = set()
        spans = list(action.attribute_spans) + [action.span] * len(action.attributes)
        for attr, span in zip(action.attributes, spans, strict=False):
            if attr not in ir.ACTION_ATTRIBUTES:
                out.append(error("E106", f"unknown attribute `{attr}` on action `{action.name}`", span,
                                 suggest(attr, ir.ACTION_ATTRIBUTES)
                                 or "attributes are " + quote_list(ir.ACTION_ATTRIBUTES)))
            elif attr in seen:
                out.append(warning("W403", f"attribute `{attr}` is listed twice on `{action.name}`", span,
                                   "remove the repeated attribute"))
            seen.add(attr)
    fields = [v.name for v in scenario.fields]
    for stage in scenario.stages.values():
        seen = set()
        for name in stage.classify:
            var = scenario.variables.get(name)
            if var is None:
                out.append(error("E101", f"undefined field `{name}` in `classify` of stage `{stage.id}`",
                                 stage.span, suggest(name, fields)
                                 or ("declare it: `field " + name + ": A | B`")))
            elif var.role != "field":
                out.append(error("E108", f"`classify` lists `{name}`, which is a {var.role} variable, "
                                 "not a field", stage.span,
                                 "only fields are classified by the agent; "
                                 + ("system values come from the backend" if var.role == "system"
                                    else "derived values are computed from the others")))
            elif name in seen:
                out.append(warning("W403", f"`{name}` is listed twice in `classify` of stage `{stage.id}`",
                                   stage.span, "remove the repeated name"))
            seen.add(name)
    if scenario.stages and scenario.start is not None and scenario.start not in scenario.stages:
        out.append(error("E103", f"the entry stage `{scenario.start}` is not declared", scenario.span,
                         suggest(scenario.start, scenario.stages) or "`start` must name a declared stage"))
    return out


# ---------------------------------------------------------------------------------------------
# Pass 2: names used by branches (stages, actions, outputs)


_END_WORDS = frozenset({"end", "stop", "exit", "finish", "done", "close", "terminate"})


def check_targets(scenario: ir.Scenario, graph: StageGraph) -> list[Diagnostic]:
    """Undefined stages (E103), actions (E104) and outputs (E107); outputs assigned twice (E102)."""
    out: list[Diagnostic] = []
    suggest = _Suggester()
    for stage in scenario.stages.values():
        for branch in stage.branches:
            tgt = branch.target
            if tgt.kind == "stage":
                if tgt.stage not in scenario.stages:
                    span = span_or(tgt.span, branch.span)
                    name = tgt.stage or ""
                    hint = suggest(name, scenario.stages)
                    if hint is None and name in scenario.actions:
                        hint = f"`{name}` is an action: write `do {name}`"
                    elif hint is None and name.lower() in _END_WORDS:
                        ranked = sorted(scenario.actions.values(), key=lambda a: (
                            "ends_dialogue" not in a.attributes, a.risky))  # stable: declaration order
                        ending = ranked[0] if ranked else None
                        hint = (f"a procedure ends with an action, not a stage: write `-> do "
                                f"{ending.name if ending else 'ACTION'}` (the graph's end node is implicit)")
                    out.append(error("E103", f"undefined stage `{name}`", span,
                                     hint or "declare it with `stage " + name + " { ... }`"))
                continue
            if tgt.action not in scenario.actions:
                span = span_or(tgt.span, branch.span)
                name = tgt.action or ""
                hint = suggest(name, scenario.actions)
                if hint is None and name in scenario.stages:
                    hint = f"`{name}` is a stage: write `-> {name}` without `do`"
                out.append(error("E104", f"undefined action `{name}`", span,
                                 hint or f'declare it with `action {name} "what it does"`'))
            if not tgt.outputs:
                continue
            seen: set[str] = set()
            for assign in tgt.outputs:
                if assign.name == "Action":
                    out.append(error("E107", "`Action` is set by `do` and cannot be assigned",
                                     assign.span, "remove this assignment"))
                elif assign.name not in scenario.outputs:
                    out.append(error("E107", f"undefined output `{assign.name}`", assign.span,
                                     suggest(assign.name, scenario.outputs)
                                     or f"declare it with `output {assign.name}: A | B`"))
                elif assign.name in seen:
                    out.append(error("E102", f"output `{assign.name}` is assigned twice", assign.span,
                                     "keep one assignment"))
                seen.add(assign.name)
    return out


# ---------------------------------------------------------------------------------------------
# Pass 3: types


def _cycle_text(cycle: list[str]) -> str:
    if len(cycle) <= 12:
        return " -> ".join(cycle)
    return " -> ".join(cycle[:6]) + " -> ... -> " + " -> ".join(cycle[-4:]) + f" ({len(cycle) - 1} stages)"


class _Typer(ScalarTyping, DataTyping):
    """Infers expression types, reporting each misuse once, and derived variables' types."""
    def __init__(self, scenario: ir.Scenario):
        self.s = scenario
        self.out: list[Diagnostic] = []
        self.derived: dict[str, Ty] = {}
        self.visiting: list[str] = []
        self.reads: list[ir.Span] = []  # where each derived variable being visited was read
        self.suggest = _Suggester()
        self.cycles: set[frozenset[str]] = set()
        self.items: dict[str, Ty] = {}  # item variables of the enclosing `any`/`all`/`count(… where …)`
        self.lengths: dict[str, int] = {}  # lists known to hold at least so many items (`len(L) > 0 and …`)

    # -- reporting
    def undefined(self, sym: Sym, context: str, fallback: str | None = None) -> None:
        """A bare name where no enum gives it meaning: a variable that is not declared."""
        if not sym.bare:
            self.out.append(error("E201", f"the string {clip(ir.quote_string(sym.value))} is used {context}", sym.span,
                                  "strings are only values of enums"))
            return
        hint = self.suggest(sym.value, self.s.variables)
        if hint is None:
            owner = self.value_owner(sym.value)
            if owner is not None:
                hint = f"`{sym.value}` is a value of `{owner}`, not a variable"
        self.out.append(error("E101", f"undefined name `{sym.value}` (used {context})", sym.span,
                              hint or fallback
                              or f"declare `{sym.value}` as a field, system or derived variable"))

    def mismatch(self, message: str, span: ir.Span, hint: str | None = None, code: str = "E201") -> None:
        self.out.append(error(code, message, span, hint))

    def value_owner(self, value: str) -> str | None:
        """The first variable whose enum has `value` among its values."""
        return next((v.name for v in self.s.variables.values()
                     if isinstance(v.type, ir.EnumType) and value in v.type.values), None)

    def cycle_error(self, cycle: list[str], reads: list[ir.Span]) -> Diagnostic:
        """E205 for a cycle of derived variables (`reads[i]` is where `cycle[i + 1]` is read). A read of a
        name that is also an enum value (`let Damaged = P == Damaged`) was meant as the value: say so there."""
        text = "derived variable cycle: " + " -> ".join(cycle)
        for name, read in zip(cycle[1:], reads, strict=True):
            owner = self.value_owner(name)
            if owner is not None:
                return error("E205", f"{text}: `{name}` here is the derived variable, not the value of `{owner}`",
                             read, f"`{name}` is both a variable and a value of `{owner}`; rename one of them, "
                                   f'or write the value as "{name}"')
        return error("E205", text, self.s.variables[cycle[0]].span,
                     "a derived variable cannot depend on itself; compute it from fields and system variables")

    # -- variables
    def var_type(self, name: str, span: ir.Span) -> Ty:
        var = self.s.variables.get(name)
        if var is None:
            return None
        if var.role != "derived":
            return var.type
        if name in self.derived:
            return self.derived[name]
        if name in self.visiting:
            at = self.visiting.index(name)
            cycle = self.visiting[at:] + [name]
            key = frozenset(cycle)
            if key not in self.cycles:
                self.cycles.add(key)
                self.out.append(self.cycle_error(cycle, self.reads[at + 1:] + [span]))
            return None
        self.visiting.append(name)
        self.reads.append(span)
        t = self.infer(var.expr) if var.expr is not None else None
        self.visiting.pop()
        self.reads.pop()
        if isinstance(t, Sym):
            self.undefined(t, "as the whole value of a derived variable")
            t = None
        elif ir.is_structured(t):
            self.mismatch(f"derived variable `{name}` is {kind_of(t)}: a `let` gives one value", var.span,
                          "compute a single value from it, e.g. `len(...)`, `any(x in ... where ...)` or a field")
            t = None
        self.derived[name] = t
        return t

    # -- expectations
    def declared_type(self, name: str) -> Any:
        """The declared type of a field or system variable `name` (None for anything else)."""
        var = self.s.variables.get(name)
        return None if var is None or var.role == "derived" else var.type

    def plainly_bool(self, e: Any) -> bool:
        """Whether `e` is, by its exact shape, a condition with nothing to report: a bool variable, or
        a number variable compared with a number (most guards of a large file; `infer` would build a
        type for each node and find nothing)."""
        kind = type(e)
        if kind is ir.Var:
            return type(self.declared_type(e.name)) is ir.BoolType
        if kind is ir.Compare and type(e.left) is ir.Var and type(e.right) is ir.Lit:
            value = e.right.value
            return (type(value) is int or type(value) is float) and type(self.declared_type(e.left.name)) is ir.NumType
        return False

    def expect_bool(self, e: Any, what: str) -> None:
        if self.plainly_bool(e):
            return
        t = self.infer(e)
        if isinstance(t, Sym):
            self.undefined(t, "as a condition")
        elif t is not None and not isinstance(t, ir.BoolType):
            hint = None
            if isinstance(t, ir.EnumType):
                hint = f"compare it with a value: `{clip(ir.show(e))} == {t.values[0]}`"
            elif isinstance(t, ir.NumType):
                hint = f"compare it with a number: `{clip(ir.show(e))} > 0`"
            elif isinstance(t, ir.ListType):
                hint = f"test its items: `any(x in {clip(ir.show(e))} where ...)`, or its length: `len({clip(ir.show(e))}) > 0`"
            elif isinstance(t, ir.RecordType):
                hint = "read one of its fields: " + quote_list(f"{clip(ir.show(e))}.{f.name}" for f in t.fields)
            self.mismatch(f"{what} `{clip(ir.show(e))}` is {kind_of(t)}, not a condition", e.span, hint)

    def expect_num(self, e: Any, t: Ty, what: str) -> ir.NumType | None:
        if isinstance(t, ir.NumType):
            return t
        if isinstance(t, Sym):
            self.undefined(t, f"in {what}")
        elif t is not None:
            hint = "arithmetic works on int and float values only"
            if isinstance(t, ir.BoolType):
                hint += f"; to count a condition as a number, weigh it: `count(2: {clip(ir.show(e))})` is 2 when it holds"
            self.mismatch(f"{what} on {kind_of(t)}: `{clip(ir.show(e))}` is not a number", e.span, hint)
        return None

    # -- inference
    def infer(self, e: Any) -> Ty:
        if isinstance(e, ir.Lit):
            v = e.value
            if isinstance(v, bool):
                return bool_of(e.span)
            if isinstance(v, (int, float)):
                exact = as_float(v)
                return num_of("int" if isinstance(v, int) else "float", exact, exact)
            return Sym(v, e.bare, e.span)
        if isinstance(e, ir.Var):
            return self.var_type(e.name, e.span)
        if isinstance(e, ir.Unary):
            if e.op == "not":
                self.expect_bool(e.operand, "`not` of")
                return bool_of(e.span)
            inner_t = self.infer(e.operand)
            if isinstance(inner_t, ir.TimeType) and inner_t.kind == "duration":
                return inner_t
            t = self.expect_num(e.operand, inner_t, "negation")
            if t is None:
                return None
            return num_of(t.kind, None if t.hi is None else -t.hi, None if t.lo is None else -t.lo)
        if isinstance(e, ir.Binary):
            return self.binary(e)
        if isinstance(e, ir.Compare):
            self.compare(e)
            return bool_of(e.span)
        if isinstance(e, ir.InSet):
            self.membership(e.operand, self.infer(e.operand), e.values, "`in` set")
            return bool_of(e.span)
        if isinstance(e, ir.BoolOp):
            if e.op == "and" and any(isinstance(o, (ir.Compare, ir.Quant)) for o in e.operands[:-1]):
                self.conjunction(e.operands)
            else:
                for operand in e.operands:
                    self.expect_bool(operand, f"`{e.op}` needs conditions, but")
            return bool_of(e.span)
        if isinstance(e, ir.Call):
            return self.call(e)
        if isinstance(e, ir.CaseExpr):
            return self.case(e)
        if isinstance(e, ir.TimeLit):
            return ir.TimeType(kind=e.unit, span=e.span)
        if isinstance(e, ir.Func):
            return self.position(e) if e.name in ir.POSITIONS else self.func(e)
        if isinstance(e, ir.Matches):
            return self.matches_type(e)
        return self.infer_data(e)

    def binary(self, e: ir.Binary) -> Ty:
        what = {"+": "addition", "-": "subtraction", "*": "multiplication", "/": "division"}[e.op]
        la, lb = self.infer(e.left), self.infer(e.right)
        handled, scalar = self.temporal_binary(e, la, lb)
        if handled:
            return scalar
        a = self.expect_num(e.left, la, what)
        b = self.expect_num(e.right, lb, what)
        if a is None or b is None:
            return None
        kind: ir.NumKind = "int" if a.kind == b.kind == "int" and e.op != "/" else "float"
        if e.op == "+":
            return num_of(kind, add_bound(a.lo, b.lo), add_bound(a.hi, b.hi))
        if e.op == "-":
            return num_of(kind, add_bound(a.lo, b.hi, -1), add_bound(a.hi, b.lo, -1))
        if e.op == "*":
            return num_of(kind, *mul_bounds(a, b))
        return num_of(kind, None, None)

    def call(self, e: ir.Call) -> Ty:
        if e.func == "count":
            for arg in e.args:
                self.expect_bool(arg, "`count` counts conditions, but")
            return num_of("int", 0.0, float(len(e.args)))
        inferred = [self.infer(a) for a in e.args]
        handled, scalar = self.temporal_extreme(e, inferred)
        if handled:
            return scalar
        checked = [self.expect_num(a, t, f"`{e.func}`") for a, t in zip(e.args, inferred, strict=True)]
        nums = [n for n in checked if n is not None]
        if len(nums) < len(checked):
            return None
        kind: ir.NumKind = "int" if all(n.kind == "int" for n in nums) else "float"
        los = [n.lo for n in nums]
        his = [n.hi for n in nums]
        if e.func == "min":
            # min(x, y) lies below every argument's upper bound, above the lowest lower bound.
            lo = all_bounded(los, min)
            bounded = [h for h in his if h is not None]
            hi = min(bounded) if bounded else None
        else:
            bounded = [lo_ for lo_ in los if lo_ is not None]
            lo = max(bounded) if bounded else None
            hi = all_bounded(his, max)
        return num_of(kind, lo, hi)

    def conjunction(self, operands: list[Any]) -> None:
        """`A and B and …`: each operand typed knowing the ones before it hold (`len(L) > 0 and first(L)…`)."""
        saved = self.lengths
        self.lengths = dict(saved)
        try:
            for operand in operands:
                self.expect_bool(operand, "`and` needs conditions, but")
                for name, n in length_facts(operand).items():
                    self.lengths[name] = max(self.lengths.get(name, 0), n)
        finally:
            self.lengths = saved

    def case(self, e: ir.CaseExpr) -> Ty:
        types = []
        for arm in e.arms:
            self.expect_bool(arm.when, "`when` needs a condition, but")
            with self.knowing(arm.when):
                types.append((arm.then, self.infer(arm.then)))
        types.append((e.otherwise, self.infer(e.otherwise)))
        known = [(x, t) for x, t in types if t is not None]
        if not known:
            return None
        has_value = [t for _, t in known if isinstance(t, (Sym, ir.EnumType))]
        if len(has_value) == len(known):
            values: dict[str, None] = {}
            for _, t in known:
                for v in ([t.value] if isinstance(t, Sym) else t.values):  # type: ignore[union-attr]
                    values.setdefault(v, None)
            return ir.EnumType(values=list(values), span=e.span)
        # Mixed: bare names among numbers/bools are names that were meant to be variables.
        for _x, t in known:
            if isinstance(t, Sym):
                self.undefined(t, "as a `case` result")
        rest = [(x, t) for x, t in known if not isinstance(t, Sym)]
        first_x, first = rest[0]
        for x, t in rest[1:]:
            if type(t) is not type(first):
                self.mismatch(f"`case` results have different types: `{clip(ir.show(first_x))}` is {kind_of(first)} "
                              f"but `{clip(ir.show(x))}` is {kind_of(t)}", x.span,
                              "every arm of a `case` must give the same type")
                return None
        if isinstance(first, ir.NumType):
            nums = [t for _, t in rest if isinstance(t, ir.NumType)]  # all are: same type as `first`
            kind: ir.NumKind = "int" if all(n.kind == "int" for n in nums) else "float"
            los = [n.lo for n in nums]
            his = [n.hi for n in nums]
            return num_of(kind, all_bounded(los, min), all_bounded(his, max))
        if isinstance(first, ir.EnumType):
            values = {}
            for _, t in rest:
                for v in t.values:  # type: ignore[union-attr]
                    values.setdefault(v, None)
            return ir.EnumType(values=list(values), span=e.span)
        return first

    def compare(self, e: ir.Compare) -> None:
        lt, rt = self.infer(e.left), self.infer(e.right)
        if lt is None or rt is None:
            return
        ordering = e.op not in ("==", "!=")
        shown = Lazy(e)
        if isinstance(lt, Sym) and isinstance(rt, Sym):
            if lt.bare:
                self.undefined(lt, "in a comparison")
            elif rt.bare:
                self.undefined(rt, "in a comparison")
            else:
                self.mismatch(f"`{shown}` compares two constants", e.span, "compare a variable with a value")
            return
        if self.scalar_compare(e, lt, rt):
            return
        if isinstance(rt, ir.EnumType) and not isinstance(lt, ir.EnumType):
            lt, rt = rt, lt
            left_e, right_e = e.right, e.left
        else:
            left_e, right_e = e.left, e.right
        if isinstance(lt, ir.EnumType):
            if isinstance(rt, Sym):
                if ordering:
                    self.mismatch(f"enum values have no order: `{shown}`", e.span,
                                  "use `==`, `!=` or `in { ... }` with enum values")
                self.enum_value(lt, rt, left_e)
            elif isinstance(rt, ir.EnumType):
                if ordering:
                    self.mismatch(f"enum values have no order: `{shown}`", e.span,
                                  "use `==` or `!=` with enum values")
                elif not set(lt.values) & set(rt.values):
                    self.mismatch(f"`{clip(ir.show(left_e))}` and `{clip(ir.show(right_e))}` have no value in common, so "
                                  f"`{shown}` is constant", e.span,
                                  "compare each variable with one of its own values")
            else:
                self.mismatch(f"comparing an enum with {kind_of(rt)}: `{shown}`", e.span,
                              self.collision_hint(lt, right_e)
                              or f"`{clip(ir.show(left_e))}` is one of " + quote_list(lt.values))
            return
        if isinstance(lt, Sym) or isinstance(rt, Sym):
            sym, other = (lt, rt) if isinstance(lt, Sym) else (rt, lt)
            if isinstance(other, ir.BoolType):
                self.undefined(sym, "in a comparison with a bool",  # type: ignore[arg-type]
                               "a bool is compared with `true` or `false`")
            else:
                self.undefined(sym, "in a comparison with a number")  # type: ignore[arg-type]
            return
        if isinstance(lt, ir.BoolType) and isinstance(rt, ir.BoolType):
            if ordering:
                self.mismatch(f"bools have no order: `{shown}`", e.span, "use `==`, `!=` or `not`")
            return
        if isinstance(lt, ir.NumType) and isinstance(rt, ir.NumType):
            return
        self.mismatch(f"comparing {kind_of(lt)} with {kind_of(rt)}: `{shown}`", e.span,
                      "both sides of a comparison must be of the same kind")

    def collision_hint(self, enum: ir.EnumType, other: Any) -> str | None:
        if isinstance(other, ir.Var) and other.name in enum.values:
            return (f"`{other.name}` is both a variable and a value of this enum; rename one of them, or "
                    f'write the value as "{other.name}"')
        return None

    def enum_value(self, enum: ir.EnumType, sym: Sym, subject: Any, code: str = "E202") -> bool:
        if sym.value in enum.values:
            return True
        hint = "its values are " + quote_list(enum.values)
        close = self.suggest(sym.value, enum.values)
        if close:
            hint = f"{close} ({hint})"
        elif sym.bare and sym.value in ("else", "default") and code == "E202":
            hint = f"for the remaining values write `otherwise -> ...` ({hint})"
        owner = f"output `{subject.name}`" if code == "E204" else f"`{clip(ir.show(subject))}`"
        self.out.append(error(code, f"`{clip(sym.value)}` is not a value of {owner}", sym.span, hint))
        return False

    def membership(self, subject: Any, st: Ty, values: list[ir.Lit], what: str) -> None:
        """Values of a `match` arm or an `in { ... }` set against the subject's type."""
        if _plain_members(st, values):
            return
        if isinstance(st, Sym):
            self.undefined(st, f"as the subject of {what}")
            return
        if st is None or self.scalar_member(subject, st, values, what):
            return
        if ir.is_structured(st):
            self.mismatch(f"{what} on `{clip(ir.show(subject))}`, which is {kind_of(st)}", subject.span,
                          "match a single value: a field, `len(...)` or a condition")
            return
        for lit in values:
            lt = self.infer(lit)
            if isinstance(st, ir.EnumType):
                if isinstance(lt, Sym):
                    self.enum_value(st, lt, subject)
                else:
                    self.mismatch(f"{what} value `{clip(ir.show(lit))}` is {kind_of(lt)}, not a value of "
                                  f"`{clip(ir.show(subject))}`", lit.span, "its values are " + quote_list(st.values))
            elif isinstance(st, ir.BoolType):
                if not isinstance(lt, ir.BoolType):
                    self.mismatch(f"{what} value `{clip(ir.show(lit))}` is not a bool, but `{clip(ir.show(subject))}` is",
                                  lit.span, "a bool is matched with `true` and `false`")
            elif isinstance(st, ir.NumType):
                if not isinstance(lt, ir.NumType):
                    self.mismatch(f"{what} value `{clip(ir.show(lit))}` is not a number, but `{clip(ir.show(subject))}` "
                                  "is", lit.span, "match a number with numbers, e.g. `0 -> ...`")
                elif st.kind == "int" and isinstance(lit.value, float) and not lit.value.is_integer():
                    self.mismatch(f"{what} value `{clip(ir.show(lit))}` is not an integer, but "
                                  f"`{clip(ir.show(subject))}` is", lit.span, "this arm can never match; use whole numbers")


def _typer(scenario: ir.Scenario) -> _Typer:
    """A typer that has inferred (and recorded on `Variable.type`) every derived variable."""
    typer = _Typer(scenario)
    derived = scenario.derived
    for var in derived:
        typer.var_type(var.name, var.span)
    for var in derived:
        t = typer.derived.get(var.name)
        var.type = t if isinstance(t, (ir.EnumType, ir.BoolType, ir.NumType, ir.TimeType, ir.StringType)) else None
    return typer


def _plain_members(st: Ty, values: list[ir.Lit]) -> bool:
    """Whether every value is, by its exact type, one of the enum `st`'s values (a string) or a bool
    for the bool `st`: what `membership` accepts without a word (most match arms of a large file)."""
    kind = type(st)
    if kind is ir.EnumType:
        allowed = st.values  # type: ignore[union-attr] # an EnumType
        for lit in values:  # a loop, not `all(...)`: called for each arm
            if type(lit) is not ir.Lit or type(lit.value) is not str or lit.value not in allowed:
                return False
        return True
    if kind is ir.BoolType:
        for lit in values:  # noqa: SIM110 - a loop, as above
            if type(lit) is not ir.Lit or type(lit.value) is not bool:
                return False
        return True
    return False


def condition_type_errors(scenario: ir.Scenario, condition: Any) -> list[Diagnostic]:
    """Type errors (E201) of one condition written outside the program (a profile intent's `when:` or
    `requires:`), as the checker reports them in guards: a date compared with a number, a string
    with an order, arithmetic on an enum. Names are the caller's to check."""
    typer = scenario.cached_analysis("condition_typer", domain.variables_signature(scenario), lambda: _typer(scenario))
    found = len(typer.out)
    typer.expect_bool(condition, "a condition")
    new = typer.out[found:]
    del typer.out[found:]  # the typer is shared: each condition reports only its own errors
    return [d for d in new if d.code == "E201"]


def infer_types(scenario: ir.Scenario) -> list[Diagnostic]:
    """Infer each derived variable's type and store it on `Variable.type` (None when it cannot be
    typed); returns the diagnostics found in derived expressions. Idempotent."""
    return _typer(scenario).out


def check_types(scenario: ir.Scenario, graph: StageGraph) -> list[Diagnostic]:
    """Type errors in derived variables, guards, match arms, output values and defaults; infers
    and records derived variables' types (see `infer_types`)."""
    typer = _typer(scenario)
    for output in scenario.outputs.values():
        if output.default is not None:
            typer.output_value(output, output.default, span_or(output.default.span, output.span))
    for stage in scenario.stages.values():
        if stage.kind == "match" and stage.subject is not None:
            st = typer.infer(stage.subject)
            if isinstance(st, Sym):
                typer.undefined(st, "as the subject of `match`")
                st = None
            for branch in stage.branches:
                values = branch.values
                if values and not _plain_members(st, values):  # as `membership` tests first (most arms)
                    typer.membership(stage.subject, st, values, "match arm")
        else:
            for branch in stage.branches:
                if branch.guard is not None:
                    typer.expect_bool(branch.guard, "the condition")
        for branch in stage.branches:
            if not branch.target.outputs:
                continue
            for assign in branch.target.outputs:
                declared_output = scenario.outputs.get(assign.name)
                if declared_output is None:
                    typer.infer(assign.value)  # still report undefined names inside
                else:
                    typer.output_value(declared_output, assign.value, span_or(assign.value.span, assign.span))
    return typer.out


# ---------------------------------------------------------------------------------------------
# Pass 4: the stage graph (no stages, unreachable stages, cycles, stages that cannot end)


def _bfs_order(graph: StageGraph, source: str) -> dict[str, int]:
    order: dict[str, int] = {}
    if source not in graph:
        return order
    queue = deque([source])
    order[source] = 0
    succ = graph.succ
    while queue:
        node = queue.popleft()
        for nxt in succ[node]:
            if nxt not in order:
                order[nxt] = len(order)
                queue.append(nxt)
    return order


def _shortest_cycle(graph: nx.DiGraph, members: set[str], head: str) -> list[str]:
    """A shortest cycle through `head` inside one strongly connected component."""
    parent: dict[str, str | None] = {head: None}
    queue = deque([head])
    while queue:
        node = queue.popleft()
        for nxt in graph.successors(node):
            if nxt == head:
                path = [node]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])  # type: ignore[arg-type]
                return list(reversed(path)) + [head]
            if nxt in members and nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return [head, head]  # pragma: no cover - an SCC always has a cycle through each member


# A structural cycle is harmless when its guards can never all hold at once (values are fixed along
# a path): e.g. `step4 -> step6` only for complaints and `step8 -> step4` only for refunds. The
# analysis below is deliberately small and sound: it reads finite-domain facts (enum and bool
# variables, including derived ones) from guards, and ignores everything else, so "infeasible"
# is only ever claimed when it is certain.

_Facts = dict[str, frozenset]
_CYCLE_LIMIT = 64  # simple cycles examined per strongly connected component
_CHOICE_LIMIT = 4096  # branch combinations examined per cycle


def _domain(scenario: ir.Scenario, name: str) -> frozenset | None:
    var = scenario.variables.get(name)
    t = var.type if var is not None else None
    if isinstance(t, ir.EnumType):
        return frozenset(t.values)
    if isinstance(t, ir.BoolType):
        return frozenset((True, False))
    return None


def _merge(a: _Facts | None, b: _Facts | None) -> _Facts | None:
    """Conjunction; None means contradiction."""
    if a is None or b is None:
        return None
    out = dict(a)
    for k, v in b.items():
        both = out[k] & v if k in out else v
        if not both:
            return None
        out[k] = both
    return out


def _either(options: list[_Facts | None]) -> _Facts | None:
    """Disjunction, over-approximated: a variable stays constrained only if every option constrains it."""
    live = [o for o in options if o is not None]
    if not live:
        return None
    keys = set(live[0]).intersection(*live[1:])
    return {k: frozenset().union(*(o[k] for o in live)) for k in keys}


def _facts(scenario: ir.Scenario, e: Any, positive: bool) -> _Facts | None:
    """Finite-domain facts implied by `e` being true (`positive`) or false; {} when nothing is known."""
    if isinstance(e, ir.Unary) and e.op == "not":
        return _facts(scenario, e.operand, not positive)
    if isinstance(e, ir.BoolOp):
        parts = [_facts(scenario, o, positive) for o in e.operands]
        if (e.op == "and") == positive:
            result: _Facts | None = {}
            for part in parts:
                result = _merge(result, part)
            return result
        return _either(parts)
    if isinstance(e, ir.Lit) and isinstance(e.value, bool):
        return {} if e.value == positive else None
    if isinstance(e, ir.Var):
        dom = _domain(scenario, e.name)
        if dom == frozenset((True, False)):
            return {e.name: frozenset((positive,))}
        return {}
    subject, values, member = None, None, positive
    if isinstance(e, ir.InSet) and isinstance(e.operand, ir.Var):
        subject, values = e.operand.name, {v.value for v in e.values}
        member = positive != e.negated
    elif isinstance(e, ir.Compare) and e.op in ("==", "!="):
        left, right = e.left, e.right
        if isinstance(right, ir.Var) and isinstance(left, ir.Lit):
            left, right = right, left
        if isinstance(left, ir.Var) and isinstance(right, ir.Lit):
            subject, values = left.name, {right.value}
            member = positive == (e.op == "==")
    if subject is None or values is None:
        return {}
    dom = _domain(scenario, subject)
    if dom is None:
        return {}
    allowed = frozenset(v for v in dom if (v in values) == member)
    return {subject: allowed} if allowed else None


def _branch_facts(scenario: ir.Scenario, stage: ir.Stage, index: int) -> _Facts | None:
    """Facts implied by the stage taking branch `index`: its guard holds and no earlier one does."""
    facts: _Facts | None = {}
    for i, branch in enumerate(stage.branches[: index + 1]):
        if branch.guard is None:
            continue
        facts = _merge(facts, _facts(scenario, branch.guard, i == index))
        if facts is None:
            return None
    return facts


def _cycle_feasible(scenario: ir.Scenario, cycle: list[str]) -> bool:
    """False only when no assignment can take every edge of the cycle (sound, not complete)."""
    options: list[list[_Facts]] = []
    for u, v in zip(cycle, cycle[1:], strict=False):
        stage = scenario.stages[u]
        facts = [_branch_facts(scenario, stage, i) for i, b in enumerate(stage.branches)
                 if b.target.kind == "stage" and b.target.stage == v]
        live = [f for f in facts if f is not None]
        if not live:
            return False
        options.append(live)
    # Depth-first over one branch choice per edge, iteratively (cycles can be thousands long).
    budget = _CHOICE_LIMIT + len(options)
    stack: list[tuple[int, _Facts]] = [(0, {})]
    while stack:
        i, acc = stack.pop()
        if i == len(options):
            return True
        for opt in reversed(options[i]):
            budget -= 1
            if budget < 0:
                return True  # too many combinations to be sure: assume it can be walked
            merged = _merge(acc, opt)
            if merged is not None:
                stack.append((i + 1, merged))
    return False


_DOMAIN_CYCLE_EDGES = 64  # longest cycle handed to the constraint domain
_DOMAIN_BOXES = 256  # boxes carried along one cycle before giving up


def _domain_rules_out(scenario: ir.Scenario, cycle: list[str]) -> bool:
    """Ask the constraint domain (`sopgraph.logic.domain`, exact on numbers too) whether no assignment
    can take every edge of the cycle. Best effort: any doubt, size limit or failure of the domain
    keeps the cycle (the error is then reported, never silently dropped)."""
    if len(cycle) - 1 > _DOMAIN_CYCLE_EDGES:
        return False
    try:
        boxes = [domain.full_box(scenario)]
        for u, v in zip(cycle, cycle[1:], strict=False):
            branches = scenario.stages[u].branches
            taken = []
            for i, branch in enumerate(branches):
                if branch.target.kind != "stage" or branch.target.stage != v:
                    continue
                current = list(boxes)
                for earlier in branches[:i]:
                    if earlier.guard is not None:
                        current = [b for box in current for b in domain.constrain(scenario, box, earlier.guard, False)]
                if branch.guard is not None:
                    current = [b for box in current for b in domain.constrain(scenario, box, branch.guard, True)]
                taken += current
            boxes = [b for b in taken if domain.is_feasible(scenario, b) is not False]
            if not boxes:
                return True
            if len(boxes) > _DOMAIN_BOXES:
                return False
        return False
    except Exception:  # noqa: BLE001 - a refinement must never turn a check into a crash
        return False


def _feasible_cycle(scenario: ir.Scenario, graph: nx.DiGraph, scc: set[str], head: str,
                    rank: Callable[[str], tuple[int, int]]) -> list[str] | None:
    """A cycle of the component that guards do not rule out (starting at its earliest stage), or
    None when every cycle needs contradictory guards. Too many cycles to examine: assume walkable."""
    import networkx as nx  # here: only a file with a cycle needs it (start-up of `sop check`)

    for n, cyc in enumerate(nx.simple_cycles(graph.subgraph(scc))):
        if n >= _CYCLE_LIMIT:
            return _shortest_cycle(graph, scc, head)
        first = min(range(len(cyc)), key=lambda i: rank(cyc[i]))
        path = cyc[first:] + cyc[:first] + [cyc[first]]
        if _cycle_feasible(scenario, path) and not _domain_rules_out(scenario, path):
            return path
    return None


def _has_cycle(graph: StageGraph, stages: dict[str, ir.Stage], declared: dict[str, int]) -> bool:
    """Whether the stage-to-stage edges form a cycle (Kahn's algorithm: peel stages no other stage
    leads to). Most programs have none, and then no strongly connected components are computed.
    Most of those write each stage before the stages it leads to: when every stage-to-stage edge goes
    to a later stage (`declared`: each stage's position), there is no cycle and nothing is peeled."""
    succ = graph.succ
    later = True
    for sid, at in declared.items():
        for nxt in succ[sid]:
            if declared.get(nxt, at + 1) <= at:
                later = False
                break
        if not later:
            break
    if later:
        return False
    waiting = dict.fromkeys(stages, 0)
    for sid in stages:
        for nxt in succ[sid]:
            if nxt in waiting:
                waiting[nxt] += 1
    free = [sid for sid, n in waiting.items() if n == 0]
    peeled = 0
    while free:
        sid = free.pop()
        peeled += 1
        for nxt in succ[sid]:
            if nxt in waiting:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    free.append(nxt)
    return peeled < len(waiting)


def check_structure(scenario: ir.Scenario, graph: StageGraph) -> list[Diagnostic]:
    """No stages (E304), cycles that guards do not rule out (E302, printed as `a -> b -> a`),
    cycles without exit (E303) and stages unreachable from the entry (W302)."""
    if not scenario.stages:
        return [error("E304", f"scenario `{scenario.name}` has no stages", scenario.span,
                      "add at least one `stage step1 { ... -> do SomeAction }`")]
    out: list[Diagnostic] = []
    order = _bfs_order(graph, START)
    declared = {sid: i for i, sid in enumerate(scenario.stages)}

    def rank(sid: str) -> tuple[int, int]:
        return (order.get(sid, len(order) + declared[sid]), declared[sid])

    # Branches to undefined stages/actions are reported as names; count them as ending here so
    # that one typo does not also claim that everything before it can never end.
    ends = (graph.exits if isinstance(graph, Topology) else
            {sid for sid, st in scenario.stages.items() for b in st.branches
             if (b.target.kind == "action") or b.target.stage not in scenario.stages})
    can_end: set[str] = set(ends)
    rev = deque(ends)
    stages, preds = scenario.stages, graph.pred
    while rev:
        node = rev.popleft()
        for pred in preds[node]:
            if pred not in can_end and pred in stages:
                can_end.add(pred)
                rev.append(pred)
    # procedures loop on purpose: their cycles are bounded or reported by `procheck.check_loops`
    sccs: Iterable[set[str]] = []
    if not _procedural(scenario, graph) and _has_cycle(graph, stages, declared):
        import networkx as nx  # here: only a file with a cycle needs it (start-up of `sop check`)

        # built directly: copying a subgraph view walks filtered adjacency views (quadratic-ish on 10k stages)
        stage_graph = nx.DiGraph()
        stage_graph.add_nodes_from(stages)
        succ = graph.succ
        stage_graph.add_edges_from((u, v) for u in stages for v in succ[u] if v in stages)
        sccs = nx.strongly_connected_components(stage_graph)
    for scc in sorted(sccs, key=lambda c: min(map(rank, c))):
        if len(scc) == 1:
            (only,) = scc
            if not stage_graph.has_edge(only, only):
                continue
        head = min(scc, key=rank)
        escapes = not scc.isdisjoint(can_end)
        members = ", ".join(f"`{s}`" for s in sorted(scc, key=rank))
        if not escapes:
            cycle = _shortest_cycle(stage_graph, set(scc), head)
        else:
            found = _feasible_cycle(scenario, stage_graph, set(scc), head, rank)
            if found is None:
                continue  # every cycle needs contradictory guards: it can never be walked
            cycle = found
        closing = scenario.stages[cycle[-2]]
        branch = next(b for b in closing.branches if b.target.kind == "stage" and b.target.stage == cycle[0])
        notes = []
        if len(scc) > len(cycle) - 1:
            notes.append(f"{len(scc)} stages are caught in this loop: {members}")
        out.append(error("E302", "cycle in the stage graph: " + _cycle_text(cycle),
                         span_or(branch.target.span, branch.span),
                         "values are fixed while the engine decides, so a cycle that can be entered never "
                         "ends; route this branch to a later stage or an action, or add guards that rule "
                         "the loop out", notes=notes))
        if not escapes:
            out.append(error("E303", f"stage `{head}` cannot reach an end: every branch of {members} leads "
                             "back into the cycle", scenario.stages[head].span,
                             "give one of these stages a branch that ends in `do <Action>`"))
    reachable = set(order)
    for sid, stage in scenario.stages.items():
        if sid not in reachable:
            hint = "route a branch to it, or delete it"
            if "." in sid:  # a subflow copy: the `use` is what to route to (or start with)
                instance = sid.split(".")[0]
                hint = (f"route a branch to `{instance}`, or write `start {instance}` to begin the procedure "
                        f"with it (without `start`, the entry is the first `stage` of the main file)")
            out.append(warning("W302", f"stage `{sid}` is unreachable from the entry `{scenario.start}`",
                               stage.span, hint))
    return out


# ---------------------------------------------------------------------------------------------
# Pass 5: unused declarations


def _uses(scenario: ir.Scenario) -> tuple[set[str], set[str | None], set[str]]:
    """What the program uses, in one walk over its stages: the variables some expression reads or a
    `classify` names (the names `reads` finds, gathered into one set), the actions done (final or a
    step, or named as a stage that does not exist: its E103 already says `do …`) and the outputs
    assigned. One walk, not four: each walk over 300k branches costs a quarter of a second on a large
    file."""
    variables: set[str] = set()
    done: set[str | None] = set()
    assigned: set[str] = set()
    stack = [var.expr for var in scenario.derived if var.expr is not None]
    var, lit, inset, compare = ir.Var, ir.Lit, ir.InSet, ir.Compare
    stages = scenario.stages
    for stage in stages.values():
        if stage.classify:
            variables.update(stage.classify)
        if stage.subject is not None:
            stack.append(stage.subject)
        for branch in stage.branches:
            guard: Any = branch.guard
            if guard is not None:  # the commonest guards read here, by exact shape; the walk below takes the rest
                kind = type(guard)
                if kind is inset and type(guard.operand) is var:
                    variables.add(guard.operand.name)  # the set's values are literals
                elif kind is compare and type(guard.left) is var and type(guard.right) in (var, lit):
                    variables.add(guard.left.name)
                    if type(guard.right) is var:
                        variables.add(guard.right.name)
                else:
                    stack.append(guard)
            target = branch.target
            if target.kind == "action":
                done.add(target.action)
            elif target.stage not in stages:  # `-> Refund` naming an action: E103 says "write `do Refund`"
                done.add(target.stage)
            if target.outputs or target.args or target.steps:
                done.update(c.action for c in target.steps)
                assigned.update(a.name for a in target.outputs)
                stack += [a.value for a in target.outputs]
                stack += [a.value for a in _call_args(target)]
    children = ir.children
    while stack:
        e = stack.pop()
        if type(e) is var or isinstance(e, var):
            variables.add(e.name)
            continue
        kids = children(e)
        if kids:
            stack += kids
    return variables, done, assigned


def _call_args(target: ir.Target) -> list[ir.OutputAssign]:
    """Arguments of every action a target carries out (steps and the final action); read-only (without
    steps it is the target's own list: most targets have neither steps nor arguments)."""
    if not target.steps:
        return target.args
    return [a for c in target.steps for a in c.args] + list(target.args)


def check_unused(scenario: ir.Scenario, graph: StageGraph) -> list[Diagnostic]:
    """Variables never read, actions never done, outputs never set and without default (W401), among
    the main file's declarations: an included file is shared, and one program rarely reads all of it."""
    out: list[Diagnostic] = []
    used, done, assigned = _uses(scenario)
    main = scenario.span.file
    role_word = {"field": "field", "system": "system variable", "derived": "derived variable"}
    for var in scenario.variables.values():
        if var.name not in used and var.span.file == main:
            out.append(warning("W401", f"{role_word[var.role]} `{var.name}` is never used", var.span,
                               "no guard, derived variable, output or `classify` reads it; use it or "
                               "delete it"))
    for action in scenario.actions.values():
        if action.name not in done and action.span.file == main:
            out.append(warning("W401", f"action `{action.name}` is never used", action.span,
                               "no branch ends in `do " + action.name + "`"))
    for output in scenario.outputs.values():
        if output.name not in assigned and output.default is None and output.span.file == main:
            out.append(warning("W401", f"output `{output.name}` is never assigned and has no default",
                               output.span, f"give it a default (`= value`) or set it in a `do "
                               f"<Action> {{ {output.name} = ... }}` block"))
    return out


def check_descriptions(scenario: ir.Scenario, graph: StageGraph) -> list[Diagnostic]:
    """Fields, system variables and actions without a description (W402): the agent, the user
    simulator and the judges see only what is written, so a bare name is a weak instruction."""
    out: list[Diagnostic] = []
    kinds = {"field": "field", "system": "system variable"}
    for var in scenario.variables.values():
        if var.role in kinds and not var.description.strip():
            out.append(warning("W402", f"{kinds[var.role]} `{var.name}` has no description", var.span,
                               f'add one after the declaration: `{var.role} {var.name}: ... "what it means"`'))
    for action in scenario.actions.values():
        if not action.description.strip():
            out.append(warning("W402", f"action `{action.name}` has no description", action.span,
                               f'add one: `action {action.name} "what the agent does"`'))
    return out


# ---------------------------------------------------------------------------------------------
# Pass 6: flow analysis (exhaustiveness, overlaps, infeasible paths) from `sopgraph.logic.flow`


def _procedural(scenario: ir.Scenario, graph: StageGraph) -> bool:
    """`scenario.procedural`, as `topology` found it in its walk (the passes do not change it)."""
    return graph.procedural if isinstance(graph, Topology) else scenario.procedural


def _needs_analysis_form(scenario: ir.Scenario, graph: StageGraph) -> bool:
    """`lower.needs_analysis_form`, with `_procedural`."""
    return _procedural(scenario, graph) or structured(scenario)


def check_flow(scenario: ir.Scenario, graph: StageGraph, *,
               cpu_budget: float | CpuBudget | None = None) -> list[Diagnostic]:
    """E301/W301/W303/W304/W305 from the constraint domain (`sopgraph.logic.flow`); procedures
    are analysed unrolled (`procheck.procedure_flow`). `cpu_budget`: CPU seconds or a `CpuBudget`
    (default: the flow's part of `sop check`'s)."""
    clock = budget_of(cpu_budget, CHECK_CPU_BUDGET * FLOW_SHARE)
    flow = functools.partial(flow_diagnostics, cpu_budget=clock)
    if _needs_analysis_form(scenario, graph):  # procedures unrolled, lists and records lowered
        return procheck.procedure_flow(scenario, flow, clock)
    return list(flow(scenario))


def check_procedures(scenario: ir.Scenario, graph: StageGraph) -> list[Diagnostic]:
    """Actions on the way and their arguments, observations, bounded loops (`procheck`)."""
    typer = _typer(scenario)
    # without steps, arguments or parameters there is no call to check; without observations or
    # bounds, no observation and no loop (as `topology` found them)
    calls = (not isinstance(graph, Topology) or graph.calls
             or any(a.params for a in scenario.actions.values()))
    found = procheck.check_calls(scenario, typer.arg_value, typer.call_scope) if calls else []
    found += [d.model_copy(update={"message": d.message.replace("output `", "parameter `")})
              for d in typer.out]
    if any(v.volatile for v in scenario.variables.values()):
        found += procheck.check_volatile(scenario)
    if _procedural(scenario, graph):
        found += procheck.check_observations(scenario)
        if not any(d.is_error for d in found):
            found += procheck.check_loops(scenario)
        found += procheck.check_still_retries(scenario)
    return found


def check_output_ranges(scenario: ir.Scenario, graph: StageGraph, *,
                        cpu_budget: float | CpuBudget | None = None) -> list[Diagnostic]:
    """E204 for assignments some feasible path drives outside the output's range (`sopgraph.logic.ranges`).
    Procedures, lists and records are searched in their analysis form, as the flow pass is: on the
    source form their paths and values cannot be explored, so nothing would ever be found. Past
    `cpu_budget` (default: `sop check`'s) an I304 note says where the search stopped."""
    if not has_checked_outputs(scenario):
        return []  # nothing to check: no analysis form, no path walked
    clock = budget_of(cpu_budget, CHECK_CPU_BUDGET)
    search = functools.partial(output_range_diagnostics, cpu_budget=clock)
    if _needs_analysis_form(scenario, graph):
        return procheck.procedure_flow(scenario, search, clock)
    return search(scenario)


def check_optional_reads(scenario: ir.Scenario, graph: StageGraph, *,
                         cpu_budget: float | CpuBudget | None = None) -> list[Diagnostic]:
    """W306 and I303 from `sopgraph.logic.optcheck`, within `cpu_budget` (default: `sop check`'s)."""
    return optional_read_diagnostics(scenario, cpu_budget=budget_of(cpu_budget, CHECK_CPU_BUDGET))


# ---------------------------------------------------------------------------------------------
# The pass list and the entry points

_SCALARS = Pass("scalars", lambda s, g: check_scalars(s, _expressions(s)))
"""The scalar pass; `check` gives it the expression list the depth check walked."""

PASSES: tuple[Pass, ...] = (
    Pass("declarations", check_declarations),
    Pass("targets", check_targets),
    Pass("types", check_types),
    _SCALARS,
    Pass("structure", check_structure),
    Pass("unused", check_unused),
    Pass("descriptions", check_descriptions),
    Pass("procedures", check_procedures, blocked_by=("E1", "E2")),
    Pass("flow", check_flow, blocked_by=("E1", "E2", "E302", "E303", "E304"),
         budgeted=lambda s, g, clock: check_flow(s, g, cpu_budget=clock), share=FLOW_SHARE),
    Pass("output ranges", check_output_ranges, blocked_by=("E1", "E2", "E302", "E303", "E304"),
         budgeted=lambda s, g, clock: check_output_ranges(s, g, cpu_budget=clock), share=RANGES_SHARE - FLOW_SHARE),
    Pass("optional reads", check_optional_reads, blocked_by=("E1", "E2", "E302", "E303", "E304"),
         budgeted=lambda s, g, clock: check_optional_reads(s, g, cpu_budget=clock), share=1 - RANGES_SHARE),
)
CHEAP_PASSES: tuple[Pass, ...] = tuple(p for p in PASSES if p.name not in ("flow", "optional reads"))


def _dedupe(diags: Iterable[Diagnostic]) -> list[Diagnostic]:
    seen: set[tuple] = set()
    out: list[Diagnostic] = []
    for d in diags:
        key = (d.code, d.message, d.span)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _expressions(scenario: ir.Scenario) -> list[Any]:
    """Every expression of the program: derived values, subjects, guards, outputs, arguments."""
    out = [var.expr for var in scenario.derived if var.expr is not None]
    for stage in scenario.stages.values():
        if stage.subject is not None:
            out.append(stage.subject)
        for branch in stage.branches:
            if branch.guard is not None:
                out.append(branch.guard)
            target = branch.target
            if target.outputs or target.args or target.steps:
                out += [a.value for a in target.outputs]
                out += [a.value for a in _call_args(target)]
    return out


def _depth(expr: Any) -> int:
    """Nesting depth of an expression, computed without recursion (it guards the recursive passes):
    one level of nodes at a time."""
    children = ir.children
    depth, level = 0, [expr]
    while level:
        depth += 1
        below: list[Any] = []
        for node in level:
            below += children(node)
        level = below
    return depth


_LEAF = frozenset((ir.Var, ir.Lit))


def _shallow(expr: Any) -> bool:
    """Whether an expression is at most two levels deep by its exact shape (a name, a literal, a set
    test or a comparison of names and literals: most guards), so `_depth` need not measure it."""
    kind = type(expr)
    if kind in _LEAF:
        return True
    if kind is ir.InSet:
        return type(expr.operand) in _LEAF  # its values are literals (`InSet.values: list[Lit]`)
    return kind is ir.Compare and type(expr.left) in _LEAF and type(expr.right) in _LEAF


def check_depth(scenario: ir.Scenario, expressions: list[Any] | None = None) -> list[Diagnostic]:
    """Expressions nested deeper than `MAX_DEPTH` (E006). Runs before everything else: graph
    building, type inference and the engine's code generation all recurse over expressions.
    `expressions`: the program's (`_expressions`), when the caller has them already."""
    out: list[Diagnostic] = []
    for expr in _expressions(scenario) if expressions is None else expressions:
        if _shallow(expr):
            continue
        depth = _depth(expr)
        if depth > MAX_DEPTH:
            out.append(error("E006", f"expression nested too deeply ({depth} levels; at most {MAX_DEPTH})",
                             expr.span, "split it into derived variables (`let`)"))
    return out


def check(scenario: ir.Scenario, passes: tuple[Pass, ...] = PASSES, *,
          graph: StageGraph | None = None, cpu_budget: float | CpuBudget | None = None) -> list[Diagnostic]:
    """Run every pass and return all diagnostics, sorted by file, line and column. Expressions
    nested too deeply (E006) are reported alone: nothing else can safely walk them. Pass the
    scenario's compiled `graph` when you have it (the passes only read its nodes and edges) to avoid
    building one; otherwise only its structure is built (`compile.topology`). The analyses that can run
    long share one CPU budget, `cpu_budget` (seconds or a command's `CpuBudget`; default
    `CHECK_CPU_BUDGET`, counted from here): each gets what the ones before it left, less the shares of
    the ones after it; past its part, each says in a note what it did not prove and where."""
    expressions = _expressions(scenario)  # one list for the depth check and the scalar pass (no pass changes them)
    found: list[Diagnostic] = check_depth(scenario, expressions)
    if found:
        return sorted(found, key=sort_key)
    if graph is None:
        graph = topology(scenario)
    clock = budget_of(cpu_budget, CHECK_CPU_BUDGET)
    for at, p in enumerate(passes):
        if p.blocked_by and any(d.is_error and d.code.startswith(p.blocked_by) for d in found):
            continue
        try:
            if p is _SCALARS:
                found += check_scalars(scenario, expressions)
            elif p.budgeted is not None:  # its part: what is left, less the shares of the analyses after it
                later = sum(q.share for q in passes[at + 1:] if q.budgeted is not None)
                found += p.budgeted(scenario, graph, clock.leaving(min(later, 1.0)))
            else:
                found += p.run(scenario, graph)
        except RecursionError:
            found.append(error("E001", "the program is nested too deeply to check", scenario.span,
                               "split very long or deeply nested expressions into derived variables"))
            break
    found = sorted(_dedupe(found), key=sort_key)
    mark_text_values(found, scenario)
    return found


check_scenario = check  # `load` takes a `check` flag, so it reaches the passes by this name


class Checked(BaseModel):
    """The result of checking one file: every diagnostic (loading and static) and the sources."""
    file: str
    diagnostics: list[Diagnostic] = Field(default_factory=list)
    sources: dict[str, str] = Field(default_factory=dict)
    scenario: ir.Scenario | None = Field(default=None, exclude=True)

    @property
    def errors(self) -> int:
        return sum(1 for d in self.diagnostics if d.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for d in self.diagnostics if d.severity == "warning")


def check_file(path: str | Path, *, text: str | None = None, name: str | None = None,
               include_path: Sequence[str | Path] = (),
               loading: Callable[[], AbstractContextManager[object]] = nullcontext,
               passes: tuple[Pass, ...] | None = None, cpu_budget: float | CpuBudget | None = None) -> Checked:
    """Load and check one file. Static checks run when the loader built a scenario and found no
    errors other than duplicate declarations (whose later copies it drops), so nothing is reported
    twice and a broken include or subflow does not cascade into undefined-stage errors. The loading
    runs inside `loading()`: the application's choice (`sop check` gives `perf.build_then_freeze`). `passes`: the
    static passes to run (default: all); `cpu_budget`: the analyses' CPU budget (see `check`)."""
    with loading():
        loaded = load_source(path, text=text, name=name, include_path=include_path)
    diags = list(loaded.diagnostics)
    sources = dict(loaded.sources)
    if loaded.scenario is not None and all(d.code == "E102" for d in diags if d.is_error):
        checked = check(loaded.scenario, PASSES if passes is None else passes, cpu_budget=cpu_budget)
        if not diags and all(d.code != "E006" for d in checked):
            # already sorted and without repeats: `check` returns them so, but for E006 (not deduplicated)
            return Checked(file=name or str(path), diagnostics=checked, sources=sources, scenario=loaded.scenario)
        diags += checked
    return Checked(file=name or str(path), diagnostics=sorted(_dedupe(diags), key=sort_key), sources=sources,
                   scenario=loaded.scenario)


BUDGET_NOTES = ("I302", "I303", "I304")
"""The notes of analyses that stopped short (a budget, an open question): what a command that loads shows."""


def load(path: str | Path | None = None, *, text: str | None = None, check: bool = True,
         flow: bool = True, include_path: Sequence[str | Path] = (),
         cpu_budget: float | CpuBudget | None = None) -> ir.Scenario:
    """Load a `.sop` program (file or text), merge includes, inline subflows and, by default,
    run the static checker. Raises `SopError` (with every diagnostic) if there are errors.
    `flow=False` runs the cheap passes only (names, types, structure, output ranges): what a command
    that just runs the SOP needs; the flow proofs (exhaustiveness, overlaps, dead branches) are `sop
    check`'s. `cpu_budget`: the CPU budget of the checks' analyses (see `check`)."""
    loaded = load_noted(path, text=text, check=check, flow=flow, include_path=include_path, cpu_budget=cpu_budget)
    assert loaded.scenario is not None  # `load_noted` raises otherwise
    return loaded.scenario


def load_noted(path: str | Path | None = None, *, text: str | None = None, check: bool = True,
               flow: bool = True, include_path: Sequence[str | Path] = (),
               cpu_budget: float | CpuBudget | None = None) -> Checked:
    """`load`, as a `Checked` whose diagnostics are the notes (`BUDGET_NOTES`) of the analyses that did not
    prove everything, for a command to show: a load-time check cut short by its CPU budget says so
    instead of passing silently. Raises `SopError` as `load` does."""
    loaded = load_source(path, text=text, include_path=include_path)
    diagnostics = list(loaded.diagnostics)
    if loaded.scenario is not None and check and not any(d.is_error for d in diagnostics):
        diagnostics += check_scenario(loaded.scenario, PASSES if flow else CHEAP_PASSES, cpu_budget=cpu_budget)
    errors = [d for d in diagnostics if d.is_error]
    if errors or loaded.scenario is None:
        raise SopError(errors or diagnostics, loaded.sources)
    return Checked(file=str(path) if path is not None else "<text>", sources=dict(loaded.sources),
                   diagnostics=[d for d in diagnostics if d.code in BUDGET_NOTES], scenario=loaded.scenario)


__all__ = [
    "BUDGET_NOTES",
    "load",
    "load_noted",
    "check_optional_reads",
    "PASSES",
    "CHEAP_PASSES",
    "Checked",
    "Pass",
    "check",
    "check_declarations",
    "check_depth",
    "check_descriptions",
    "check_file",
    "check_flow",
    "check_output_ranges",
    "check_structure",
    "check_targets",
    "check_types",
    "check_unused",
    "condition_type_errors",
    "infer_types",
]
