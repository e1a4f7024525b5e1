"""`logic.solver`: when z3's "unsat" proves a region empty. Float values that are only compared are
exact (every float is a rational, and a constant is translated as the rational its float is); float
arithmetic rounds in the engine and not in z3, so such a query is never trusted to be empty."""

from __future__ import annotations

from fractions import Fraction

from helpers import ORDER

from sopgraph.language.parse import load_source
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


def _two_floats(guard: str) -> str:
    """A program whose one branch takes `guard` over two floats A and B in [0, 1]."""
    return (f'scenario r "R"\nsystem A: float[0..1] "a"\nsystem B: float[0..1] "b"\naction X "x"\naction Y "y"\n'
            f"stage s {{ when {guard} -> do X  otherwise -> do Y }}\n")


ROUNDED = _two_floats("A == 0.1 and B == 0.2 and A + B == 0.30000000000000004")


def test_float_arithmetic_is_never_refuted_by_the_rationals() -> None:
    """0.1 + 0.2 is 0.30000000000000004 in floats and not in the rationals: the region is not empty."""
    sc = load(text=ROUNDED)
    assert decide(sc, {"A": 0.1, "B": 0.2}).finals["Action"] == "X"
    boxes = domain.constrain(sc, domain.full_box(sc), sc.stages["s"].branches[0].guard)
    assert boxes and all(domain.is_feasible(sc, b) is not False for b in boxes)


EDGE = _two_floats("A <= 0.1 and B <= 0.2 and A + B >= 0.30000000000000004")


def test_a_region_that_only_rounding_reaches_is_not_refuted() -> None:
    """Over the rationals A + B stays below 0.30000000000000004 here; in floats 0.1 + 0.2 reaches it. The query
    with the rounding bound must not be refuted (it is a question the search then answers)."""
    sc = load(text=EDGE)
    assert decide(sc, {"A": 0.1, "B": 0.2}).finals["Action"] == "X"
    boxes = domain.constrain(sc, domain.full_box(sc), sc.stages["s"].branches[0].guard)
    assert boxes and all(domain.is_feasible(sc, b) is not False for b in boxes)
    assert {p.action for p in paths.iter_paths(sc)} == {"X", "Y"}


REFUND = """
scenario r "R"
type Line = record { price: float[0..2000], back: bool }
system Lines: list[1..3] of Line "lines"
let Refund = sum(l.price for l in Lines where l.back) "refund"
action X "x"
action Y "y"
action Z "z"
stage s { when Refund <= 1300 -> do X  otherwise -> t }
stage t { when Refund <= 1250 -> do Y  when Refund * 0.5 + 10 > 1000 -> do X  otherwise -> do Z }
"""


def test_a_float_sum_compared_twice_is_one_value_whatever_its_rounding() -> None:
    """`Refund <= 1250` after `Refund <= 1300` failed: the engine computes the same sum to the same float both
    times, so the branch is never taken whatever the rounding (a variable of its own per computation, tied to
    the exact sum within its rounding error). Before, float arithmetic made every refutation untrusted: the
    path stayed "(?)" and `sop check` said I302 instead of W303."""
    sc = load(text=REFUND)
    found = {tuple(p.labels): p.status for p in paths.iter_paths(sc)}
    assert found == {("Refund <= 1300",): "feasible", ("otherwise", "Refund * 0.5 + 10 > 1000"): "feasible",
                     ("otherwise", "otherwise"): "feasible"}
    assert paths.count_paths(sc).feasible == 3
    from sopgraph.logic.flow import flow_diagnostics
    from sopgraph.logic.lower import analysis_form

    found_d = flow_diagnostics(analysis_form(sc).scenario)
    assert [d.code for d in found_d if d.code.startswith(("W303", "W304", "I302"))] == ["W303"]
    assert "Refund <= 1250" in next(d.message for d in found_d if d.code == "W303")


def test_counts_over_float_amounts_of_a_list_are_exact() -> None:
    """tests/data/lost_card_lists.sop: 56 feasible paths, counted exactly (undecided regions made it an
    upper bound of 212, and `sop check` 34 s of CPU)."""
    from pathlib import Path

    sc = load(Path(__file__).resolve().parent / "data" / "lost_card_lists.sop")
    counted = paths.count_paths(sc)
    assert counted.complete and counted.exact and counted.feasible == 56


