"""Constraint domains: which values are still possible after a sequence of guard decisions.

Path enumeration, counting, sampling, flow diagnostics and case synthesis all ask the same question:
"given what the guards on the way here decided, which assignments of the fields and system
variables are left?". This module answers it exactly where it can and soundly where it cannot.

Public API (stable; other modules build on it):

- `Box` — immutable, hashable (interned) set of assignments: one domain per field/system variable
  (enum/bool value subsets; int/float intervals with open/closed ends and finite `!=` exclusions,
  ints normalised to closed integer bounds) plus *residual* predicates that are not representable
  as per-variable domains (e.g. `A > B`). `box[name]` gives the public domain (a frozenset of values
  for enum/bool, a `NumDom` for numbers); `box.constraints()` gives human text for constrained
  variables.
- `full_box(scenario) -> Box` — every assignment the declarations allow.
- `constrain(scenario, box, expr, truth) -> list[Box]` — the boxes (disjoint where practical) of
  assignments inside `box` for which `expr` evaluates, without error, to `truth` under the engine's
  semantics. Derived variables are inlined; comparisons of one numeric variable (possibly through
  affine arithmetic such as `Penalty * 0.5 + 10 > 100`) are solved exactly, including float
  rounding; comparisons of two integer variables shifted by constants (dates: `BookedAt > now - 24 hours`)
  become difference literals decided exactly by `diffbound`; `count(...)` thresholds, `case`,
  `min`/`max` expand into disjunctions. Everything else
  becomes a residual predicate on the box, decided later by witness search (never assumed false).
- `witness(scenario, box, *, style="representative"|"boundary", rng=None) -> dict | None` — one
  concrete assignment of EVERY field and system variable inside the box (enums: first remaining
  value; numbers: a typical value such as 100 or the boundary such as 1 for `Penalty > 0`; with a
  seeded `random.Random` a random member). `None` when no member could be found.
- `is_feasible(scenario, box) -> bool | None` — True (a member is known), False (proven empty),
  None (undecided: residual predicates the witness search could not satisfy nor exhaust).

Internally a per-scenario `Space` (see `space_for`) interns boxes and compiled formulas and
memoises `constrain` per (box, formula), which is what keeps path counting and enumeration fast.
This module holds the space's compiled constraints; the space is built in layers below it: `spacecore`
(boxes, per-variable domains), `spacepick` (picks and the candidate search), `spacesearch` (feasibility,
witnesses) and `spacetext` (regions in words). Guards compile to formulas in `guards` (the compiler) and `formula` (formulas and their
simplifying constructors), below it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from typing import Any

from sopgraph.errors import ArgumentError
from sopgraph.language import ir
from sopgraph.logic.budget import check_active
from sopgraph.logic.formula import FALSE, TRUE, Formula, mk_and, negate_exact
from sopgraph.logic.guards import GuardCompiler, OverBudget
from sopgraph.logic.intervals import (  # noqa: F401 - re-exported: NumDom and the num_* operations are the domain's API
    NO_POINTS,
    NO_VALUE,
    NumDom,
    describe_num,
    num_meet,
    num_norm,
    num_subset,
    num_union,
    pick_num,
)
from sopgraph.logic.spacecore import (  # noqa: F401 - re-exported: the domain API, its constants and helpers
    CANONICAL_OP,
    EXPAND_VARS,
    INF,
    MAX_ALTERNATIVES,
    MAX_SAMPLES,
    MAX_SPLIT,
    REFUTED_COMBOS,
    SEARCH_COMBOS,
    SOLVER_FIRST_VARS,
    Box,
    SpaceCore,
    alternative_text,
    canonical_compare,
    dedupe_boxes,
    merge_nums,
    numeric_consts,
    one_call,
    relation_text,
    strict_reads,
    structured_samples,
)
from sopgraph.logic.spacetext import SpaceText

BOX_SPLIT = 4  # pieces one condition may cut one box into before it is kept as a literal (`Space.split`)
REGION_CAP = 64  # boxes of a region a condition may make before it is kept on each box (`constrain_region`)


class Space(SpaceText):
    """Per-scenario analysis context: variable layout, interned boxes, compiled formulas, memos. The
    compiled constraints live here; the layers below are `spacecore`, `spacesearch` and `spacetext`."""

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

    def constrain(self, box: Box, f: Formula, cap: int = MAX_SPLIT) -> tuple[Box, ...]:
        """The boxes of `box` where `f` holds; a part that would cut it into more than `cap` boxes is kept as a
        residual literal instead (the same set)."""
        kind = f.kind
        if kind == "T":
            return (box,)
        if kind == "F":
            return ()
        key: tuple = (box, f) if cap == MAX_SPLIT else (box, f, cap)
        hit = self._cons.get(key)
        if hit is not None:
            return hit
        if kind == "atom":
            i = f.var
            cur = box.doms[i]
            d = self.meet_dom(i, cur, f.dom)
            if d is None:
                res: tuple[Box, ...] = ()
            elif d is cur or d == cur:
                res = (box,)
            else:
                res = (self.with_dom(box, i, d),)
        elif kind == "and":
            cur_boxes: Sequence[Box] = (box,)
            # atoms first: they never cut the box, and one that empties it ends the work before a wide part
            # is split (or kept whole) in vain (`missing(X)` beside a read guarded by `not missing(X)`)
            for p in sorted(f.parts, key=lambda q: q.kind != "atom"):
                nxt: list[Box] = []
                for b in cur_boxes:
                    nxt.extend(self.constrain(b, p, cap))
                cur_boxes = nxt
                if not nxt or len(nxt) > cap:
                    break
            res = dedupe_boxes(cur_boxes)
            if len(res) > cap:
                res = self._kept(box, f, cap)
        elif kind == "or":
            out: list[Box] = []
            aborted = False
            if f.exact:
                rest: Sequence[Box] = (box,)
                parts = f.parts
                last = len(parts) - 1
                for k, p in enumerate(parts):
                    for b in rest:
                        out.extend(self.constrain(b, p, cap))
                    if k == last:
                        break
                    nrest: list[Box] = []
                    pn = negate_exact(self, p)
                    for b in rest:
                        nrest.extend(self.constrain(b, pn, cap))
                    rest = nrest
                    if not rest:
                        break
                    if len(out) + len(rest) > cap:
                        aborted = True
                        break
            else:
                for p in f.parts:
                    out.extend(self.constrain(box, p, cap))
                    if len(out) > cap:
                        aborted = True
                        break
            if aborted or len(out) > cap:
                res = self._kept(box, f, cap)
            else:
                res = dedupe_boxes(out)
        else:  # residual literal
            res = self.add_residual(box, f.rid, f.truth)
        if len(self._cons) > 500_000:
            self._cons.clear()
        self._cons[key] = res
        return res

    def _kept(self, box: Box, f: Formula, cap: int) -> tuple[Box, ...]:
        """`box` where `f` holds, `f` kept as a residual literal: past `MAX_SPLIT` cut into points where its
        variables have few values (`add_residual`); under a smaller cap (`split`) attached as it is."""
        if cap == MAX_SPLIT:
            return self.add_residual(box, self.formula_residual(f), True)
        return self.add_literal(box, f)

    def constrain_region(self, region: Iterable[Box], f: Formula, cap: int | None = REGION_CAP) -> tuple[Box, ...]:
        """The boxes of `region` where `f` holds, split where that is cheap (`split`). Past `cap` boxes the
        region's boxes keep `f` as one residual literal each instead: the same set, only decided lazily (by
        witness search and the solver). Why: along a long route every stage can split each box, and the
        product of the splits made one path's region cost minutes (issue 31)."""
        region = tuple(region)
        out: list[Box] = []
        for b in region:
            out.extend(self.split(b, f))
            if cap is not None and len(out) > cap:
                out = [b3 for b2 in region for b3 in self.add_literal(b2, f)]
                break
        return self.normalize(out)

    def split(self, box: Box, f: Formula) -> tuple[Box, ...]:
        """`constrain`, keeping as one residual literal each part of `f` that would cut `box` into more than
        `BOX_SPLIT` pieces. A condition on one or two variables cuts a box in two or three; a negated
        `any(l in Lines where ...)` cuts it once per order line and per field, and the next such condition
        multiplied the pieces, each a question for the solver later (the parts that cut little, such as
        `Mood == Calm` beside a count, still narrow the box)."""
        return self.constrain(box, f, BOX_SPLIT)

    def unfold(self, box: Box, limit: int = 256) -> tuple[Box, ...]:
        """`box` with the conditions `split` kept whole cut into boxes again, as far as `limit` boxes allow: a
        member picked at random in one of them satisfies those conditions (`cases.synth` samples regions)."""
        out: Sequence[Box] = (box,)
        for rid, truth in sorted(box.resid):
            f = self.res_exprs[rid]
            if not truth or not isinstance(f, Formula):
                continue
            cut = [b2 for b in out for b2 in self.constrain(self.box(b.doms, b.resid - {(rid, True)}), f)]
            if len(cut) > limit:
                break
            out = cut
        return tuple(out)

    def _search_or_solve(self, box: Box, style: str, rng: random.Random | None) -> tuple[dict | None, bool]:
        """The search and the solver (`SpaceSearch`); on a box they leave open that carries conditions `split` kept
        whole, the same question again on its pieces (`unfold`): the solver does not model every construct a kept
        condition may hold (a division, a date difference), which the pieces' own domains and search decide as
        they did before such conditions were kept whole."""
        open_before, texts_before = self.undecided, list(self.undecided_texts)
        w, exhaustive = super()._search_or_solve(box, style, rng)
        if w is not None or exhaustive:
            return w, exhaustive
        pieces = self.unfold(box)
        if pieces == (box,):
            return w, exhaustive
        after, texts_after = self.undecided, list(self.undecided_texts)
        empty = True
        for piece in pieces:
            check_active()
            wp, ex = self._search_or_solve(piece, style, rng)
            if wp is not None:
                self.undecided, self.undecided_texts = open_before, texts_before
                return wp, False
            empty = empty and ex
        if empty:
            self.undecided, self.undecided_texts = open_before, texts_before
            return None, True
        self.undecided, self.undecided_texts = after, texts_after
        return None, False

    def add_literal(self, box: Box, f: Formula) -> tuple[Box, ...]:
        """`box` where formula `f` holds, with `f` kept whole as one residual literal (a residual literal stays
        itself): the same set as `constrain`, not split into boxes."""
        if f.kind == "res":
            return self.add_residual(box, f.rid, f.truth)
        rid = self.formula_residual(f)
        if (rid, False) in box.resid:
            return ()
        return (self.box(box.doms, box.resid | {(rid, True)}),)

    def add_residual(self, box: Box, rid: int, truth: bool) -> tuple[Box, ...]:
        """Boxes of `box` where residual `rid` has truth `truth`: split into points when its
        variables have few values, else the literal is attached (public: the paths benchmark's
        memo-free baseline constrains with it)."""
        if (rid, truth) in box.resid:
            return (box,)
        if (rid, not truth) in box.resid:
            return ()
        vs = self.res_vars[rid]
        # Decide exactly when the residual's variables have few possible values: split into points.
        finite = []
        total = 1
        for i in vs:
            # a missing optional value has no point domain: `missing(X)` stays a literal for the search
            vals = None if (i in self.optional and box.doms[i] == self.full_doms[i]) or (
                i in self.text_enums and box.doms[i] & 1 and self._foreign_text(rid, i)) else (
                self._finite_values(i, box.doms[i], 32))
            if vals is None:
                total = -1
                break
            finite.append(vals)
            total *= len(vals)
            if total > 256:
                total = -1
                break
        if total >= 0:
            base = self.pick_all(box, "boundary", None)
            if base is None:
                return (self.box(box.doms, box.resid | {(rid, truth)}),)
            out: list[Box] = []
            for combo in itertools.product(*finite):
                values = dict(base)
                for i, v in zip(vs, combo, strict=True):
                    values[self.names[i]] = v
                if self.eval_resid(rid, truth, values):
                    doms = list(box.doms)
                    for i, v in zip(vs, combo, strict=True):
                        doms[i] = self._point(i, v)
                    out.append(self.box(tuple(doms), box.resid))
            return self.normalize(out)
        return (self.box(box.doms, box.resid | {(rid, truth)}),)

    def _foreign_text(self, rid: int, i: int) -> bool:
        """Whether residual `rid` compares text with a literal outside string variable `i`'s finite domain
        (whose first value stands for every other text): its points do not decide it then."""
        known = set(self.values[i])
        stack = [self.res_exprs[rid]]
        while stack:
            e = stack.pop()
            if isinstance(e, ir.Lit) and isinstance(e.value, str) and e.value not in known:
                return True
            if not isinstance(e, Formula):
                stack.extend(ir.children(e))
        return False

    def _point(self, i: int, v: Any) -> Any:
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            for j, x in enumerate(self.values[i]):
                if x == v and type(x) is type(v):
                    return 1 << j
            return 0
        return NumDom(v, v, False, False, NO_POINTS)


