"""Constraint domains (`sopgraph.logic.domain`): exactness and soundness against the reference engine.

The central property: for a guard `g` and truth `t`, an assignment lies in one of the boxes of
`constrain(full, g, t)` exactly when the engine evaluates `g` without error to truthiness `t`
(residual predicates are part of box membership). Every witness must satisfy that too.
"""

from __future__ import annotations

import math
import random
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sopgraph.language import ir
from sopgraph.language.parse import load_source
from sopgraph.logic.checker import check
from sopgraph.logic.domain import (
    INF,
    NumDom,
    constrain,
    full_box,
    is_feasible,
    num_meet,
    num_norm,
    num_union,
    space_for,
    witness,
)
from sopgraph.logic.engine import DecideError, Interpreter

DECLS = """
scenario domaintest "Domain test"
field E: A | B | C
field F: bool
field G: bool
system N: int[0..20]
system X: float[-5..5]
system P: int[0..)
let D = N * 2 + 1
let H = P * 0.5 + 10
let S = N + X
action Ok "ok"
"""


@cache
def guard_of(text: str) -> tuple[ir.Scenario, Any]:
    """Scenario + parsed guard expression (one cached scenario per guard text)."""
    src = DECLS + f'stage s "s" {{\n    when {text} -> do Ok\n    otherwise -> do Ok\n}}\n'
    loaded = load_source(None, text=src)
    assert loaded.scenario is not None and not [d for d in loaded.diagnostics if d.is_error], (
        text, [d.message for d in loaded.diagnostics])
    return loaded.scenario, loaded.scenario.stages["s"].branches[0].guard


def evaluate(scenario: ir.Scenario, expr: Any, values: dict[str, Any]) -> Any:
    """The engine's value of an expression, or an `error` marker."""
    try:
        return Interpreter(scenario, values).eval(expr)
    except (DecideError, TypeError, ArithmeticError):
        return ERROR


ERROR = object()


def members(scenario: ir.Scenario, boxes: list[Any], values: dict[str, Any]) -> bool:
    sp = space_for(scenario)
    return any(sp.box_contains(b, values) for b in boxes)


# ---------------------------------------------------------------------------------------------
# Strategies: guard texts over the declarations above, and full assignments

INTS = st.integers(min_value=-2, max_value=22)
FLOATS = st.sampled_from([-5.0, -4.5, -1.0, -0.1, 0.0, 0.1, 0.3, 0.5, 1.0, 2.5, 4.99, 5.0])

ATOMS = st.one_of(
    st.sampled_from(["E == A", "E != B", "E in {A, C}", "E not in {B}", "F", "not G", "F == true",
                     "G != false", "N * 0.1 > 0.3", "H > 100", "H == 60", "S > 3", "N > X",
                     "count(F, G, E == A) >= 2", "count(F, N > 10) == 1",
                     "case { when F -> N otherwise -> 7 } > 5", "min(N, 12) >= 9", "max(N, 3) < 5",
                     "N / 2 > 4", "-N < -3", "P > 0", "P == 0", "N == 2.5", "X != 0", "D in {3, 5, 9}"]),
    st.builds(lambda op, k: f"N {op} {k}", st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), INTS),
    st.builds(lambda op, k: f"X {op} {k}", st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), FLOATS),
    st.builds(lambda op, k: f"D {op} {k}", st.sampled_from(["<", ">=", "==", "!="]), st.integers(-1, 45)),
    st.builds(lambda op, k: f"X * 2 - 1 {op} {k}", st.sampled_from(["<", ">", "=="]), FLOATS),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda a, b: f"({a}) and ({b})", children, children),
        st.builds(lambda a, b: f"({a}) or ({b})", children, children),
        st.builds(lambda a: f"not ({a})", children),
    )


GUARDS = st.recursive(ATOMS, _combine, max_leaves=4)

ASSIGNMENTS = st.fixed_dictionaries({
    "E": st.sampled_from(["A", "B", "C"]),
    "F": st.booleans(),
    "G": st.booleans(),
    "N": st.integers(min_value=0, max_value=20),
    "X": st.one_of(FLOATS, st.floats(min_value=-5, max_value=5, allow_nan=False)),
    "P": st.one_of(st.integers(min_value=0, max_value=400), st.sampled_from([0, 1, 180, 181, 10**6])),
})

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(GUARDS, st.booleans(), st.lists(ASSIGNMENTS, min_size=1, max_size=8))
def test_constrain_is_exact_on_assignments(text: str, truth: bool, assignments: list[dict]) -> None:
    scenario, guard = guard_of(text)
    boxes = constrain(scenario, full_box(scenario), guard, truth)
    for values in assignments:
        v = evaluate(scenario, guard, values)
        expected = v is not ERROR and bool(v) == truth
        assert members(scenario, boxes, values) == expected, (text, truth, values, boxes)


