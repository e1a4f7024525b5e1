"""The deterministic rule engine: values → reference path and final outputs.

Two implementations of one semantics:
- `interpret` walks the IR. It is the reference: simple, precise error messages (which stage needed
  which value).
- `Engine` generates a Python function from the IR. For acyclic SOPs of moderate size it expands the
  graph into one nested if/else tree whose leaves return constant paths — as fast as a hand-written
  if/else function; larger or cyclic SOPs use a table-driven loop. On any error it re-runs `interpret`
  so that messages are identical in both.

Semantics: from the entry stage, evaluate a stage's branches in order; the first true guard (or
`otherwise`) fires. A value is needed only when a guard actually reads it (`and`/`or` short-circuit),
so values the path never reads are not required. A needed value that is missing or outside its
declared domain is an error, never a silent default.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from collections.abc import Generator, Iterable, Iterator, Mapping
from typing import Any

from pydantic import BaseModel

from sopgraph.errors import Error
from sopgraph.language import ir, scalars
from sopgraph.language.diagnostics import did_you_mean
from sopgraph.logic.scalarcheck import default_value
from sopgraph.logic.unroll import UnrollError, affects_of, held_variables, look_name, unrolled_for

NOW = "now"  # the reference time: an implicit system variable (sopgraph.language.parse._declare_now)
CASE_INLINE = 16  # `case` arms written as one conditional expression; longer ones become helper functions
EXPAND_LIMIT = 4000  # stage occurrences in the expanded tree before falling back to the loop


class DecideError(Error):
    """A value the path needs is missing or outside its domain, an output the chosen leaf sets does
    not fit its declared type (`output` names it), or the SOP is not exhaustive."""

    def __init__(self, message: str, variable: str | None = None, stage: str | None = None,
                 output: str | None = None, part: str | None = None, read: str | None = None):
        super().__init__(message)
        self.message = message
        self.variable = variable
        self.stage = stage
        self.output = output
        self.part = part  # the missing optional record field read, as a path (`Bills[1].note`)
        self.read = read  # ... and as the program reads it (`b.note`)


class Decision(BaseModel):
    """The engine's answer: the stage ids visited, the final outputs (Action first) and the
    reference trace: every action carried out, in order, as `{"name": …, "args": {…}}` (the
    mid-flow steps, then the final action)."""

    path: list[str]
    finals: dict[str, Any]
    actions: list[dict[str, Any]] = []


Trace = tuple[list[str], dict[str, Any], list[dict[str, Any]]]  # (path, finals, actions) of a decision


class NeedValue(Exception):  # noqa: N818 - a request, not an error: the stepping engine yields it
    """Raised inside an evaluation that reads a value a session has not been given yet (the `look`-th
    look, 1-based, of an observed variable; 0 for a field or system value). The stepping engine
    catches it where it evaluates (a guard, an action's arguments, a leaf), yields it to the session
    and evaluates that again once the value is known: evaluations are pure, so nothing is repeated."""

    def __init__(self, variable: str, look: int = 0):
        super().__init__(variable)
        self.variable = variable
        self.look = look
        self.stage: str | None = None


class OpenValues(dict):
    """The values a session knows so far: a key that is absent is *not known yet* (the engine asks
    for it), where in a plain mapping an absent key is *missing* (the default, or an error)."""


# ---------------------------------------------------------------------------------------------
# Value validation shared by both implementations


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (dict, list)):
        try:
            return json.dumps(value, sort_keys=False)[:200]
        except (TypeError, ValueError):
            return repr(value)[:200]
    return repr(value)


def validate_value(var: ir.Variable, value: Any) -> Any:
    """Return the value (ints normalised) or raise DecideError if it is outside the domain."""
    vtype = var.type
    if ir.is_structured(vtype):
        return validate_data(var.name, var.name, vtype, value)
    if value is None:
        raise DecideError(f"missing value for `{var.name}`", var.name)
    if isinstance(vtype, ir.EnumType):
        if not isinstance(value, str) or value not in vtype.values:
            raise DecideError(f"value {_fmt(value)} is not in the domain of `{var.name}` "
                              f"({ir.describe_type(vtype)})", var.name)
        return value
    if isinstance(vtype, ir.BoolType):
        if value is not True and value is not False:
            raise DecideError(f"value {_fmt(value)} of `{var.name}` is not a bool", var.name)
        return value
    if isinstance(vtype, ir.NumType):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DecideError(f"value {_fmt(value)} of `{var.name}` is not a number", var.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise DecideError(f"value {_fmt(value)} of `{var.name}` is not finite", var.name)
        if vtype.kind == "int" and isinstance(value, float):
            if not value.is_integer():
                raise DecideError(f"value {_fmt(value)} of `{var.name}` is not an integer", var.name)
            value = int(value)
        if not vtype.contains(value):
            raise DecideError(f"value {_fmt(value)} of `{var.name}` is outside {vtype.describe()}",
                              var.name)
        return value
    if isinstance(vtype, ir.TimeType):
        try:
            return scalars.parse_temporal(vtype.kind, value)
        except scalars.ValueProblem as exc:
            raise DecideError(f"value {_fmt(value)} of `{var.name}` {exc}", var.name) from None
    if isinstance(vtype, ir.StringType):
        if not isinstance(value, str):
            raise DecideError(f"value {_fmt(value)} of `{var.name}` is not a string", var.name)
        if len(value) > scalars.MAX_STRING:
            raise DecideError(f"value of `{var.name}` is longer than {scalars.MAX_STRING} characters", var.name)
        return value
    return value


def input_value(var: ir.Variable, value: Any) -> Any:
    """An input value in the engine's form: its default when left out (or null), the value checked
    against the declaration otherwise. A left-out optional is an error here: reading it needs a
    `missing(X)` test first (docs/language.md §8)."""
    if value is None:
        if var.name == NOW and var.role == "system" and isinstance(var.type, ir.TimeType):
            raise DecideError("missing value for `now`: the program reads the current time, which is never "
                              "taken from the clock; give it as `\"now\": \"2026-11-23T10:00\"` or with "
                              "`sop decide --now 2026-11-23T10:00`", var.name)
        if var.default is not None:
            return default_value(var)
        if var.optional:
            raise DecideError(f"`{var.name}` is missing: it is optional, so test `missing({var.name})` "
                              "before reading it", var.name)
    return validate_value(var, value)


def export_value(vtype: Any, value: Any) -> Any:
    """An output or argument value as reported: dates and durations as text (`2026-11-23`); a list of enum
    values once each, in the enum's order (a list output is a set: `[Network, Billing, Network]` is
    `["Billing", "Network"]` for `list of Billing | Network`)."""
    if isinstance(vtype, ir.TimeType) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return scalars.format_temporal(vtype.kind, value)
    if isinstance(vtype, ir.ListType) and isinstance(vtype.item, ir.EnumType) and isinstance(value, list):
        present = set(value)
        return [v for v in vtype.item.values if v in present]
    return value


def export_arg(ptype: Any, value: Any) -> Any:
    """An action argument as reported: a list or record argument item by item and field by field (a copy,
    dates and durations inside as text, a list in its own order), anything else as `export_value` does."""
    if isinstance(ptype, ir.ListType) and isinstance(value, list):
        return [export_arg(ptype.item, x) for x in value]
    if isinstance(ptype, ir.RecordType) and isinstance(value, Mapping):
        return {f.name: export_arg(f.type, value.get(f.name)) for f in ptype.fields}
    return export_value(ptype, value)


def at_position(items: Any, k: int, label: str) -> Any:
    """`L[k]`, `first(L)` (k = 0), `last(L)` (k = -1): the item, or DecideError past the end (like reading
    a missing value: the decision cannot be made on these values)."""
    n = len(items)
    if -n <= k < n:
        return items[k]
    held = "is empty" if n == 0 else f"has {n} item{'s' if n != 1 else ''}"
    raise DecideError(f"`{label}` is past the end: the list {held}")


def validate_data(label: str, owner: str, vtype: Any, value: Any) -> Any:
    """A list or record value checked whole, item by item and field by field (`label` names the
    part, `Segments[2].cabin`; `owner` is the input variable). Returns a normalised copy."""
    if isinstance(vtype, ir.ListType):
        if value is None:
            raise DecideError(f"missing value for `{label}`", owner)
        if not isinstance(value, (list, tuple)):
            raise DecideError(f"value {_fmt(value)} of `{label}` is not a list", owner)
        if not vtype.min_len <= len(value) <= vtype.max_len:
            bound = (f"at most {vtype.max_len}" if len(value) > vtype.max_len else f"at least {vtype.min_len}")
            raise DecideError(f"`{label}` has {len(value)} item{'' if len(value) == 1 else 's'}; it holds {bound}",
                              owner)
        return [validate_data(f"{label}[{i}]", owner, vtype.item, x) for i, x in enumerate(value)]
    if isinstance(vtype, ir.RecordType):
        if value is None:
            raise DecideError(f"missing value for `{label}`", owner)
        if not isinstance(value, Mapping):
            names = ", ".join(f.name for f in vtype.fields)
            raise DecideError(f"value {_fmt(value)} of `{label}` is not a record (an object with {names})", owner)
        names_list = [f.name for f in vtype.fields]
        for key in value:
            if key not in names_list and not vtype.open:  # `record open`: undeclared fields are ignored
                hint = did_you_mean(str(key), names_list)
                hint = hint or "write `record open { … }` to ignore fields the record does not declare"
                raise DecideError(f"`{label}` has no field `{key}` ({hint})", owner)
        return {f.name: None if f.optional and value.get(f.name) is None  # `note: string?` left out
                else validate_data(f"{label}.{f.name}", owner, f.type, value.get(f.name)) for f in vtype.fields}
    leaf = ir.Variable.model_construct(name=label, role="system", type=vtype)
    try:
        return validate_value(leaf, value)
    except DecideError as exc:
        raise DecideError(exc.message, owner) from None


def output_problem(output: ir.Output, value: Any) -> str | None:
    """Why `value` cannot be the final value of `output` (None when it fits). Both engine forms
    use this one test, so an assignment that leaves its declared range fails the same way in both."""
    otype = output.type
    if isinstance(otype, ir.ListType):
        return _list_output_problem(otype, value)
    if isinstance(otype, ir.NumType):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "is not a number"
        if isinstance(value, float) and not math.isfinite(value):
            return "is not finite"
        if otype.kind == "int" and isinstance(value, float) and not value.is_integer():
            return "is not an integer"
        if not otype.contains(value):
            return f"is outside {otype.describe()}"
        return None
    if isinstance(otype, ir.EnumType):
        if not isinstance(value, str) or value not in otype.values:
            return f"is not one of {ir.describe_type(otype)}"
        return None
    if isinstance(otype, ir.StringType):
        return None if isinstance(value, str) else "is not a string"
    if isinstance(otype, ir.TimeType):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"is not a {otype.kind}"
        if otype.kind == "date" and value % scalars.DAY != 0:
            return "is not a whole day (a date has no time of day)"
        return None
    if value is not True and value is not False:
        return "is not a bool"
    return None


def _list_output_problem(otype: ir.ListType, value: Any) -> str | None:
    """A list output holds values of its enum, each counted once, within its length bounds."""
    if not isinstance(value, list) or not isinstance(otype.item, ir.EnumType):
        return "is not a list"
    bad = [v for v in value if not isinstance(v, str) or v not in otype.item.values]
    if bad:
        return f"holds {_fmt(bad[0])}, which is not one of {ir.describe_type(otype.item)}"
    n = len(set(value))
    if not otype.min_len <= n <= otype.max_len:
        bound = f"at most {otype.max_len}" if n > otype.max_len else f"at least {otype.min_len}"
        return f"has {n} value{'' if n == 1 else 's'}; it holds {bound}"
    return None


def output_error(output: ir.Output, value: Any, problem: str, stage: str | None,
                 assign: ir.OutputAssign | None = None) -> DecideError:
    """The decide-time error for an output value that does not fit its declaration."""
    where = f" at {stage}" if stage else ""
    by = f" by `{assign.name} = {ir.show(assign.value)}`" if assign is not None else ""
    return DecideError(f"output `{output.name}` = {_fmt(value)} {problem} (set{by}{where})",
                       stage=stage, output=output.name)


def undeclared_inputs(scenario: ir.Scenario, keys: Iterable[str]) -> list[str]:
    """One message per key that is not a field or system variable (the engine ignores such keys,
    so a misspelt `Reqest` would otherwise go unnoticed); derived and output names say so."""
    inputs = [v.name for v in scenario.variables.values() if v.role != "derived"]
    out: list[str] = []
    for key in keys:
        var = scenario.variables.get(key)
        if var is not None and var.role != "derived":
            continue
        if var is not None:
            out.append(f"`{key}` is a derived variable: the engine computes it and ignores the given value")
        elif key in scenario.outputs or key == "Action":
            out.append(f"`{key}` is an output, not an input: the given value is ignored")
        else:
            hint = did_you_mean(key, inputs)
            out.append(f"`{key}` is not a field or system variable of `{scenario.name}`; it is ignored"
                       + (f" ({hint})" if hint else ""))
    return out


# ---------------------------------------------------------------------------------------------
# Reference interpreter

WARM_DEPTH = 48  # derived chains deeper than this are evaluated bottom-up (no deep recursion)
_ORDERS: dict[int, tuple[ir.Scenario, dict[str, list[str]]]] = {}


def _derived_deps(scenario: ir.Scenario, name: str) -> list[str]:
    var = scenario.variables.get(name)
    if var is None or var.role != "derived" or var.expr is None:
        return []
    out: dict[str, None] = {}
    stack = [var.expr]
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Var):
            dep = scenario.variables.get(e.name)
            if dep is not None and dep.role == "derived":
                out.setdefault(e.name, None)
            continue
        stack.extend(ir.children(e))
    return list(out)


def deep_derived_order(scenario: ir.Scenario, name: str) -> list[str]:
    """The derived variables `name` depends on, dependencies first, when its dependency chain is
    deeper than `WARM_DEPTH`; empty otherwise. Iterative (the chains it exists for are deep);
    computed once per scenario object and variable."""
    hit = _ORDERS.get(id(scenario))
    if hit is None or hit[0] is not scenario:
        if len(_ORDERS) >= 16:
            _ORDERS.pop(next(iter(_ORDERS)))
        hit = (scenario, {})
        _ORDERS[id(scenario)] = hit
    memo = hit[1]
    if name in memo:
        return memo[name]
    order: list[str] = []
    depth: dict[str, int] = {}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[tuple[str, int]] = [(name, 0)]
    while stack:
        node, i = stack.pop()
        deps = _derived_deps(scenario, node)
        state[node] = 1
        if i < len(deps):
            stack.append((node, i + 1))
            if deps[i] not in state:
                stack.append((deps[i], 0))
            continue
        state[node] = 2
        depth[node] = 1 + max((depth.get(d, 0) for d in deps), default=0)
        order.append(node)
    result = order[:-1] if depth.get(name, 0) > WARM_DEPTH else []
    memo[name] = result
    return result



class Interpreter:
    """Evaluates expressions of one scenario over one assignment of values (derived variables are
    computed once and cached). The public core of the logic layer: the engine, the constraint domain,
    paths, flow analysis, synthesis and scoring all evaluate through it."""

    def __init__(self, scenario: ir.Scenario, values: Mapping[str, Any]):
        self.s = scenario
        self.values = values
        self.cache: dict[str, Any] = {}
        self.stage: str | None = None
        self.depth = 0  # nesting of derived-variable evaluations
        self.looks: dict[str, int] = {}  # observed variable -> looks taken so far
        self.changed: set[str] = set()  # held observed variables an action changed since their last look
        self.items: dict[str, Any] = {}  # item variables of the enclosing `any`/`all`/`count(… where …)`
        self.item_paths: dict[str, str] = {}  # item variable -> the item it is (`Bills[1]`), for messages

    def _warm(self, name: str) -> None:
        """Before a derived variable with a deep chain of derived dependencies (a 1,000-long `let`
        chain), compute those dependencies bottom-up so no evaluation recurses deeply. A dependency
        that fails is left uncached (it may not be needed: `and`/`or` are lazy) and fails again,
        with its own message, only if it is read. Values are pure, so the result is the same."""
        order = deep_derived_order(self.s, name)
        if not order:
            return
        self.depth += 1
        try:
            for dep in order:
                if dep not in self.cache:
                    with contextlib.suppress(DecideError, ArithmeticError, TypeError, ValueError):
                        self.cache[dep] = self.eval(self.s.variables[dep].expr)
        finally:
            self.depth -= 1

    def observe(self, names: list[str]) -> None:
        """Take the next look at each variable; values computed from earlier looks are dropped. A held
        variable (one some action `affects`) that no action changed since its last look is that look."""
        held = held_variables(self.s)
        for name in names:
            k = self.looks.get(name, 0)
            if k and name in held and name not in self.changed:
                continue
            self.looks[name] = k + 1
            self.changed.discard(name)
        self.cache.clear()

    def acted(self, action: str) -> None:
        """An action was carried out: the held variables it affects may look different next time."""
        self.changed |= affects_of(self.s).get(action, frozenset())

    def look(self, var: ir.Variable) -> Any:
        name = var.name
        k = self.looks.get(name, 0)
        if k == 0:
            raise DecideError(f"`{name}` is read before it is observed", name)
        seq = self.values.get(name)
        if self.values.__class__ is OpenValues and (seq is None or isinstance(seq, list) and k > len(seq)):
            raise NeedValue(name, k)
        if seq is None:
            raise DecideError(f"missing value for `{name}`", name)
        if not isinstance(seq, (list, tuple)):
            raise DecideError(f"value {_fmt(seq)} of `{name}` is not a list (give one value per look)", name)
        if k > len(seq):
            raise DecideError(f"missing look {k} of `{name}` (the list has {len(seq)} value"
                              f"{'' if len(seq) == 1 else 's'})", name)
        try:
            return validate_value(var, seq[k - 1])
        except DecideError as exc:
            raise DecideError(exc.message + f" (look {k})", name) from None

    def var(self, name: str) -> Any:
        if name in self.cache:
            return self.cache[name]
        var = self.s.variables[name]
        if var.observed:
            value = self.look(var)
        elif var.role == "derived":
            assert var.expr is not None
            if self.depth == 0:
                self._warm(name)
            self.depth += 1
            try:
                value = self.eval(var.expr)
            finally:
                self.depth -= 1
        else:
            raw = self.values.get(name)
            if raw is None and self.values.__class__ is OpenValues and name not in self.values:
                raise NeedValue(name)
            value = input_value(var, raw)
        self.cache[name] = value
        return value

    def missing(self, e: Any) -> bool:
        """`missing(X)`: the input leaves `X` out (or gives null); `missing(R.note)`: the record's optional
        field is absent or null (the record itself is read, and must be there)."""
        if isinstance(e, ir.Get):
            return self.eval(e.base).get(e.field) is None
        if not isinstance(e, ir.Var) or self.values.get(e.name) is not None:
            return False
        if self.values.__class__ is OpenValues and e.name not in self.values:
            raise NeedValue(e.name)
        return True

    def func(self, e: ir.Func) -> Any:
        if e.name == "missing":
            return self.missing(e.args[0])
        if e.name in ir.POSITIONS:
            return at_position(self.eval(e.args[0]), 0 if e.name == "first" else -1, ir.show(e))
        args = [self.eval(a) for a in e.args]
        if e.name == "abs":
            return abs(args[0])
        return scalars.days_between(args[0], args[1])

    def eval(self, e: Any) -> Any:
        if isinstance(e, ir.Lit):
            return e.value
        if isinstance(e, ir.Var):
            return self.var(e.name)
        if isinstance(e, ir.Unary):
            x = self.eval(e.operand)
            return (not x) if e.op == "not" else -x
        if isinstance(e, ir.Binary):
            a, b = self.eval(e.left), self.eval(e.right)
            return apply_arith(e.op, a, b)
        if isinstance(e, ir.Compare):
            return apply_compare(e.op, self.eval(e.left), self.eval(e.right))
        if isinstance(e, ir.InSet):
            x = self.eval(e.operand)
            hit = x in {v.value for v in e.values}
            return not hit if e.negated else hit
        if isinstance(e, ir.BoolOp):
            if e.op == "and":
                return all(self.eval(o) for o in e.operands)
            return any(self.eval(o) for o in e.operands)
        if isinstance(e, ir.Call):
            args = [self.eval(a) for a in e.args]
            if e.func == "count":
                return sum(1 for a in args if a)
            return min(args) if e.func == "min" else max(args)
        if isinstance(e, ir.CaseExpr):
            for arm in e.arms:
                if self.eval(arm.when):
                    return self.eval(arm.then)
            return self.eval(e.otherwise)
        if isinstance(e, ir.TimeLit):
            return e.value
        if isinstance(e, ir.Func):
            return self.func(e)
        if isinstance(e, ir.Matches):
            return scalars.matches(e.pattern, self.eval(e.operand))
        return self.eval_data(e)

    def eval_data(self, e: Any) -> Any:
        """Lists, records and weighted counts (the generated engine emits the same operations)."""
        if isinstance(e, ir.Get):
            value = self.eval(e.base)[e.field]
            if value is None:  # only an optional field is None once validated
                raise missing_field(e, self.part_label(e))
            return value
        if isinstance(e, ir.Item):
            return self.items[e.name]
        if isinstance(e, ir.Quant):
            items = list(enumerate(self.eval(e.source)))
            if e.func == "sum":  # the same order and operations as the generated `sum(V for x in L if C)`
                return sum(self._with_item(e, x, e.value, i) for i, x in items if self._with_item(e, x, None, i))
            return _quantify(e.func, items, lambda ix: self._with_item(e, ix[1], None, ix[0]))
        if isinstance(e, ir.Length):
            return len(self.eval(e.operand))
        if isinstance(e, ir.Member):
            hit = self.eval(e.operand) in self.eval(e.source)
            return not hit if e.negated else hit
        if isinstance(e, ir.Weighted):
            return _wcount(tuple(self.eval(a) for a in e.args), tuple(e.weights))
        if isinstance(e, ir.ListLit):  # the items whose condition holds, in written order
            return [self.eval(i) for i, c in zip(e.items, e.conds, strict=True) if self.eval(c)]
        if isinstance(e, ir.Index):
            return at_position(self.eval(e.base), e.index, ir.show(e))
        raise TypeError(f"unknown expression {e!r}")  # pragma: no cover

    def each_calls(self, call: ir.ActionCall) -> list[dict[str, Any]]:
        """A for-each step: the action once per item of its list for which its condition holds, in order."""
        var = call.each or ""
        out = []
        saved = self.items.get(var, _UNSET)
        try:
            for item in list(self.eval(call.source)):
                self.items[var] = item
                if call.cond is None or self.eval(call.cond):
                    out.append(_call(self, call.action, call.args))
        finally:
            if saved is _UNSET:
                self.items.pop(var, None)
            else:
                self.items[var] = saved
        return out

    def _with_item(self, e: ir.Quant, item: Any, expr: Any = None, index: int = 0) -> Any:
        """`expr` (default: the condition) evaluated with the item variable bound to `item` (item `index`)."""
        saved = self.items.get(e.var, _UNSET)
        saved_path = self.item_paths.get(e.var)
        self.items[e.var] = item
        source = self.part_label(e.source)
        if source is not None:
            self.item_paths[e.var] = f"{source}[{index}]"
        try:
            return self.eval(e.cond if expr is None else expr)
        finally:
            if saved is _UNSET:
                del self.items[e.var]
            else:
                self.items[e.var] = saved
            if saved_path is None:
                self.item_paths.pop(e.var, None)
            else:
                self.item_paths[e.var] = saved_path

    def part_label(self, e: Any) -> str | None:
        """The input part an expression reads, as a path (`Contact.email`, `Bills[1].note`); None if it is
        not one."""
        if isinstance(e, ir.Var):
            return e.name
        if isinstance(e, ir.Item):
            return self.item_paths.get(e.name)
        if isinstance(e, ir.Get):
            base = self.part_label(e.base)
            return None if base is None else f"{base}.{e.field}"
        return None


_UNSET = object()


def missing_field(e: ir.Get, part: str | None) -> DecideError:
    """Reading an optional record field that is absent: refused like a missing optional variable. `part`
    is the field's path in the input (`Bills[1].note` for `b.note`); the error's variable is the input."""
    shown = ir.show(e)
    where = f" (`{part}`)" if part and part != shown else ""
    root = part.split(".")[0].split("[")[0] if part else None
    return DecideError(f"`{shown}`{where} is missing: it is optional, so test `missing({shown})` before reading it",
                       root, part=part, read=shown)


def optional_field_names(scenario: ir.Scenario) -> set[str]:
    """The names of the optional record fields anywhere in the inputs' types (the generated engine checks
    reads of these for null)."""
    out: set[str] = set()
    stack = [v.type for v in scenario.variables.values() if v.role != "derived" and v.type is not None]
    while stack:
        t = stack.pop()
        if isinstance(t, ir.ListType):
            stack.append(t.item)
        elif isinstance(t, ir.RecordType):
            out.update(f.name for f in t.fields if f.optional)
            stack.extend(f.type for f in t.fields)
    return out


def _field(record: Mapping[str, Any], name: str) -> Any:
    """An optional field's value in generated code: null is refused (the interpreter then says which)."""
    value = record[name]
    if value is None:
        raise DecideError(f"optional field `{name}` is missing")
    return value