DATED = """
scenario d "D"
type Bill = record { due: date, paid: bool }
field Request: Plan | Other "Plan = plan; Other = other."
system Bills: list[..6] of Bill "The bills."
system BrokenAt: date? "When the last plan was broken, if ever."
let Overdue = count(b in Bills where not b.paid and b.due < date("2026-01-01"))
let RecentBreak = not missing(BrokenAt) and days_between(BrokenAt, now) < 180
action A "a"
action B "b"
action C "c"
action D "d"
stage s {
    classify Request
    when Request == Other -> do C
    when Overdue == 0 -> do A
    when RecentBreak -> do D
    otherwise -> do B
}
"""


def test_dates_and_optional_values_are_decided_by_the_solver() -> None:
    """Bills due before a date constant, an optional date tested with `missing`, and `days_between`:
    the solver translated none of `date("…")`, `missing(…)` and `days_between(…)`, and took a date
    for any second (a model with a bill due at 23:59:59 is no date), so `sop check` said
    "flow analysis incomplete" (I302) on every such stage and no path list was exact."""
    from sopgraph.logic.checker import check

    sc = load(text=DATED)
    found = {p.action: p.status for p in paths.iter_paths(sc)}
    assert found == {"A": "feasible", "B": "feasible", "C": "feasible", "D": "feasible"}
    counted = paths.count_paths(sc)
    assert counted.complete and counted.exact
    assert not [d for d in check(sc) if d.code in ("I302", "I303")]


def test_a_date_is_a_whole_day_for_the_solver() -> None:
    """No bill is due strictly between two consecutive midnights: Overdue is always 0, so only A and C
    are reachable, and that is proven (a second-resolution model said otherwise)."""
    text = DATED.replace('b.due < date("2026-01-01")', 'b.due > date("2026-01-01") and b.due < date("2026-01-02")')
    sc = load(text=text)
    assert {p.action: p.status for p in paths.iter_paths(sc)} == {"A": "feasible", "C": "feasible"}
    counted = paths.count_paths(sc)
    assert counted.complete and counted.exact and counted.feasible == 2




def test_pattern_tests_and_float_sums_leave_no_question_undecided() -> None:
    """A pattern test on a string is a free Bool for the solver (a string with the truths its model gives
    is then looked for), and a region whose literals without float arithmetic are already contradictory
    is empty whatever the sum of prices rounds to. Before, a `matches` anywhere in a region kept z3 out
    of it and every refutation next to `Refund` was distrusted: three of these paths were "unknown" and
    the check said "flow analysis incomplete" (I302, 36 questions) and I303."""
    from sopgraph.logic.checker import check_file

    # under the default CPU budget again: the solver's memo, the memo of residual groups and the optional-read
    # pass no longer splitting a last stage took this file from ~16 s of CPU to ~3 s (docs/performance.md)
    checked = check_file("o.sop", text=ORDER)
    assert not {d.code for d in checked.diagnostics} & {"I302", "I303"}, [d.message for d in checked.diagnostics]
    sc = checked.scenario  # its analyses are reused below
    assert sc is not None
    found = list(paths.iter_paths(sc))
    assert {p.status for p in found} == {"feasible"} and len(found) == 6
    for p in found:
        assert p.witness is not None and decide(sc, p.witness).finals["Action"] == p.action
    assert paths.count_paths(sc).feasible == 6


def test_synthesis_gives_the_same_bytes_on_a_second_run_in_the_same_process() -> None:
    """Weighted scores leave residuals that only z3 decides. Its choices follow the ids of the terms it
    sees, which used to depend on every query the process had asked before (one global context, and
    the domain's memos skip queries on a second run): the second synthesis of the same file picked
    other witnesses. Each query is now solved in a context of its own."""
    from helpers import weighted_sop

    from sopgraph import synthesize

    text = weighted_sop(4, 16, weighted=True)
    scenario = load(text=text)
    first = synthesize(scenario, 30, seed=1).lines
    assert synthesize(scenario, 30, seed=1).lines == first  # same scenario object: its space is reused
    assert synthesize(load(text=text), 30, seed=1).lines == first  # a fresh load after other work