@SETTINGS
@given(GUARDS, st.booleans())
def test_every_witness_satisfies_its_box(text: str, truth: bool) -> None:
    scenario, guard = guard_of(text)
    sp = space_for(scenario)
    for box in constrain(scenario, full_box(scenario), guard, truth):
        for style in ("representative", "boundary"):
            w = witness(scenario, box, style=style)
            if box.exact:
                assert w is not None, (text, box)
            if w is None:
                continue
            assert set(w) == {"E", "F", "G", "N", "X", "P"}
            assert sp.box_contains(box, w)
            v = evaluate(scenario, guard, w)
            assert v is not ERROR and bool(v) == truth, (text, truth, w)


@SETTINGS
@given(GUARDS, GUARDS, st.booleans(), st.booleans(), st.lists(ASSIGNMENTS, min_size=1, max_size=6))
def test_sequential_constraints_intersect(t1: str, t2: str, a: bool, b: bool, assignments: list[dict]) -> None:
    """Constraining twice keeps exactly the assignments satisfying both (as along a path)."""
    s1, g1 = guard_of(t1)
    s2, g2 = guard_of(t2)
    # both guards must live in one scenario: rebuild the second guard inside the first scenario
    src_stage = f'stage t "t" {{\n    when {t2} -> do Ok\n    otherwise -> do Ok\n}}\n'
    loaded = load_source(None, text=DECLS + f'stage s "s" {{\n    when {t1} -> t\n    otherwise -> t\n}}\n' + src_stage)
    sc = loaded.scenario
    assert sc is not None
    g1, g2 = sc.stages["s"].branches[0].guard, sc.stages["t"].branches[0].guard
    boxes = [c for box in constrain(sc, full_box(sc), g1, a) for c in constrain(sc, box, g2, b)]
    for values in assignments:
        v1, v2 = evaluate(sc, g1, values), evaluate(sc, g2, values)
        expected = v1 is not ERROR and bool(v1) == a and v2 is not ERROR and bool(v2) == b
        assert members(sc, boxes, values) == expected
    for box in boxes:
        feasible = is_feasible(sc, box)
        if feasible is False:  # a proof of emptiness: no sampled assignment may be inside
            rng = random.Random(0)
            for _ in range(50):
                values = {"E": rng.choice("ABC"), "F": rng.random() < 0.5, "G": rng.random() < 0.5,
                          "N": rng.randint(0, 20), "X": rng.uniform(-5, 5), "P": rng.randint(0, 300)}
                assert not space_for(sc).box_contains(box, values)


# ---------------------------------------------------------------------------------------------
# Exact examples


def regions(text: str, truth: bool = True) -> list[dict[str, str]]:
    scenario, guard = guard_of(text)
    return [b.constraints() for b in constrain(scenario, full_box(scenario), guard, truth)]


def test_linear_atom_over_derived_variable_is_solved_exactly() -> None:
    assert regions("H > 100") == [{"P": ">= 181"}]  # P * 0.5 + 10 > 100
    assert regions("H > 100", False) == [{"P": "<= 180"}]
    assert regions("H == 60") == [{"P": "== 100"}]
    assert regions("D in {3, 5, 9}") == [{"N": "== 1"}, {"N": "== 2"}, {"N": "== 4"}]


def test_float_rounding_is_respected() -> None:
    # 3 * 0.1 == 0.30000000000000004 > 0.3: the engine says true for N == 3
    assert regions("N * 0.1 > 0.3") == [{"N": ">= 3"}]
    scenario, guard = guard_of("N * 0.1 > 0.3")
    assert Interpreter(scenario, {"N": 3}).eval(guard) is True


def test_int_bounds_are_normalised_to_closed_integers() -> None:
    assert regions("N > 2.5") == [{"N": ">= 3"}]
    assert regions("N == 2.5") == []
    assert regions("N != 2.5") == [{}]
    assert regions("N < 0") == []
    assert regions("X > 1") == [{"X": "> 1"}]
    assert regions("X != 0") == [{"X": "!= 0"}]


