"""`logic.solver`: when z3's "unsat" proves a region empty. Float values that are only compared are
exact (every float is a rational, and a constant is translated as the rational its float is); float
arithmetic rounds in the engine and not in z3, so such a query is never trusted to be empty."""

from __future__ import annotations

from sopgraph.logic import domain, paths
from sopgraph.logic.checker import load
from sopgraph.logic.engine import decide

COMPARED = """
scenario f "F"
type Item = record { amount: float[0..1000], ok: bool }
system Items: list[..4] of Item "items"
action X "x"
action Y "y"
action Z "z"
stage s { when count(i in Items where i.amount > 100.5 and not i.ok) >= 2 -> t  otherwise -> do Z }
stage t { when count(i in Items where i.amount > 50.5) == 0 -> do X  otherwise -> do Y }
"""


def test_compared_floats_are_decided_exactly() -> None:
    """Two items above 100.5, yet none above 50.5: the path to X is empty, which only the solver
    sees (the two counts are different residuals over the items' float amounts); floats that are
    only compared let it say so, so the path list is exact (it was "(?)": undecided)."""
    sc = load(text=COMPARED)
    found = {p.action: p.status for p in paths.iter_paths(sc)}
    assert found == {"Y": "feasible", "Z": "feasible"}
    assert paths.count_paths(sc).feasible == 2


ROUNDED = """
scenario r "R"
system A: float[0..1] "a"
system B: float[0..1] "b"
action X "x"
action Y "y"
stage s { when A == 0.1 and B == 0.2 and A + B == 0.30000000000000004 -> do X  otherwise -> do Y }
"""


def test_float_arithmetic_is_never_refuted_by_the_rationals() -> None:
    """0.1 + 0.2 is 0.30000000000000004 in floats and not in the rationals: the region is not empty."""
    sc = load(text=ROUNDED)
    assert decide(sc, {"A": 0.1, "B": 0.2}).finals["Action"] == "X"
    boxes = domain.constrain(sc, domain.full_box(sc), sc.stages["s"].branches[0].guard)
    assert boxes and all(domain.is_feasible(sc, b) is not False for b in boxes)


def test_counts_over_float_amounts_of_a_list_are_exact() -> None:
    """tests/data/lost_card_lists.sop: 56 feasible paths, counted exactly (undecided regions made it an
    upper bound of 212, and `sop check` 34 s of CPU)."""
    from pathlib import Path

    sc = load(Path(__file__).resolve().parent / "data" / "lost_card_lists.sop")
    counted = paths.count_paths(sc)
    assert counted.complete and counted.exact and counted.feasible == 56