REPEATED = """
scenario m "M"
field A: X | Y | Z "a"
field B1: bool "b1"
field B2: bool "b2"
field B3: bool "b3"
field B4: bool "b4"
field B5: bool "b5"
field B6: bool "b6"
system N: int[1..6] "n"
action P "p"
action Q "q"
stage s { when count(B1, B2, B3, B4, B5, B6) >= N + 3 and A == X -> do P  otherwise -> do Q }
"""


def test_a_query_asked_again_from_another_box_is_solved_once(monkeypatch) -> None:
    """Boxes that differ only in a variable the residuals do not read (here `A`) ask z3 the same query: on a
    list of order lines two of three queries were such repeats, each paying for a context and a solve
    (docs/performance.md). The answer is a function of the query alone, so it is memoised per space; the
    model is the same and the variable outside the query still comes from each box."""
    import z3

    from sopgraph.logic import solver

    sc = load(text=REPEATED)
    sp = domain.space_for(sc)
    guard = sc.stages["s"].branches[0].guard
    assert guard is not None
    (scored,) = [b for b in sp.constrain(sp.full, sp.formula(guard.operands[0], True)) if b.resid]
    boxes = [b for value in ("X", "Y") for b in sp.constrain(scored, sp.formula(
        guard.operands[1].model_copy(update={"right": guard.operands[1].right.model_copy(update={"value": value})}),
        True))]
    assert len(boxes) == 2 and boxes[0] != boxes[1] and boxes[0].resid == boxes[1].resid
    made: list[object] = []
    real = z3.Context

    def counting(*args: object, **kwargs: object) -> object:
        made.append(None)
        return real(*args, **kwargs)

    solver.solve(sp, boxes[0])  # the space's own context is made here, before counting
    monkeypatch.setattr(z3, "Context", counting)
    first, empty_first = solver.solve(sp, boxes[1])
    again, empty_again = solver.solve(sp, boxes[0])
    assert made == []  # both answers came from the first solve: no new context, no new solve
    assert first is not None and again is not None and not empty_first and not empty_again
    assert (first["A"], again["A"]) == ("Y", "X")
    assert {k: v for k, v in first.items() if k != "A"} == {k: v for k, v in again.items() if k != "A"}
    assert sum(first[f"B{i}"] for i in range(1, 7)) >= first["N"] + 3


def test_the_generated_order_shape_is_a_valid_program_of_lists_sums_and_patterns() -> None:
    """`benchmarks/gen_sop.py --kind orders` (the shape of `ORDER`, generated for the fuzz benchmark) gives
    programs that load without errors, use every construct of the shape, and are the same for a seed."""
    from helpers import gen_sop

    gen = gen_sop()
    assert "orders" in gen.KINDS
    seen = ""
    for seed in range(8):
        text = gen.generate(1 + seed % 5, kind="orders", seed=seed)
        assert gen.generate(1 + seed % 5, kind="orders", seed=seed) == text
        loaded = load_source(None, text=text)
        assert loaded.scenario is not None
        assert not [d for d in loaded.diagnostics if d.severity == "error"], [d.message for d in loaded.diagnostics]
        seen += text
    for construct in ("list[1..", "sum(l.price for l in Lines", "any(l in Lines", "all(l in Lines", "matches",
                      "missing(Coupon)", "count(l in Lines"):
        assert construct in seen


def test_generated_order_programs_are_analysed_completely() -> None:
    """Generated `orders` programs (a list of up to six order lines, a float sum, `any`/`all`/`count`, patterns, an
    optional coupon): the flow and optional-read analyses end complete, with no question left undecided, and find
    the branches that earlier stages make impossible. Before, a negated `any(...)` cut every box once per line and
    field and the sums made every refutation untrusted: I302 (bound on region size, or tens of undecided
    questions) on each of these, and 18-30 s of CPU on the larger ones."""
    from helpers import gen_sop

    from sopgraph.logic.checker import check_file

    gen = gen_sop()
    never = 0
    for stages, seed in ((5, 3), (6, 6), (11, 1), (17, 8)):
        found = check_file("o.sop", text=gen.generate(stages, kind="orders", seed=seed)).diagnostics
        assert not [d.message for d in found if d.code in ("I302", "I303")], (stages, seed)
        never += sum(1 for d in found if d.code in ("W303", "W304"))
    assert never >= 15