def test_count_threshold_expands_to_disjoint_boxes() -> None:
    scenario, guard = guard_of("count(F, G, E == A) >= 2")
    boxes = constrain(scenario, full_box(scenario), guard, True)
    sp = space_for(scenario)
    hits = 0
    for e in "ABC":
        for f in (False, True):
            for g in (False, True):
                values = {"E": e, "F": f, "G": g, "N": 0, "X": 0.0, "P": 0}
                inside = [b for b in boxes if sp.box_contains(b, values)]
                assert len(inside) == (1 if (f + g + (e == "A")) >= 2 else 0)
                hits += len(inside)
    assert hits == 3 + 1 + 1  # F and G (any E), or exactly one of them with E == A


def test_relations_between_variables_are_residual_and_decided_by_search() -> None:
    scenario, guard = guard_of("N > X")
    boxes = constrain(scenario, full_box(scenario), guard, True)
    assert len(boxes) == 1 and not boxes[0].exact
    assert boxes[0].constraints() == {"where": "N > X"}
    assert is_feasible(scenario, boxes[0]) is True
    w = witness(scenario, boxes[0])
    assert w is not None and w["N"] > w["X"]
    # contradictory residual literals make an empty box
    both = [c for b in boxes for c in constrain(scenario, b, guard, False)]
    assert both == []


def test_residual_over_finite_domains_is_split_exactly() -> None:
    scenario, guard = guard_of("(E == A) == F")
    boxes = constrain(scenario, full_box(scenario), guard, True)
    assert all(b.exact for b in boxes)
    assert sorted(tuple(sorted(b.constraints().items())) for b in boxes) == [
        (("E", "A"), ("F", "true")), (("E", "B | C"), ("F", "false"))]


def test_witness_styles() -> None:
    scenario, guard = guard_of("P > 0")
    (box,) = constrain(scenario, full_box(scenario), guard, True)
    assert witness(scenario, box, style="boundary")["P"] == 1
    assert witness(scenario, box, style="representative")["P"] == 100
    (box,) = constrain(scenario, full_box(scenario), guard_of("H > 100")[1], True)
    assert witness(scenario, box, style="boundary")["P"] == 181
    assert witness(scenario, box, style="representative")["P"] == 200
    w = witness(scenario, full_box(scenario))
    assert w == {"E": "A", "F": False, "G": False, "N": 10, "X": 0.0, "P": 100}
    rng_w = [witness(scenario, full_box(scenario), rng=random.Random(7)) for _ in range(2)]
    assert rng_w[0] == rng_w[1]  # seeded: deterministic
    with pytest.raises(ValueError):
        witness(scenario, box, style="nope")


def test_box_is_hashable_and_interned() -> None:
    scenario, guard = guard_of("E == A")
    a = constrain(scenario, full_box(scenario), guard, True)
    b = constrain(scenario, full_box(scenario), guard, True)
    assert a[0] is b[0] and hash(a[0]) == hash(b[0])
    assert a[0]["E"] == frozenset({"A"})
    assert full_box(scenario)["N"] == NumDom(0, 20, False, False, frozenset())


# ---------------------------------------------------------------------------------------------
# Numeric domain algebra


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-10, 10), st.integers(-10, 10), st.booleans(), st.booleans(),
                          st.frozensets(st.integers(-10, 10), max_size=3)), min_size=2, max_size=2),
       st.booleans(), st.lists(st.sampled_from([x / 2 for x in range(-24, 25)]), max_size=20))
def test_num_meet_and_union_agree_with_membership(specs: list, is_int: bool, points: list[float]) -> None:
    doms = []
    for lo, hi, lo_open, hi_open, excl in specs:
        d = num_norm(min(lo, hi), max(lo, hi), lo_open, hi_open, excl, is_int)
        if d is None:
            return
        doms.append(d)
    a, b = doms

    def member(d: NumDom | None, x: float) -> bool:
        if d is None:
            return False
        if is_int and not float(x).is_integer():
            return False
        return d.contains(x)

    m = num_meet(a, b, is_int)
    u = num_union(a, b, is_int)
    for x in points:
        assert member(m, x) == (member(a, x) and member(b, x))
        if u is not None:
            assert member(u, x) == (member(a, x) or member(b, x)), (a, b, u, x)


def test_num_norm_edge_cases() -> None:
    assert num_norm(1, 1, True, False, frozenset(), False) is None
    assert num_norm(0, 3, False, False, frozenset({0, 3}), True) == NumDom(1, 2, False, False, frozenset())
    assert num_norm(0.5, 2.5, False, False, frozenset(), True) == NumDom(1, 2, False, False, frozenset())
    assert num_norm(-INF, INF, True, True, frozenset(), False) == NumDom(-INF, INF, False, False, frozenset())
    assert math.isinf(num_norm(0, INF, False, False, frozenset(), True).hi)


