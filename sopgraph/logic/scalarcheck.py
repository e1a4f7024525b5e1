"""Type rules for dates, datetimes, durations, strings, optionals and the built-in functions.

Kept apart from the checker's core typer (a mixin it inherits) so the rules of these types read in one
place (docs/language.md §7 "Dates, durations and strings"):

- `date` / `datetime` are points in time; `duration` is a length of time.
  point - point → duration; point ± duration → a point (a date stays a date when the duration is
  written in whole days or weeks, else the result is a datetime); duration ± duration → duration;
  duration × number, number × duration, duration / number → duration; duration / duration → float;
  -duration → duration. Points compare with points (a date is its midnight, UTC), durations with
  durations; neither compares with plain numbers.
- `string` compares with `==` / `!=` with strings and quoted literals, `in {"a", "b"}`, and
  `matches "pattern"`; strings have no order and no arithmetic.
- `abs(number)` / `abs(duration)`; `days_between(a, b)` (points) is a number of days;
  `missing(X)` (X declared optional with `T?`) is a condition.
"""

from __future__ import annotations

import re
from typing import Any

from sopgraph.language import ir, scalars
from sopgraph.language.diagnostics import Diagnostic, clip, error, info

POINTS = ("date", "datetime")


def is_point(t: Any) -> bool:
    return isinstance(t, ir.TimeType) and t.kind in POINTS


def is_duration(t: Any) -> bool:
    return isinstance(t, ir.TimeType) and t.kind == "duration"


def time_kind_text(t: ir.TimeType | ir.StringType) -> str:
    return {"date": "a date", "datetime": "a datetime", "duration": "a duration", "string": "a string"}[t.kind]


def _whole_days(e: Any) -> bool:
    """A duration written in whole days: a literal like `2 days` (or such literals added up)."""
    if isinstance(e, ir.TimeLit):
        return e.unit == "duration" and e.value % scalars.DAY == 0
    if isinstance(e, ir.Binary) and e.op in ("+", "-"):
        return _whole_days(e.left) and _whole_days(e.right)
    return False


def _bare_word(e: Any) -> bool:
    """A name that is no variable where a value goes (`today`): read as the enum value of that name."""
    return isinstance(e, ir.Lit) and isinstance(e.value, str) and e.bare


def _weighed(arg: Any) -> str:
    """`2 * (A == B)` (a weight times a condition, as other languages write a score) as `2: A == B`."""
    if isinstance(arg, ir.Binary) and arg.op == "*":
        for weight, cond in ((arg.left, arg.right), (arg.right, arg.left)):
            if isinstance(weight, ir.Lit) and not isinstance(weight.value, bool):
                return f"{clip(ir.show(weight))}: {clip(ir.show(cond))}"
    return f"1: {clip(ir.show(arg))}"


_WEIGHTED_WORDS = frozenset({"weighted", "weight", "score", "points", "countif", "count_if", "sumif", "sum_if"})