def _quantify(func: str, items: list, cond: Any) -> Any:
    """`any`/`all` stop at the first item that decides; `count` looks at every item."""
    if func == "any":
        return any(cond(x) for x in items)
    if func == "all":
        return all(cond(x) for x in items)
    return sum(1 for x in items if cond(x))


def _count(conditions: tuple) -> int:
    return sum(1 for c in conditions if c)


def _wcount(conditions: tuple, weights: tuple) -> int | float:
    """A weighted count: the sum of the weights of the true conditions (all are evaluated)."""
    return sum(w for c, w in zip(conditions, weights, strict=True) if c)


def apply_arith(op: str, a: Any, b: Any) -> Any:
    """One arithmetic operator with the language's semantics (division by zero is a DecideError)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return _div(a, b)


def _div(a: Any, b: Any) -> Any:
    if b == 0:
        raise DecideError("division by zero")
    return a / b


def apply_compare(op: str, a: Any, b: Any) -> bool:
    """One comparison operator with the language's semantics."""
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    try:
        if op == "<":
            return a < b
        if op == "<=":
            return a <= b
        if op == ">":
            return a > b
        return a >= b
    except TypeError:
        raise DecideError(f"cannot compare {_fmt(a)} {op} {_fmt(b)}") from None


def leaf_finals(scenario: ir.Scenario, target: ir.Target, evaluate,
                stage: str | None = None) -> dict[str, Any]:
    """Finals of a leaf: Action, then every declared output (assigned, else its default). An
    assigned value that does not fit the output's declaration raises DecideError (`output` set)."""
    finals: dict[str, Any] = {"Action": target.action}
    assigned = {a.name: a for a in target.outputs}
    for name, out in scenario.outputs.items():
        if name in assigned:
            value = evaluate(assigned[name].value)
            problem = output_problem(out, value)
            if problem is not None:
                raise output_error(out, value, problem, stage, assigned[name])
            finals[name] = export_value(out.type, value)
        else:
            finals[name] = out.default.value if out.default is not None else None
    return finals