def _four_guards(declarations: str, guards: tuple[str, str, str, str]) -> tuple[ir.Scenario, list[Any]]:
    """A scenario of `declarations` and one stage with the four `guards` (then `otherwise`), and the guards."""
    arms = "".join(f"    when {g} -> do Ok\n" for g in guards)
    loaded = load_source(None, text=f'scenario t "t"\n{declarations}action Ok "ok"\n'
                                    f'stage s "s" {{\n{arms}    otherwise -> do Ok\n}}\n')
    assert loaded.scenario is not None
    return loaded.scenario, [b.guard for b in loaded.scenario.stages["s"].branches[:4]]


def test_an_equality_and_its_negation_written_the_other_way_are_one_literal() -> None:
    """`Given != OnFile` on a branch and `OnFile == Given` in an intent's `when:` are one residual literal
    (`==`, operands in a fixed order), so the domain sees at once that no values satisfy both; before,
    they were two unrelated literals and only a failed witness search ruled the pair out."""
    scenario, (ne, eq, floats_eq, floats_ne) = _four_guards(
        'field Given: string "g"\nsystem OnFile: string "o"\nsystem A: float[0..1] "a"\nsystem B: float[0..1] "b"\n',
        ("Given != OnFile", "OnFile == Given", "A == B", "B != A"))
    (box,) = constrain(scenario, full_box(scenario), ne, True)
    assert box.constraints() == {"where": "Given != OnFile"}  # shown as written, not `not (… == …)`
    assert constrain(scenario, box, eq, True) == []
    assert constrain(scenario, box, eq, False) == [box]
    (same,) = constrain(scenario, full_box(scenario), floats_eq, True)
    assert constrain(scenario, same, floats_ne, True) == []
    w = witness(scenario, box)
    assert w is not None and w["Given"] != w["OnFile"]


def test_a_literal_asked_for_false_is_shown_negated_whatever_was_written_for_true() -> None:
    """`missing(X)` or `A == B` constrained to false is `not missing(X)` / `A != B`, never the text of the
    literal as written for true (a box once read `missing(LastCredit)` where the value had to be there)."""
    scenario, (missing_guard, eq, _, _) = _four_guards(
        'system Last: date? "l"\nsystem A: float[0..1] "a"\nsystem B: float[0..1] "b"\n',
        ("missing(Last)", "A == B", "A > 0", "B > 0"))
    (present,) = constrain(scenario, full_box(scenario), missing_guard, False)
    assert present.constraints() == {"where": "not missing(Last)"}
    (differ,) = constrain(scenario, full_box(scenario), eq, False)
    assert differ.constraints() == {"where": "A != B"}


def test_an_ordering_and_its_negation_or_mirror_are_one_literal() -> None:
    """Over floats (no exact difference literals), `Claimed > Limit`, its mirror `Limit < Claimed` and its
    negation `Limit >= Claimed` are one literal; each is shown as it was first written."""
    scenario, (gt, mirror, negation, negation_mirror) = _four_guards(
        'system Claimed: float[0..) "c"\nsystem Limit: float[0..) "l"\n',
        ("Claimed > Limit", "Limit < Claimed", "Limit >= Claimed", "Claimed <= Limit"))
    (box,) = constrain(scenario, full_box(scenario), gt, True)
    assert box.constraints() == {"where": "Claimed > Limit"}
    assert constrain(scenario, box, mirror, True) == [box]
    assert constrain(scenario, box, negation, True) == [] == constrain(scenario, box, negation_mirror, True)
    (other,) = constrain(scenario, full_box(scenario), negation, True)
    assert other.constraints() == {"where": "Limit >= Claimed"}
    assert constrain(scenario, other, gt, True) == []
    w = witness(scenario, other)
    assert w is not None and w["Limit"] >= w["Claimed"]


_SCORES = [  # (weight, indicator) of two scores over nine shared inputs (the fraud-referral shape)
    [(2, "F4 == High4"), (1, "F7 == High7"), (1, "F3"), (3, "F2 > 700"), (2, "F6"), (3, "F5 > 750"), (3, "F8 > 150"),
     (3, "F0"), (1, "F1 == High1")],
    [(2, "F4 == High4"), (2, "F1 == High1"), (3, "F5 > 750"), (3, "F0"), (1, "F2 > 700"), (3, "F3"), (2, "F8 > 150"),
     (2, "F6"), (3, "F7 == High7")],
]