class ScalarTyping:
    """Mixin of the checker's typer: the rules above. Expects `infer`, `mismatch`, `undefined`,
    `expect_bool` and `s` (the scenario) from the host class."""

    s: ir.Scenario

    def infer(self, e: Any) -> Any: ...  # provided by the host

    def mismatch(self, message: str, span: ir.Span, hint: str | None = None, code: str = "E201") -> None: ...

    def expect_bool(self, e: Any, what: str) -> None: ...

    def temporal_binary(self, e: ir.Binary, a: Any, b: Any) -> tuple[bool, Any]:
        """(handled, type) for arithmetic with a date, datetime or duration operand (or a string)."""
        scalar = (ir.TimeType, ir.StringType)
        if not isinstance(a, scalar) and not isinstance(b, scalar):
            return False, None
        op = e.op
        shown = clip(ir.show(e))
        if isinstance(a, ir.StringType) or isinstance(b, ir.StringType):
            self.mismatch(f"strings have no arithmetic: `{shown}`", e.span,
                          "compare strings with `==`, `!=`, `in {...}` or `matches \"pattern\"`")
            return True, None
        if op == "-" and is_point(a) and is_point(b):
            return True, ir.TimeType(kind="duration", span=e.span)
        if op in ("+", "-") and is_point(a) and is_duration(b):
            keep = a.kind == "date" and _whole_days(e.right)
            return True, ir.TimeType(kind="date" if keep else "datetime", span=e.span)
        if op == "+" and is_duration(a) and is_point(b):
            keep = b.kind == "date" and _whole_days(e.left)
            return True, ir.TimeType(kind="date" if keep else "datetime", span=e.span)
        if op in ("+", "-") and is_duration(a) and is_duration(b):
            return True, a
        if op == "*" and (is_duration(a) and isinstance(b, ir.NumType) or isinstance(a, ir.NumType)
                          and is_duration(b)):
            return True, ir.TimeType(kind="duration", span=e.span)
        if op == "/" and is_duration(a) and isinstance(b, ir.NumType):
            return True, a
        if op == "/" and is_duration(a) and is_duration(b):
            return True, ir.NumType(kind="float", lo_open=True, hi_open=True)
        hint = "subtract two dates to get a duration; add or subtract a duration such as `2 days` to move a date"
        if is_point(a) and isinstance(b, ir.NumType) or is_point(b) and isinstance(a, ir.NumType):
            hint = "a number has no unit here: write a duration, e.g. `Booked + 2 days`"
        elif _bare_word(e.left) or _bare_word(e.right):
            hint = "the current time is `now`; a date constant is written `date(\"2026-01-31\")`"
        self.mismatch(f"`{shown}` is not defined for {_text(a)} and {_text(b)}", e.span, hint)
        return True, None

    def temporal_extreme(self, e: ir.Call, types: list[Any]) -> tuple[bool, Any]:
        """`min`/`max` of dates (a date or datetime) or of durations; False when no argument is one."""
        if not any(isinstance(t, ir.TimeType) for t in types):
            return False, None
        if all(is_duration(t) for t in types):
            return True, types[0]
        if all(is_point(t) for t in types):
            whole = all(t.kind == "date" for t in types)
            return True, ir.TimeType(kind="date" if whole else "datetime", span=e.span)
        self.mismatch(f"`{e.func}` mixes dates, durations and numbers: `{clip(ir.show(e))}`", e.span,
                      "give it only dates, only durations or only numbers")
        return True, None

    def func(self, e: ir.Func) -> Any:
        """The type of `abs(...)`, `days_between(...)`, `missing(...)`; unknown names are E101."""
        arity = {"abs": 1, "days_between": 2, "missing": 1}
        if e.name not in arity:
            hint = ("functions are " + ", ".join(f"`{f}`" for f in ir.FUNCTIONS)
                    + ", `count`, `min`, `max`, `len`, `any`, `all`, `sum(… for … in …)`; dates are written `date(\"2026-11-23\")`")
            if e.name in _WEIGHTED_WORDS:
                weighted = ", ".join(_weighed(a) for a in e.args[:4]) or "2: A, 1: B"
                hint = (f"a weighted score is a count with weights: `count({weighted})` adds the weights of the "
                        "conditions that hold")
            elif e.name in ("sum", "total", "add"):
                hint = (f"add values with `+` (`{' + '.join(ir.show(a) for a in e.args[:3]) or 'A + B'}`); " + hint)
            self.mismatch(f"unknown function `{e.name}`", e.span, hint, code="E101")
            for arg in e.args:
                self.infer(arg)
            return None
        if len(e.args) != arity[e.name]:
            self.mismatch(f"`{e.name}` takes {arity[e.name]} argument{'s' if arity[e.name] > 1 else ''}, "
                          f"not {len(e.args)}", e.span, f"write `{_usage(e.name)}`")
            return None
        if e.name == "missing":
            return self._missing(e)
        if e.name == "abs":
            t = self.infer(e.args[0])
            if is_duration(t):
                return t
            if isinstance(t, ir.NumType):
                return _abs_range(t)
            if t is not None:
                self.mismatch(f"`abs` of {_text(t)}: `{clip(ir.show(e.args[0]))}` is not a number", e.args[0].span,
                              "`abs` takes a number or a duration")
            return None
        kinds = [self.infer(a) for a in e.args]
        for arg, t in zip(e.args, kinds, strict=True):
            if t is not None and not is_point(t):
                self.mismatch(f"`days_between` takes dates or datetimes, but `{clip(ir.show(arg))}` is {_text(t)}",
                              arg.span, "the current time is `now` (given per case or `sop decide --now`)"
                              if _bare_word(arg) else "write `days_between(Earlier, Later)`")
                return None
        whole = all(isinstance(t, ir.TimeType) and t.kind == "date" for t in kinds)
        return ir.NumType(kind="int" if whole else "float", lo_open=True, hi_open=True)

    def _missing(self, e: ir.Func) -> Any:
        arg = e.args[0]
        if isinstance(arg, ir.Get):
            self._missing_field(arg)
            return ir.BoolType(span=e.span)
        var = self.s.variables.get(arg.name) if isinstance(arg, ir.Var) else None
        if var is None:
            self.infer(arg)
            self.mismatch(f"`missing` tests a variable, not `{clip(ir.show(arg))}`", arg.span,
                          "write `missing(X)` for a field or system variable `X` declared optional (`T?`)",
                          code="E212")
        elif not var.optional:
            self.mismatch(f"`{var.name}` is not optional, so `missing({var.name})` is always false", arg.span,
                          f"declare it optional: `{var.role} {var.name}: {ir.describe_type(var.type)}?`",
                          code="E212")
        return ir.BoolType(span=e.span)

    def _missing_field(self, arg: ir.Get) -> None:
        """`missing(R.note)`: the field must be declared optional (`note: string?`)."""
        record = self.infer(arg.base)
        if not isinstance(record, ir.RecordType):
            self.infer(arg)  # says what is wrong with the base
            return
        field = record.field(arg.field)
        if field is None:
            self.infer(arg)  # E101 with the field names
        elif not field.optional:
            self.mismatch(f"field `{arg.field}` is not optional, so `missing({clip(ir.show(arg))})` is always false",
                          arg.span, f"declare it optional in the record: `{arg.field}: "
                          f"{ir.describe_type(field.type)}?`", code="E212")

    def matches_type(self, e: ir.Matches) -> Any:
        t = self.infer(e.operand)
        if t is not None and not isinstance(t, ir.StringType):
            self.mismatch(f"`matches` tests a string, but `{clip(ir.show(e.operand))}` is {_text(t)}", e.operand.span,
                          "declare the variable as `string`")
        return ir.BoolType(span=e.span)

    def scalar_compare(self, e: ir.Compare, lt: Any, rt: Any) -> bool:
        """Comparisons involving a date, duration or string; False when neither side is one."""
        scalar = (ir.TimeType, ir.StringType)
        if not isinstance(lt, scalar) and not isinstance(rt, scalar):
            return False
        ordering = e.op not in ("==", "!=")
        shown = clip(ir.show(e))
        if isinstance(lt, ir.StringType) or isinstance(rt, ir.StringType):
            other, other_e = (rt, e.right) if isinstance(lt, ir.StringType) else (lt, e.left)
            if ordering:
                self.mismatch(f"strings have no order: `{shown}`", e.span, "use `==`, `!=` or `matches`")
            elif isinstance(other, ir.StringType) or _is_sym(other) and not other.bare:
                pass
            elif _is_sym(other):
                self.mismatch(f"`{other.value}` is not a variable; a string value is written in quotes",
                              other_e.span, f'write `"{other.value}"`', code="E101")
            else:
                self.mismatch(f"comparing a string with {_text(other)}: `{shown}`", e.span,
                              "both sides of a comparison must be of the same kind")
            return True
        if (is_point(lt) and is_point(rt)) or (is_duration(lt) and is_duration(rt)):
            return True
        hint = "both sides of a comparison must be of the same kind"
        if is_duration(lt) and isinstance(rt, ir.NumType) or is_duration(rt) and isinstance(lt, ir.NumType):
            number_side = e.right if is_duration(lt) else e.left
            if isinstance(number_side, ir.Func) and number_side.name == "days_between" and len(number_side.args) == 2:
                a, b = (clip(ir.show(arg)) for arg in number_side.args)  # `days_between(a, b) < 14 days`
                written = clip(ir.show(e.left if is_duration(lt) else e.right))
                days = re.fullmatch(r"(\d+(?:\.\d+)?) days?", written)
                op = e.op if number_side is e.left else ir.MIRRORED_OP[e.op]  # written as `days_between(…) OP days`
                hint = (f"`days_between` gives a number of days: compare it with a number "
                        f"(`days_between({a}, {b}) {op} {days.group(1) if days else 'N'}`), or compare the "
                        f"duration `{b} - {a}` with `{written}`")
            else:
                hint = "give the number a unit, e.g. `Waited > 2 hours`"
        elif is_point(lt) or is_point(rt):
            other_side = e.right if is_point(lt) else e.left
            bare = _bare_date(other_side)
            point = lt if is_point(lt) else rt
            if bare is not None:  # `Bought >= 2026-01-01`: read as 2026 minus 1 minus 1
                literal = f'date("{bare}")' if point.kind == "date" else f'datetime("{bare}T00:00")'
                hint = f"a date constant is written in quotes: `{literal}`"
            elif (quoted := _quoted_moment(other_side)) is not None:  # `Bought < "2026-01-01"`: a string
                hint = f"a date constant is written `{quoted}`"
            else:
                hint = "compare a date with a date, e.g. `Booked > now - 24 hours`, or use `days_between(a, b)`"
        self.mismatch(f"comparing {_text(lt)} with {_text(rt)}: `{shown}`", e.span, hint)
        return True

    def scalar_member(self, subject: Any, st: Any, values: list[ir.Lit], what: str) -> bool:
        """`match` / `in {...}` values for a string subject (quoted strings); False if not a string."""
        if not isinstance(st, (ir.StringType, ir.TimeType)):
            return False
        for lit in values:
            if isinstance(st, ir.TimeType):
                self.mismatch(f"{what} on {_text(st)} is not supported: `{clip(ir.show(subject))}`", lit.span,
                              "compare with `<`, `>=`, ... instead")
                return True
            if not isinstance(lit.value, str) or isinstance(lit.value, bool):
                self.mismatch(f"{what} value `{clip(ir.show(lit))}` is not a string, but `{clip(ir.show(subject))}` is",
                              lit.span, 'write string values in quotes: "like this"')
            elif lit.bare:
                self.mismatch(f"{what} value `{lit.value}` is a name; a string value is written in quotes",
                              lit.span, f'write `"{lit.value}"`')
        return True

    def scalar_output(self, name: str, ot: Any, t: Any, e: Any, span: ir.Span) -> bool:
        """An output or argument of a date, duration or string type (E204); False if not one."""
        if not isinstance(ot, (ir.TimeType, ir.StringType)):
            if isinstance(t, (ir.TimeType, ir.StringType)):
                self.mismatch(f"output `{name}` is {ir.describe_type(ot)} but `{clip(ir.show(e))}` is {_text(t)}", span,
                              f"declare it `{t.kind}`", code="E204")
                return True
            return False
        if isinstance(ot, ir.TimeType) and _is_sym(t) and not t.bare:
            try:  # a quoted value of the type, e.g. an output default `= "2026-01-01"`
                scalars.parse_temporal(ot.kind, t.value)
                return True
            except scalars.ValueProblem:
                pass
        if isinstance(ot, ir.StringType):
            ok = isinstance(t, ir.StringType) or (_is_sym(t) and not t.bare)
        elif ot.kind == "datetime":
            ok = is_point(t)
        else:
            ok = isinstance(t, ir.TimeType) and t.kind == ot.kind
        if not ok and t is not None:
            shown = clip(ir.quote_string(t.value) if _is_sym(t) else ir.show(e))
            what = "a name" if _is_sym(t) and t.bare else ("a quoted string" if _is_sym(t) else _text(t))
            self.mismatch(f"output `{name}` is {_text(ot)} but `{shown}` is {what}", span,
                          "give it a value of its own type" + (' (strings in quotes: "A-1")'
                                                               if isinstance(ot, ir.StringType) else ""),
                          code="E204")
        return True