def _call(it: Interpreter, name: str, args: list[ir.OutputAssign]) -> dict[str, Any]:
    action = it.s.actions.get(name)
    types = {p.name: p.type for p in action.params} if action is not None else {}
    return {"name": name, "args": {a.name: export_arg(types.get(a.name), it.eval(a.value)) for a in args}}


def max_steps(scenario: ir.Scenario) -> int:
    """Stage visits after which a walk must be looping: every stage once per bounded firing."""
    fires = sum(b.limit or 0 for st in scenario.stages.values() for b in st.branches)
    return len(scenario.stages) * (1 + fires) + 1


def run(scenario: ir.Scenario, values: Mapping[str, Any]) -> tuple[Decision, list[int]]:
    """Reference semantics (slow, precise errors): the decision and the branch index taken at each
    stage of its path. `walk` run to its end: with a plain mapping it never asks for a value."""
    steps = walk(scenario, values)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def _asking(evaluate: Any, stage_id: str) -> Generator[NeedValue, None, Any]:
    """Yields a `NeedValue` raised by `evaluate()` (tagged with the stage), evaluates again, and
    returns the value: `x = yield from _asking(lambda: …, stage)`."""
    while True:
        try:
            return evaluate()
        except NeedValue as need:
            need.stage = stage_id
            yield need


