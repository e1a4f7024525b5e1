"""Comparisons between two dates, datetimes, durations or ints (`x op y ± constant`) in the constraint domain.

They compile to difference literals (`x - y <= k`) that `sopgraph.logic.diffbound` decides exactly: the
properties below check that constrained boxes contain exactly the assignments the engine sends that way,
that feasibility is always decided (never "unknown") and that every witness is one the engine agrees with —
including the whole-day rounding of dates, which a search over candidate dates cannot prove.
"""

from __future__ import annotations

import itertools
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sopgraph.language import ir, scalars
from sopgraph.language.parse import load_source
from sopgraph.logic import diffbound
from sopgraph.logic.domain import constrain, full_box, is_feasible, space_for, witness
from sopgraph.logic.engine import DecideError, Interpreter, decide
from sopgraph.logic.paths import count_paths, iter_paths

DAY = scalars.DAY
DECLS = """
scenario datediff "Date differences"
system D1: date "A day."
system D2: date "Another day."
system T: datetime "A moment."
system U: datetime "Another moment."
system G: duration "A grace period."
system H: duration "Another period."
system A: int "A count."
system B: int "Another count."
action Ok "ok"
"""


@cache
def guard_of(text: str) -> tuple[ir.Scenario, Any]:
    src = DECLS + f'stage s "s" {{\n    when {text} -> do Ok\n    otherwise -> do Ok\n}}\n'
    loaded = load_source(None, text=src)
    assert loaded.scenario is not None and not [d for d in loaded.diagnostics if d.is_error], (
        text, [d.message for d in loaded.diagnostics])
    return loaded.scenario, loaded.scenario.stages["s"].branches[0].guard


ERROR = object()


def evaluate(scenario: ir.Scenario, expr: Any, values: dict[str, Any]) -> Any:
    try:
        return Interpreter(scenario, values).eval(expr)
    except (DecideError, TypeError, ArithmeticError):
        return ERROR


OPS = st.sampled_from(["<", "<=", ">", ">=", "==", "!="])
SHIFTS = st.sampled_from(["", " + 1 day", " - 1 day", " + 24 hours", " - 36 hours", " + 1 hour", " - 1 second",
                          " + 2 days"])
PAIRS = st.sampled_from([("D1", "D2"), ("D1", "T"), ("T", "U"), ("U", "D2"), ("T", "now"), ("D1", "now")])
ATOMS = st.one_of(
    st.builds(lambda pair, op, shift: f"{pair[0]} {op} {pair[1]}{shift}", PAIRS, OPS, SHIFTS),
    st.builds(lambda op, k: f"G {op} H + {k} hours", OPS, st.integers(-3, 3)),
    st.builds(lambda op, k: f"A + {k} {op} B", OPS, st.integers(-3, 3)),
    st.builds(lambda op, k: f"-A {op} -B + {k}", OPS, st.integers(-3, 3)),
    st.builds(lambda pair, op, k: f"days_between({pair[0]}, {pair[1]}) {op} {k}", PAIRS, OPS,
              st.sampled_from([0, 1, -1, 2, 0.5, -1.5, 0.25])),
    st.builds(lambda op, k: f"days_between(T - 1 hour, U + 1 day) {op} {k}", OPS, st.sampled_from([0, 1, 1.5])),
    st.sampled_from(["D1 > date(\"2026-01-10\")", "T < datetime(\"2026-01-12T06:00\")", "A > 5", "G > 2 hours"]),
)
GUARDS = st.recursive(ATOMS, lambda c: st.one_of(st.builds(lambda a, b: f"({a}) and ({b})", c, c),
                                                 st.builds(lambda a, b: f"({a}) or ({b})", c, c),
                                                 st.builds(lambda a: f"not ({a})", c)), max_leaves=4)

BASE = scalars.parse_datetime("2026-01-10T00:00")
DATES = st.integers(-3, 3).map(lambda k: scalars.format_temporal("date", BASE + k * DAY))
MOMENTS = st.one_of(st.integers(-3 * 24, 3 * 24).map(lambda h: BASE + h * 3600),
                    st.integers(-3 * DAY, 3 * DAY)).map(lambda s: BASE + (s - BASE) % (6 * DAY) - 3 * DAY
                                                         ).map(lambda s: scalars.format_temporal("datetime", s))
PERIODS = st.sampled_from(["0 seconds", "1 hour", "2 hours", "1 day", "36 hours", "1 second"])
ASSIGNMENTS = st.fixed_dictionaries({
    "D1": DATES, "D2": DATES, "T": MOMENTS, "U": MOMENTS, "now": MOMENTS, "G": PERIODS, "H": PERIODS,
    "A": st.integers(-5, 5), "B": st.integers(-5, 5)})

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(GUARDS, st.booleans(), st.lists(ASSIGNMENTS, min_size=1, max_size=8))
def test_constrain_is_exact_on_assignments(text: str, truth: bool, assignments: list[dict]) -> None:
    """Engine/domain agreement: an assignment is in the boxes exactly when the engine evaluates the guard to
    `truth` (the domain holds dates in seconds, so membership is checked on the engine's own values)."""
    scenario, guard = guard_of(text)
    sp = space_for(scenario)
    boxes = constrain(scenario, full_box(scenario), guard, truth)
    for values in assignments:
        v = evaluate(scenario, guard, values)
        expected = v is not ERROR and bool(v) == truth
        raw = {n: (scalars.parse_temporal(sp.time_names[n], x) if n in sp.time_names else x)
               for n, x in values.items()}
        assert any(sp.box_contains(b, raw) for b in boxes) == expected, (text, truth, values)