DIVIDED = """
scenario d "D"
type Line = record { price: float[0..1000], qty: int[1..10] }
system Lines: list[1..3] of Line "lines"
action X "x"
action Y "y"
action Z "z"
stage s { when any(l in Lines where l.price / l.qty > 90.5 and l.qty > 2) -> do X  otherwise -> t }
stage t { when any(l in Lines where l.price / l.qty > 50.5) -> do Y  otherwise -> do Z }
"""


def test_a_condition_kept_whole_that_the_solver_cannot_model_is_decided_on_its_pieces() -> None:
    """A negated `any(...)` over three lines is kept on its box as one literal (it would cut it into many pieces);
    the solver does not model division, and the search over all the lines' variables at once finds nothing, so
    the question stayed open (I302, the path to X "unknown"). Asked again on the pieces, each is decided."""
    from sopgraph.logic.checker import check_file

    assert not [d.message for d in check_file("d.sop", text=DIVIDED).diagnostics if d.code == "I302"]
    sc = load(text=DIVIDED)
    assert {p.action: p.status for p in paths.iter_paths(sc)} == {"X": "feasible", "Y": "feasible", "Z": "feasible"}


TWO_PATTERNS = """
scenario p "P"
system OrderId: string "the order number"
action A "a"
action B "b"
action C "c"
stage s {
    when OrderId matches "ORD-0.*" -> do A
    when not (OrderId matches "ORD-[0-9]{6}") -> do B
    otherwise -> do C
}
"""


def test_two_patterns_on_one_string_get_a_witness_with_both_truths() -> None:
    """The solver says "matches `ORD-[0-9]{6}`, not `ORD-0.*`"; every example built from the two patterns starts
    `ORD-0`, so the path to C stayed unknown and the check said I302 (found by the generated `orders` shape).
    An example with one character changed (`ORD-100000`) has both truths."""
    sc = load(text=TWO_PATTERNS, flow=False)
    found = {p.action: p for p in paths.iter_paths(sc)}
    assert {a: p.status for a, p in found.items()} == {"A": "feasible", "B": "feasible", "C": "feasible"}
    witness = found["C"].witness
    assert witness is not None and decide(sc, witness).finals["Action"] == "C"
    from sopgraph.logic.checker import check_file

    assert not [d for d in check_file("p.sop", text=TWO_PATTERNS).diagnostics if d.code in ("I302", "I303")]


def test_a_model_read_from_its_text_says_what_the_api_says() -> None:
    """Models are read from their text in one call (the z3 API costs ~4 calls per constant, 6 ms a model on a
    list of records); ints, rationals, negatives, bools, an algebraic number and z3's own functions."""
    import z3

    from sopgraph.logic import solver

    ctx = z3.Context()
    s = z3.Solver(ctx=ctx)
    v1, v2, v3, v4, v5 = (z3.Real(f"v{i}", ctx) for i in range(1, 6))
    n1, n2 = z3.Int("v6", ctx), z3.Int("v7", ctx)
    s.add(v1 * 3 == 1, v2 == -z3.RealVal("7/2", ctx), v3 == 2, v4 * v4 == 2, v4 > 0, v5 / v1 == 6,
          n1 == -5, n2 == 123456789012, z3.Bool("m8", ctx), z3.Not(z3.Bool("p9", ctx)))
    assert s.check() == z3.sat
    model = s.model()
    read = solver._read_model(model.sexpr())
    by_api = solver._Model.__new__(solver._Model)
    by_api.values = {}
    by_api._read_api(z3, model)
    assert read == by_api.values
    assert read["v1"] == Fraction(1, 3) and read["v2"] == Fraction(-7, 2) and read["v4"] is None
    assert read["v6"] == -5 and isinstance(read["v6"], int) and read["m8"] is True and read["p9"] is False