def _is_sym(t: Any) -> bool:
    return t is not None and not isinstance(t, ir.Node) and hasattr(t, "bare")


def _text(t: Any) -> str:
    if isinstance(t, (ir.TimeType, ir.StringType)):
        return time_kind_text(t)
    if isinstance(t, ir.EnumType):
        return "an enum"
    if isinstance(t, ir.BoolType):
        return "a bool"
    if isinstance(t, ir.NumType):
        return "a number"
    if _is_sym(t):
        return f"the value `{t.value}`"
    return "unknown"


def _usage(name: str) -> str:
    return {"abs": "abs(X - Y)", "days_between": "days_between(Earlier, Later)", "missing": "missing(X)"}[name]


def _abs_range(t: ir.NumType) -> ir.NumType:
    if t.lo is not None and t.lo >= 0:
        return t
    if t.lo is None or t.hi is None:
        return ir.NumType(kind=t.kind, lo=0.0, hi=None, hi_open=True)
    hi = max(abs(t.lo), abs(t.hi))
    lo = 0.0 if t.hi >= 0 else abs(t.hi)
    return ir.NumType(kind=t.kind, lo=lo, hi=hi)


# ---------------------------------------------------------------------------------------------
# The pass: defaults, optionals, patterns


def default_problem(var: ir.Variable) -> str | None:
    """Why `var`'s declared default does not fit its type (None when it fits)."""
    d = var.default
    t = var.type
    if d is None:
        return None
    value = d.value
    if isinstance(t, ir.TimeType):
        if isinstance(d, ir.TimeLit):
            return None if d.unit == t.kind or (t.kind == "datetime" and d.unit == "date") else \
                f"is {time_kind_text(ir.TimeType(kind=d.unit))}, not {time_kind_text(t)}"
        try:
            scalars.parse_temporal(t.kind, value)
        except scalars.ValueProblem as exc:
            return str(exc)
        return None
    if isinstance(d, ir.TimeLit):
        return f"is a {d.unit}, but `{var.name}` is {ir.describe_type(t)}"
    if isinstance(t, ir.StringType):
        return None if isinstance(value, str) and not d.bare else "is not a quoted string"
    if isinstance(t, ir.EnumType):
        return None if value in t.values and isinstance(value, str) else \
            f"is not one of {' | '.join(t.values)}"
    if isinstance(t, ir.BoolType):
        return None if isinstance(value, bool) else "is not `true` or `false`"
    if isinstance(t, ir.NumType):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "is not a number"
        if t.kind == "int" and isinstance(value, float) and not value.is_integer():
            return "is not an integer"
        if not t.contains(value):
            return f"is outside {t.describe()}"
    return None


