"""Conditions compiled for a constraint space: guards to formulas (`formula`, through `guards.GuardCompiler`),
guarded values (`term`), residual literals for what boxes cannot hold, and the variables an expression reads.
The layer between `spacetext` and `domain` (which constrains boxes by these formulas)."""

from __future__ import annotations

from typing import Any

from sopgraph.language import ir
from sopgraph.logic.formula import FALSE, TRUE, Formula, mk_and
from sopgraph.logic.guards import GuardCompiler, OverBudget
from sopgraph.logic.spacecore import CANONICAL_OP, EXPAND_VARS, canonical_compare
from sopgraph.logic.spacetext import SpaceText


class SpaceFormulas(SpaceText):
    """Compiled conditions and residual literals of a space (memoised per expression)."""

    def base_reads(self, expr: Any) -> tuple[int, ...]:
        """Base (field/system) variable indices an expression depends on, derived ones expanded."""
        out: dict[int, None] = {}
        seen: set[str] = set()
        variables = self.scenario.variables
        stack = [expr]
        while stack:
            e = stack.pop()
            if isinstance(e, ir.Var):
                v = variables.get(e.name)
                if v is None:
                    continue
                if v.role == "derived":
                    if e.name not in seen and v.expr is not None:
                        seen.add(e.name)
                        stack.append(v.expr)
                else:
                    out.setdefault(self.index[e.name], None)
                continue
            if isinstance(e, ir.Lit):
                continue
            stack.extend(reversed(ir.children(e)))
        return tuple(out)

    def total(self, expr: Any) -> bool:
        """True when evaluating `expr` on any assignment of the space cannot fail: no division
        (the one operation that raises on in-domain values), derived variables included. Then the
        short-circuit of `and`/`or` does not matter and their negations stay linear in size."""
        key = id(expr)
        hit = self._total.get(key)
        if hit is not None and hit[0] is expr:
            return hit[1]
        variables = self.scenario.variables
        seen: set[str] = set()
        stack = [expr]
        ok = True
        while stack and ok:
            e = stack.pop()
            if isinstance(e, ir.Var):
                v = variables.get(e.name)
                if v is None:
                    ok = False
                elif v.role == "derived" and e.name not in seen and v.expr is not None:
                    seen.add(e.name)
                    stack.append(v.expr)
                continue
            if isinstance(e, ir.Binary) and e.op == "/":
                ok = False
                continue
            stack.extend(ir.children(e))
        self._total[key] = (expr, ok)
        return ok

    def residual(self, expr: Any, truth: bool) -> Formula:
        """The literal "expr is `truth`", kept whole. A comparison is one literal with its negation and its
        mirror image: `A != B` is `A == B` false, `B == A` is `A == B`, `A >= B` is `A < B` false and
        `B > A` is `A < B`. So a condition and its negation written another way (a branch `when A != B`,
        an intent's `when: A == B`) make a box that cannot hold both (empty). Shown as first written."""
        written: Any = None  # a comparison as written, shown only if this literal has no text yet
        as_written = truth  # the text written is this literal's only when it is asked for true
        if isinstance(expr, ir.Compare) and expr.op in CANONICAL_OP:
            written = expr
            expr, truth, text = canonical_compare(expr, truth)
        else:
            text = ir.show(expr)
        rid = self._res_index.get(text)
        if rid is None:
            rid = len(self.res_exprs)
            self._res_index[text] = rid
            self.res_exprs.append(expr)
            self.res_vars.append(self.base_reads(expr))
            self.res_text.append(text)
        if as_written and (rid, truth) not in self._res_shown:
            self._res_shown[rid, truth] = text if written is None else ir.show(written)
        return Formula("res", rid=rid, truth=truth, exact=False)

    def diff_residual(self, p: int, q: int, k: int) -> Formula:
        """The literal "x_p - x_q <= k" over two integer variables (dates and durations in seconds),
        decided exactly by `diffbound`. One residual per constraint and its complement
        (`x_q - x_p <= -k - 1` is the same literal, false)."""
        if p > q:
            f = self.diff_residual(q, p, -k - 1)
            return Formula("res", rid=f.rid, truth=False, exact=False)
        key = f"#diff {p} {q} {k}"
        rid = self._res_index.get(key)
        if rid is None:
            rid = len(self.res_exprs)
            self._res_index[key] = rid
            left = ir.Binary.model_construct(kind="binary", op="-", left=self._var(p), right=self._var(q),
                                             span=ir.NO_SPAN)
            self.res_exprs.append(ir.Compare.model_construct(kind="compare", op="<=", left=left,
                                                             right=ir.Lit.model_construct(
                                                                 value=k, bare=False, kind="lit", span=ir.NO_SPAN),
                                                             span=ir.NO_SPAN))
            self.res_vars.append((p, q))
            self.res_text.append(self._diff_text(p, q, k))
            self.diffs[rid] = (p, q, k)
        return Formula("res", rid=rid, truth=True, exact=False)

    def formula_residual(self, f: Formula) -> int:
        """A residual predicate "the assignment is in formula f" (used when splitting f into boxes
        would create too many boxes: membership stays exact, only the representation is lazy)."""
        key = f"#formula{id(f)}"
        rid = self._res_index.get(key)
        if rid is None or self.res_exprs[rid] is not f:
            rid = len(self.res_exprs)
            self._res_index[key] = rid
            self.res_exprs.append(f)
            self.res_vars.append(tuple(sorted(self._formula_vars(f))))
            self.res_text.append(self.formula_text(f))
        return rid

    def _formula_vars(self, f: Formula) -> set[int]:
        out: set[int] = set()
        stack = [f]
        seen: set[int] = set()
        while stack:
            g = stack.pop()
            if id(g) in seen:
                continue
            seen.add(id(g))
            if g.kind == "atom":
                out.add(g.var)
            elif g.kind == "res":
                out.update(self.res_vars[g.rid])
            else:
                stack.extend(g.parts)
        return out

    def formula_text(self, f: Formula, depth: int = 0) -> str:
        if f.src is not None:
            expr, truth = f.src
            return ir.show(expr) if truth else f"not ({ir.show(expr)})"
        if depth > 4:
            return "..."
        if f.kind == "T":
            return "true"
        if f.kind == "F":
            return "false"
        if f.kind == "atom":
            return f"{self.names[f.var]} in {{{self.describe_dom(f.var, f.dom)}}}"
        if f.kind == "res":
            return self.lit_text(f.rid, f.truth)
        joiner = " and " if f.kind == "and" else " or "
        return joiner.join(f"({self.formula_text(p, depth + 1)})" for p in f.parts)

    def formula(self, expr: Any, truth: bool = True) -> Formula:
        """The compiled condition "expr evaluates (without error) to a value whose truthiness is
        `truth`". Cached per expression object."""
        if expr is None:
            return TRUE if truth else FALSE
        key = (id(expr), truth)
        hit = self._formula_cache.get(key)
        if hit is not None and hit[0] is expr:
            return hit[1]
        try:
            if self.aggregate_over_many(expr):
                raise OverBudget
            f = GuardCompiler(self).cond(expr, truth, 0)
        except OverBudget:
            f = self._parts_or_whole(expr, truth)
        self._formula_cache[key] = (expr, f)
        return f

    def _parts_or_whole(self, expr: Any, truth: bool) -> Formula:
        """A condition too large to expand into boxes (e.g. `max` of several `count`s over shared inputs) is kept
        whole as a residual, decided by witness search and the solver; an `and` that holds (an `or` that fails,
        a `not`) is the conjunction of its operands' conditions, so only the large operands are kept whole and
        the others (`not missing(X)`, `Mood == Calm`) still narrow the boxes."""
        if isinstance(expr, ir.Unary) and expr.op == "not":
            return self.formula(expr.operand, not truth)
        if isinstance(expr, ir.BoolOp) and (expr.op == "and") == truth:
            return mk_and(self, [self.formula(o, truth) for o in expr.operands])
        self.note_unproven(expr)
        return self.residual(expr, truth)

    def term(self, expr: Any) -> list[tuple[Formula, tuple]]:
        """Guarded values of an expression: [(condition, value)], conditions pairwise disjoint.
        A value is ('c', constant), ('v', var index, expr), ('a', var index, a, b, expr) (monotone
        affine in one variable), ('o', expr) (opaque) or ('e',) (always an error)."""
        key = (id(expr), None)
        hit = self._formula_cache.get(key)
        if hit is not None and hit[0] is expr:
            return hit[1]
        try:
            t = GuardCompiler(self).term(expr, 0)
        except OverBudget:
            self.note_unproven(expr)
            t = [(TRUE, ("o", expr))]
        self._formula_cache[key] = (expr, t)
        return t

    def aggregate_over_many(self, expr: Any) -> bool:
        """A condition on `count`/`min`/`max`/`case` values (directly or through derived variables)
        that reads more than `EXPAND_VARS` base variables: expanding it into boxes is exponential in
        the number of inputs (a scoring SOP's `max` of counts), so it is kept whole and decided by
        the solver, over the inputs it actually reads."""
        variables = self.scenario.variables
        seen: set[str] = set()
        stack = [expr]
        aggregate = False
        while stack:
            e = stack.pop()
            if isinstance(e, ir.Var):
                v = variables.get(e.name)
                if v is not None and v.role == "derived" and e.name not in seen and v.expr is not None:
                    seen.add(e.name)
                    stack.append(v.expr)
                continue
            if isinstance(e, (ir.Call, ir.CaseExpr, ir.Weighted)):
                aggregate = True
            if isinstance(e, ir.Binary) and e.op == "/":
                return False  # the solver does not model division: keep the exact expansion
            stack.extend(ir.children(e))
        return aggregate and len(self.base_reads(expr)) > EXPAND_VARS

    def note_unproven(self, expr: Any) -> None:
        """Remember a condition kept whole because expanding it ran over the compile budget."""
        text = ir.show(expr)
        text = text if len(text) <= 80 else text[:77] + "..."
        if len(self.unproven) < 20 and text not in self.unproven:
            self.unproven.append(text)

    def fire_formula(self, stage: ir.Stage, index: int) -> Formula:
        """Region where branch `index` of `stage` fires: earlier guards false, this one true."""
        parts = [self.formula(b.guard, False) for b in stage.branches[:index] if b.guard is not None]
        own = stage.branches[index].guard
        parts.append(self.formula(own, True) if own is not None else TRUE)
        return mk_and(self, parts)
