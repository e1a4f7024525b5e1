"""The guard compiler: IR expressions → formulas (conditions) and guarded values (terms).

`GuardCompiler` turns a guard into a `Formula` under the engine's semantics ("evaluates, without
error, to a value of this truthiness"): derived variables are inlined; `count` thresholds, `case`,
`min`/`max` expand into disjoint alternatives; and/or/not follow the engine's short-circuit order.
At the leaves it hands comparisons of the values it reached to `atoms.AtomCompiler`, which solves those
of one numeric variable exactly (directly or through monotone affine arithmetic, including float
rounding) and of two integer variables as difference literals; everything else becomes a residual
literal the space decides later. Each compilation has a deterministic step budget (`COMPILE_BUDGET`);
past it `OverBudget` is raised and the space keeps the condition whole. The space is seen through
`CompileSpace`, so this module sits below it.
"""

from __future__ import annotations

from typing import Any

from sopgraph.errors import Error
from sopgraph.language import ir, scalars
from sopgraph.logic.atoms import NEGATED_OP as NEGATED_OP
from sopgraph.logic.atoms import AtomCompiler, CompileSpace, Val, lit_of
from sopgraph.logic.formula import FALSE, TRUE, Formula, mk_and, mk_or

_MAX_TERMS = 64  # guarded alternatives per sub-expression before it is treated as opaque
_MAX_COUNT_ARGS = 12
LINEAR_BOOL = 16  # longer and/or chains negate linearly (short ones keep disjoint alternatives)
COMPILE_BUDGET = 20_000  # compiler steps per top-level condition before it is kept whole (residual)

__all__ = ["COMPILE_BUDGET", "LINEAR_BOOL", "NEGATED_OP", "CompileSpace", "GuardCompiler", "OverBudget",
           "weighted_as_counts"]


class OverBudget(Error):
    """A condition whose expansion into boxes ran over `COMPILE_BUDGET`."""