@SETTINGS
@given(GUARDS, st.booleans())
def test_feasibility_is_decided_and_witnesses_agree_with_the_engine(text: str, truth: bool) -> None:
    scenario, guard = guard_of(text)
    for box in constrain(scenario, full_box(scenario), guard, truth):
        assert is_feasible(scenario, box) is True, (text, truth, box)  # `constrain` drops proven-empty boxes
        for style in ("representative", "boundary"):
            w = witness(scenario, box, style=style)
            assert w is not None, (text, truth, style, box)
            v = evaluate(scenario, guard, w)
            assert v is not ERROR and bool(v) == truth, (text, truth, style, w)


def _empty(text: str) -> bool:
    scenario, guard = guard_of(text)
    sp = space_for(scenario)
    boxes = sp.constrain(full_box(scenario), sp.formula(guard, True))
    return all(is_feasible(scenario, b) is False for b in boxes)


@pytest.mark.parametrize("text, empty", [
    ("D1 < D2 and D2 < D1", True),
    ("T < U and U < T + 1 second", True),  # whole seconds
    ("D1 < D2 + 1 hour and D2 < D1 + 1 hour and D1 != D2", True),  # dates are whole days
    ("D1 < T and T < D1 + 12 hours and D2 > D1 and D2 < T + 1 hour", True),  # needs the day rounding
    ("D1 < T and T < D1 + 1 day and D2 > D1 and D2 < T + 1 hour", False),
    ("T > now - 24 hours and T < now - 1 day", True),
    ("G > H + 1 hour and H > G", True),
    ("A > B + 2 and B > A - 4", False),
    ("A > B + 2 and B > A - 4 and A < B + 3", True),
    ("D1 > D2 and D1 < date(\"2026-01-10\") and D2 > date(\"2026-01-08\")", True),
    ("days_between(D1, D2) > 0 and days_between(D1, D2) < 1", True),  # dates: whole days apart
    ("days_between(D1, T) > 0 and days_between(D1, T) < 1", False),
    ("days_between(T, now) >= 2.5 and now < T + 60 hours", True),
    ("days_between(D1, now) > 90 and D1 > now - 90 days", True),
])
def test_contradictions_are_proven_and_satisfiable_ones_get_witnesses(text: str, empty: bool) -> None:
    assert _empty(text) == empty
    if not empty:
        scenario, guard = guard_of(text)
        (box, *_) = constrain(scenario, full_box(scenario), guard, True)
        w = witness(scenario, box, style="boundary")
        assert w is not None and evaluate(scenario, guard, w) is True


def test_boundary_witnesses_sit_on_the_cut_off() -> None:
    scenario, guard = guard_of("T > now - 24 hours")
    (box,) = constrain(scenario, full_box(scenario), guard, True)
    w = witness(scenario, box, style="boundary")
    gap = scalars.parse_temporal("datetime", w["now"]) - scalars.parse_temporal("datetime", w["T"])
    assert gap == DAY - 1  # one second inside the 24 hours


def test_paths_through_date_comparisons_are_exact_and_decided_by_the_engine() -> None:
    src = DECLS.replace("action Ok \"ok\"", 'action Free "free"\naction Fee "fee"\naction No "no"') + """
stage s1 "booked recently?" {
    when T > now - 24 hours and D1 > now -> do Free
    when D1 <= now -> do No
    otherwise -> s2
}
stage s2 "soon?" {
    when D1 < now + 3 days -> do No
    when D1 < D2 and D2 < D1 + 1 hour -> do Free
    otherwise -> do Fee
}
"""
    loaded = load_source(None, text=src)
    assert loaded.scenario is not None
    sc = loaded.scenario
    count = count_paths(sc)
    assert count.exact and count.feasible == 4  # `D1 < D2 < D1 + 1 hour` is impossible for dates
    for info in iter_paths(sc):
        for w in (info.witness, info.boundary_witness):
            assert w is not None
            assert decide(sc, w).path == list(info.stages)
    assert "where" in next(iter_paths(sc)).constraints
    assert "T > now - 24 hours" in next(iter_paths(sc)).constraints["where"]  # as the SOP writes it


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(-3, 3)), max_size=6),
       st.sets(st.integers(0, 3)))
@settings(max_examples=200, deadline=None)
def test_solve_agrees_with_brute_force(cons: list[tuple[int, int, int]], dates: set[int]) -> None:
    """`diffbound.solve` on small systems (unit "days" of 1 here is tested via DAY-scaled constants)."""
    scaled = [(p, q, k * DAY // 2) for p, q, k in cons if p != q]
    bounds = {v: (-2 * DAY, 2 * DAY) for v in range(4)}

    def pick(v: int, lo: float, hi: float) -> int | None:
        if v in dates:
            x = -(-lo // DAY) * DAY
            return int(x) if x <= hi else None
        return int(lo)

    verdict, values = diffbound.solve(range(4), scaled, bounds, dates, pick)
    grid = [range(-2 * DAY, 2 * DAY + 1, DAY) if v in dates else range(-2 * DAY, 2 * DAY + 1, DAY // 2)
            for v in range(4)]
    brute = any(diffbound.holds(dict(enumerate(combo)), scaled) for combo in itertools.product(*grid))
    assert verdict in ("sat", "empty")
    assert (verdict == "sat") == brute
    if values is not None:
        assert diffbound.holds(values, scaled)
        assert all(values[v] % DAY == 0 for v in dates)