def _referral(weighted: bool) -> str:
    """Two scores over shared indicators, written as weighted counts or as the equal sums of counts."""
    lets = []
    for j, score in enumerate(_SCORES):
        if weighted:
            body = "count(" + ", ".join(f"{w}: {c}" for w, c in score) + ")"
        else:
            body = " + ".join(f"{w} * count({', '.join(c for v, c in score if v == w)})" for w in (1, 2, 3))
        lets.append(f"let S{j} = {body}")
    decls = "".join(f"field F{i}: bool\n" if i % 3 == 0 else f"field F{i}: Low{i} | Mid{i} | High{i}\n" if i % 3 == 1
                    else f"system F{i}: int[0..1000]\n" for i in range(9))
    return f"""scenario referral "Referral"
{decls}{chr(10).join(lets)}
let Top = max(S0, S1)
action Clear "clear" [ends_dialogue]
action Review "review"
action Refer "refer" [escalation]
action Hold "hold"
stage triage "Triage" {{
    when Top >= 14 -> refer
    when Top >= 7 -> review
    otherwise -> do Clear
}}
stage refer "Refer" {{
    when S0 >= 14 and F0 -> do Hold
    otherwise -> do Refer
}}
stage review "Review" {{
    when S0 >= 7 -> do Review
    when F1 == High1 -> do Hold
    otherwise -> do Clear
}}
"""


def test_a_weighted_count_is_analysed_like_the_sum_of_counts_it_equals() -> None:
    """Issue 31: `count(2: A, …)` was opaque to the analyses, so every threshold on it stayed undecided
    (I302) and synthesis missed paths, while the same score written as a sum of counts was decided."""
    found = {}
    for weighted in (True, False):
        loaded = load_source(None, text=_referral(weighted))
        assert loaded.scenario is not None
        diags = check(loaded.scenario)
        codes = sorted(d.code for d in diags)
        assert "I302" not in codes and "I303" not in codes, [d.message for d in diags]
        found[weighted] = codes
    assert found[True] == found[False]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([0, 1, 2, 3, 7, 2.5, 0.1]), min_size=1, max_size=6),
       st.lists(st.booleans(), min_size=6, max_size=6))
def test_weighted_as_counts_has_the_engines_value(weights: list, truths: list[bool]) -> None:
    """The sum-of-counts form (grouped for whole weights, in argument order for fractional ones) has
    exactly the value the engine gives the weighted count, floats included."""
    from sopgraph.logic.guards import weighted_as_counts
    names = [f"B{i}" for i in range(len(weights))]
    decls = "".join(f"field {n}: bool\n" for n in names)
    body = ", ".join(f"{w}: {n}" for w, n in zip(weights, names, strict=True))
    scenario, _ = guard_of_text(decls, f"count({body}) >= 0")
    weighted = scenario.variables["W"].expr
    assert isinstance(weighted, ir.Weighted)
    values = dict(zip(names, truths, strict=False))
    want = Interpreter(scenario, values).eval(weighted)
    got = Interpreter(scenario, values).eval(weighted_as_counts(weighted))
    assert got == want and type(got) is type(want)


def guard_of_text(decls: str, score: str) -> tuple[ir.Scenario, Any]:
    src = (f'scenario w "w"\n{decls}let W = {score.split(" >= ")[0]}\naction Ok "ok"\n'
           'stage s "s" {\n    when W >= 0 -> do Ok\n    otherwise -> do Ok\n}\n')
    loaded = load_source(None, text=src)
    assert loaded.scenario is not None, [d.message for d in loaded.diagnostics]
    return loaded.scenario, loaded.scenario.stages["s"].branches[0].guard


def _searches(monkeypatch: pytest.MonkeyPatch) -> list:
    """The boxes the space searches or asks the solver about from now on (a spy on `_search_or_solve`)."""
    from sopgraph.logic.spacesearch import SpaceSearch

    asked: list = []
    real = SpaceSearch._search_or_solve

    def counting(self: SpaceSearch, box: object, style: str, rng: object) -> tuple:
        asked.append(box)
        return real(self, box, style, rng)  # type: ignore[arg-type]

    monkeypatch.setattr(SpaceSearch, "_search_or_solve", counting)
    return asked


