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
This module constrains boxes by compiled conditions; the space is built in layers below it: `spacecore`
(boxes, per-variable domains), `spacepick` (picks and the candidate search), `spacesearch` (feasibility,
witnesses), `spacetext` (regions in words) and `spaceformula` (conditions compiled). Guards compile to formulas in `guards` (the compiler) and `formula` (formulas and their
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
from sopgraph.logic.formula import Formula, negate_exact
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
from sopgraph.logic.spaceformula import SpaceFormulas

BOX_SPLIT = 4  # pieces one condition may cut one box into before it is kept as a literal (`Space.split`)
REGION_CAP = 64  # boxes of a region a condition may make before it is kept on each box (`constrain_region`)


class Space(SpaceFormulas):
    """Per-scenario analysis context: variable layout, interned boxes, compiled formulas, memos. Constraining
    boxes by compiled conditions lives here; the layers below are `spaceformula` (compiling conditions),
    `spacetext`, `spacesearch`, `spacepick` and `spacecore`."""

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

