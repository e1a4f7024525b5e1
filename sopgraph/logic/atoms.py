"""Comparisons of guarded values → the space's atoms: what a guard's leaves become once the guard
compiler (`guards.GuardCompiler`) has walked the expression down to values.

A value is a constant, a variable, a monotone affine function of one numeric variable, a
`days_between` of two such, opaque, or always an error (`Val`). `AtomCompiler` turns a comparison,
membership or truthiness test of such values into an enum mask, a numeric interval solved exactly
under float rounding (by probing the reference interpreter), a difference literal `x - y <= k` that
`diffbound` decides, or else a residual the space decides later; `arith` and `neg_val` keep the
affine form through arithmetic. No step budget is spent here: each call does bounded work on values
the compiler already paid for. The space is seen through `CompileSpace`, so this module sits below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Protocol

from sopgraph.language import ir, scalars
from sopgraph.logic.engine import DecideError, Interpreter, apply_arith, apply_compare
from sopgraph.logic.formula import FALSE, TRUE, DomainOps, Formula, mk_and, mk_atom, mk_or, negate
from sopgraph.logic.intervals import (
    MAX_FLOAT,
    NO_POINTS,
    NumDom,
    first_true,
    float_to_ordinal,
    num_norm,
    ordinal_to_float,
    pick_num,
)

INF = math.inf
_INT_LIMIT = 2**1000  # affine solving searches ints inside ±this (beyond it floats overflow)

# Values of sub-expressions: ('c', value) constant, ('v', idx, expr) variable, ('a', idx, a, b, expr)
# monotone affine function of one numeric variable, ('d', later, earlier, expr) `days_between` of two
# such values, ('o', expr) opaque, ('e',) always an error.
Val = tuple


class CompileSpace(DomainOps, Protocol):
    """What the compiler reads and asks of a space (a protocol so the compiler sits below it):
    the variable layout, residual numbering and the totality test for linear negation."""

    scenario: ir.Scenario
    names: list[str]
    index: dict[str, int]
    values: list[tuple]
    strings: set[int]  # string variables (their constants are shown quoted)
    text_enums: set[int]  # string variables analysed as a finite domain (likewise quoted)

    def residual(self, expr: Any, truth: bool) -> Formula: ...

    def diff_residual(self, p: int, q: int, k: int) -> Formula: ...

    def total(self, expr: Any) -> bool: ...


NEGATED_OP = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class AtomCompiler:
    """Comparisons, memberships and truthiness of guarded values → formulas over the space's atoms."""

    def __init__(self, space: CompileSpace):
        self.sp = space

    def truthy(self, v: Val, truth: bool) -> Formula:
        sp = self.sp
        tag = v[0]
        if tag == "e":
            return FALSE
        if tag == "c":
            return TRUE if bool(v[1]) == truth else FALSE
        if tag == "v":
            i = v[1]
            k = sp.kinds[i]
            if k in ("enum", "bool"):
                m = 0
                for j, x in enumerate(sp.values[i]):
                    if bool(x) == truth:
                        m |= 1 << j
                return mk_atom(sp, i, m)
            if k in ("int", "float"):
                return self.compare(v, "!=", ("c", 0), truth)
        if tag == "a":
            return self.compare(v, "!=", ("c", 0), truth)
        return sp.residual(_expr_of(sp, v), truth)

    def member(self, v: Val, values: list, want: bool, e: Any) -> Formula:
        sp = self.sp
        tag = v[0]
        if tag == "e":
            return FALSE
        if tag == "c":
            try:
                hit = v[1] in set(values)
            except TypeError:
                return FALSE
            return TRUE if hit == want else FALSE
        if tag == "v" and not _foreign(sp, v[1], values):
            i = v[1]
            k = sp.kinds[i]
            if k in ("enum", "bool"):
                vs = set(values)
                m = 0
                for j, x in enumerate(sp.values[i]):
                    if (x in vs) == want:
                        m |= 1 << j
                return mk_atom(sp, i, m)
        if tag in ("v", "a") and all(_is_num(x) for x in values) and sp.kinds[v[1]] in ("int", "float"):
            if want:
                return mk_or(sp, [self.compare(v, "==", ("c", x), True) for x in values])
            return mk_and(sp, [self.compare(v, "!=", ("c", x), True) for x in values])
        quoted = _is_text(sp, v)
        node = ir.InSet.model_construct(kind="in", operand=_expr_of(sp, v),
                                        values=[lit_of(x, quoted) for x in values], negated=False, span=e.span)
        return sp.residual(node, want)

    def compare(self, vl: Val, op: str, vr: Val, truth: bool) -> Formula:
        sp = self.sp
        if vl[0] == "e" or vr[0] == "e":
            return FALSE
        if vl[0] == "c" and vr[0] == "c":
            try:
                r = apply_compare(op, vl[1], vr[1])
            except (DecideError, TypeError):
                return FALSE
            return TRUE if bool(r) == truth else FALSE
        if vl[0] == "c":
            vl, vr = vr, vl
            op = ir.MIRRORED_OP[op]
        if vr[0] == "c":
            c = vr[1]
            if vl[0] == "d":
                f = self.days_compare(vl, op, c, truth)
                if f is not None:
                    return f
            if vl[0] == "v":
                return self.var_const(vl[1], op, c, truth, vl)
            if vl[0] == "a" and _is_num(c):
                f = self.affine(vl, op, c, truth)
                if f is not None:
                    return f
        elif vl[0] in ("v", "a") and vr[0] in ("v", "a"):
            f = self.difference(vl, op, vr, truth)
            if f is not None:
                return f
        node = ir.Compare.model_construct(kind="compare", op=op, left=_expr_of(sp, vl),
                                          right=_expr_of(sp, vr), span=ir.NO_SPAN)
        return sp.residual(node, truth)

    def difference(self, vl: Val, op: str, vr: Val, truth: bool) -> Formula | None:
        """`x + b1 op y + b2` for two integer variables (dates, datetimes and durations are seconds):
        literals "x_p - x_q <= k" that the space decides exactly (`diffbound`). None when the sides are
        not unit-coefficient shifts of two different integer variables by whole numbers."""
        sp = self.sp
        al, ar = self.as_affine(vl), self.as_affine(vr)
        if al is None or ar is None:
            return None
        (i, a1, b1), (j, a2, b2) = al, ar
        if i == j or a1 != a2 or a1 not in (1, -1) or sp.kinds[i] != "int" or sp.kinds[j] != "int":
            return None
        if not all(_is_num(b) and math.isfinite(b) and float(b).is_integer() and abs(b) < 2**52 for b in (b1, b2)):
            return None
        c = int(b2) - int(b1)
        p, q = (i, j) if a1 == 1 else (j, i)  # x_p - x_q op c
        eff = op if truth else NEGATED_OP[op]
        if eff == "<=":
            return sp.diff_residual(p, q, c)
        if eff == "<":
            return sp.diff_residual(p, q, c - 1)
        if eff == ">=":
            return sp.diff_residual(q, p, -c)
        if eff == ">":
            return sp.diff_residual(q, p, -c - 1)
        if eff == "==":
            return mk_and(sp, [sp.diff_residual(p, q, c), sp.diff_residual(q, p, -c)])
        return mk_or(sp, [sp.diff_residual(p, q, c - 1), sp.diff_residual(q, p, -c - 1)])

    def var_const(self, i: int, op: str, c: Any, truth: bool, v: Val) -> Formula:
        sp = self.sp
        k = sp.kinds[i]
        if k in ("enum", "bool") and not _foreign(sp, i, [c]):
            m = 0
            for j, x in enumerate(sp.values[i]):
                try:
                    r = apply_compare(op, x, c)
                except (DecideError, TypeError):
                    continue
                if bool(r) == truth:
                    m |= 1 << j
            return mk_atom(sp, i, m)
        if k in ("int", "float") and _is_num(c) and math.isfinite(c):
            if not truth:
                op = NEGATED_OP[op]
            is_int = k == "int"
            if op == "==":
                d = num_norm(c, c, False, False, NO_POINTS, is_int)
            elif op == "!=":
                d = num_norm(-INF, INF, False, False, frozenset([c]), is_int)
            elif op == "<":
                d = num_norm(-INF, c, False, True, NO_POINTS, is_int)
            elif op == "<=":
                d = num_norm(-INF, c, False, False, NO_POINTS, is_int)
            elif op == ">":
                d = num_norm(c, INF, True, False, NO_POINTS, is_int)
            else:
                d = num_norm(c, INF, False, False, NO_POINTS, is_int)
            return FALSE if d is None else mk_atom(sp, i, d)
        node = ir.Compare.model_construct(kind="compare", op=op, left=_expr_of(sp, v),
                                          right=lit_of(c, _is_text(sp, v)), span=ir.NO_SPAN)
        return sp.residual(node, truth)

    def affine(self, v: Val, op: str, c: float, truth: bool) -> Formula | None:
        """Solve `f(x) op c` for a monotone affine f exactly under float semantics."""
        sp = self.sp
        _, i, a, b, expr = v
        if not truth:
            op = NEGATED_OP[op]
        if not math.isfinite(c):
            return None
        if op == "!=":
            eq = self.affine(v, "==", c, True)
            if eq is None:
                return None
            return negate(sp, eq) if eq.exact else None
        if op == "==":
            ge = self._half(i, a, b, expr, ">=", c)
            le = self._half(i, a, b, expr, "<=", c)
            if ge is None or le is None:
                return None
            if ge is FALSE_DOM or le is FALSE_DOM:
                return FALSE
            d = sp.meet_dom(i, ge, le)
            return FALSE if d is None else mk_atom(sp, i, d)
        d = self._half(i, a, b, expr, op, c)
        if d is None:
            return None
        if d is FALSE_DOM:
            return FALSE
        return mk_atom(sp, i, d)

    def _half(self, i: int, a: float, b: float, expr: Any, op: str, c: float) -> Any:
        sp = self.sp
        is_int = sp.kinds[i] == "int"
        name = sp.names[i]
        full: NumDom = sp.full_doms[i]
        scen = sp.scenario

        def p_at(x: Any) -> bool:
            val = _Probe(scen, name, x).eval(expr)
            return bool(apply_compare(op, val, c))

        if is_int:
            lo_i = int(full.lo) if full.lo != -INF else -_INT_LIMIT
            hi_i = int(full.hi) if full.hi != INF else _INT_LIMIT
            to_x: Callable[[int], float] = int
            hint_x = (c - b) / a if a else 0.0
            hint = int(hint_x) if math.isfinite(hint_x) and abs(hint_x) < 2**1000 else 0
        else:
            lo_f = full.lo if full.lo != -INF else -MAX_FLOAT
            hi_f = full.hi if full.hi != INF else MAX_FLOAT
            lo_i, hi_i = float_to_ordinal(lo_f), float_to_ordinal(hi_f)
            to_x = ordinal_to_float
            try:
                hint_x = (c - b) / a if a else 0.0
            except (OverflowError, ZeroDivisionError):
                hint_x = 0.0
            hint = float_to_ordinal(hint_x) if math.isfinite(hint_x) else 0

        def pred_index(k: int) -> bool:
            return p_at(to_x(k))

        try:
            if a == 0:
                probe = pick_num(full, is_int, "boundary", None)
                return full if p_at(probe) else FALSE_DOM
            up = (op in (">", ">=")) == (a > 0)
            if up:
                k = first_true(pred_index, lo_i, hi_i, hint)
                if k is None:
                    return FALSE_DOM
                x = to_x(k)
                lo = -INF if k == lo_i and full.lo == -INF else x
                d = num_norm(lo, INF, False, False, NO_POINTS, is_int)
            else:
                k = first_true(lambda j: not pred_index(j), lo_i, hi_i, hint)
                if k is None:
                    hi = INF
                elif k == lo_i:
                    return FALSE_DOM
                else:
                    hi = to_x(k - 1)
                d = num_norm(-INF, hi, False, False, NO_POINTS, is_int)
        except (DecideError, TypeError, ValueError, ArithmeticError, RecursionError):
            return None
        if d is None:
            return FALSE_DOM
        d2 = sp.meet_dom(i, full, d)
        return FALSE_DOM if d2 is None else d2

    def days_compare(self, v: Val, op: str, c: Any, truth: bool) -> Formula | None:
        """`days_between(a, b) op c` ⟺ `(b + shift_b) - (a + shift_a) op c days`: a difference literal
        (the difference is a whole number of seconds, so a fractional bound rounds exactly)."""
        later, earlier = self.as_affine(v[1]), self.as_affine(v[2])
        if later is None or earlier is None or not _is_num(c) or not math.isfinite(c) or abs(c) > 1e9:
            return None
        bound = Fraction(c) * scalars.DAY
        if bound.denominator != 1:
            if op in ("==", "!="):
                return None
            op = {"<=": "<", "<": "<", ">=": ">=", ">": ">="}[op]
            bound = Fraction(math.ceil(bound))
        (p, a1, b1), (q, a2, b2) = later, earlier
        return self.difference(("a", p, a1, b1, None), op, ("a", q, a2, b2 + int(bound), None), truth)

    def neg_val(self, v: Val, e: Any) -> Val:
        tag = v[0]
        if tag == "e":
            return v
        if tag == "c":
            try:
                return ("c", -v[1])
            except TypeError:
                return ("e",)
        if tag == "v" and self.sp.kinds[v[1]] in ("int", "float"):
            return ("a", v[1], -1, 0, e)
        if tag == "a":
            return ("a", v[1], -v[2], -v[3], e)
        return ("o", ir.Unary.model_construct(kind="unary", op="neg", operand=_expr_of(self.sp, v),
                                              span=ir.NO_SPAN))

    def arith(self, op: str, vl: Val, vr: Val, e: Any) -> Val:
        sp = self.sp
        if vl[0] == "e" or vr[0] == "e":
            return ("e",)
        if vl[0] == "c" and vr[0] == "c":
            try:
                return ("c", apply_arith(op, vl[1], vr[1]))
            except (DecideError, TypeError, ArithmeticError):
                return ("e",)
        node = ir.Binary.model_construct(kind="binary", op=op, left=_expr_of(sp, vl),
                                         right=_expr_of(sp, vr), span=ir.NO_SPAN)
        al = self.as_affine(vl)
        ar = self.as_affine(vr)
        if al is not None and vr[0] == "c" and _is_num(vr[1]):
            i, a, b = al
            c = vr[1]
            if op == "+":
                return ("a", i, a, b + c, node)
            if op == "-":
                return ("a", i, a, b - c, node)
            if op == "*":
                return ("a", i, a * c, b * c, node)
            if op == "/":
                if c == 0:
                    return ("e",)
                return ("a", i, a / c, b / c, node)
        if ar is not None and vl[0] == "c" and _is_num(vl[1]):
            i, a, b = ar
            c = vl[1]
            if op == "+":
                return ("a", i, a, b + c, node)
            if op == "-":
                return ("a", i, -a, c - b, node)
            if op == "*":
                return ("a", i, a * c, b * c, node)
        if al is not None and ar is not None and al[0] == ar[0] and op in ("+", "-"):
            i, a1, b1 = al
            _, a2, b2 = ar
            a2s = a2 if op == "+" else -a2
            if a1 * a2s >= 0:  # same direction: the sum stays monotone
                return ("a", i, a1 + a2s, b1 + (b2 if op == "+" else -b2), node)
        return ("o", node)

    def as_affine(self, v: Val) -> tuple[int, float, float] | None:
        if v[0] == "a":
            return v[1], v[2], v[3]
        if v[0] == "v" and self.sp.kinds[v[1]] in ("int", "float"):
            return v[1], 1, 0
        return None


