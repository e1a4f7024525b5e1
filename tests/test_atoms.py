"""The leaves of a guard (`sopgraph.logic.atoms`): a comparison of guarded values becomes the space's atoms
(masks, intervals solved under float rounding, difference literals) exactly when the engine agrees.

Each test builds values with `AtomCompiler`'s own algebra (`arith`, `neg_val`), asks for a comparison,
and checks every assignment of a grid against the reference interpreter evaluating the same expression.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sopgraph.language import ir
from sopgraph.language.parse import load_source
from sopgraph.logic.atoms import AtomCompiler, Val
from sopgraph.logic.domain import Space, full_box, space_for
from sopgraph.logic.engine import DecideError, Interpreter

SOURCE = """
scenario atoms "Atoms"
field E: A | B | C
system N: int[0..20]
system P: int[0..30]
system X: float[-5..5]
action Ok "ok"
stage s "s" {
    when N > 1 -> do Ok
    otherwise -> do Ok
}
"""
OPS = ["<", "<=", ">", ">=", "==", "!="]
X_GRID = [-5.0, -4.5, -1.0, -0.1, 0.0, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5, 4.99, 5.0]


@cache
def _space() -> Space:
    loaded = load_source(None, text=SOURCE)
    assert loaded.scenario is not None
    return space_for(loaded.scenario)


def _var(name: str) -> Val:
    return ("v", _space().index[name], ir.Var.model_construct(kind="var", name=name, span=ir.NO_SPAN))


def _node(v: Val) -> Any:
    return {"v": lambda: v[2], "a": lambda: v[4]}[v[0]]()


def _engine(expr: Any, values: dict[str, Any]) -> bool | None:
    """The engine's truthiness of `expr`, None when it fails."""
    try:
        return bool(Interpreter(_space().scenario, values).eval(expr))
    except (DecideError, TypeError, ArithmeticError):
        return None


def _holds(formula: Any, values: dict[str, Any]) -> bool:
    sp = _space()
    return any(sp.box_contains(b, values) for b in sp.constrain(full_box(sp.scenario), formula))


def _compare(left: Val, op: str, right: Val) -> ir.Compare:
    def expr(v: Val) -> Any:
        return ir.Lit.model_construct(kind="lit", value=v[1], span=ir.NO_SPAN) if v[0] == "c" else _node(v)
    return ir.Compare.model_construct(kind="compare", op=op, left=expr(left), right=expr(right), span=ir.NO_SPAN)


STEPS = st.lists(st.tuples(st.sampled_from(["+", "-", "*", "/"]),
                           st.sampled_from([-3, -1, 0.1, 0.5, 2, 3, 7])), min_size=1, max_size=3)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(name=st.sampled_from(["N", "X"]), steps=STEPS, op=st.sampled_from(OPS),
       c=st.sampled_from([-7, -1, 0, 0.3, 0.30000000000000004, 1, 2.5, 4, 10]), truth=st.booleans())
def test_affine_values_are_solved_exactly_as_the_engine_rounds(name: str, steps: list, op: str, c: float,
                                                               truth: bool) -> None:
    """`N * 0.1 > 0.3` holds for N = 3 (0.30000000000000004): the interval follows the engine's floats."""
    atoms = AtomCompiler(_space())
    v = _var(name)
    for arith_op, k in steps:
        v = atoms.arith(arith_op, v, ("c", k), None)
        if v[0] != "a":  # division by zero: an error value, checked below
            return
    formula = atoms.compare(v, op, ("c", c), truth)
    expr = _compare(v, op, ("c", c))
    grid = [{name: n} for n in range(0, 21)] if name == "N" else [{name: x} for x in X_GRID]
    for values in grid:
        full = {"N": 0, "P": 0, "X": 0.0, "E": "A", **values}
        assert _holds(formula, full) == (_engine(expr, full) is truth), (steps, op, c, truth, values)


def test_a_constant_on_the_left_is_mirrored() -> None:
    atoms = AtomCompiler(_space())
    n = _var("N")
    for op in OPS:
        for truth in (True, False):
            formula = atoms.compare(("c", 5), op, n, truth)
            expr = _compare(("c", 5), op, n)
            assert [v for v in range(21) if _holds(formula, {"N": v})] == [
                v for v in range(21) if _engine(expr, {"N": v}) is truth], (op, truth)


def test_two_integer_variables_shifted_by_whole_numbers_are_a_difference_literal() -> None:
    """`N + 3 op P - 2`: one literal `x - y <= k` per side, exact on every pair of the grid."""
    atoms = AtomCompiler(_space())
    left = atoms.arith("+", _var("N"), ("c", 3), None)
    right = atoms.arith("-", _var("P"), ("c", 2), None)
    for op in OPS:
        for truth in (True, False):
            formula = atoms.difference(left, op, right, truth)
            assert formula is not None and formula.kind != "atom"
            expr = _compare(left, op, right)
            wrong = [(n, p) for n in range(0, 21, 2) for p in range(0, 31, 3)
                     if _holds(formula, {"N": n, "P": p}) != (_engine(expr, {"N": n, "P": p}) is truth)]
            assert wrong == [], (op, truth)
    assert atoms.difference(left, "<", atoms.arith("*", _var("P"), ("c", 2), None), True) is None  # not unit


def test_an_error_value_is_neither_true_nor_false() -> None:
    """`-"text"` fails in the engine: no assignment makes a comparison of it true, nor false."""
    atoms = AtomCompiler(_space())
    error = atoms.neg_val(("c", "text"), None)
    assert error == ("e",)
    for truth in (True, False):
        assert atoms.compare(error, "==", ("c", 1), truth).kind == "F"
        assert atoms.truthy(error, truth).kind == "F"
        assert atoms.member(error, [1, 2], truth, None).kind == "F"
    assert atoms.arith("/", _var("N"), ("c", 0), None) == ("e",)


def test_enum_membership_is_a_mask_of_the_values() -> None:
    atoms = AtomCompiler(_space())
    e = _var("E")
    inside = atoms.member(e, ["A", "C"], True, None)
    outside = atoms.member(e, ["A", "C"], False, None)
    assert inside.kind == outside.kind == "atom"
    assert [x for x in "ABC" if _holds(inside, {"E": x})] == ["A", "C"]
    assert [x for x in "ABC" if _holds(outside, {"E": x})] == ["B"]
