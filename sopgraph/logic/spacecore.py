"""The core of a constraint space (`domain.Space`): the variables' layout, interned boxes, the per-variable
domain operations, normalisation and projection, and the evaluation of residual literals on values. Split
from `domain` along its seams (core here, witness search in `spacesearch`, descriptions in `spacetext`, the
compiled constraints in `domain`); each layer only calls the ones below it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from sopgraph.language import ir, scalars
from sopgraph.logic.engine import DecideError
from sopgraph.logic.formula import Formula
from sopgraph.logic.intervals import (  # re-exported: NumDom and the num_* operations are the domain's API
    NO_POINTS,
    NumDom,
    num_meet,
    num_norm,
    num_subset,
    num_union,
)
from sopgraph.logic.scalardom import (
    InternalValues,
    finite_strings,
    string_samples,
)

INF = math.inf
SEARCH_COMBOS = 4096  # candidate assignments tried per residual witness search
REFUTED_COMBOS = 256  # … after the solver refuted the rational relaxation (float arithmetic)
QUICK_COMBOS = 256  # … tried before the solver on a question (no random source), the rest after it
MAX_SPLIT = 256  # boxes one constraint may split a box into; beyond, the constraint stays a residual
EXPAND_VARS = 6  # aggregates (count/min/max/case) over more base variables are kept whole
MAX_ALTERNATIVES = 8  # boxes of a region described one by one (`describe_region`)
SOLVER_FIRST_VARS = 8  # residuals reading more variables go to the solver before the witness search


class Box:
    """An interned set of assignments: per-variable domains plus residual predicate literals.

    Do not construct directly: use `full_box` / `constrain` (or `Space` methods). Boxes of one
    scenario are interned, so equality is identity and hashing is cheap."""

    __slots__ = ("space", "doms", "resid", "serial", "__weakref__")

    def __init__(self, space: SpaceCore, doms: tuple, resid: frozenset, serial: int):
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


class SpaceCore:
    """Per-scenario analysis context: variable layout, interned boxes, domain operations, memos."""

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
        self._members: list[dict] = []  # the latest members decisions found (`SpaceSearch.decide`)
        self._groups: dict[tuple, tuple[dict | None, bool, int]] = {}  # see `SpaceSearch._decide_group`
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

    def describe_region(self, region: Sequence[Box]) -> dict[str, str]:
        """Text of a region's constraints (`Box.constraints`): defined by the text layer (`spacetext`)."""
        raise NotImplementedError

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
        doms = merge_nums([b.doms[i] for b in grp], k == "int")
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


CANONICAL_OP = {"==": ("==", False), "!=": ("==", True), "<": ("<", False), ">=": ("<", True),
                 "<=": ("<=", False), ">": ("<=", True)}
"""A comparison operator as (the operator of its literal, whether the literal is negated)."""
_MIRROR = {"==": "==", "<": ">", "<=": ">="}  # `A op B` is `B mirror A`


def canonical_compare(expr: ir.Compare, truth: bool) -> tuple[ir.Compare, bool, str]:
    """(`X op Y`, truth, key) equal to "`expr` is `truth`", with op one of `==` `<` `<=` and the operands in
    the order of their text. Why: so that `A >= B`, `B > A` and `not (A < B)` are one literal."""
    op, negated = CANONICAL_OP[expr.op]
    left, right = expr.left, expr.right
    shown_left, shown_right = ir.show(left), ir.show(right)
    if shown_left > shown_right:  # mirror: `B < A` is `A > B`, which is `A <= B` negated
        left, right, shown_left, shown_right = right, left, shown_right, shown_left
        mirrored = _MIRROR[op]
        op, flip = CANONICAL_OP[mirrored]
        negated = negated != flip
    truth = truth != negated
    canonical = expr if op == expr.op and left is expr.left else expr.model_copy(
        update={"op": op, "left": left, "right": right})
    return canonical, truth, f"{shown_left} {op} {shown_right}"


def alternative_text(text: str) -> str:
    """One alternative of an `or`, in parentheses unless it is one call (`missing(X)`)."""
    return text if one_call(text) else f"({text})"


def one_call(text: str) -> bool:
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


def dedupe_boxes(boxes: Sequence[Box]) -> tuple[Box, ...]:
    if len(boxes) <= 1:
        return tuple(boxes)
    return tuple(dict.fromkeys(boxes))


def merge_nums(doms: list[NumDom], is_int: bool) -> list[NumDom]:
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


def numeric_consts(expr: Any) -> list[float]:
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
