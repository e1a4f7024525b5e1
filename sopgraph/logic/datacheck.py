"""Types of the data expressions: lists, records and their items (docs/language.md §4 and §7).

Kept apart from the checker's core typer (a mixin it inherits, as `scalarcheck` is) so the rules of
structured data read in one place: `any`/`all`/`count`/`sum` over a list, `len`, `in` a list, record
fields, positions (`first(L)`, `last(L)`, `L[k]`), for-each steps (`for x in L where C do A(...)`) and
list or record arguments of actions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sopgraph.language import ir
from sopgraph.language.diagnostics import Diagnostic, clip, error, warning
from sopgraph.language.fastparse import mk
from sopgraph.logic.scalarcheck import time_kind_text


def quote_list(values: Iterable[str], limit: int = 8) -> str:
    items = [f"`{v}`" for v in values]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f", ... ({len(items)} in all)"
    return ", ".join(items)



def span_or(span: ir.Span, fallback: ir.Span) -> ir.Span:
    return span if span.line else fallback


@dataclass(frozen=True)
class Sym:
    """A bare identifier or quoted string: an enum value if the context has an enum, else a name
    that is not declared."""
    value: str
    bare: bool
    span: ir.Span


Ty = ir.EnumType | ir.BoolType | ir.NumType | ir.TimeType | ir.StringType | ir.ListType | ir.RecordType | Sym | None


def kind_of(t: Ty) -> str:
    if isinstance(t, ir.ListType):
        return "a list"
    if isinstance(t, ir.RecordType):
        return f"a record ({t.alias})" if t.alias else "a record"
    if isinstance(t, Sym):
        return f"the value `{t.value}`" if t.bare else f'the string "{t.value}"'
    if isinstance(t, ir.EnumType):
        return "an enum (" + ir.describe_type(t) + ")" if len(t.values) <= 6 else "an enum"
    if isinstance(t, ir.BoolType):
        return "a bool"
    if isinstance(t, ir.NumType):
        return "a number" if t.kind == "float" else "an integer"
    if isinstance(t, (ir.TimeType, ir.StringType)):
        return time_kind_text(t)
    return "unknown"


def all_bounded(bounds: list[float | None], pick: Callable[[list[float]], float]) -> float | None:
    """`pick` of the bounds when every one is finite; None (unbounded) when any is."""
    finite = [b for b in bounds if b is not None]
    return pick(finite) if len(finite) == len(bounds) else None


_FLOAT_OR_NONE = (float, type(None))


def num_of(kind: ir.NumKind, lo: float | None, hi: float | None) -> ir.NumType:
    """`ir.NumType(...)` of the given bounds; built without validation when they are already floats
    (or None) and the kind a known one: what validation would give, at a third of the cost (the
    checker types every literal and comparison of a large file)."""
    if type(lo) in _FLOAT_OR_NONE and type(hi) in _FLOAT_OR_NONE and (kind == "int" or kind == "float"):
        return mk(ir.NumType, kind=kind, lo=lo, hi=hi, lo_open=lo is None, hi_open=hi is None)
    return ir.NumType(kind=kind, lo=lo, hi=hi, lo_open=lo is None, hi_open=hi is None)


def _sum_bounds(item: ir.NumType | None, max_len: int | None) -> ir.NumType:
    """The type of `sum(V for x in L …)`: V's kind, between `max_len` times V's bounds and 0 (any item may be
    left out)."""
    if item is None:
        return num_of("float", None, None)
    lo = None if item.lo is None or max_len is None else min(0.0, item.lo * max_len)
    hi = None if item.hi is None or max_len is None else max(0.0, item.hi * max_len)
    return num_of(item.kind, lo, hi)


def bool_of(span: ir.Span) -> ir.BoolType:
    """`ir.BoolType(span=span)` without validation (a span is always a `Span` here)."""
    return mk(ir.BoolType, span=span)


def mul_bounds(a: ir.NumType, b: ir.NumType) -> tuple[float | None, float | None]:
    if None in (a.lo, a.hi, b.lo, b.hi):
        # Keep the common case exact: a non-negative quantity times a non-negative constant.
        if (a.lo is not None and a.lo >= 0 and b.lo is not None and b.lo >= 0):
            hi = None if (a.hi is None or b.hi is None) else a.hi * b.hi
            return a.lo * b.lo, hi
        return None, None
    products = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]  # type: ignore[operator]
    return min(products), max(products)


def as_float(value: int | float) -> float | None:
    """A literal as a bound; integers too large for a float are simply unbounded."""
    try:
        return float(value)
    except OverflowError:
        return None


def add_bound(x: float | None, y: float | None, sign: int = 1) -> float | None:
    return None if x is None or y is None else x + sign * y


class Lazy:
    """An expression unparsed only if a message needs it (checks of clean code stay cheap), and as a
    message quotes it (`clip`: a huge one is cut in the middle)."""
    def __init__(self, expr: Any):
        self.expr = expr

    def __str__(self) -> str:
        return clip(ir.show(self.expr))

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class DataTyping:
    """Mixin of the checker's typer for lists and records. Expects `infer`, `mismatch`, `undefined`,
    `enum_value`, `expect_bool`, `expect_num`, `suggest`, `out` and `items` from the host class."""

    s: ir.Scenario
    out: list[Diagnostic]
    items: dict[str, Any]
    lengths: dict[str, int]  # lists known to hold at least so many items where the current expression is read
    suggest: Callable[[str, Iterable[str]], str | None]

    def infer(self, e: Any) -> Any: ...  # provided by the host

    def mismatch(self, message: str, span: ir.Span, hint: str | None = None, code: str = "E201") -> None: ...

    def undefined(self, sym: Sym, context: str, fallback: str | None = None) -> None: ...

    def enum_value(self, enum: ir.EnumType, sym: Sym, subject: Any, code: str = "E202") -> bool:
        raise NotImplementedError  # provided by the host

    def expect_bool(self, e: Any, what: str) -> None: ...

    def expect_num(self, e: Any, t: Ty, what: str) -> ir.NumType | None: ...

    # -- lists, records, weighted counts
    def infer_data(self, e: Any) -> Ty:
        if isinstance(e, ir.Get):
            return self.get(e)
        if isinstance(e, ir.ListLit):  # only a list output's value (`output_value`) may be a list
            self.mismatch(f"`{clip(ir.show(e))}` is a list, which only a list output takes as its value", e.span,
                          "declare `output NAME: list of A | B` and set it in a leaf: `do Go { NAME = [A, B] }`")
            return None
        if isinstance(e, ir.Item):
            return self.items.get(e.name)
        if isinstance(e, ir.Quant):
            lt = self.list_of(e.source, f"`{e.func}(... where ...)`")
            saved = self.items.get(e.var)
            self.items[e.var] = lt.item if lt is not None else None
            self.expect_bool(e.cond, f"`{e.func}(... where ...)` needs a condition, but")
            total = None
            if e.func == "sum" and e.value is not None:
                total = self.expect_num(e.value, self.infer(e.value), "`sum(...)`")
            if saved is None:
                self.items.pop(e.var, None)
            else:
                self.items[e.var] = saved
            if e.func == "count":
                return num_of("int", 0.0, float(lt.max_len) if lt is not None else None)
            if e.func == "sum":
                return _sum_bounds(total, lt.max_len if lt is not None else None)
            return bool_of(e.span)
        if isinstance(e, ir.Length):
            lt = self.list_of(e.operand, "`len`")
            return num_of("int", float(lt.min_len), float(lt.max_len)) if lt is not None else num_of("int", 0.0, None)
        if isinstance(e, ir.Member):
            self.member(e)
            return bool_of(e.span)
        if isinstance(e, ir.Index):
            return self.position(e)
        if isinstance(e, ir.Weighted):
            for arg in e.args:
                self.expect_bool(arg, "`count` counts conditions, but")
            kind: ir.NumKind = "int" if all(isinstance(w, int) for w in e.weights) else "float"
            return num_of(kind, 0.0, as_float(sum(e.weights)))
        return None

    def get(self, e: ir.Get) -> Ty:
        t = self.infer(e.base)
        if t is None:
            return None
        if isinstance(t, Sym):
            self.undefined(t, f"before `.{e.field}`")
            return None
        if not isinstance(t, ir.RecordType):
            self.mismatch(f"`{clip(ir.show(e.base))}` is {kind_of(t)}, not a record: it has no field `{e.field}`", e.span,
                          "only records have fields (`type R = record { a: bool }`)")
            return None
        field = t.field(e.field)
        if field is None:
            names = [f.name for f in t.fields]
            self.out.append(error("E101", f"`{clip(ir.show(e.base))}` has no field `{e.field}`", e.span,
                                  self.suggest(e.field, names) or "its fields are " + quote_list(names)))
            return None
        return field.type

    def list_of(self, e: Any, what: str) -> ir.ListType | None:
        t = self.infer(e)
        if isinstance(t, ir.ListType):
            return t
        if isinstance(t, Sym):
            self.undefined(t, f"as the list of {what}")
        elif t is not None:
            self.mismatch(f"{what} needs a list, but `{clip(ir.show(e))}` is {kind_of(t)}", e.span,
                          "declare the variable as `list of T`")
        return None

    def member(self, e: ir.Member) -> None:
        lt = self.list_of(e.source, "`in`")
        ot = self.infer(e.operand)
        if lt is None or ot is None:
            return
        item = lt.item
        shown = Lazy(e)
        if ir.is_structured(item):
            self.mismatch(f"`{shown}`: the items of `{clip(ir.show(e.source))}` are {'records' if isinstance(item, ir.RecordType) else 'lists'}, which `in` "
                          "cannot compare", e.span, f"test a field: `any(x in {clip(ir.show(e.source))} where x.FIELD == ...)`")
        elif isinstance(item, ir.EnumType) and isinstance(ot, Sym):
            self.enum_value(item, ot, e.source)
        elif isinstance(ot, Sym):
            self.undefined(ot, "before `in`")
        elif type(ot) is not type(item) or (isinstance(ot, ir.EnumType) and isinstance(item, ir.EnumType)
                                            and not set(ot.values) & set(item.values)):
            self.mismatch(f"`{shown}`: `{clip(ir.show(e.operand))}` is {kind_of(ot)} but the items of "
                          f"`{clip(ir.show(e.source))}` are {kind_of(item)}", e.span,
                          "compare values of the same kind")

    # -- positions: `first(L)`, `last(L)`, `L[k]` (docs/language.md §7)
    def position(self, e: ir.Func | ir.Index) -> Ty:
        """The item type of a list read by position. E213 when the position can never exist (the list
        holds fewer items at most); W309 when the list may be shorter and no test of the same condition
        (`len(L) > k`, `any(x in L where …)`) says it is not: the run fails there (§8)."""
        if isinstance(e, ir.Func):
            if len(e.args) != 1:
                self.mismatch(f"`{e.name}` takes 1 argument, not {len(e.args)}", e.span, f"write `{e.name}(L)` for a list L")
                return None
            base, k = e.args[0], 0
        else:
            base, k = e.base, e.index
        what = f"`{e.name}(...)`" if isinstance(e, ir.Func) else "a position `[...]`"
        lt = self.list_of(base, what)
        if lt is None:
            return None
        shown = clip(ir.show(e))
        if k >= lt.max_len:
            self.out.append(error("E213", f"`{shown}` is past the end: `{clip(ir.show(base))}` holds at most {lt.max_len} "
                                  f"item{'s' if lt.max_len != 1 else ''}", e.span,
                                  f"positions start at 0: the last possible one is `{clip(ir.show(base))}[{lt.max_len - 1}]`"
                                  if lt.max_len else "the list is always empty"))
        elif k >= lt.min_len and self.known_length(base) <= k:
            need = k + 1
            self.out.append(warning(
                "W309", f"`{shown}` may be past the end: `{clip(ir.show(base))}` may "
                + ("be empty" if need == 1 else f"hold fewer than {need} items"),
                e.span, f"test `len({clip(ir.show(base))}) > {k}` first in the same condition (`when len({clip(ir.show(base))}) > {k} "
                f"and …`), or declare the list `list[{need}..{max(need, lt.max_len)}] of …` if it is never shorter; "
                "reading past the end fails the decision"))
        return lt.item

    def known_length(self, base: Any) -> int:
        """The length `base` is known to have at least, from the tests enclosing the expression being typed."""
        return self.lengths.get(ir.show(base), 0) if getattr(self, "lengths", None) else 0

    @contextmanager
    def knowing(self, cond: Any) -> Iterator[None]:
        """Type what follows knowing `cond` holds (its length tests: `len(L) > k`, `any(x in L …)`)."""
        saved = dict(getattr(self, "lengths", None) or {})
        self.lengths = {**saved}
        for name, n in length_facts(cond).items():
            self.lengths[name] = max(self.lengths.get(name, 0), n)
        try:
            yield
        finally:
            self.lengths = saved

    # -- for-each steps and list or record arguments
    @contextmanager
    def each_step(self, call: ir.ActionCall) -> Iterator[None]:
        """Type a for-each step's condition and arguments with its item variable bound to the items of
        its list (E201 when the source is not a list)."""
        if call.each is None or call.source is None:
            yield
            return
        lt = self.list_of(call.source, f"`for {call.each} in …`")
        saved = self.items.get(call.each)
        self.items[call.each] = lt.item if lt is not None else None
        try:
            if call.cond is not None:
                self.expect_bool(call.cond, f"`for {call.each} in … where` needs a condition, but")
            with self.knowing(call.cond):
                yield
        finally:
            if saved is None:
                self.items.pop(call.each, None)
            else:
                self.items[call.each] = saved

    def scalar_output(self, name: str, ot: Any, t: Any, e: Any, span: ir.Span) -> bool:
        raise NotImplementedError  # provided by ScalarTyping

    # -- values given to outputs and action parameters
    def list_output_value(self, output: ir.Output, item_type: ir.EnumType, e: Any, span: ir.Span) -> None:
        """A list output's value: a list `[A, B when C]` of values of its enum, or a `case` choosing such lists
        (E204); the conditions are conditions (E201)."""
        if isinstance(e, ir.CaseExpr):
            for arm in e.arms:
                self.expect_bool(arm.when, "the condition")
                self.list_output_value(output, item_type, arm.then, span_or(arm.then.span, span))
            self.list_output_value(output, item_type, e.otherwise, span_or(e.otherwise.span, span))
            return
        if not isinstance(e, ir.ListLit):
            self.infer(e)
            self.mismatch(f"output `{output.name}` is a list but `{clip(ir.show(e))}` is not", span,
                          f"give it a list of its values: `[{item_type.values[0]}, ...]`, an item kept only when a "
                          "condition holds written `A when C`", code="E204")
            return
        each = output.model_copy(update={"type": item_type})
        for item, cond in zip(e.items, e.conds, strict=True):
            self.output_value(each, item, span_or(item.span, span))
            if not (isinstance(cond, ir.Lit) and cond.value is True):
                self.expect_bool(cond, "the condition of a list item")
        lt = output.type
        always = {i.value for i, c in zip(e.items, e.conds, strict=True)
                  if isinstance(i, ir.Lit) and isinstance(c, ir.Lit) and c.value is True}
        if isinstance(lt, ir.ListType) and len(always) > lt.max_len:
            self.mismatch(f"`{clip(ir.show(e))}` holds {len(always)} values but output `{output.name}` holds at most "
                          f"{lt.max_len}", span, "widen the bound (`list[..N] of ...`) or give fewer values",
                          code="E204")
        fixed = all(isinstance(c, ir.Lit) and c.value is True for c in e.conds)
        if isinstance(lt, ir.ListType) and fixed and len(always) < lt.min_len:
            self.mismatch(f"`{clip(ir.show(e))}` holds {len(always)} value{'' if len(always) == 1 else 's'} but output "
                          f"`{output.name}` holds at least {lt.min_len}", span,
                          "give more values, or lower the bound (`list[..N] of ...`)", code="E204")

    def output_value(self, output: ir.Output, e: Any, span: ir.Span) -> None:
        """An assigned or default value against the output's declared type (E204)."""
        if isinstance(output.type, ir.ListType):
            if isinstance(output.type.item, ir.EnumType):
                self.list_output_value(output, output.type.item, e, span)
            return  # any other list output is E201 (`_scalar_only`)
        if isinstance(e, ir.ListLit):
            self.infer(e)  # a list for an output of one value: says so
            return
        t = self.infer(e)
        ot = output.type
        if t is None:
            return
        name = output.name
        if self.scalar_output(name, ot, t, e, span):
            return
        if isinstance(ot, ir.EnumType):
            if isinstance(t, Sym):
                self.enum_value(ot, t, ir.Var(name=name), code="E204")
            elif isinstance(t, ir.EnumType):
                extra = [v for v in t.values if v not in ot.values]
                if extra:
                    self.mismatch(f"`{clip(ir.show(e))}` can be {quote_list(extra)}, which is not a value of "
                                  f"output `{name}`", span, "the output's values are " + quote_list(ot.values),
                                  code="E204")
            else:
                self.mismatch(f"output `{name}` is an enum but `{clip(ir.show(e))}` is {kind_of(t)}", span,
                              "its values are " + quote_list(ot.values), code="E204")
            return
        if isinstance(t, Sym):
            if t.bare:
                self.undefined(t, f"as the value of output `{name}`")
            else:
                self.mismatch(f"output `{name}` is {kind_of(ot)} but is given a string", span,
                              "strings are only values of enum outputs", code="E204")
            return
        if isinstance(ot, ir.BoolType):
            if not isinstance(t, ir.BoolType):
                self.mismatch(f"output `{name}` is a bool but `{clip(ir.show(e))}` is {kind_of(t)}", span,
                              "give it `true`, `false` or a condition", code="E204")
            return
        if not isinstance(ot, ir.NumType):
            return  # dates and strings were handled by `scalar_output`; lists and records are E201
        if not isinstance(t, ir.NumType):
            self.mismatch(f"output `{name}` is a number but `{clip(ir.show(e))}` is {kind_of(t)}", span,
                          f"give it a number or arithmetic over numbers ({ot.describe()})", code="E204")
            return
        if isinstance(e, ir.Lit) and not isinstance(e.value, bool):
            value = e.value
            if ot.kind == "int" and isinstance(value, float) and not value.is_integer():
                self.mismatch(f"output `{name}` is an integer but `{clip(ir.show(e))}` is not", span,
                              "use a whole number, or declare the output as float", code="E204")
            elif isinstance(value, (int, float)) and not ot.contains(value):
                self.mismatch(f"`{clip(ir.show(e))}` is outside the range {ot.describe()} of output `{name}`",
                              span, "use a value inside the range, or widen the declaration", code="E204")
        elif ot.kind == "int" and t.kind == "float":
            self.mismatch(f"output `{name}` is an integer but `{clip(ir.show(e))}` may be fractional", span,
                          "round it in the SOP, or declare the output as float", code="E204")

    def arg_value(self, param: ir.Output, e: Any, span: ir.Span) -> None:
        """An action argument against its parameter: a list or record by shape, anything else as an output."""
        if ir.is_structured(param.type):
            self.structured_value(f"parameter {param.name}", param.type, e, span)
        else:
            self.output_value(param, e, span)

    @contextmanager
    def call_scope(self, call: ir.ActionCall | None, branch: ir.Branch) -> Iterator[None]:
        """Where a call's arguments are typed: knowing its branch's condition holds, with the item
        variable of a for-each step bound."""
        with self.knowing(branch.guard), self.each_step(call) if call is not None else _nothing():
            yield

    def structured_value(self, owner: str, want: Any, e: Any, span: ir.Span) -> None:
        """A list or record argument against its parameter's type (E201): the same shape, enum values
        among the declared ones, numbers for numbers (ranges are checked when the run gives values)."""
        got = self.infer(e)
        if got is None:
            return
        if isinstance(got, Sym):
            self.undefined(got, f"as the value of `{owner}`")
            return
        problem = shape_problem(want, got)
        if problem:
            self.mismatch(f"`{owner}` is {ir.describe_type(want)} but `{clip(ir.show(e))}` is {kind_of(got)}: {problem}",
                          span, "pass a variable, item or field declared with the same type (a `type` alias helps)")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def length_facts(cond: Any) -> dict[str, int]:
    """Lengths a condition guarantees when it holds, per list as written: `len(L) > 2` → 3 items,
    `any(x in L where …)` → 1; conjunctions add up, anything else says nothing."""
    out: dict[str, int] = {}
    if isinstance(cond, ir.BoolOp) and cond.op == "and":
        for o in cond.operands:
            for name, n in length_facts(o).items():
                out[name] = max(out.get(name, 0), n)
    elif isinstance(cond, ir.Quant) and cond.func == "any":
        out[ir.show(cond.source)] = 1
    elif isinstance(cond, ir.Compare):
        left, right, op = cond.left, cond.right, cond.op
        if isinstance(right, ir.Length) and isinstance(left, ir.Lit):
            left, right, op = right, left, ir.MIRRORED_OP[op]
        if isinstance(left, ir.Length) and isinstance(right, ir.Lit) and isinstance(right.value, (int, float)) \
                and not isinstance(right.value, bool):
            v = right.value
            least = {">": math.floor(v) + 1, ">=": math.ceil(v), "==": math.ceil(v)}.get(op)
            if op == "!=" and v == 0:
                least = 1
            if least is not None and least > 0:
                out[ir.show(left.operand)] = int(least)
    return out