FALSE_DOM = object()  # sentinel: "no value satisfies"


class _Probe(Interpreter):
    """Evaluates an expression of one variable with a value outside validation (affine solving
    probes values at and beyond declared open bounds)."""

    def __init__(self, scenario: ir.Scenario, name: str, value: Any):
        super().__init__(scenario, {})
        self.cache[name] = value


def lit_of(x: Any, quoted: bool = False) -> ir.Lit:
    """A constant of a residual; text is shown quoted when it is compared with a string variable
    (`Channel == "web"`), bare when it is an enum value."""
    return ir.Lit.model_construct(value=x, bare=isinstance(x, str) and not quoted, kind="lit", span=ir.NO_SPAN)


def _foreign(space: CompileSpace, i: int, constants: list) -> bool:
    """A string analysed as a finite domain compared with a literal outside it (a profile's `requires`, a
    condition of another program): its first value stands for every other text, so such a test is not
    an atom of the domain; it stays a residual, decided exactly by the engine on candidate values."""
    return i in space.text_enums and any(c not in space.values[i][1:] for c in constants)


def _is_text(space: CompileSpace, v: Val) -> bool:
    return v[0] == "v" and (v[1] in space.strings or v[1] in space.text_enums)


def _expr_of(space: CompileSpace, v: Val) -> Any:
    tag = v[0]
    if tag == "c":
        return lit_of(v[1])
    if tag == "v":
        return v[2]
    if tag == "a":
        return v[4]
    if tag == "o":
        return v[1]
    if tag == "d":
        return v[3]
    # an always-failing expression: 1 / 0
    return ir.Binary.model_construct(kind="binary", op="/", left=lit_of(1), right=lit_of(0), span=ir.NO_SPAN)