def default_value(var: ir.Variable) -> Any:
    """The declared default in the engine's internal form (seconds for dates and durations)."""
    d = var.default
    if d is None:
        return None
    if isinstance(d, ir.TimeLit):
        return d.value
    if isinstance(var.type, ir.TimeType):
        return scalars.parse_temporal(var.type.kind, d.value)
    if isinstance(var.type, ir.NumType) and var.type.kind == "int" and isinstance(d.value, float):
        return int(d.value)
    return d.value


def check_scalars(scenario: ir.Scenario, expressions: list[Any]) -> list[Diagnostic]:
    """Defaults that do not fit (E212), optional-with-default and optional derived/observed (E212),
    patterns that are invalid or too costly (E211), patterns witnesses cannot be built for (I210)."""
    out: list[Diagnostic] = []
    for var in scenario.variables.values():
        if var.default is not None:
            problem = default_problem(var)
            span = var.default.span if var.default.span.line else var.span
            if problem:
                out.append(error("E212", f"the default of `{var.name}` {problem}", span,
                                 f"give a value of type {ir.describe_type(var.type)}"))
            if var.optional:
                out.append(error("E212", f"`{var.name}` is optional and has a default", span,
                                 "with a default it is never missing: drop the `?` or the default"))
        if var.observed and (var.optional or var.default is not None):
            out.append(error("E212", f"observed `{var.name}` cannot be optional or have a default", var.span,
                             "give a value for every look"))
    stack = list(expressions)
    seen: set[str] = set()
    children, var_node, lit_node = ir.children, ir.Var, ir.Lit
    leaves = (var_node, lit_node)
    while stack:
        e = stack.pop()
        kind = type(e)
        if kind is var_node or kind is lit_node:
            continue  # leaves: most nodes of a large program
        if kind is ir.InSet and type(e.operand) in leaves:
            continue  # a name's set test (its values are literals): most other guards
        if isinstance(e, ir.Matches):
            span = e.pattern_span if e.pattern_span.line else e.span
            bad = scalars.pattern_problem(e.pattern)
            if bad:
                out.append(error("E211", bad[0], span, bad[1]))
            elif e.pattern not in seen:
                seen.add(e.pattern)
                out += _witness_note(e.pattern, span)
        stack += children(e)
    return out


