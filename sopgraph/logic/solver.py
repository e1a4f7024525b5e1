"""Exact decisions for residual constraints with an SMT solver (z3), under a deterministic budget.

The constraint domain (`domain`) keeps what it cannot represent as per-variable domains as
*residual* predicates: `max(S0, ..., S7) >= 5` over counts of 30 shared inputs, `S3 == Top`, a
`case` picking a type. Its witness search tries a few thousand candidate assignments; on scoring
SOPs the interesting assignments (five indicators of one score true) are too rare for that, so the
region stays undecided and paths, synthesis and flow analysis lose exactly the cases that matter.
An SMT solver answers these questions directly: integer arithmetic, `count` as a sum of 0/1 terms,
`min`/`max`/`case` as if-then-else. See docs/architecture.md for why z3 (and not a SAT encoding).

Soundness rules:
- every witness the solver proposes is re-checked by the caller with the reference interpreter;
- "unsat" is trusted (the region is proven empty) only when the query is exact: no nonlinear product,
  no division, and float arithmetic only where its rounding is bounded. Float variables and non-integer
  constants that are only compared are exact: a constant is translated as the rational its float is
  (`0.1` as 3602879701896397/2**55), and every float is a rational, so a comparison the reals cannot
  satisfy no float satisfies either. A compared value computed in floats (`sum(l.price for l in Lines)`,
  `Fee * 0.5 + 10`) is compared through a variable of its own, the engine's float result, tied to the
  exact rational value within the rounding error its operations can make on the box's ranges
  (`rounding_error`); one such variable per distinct computation, since the engine computes the same
  expression to the same float every time (`Refund <= 1250` and `Refund > 1300` contradict whatever the
  rounding). Such a query is solved with the rounding allowed: refuted so, the region is empty; its model
  is kept when the engine agrees, else the query is solved again with the exact values (no rounding) for
  a model away from the boundary. Where a range is unbounded the rounding has no bound and the query stays
  inexact. An inexact query that is refuted is still empty when its exact literals alone are refuted;
- what the translation cannot model is relaxed, never guessed: a literal it cannot take is left out,
  a pattern test on a string is a free Bool (`pattern_atom`); a refuted relaxation refutes the query;
- each query has a deterministic resource limit (`rlimit`, z3's count of internal steps, not wall
  time), so the same input gives the same answer on any machine; "unknown" means undecided.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

from sopgraph.language import ir, scalars
from sopgraph.logic.guards import weighted_as_counts

if TYPE_CHECKING:  # pragma: no cover
    from sopgraph.logic.formula import Formula


class Space(Protocol):
    """What the translation reads of a `domain.Space`. A protocol, so that the solver does not import
    the domain that calls it (no import cycle, not even for type checking)."""

    scenario: ir.Scenario
    names: list[str]
    index: dict[str, int]
    kinds: list[str]
    values: list[tuple]
    dates: set[int]
    full_doms: tuple
    res_exprs: list[Any]
    strings: set[int]
    text_enums: set[int]
    optional: set[int]
    string_samples: dict[int, tuple[str, str]]

    def pick(self, i: int, d: Any, style: str, rng: random.Random | None) -> Any: ...

    def box_contains(self, box: Any, values: dict) -> bool: ...


class Box(Protocol):
    """What the translation reads of a `domain.Box`: per-variable domains and residual literals."""

    doms: tuple
    resid: frozenset

DAY_SECONDS = 86_400
RLIMIT = 5_000_000  # z3 resource units per query (deterministic); a scoring SOP needs ~1e5
MAX_TERMS = 20_000  # expression nodes translated per query before giving up (undecided)
VARIANT_LENGTH = 40  # candidate strings up to this long are also tried with one character changed
VARIANT_CHARS = "1a9zZ_- ."  # the characters tried there: another digit, letter, case, separator
MAX_MEMO = 50_000  # distinct queries remembered per space (answers and their terms), then forgotten
UNIT_ROUNDOFF = 2.0 ** -53  # a float operation's relative error (round to nearest)


class _Unsupported(Exception):
    """A construct the translation does not model (division, opaque values): undecided."""


def available() -> bool:
    """Whether the solver package is installed (it is a declared dependency; kept optional so the
    domain degrades to its witness search rather than failing)."""
    try:
        import z3  # noqa: F401  heavy optional dependency, imported on first use
    except ImportError:  # pragma: no cover - installed with sopgraph
        return False
    return True


def solve(space: Space, box: Box) -> tuple[dict[str, Any] | None, bool | None]:
    """(assignment, proven_empty) for a box with residual predicates. The assignment is a full
    candidate for every base variable (the caller verifies it); proven_empty is True only for an
    exact query the solver refuted, None for an inexact one it refuted (only float rounding could
    still satisfy it), False otherwise."""
    if not box.resid:
        return None, False
    try:
        import z3  # heavy optional dependency, imported on first residual query
    except ImportError:  # pragma: no cover
        return None, False
    tr = _Translator(space, box, z3)
    goal: list[Any] = []
    exact_goal: list[Any] = []  # the literals whose translation is exact (see below)
    for rid, truth in sorted(box.resid):
        was_exact, tr.exact = tr.exact, True
        tr.lit_rounds = set()
        try:
            term = tr.literal(rid, truth)
        except (_Unsupported, RecursionError, z3.Z3Exception):
            # left out: the rest still decides (an empty rest is an empty box; a model of the rest
            # is a candidate the caller verifies against every literal, this one included), and what
            # its partial translation saw does not make the rest inexact
            tr.exact = True
            continue
        finally:
            literal_exact, tr.exact = tr.exact, was_exact and tr.exact
        goal.append(term)
        if literal_exact and not tr.lit_rounds:
            exact_goal.append(term)
    if not goal:
        return None, False
    linear = tr.exact and not tr.reals
    rounded = sorted(tr.rounds_used)
    loose = tr.rounding_bounds(rounded) if rounded and tr.exact else None
    if loose is not None:  # the rounding allowed: a refutation is a proof; a model is usually a member
        result, model = _check(z3, tr, goal + loose, None)
        if result == z3.unsat:
            return None, True
        if result == z3.sat and model is not None:
            w = tr.assignment(model)
            if w is not None and space.box_contains(box, w):
                return w, False
    # the exact values (R = T): the model to try when the rounding's was none (it sits on a boundary)
    tied = [tr.rounded[t][0] == tr.rounded[t][1] for t in rounded]
    result, model = _check(z3, tr, goal + tied, "QF_LIA" if linear else None)
    if result == z3.unsat:
        if tr.exact and not rounded:
            return None, True
        # Refuted over the rationals with unbounded float arithmetic somewhere: rounding might still satisfy
        # it, unless the literals without float arithmetic are already contradictory on their own
        # (`count(…) != 0` beside an item that is not returned, next to a sum of prices).
        if exact_goal and len(exact_goal) < len(goal) and _check(z3, tr, exact_goal, None)[0] == z3.unsat:
            return None, True
        return None, None
    if result != z3.sat or model is None:
        return None, False
    return tr.assignment(model), False


def _check(z3: Any, tr: _Translator, goal: list[Any], logic: str | None) -> tuple[Any, _Model | None]:
    """z3's verdict on the box's domains and `goal` within the deterministic budget, and its model.

    The query is copied into a context of its own (`translate`, done inside z3) and solved there: the
    solver's choices follow the ids of the terms it sees, and in the space's context those ids depend on
    every query asked before (and on which ones the domain's memos skipped). A fresh context numbers
    the query's terms by its own structure, so the same question gets the same answer whatever the
    process did earlier, and the resource limit counts this query alone.

    The answer is therefore a function of the query alone, and it is memoised per space (`_query_key`):
    boxes that differ only in variables the residuals do not read ask the same query (on a list of order
    lines, two of three queries repeat), and each distinct query then costs one context and one solve."""
    terms = [*tr.domains(), *goal]
    key = _query_key(terms, logic)
    hit = tr.checks.get(key)
    if hit is not None:
        return hit[0], hit[1]
    ctx = z3.Context()
    query = [t.translate(ctx) for t in terms]
    # z3's plain SMT core first: 4-10 times faster than its tactic for the logic on these small queries (the
    # QF_LIA tactic's preprocessing was 22 ms of a 23 ms query); the tactic when the core gives up
    for solver in (z3.SimpleSolver(ctx=ctx), z3.SolverFor(logic, ctx=ctx) if logic else z3.Solver(ctx=ctx)):
        solver.set("rlimit", RLIMIT)
        try:
            solver.add(*query)
            result = solver.check()
        except z3.Z3Exception:  # pragma: no cover - resource exhaustion surfaces as unknown
            result = None
        if result == z3.sat or result == z3.unsat:
            break
    model = _Model(z3, solver.model()) if result == z3.sat else None
    if len(tr.checks) >= MAX_MEMO:
        tr.checks.clear()
    # the terms are kept with the answer: z3 reuses the id of a term nobody holds, and the key must
    # never come to name another query
    tr.checks[key] = (result, model, terms)
    tr.stats["solved"] = tr.stats.get("solved", 0) + 1
    return result, model


def _query_key(terms: list[Any], logic: str | None) -> tuple:
    """The query as the ids of its terms in the space's context. z3 shares structurally equal terms
    (one id per distinct term of a context), so equal keys are equal queries; far cheaper than the
    query's text (`sexpr`). Sound only while the terms stay alive (see `_check`)."""
    return (logic, *(t.get_id() for t in terms))


class _Model:
    """What a model says of the query's constants, read out once (as Python values) so that the model's
    context can be released and a memoised answer costs no z3 call. A constant the model leaves out
    takes z3's completion default (false, 0)."""

    def __init__(self, z3: Any, model: Any):
        self.values: dict[str, Any] = {}
        try:  # the model's text in one call: the z3 API costs ~4 calls per constant (6 ms on 30 of them)
            self.values = _read_model(model.sexpr())
        except (ValueError, ZeroDivisionError):  # pragma: no cover - a form the reader does not know
            self.values = {}
            self._read_api(z3, model)

    def _read_api(self, z3: Any, model: Any) -> None:
        for d in model.decls():
            name = d.name()
            if name[:1] not in ("v", "m", "p") or d.arity() != 0:  # z3's own functions (`/0`, ...)
                continue
            v = model[d]
            if z3.is_true(v) or z3.is_false(v):
                self.values[name] = z3.is_true(v)
            elif z3.is_int_value(v) or z3.is_rational_value(v):
                exact = Fraction(v.as_string())  # one call: `as_fraction` makes three
                self.values[name] = int(exact) if z3.is_int_value(v) else exact
            else:  # an algebraic number (an irrational root): no float stands for it
                self.values[name] = None

    def value(self, name: str, default: Any) -> Any:
        return self.values.get(name, default)


def _read_model(text: str) -> dict[str, Any]:
    """`(define-fun v3 () Real (/ 1.0 3.0))` ... → {"v3": Fraction(1, 3)}: the constants of a model's text (ints
    as int, reals as Fraction, an algebraic number as None); functions (`/0`) are skipped. Raises ValueError
    on a form it does not know."""
    out: dict[str, Any] = {}
    for chunk in text.split("(define-fun ")[1:]:
        head, _, rest = chunk.partition(")")
        name = head.split(" (", 1)[0]
        if head != f"{name} (" or name[:1] not in ("v", "m", "p"):
            continue  # a function with arguments, or a name the translation did not make
        sort, value = rest.split(None, 1)
        value = " ".join(value.split())
        if sort not in ("Int", "Real", "Bool") or not value.endswith(")"):
            raise ValueError(f"model entry {chunk[:40]!r}")
        value = value[:-1].strip()  # the define-fun's own parenthesis
        if sort == "Bool":
            if value not in ("true", "false"):
                raise ValueError(f"model bool {value[:20]!r}")
            out[name] = value == "true"
        elif value.startswith("(root-obj"):
            out[name] = None
        else:
            number = _number(value)
            out[name] = int(number) if sort == "Int" else number
    return out


def _number(text: str) -> Fraction:
    """`5`, `(- 5)`, `2.0`, `(/ 1.0 3.0)`, `(- (/ 7.0 2.0))` as exact fractions."""
    t = text.strip()
    if t.startswith("(- ") and t.endswith(")"):
        return -_number(t[3:-1])
    if t.startswith("(/ ") and t.endswith(")"):
        num, den = t[3:-1].split()
        return Fraction(num) / Fraction(den)
    return Fraction(t)


class _Translator:
    """IR expressions and domain formulas → z3 terms over one box's variables."""

    def __init__(self, space: Space, box: Box, z3: Any):
        self.sp = space
        self.box = box
        self.z3 = z3
        self.vars: dict[int, Any] = {}
        self.absent: dict[int, Any] = {}  # optional variable -> the Bool "it is missing"
        self.patterns: dict[tuple[int, str], Any] = {}  # (string variable, pattern) -> the Bool "it matches"
        # Terms do not depend on the box (its domains are added separately), so translations of
        # residuals and derived variables are kept on the space and reused by every later query:
        # the z3 Python API costs far more than the solving on list-heavy SOPs. Enum ids are shared
        # for the same reason.
        # Each space has its own z3 context: terms, their ids and the solver's heuristics then depend only on
        # this space's queries, never on what other analyses did earlier in the process (determinism).
        shared = space.__dict__.get("_z3_shared")
        if shared is None:
            shared = space.__dict__["_z3_shared"] = {"memo": {}, "enums": {}, "patterns": {}, "doms": {},
                                                     "checks": {}, "stats": {}, "atoms": {}, "shapes": {},
                                                     "rounded": {}, "ctx": z3.Context()}
        self.ctx = shared["ctx"]
        self.memo: dict[Any, tuple[tuple[str, Any], bool, bool, int, frozenset[Any]]] = shared["memo"]
        self.enum_ids: dict[str, int] = shared["enums"]
        self.pattern_ids: dict[tuple[int, str], int] = shared["patterns"]
        self.dom_memo: dict[tuple[int, Any], tuple[Any, bool]] = shared["doms"]
        self.checks: dict[tuple, tuple[Any, _Model | None, list[Any]]] = shared["checks"]  # see `_check`
        self.atoms: dict[str, Any] = shared["atoms"]  # name -> the variable's z3 constant
        self.stats: dict[str, int] = shared["stats"]  # "solved": distinct queries solved (for tests, benchmarks)
        # numeric term id -> (term, shape): how the engine computes it, for its rounding error (`rounding_error`)
        self.shapes: dict[int, tuple[Any, tuple]] = shared["shapes"]
        # computed float term id -> (its own variable, the term, its shape): see the module docstring
        self.rounded: dict[int, tuple[Any, Any, tuple]] = shared["rounded"]
        self.rounds_used: set[int] = set()  # those the query compares
        self.lit_rounds: set[int] = set()  # those the literal being translated compares
        # base variables (and `missing`, pattern tests: see `missing_var`, `pattern_atom`) read by the
        # translations in progress
        self.reading: list[set[Any]] = []
        self.exact = True
        self.reals = False  # a float variable or constant: z3's general solver, not QF_LIA
        self.terms = 0

    def memoized(self, key: Any, build: Any) -> tuple[str, Any]:
        """`build()` once per space: later queries get its term, flags, size and base variables."""
        hit = self.memo.get(key)
        if hit is None:
            saved = (self.exact, self.reals, self.terms)
            self.exact, self.reals, self.terms = True, False, 0
            self.reading.append(set())
            try:
                term = build()
            finally:
                used = self.reading.pop()
                exact, reals, terms = self.exact, self.reals, self.terms
                self.exact, self.reals = saved[0] and exact, saved[1] or reals
                self.terms = saved[2] + terms
            self.memo[key] = (term, exact, reals, terms, frozenset(used))
            for outer in self.reading:
                outer.update(used)
            if self.terms > MAX_TERMS:
                raise _Unsupported("too large")
            return term
        term, exact, reals, terms, reads = hit
        for i in reads:
            if isinstance(i, tuple) and i[0] == "round":
                self.round_used(i[1])
            elif isinstance(i, tuple):
                self.pattern_atom(*i)
            elif i >= 0:
                self.base(i)
            else:
                self.missing_var(-i - 1)
        self.exact, self.reals = self.exact and exact, self.reals or reals
        self.terms += terms
        if self.terms > MAX_TERMS:
            raise _Unsupported("too large")
        return term

    # -- variables -------------------------------------------------------------------------------

    def enum_id(self, value: str) -> int:
        return self.enum_ids.setdefault(value, len(self.enum_ids))

    def base(self, i: int) -> tuple[str, Any]:
        for reading in self.reading:
            reading.add(i)
        kind = self.sp.kinds[i]
        x = self.vars.get(i)
        if x is None:
            if kind not in ("bool", "float", "int", "enum"):
                raise _Unsupported(kind)
            name = f"v{i}"
            x = self.atoms.get(name)
            if x is None:  # once per space, like the translations that use it
                make = self.z3.Bool if kind == "bool" else self.z3.Real if kind == "float" else self.z3.Int
                x = self.atoms[name] = make(name, self.ctx)
                if kind != "bool":
                    self.note_shape(x, ("v", i))
            self.vars[i] = x
        if kind == "float":
            self.reals = True
        if kind == "enum":
            return "enum", x
        return ("bool" if kind == "bool" else "num"), x

    def missing_var(self, i: int) -> Any:
        """`missing(X)` as a free Bool. Reads of `X` are not tied to it: that admits more than the
        engine does (it refuses a read of a missing value), so "unsat" stays sound; a model is
        re-checked by the caller."""
        for reading in self.reading:
            reading.add(-i - 1)  # recorded apart from the value's own reads (see `memoized`)
        x = self.absent.get(i)
        if x is None:
            name = f"m{i}"
            x = self.atoms.get(name)
            if x is None:
                x = self.atoms[name] = self.z3.Bool(name, self.ctx)
            self.absent[i] = x
        return x

    def pattern_atom(self, i: int, pattern: str) -> Any:
        """`X matches "pattern"` for a string `X` as a free Bool, one per (variable, pattern). Two patterns
        on one string are not tied together: that admits more than the engine does, so "unsat" stays
        sound; `assignment` then looks for a string with the truths the model gives (the caller
        re-checks it)."""
        for reading in self.reading:
            reading.add((i, pattern))  # replayed by `memoized` like a variable read
        x = self.patterns.get((i, pattern))
        if x is None:  # named by a number the space keeps: memoized terms of earlier queries use the same Bool
            number = self.pattern_ids.setdefault((i, pattern), len(self.pattern_ids))
            x = self.patterns[i, pattern] = self.z3.Bool(f"p{number}", self.ctx)
        return x

    def dom(self, i: int, d: Any) -> Any:
        """The constraint "variable i lies in domain d" (a mask for enums/bools, a NumDom else), built once
        per space: the z3 Python API costs far more than the solving (a box has a domain per variable)."""
        _, x = self.base(i)
        hit = self.dom_memo.get((i, d))
        if hit is None:
            saved, self.reals = self.reals, False
            hit = self.dom_memo[i, d] = (self._dom(i, d, x), self.reals)
            self.reals = saved
        self.reals = self.reals or hit[1]
        return hit[0]

    def _dom(self, i: int, d: Any, x: Any) -> Any:
        z3 = self.z3
        kind = self.sp.kinds[i]
        if kind in ("enum", "bool"):
            vals = [v for j, v in enumerate(self.sp.values[i]) if d >> j & 1]
            if kind == "bool":
                if len(vals) == 2:
                    return z3.BoolVal(True, self.ctx)
                return z3.BoolVal(False, self.ctx) if not vals else (x if vals[0] else z3.Not(x))
            if i in self.sp.text_enums and d & 1:  # the first value stands for every other text
                others = z3.And([x != self.enum_id(v) for v in self.sp.values[i][1:]], self.ctx)
                return z3.Or([x == self.enum_id(v) for v in vals[1:]] + [others], self.ctx)
            return z3.Or([x == self.enum_id(v) for v in vals], self.ctx) if vals else z3.BoolVal(False, self.ctx)
        parts = []
        if d.lo != -math.inf:
            lo = self.num(d.lo)
            parts.append(x > lo if d.lo_open else x >= lo)
        if d.hi != math.inf:
            hi = self.num(d.hi)
            parts.append(x < hi if d.hi_open else x <= hi)
        parts += [x != self.num(e) for e in d.excl]
        if i in self.sp.dates:  # a date is a whole day of seconds (its midnight, UTC)
            parts.append(x % DAY_SECONDS == 0)
        return z3.And(parts, self.ctx) if parts else z3.BoolVal(True, self.ctx)

    def num(self, value: float) -> Any:
        if isinstance(value, bool):
            raise _Unsupported("bool as number")
        if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
            return self.z3.IntVal(int(value), self.ctx)
        if not math.isfinite(value):
            raise _Unsupported("non-finite constant")
        self.reals = True
        exact = Fraction(value)  # the float itself, not the decimal it was written as
        return self.z3.RealVal(f"{exact.numerator}/{exact.denominator}", self.ctx)

    def domains(self) -> list[Any]:
        doms = self.box.doms
        # in variable order: a query replayed from memoised translations reads its variables in
        # another order than the one that built them, and must still be the same query (`_query_key`)
        present = [self.z3.Not(self.absent[i]) for i in sorted(self.absent) if doms[i] != self.sp.full_doms[i]]
        return [self.dom(i, doms[i]) for i in sorted(self.vars)] + present

    # -- residual literals -----------------------------------------------------------------------

    def literal(self, rid: int, truth: bool) -> Any:
        pred = self.sp.res_exprs[rid]
        if type(pred).__name__ == "Formula":  # translated once per space, like an expression's
            _, f = self.memoized(("resid", rid), lambda: ("bool", self.formula(pred)))
        else:
            kind, f = self.memoized(("resid", rid), lambda: self.expr(pred))
            if kind != "bool":
                raise _Unsupported("non-boolean residual")
        return f if truth else self.z3.Not(f)

    def formula(self, f: Formula) -> Any:
        z3 = self.z3
        self.tick()
        if f.kind == "T":
            return z3.BoolVal(True, self.ctx)
        if f.kind == "F":
            return z3.BoolVal(False, self.ctx)
        if f.kind == "atom":
            return self.dom(f.var, f.dom)
        if f.kind == "and":
            return z3.And([self.formula(p) for p in f.parts], self.ctx)
        if f.kind == "or":
            return z3.Or([self.formula(p) for p in f.parts], self.ctx)
        return self.literal(f.rid, f.truth)

    def tick(self) -> None:
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise _Unsupported("too large")

    # -- expressions -----------------------------------------------------------------------------

    def expr(self, e: Any) -> tuple[str, Any]:  # noqa: C901 - one case per IR node
        z3 = self.z3
        self.tick()
        if isinstance(e, ir.Lit):
            v = e.value
            if isinstance(v, bool):
                return "bool", z3.BoolVal(v, self.ctx)
            if isinstance(v, (int, float)):
                return "num", self.num(v)
            return "enum", z3.IntVal(self.enum_id(v), self.ctx)
        if isinstance(e, ir.TimeLit):  # dates, datetimes and durations are seconds, as in the space
            return "num", self.num(e.value)
        if isinstance(e, ir.Var):
            return self.var(e.name)
        if isinstance(e, ir.Func):
            return self.func(e)
        if isinstance(e, ir.Unary):
            kind, x = self.expr(e.operand)
            if e.op == "not":
                return "bool", z3.Not(self.truthy(kind, x))
            return "num", self.note_shape(-x, ("neg", self.shape(x)))
        if isinstance(e, ir.Binary):
            if e.op == "/":
                raise _Unsupported("division")
            (_, a), (_, b) = self.expr(e.left), self.expr(e.right)
            if e.op == "*" and not (self.is_const(a) or self.is_const(b)):
                self.exact = False  # nonlinear: z3 may answer unknown, never trust unsat blindly
            # float arithmetic rounds, z3's rationals do not: its bound is added where the value is compared
            real = bool(self.z3.is_real(a) or self.z3.is_real(b))
            out = a + b if e.op == "+" else a - b if e.op == "-" else a * b
            return "num", self.note_shape(out, (e.op, real, self.shape(a), self.shape(b)))
        if isinstance(e, ir.Compare):
            (_, a), (_, b) = self.expr(e.left), self.expr(e.right)
            a, b = self.settled(a), self.settled(b)
            ops = {"==": lambda: a == b, "!=": lambda: a != b, "<": lambda: a < b, "<=": lambda: a <= b,
                   ">": lambda: a > b, ">=": lambda: a >= b}
            return "bool", ops[e.op]()
        if isinstance(e, ir.InSet):
            kind, x = self.expr(e.operand)
            x = self.settled(x) if kind == "num" else x
            hits = [x == self.settled(self.expr(v)[1]) for v in e.values]
            inside = z3.Or(hits) if hits else z3.BoolVal(False, self.ctx)
            return "bool", (z3.Not(inside) if e.negated else inside)
        if isinstance(e, ir.BoolOp):
            parts = [self.truthy(*self.expr(o)) for o in e.operands]
            return "bool", (z3.And(parts, self.ctx) if e.op == "and" else z3.Or(parts, self.ctx))
        if isinstance(e, ir.Weighted):  # as the sum of counts it equals (`guards.weighted_as_counts`)
            return self.expr(weighted_as_counts(e))
        if isinstance(e, ir.Call):
            if e.func == "count":
                total = z3.Sum([z3.If(self.truthy(*self.expr(a)), 1, 0, self.ctx) for a in e.args])
                return "num", self.note_shape(total, ("c", float(len(e.args))))
            args = [self.expr(a)[1] for a in e.args]
            best = args[0]
            for x in args[1:]:
                # which one the engine picks depends on the computed values: compared as computed
                sx, sb = self.settled(x), self.settled(best)
                pick = z3.If(sx < sb, x, best) if e.func == "min" else z3.If(sx > sb, x, best)
                best = self.note_shape(pick, ("ite", self.shape(x), self.shape(best)))
            return "num", best
        if isinstance(e, ir.Matches) and isinstance(e.operand, ir.Var):
            i = self.sp.index.get(e.operand.name)
            if i is not None and i in self.sp.strings:
                return "bool", self.pattern_atom(i, e.pattern)
        if isinstance(e, ir.CaseExpr):
            kind, out = self.expr(e.otherwise)
            for arm in reversed(e.arms):
                k2, then = self.expr(arm.then)
                if k2 != kind:
                    raise _Unsupported("mixed case results")
                picked = z3.If(self.truthy(*self.expr(arm.when)), then, out)
                out = self.note_shape(picked, ("ite", self.shape(then), self.shape(out))) if kind == "num" else picked
            return kind, out
        raise _Unsupported(type(e).__name__)

    def func(self, e: ir.Func) -> tuple[str, Any]:
        """`abs(x)` exactly; `days_between(a, b)` as (b - a) / 1 day over the reals, which the engine
        computes in floats (whole days exactly, fractions rounded): such a query is inexact. `missing`
        is not modelled (absence is decided before the solver, `Space._reads_missing`)."""
        z3 = self.z3
        if e.name == "abs" and len(e.args) == 1:
            _, x = self.expr(e.args[0])
            return "num", self.note_shape(z3.If(self.settled(x) < 0, -x, x), ("neg", self.shape(x)))
        if e.name == "days_between" and len(e.args) == 2:
            (_, a), (_, b) = self.expr(e.args[0]), self.expr(e.args[1])
            self.exact = False
            self.reals = True
            return "num", z3.ToReal(b - a) / z3.RealVal(DAY_SECONDS, self.ctx) if not z3.is_real(b - a) else (b - a) / DAY_SECONDS
        if e.name == "missing" and len(e.args) == 1 and isinstance(e.args[0], ir.Var):
            i = self.sp.index.get(e.args[0].name)
            if i is not None and i in self.sp.optional:
                return "bool", self.missing_var(i)
        raise _Unsupported(f"function {e.name}")

    # -- float rounding (see the module docstring) -------------------------------------------------

    def note_shape(self, term: Any, shape: tuple) -> Any:
        """Remember how the engine computes numeric `term` (kept with the term: an id names it while it lives)."""
        self.shapes.setdefault(term.get_id(), (term, shape))
        return term

    def shape(self, term: Any) -> tuple:
        hit = self.shapes.get(term.get_id())
        if hit is not None:
            return hit[1]
        if self.z3.is_int_value(term) or self.z3.is_rational_value(term):
            return ("c", abs(float(Fraction(term.as_string()))))
        return ("?",)  # not known: no bound on its rounding

    def settled(self, term: Any) -> Any:
        """The value the engine compares: `term` itself, or for one computed with float arithmetic a variable
        of its own (the same for every comparison of the same computation), tied to it by the query."""
        if not self.z3.is_real(term) or not _rounds(self.shape(term)):
            return term
        key = term.get_id()
        hit = self.rounded.get(key)
        if hit is None:
            hit = self.rounded[key] = (self.z3.Real(f"r{len(self.rounded)}", self.ctx), term, self.shape(term))
        self.round_used(key)
        return hit[0]

    def round_used(self, key: int) -> None:
        for reading in self.reading:
            reading.add(("round", key))  # replayed by `memoized` like a variable read
        self.rounds_used.add(key)
        self.lit_rounds.add(key)

    def rounding_bounds(self, keys: list[int]) -> list[Any] | None:
        """`|R - T| <= error` for each rounded value of the query on this box's ranges; None when one has no
        bound (a range without an end)."""
        out = []
        for key in keys:
            r, t, shape = self.rounded[key]
            err = rounding_error(shape, self.box.doms)
            if not math.isfinite(err):
                return None
            e = Fraction(err)
            bound = self.z3.RealVal(f"{e.numerator}/{e.denominator}", self.ctx)
            out += [r - t <= bound, t - r <= bound]
        return out

    def is_const(self, x: Any) -> bool:
        return bool(self.z3.is_int_value(x) or self.z3.is_rational_value(x))

    def truthy(self, kind: str, x: Any) -> Any:
        if kind == "bool":
            return x
        if kind == "num":
            return self.settled(x) != 0
        raise _Unsupported("enum as condition")

    def var(self, name: str) -> tuple[str, Any]:
        v = self.sp.scenario.variables.get(name)
        if v is None:
            raise _Unsupported(f"unknown variable {name}")
        if v.role != "derived":
            return self.base(self.sp.index[name])
        if v.expr is None:
            raise _Unsupported("derived variable without expression")
        expr = v.expr
        return self.memoized(("let", name), lambda: self.expr(expr))

    # -- models ----------------------------------------------------------------------------------

    def matching_string(self, model: _Model, i: int, picked: Any) -> Any:
        """A value of string variable `i` that matches exactly the patterns the model says it matches:
        the box's pick, its plausible samples, or an example built from one of the patterns; the pick
        when none fits (the caller's check then refuses the assignment)."""
        wanted = [(p, bool(model.value(f"p{self.pattern_ids[j, p]}", False))) for j, p in self.patterns if j == i]
        candidates: list[Any] = [picked, *self.sp.string_samples.get(i, ())]
        for p, _truth in wanted:
            try:
                candidates += [c for c in scalars.pattern_examples(p) if c is not None]
            except (scalars.OutsideSubset, ValueError, RecursionError):
                continue
        for c in candidates:
            if isinstance(c, str) and all(scalars.matches(p, c) == truth for p, truth in wanted):
                return c
        # one pattern's example with one character changed: `ORD-100000` matches `ORD-[0-9]{6}` and not
        # `ORD-0.*`, where every example above starts `ORD-0`
        for c in candidates:
            if not isinstance(c, str) or len(c) > VARIANT_LENGTH:
                continue
            for k in range(len(c)):
                for ch in VARIANT_CHARS:
                    v = c[:k] + ch + c[k + 1:]
                    if v != c and all(scalars.matches(p, v) == truth for p, truth in wanted):
                        return v
        return picked

    def assignment(self, model: _Model) -> dict[str, Any] | None:
        """Every base variable: the model's value where the query constrained it, else a pick
        from the box (the caller verifies the whole assignment)."""
        sp = self.sp
        tested = {j for j, _pattern in self.patterns}  # string variables a pattern test reads
        names = {v: k for k, v in self.enum_ids.items()}
        out: dict[str, Any] = {}
        for i, n in enumerate(sp.names):
            if i in self.absent and model.value(f"m{i}", False):
                out[n] = None
                continue
            if i not in self.vars:
                out[n] = sp.pick(i, self.box.doms[i], "representative", None)
                if i in tested:
                    out[n] = self.matching_string(model, i, out[n])
                continue
            kind = sp.kinds[i]
            if kind == "bool":
                out[n] = bool(model.value(f"v{i}", False))
            elif kind == "enum":
                out[n] = names.get(model.value(f"v{i}", 0))
                if i in sp.text_enums and not isinstance(out[n], str):  # some other text: its sample
                    out[n] = sp.values[i][0]
            elif kind == "int":
                out[n] = model.value(f"v{i}", 0)
            else:
                frac = model.value(f"v{i}", Fraction(0))
                if frac is None:
                    return None
                out[n] = float(frac)
        return out


def _rounds(shape: tuple) -> bool:
    """Whether a value so computed may be rounded: some float `+`, `-` or `*` in it, or an unknown part."""
    kind = shape[0]
    if kind in ("+", "-", "*"):
        return bool(shape[1]) or _rounds(shape[2]) or _rounds(shape[3])
    if kind in ("neg", "ite"):
        return any(_rounds(s) for s in shape[1:])
    return kind == "?"


def rounding_error(shape: tuple, doms: tuple) -> float:
    """A bound on |engine's float result - exact rational value| of a computation of this shape when every
    variable lies in its domain (`doms`); inf when a range has no end. Each float operation errs by at most
    the unit roundoff of its result's magnitude; the bound counts it twice, and an int operand converted to
    a float as well (beyond 2**53 it rounds), so it is generous: it only has to be a bound."""
    return _err_mag(shape, doms)[0] * 2 + 1e-300


def _err_mag(shape: tuple, doms: tuple) -> tuple[float, float]:
    """(error bound, bound on the magnitude of the exact value)."""
    kind = shape[0]
    if kind == "c":
        return 0.0, shape[1]
    if kind == "v":
        d = doms[shape[1]]
        lo, hi = getattr(d, "lo", -math.inf), getattr(d, "hi", math.inf)
        return 0.0, max(abs(lo), abs(hi))
    if kind == "neg":
        return _err_mag(shape[1], doms)
    if kind == "ite":
        (ea, ma), (eb, mb) = _err_mag(shape[1], doms), _err_mag(shape[2], doms)
        return max(ea, eb), max(ma, mb)
    if kind in ("+", "-", "*"):
        (ea, ma), (eb, mb) = _err_mag(shape[2], doms), _err_mag(shape[3], doms)
        if not all(math.isfinite(x) for x in (ea, ma, eb, mb)):
            return math.inf, math.inf
        real = shape[1]
        if kind == "*":
            mag = ma * mb
            err = ma * eb + mb * ea + ea * eb
            if real:
                err += UNIT_ROUNDOFF * (ma + ea) * (mb + eb) + UNIT_ROUNDOFF * (ma * (mb + eb) + mb * (ma + ea))
            return err, mag
        mag = ma + mb
        err = ea + eb
        if real:
            err += UNIT_ROUNDOFF * (mag + ea + eb) + UNIT_ROUNDOFF * mag
        return err, mag
    return math.inf, math.inf