class GuardCompiler:
    """IR expressions → formulas (conditions) and guarded values (terms); the leaves go to `AtomCompiler`."""

    def __init__(self, space: CompileSpace):
        self.sp = space
        self.atoms = AtomCompiler(space)
        self.left = COMPILE_BUDGET

    def spend(self, n: int = 1) -> None:
        """Deterministic work budget of one compilation (steps, not time): expansions of `count`,
        `min`/`max` and `case` multiply, so a scoring SOP would otherwise take hours."""
        self.left -= n
        if self.left < 0:
            raise OverBudget

    # conditions ----------------------------------------------------------------------------

    def cond(self, e: Any, truth: bool, depth: int) -> Formula:
        f = self._cond(e, truth, depth)
        if f.src is None and f.kind in ("and", "or"):
            f.src = (e, truth)
        return f

    def _cond(self, e: Any, truth: bool, depth: int) -> Formula:
        sp = self.sp
        self.spend()
        if depth > 60:
            return sp.residual(e, truth)
        if isinstance(e, ir.Unary) and e.op == "not":
            return self.cond(e.operand, not truth, depth + 1)
        if isinstance(e, ir.BoolOp):
            fs_t = [self.cond(o, True, depth + 1) for o in e.operands]
            fs_f = [self.cond(o, False, depth + 1) for o in e.operands]
            if e.op == "and":
                if truth:
                    return mk_and(sp, fs_t)
                if len(e.operands) > LINEAR_BOOL and sp.total(e):  # no operand can fail: linear
                    return mk_or(sp, fs_f)
                # first false operand stops evaluation
                alts = [mk_and(sp, fs_t[:k] + [fs_f[k]]) for k in range(len(fs_f))]
                return mk_or(sp, alts)
            if not truth:
                return mk_and(sp, fs_f)
            if len(e.operands) > LINEAR_BOOL and sp.total(e):
                return mk_or(sp, fs_t)
            alts = [mk_and(sp, fs_f[:k] + [fs_t[k]]) for k in range(len(fs_t))]
            return mk_or(sp, alts)
        if isinstance(e, ir.Compare):
            lt = self.term(e.left, depth + 1)
            rt = self.term(e.right, depth + 1)
            alts = []
            for gl, vl in lt:
                for gr, vr in rt:
                    self.spend(len(gl.parts) + len(gr.parts) + 1)
                    g = mk_and(sp, [gl, gr])
                    if g.kind == "F":
                        continue
                    alts.append(mk_and(sp, [g, self.atoms.compare(vl, e.op, vr, truth)]))
            return mk_or(sp, alts)
        if isinstance(e, ir.InSet):
            ot = self.term(e.operand, depth + 1)
            want = truth != e.negated
            values = [v.value for v in e.values]
            alts = []
            for g, v in ot:
                alts.append(mk_and(sp, [g, self.atoms.member(v, values, want, e)]))
            return mk_or(sp, alts)
        # truthiness of a value
        alts = []
        for g, v in self.term(e, depth + 1):
            alts.append(mk_and(sp, [g, self.atoms.truthy(v, truth)]))
        return mk_or(sp, alts)

    # terms ---------------------------------------------------------------------------------

    def term(self, e: Any, depth: int) -> list[tuple[Formula, Val]]:
        sp = self.sp
        self.spend()
        if depth > 60:
            return [(TRUE, ("o", e))]
        if isinstance(e, ir.Lit):
            return [(TRUE, ("c", e.value))]
        if isinstance(e, ir.TimeLit):  # dates and durations are seconds (sopgraph.language.scalars)
            return [(TRUE, ("c", e.value))]
        if isinstance(e, ir.Func) and e.name == "abs" and len(e.args) == 1:  # abs(x) = max(x, -x)
            neg = ir.Unary.model_construct(kind="unary", op="neg", operand=e.args[0], span=e.span)
            return self.term(ir.Call.model_construct(kind="call", func="max", args=[e.args[0], neg],
                                                     span=e.span), depth + 1)
        if isinstance(e, ir.Func) and e.name == "days_between" and len(e.args) == 2:
            return self.days_between(e, depth)
        if isinstance(e, ir.Var):
            var = sp.scenario.variables.get(e.name)
            if var is None:
                return [(TRUE, ("o", e))]
            if var.role == "derived":
                if var.expr is None:
                    return [(TRUE, ("o", e))]
                return self.term(var.expr, depth + 1)
            return [(TRUE, ("v", sp.index[e.name], e))]
        if isinstance(e, (ir.Compare, ir.InSet, ir.BoolOp)) or (isinstance(e, ir.Unary) and e.op == "not"):
            return [(self.cond(e, True, depth + 1), ("c", True)),
                    (self.cond(e, False, depth + 1), ("c", False))]
        if isinstance(e, ir.Unary):  # neg
            out = []
            for g, v in self.term(e.operand, depth + 1):
                out.append((g, self.atoms.neg_val(v, e)))
            return out
        if isinstance(e, ir.Binary):
            lt = self.term(e.left, depth + 1)
            rt = self.term(e.right, depth + 1)
            if len(lt) * len(rt) > _MAX_TERMS:
                return [(TRUE, ("o", e))]
            out = []
            for gl, vl in lt:
                for gr, vr in rt:
                    g = mk_and(sp, [gl, gr])
                    if g.kind == "F":
                        continue
                    out.append((g, self.atoms.arith(e.op, vl, vr, e)))
            return out
        if isinstance(e, ir.Weighted):  # the same form as the sum of counts a user would write
            return self.term(weighted_as_counts(e), depth + 1)
        if isinstance(e, ir.Call):
            if e.func == "count":
                if len(e.args) > _MAX_COUNT_ARGS:
                    return [(TRUE, ("o", e))]
                ts = [self.cond(a, True, depth + 1) for a in e.args]
                fs = [self.cond(a, False, depth + 1) for a in e.args]
                n = len(ts)
                return [(self.exactly(ts, fs, 0, j, {}), ("c", j)) for j in range(n + 1)]
            terms = [self.term(a, depth + 1) for a in e.args]
            cur = terms[0]
            for nxt in terms[1:]:
                if len(cur) * len(nxt) * 2 > _MAX_TERMS:
                    return [(TRUE, ("o", e))]
                new = []
                op = "<" if e.func == "min" else ">"
                for g1, v1 in cur:
                    for g2, v2 in nxt:
                        self.spend(len(g1.parts) + len(g2.parts) + 1)
                        g = mk_and(sp, [g1, g2])
                        if g.kind == "F":
                            continue
                        new.append((mk_and(sp, [g, self.atoms.compare(v2, op, v1, True)]), v2))
                        new.append((mk_and(sp, [g, self.atoms.compare(v2, op, v1, False)]), v1))
                cur = new
            return cur
        if isinstance(e, ir.CaseExpr):
            out = []
            prefix: list[Formula] = []
            for arm in e.arms:
                g = mk_and(sp, prefix + [self.cond(arm.when, True, depth + 1)])
                self.spend(len(prefix) + 1)
                if g.kind != "F":
                    for g2, v in self.term(arm.then, depth + 1):
                        out.append((mk_and(sp, [g, g2]), v))
                prefix.append(self.cond(arm.when, False, depth + 1))
            g = mk_and(sp, prefix)
            if g.kind != "F":
                for g2, v in self.term(e.otherwise, depth + 1):
                    out.append((mk_and(sp, [g, g2]), v))
            if len(out) > _MAX_TERMS:
                return [(TRUE, ("o", e))]
            return [(g, v) for g, v in out if g.kind != "F"]
        return [(TRUE, ("o", e))]

    def days_between(self, e: ir.Func, depth: int) -> list[tuple[Formula, Val]]:
        """`days_between(a, b)` = (b - a) / 1 day: ('d', later, earlier, expr) when both are shifted integer
        variables (compared with a number it is a difference literal), a constant when both are constant."""
        out: list[tuple[Formula, Val]] = []
        for ga, va in self.term(e.args[0], depth + 1):
            for gb, vb in self.term(e.args[1], depth + 1):
                g = mk_and(self.sp, [ga, gb])
                if g.kind == "F":
                    continue
                if va[0] == "c" and vb[0] == "c":
                    try:
                        out.append((g, ("c", scalars.days_between(va[1], vb[1]))))
                    except (TypeError, ArithmeticError):
                        out.append((g, ("e",)))
                elif self.atoms.as_affine(va) is not None and self.atoms.as_affine(vb) is not None:
                    out.append((g, ("d", vb, va, e)))
                else:
                    out.append((g, ("o", e)))
        if len(out) > _MAX_TERMS:
            return [(TRUE, ("o", e))]
        return out

    def exactly(self, ts: list[Formula], fs: list[Formula], k: int, j: int, memo: dict) -> Formula:
        """count(args[k:]) == j, by Shannon expansion (disjoint alternatives)."""
        n = len(ts) - k
        if j < 0 or j > n:
            return FALSE
        if n == 0:
            return TRUE if j == 0 else FALSE
        key = (k, j)
        if key in memo:
            return memo[key]
        self.spend(2)
        f = mk_or(self.sp, [mk_and(self.sp, [ts[k], self.exactly(ts, fs, k + 1, j - 1, memo)]),
                            mk_and(self.sp, [fs[k], self.exactly(ts, fs, k + 1, j, memo)])])
        memo[key] = f
        return f