def walk(scenario: ir.Scenario, values: Mapping[str, Any],
         it: Interpreter | None = None) -> Generator[Any, None, tuple[Decision, list[int]]]:
    """The reference semantics stepped: yields a `NeedValue` when an evaluation reads a value an
    `OpenValues` mapping does not have yet (and evaluates it again on resumption), and each action
    on the way (`{"name", "args"}`) once it is carried out; returns (Decision, branch indices).
    `it`: the interpreter to evaluate with (its `looks` then tell the looks the run took)."""
    it = it if it is not None else Interpreter(scenario, values)
    path: list[str] = []
    taken: list[int] = []
    actions: list[dict[str, Any]] = []
    fired: dict[tuple[str, int], int] = {}
    stage_id = scenario.start
    limit = max_steps(scenario)
    while stage_id is not None:
        if len(path) >= limit:
            raise DecideError(f"the SOP loops: {' -> '.join(path[-5:])} -> ...", stage=stage_id)
        stage = scenario.stages.get(stage_id)
        if stage is None:
            raise DecideError(f"undefined stage `{stage_id}`", stage=stage_id)
        path.append(stage_id)
        it.stage = stage_id
        if stage.observe:
            it.observe(stage.observe)
        chosen: ir.Branch | None = None
        try:
            for bi, branch in enumerate(stage.branches):
                if branch.limit is not None and fired.get((stage_id, bi), 0) >= branch.limit:
                    continue  # spent: `up to N times` already fired N times on this path
                guard = branch.guard
                if guard is None:
                    holds = True
                else:
                    try:  # the usual case: nothing to ask, no generator
                        holds = it.eval(guard)
                    except NeedValue as need:
                        need.stage = stage_id
                        yield need
                        holds = yield from _asking(lambda g=guard: it.eval(g), stage_id)
                if holds:
                    chosen = branch
                    taken.append(bi)
                    if branch.limit is not None:
                        fired[(stage_id, bi)] = fired.get((stage_id, bi), 0) + 1
                    break
            if chosen is not None:
                for c in chosen.target.steps:
                    if c.each is not None:  # `for x in L where C do A(...)`: one action per item
                        acts = yield from _asking(lambda c=c: it.each_calls(c), stage_id)
                    else:
                        acts = [(yield from _asking(lambda c=c: _call(it, c.action, c.args), stage_id))]
                    it.acted(c.action)  # a for-each step counts as done for `affects`, items or not
                    for act in acts:
                        actions.append(act)
                        yield act
        except DecideError as exc:
            where = f" (needed at {stage_id})" if exc.variable else f" (at {stage_id})"
            raise DecideError(exc.message + where, exc.variable, stage_id, part=exc.part, read=exc.read) from None
        if chosen is None:
            raise DecideError(f"no branch of `{stage_id}` applies to these values", stage=stage_id)
        target = chosen.target
        if target.kind == "action":
            try:
                finals, last = yield from _asking(lambda t=target, sid=stage_id: (
                    leaf_finals(scenario, t, it.eval, sid), _call(it, t.action or "", t.args)), stage_id)
                actions.append(last)
            except DecideError as exc:
                if exc.output is not None:
                    raise
                raise DecideError(exc.message + f" (needed for the outputs of {stage_id})",
                                  exc.variable, stage_id, part=exc.part, read=exc.read) from None
            return Decision(path=path, finals=finals, actions=actions), taken
        stage_id = target.stage
    raise DecideError("the SOP has no entry stage")