def _witness_note(pattern: str, span: ir.Span) -> list[Diagnostic]:
    try:
        good, bad = scalars.pattern_examples(pattern)
    except scalars.OutsideSubset as exc:
        return [info("I210", f"test cases cannot be built for this pattern (it uses `{exc}`)", span,
                     "paths through it are still checked; synthesis leaves this string out of its cases")]
    if good is None or bad is None:
        which = "matches" if good is None else "does not match"
        return [info("I210", f"no example string that {which} this pattern could be built", span,
                     "synthesis cannot cover the branch that needs one")]
    return []


def _quoted_moment(e: Any) -> str | None:
    """`"2026-01-01"` (or a datetime) written as a plain string where a date is compared: the
    `date("…")` / `datetime("…")` constant it means, else None."""
    if not (isinstance(e, ir.Lit) and isinstance(e.value, str) and not e.bare):
        return None
    for kind in ("date", "datetime"):
        try:
            scalars.parse_temporal(kind, e.value)
        except (ValueError, TypeError):
            continue
        return f'{kind}("{e.value}")'
    return None


def _bare_date(e: Any) -> str | None:
    """`2026-01-01` written without `date("…")` parses as the subtraction 2026 - 1 - 1: the date it
    spells (YYYY-MM-DD from the numbers as written), else None."""
    if not (isinstance(e, ir.Binary) and e.op == "-" and isinstance(e.left, ir.Binary) and e.left.op == "-"):
        return None
    numbers = [p.value for p in (e.left.left, e.left.right, e.right) if isinstance(p, ir.Lit) and type(p.value) is int]
    if len(numbers) != 3:
        return None
    year, month, day = (int(n) for n in numbers)
    if not (1000 <= year <= 9999 and 1 <= month <= 12 and 1 <= day <= 31):
        return None
    return f"{year:04d}-{month:02d}-{day:02d}"

