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
This module holds the space, its boxes and the witness search; guards compile to formulas in
`guards` (the compiler) and `formula` (formulas and their simplifying constructors), below it.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

from sopgraph.language import ir, scalars
from sopgraph.logic import diffbound, solver
from sopgraph.logic.engine import DecideError
from sopgraph.logic.formula import FALSE, TRUE, Formula, mk_and, negate_exact
from sopgraph.logic.guards import NEGATED_OP, GuardCompiler, OverBudget
from sopgraph.logic.intervals import (  # re-exported: NumDom and the num_* operations are the domain's API
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
from sopgraph.logic.scalardom import (
    DAY,
    InternalValues,
    describe_time,
    finite_strings,
    pick_time,
    string_candidates,
    string_samples,
    time_candidates,
    to_input,
    typical,
)

INF = math.inf
_SEARCH_COMBOS = 4096  # candidate assignments tried per residual witness search
_REFUTED_COMBOS = 256  # … after the solver refuted the rational relaxation (float arithmetic)
MAX_SPLIT = 256  # boxes one constraint may split a box into; beyond, the constraint stays a residual
EXPAND_VARS = 6  # aggregates (count/min/max/case) over more base variables are kept whole
MAX_ALTERNATIVES = 8  # boxes of a region described one by one (`describe_region`)
SOLVER_FIRST_VARS = 8  # residuals reading more variables go to the solver before the witness search


class Box:
    """An interned set of assignments: per-variable domains plus residual predicate literals.

    Do not construct directly: use `full_box` / `constrain` (or `Space` methods). Boxes of one
    scenario are interned, so equality is identity and hashing is cheap."""

    __slots__ = ("space", "doms", "resid", "serial", "__weakref__")

    def __init__(self, space: Space, doms: tuple, resid: frozenset, serial: int):
        self.space = space
        self.doms = doms
        self.resid = resid
        self.serial = serial

    def __getitem__(self, name: str) -> frozenset | NumDom:
        sp = self.space
        i = sp.index[name]
        return sp.public_dom(i, self.doms[i])

    def __contains__(self, values: object) -> bool:
        return isinstance(values, dict) and self.space.box_contains(self, values)

    def __iter__(self):
        return iter(self.space.names)

    def __len__(self) -> int:
        return len(self.space.names)

    def items(self) -> list[tuple[str, frozenset | NumDom]]:
        return [(n, self[n]) for n in self.space.names]

    def constraints(self) -> dict[str, str]:
        """Human text of the remaining domain of each constrained variable (+ `where` residuals)."""
        return self.space.describe_region((self,))

    @property
    def exact(self) -> bool:
        """True when the box is a plain product of domains (no residual predicate)."""
        return not self.resid

    def __repr__(self) -> str:
        return f"Box({self.constraints()})"


class Space:
    """Per-scenario analysis context: variable layout, interned boxes, compiled formulas, memos."""

    def __init__(self, scenario: ir.Scenario):
        self.scenario = scenario
        self.names: list[str] = [n for n, v in scenario.variables.items() if v.role != "derived"]
        self.index: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        self.kinds: list[str] = []
        self.values: list[tuple] = []
        full: list[Any] = []
        self.time_kinds: dict[int, str] = {}  # date/datetime/duration variables: ints of seconds
        self.time_names: dict[str, str] = {}
        self.strings: set[int] = set()  # string variables: decided by witness search alone
        self.string_samples: dict[int, tuple[str, str]] = {}  # their plausible values (`string_samples`)
        # lists and records (analysed lowered, `logic.lower`; here only sample values for the witness
        # search of analyses on the source form, e.g. `sop diff`)
        self.structured: dict[int, list[Any]] = {}
        # string variables read only against literals: an enum of those literals and one other text
        # (`scalardom.finite_strings`), decided exactly like enums
        self.text_enums: set[int] = set()
        texts = finite_strings(scenario)
        self.optional = {i for i, n in enumerate(self.names) if scenario.variables[n].optional}
        for n in self.names:
            t = scenario.variables[n].type
            if isinstance(t, ir.TimeType):
                self.time_kinds[len(self.kinds)] = self.time_names[n] = t.kind
                self.kinds.append("int")
                self.values.append(())  # a duration input is never negative ("-5 hours" does not parse)
                full.append(NumDom(0 if t.kind == "duration" else -INF, INF, False, False, NO_POINTS))
            elif isinstance(t, ir.StringType) and n in texts:  # compared with literals only: finite
                self.text_enums.add(len(self.kinds))
                self.kinds.append("enum")
                self.values.append(texts[n])
                full.append((1 << len(texts[n])) - 1)
            elif isinstance(t, ir.StringType):
                self.string_samples[len(self.kinds)] = string_samples(n, scenario.variables[n].description)
                self.strings.add(len(self.kinds))
                self.kinds.append("none")
                self.values.append(())
                full.append(None)
            elif isinstance(t, ir.EnumType):
                vals = tuple(dict.fromkeys(t.values))
                self.kinds.append("enum")
                self.values.append(vals)
                full.append((1 << len(vals)) - 1)
            elif isinstance(t, ir.BoolType):
                self.kinds.append("bool")
                self.values.append((False, True))
                full.append(3)
            elif isinstance(t, ir.NumType):
                is_int = t.kind == "int"
                self.kinds.append(t.kind)
                self.values.append(())
                lo = -INF if t.lo is None else t.lo
                hi = INF if t.hi is None else t.hi
                d = num_norm(lo, hi, t.lo_open, t.hi_open, NO_POINTS, is_int)
                if d is None:  # empty declared range (a checker error): keep something usable
                    d = NumDom(-INF, INF, False, False, NO_POINTS)
                full.append(d)
            else:
                samples = structured_samples(t)
                if samples:
                    self.structured[len(self.kinds)] = samples
                self.kinds.append("none")
                self.values.append(())
                full.append(None)
        self.full_doms: tuple = tuple(full)
        self._boxes: dict[tuple, Box] = {}
        self._serial = 0
        self.full = self.box(self.full_doms, NO_POINTS)
        self._formula_cache: dict[tuple[int, bool | None], tuple[Any, Any]] = {}
        self._cons: dict[tuple[Box, Formula], tuple[Box, ...]] = {}
        self._decided: dict[Box, tuple[bool | None, dict | None]] = {}
        self.res_exprs: list[Any] = []
        self.res_vars: list[tuple[int, ...]] = []
        self.res_text: list[str] = []
        self._res_index: dict[str, int] = {}
        self._res_shown: dict[tuple[int, bool], str] = {}  # a literal as first written (`Given != OnFile`)
        self.diffs: dict[int, tuple[int, int, int]] = {}  # residual id -> (p, q, k): x_p - x_q <= k
        self.dates = {i for i, k in self.time_kinds.items() if k == "date"}
        self._base_reads: dict[str, tuple[int, ...]] = {}
        self._total: dict[int, tuple[Any, bool]] = {}
        self.unproven: list[str] = []  # conditions kept whole (compile budget), for flow's I302
        self.undecided = 0  # feasibility questions left open (neither a member nor a proof found)
        self.undecided_texts: list[str] = []  # the first few of them, for I302
        self._strict_reads: dict[int, tuple[Any, frozenset[str]]] = {}
        self._dead: dict[frozenset[int], list[int]] = {}
        self._describe_cache: dict[tuple[int, Any], str] = {}
        self.lit_true = ir.Lit.model_construct(value=True, bare=False, kind="lit", span=ir.NO_SPAN)
        self.lit_false = ir.Lit.model_construct(value=False, bare=False, kind="lit", span=ir.NO_SPAN)

    # -- boxes ---------------------------------------------------------------------------------

    def box(self, doms: tuple, resid: frozenset) -> Box:
        key = (doms, resid)
        b = self._boxes.get(key)
        if b is None:
            self._serial += 1
            b = Box(self, doms, resid, self._serial)
            self._boxes[key] = b
        return b

    def with_dom(self, box: Box, i: int, d: Any) -> Box:
        doms = box.doms
        return self.box(doms[:i] + (d,) + doms[i + 1:], box.resid)

    def meet_dom(self, i: int, a: Any, b: Any) -> Any:
        """Intersection of two domains of variable i, or None if empty."""
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            m = a & b
            return m if m else None
        if k == "none":
            return a
        return num_meet(a, b, k == "int")

    def dom_subset(self, i: int, a: Any, b: Any) -> bool:
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            return a & ~b == 0
        if k == "none":
            return True
        return num_subset(a, b)

    def public_dom(self, i: int, d: Any) -> frozenset | NumDom:
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            vals = self.values[i]
            return frozenset(v for j, v in enumerate(vals) if d >> j & 1)
        return d

    def dom_values(self, i: int, d: int) -> list:
        vals = self.values[i]
        return [v for j, v in enumerate(vals) if d >> j & 1]

    def dom_contains(self, i: int, d: Any, value: Any) -> bool:
        k = self.kinds[i]
        if value is None and i in self.optional:  # missing: allowed where nothing constrains it
            return d == self.full_doms[i]
        if k == "enum" or k == "bool":
            vals = self.values[i]
            for j, v in enumerate(vals):
                if v == value and type(v) is type(value):
                    return bool(d >> j & 1)
            if i in self.text_enums and isinstance(value, str):  # any other text: the first value's bit
                return bool(d & 1)
            return False
        if k == "none":
            return True
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if k == "int" and isinstance(value, float) and not value.is_integer():
            return False
        if i in self.dates and value % scalars.DAY:  # a date is a whole day
            return False
        return d.contains(value)

    def box_contains(self, box: Box, values: dict) -> bool:
        """Is this complete assignment (field/system values) a member of the box?"""
        for i, n in enumerate(self.names):
            if n not in values:
                if box.doms[i] != self.full_doms[i]:
                    return False
                continue
            if not self.dom_contains(i, box.doms[i], values[n]):
                return False
        return all(self.eval_resid(rid, truth, values) for rid, truth in box.resid)

    def subsumes(self, a: Box, b: Box, positions: Iterable[int] | None = None) -> bool:
        """b ⊆ a (syntactically), comparing only `positions` (default: all variables)."""
        if not a.resid <= b.resid:
            return False
        da, db = a.doms, b.doms
        for i in (range(len(da)) if positions is None else positions):
            x, y = da[i], db[i]
            if x is not y and x != y and not self.dom_subset(i, y, x):
                return False
        return True

    def normalize(self, boxes: Iterable[Box]) -> tuple[Box, ...]:
        """A canonical-ish union: dedupe, merge boxes that differ in one variable only, drop boxes
        subsumed by another; ordered by creation serial (deterministic). Only variables whose
        domain differs between the boxes are compared, which keeps this cheap for wide scenarios."""
        uniq = sorted(set(boxes), key=_serial)
        if len(uniq) <= 1 or len(uniq) > 256:
            return tuple(uniq)
        for _round in range(8):
            varying = _varying(uniq)
            changed = False
            for i in varying:
                groups: dict[tuple, list[Box]] = {}
                for b in uniq:
                    d = b.doms
                    key = (tuple([d[j] for j in varying if j != i]), b.resid)
                    grp = groups.get(key)
                    if grp is None:
                        groups[key] = [b]
                    else:
                        grp.append(b)
                if len(groups) == len(uniq):
                    continue
                new: list[Box] = []
                for grp in groups.values():
                    if len(grp) == 1:
                        new.append(grp[0])
                        continue
                    merged = self._merge_group(i, grp)
                    if len(merged) < len(grp):
                        changed = True
                    new.extend(merged)
                uniq = sorted(set(new), key=_serial)
                if len(uniq) <= 1:
                    return tuple(uniq)
            if not changed:
                break
        if len(uniq) <= 32:
            varying = _varying(uniq)
            keep: list[Box] = []
            for b in uniq:
                if any(o is not b and self.subsumes(o, b, varying)
                       and (o.serial < b.serial or not self.subsumes(b, o, varying)) for o in uniq):
                    continue
                keep.append(b)
            uniq = keep
        return tuple(uniq)

    def _merge_group(self, i: int, grp: list[Box]) -> list[Box]:
        """Boxes equal except at variable i: union their domains there (one box, or a few
        for numeric domains with gaps)."""
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            m = 0
            for b in grp:
                m |= b.doms[i]
            return [self.with_dom(grp[0], i, m)]
        if k == "none":
            return [grp[0]]
        doms = _merge_nums([b.doms[i] for b in grp], k == "int")
        return [self.with_dom(grp[0], i, d) for d in doms]

    def project(self, box: Box, live: frozenset[int]) -> Box:
        """Forget the domains of variables outside `live` (residuals over live variables keep
        their variables). Residuals purely over forgotten variables are dropped (the caller has
        checked the box is non-empty)."""
        resid = box.resid
        full = self.full_doms
        if resid:
            keep_vars = set(live)
            kept = []
            for lit in resid:
                vs = self.res_vars[lit[0]]
                if any(v in live for v in vs):
                    kept.append(lit)
                    keep_vars.update(vs)
            resid = frozenset(kept)
            dead = [i for i in range(len(full)) if i not in keep_vars]
        else:
            cached = self._dead.get(live)
            if cached is None:
                cached = [i for i in range(len(full)) if i not in live]
                self._dead[live] = cached
            dead = cached
        doms = box.doms
        changed = False
        for i in dead:
            if doms[i] is not full[i] and doms[i] != full[i]:
                changed = True
                break
        if not changed and resid == box.resid:
            return box
        if changed:
            lst = list(doms)
            for i in dead:
                lst[i] = full[i]
            doms = tuple(lst)
        return self.box(doms, resid)

    # -- residual predicates -------------------------------------------------------------------

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
        if isinstance(expr, ir.Compare) and expr.op in _CANONICAL_OP:
            written = expr
            expr, truth, text = _canonical_compare(expr, truth)
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

    def lit_text(self, rid: int, truth: bool) -> str:
        """A residual literal as text: as first written with this truth, else a false difference literal
        or comparison as its complement (`A >= B`), not `not (…)`."""
        shown = self._res_shown.get((rid, truth))
        if shown is not None:
            return shown
        if truth:
            return self.res_text[rid]
        pqk = self.diffs.get(rid)
        if pqk is not None:
            p, q, k = pqk
            return self._diff_text(q, p, -k - 1)
        expr = self.res_exprs[rid]
        if isinstance(expr, ir.Compare) and expr.op in _CANONICAL_OP:
            return f"{ir.show(expr.left)} {NEGATED_OP[expr.op]} {ir.show(expr.right)}"
        text = self.res_text[rid]
        return f"not {text}" if _one_call(text) else f"not ({text})"

    def _var(self, i: int) -> ir.Var:
        return ir.Var.model_construct(kind="var", name=self.names[i], span=ir.NO_SPAN)

    def _diff_text(self, p: int, q: int, k: int) -> str:
        """`x_p - x_q <= k` as people write it: `BookedAt > now - 24 hours` rather than in seconds."""
        timed = p in self.time_kinds or q in self.time_kinds
        if k == -1 or (timed and (k + 1) % 60 == 0 and k % 60) or (not timed and abs(k + 1) < abs(k)):
            # a strict bound reads rounder: `Amount > Limit`, `BookedAt > now - 1 day`
            lhs, op, rhs, off = self.names[q], ">", self.names[p], -(k + 1)
        else:
            lhs, op, rhs, off = self.names[p], "<=", self.names[q], k
        if off == 0:
            return f"{lhs} {op} {rhs}"
        amount = scalars.format_duration(abs(off)) if timed else str(abs(off))
        return f"{lhs} {op} {rhs} {'+' if off > 0 else '-'} {amount}"

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

    def in_formula(self, f: Formula, values: dict) -> bool:
        """Exact membership of a complete assignment in a formula's set."""
        k = f.kind
        if k == "T":
            return True
        if k == "F":
            return False
        if k == "atom":
            n = self.names[f.var]
            return n in values and self.dom_contains(f.var, f.dom, values[n])
        if k == "and":
            return all(self.in_formula(p, values) for p in f.parts)
        if k == "or":
            return any(self.in_formula(p, values) for p in f.parts)
        return self.eval_resid(f.rid, f.truth, values)

    def eval_resid(self, rid: int, truth: bool, values: dict) -> bool:
        pred = self.res_exprs[rid]
        if isinstance(pred, Formula):
            return self.in_formula(pred, values) == truth
        try:
            v = InternalValues(self.scenario, values).eval(pred)
        except (DecideError, TypeError, ValueError, ArithmeticError, KeyError, RecursionError,
                AttributeError):
            return False
        return bool(v) == truth

    # -- formulas ------------------------------------------------------------------------------

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
            # too large to expand into boxes (e.g. `max` of several `count`s over shared inputs):
            # keep it whole as a residual, decided by witness search and the solver
            self.note_unproven(expr)
            f = self.residual(expr, truth)
        self._formula_cache[key] = (expr, f)
        return f

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

    def note_undecided(self, box: Box) -> None:
        """Count a feasibility question left open and remember (the first few of) its conditions, so
        the I302 that reports it can say which question it was."""
        self.undecided += 1
        if len(self.undecided_texts) < 5:
            text = " and ".join(f"`{self.lit_text(rid, truth)}`" for rid, truth in sorted(box.resid))
            text = text if len(text) <= 200 else text[:197] + "..."
            if text not in self.undecided_texts:
                self.undecided_texts.append(text)

    def fire_formula(self, stage: ir.Stage, index: int) -> Formula:
        """Region where branch `index` of `stage` fires: earlier guards false, this one true."""
        parts = [self.formula(b.guard, False) for b in stage.branches[:index] if b.guard is not None]
        own = stage.branches[index].guard
        parts.append(self.formula(own, True) if own is not None else TRUE)
        return mk_and(self, parts)

    # -- constrain -----------------------------------------------------------------------------

    def constrain(self, box: Box, f: Formula) -> tuple[Box, ...]:
        kind = f.kind
        if kind == "T":
            return (box,)
        if kind == "F":
            return ()
        key = (box, f)
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
            for p in f.parts:
                nxt: list[Box] = []
                for b in cur_boxes:
                    nxt.extend(self.constrain(b, p))
                cur_boxes = nxt
                if not nxt or len(nxt) > MAX_SPLIT:
                    break
            res = _dedupe(cur_boxes)
            if len(res) > MAX_SPLIT:
                res = self.add_residual(box, self.formula_residual(f), True)
        elif kind == "or":
            out: list[Box] = []
            aborted = False
            if f.exact:
                rest: Sequence[Box] = (box,)
                parts = f.parts
                last = len(parts) - 1
                for k, p in enumerate(parts):
                    for b in rest:
                        out.extend(self.constrain(b, p))
                    if k == last:
                        break
                    nrest: list[Box] = []
                    pn = negate_exact(self, p)
                    for b in rest:
                        nrest.extend(self.constrain(b, pn))
                    rest = nrest
                    if not rest:
                        break
                    if len(out) + len(rest) > MAX_SPLIT:
                        aborted = True
                        break
            else:
                for p in f.parts:
                    out.extend(self.constrain(box, p))
                    if len(out) > MAX_SPLIT:
                        aborted = True
                        break
            if aborted or len(out) > MAX_SPLIT:
                res = self.add_residual(box, self.formula_residual(f), True)
            else:
                res = _dedupe(out)
        else:  # residual literal
            res = self.add_residual(box, f.rid, f.truth)
        if len(self._cons) > 500_000:
            self._cons.clear()
        self._cons[key] = res
        return res

    def constrain_region(self, region: Iterable[Box], f: Formula, cap: int | None = None) -> tuple[Box, ...]:
        """The boxes of `region` where `f` holds. With `cap`, a result that would exceed `cap` boxes keeps
        the region's boxes and attaches `f` to each as one residual literal instead: the same set, only
        decided lazily (by witness search and the solver). Why: along a long route every stage can split
        each box, and the product of the splits made one path's region cost minutes (issue 31)."""
        region = tuple(region)
        out: list[Box] = []
        for b in region:
            out.extend(self.constrain(b, f))
            if cap is not None and len(out) > cap:
                rid = self.formula_residual(f)
                out = [self.box(b2.doms, b2.resid | {(rid, True)}) for b2 in region if (rid, False) not in b2.resid]
                break
        return self.normalize(out)

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

    def _finite_values(self, i: int, d: Any, limit: int) -> list | None:
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            return self.dom_values(i, d)
        if k == "int" and d.lo != -INF and d.hi != INF and d.hi - d.lo < limit:
            return [x for x in range(int(d.lo), int(d.hi) + 1) if x not in d.excl]
        if k == "float" and d.lo == d.hi:
            return [d.lo]
        return None

    def _point(self, i: int, v: Any) -> Any:
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            for j, x in enumerate(self.values[i]):
                if x == v and type(x) is type(v):
                    return 1 << j
            return 0
        return NumDom(v, v, False, False, NO_POINTS)

    # -- feasibility and witnesses -------------------------------------------------------------

    def decide(self, box: Box) -> bool | None:
        """True: a member exists; False: proven empty; None: undecided."""
        if not box.resid:
            return True
        hit = self._decided.get(box)
        if hit is None:
            w, exhaustive = self._search_or_solve(box, "boundary", None)
            hit = (True if w is not None else (False if exhaustive else None), w)
            self._decided[box] = hit
        return hit[0]

    def decide_region(self, region: Iterable[Box]) -> bool | None:
        status: bool | None = False
        for b in region:
            s = self.decide(b)
            if s:
                return True
            if s is None:
                status = None
        return status

    def witness(self, box: Box, style: str = "representative",
                rng: random.Random | None = None) -> dict[str, Any] | None:
        """A member of the box in the engine's input form (dates and durations as text)."""
        w = self._witness(box, style, rng)
        if w is not None and not self.box_contains(box, w):  # defensive: never hand out a non-member
            return None
        return to_input(self.time_names, w) if w is not None and self.time_names else w

    def _witness(self, box: Box, style: str, rng: random.Random | None) -> dict[str, Any] | None:
        if not box.resid:
            return self.pick_all(box, style, rng)
        if style == "boundary" and rng is None:
            self.decide(box)
            hit = self._decided.get(box)
            if hit is not None and hit[1] is not None:
                return dict(hit[1])
        w, _ = self._search_or_solve(box, style, rng)
        return w

    def _search_or_solve(self, box: Box, style: str, rng: random.Random | None) -> tuple[dict | None, bool]:
        """Witness search and the SMT solver (`solver`): the search first when the residuals read
        few variables (cheap, and it varies witnesses), the solver first when they read many (the
        search's few thousand candidates would be a needle-in-a-haystack guess). A solver model is
        kept only if the reference interpreter confirms it. Residuals that share no variable are
        decided one group at a time (`_solve_groups`)."""
        if self._reads_missing(box):
            return None, True
        groups = self._resid_groups(box)
        if len(groups) > 1:
            return self._solve_groups(box, groups, style, rng)
        if any(rid in self.diffs for rid, _t in box.resid):
            verdict, w = self._solve_diffs(box, style, rng)
            if verdict == "empty":
                return None, True
            if w is not None:
                return w, False
        rvars = {v for rid, _t in box.resid for v in self.res_vars[rid]}
        solver_first = len(rvars) > SOLVER_FIRST_VARS
        if not solver_first:
            w, exhaustive = self._search(box, style, rng)
            if w is not None or exhaustive:
                return w, exhaustive
        model, empty = solver.solve(self, box)
        if model is not None and self.box_contains(box, model):
            return self._near_reference(box, model), False
        if empty:
            return None, True
        if solver_first:  # after an inexact refutation only a short search (for a rounding witness)
            w, exhaustive = self._search(box, style, rng, _REFUTED_COMBOS if empty is None else _SEARCH_COMBOS)
            if w is not None or exhaustive:
                return w, exhaustive
        self.note_undecided(box)
        return None, False

    def _near_reference(self, box: Box, model: dict[str, Any]) -> dict[str, Any]:
        """The solver leaves a moment nothing pins at 0, which reads as 1970 (`LostAt=1970-01-01`, and
        an item "at 1969-12-31T23:59:59" just before it). Comparisons between moments only see their
        differences: moved together by whole days so that the latest sits at the reference moment, the
        model usually still holds; that one is kept, else the model as it was."""
        solved = {v for rid, _t in box.resid for v in self.res_vars[rid]}  # the rest was picked, not solved
        moments = [self.names[i] for i, kind in self.time_kinds.items() if kind != "duration" and i in solved
                   and isinstance(model.get(self.names[i]), int) and not isinstance(model.get(self.names[i]), bool)]
        if not moments:
            return model
        latest = max(model[n] for n in moments)
        shift = (typical("date") - latest) // DAY * DAY
        if abs(shift) < 365 * DAY:  # already near the reference
            return model
        moved = {**model, **{n: model[n] + shift for n in moments}}
        return moved if self.box_contains(box, moved) else model

    def _reads_missing(self, box: Box) -> bool:
        """True when the box says `missing(X)` and another of its residuals always reads `X`: the engine
        refuses every such assignment, so the box is empty. (The search cannot show it, since the other
        variables of that residual have unbounded candidates, and the solver does not model absence.)"""
        absent: set[str] = set()
        for rid, truth in box.resid:
            pred = self.res_exprs[rid]
            if truth and isinstance(pred, ir.Func) and pred.name == "missing" and isinstance(pred.args[0], ir.Var):
                absent.add(pred.args[0].name)
        if not absent:
            return False
        for rid, _truth in box.resid:
            pred = self.res_exprs[rid]
            if isinstance(pred, Formula) or (isinstance(pred, ir.Func) and pred.name == "missing"):
                continue
            if not absent.isdisjoint(self._strict(pred)):
                return True
        return False

    def _strict(self, expr: Any) -> frozenset[str]:
        hit = self._strict_reads.get(id(expr))
        if hit is None or hit[0] is not expr:
            hit = (expr, strict_reads(self.scenario, expr))
            self._strict_reads[id(expr)] = hit
        return hit[1]

    def _resid_groups(self, box: Box) -> list[frozenset]:
        """The box's residual literals split into groups that read disjoint sets of variables."""
        res_vars = self.res_vars
        groups: list[tuple[set[int], list]] = []
        for lit in sorted(box.resid):
            reads = set(res_vars[lit[0]])
            joined = [g for g in groups if g[0] & reads]
            if not joined:
                groups.append((reads, [lit]))
                continue
            first = joined[0]
            first[0].update(reads)
            first[1].append(lit)
            for g in joined[1:]:
                first[0].update(g[0])
                first[1].extend(g[1])
                groups.remove(g)
        return [frozenset(lits) for _reads, lits in groups]

    def _solve_groups(self, box: Box, groups: list[frozenset], style: str,
                      rng: random.Random | None) -> tuple[dict | None, bool]:
        """Independent residual groups (e.g. a score over some inputs, a pattern on a text, a date
        window) decided one by one: the box has a member iff every group does, and the members of
        the groups combine, since no two read the same variable. Searching them together would
        multiply their candidate lists (and the solver gives up on the whole when one part is a
        construct it does not model)."""
        merged = self.pick_all(box, style, rng)
        if merged is None:
            return None, False
        for lits in groups:
            w, exhaustive = self._search_or_solve(self.box(box.doms, lits), style, rng)
            if w is None:
                return None, exhaustive  # one empty group empties the box; an undecided one was counted
            for i in {v for rid, _t in lits for v in self.res_vars[rid]}:
                merged[self.names[i]] = w[self.names[i]]
        if not all(self.eval_resid(rid, truth, merged) for rid, truth in box.resid):
            self.note_undecided(box)  # defensive: groups that do not combine (a read the split did not see)
            return None, False
        return merged, False

    def _solve_diffs(self, box: Box, style: str, rng: random.Random | None) -> tuple[str, dict | None]:
        """The box's difference literals as one difference-bound system (`diffbound`): "empty" is exact;
        a member is returned when every residual is a difference literal (else the system's solution
        only seeds nothing and the caller searches)."""
        cons: list[tuple[int, int, int]] = []
        for rid, truth in box.resid:
            pqk = self.diffs.get(rid)
            if pqk is not None:
                p, q, k = pqk
                cons.append((p, q, k) if truth else (q, p, -k - 1))
        involved = {v for p, q, _k in cons for v in (p, q)}
        bounds: dict[int, tuple[float, float]] = {}
        for i in involved:
            d = box.doms[i]
            lo = d.lo + 1 if d.lo_open else d.lo  # ints: closed already; kept general
            hi = d.hi - 1 if d.hi_open else d.hi
            bounds[i] = (lo, hi)

        def pick(i: int, lo: float, hi: float) -> Any:
            d = num_meet(box.doms[i], NumDom(lo, hi, False, False, NO_POINTS), True)
            if d is None:
                return None
            x = self.pick(i, d, style, rng)
            return None if x is NO_VALUE else x

        verdict, values = diffbound.solve(involved, cons, bounds, self.dates & involved, pick)
        if verdict != "sat" or values is None or len(cons) != len(box.resid):
            return verdict, None
        w = self.pick_all(box, style, rng)
        if w is None:
            return "unknown", None
        for i, x in values.items():
            w[self.names[i]] = x
        return ("sat", w) if self.box_contains(box, w) else ("unknown", None)

    def pick_all(self, box: Box, style: str, rng: random.Random | None) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        for i, n in enumerate(self.names):
            v = self.pick(i, box.doms[i], style, rng)
            if v is NO_VALUE:
                return None
            out[n] = v
        return out

    def pick(self, i: int, d: Any, style: str, rng: random.Random | None) -> Any:
        if i in self.time_kinds:
            return pick_time(self.time_kinds[i], d, style, rng)
        if i in self.strings:
            return self.string_samples[i][0]
        if i in self.structured:
            return copy.deepcopy(self.structured[i][0])
        k = self.kinds[i]
        if k == "enum" or k == "bool":
            vals = self.dom_values(i, d)
            if not vals:
                return NO_VALUE
            return rng.choice(vals) if rng is not None else vals[0]
        if k == "none":
            return NO_VALUE
        return pick_num(d, k == "int", style, rng)

    def _candidates(self, i: int, d: Any, style: str, rng: random.Random | None,
                    consts: list[float]) -> tuple[list, bool]:
        """Candidate values for variable i in witness search; bool = the list is the whole domain."""
        if i in self.optional:  # missing is a value of its own
            cands, whole = self._candidates_present(i, d, style, rng, consts)
            return (cands[:1] + [None] + cands[1:], whole) if d == self.full_doms[i] else (cands, whole)
        return self._candidates_present(i, d, style, rng, consts)

    def _candidates_present(self, i: int, d: Any, style: str, rng: random.Random | None,
                            consts: list[float]) -> tuple[list, bool]:
        if i in self.time_kinds:
            return time_candidates(self.time_kinds[i], d, style, rng, consts), False
        if i in self.strings:
            return string_candidates(self.names[i], self.res_exprs, *self.string_samples[i]), False
        if i in self.structured:
            return copy.deepcopy(self.structured[i]), False
        k = self.kinds[i]
        if i in self.text_enums and d & 1:  # other texts: also those a residual compares it with
            vals = self.dom_values(i, d)
            known = set(self.values[i])
            vals += [x for x in string_candidates(self.names[i], self.res_exprs, vals[0]) if x not in known]
            return vals, False
        if k == "enum" or k == "bool":
            vals = self.dom_values(i, d)
            if rng is not None:
                vals = vals[:]
                rng.shuffle(vals)
            return vals, True
        if k == "none":
            return [], False
        finite = self._finite_values(i, d, 16)
        if finite is not None:
            first = pick_num(d, k == "int", style, rng)
            return [first] + [x for x in finite if x != first], True
        is_int = k == "int"
        raw: list[float] = [pick_num(d, is_int, style, rng), pick_num(d, is_int, "boundary", None),
                            pick_num(d, is_int, "representative", None)]
        for c in consts:
            raw += [c, c + 1, c - 1]
            if not is_int:
                raw += [c + 0.5, c - 0.5]
        raw += [0, 1, -1, 100, 1000]
        if d.lo != -INF:
            raw += [d.lo, d.lo + 1, d.lo + 2]
        if d.hi != INF:
            raw += [d.hi, d.hi - 1, d.hi - 2]
        if d.lo != -INF and d.hi != INF:
            raw.append((d.lo + d.hi) / 2)
        out: list = []
        seen: set = set()
        for x in raw:
            if x is NO_VALUE or isinstance(x, bool):
                continue
            if is_int:
                if isinstance(x, float):
                    if not math.isfinite(x) or not x.is_integer():
                        continue
                    x = int(x)
            else:
                if not math.isfinite(x):
                    continue
                x = float(x)
            if x in seen or not d.contains(x):
                continue
            seen.add(x)
            out.append(x)
            if len(out) >= 14:
                break
        return out, False

    def _search(self, box: Box, style: str, rng: random.Random | None,
                limit: int = _SEARCH_COMBOS) -> tuple[dict | None, bool]:
        base = self.pick_all(box, style, rng)
        if base is None:
            return None, False
        lits = sorted(box.resid)
        rvars: dict[int, None] = {}
        consts: list[float] = []
        for rid, _t in lits:
            for v in self.res_vars[rid]:
                rvars.setdefault(v, None)
            pred = self.res_exprs[rid]
            if isinstance(pred, Formula):
                if pred.src is not None:
                    consts += _numeric_consts(pred.src[0])
            else:
                consts += _numeric_consts(pred)
        order = list(rvars)
        cand_lists = []
        exhaustive = True
        for i in order:
            cands, whole = self._candidates(i, box.doms[i], style, rng, consts)
            if not cands:
                return None, False
            cand_lists.append(cands)
            exhaustive = exhaustive and whole
        for tried, combo in enumerate(itertools.product(*cand_lists)):
            if tried >= limit:
                return None, False
            values = dict(base)
            for i, v in zip(order, combo, strict=True):
                values[self.names[i]] = v
            if all(self.eval_resid(rid, truth, values) for rid, truth in lits):
                return values, False
        return None, exhaustive

    # -- descriptions --------------------------------------------------------------------------

    def describe_dom(self, i: int, d: Any) -> str:
        if i in self.time_kinds:
            return describe_time(self.time_kinds[i], d)
        k = self.kinds[i]
        if k == "enum" and i in self.text_enums:
            other, *lits = self.values[i]
            vals = self.dom_values(i, d)
            if other in vals and len(vals) > 1:
                return "any text but " + ", ".join(ir.quote(x) for x in lits if x not in vals)
            return " | ".join("any other text" if x == other else ir.quote(x) for x in vals)
        if k == "enum":
            return " | ".join(ir.show_enum_value(v) for v in self.dom_values(i, d))
        if k == "bool":
            return " | ".join("true" if v else "false" for v in self.dom_values(i, d))
        if k == "none":
            return "any"
        return describe_num(d, self.full_doms[i])

    def describe_region(self, region: Sequence[Box]) -> dict[str, str]:
        """Per constrained variable, its domain over the region, as text; `where` for the rest. Exact
        when the region is one box, or its boxes differ in one variable only, or they are few: then the
        constraints they share are listed per variable and the rest as alternatives (`where`: "(Hardship
        = true and now > …) or (…)"). Per-variable unions alone would lose how variables combine (a
        region "A or B" would read as no constraint at all). Beyond `MAX_ALTERNATIVES` boxes, each
        variable's union is listed and `where` names the variables whose combination is not shown."""
        out: dict[str, str] = {}
        if not region:
            return out
        if len(region) > 1:
            exact = self._describe_alternatives(region)
            if exact is not None:
                return exact
        full_doms = self.full_doms
        cache = self._describe_cache
        for i, n in enumerate(self.names):
            full = full_doms[i]
            if len(region) == 1:
                d = region[0].doms[i]
                if d is full or d == full:
                    continue
                key = (i, d)
                text = cache.get(key)
                if text is None:
                    text = self.describe_dom(i, d)
                    cache[key] = text
                out[n] = text
                continue
            doms: list[Any] = []
            for b in region:
                d = b.doms[i]
                if d not in doms:
                    doms.append(d)
            if any(d == full for d in doms):
                continue
            k = self.kinds[i]
            if k == "enum" or k == "bool":
                m = 0
                for d in doms:
                    m |= d
                if m == full:
                    continue
                out[n] = self.describe_dom(i, m)
                continue
            merged = _merge_nums(doms, k == "int")
            if len(merged) == 1 and merged[0] == full:
                continue
            out[n] = " or ".join(describe_num(d, full) for d in merged)
        resid_texts: list[str] = []
        for b in region:
            if not b.resid:
                continue
            parts = [self.lit_text(rid, truth) for rid, truth in sorted(b.resid)]
            t = " and ".join(parts)
            if t and t not in resid_texts:
                resid_texts.append(t)
        if resid_texts:
            out["where"] = " or ".join(_alternative(t) if len(resid_texts) > 1 else t for t in resid_texts)
        if len(region) > MAX_ALTERNATIVES:
            combined = [self.names[i] for i in self._varying_vars(region)]
            if len(combined) > 1:
                shown = ", ".join(combined[:6]) + (", …" if len(combined) > 6 else "")
                note = f"one of {len(region)} combinations of {shown} (not listed)"
                out["where"] = f"{out['where']}; {note}" if "where" in out else note
        return out

    def _varying_vars(self, region: Sequence[Box]) -> list[int]:
        first = region[0].doms
        return [i for i in range(len(first)) if any(b.doms[i] != first[i] for b in region[1:])]

    def _describe_alternatives(self, region: Sequence[Box]) -> dict[str, str] | None:
        """`describe_region` of a few boxes that differ in more than one variable (or residual): what they
        share per variable, the rest as `where` alternatives. None when per-variable unions are exact
        (one varying variable, same residuals) or the boxes are too many to list."""
        if len(region) > MAX_ALTERNATIVES:
            return None
        varying = self._varying_vars(region)
        if len(varying) <= 1 and all(b.resid == region[0].resid for b in region[1:]):
            return None
        out: dict[str, str] = {}
        full_doms = self.full_doms
        vary = set(varying)
        for i, n in enumerate(self.names):
            d = region[0].doms[i]
            if i not in vary and d != full_doms[i]:
                out[n] = self.describe_dom(i, d)
        shared = frozenset.intersection(*(b.resid for b in region))
        alternatives: list[str] = []
        for b in region:
            parts = [f"{self.names[i]} {relation_text(self.describe_dom(i, b.doms[i]))}"
                     for i in varying if b.doms[i] != full_doms[i]]
            parts += [self.lit_text(rid, truth) for rid, truth in sorted(b.resid - shared)]
            if not parts:  # one box is unconstrained here: the alternatives cover everything
                alternatives = []
                break
            text = " and ".join(parts)
            if text not in alternatives:
                alternatives.append(text)
        where = [self.lit_text(rid, truth) for rid, truth in sorted(shared)]
        if len(alternatives) == 1:
            where.append(alternatives[0])
        elif alternatives:
            where.append("(" + " or ".join(_alternative(t) for t in alternatives) + ")"
                         if where else " or ".join(_alternative(t) for t in alternatives))
        if where:
            out["where"] = " and ".join(where)
        return out


_CANONICAL_OP = {"==": ("==", False), "!=": ("==", True), "<": ("<", False), ">=": ("<", True),
                 "<=": ("<=", False), ">": ("<=", True)}
"""A comparison operator as (the operator of its literal, whether the literal is negated)."""
_MIRROR = {"==": "==", "<": ">", "<=": ">="}  # `A op B` is `B mirror A`


def _canonical_compare(expr: ir.Compare, truth: bool) -> tuple[ir.Compare, bool, str]:
    """(`X op Y`, truth, key) equal to "`expr` is `truth`", with op one of `==` `<` `<=` and the operands in
    the order of their text. Why: so that `A >= B`, `B > A` and `not (A < B)` are one literal."""
    op, negated = _CANONICAL_OP[expr.op]
    left, right = expr.left, expr.right
    shown_left, shown_right = ir.show(left), ir.show(right)
    if shown_left > shown_right:  # mirror: `B < A` is `A > B`, which is `A <= B` negated
        left, right, shown_left, shown_right = right, left, shown_right, shown_left
        mirrored = _MIRROR[op]
        op, flip = _CANONICAL_OP[mirrored]
        negated = negated != flip
    truth = truth != negated
    canonical = expr if op == expr.op and left is expr.left else expr.model_copy(
        update={"op": op, "left": left, "right": right})
    return canonical, truth, f"{shown_left} {op} {shown_right}"


def _alternative(text: str) -> str:
    """One alternative of an `or`, in parentheses unless it is one call (`missing(X)`)."""
    return text if _one_call(text) else f"({text})"


def _one_call(text: str) -> bool:
    """`missing(X)`, `any(s in L where …)`: one call, so `not` needs no parentheses around it."""
    head, paren, _rest = text.partition("(")
    if not paren or not head.isidentifier() or not text.endswith(")"):
        return False
    depth = 0
    for pos, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and pos >= len(head):
            return pos == len(text) - 1
    return False


def relation_text(text: str) -> str:
    """A domain's text as a relation after the variable's name: `<= 2000`, `= true`, `in {A, B}`."""
    if text[:1] in "<>=!" or text.startswith("in "):
        return text
    return f"= {text}" if " | " not in text else f"in {{{text.replace(' | ', ', ')}}}"


def _serial(b: Box) -> int:
    return b.serial


def _varying(boxes: Sequence[Box]) -> list[int]:
    """Variable positions whose domain is not the same in every box."""
    first = boxes[0].doms
    out = []
    for i, col in enumerate(zip(*(b.doms for b in boxes), strict=True)):
        d = first[i]
        for x in col:
            if x is not d and x != d:
                out.append(i)
                break
    return out


def _dedupe(boxes: Sequence[Box]) -> tuple[Box, ...]:
    if len(boxes) <= 1:
        return tuple(boxes)
    return tuple(dict.fromkeys(boxes))


def _merge_nums(doms: list[NumDom], is_int: bool) -> list[NumDom]:
    """The union as few intervals as possible. A strict float bound is kept as the next float
    (`> 250` is `>= 250.00000000000003`), so `[0, 250]` and `[250.00000000000003, 1750]` touch: no
    float lies between them, and they read as one range (not "<= 250 or in (250..1750]")."""
    pending = sorted(doms, key=lambda d: (d.lo, d.lo_open))
    out: list[NumDom] = []
    for d in pending:
        if out:
            last = out[-1]
            if not is_int and not last.hi_open and not d.lo_open and math.nextafter(last.hi, math.inf) == d.lo:
                d = d._replace(lo=last.hi)
            u = num_union(last, d, is_int)
            if u is not None:
                out[-1] = u
                continue
        out.append(d)
    return out


def _numeric_consts(expr: Any) -> list[float]:
    out: list[float] = []

    def walk(e: Any) -> None:
        if isinstance(e, (ir.Lit, ir.TimeLit)):
            if isinstance(e.value, (int, float)) and not isinstance(e.value, bool):
                out.append(e.value)
            return
        for c in ir.children(e):
            walk(c)

    walk(expr)
    return out[:8]


# ---------------------------------------------------------------------------------------------
# Public functions


MAX_SAMPLES = 8  # sample values per list or record type


def structured_samples(t: Any) -> list[Any]:
    """A few values of a list or record type (enum, bool, number and string leaves; [] when it has
    others), in the engine's input form: the shortest list, single-item lists of other items, the
    longest list; records varying one field at a time. The witness search tries them as candidates."""
    if isinstance(t, ir.EnumType):
        return list(dict.fromkeys(t.values))
    if isinstance(t, ir.BoolType):
        return [False, True]
    if isinstance(t, ir.StringType):
        return ["text"]
    if isinstance(t, ir.NumType):
        lo = -INF if t.lo is None else t.lo + (1 if t.lo_open else 0)
        hi = INF if t.hi is None else t.hi - (1 if t.hi_open else 0)
        picks = [x for x in (max(lo, 0.0) if lo <= 0 <= hi else lo if lo != -INF else hi, 100.0, hi)
                 if x not in (-INF, INF) and lo <= x <= hi]
        return list(dict.fromkeys(int(x) if t.kind == "int" else float(x) for x in picks
                                  if t.kind != "int" or float(x).is_integer()))
    if isinstance(t, ir.ListType):
        items = structured_samples(t.item)
        if not items:
            return []
        some = max(t.min_len, 1)
        lists: list[Any] = [[items[0]] * t.min_len]
        lists += [[item] * some for item in items[1:MAX_SAMPLES - 2]] if some <= t.max_len else []
        lists.append([items[0]] * t.max_len)
        return [v for i, v in enumerate(lists) if v not in lists[:i]][:MAX_SAMPLES]
    if isinstance(t, ir.RecordType):
        fields = [(f.name, structured_samples(f.type)) for f in t.fields]
        if not fields or any(not samples for _name, samples in fields):
            return []
        base = {name: samples[0] for name, samples in fields}
        records: list[Any] = [base] + [{**base, name: v} for name, samples in fields for v in samples[1:]]
        return records[:MAX_SAMPLES]
    return []


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
        raise ValueError(f"unknown witness style {style!r}")
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


def strict_reads(scenario: ir.Scenario, expr: Any) -> frozenset[str]:
    """The input variables evaluating `expr` always reads, whatever their values: every operand,
    except the later operands of `and`/`or` and the later arms of `case` (they may be skipped), the
    condition of a quantifier (an empty list reads no item) and `missing(X)` (it reads no value).
    Derived variables are followed."""
    out: set[str] = set()
    seen: set[str] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Var):
            var = scenario.variables.get(e.name)
            if var is not None and var.role == "derived" and var.expr is not None:
                if e.name not in seen:
                    seen.add(e.name)
                    stack.append(var.expr)
            elif var is not None:
                out.add(e.name)
        elif isinstance(e, ir.BoolOp):
            stack.append(e.operands[0])
        elif isinstance(e, ir.CaseExpr):
            stack.append(e.arms[0].when if e.arms else e.otherwise)
        elif isinstance(e, ir.Quant):
            stack.append(e.source)
        elif isinstance(e, ir.Func) and e.name == "missing":
            continue
        elif isinstance(e, ir.Node):
            stack.extend(ir.children(e))
    return frozenset(out)