def looks_taken(scenario: ir.Scenario, values: Mapping[str, Any]) -> dict[str, int]:
    """The looks a run on `values` takes at each observed variable (as far as it gets, if it fails)."""
    it = Interpreter(scenario, values)
    steps = walk(scenario, values, it)
    with contextlib.suppress(DecideError, StopIteration, ArithmeticError, TypeError, ValueError):
        while True:
            next(steps)
    return dict(it.looks)


def interpret(scenario: ir.Scenario, values: Mapping[str, Any]) -> Decision:
    """Reference semantics (slow, precise errors)."""
    return run(scenario, values)[0]


def has_action_trace(scenario: ir.Scenario) -> bool:
    """Whether the program carries out actions on the way or gives actions arguments (its
    decisions are then reported with their action trace; otherwise the trace is just the final
    action and outputs stay as they always were)."""
    return scenario.traced


def reference_trace(scenario: ir.Scenario, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The actions the procedure carries out for these values, in order (`{"name", "args"}`; the
    final action last): what an agent's tool calls are compared against."""
    return decide(scenario, values).actions


# ---------------------------------------------------------------------------------------------
# Generated engine


_CallCode = tuple[str, list[tuple[str, Any]], ir.ActionCall | None]  # an action call as `_Gen` emits it


class _Gen:
    """Emits Python source for one scenario."""

    def __init__(self, scenario: ir.Scenario, looks: Mapping[str, tuple[str, int]] | None = None,
                 stepping: bool = False):
        self.s = scenario
        self.looks = looks or {}  # unrolled look variable -> (observed variable, 1-based look)
        # the stepping form: a generator that asks for values an `OpenValues` mapping lacks (the
        # reads raise NeedValue; guards, arguments and leaves catch it, yield it, and evaluate again)
        # and yields each action on the way; the same code as the plain form otherwise
        self.stepping = stepping
        self.stage = ""  # the display id of the stage being emitted (a request names it)
        self.ns: dict[str, Any] = {"_div": _div, "_bad": self._bad, "DecideError": DecideError,
                                   "_INF": math.inf, "_out": self._out, "_exp": export_value,
                                   "_days_between": scalars.days_between, "_time": scalars.parse_temporal,
                                   "_at": at_position, "_exa": export_arg}
        self.lines: list[str] = []
        self.var_index = {name: i for i, name in enumerate(scenario.variables)}
        self.consts = 0
        self.tmp = 0
        self.helpers: list[str] = []  # helper functions (long `case`s), emitted before `decide`
        self.ns["_count"] = _count
        self.ns["_wcount"] = _wcount
        self.ns["_data"] = validate_data
        self.ns["_field"] = _field
        self.optional_fields = optional_field_names(scenario)
        self.ns["_Need"] = NeedValue
        self.ns["_Open"] = OpenValues
        self.ns["_absent"] = _absent

    # -- helpers
    def const(self, value: Any) -> str:
        name = f"K{self.consts}"
        self.consts += 1
        self.ns[name] = value
        return name

    @staticmethod
    def _bad(name: str, value: Any) -> None:
        raise DecideError(f"bad value for `{name}`: {_fmt(value)}", name)

    @staticmethod
    def _out(output: ir.Output, value: Any) -> Any:
        """Generated leaves pass each computed output through here (the interpreter's test)."""
        problem = output_problem(output, value)
        if problem is not None:
            raise output_error(output, value, problem, None)
        return export_value(output.type, value)

    def readers(self) -> None:
        for name, var in self.s.variables.items():
            i = self.var_index[name]
            out = [f"def R{i}(v):"]
            if var.role == "derived":
                out.append(f"    return {self.expr(var.expr)}")
            elif name in self.looks:  # the k-th entry of the observed variable's list of looks
                base, k = self.looks[name]
                out.append(f"    s = v.get({base!r})")
                out.append(f"    x = s[{k - 1}] if s.__class__ is list and len(s) >= {k} else None")
                if self.stepping:
                    out.append(f"    if x is None and v.__class__ is _Open and (s.__class__ is not list or "
                               f"len(s) < {k}): raise _Need({base!r}, {k})")
                if ir.is_structured(var.type):  # a look at a list or record: checked whole, like an input
                    out.append(f"    return _data({base!r}, {base!r}, {self.const(var.type)}, x)")
                else:
                    out += [f"    {line}" for line in self.check_lines(var, "x")]
                    out.append("    return x")
            elif ir.is_structured(var.type):  # checked whole (items, fields) by the interpreter's test
                out.append(f"    x = v.get({name!r})")
                out += self.ask_lines(name)
                out.append(f"    return _data({name!r}, {name!r}, {self.const(var.type)}, x)")
            else:
                out.append(f"    x = v.get({name!r})")
                out += self.ask_lines(name)
                if var.default is not None:
                    out.append(f"    if x is None: return {self.const(default_value(var))}")
                out += [f"    {line}" for line in self.check_lines(var, "x")]
                out.append("    return x")
            self.lines += out

    def ask_lines(self, name: str) -> list[str]:
        """In the stepping form, a read of a value the session does not know yet asks for it."""
        if not self.stepping:
            return []
        return [f"    if x is None and v.__class__ is _Open and {name!r} not in v: raise _Need({name!r})"]

    def retry(self, indent: str, target: str, code: str) -> list[str]:
        """`target = code`; in the stepping form, a read of an unknown value yields the request
        (naming the stage) and evaluates `code` again once it is answered."""
        if not self.stepping:
            return [f"{indent}{target} = {code}"]
        return [f"{indent}while 1:",
                f"{indent}    try:",
                f"{indent}        {target} = {code}",
                f"{indent}        break",
                f"{indent}    except _Need as n:",
                f"{indent}        n.stage = {self.stage!r}",
                f"{indent}        yield n"]

    def check_lines(self, var: ir.Variable, x: str) -> list[str]:
        vtype = var.type
        n = repr(var.name)
        if isinstance(vtype, ir.EnumType):
            return [f"if {x} not in {self.const(frozenset(vtype.values))}: _bad({n}, {x})"]
        if isinstance(vtype, ir.BoolType):
            return [f"if {x} is not True and {x} is not False: _bad({n}, {x})"]
        if isinstance(vtype, ir.NumType):
            lines = []
            if vtype.kind == "int":
                lines.append(f"if {x}.__class__ is not int: _bad({n}, {x})")
            else:
                lines.append(f"if {x}.__class__ is not float and {x}.__class__ is not int: "
                             f"_bad({n}, {x})")
                lines.append(f"if not -_INF < {x} < _INF: _bad({n}, {x})")  # NaN and infinities
            if vtype.lo is not None:
                op = "<=" if vtype.lo_open else "<"
                lines.append(f"if {x} {op} {vtype.lo!r}: _bad({n}, {x})")
            if vtype.hi is not None:
                op = ">=" if vtype.hi_open else ">"
                lines.append(f"if {x} {op} {vtype.hi!r}: _bad({n}, {x})")
            return lines
        if isinstance(vtype, ir.TimeType):  # a bad value raises; the interpreter then says why
            return [f"{x} = _time({vtype.kind!r}, {x})"]
        if isinstance(vtype, ir.StringType):
            return [f"if {x}.__class__ is not str or len({x}) > {scalars.MAX_STRING}: _bad({n}, {x})"]
        return []

    def expr(self, e: Any) -> str:
        if isinstance(e, ir.Lit):
            return repr(e.value)
        if isinstance(e, ir.Var):
            return f"R{self.var_index[e.name]}(v)"
        if isinstance(e, ir.Unary):
            return f"(not {self.expr(e.operand)})" if e.op == "not" else f"(-{self.expr(e.operand)})"
        if isinstance(e, ir.Binary):
            if e.op == "/":
                return f"_div({self.expr(e.left)}, {self.expr(e.right)})"
            return f"({self.expr(e.left)} {e.op} {self.expr(e.right)})"
        if isinstance(e, ir.Compare):
            return f"({self.expr(e.left)} {e.op} {self.expr(e.right)})"
        if isinstance(e, ir.InSet):
            kw = "not in" if e.negated else "in"
            return f"({self.expr(e.operand)} {kw} {self.const(frozenset(v.value for v in e.values))})"
        if isinstance(e, ir.BoolOp):
            return "(" + f" {e.op} ".join(self.expr(o) for o in e.operands) + ")"
        if isinstance(e, ir.Call):
            args = [self.expr(a) for a in e.args]
            if e.func == "count":  # a flat tuple: no nesting however many conditions
                return "_count((" + ", ".join(args) + ",))"
            return f"{e.func}({', '.join(args)})"
        if isinstance(e, ir.TimeLit):
            return repr(e.value)
        if isinstance(e, ir.Func):
            if e.name == "missing":
                if isinstance(e.args[0], ir.Get):  # an optional record field
                    return f"({self.expr(e.args[0].base)}.get({e.args[0].field!r}) is None)"
                name = e.args[0].name if isinstance(e.args[0], ir.Var) else ""
                if self.stepping:
                    return f"(v.get({name!r}) is None and _absent(v, {name!r}))"
                return f"(v.get({name!r}) is None)"
            if e.name in ir.POSITIONS:
                return f"_at({self.expr(e.args[0])}, {0 if e.name == 'first' else -1}, {self.const(ir.show(e))})"
            code = ", ".join(self.expr(a) for a in e.args)
            return f"abs({code})" if e.name == "abs" else f"_days_between({code})"
        if isinstance(e, ir.Matches):
            return f"({self.const(scalars.compiled(e.pattern).fullmatch)}({self.expr(e.operand)}) is not None)"
        if isinstance(e, ir.CaseExpr):
            if len(e.arms) > CASE_INLINE and not _has_items(e):  # a helper would not see item variables
                return self.case_function(e)
            code = self.expr(e.otherwise)
            for arm in reversed(e.arms):
                code = f"({self.expr(arm.then)} if {self.expr(arm.when)} else {code})"
            return code
        return self.data_expr(e)

    def data_expr(self, e: Any) -> str:
        """Lists, records and weighted counts as Python (item variables become generator locals)."""
        if isinstance(e, ir.Get):
            if e.field in self.optional_fields:
                return f"_field({self.expr(e.base)}, {e.field!r})"
            return f"{self.expr(e.base)}[{e.field!r}]"
        if isinstance(e, ir.Item):
            return f"I_{e.name}"
        if isinstance(e, ir.Quant):
            src, cond, x = self.expr(e.source), self.expr(e.cond), f"I_{e.var}"
            if e.func == "count":
                return f"sum(1 for {x} in {src} if {cond})"
            if e.func == "sum":
                return f"sum({self.expr(e.value)} for {x} in {src} if {cond})"
            return f"{e.func}({cond} for {x} in {src})"
        if isinstance(e, ir.Length):
            return f"len({self.expr(e.operand)})"
        if isinstance(e, ir.Member):
            kw = "not in" if e.negated else "in"
            return f"({self.expr(e.operand)} {kw} {self.expr(e.source)})"
        if isinstance(e, ir.Weighted):
            conds = ", ".join(self.expr(a) for a in e.args)
            return f"_wcount(({conds},), {self.const(tuple(e.weights))})"
        if isinstance(e, ir.ListLit):  # `[*([A] if C else ()), B]`: the same items, order and evaluation order
            parts = [self.expr(i) if isinstance(c, ir.Lit) and c.value is True
                     else f"*(({self.expr(i)},) if {self.expr(c)} else ())" for i, c in zip(e.items, e.conds, strict=True)]
            return "[" + ", ".join(parts) + "]"
        if isinstance(e, ir.Index):
            return f"_at({self.expr(e.base)}, {e.index}, {self.const(ir.show(e))})"
        raise TypeError(f"unknown expression {e!r}")  # pragma: no cover

    def case_function(self, e: ir.CaseExpr) -> str:
        """A `case` with many arms as a helper function of flat `if`s: nested conditional
        expressions hit Python's parser limit (about 200 levels)."""
        name = f"C{self.tmp}"
        self.tmp += 1
        body = [f"def {name}(v):"]
        for arm in e.arms:
            body.append(f"    if {self.expr(arm.when)}: return {self.expr(arm.then)}")
        body.append(f"    return {self.expr(e.otherwise)}")
        self.helpers += body
        return f"{name}(v)"

    def leaf(self, target: ir.Target) -> str:
        base: dict[str, Any] = {"Action": target.action}
        dynamic: list[tuple[str, str]] = []
        assigned = {a.name: a.value for a in target.outputs}
        for name, out in self.s.outputs.items():
            if name in assigned:
                val = assigned[name]
                if isinstance(val, ir.Lit) and output_problem(out, val.value) is None:
                    base[name] = val.value
                else:
                    base[name] = None
                    dynamic.append((name, f"_out({self.const(out)}, {self.expr(val)})"))
            else:
                base[name] = out.default.value if out.default is not None else None
        k = self.const(base)
        if not dynamic:
            return k
        return "{**" + k + ", " + ", ".join(f"{n!r}: {c}" for n, c in dynamic) + "}"

    def calls(self, target: ir.Target) -> list[_CallCode]:
        """The actions a target carries out (steps, then the final action if a leaf) as
        (name, [(param, expr)], the for-each step or None)."""
        out: list[_CallCode] = [(c.action, [(a.name, a.value) for a in c.args], c if c.each is not None else None)
                                for c in target.steps]
        if target.kind == "action":
            out.append((target.action or "", [(a.name, a.value) for a in target.args], None))
        return out

    def action_code(self, call: _CallCode) -> str:
        """Code of one action carried out, `{"name", "args"}` (a constant when its arguments are); for a
        for-each step, the list of its actions (a comprehension over the items)."""
        n, args, each = call
        if each is None and all(isinstance(e, ir.Lit) for _, e in args):
            return self.const({"name": n, "args": {p: e.value for p, e in args}})
        body = ", ".join(f"{p!r}: {self.arg_code(n, p, e)}" for p, e in args)
        one = f"{{'name': {n!r}, 'args': {{{body}}}}}"
        if each is None:
            return one
        cond = "" if each.cond is None else f" if {self.expr(each.cond)}"
        return f"[{one} for I_{each.each} in {self.expr(each.source)}{cond}]"

    def step_lines(self, target: ir.Target, indent: str) -> list[str]:
        """In the stepping form, each action on the way of `target` yielded as it is carried out."""
        out: list[str] = []
        if self.stepping:
            for call in self.calls(target)[:len(target.steps)]:
                out += self.retry(indent, "a", self.action_code(call))
                if call[2] is not None:
                    out.append(f"{indent}yield from a")
                else:
                    out.append(f"{indent}yield a")
        return out

    def leaf_return(self, indent: str, code: str) -> list[str]:
        """`return code` (a leaf's results); in the stepping form, with its reads asked for first."""
        if not self.stepping or _CONSTANTS.fullmatch(code):
            return [f"{indent}return {code}"]
        return [*self.retry(indent, "r", f"({code})"), f"{indent}return r"]

    def actions_code(self, calls: list[_CallCode]) -> str:
        """Code building the action list: a constant when every argument is a literal."""
        if all(each is None for _, _, each in calls) and all(
                isinstance(e, ir.Lit) for _, args, _ in calls for _, e in args):
            return self.const([{"name": n, "args": {p: e.value for p, e in args}} for n, args, _ in calls])
        items = []
        for call in calls:
            code = self.action_code(call)
            items.append(f"*{code}" if call[2] is not None else code)
        return "[" + ", ".join(items) + "]"

    def arg_code(self, action: str, param: str, e: Any) -> str:
        """An argument's code; dates and durations are reported as text (like the interpreter), lists
        and records as copies (`export_arg`)."""
        decl = self.s.actions.get(action)
        ptype = next((p.type for p in decl.params if p.name == param), None) if decl is not None else None
        if isinstance(ptype, ir.TimeType):
            return f"_exp({self.const(ptype)}, {self.expr(e)})"
        if ir.is_structured(ptype):
            return f"_exa({self.const(ptype)}, {self.expr(e)})"
        return self.expr(e)

    def branch_code(self, stage: ir.Stage, emit_target, indent: str) -> list[str]:
        """Lines evaluating a stage's branches; `emit_target(target, indent)` writes each target."""
        out: list[str] = []
        subject = stage.subject
        fast_enum = (
            stage.kind == "match" and isinstance(subject, ir.Var)
            and self.s.variables[subject.name].role != "derived" and subject.name not in self.looks
            and isinstance(self.s.variables[subject.name].type, (ir.EnumType, ir.BoolType))
        )
        if fast_enum and isinstance(subject, ir.Var):  # the isinstance narrows `subject` for mypy
            var = self.s.variables[subject.name]
            x = f"x{self.tmp}"
            self.tmp += 1
            if self.stepping:  # the reader asks for an unknown value (and checks it)
                out += self.retry(indent, x, f"R{self.var_index[var.name]}(v)")
            else:
                out.append(f"{indent}{x} = v.get({var.name!r})")
            otherwise = None
            for branch in stage.branches:
                if not branch.values:
                    otherwise = branch
                    continue
                vals = [v.value for v in branch.values]
                if len(vals) == 1:
                    cond = f"{x} is {vals[0]!r}" if isinstance(vals[0], bool) else f"{x} == {vals[0]!r}"
                else:
                    cond = f"{x} in {self.const(frozenset(vals))}"
                # flat `if`s (every target returns or raises): a long `elif` chain nests in the AST
                out.append(f"{indent}if {cond}:")
                out += emit_target(branch.target, indent + "    ")
            out += [f"{indent}{line}" for line in self.check_lines(var, x)]
            if otherwise is not None:
                out += emit_target(otherwise.target, indent)
            else:
                out.append(f"{indent}raise DecideError('no branch')")
            return out
        closed = False
        for branch in stage.branches:
            if isinstance(branch.guard, ir.Lit) and branch.guard.value is False:
                continue  # a spent bounded branch of an unrolled procedure: never taken
            if branch.guard is None:
                out += emit_target(branch.target, indent)
                closed = True
                break
            if self.stepping:
                out += self.retry(indent, "c", self.expr(branch.guard))
                out.append(f"{indent}if c:")
            else:
                out.append(f"{indent}if {self.expr(branch.guard)}:")
            out += emit_target(branch.target, indent + "    ")
        if not closed:
            out.append(f"{indent}raise DecideError('no branch')")
        return out


_CONSTANTS = re.compile(r"K\d+(, K\d+)*")  # generated code made of constants only (reads nothing)


def _absent(values: Mapping[str, Any], name: str) -> bool:
    """`missing(X)` in the stepping form once `X` reads as null: asks for it if not known yet."""
    if values.__class__ is OpenValues and name not in values:
        raise NeedValue(name)
    return True


def _has_items(e: Any) -> bool:
    """Whether an expression reads an item variable of an enclosing `any`/`all`/`count`."""
    return isinstance(e, ir.Item) or any(_has_items(c) for c in ir.children(e))


def _expanded_size(scenario: ir.Scenario) -> int | None:
    """Stage occurrences in the fully expanded tree, or None if cyclic / over the limit."""
    memo: dict[str, int] = {}
    visiting: set[str] = set()

    def size(stage_id: str) -> int | None:
        if stage_id in memo:
            return memo[stage_id]
        if stage_id in visiting:
            return None
        stage = scenario.stages.get(stage_id)
        if stage is None:
            return None
        visiting.add(stage_id)
        total = 1
        for branch in stage.branches:
            if branch.target.kind == "stage":
                sub = size(branch.target.stage or "")
                if sub is None:
                    visiting.discard(stage_id)
                    return None
                total += sub
                if total > EXPAND_LIMIT:
                    visiting.discard(stage_id)
                    return None
        visiting.discard(stage_id)
        memo[stage_id] = total
        return total

    if scenario.start is None:
        return None
    if len(scenario.stages) > sys.getrecursionlimit() // 4:
        return None
    return size(scenario.start)


class Engine:
    """A compiled decision function for one scenario, and its stepping form (`steps`, built on
    first use): the same generated code as a generator that asks for unknown values and yields
    each action on the way, which a `sopgraph.logic.session.Session` drives."""

    def __init__(self, scenario: ir.Scenario):
        self.scenario = scenario
        self._flatten: Any = None  # reserved: values are read in their source form (looks from the lists)
        self._steps_fn: Any = None
        self._plan: tuple[ir.Scenario, dict[str, str] | None, dict[str, tuple[str, int]]] | None = None
        plan, display, looks = scenario, None, {}
        if scenario.procedural:
            try:
                unrolled = unrolled_for(scenario)
            except UnrollError:
                unrolled = None
            if unrolled is None or unrolled.premature:
                self._build_interpreted()  # not a valid procedure: the interpreter says why
                return
            plan, display = unrolled.scenario, unrolled.origin
            looks = {look_name(name, k): (name, k) for name, n in unrolled.looks.items() for k in range(1, n + 1)}
        self.mode = "tree" if _expanded_size(plan) is not None else "loop"
        built = self._generate(_Gen(plan, looks), plan, display)
        if built is None:
            self._build_interpreted()
            return
        self.source, self._fn = built
        self._plan = (plan, display, looks)

    def _generate(self, gen: _Gen, plan: ir.Scenario, display: dict[str, str] | None) -> tuple[str, Any] | None:
        """(source, function) of one form, or None when Python cannot compile it as written."""
        gen.readers()
        if self.mode == "tree":
            self._build_tree(gen, plan, display)
        else:
            self._build_loop(gen, plan, display)
        source = "\n".join(gen.helpers + gen.lines) + "\n"
        try:
            exec(compile(source, f"<sop engine {self.scenario.name}>", "exec"), gen.ns)  # noqa: S102
        except (SyntaxError, RecursionError, MemoryError, ValueError, OverflowError):
            return None  # any program that checks runs: past what Python can compile, interpret it
        return source, gen.ns["steps" if gen.stepping else "decide"]

    def _build_interpreted(self) -> None:
        self.mode = "interpret"
        self.source = ""

        def fn(values: Mapping[str, Any]) -> tuple[list[str], dict[str, Any], list[dict[str, Any]]]:
            d = interpret(self.scenario, values)
            return d.path, d.finals, d.actions

        self._fn = fn

    def steps(self, values: Mapping[str, Any]) -> Generator[Any, None, Trace]:
        """The stepping form on `values` (an `OpenValues` to be asked for what it lacks): a generator
        yielding `NeedValue` requests and the actions on the way (`{"name", "args"}`), returning
        (path, finals, actions) exactly as `decide_trace_raw` does."""
        if self._steps_fn is None:
            built = None
            if self._plan is not None:
                plan, display, looks = self._plan
                built = self._generate(_Gen(plan, looks, stepping=True), plan, display)
            self._steps_fn = built[1] if built is not None else self.walk
        return self._steps_fn(values)

    def walk(self, values: Mapping[str, Any]) -> Generator[Any, None, Trace]:
        """The stepping form by the reference interpreter (precise errors; the fallback)."""
        decision, _taken = yield from walk(self.scenario, values)
        return decision.path, decision.finals, decision.actions

    @staticmethod
    def _build_tree(gen: _Gen, plan: ir.Scenario, display: dict[str, str] | None) -> None:
        def emit_stage(stage_id: str, prefix: tuple[str, ...], calls: tuple, indent: str) -> list[str]:
            stage = plan.stages[stage_id]
            shown = (display or {}).get(stage_id, stage_id)
            path = prefix + (shown,)

            def emit_target(target: ir.Target, ind: str) -> list[str]:
                gen.stage = shown
                done = calls + tuple(gen.calls(target))
                out = gen.step_lines(target, ind)
                if target.kind == "action":
                    return out + gen.leaf_return(ind, f"{gen.const(list(path))}, {gen.leaf(target)}, "
                                                      f"{gen.actions_code(list(done))}")
                out += emit_stage(target.stage or "", path, done, ind)
                gen.stage = shown
                return out

            gen.stage = shown
            return gen.branch_code(stage, emit_target, indent)

        gen.lines.append("def steps(v):" if gen.stepping else "def decide(v):")
        gen.lines += emit_stage(plan.start or "", (), (), "    ")

    @staticmethod
    def _build_loop(gen: _Gen, plan: ir.Scenario, display: dict[str, str] | None) -> None:
        index = {sid: i for i, sid in enumerate(plan.stages)}
        for sid, stage in plan.stages.items():

            def emit_target(target: ir.Target, ind: str) -> list[str]:
                calls = gen.calls(target)
                out = gen.step_lines(target, ind)
                if target.kind == "action":
                    return out + gen.leaf_return(ind, f"{gen.leaf(target)}, {gen.actions_code(calls)}")
                nxt = index.get(target.stage or "", -1)
                if calls:
                    return out + [f"{ind}return {nxt}, {gen.actions_code(calls)}"]
                return out + [f"{ind}return {nxt}"]

            gen.stage = (display or {}).get(sid, sid)
            gen.lines.append(f"def S{index[sid]}(v):")
            if gen.stepping:
                gen.lines.append("    if 0: yield  # a generator even where nothing is asked or done")
            gen.lines += gen.branch_code(stage, emit_target, "    ")
        gen.ns["IDS"] = [(display or {}).get(sid, sid) for sid in plan.stages]
        gen.lines.append("FUNCS = [" + ", ".join(f"S{i}" for i in range(len(index))) + "]")
        start = index.get(plan.start or "", -1)
        limit = len(index) + 1
        gen.lines += [
            "def steps(v):" if gen.stepping else "def decide(v):",
            "    p = []",
            "    a = []",
            f"    s = {start}",
            f"    for _ in range({limit}):",
            "        if s < 0: raise DecideError('undefined stage')",
            "        p.append(IDS[s])",
            "        r = yield from FUNCS[s](v)" if gen.stepping else "        r = FUNCS[s](v)",
            "        if r.__class__ is int:",
            "            s = r",
            "            continue",
            "        r, acts = r",
            "        a += acts",
            "        if r.__class__ is not int: return p, r, a",
            "        s = r",
            "    raise DecideError('loop')",
        ]

    def decide_trace_raw(self, values: Mapping[str, Any]) -> tuple[list[str], dict[str, Any], list[dict[str, Any]]]:
        """Fast path for batches: (path, finals, actions); the returned objects must not be mutated."""
        try:
            if self._flatten is not None:
                return self._fn(self._flatten(values))
            return self._fn(values)
        except (DecideError, TypeError, ValueError, OverflowError, AttributeError, RecursionError) as exc:
            # RecursionError: a deep `let` chain; the interpreter evaluates it bottom-up
            d = self._fallback(values, exc)
            return d.path, d.finals, d.actions

    def decide_raw(self, values: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
        """Fast path for batches: (path, finals); the returned objects must not be mutated."""
        try:
            r = self._fn(values if self._flatten is None else self._flatten(values))
            return r[0], r[1]
        except (DecideError, TypeError, ValueError, OverflowError, AttributeError, RecursionError) as exc:
            # RecursionError: a deep `let` chain; the interpreter evaluates it bottom-up
            d = self._fallback(values, exc)
            return d.path, d.finals

    def _fallback(self, values: Mapping[str, Any], exc: Exception) -> Decision:
        """Re-run the interpreter after a failure of the generated code: it raises the precise
        DecideError (which stage needed which value), or decides if the failure was not a bad value."""
        if isinstance(exc, DecideError):
            return interpret(self.scenario, values)  # raises, with the precise message
        try:
            return interpret(self.scenario, values)
        except DecideError:
            raise
        except Exception:  # noqa: BLE001 - a value of the wrong shape deep in an expression
            raise DecideError(f"cannot evaluate: {exc}") from None

    def decide(self, values: Mapping[str, Any]) -> Decision:
        path, finals, actions = self.decide_trace_raw(values)
        return Decision(path=list(path), finals=dict(finals),
                        actions=[{"name": a["name"], "args": dict(a["args"])} for a in actions])

    def decide_many(self, rows: Iterable[Mapping[str, Any]]) -> Iterator[Decision | DecideError]:
        """Decide a batch; failures are yielded as DecideError values so the batch continues."""
        for row in rows:
            try:
                yield self.decide(row)
            except DecideError as exc:
                yield exc


def engine_for(scenario: ir.Scenario) -> Engine:
    """The scenario's compiled engine, built once and kept on the scenario object."""
    engine = scenario._engine
    if not isinstance(engine, Engine):  # None until first use (ir cannot name the Engine type)
        engine = scenario._engine = Engine(scenario)
    return engine


def decide(scenario: ir.Scenario, values: Mapping[str, Any]) -> Decision:
    """Reference path and finals for one assignment of field and system values."""
    return engine_for(scenario).decide(values)