def _two_group_box(text: str) -> tuple:
    """(scenario, space, a box of it) where the first branches of stages `s` and `u` hold and the box's
    residuals fall into two independent groups."""
    from sopgraph.logic import domain

    sc = load_source(None, text=text).scenario
    assert sc is not None
    sp = domain.space_for(sc)
    box = next(b2 for b in sp.constrain(sp.full, sp.formula(sc.stages["s"].branches[0].guard, True))
               for b2 in sp.constrain(b, sp.formula(sc.stages["u"].branches[0].guard, True))
               if len(sp._resid_groups(b2)) == 2)
    return sc, sp, box


GROUPS = """
scenario g "G"
field A: X | Y | Z "a"
field B1: bool "b1"
field B2: bool "b2"
field B3: bool "b3"
field B4: bool "b4"
field B5: bool "b5"
field B6: bool "b6"
system N: int[1..6] "n"
system M1: int[0..100] "m1"
system M2: int[0..100] "m2"
action P "p"
action Q "q"
stage s { when count(B1, B2, B3, B4, B5, B6) >= N + 3 -> u  otherwise -> do Q }
stage u { when M1 + M2 > 150 -> t  otherwise -> do Q }
stage t { when A == X -> do P  otherwise -> do Q }
"""


def test_a_group_of_residuals_asked_again_from_another_box_is_decided_once(monkeypatch) -> None:
    """Residuals that read disjoint variables are decided group by group; boxes that differ only outside a
    group (here in `A`) ask it the same question. Its answer depends only on its literals and on the domains
    of the variables it reads, so the second box reuses it: on a list of records five of six group
    questions were such repeats (docs/performance.md). The witnesses still differ where the boxes do."""

    sc, sp, scored = _two_group_box(GROUPS)
    guard = sc.stages["t"].branches[0].guard
    boxes = [*sp.constrain(scored, sp.formula(guard, True)), *sp.constrain(scored, sp.formula(guard, False))]
    assert len(boxes) == 2 and boxes[0].resid == boxes[1].resid
    asked = _searches(monkeypatch)
    assert sp.decide(boxes[0]) is True
    assert len(asked) == 2  # each of its two groups (its own pick satisfies neither)
    assert sp.decide(boxes[1]) is True
    assert len(asked) == 2  # nothing new: both groups were answered before
    first, second = sp.witness(boxes[0], "boundary"), sp.witness(boxes[1], "boundary")
    assert first is not None and second is not None
    assert first["A"] == "X" and second["A"] != "X"
    assert {k: v for k, v in first.items() if k != "A"} == {k: v for k, v in second.items() if k != "A"}


PICKED = """
scenario k "K"
system M1: int[0..100] "m1"
system M2: int[0..100] "m2"
system M3: int[0..100] "m3"
action P "p"
action Q "q"
stage s { when M1 + M2 + M3 < 150 -> do P  otherwise -> do Q }
"""


def test_a_box_whose_own_pick_satisfies_its_residuals_is_decided_without_a_search(monkeypatch) -> None:
    """Deciding a box needs one member; its boundary pick often is one, and checking it costs one evaluation
    where the search or a solver query costs a context each (a four-stage generated order SOP: 25 s of CPU,
    then 1.2 s). The witness, when asked for, is still the one the search or the solver gives."""
    from sopgraph.logic import domain

    sc = load_source(None, text=PICKED).scenario
    assert sc is not None
    sp = domain.space_for(sc)
    (box,) = [b for b in sp.constrain(sp.full, sp.formula(sc.stages["s"].branches[0].guard, True)) if b.resid]
    asked = _searches(monkeypatch)
    assert sp.decide(box) is True
    assert asked == []
    witness = sp.witness(box, "boundary")
    assert witness is not None and witness["M1"] + witness["M2"] + witness["M3"] < 150
    assert len(asked) == 1 and sp.undecided == 0


HALF_PICKED = GROUPS.replace("M1 + M2 > 150", "M1 + M2 < 150")


def test_only_the_residual_groups_a_box_s_pick_fails_are_searched(monkeypatch) -> None:
    """A box with two independent residual groups whose pick satisfies one of them: only the other is searched
    (or solved) to decide the box; on `ORDER` about half of the group questions were such (docs/performance.md)."""

    _, sp, box = _two_group_box(HALF_PICKED)
    asked = _searches(monkeypatch)
    assert sp.decide(box) is True
    assert len(asked) == 1 and "count(" in sp.res_text[next(iter(asked[0].resid))[0]]
    witness = sp.witness(box, "boundary")
    assert witness is not None and witness["M1"] + witness["M2"] < 150
    assert sum(witness[f"B{i}"] for i in range(1, 7)) >= witness["N"] + 3