def weighted_as_counts(e: ir.Weighted) -> Any:
    """A weighted count in the form of the equivalent sum of counts, which the analyses decide exactly:
    `count(2: A, 1: B, 2: C)` is `count(B) + 2 * count(A, C)` (weights grouped, smallest first).

    Why: left whole, a weighted count is opaque to the compiler and the solver, so every threshold on
    it stays residual (issue 31: 25x slower checks, paths without a witness, `sop diff` running on).
    With whole weights the grouped form has the engine's value exactly (ints add exactly); with a
    fractional weight the terms stay in argument order (`case {when A -> 0.5 otherwise -> 0} + …`),
    which adds the same floats in the same order as the engine."""
    span = e.span
    if not e.args:
        return lit_of(0)
    whole = [w for w in e.weights if isinstance(w, int) and not isinstance(w, bool)]
    if len(whole) == len(e.weights):
        groups: dict[int, list[Any]] = {}
        for w, a in zip(whole, e.args, strict=True):
            groups.setdefault(w, []).append(a)
        terms: list[Any] = []
        for w in sorted(groups):
            count = ir.Call.model_construct(kind="call", func="count", args=groups[w], span=span)
            terms.append(count if w == 1 else ir.Binary.model_construct(kind="binary", op="*", left=lit_of(w),
                                                                        right=count, span=span))
    else:
        terms = [ir.CaseExpr.model_construct(kind="case", arms=[ir.CaseArm.model_construct(
            when=a, then=lit_of(w), span=span)], otherwise=lit_of(0), span=span)
            for w, a in zip(e.weights, e.args, strict=True)]
    total = terms[0]
    for t in terms[1:]:
        total = ir.Binary.model_construct(kind="binary", op="+", left=total, right=t, span=span)
    return total