def variables_signature(scenario: ir.Scenario) -> tuple:
    """What a Space depends on: the variables' names, roles, types and derived expressions (so a
    scenario edited in place gets a fresh Space)."""
    out = []
    for name, v in scenario.variables.items():
        t = v.type
        if isinstance(t, ir.EnumType):
            ts: tuple = ("enum", tuple(t.values))
        elif isinstance(t, ir.NumType):
            ts = (t.kind, t.lo, t.hi, t.lo_open, t.hi_open)
        else:
            ts = (type(t).__name__,)
        out.append((name, v.role, ts, id(v.expr)))
    return tuple(out)


def space_for(scenario: ir.Scenario) -> Space:
    """The scenario's analysis space, built once per scenario and set of variable declarations."""
    return scenario.cached_analysis("space", variables_signature(scenario), lambda: Space(scenario))


def full_box(scenario: ir.Scenario) -> Box:
    """Every assignment the declarations of fields and system variables allow."""
    return space_for(scenario).full


def constrain(scenario: ir.Scenario, box: Box, expr: Any, truth: bool = True, *,
              space: Space | None = None) -> list[Box]:
    """Boxes (disjoint where practical) of the assignments in `box` for which `expr` evaluates,
    without error, to a value of truthiness `truth`. Boxes proven empty are left out; boxes with
    undecided residual predicates are kept. `space`: the scenario's `space_for`, when a caller
    constraining many boxes fetched it once (checking the declarations costs more than a cached
    constraint)."""
    sp = space if space is not None else space_for(scenario)
    out = sp.constrain(box, sp.formula(expr, truth))
    return [b for b in out if sp.decide(b) is not False]


def is_feasible(scenario: ir.Scenario, box: Box) -> bool | None:
    """True if the box has a member, False if proven empty, None if undecided."""
    return space_for(scenario).decide(box)


def witness(scenario: ir.Scenario, box: Box, *, style: str = "representative",
            rng: random.Random | None = None, space: Space | None = None) -> dict[str, Any] | None:
    """A concrete assignment of every field and system variable inside `box`, or None (`space`: the
    scenario's `space_for`, when a caller making many witnesses fetched it once)."""
    if style not in ("representative", "boundary"):
        raise ArgumentError(f"unknown witness style {style!r}")
    return (space if space is not None else space_for(scenario)).witness(box, style, rng)


__all__ = [
    "Box",
    "NumDom",
    "Space",
    "constrain",
    "full_box",
    "is_feasible",
    "space_for",
    "witness",
]