def shape_problem(want: Any, got: Any) -> str | None:
    """Why a value of type `got` does not fit a parameter of type `want` (None when it does)."""
    if isinstance(want, ir.ListType):
        if not isinstance(got, ir.ListType):
            return "a list is expected"
        return shape_problem(want.item, got.item)
    if isinstance(want, ir.RecordType):
        if not isinstance(got, ir.RecordType):
            return "a record is expected"
        for f in want.fields:
            g = got.field(f.name)
            if g is None:
                if not f.optional:
                    return f"it has no field `{f.name}`"
                continue
            inner = shape_problem(f.type, g.type)
            if inner:
                return f"field `{f.name}`: {inner}"
        return None
    if isinstance(want, ir.EnumType):
        if not isinstance(got, ir.EnumType):
            return f"{kind_of(got)} is not an enum"
        extra = [v for v in got.values if v not in want.values]
        return f"it can be {quote_list(extra)}, which the parameter does not take" if extra else None
    if isinstance(want, ir.NumType):
        return None if isinstance(got, ir.NumType) and not (want.kind == "int" and got.kind == "float") else \
            f"{kind_of(got)} is not {'an integer' if want.kind == 'int' else 'a number'}"
    if type(want) is not type(got) or (isinstance(want, ir.TimeType) and want.kind != got.kind):
        return f"{kind_of(got)} is not {kind_of(want)}"
    return None
