"""The rule engine: semantics on small programs, and a differential test of the generated engine
against the reference interpreter on random programs and random (also invalid) assignments."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sopgraph
from sopgraph.language import ir
from sopgraph.logic import engine as engine_mod
from sopgraph.logic.engine import DecideError, Decision, Engine, decide, engine_for, interpret, validate_value

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"

TELECOM = """
field ConsumptionType: Enquiry | Change | Cancel
field ApplicationTendency: Agree | Reject | Hesitate
field EmotionTag: Calm | Discontent
system PackageStatus: Contracted | NoContract
system Penalty: int[0..) money
let Fee = Penalty * 0.5 + 10
action ChangeOrder "c" [moves_money]
action GoodBye "g"
action TransHuman "t" [escalation]
output Cost: float = 0
stage step1 { -> step2 }
stage step2 { match ConsumptionType { Enquiry -> step6 Change -> step4 Cancel -> step5 } }
stage step6 { match ApplicationTendency { Agree -> step4 Reject, Hesitate -> do GoodBye } }
stage step4 { match PackageStatus { NoContract -> do ChangeOrder Contracted -> step5 } }
stage step5 { when Penalty == 0 -> do ChangeOrder otherwise -> step7 }
stage step7 { match EmotionTag { Calm -> do ChangeOrder { Cost = Fee } Discontent -> do TransHuman } }
"""


@pytest.fixture(scope="module")
def telecom() -> ir.Scenario:
    return sopgraph.load(text=TELECOM)


# ---------------------------------------------------------------------------------------------
# Semantics


def test_path_and_finals(telecom: ir.Scenario) -> None:
    d = decide(telecom, {"ConsumptionType": "Cancel", "Penalty": 40, "EmotionTag": "Calm"})
    assert d == Decision(path=["step1", "step2", "step5", "step7"], finals={"Action": "ChangeOrder", "Cost": 30.0},
                         actions=[{"name": "ChangeOrder", "args": {}}])


def test_only_values_the_path_reads_are_required(telecom: ir.Scenario) -> None:
    d = decide(telecom, {"ConsumptionType": "Enquiry", "ApplicationTendency": "Reject"})
    assert d.finals == {"Action": "GoodBye", "Cost": 0}


def test_missing_value_names_the_variable_and_stage(telecom: ir.Scenario) -> None:
    with pytest.raises(DecideError) as info:
        decide(telecom, {"ConsumptionType": "Change"})
    assert info.value.message == "missing value for `PackageStatus` (needed at step4)"
    assert info.value.variable == "PackageStatus" and info.value.stage == "step4"


@pytest.mark.parametrize("value, fragment", [
    (-1, "outside int[0..)"), (1.5, "not an integer"), ("3", "not a number"), (True, "not a number"),
    (math.inf, "not finite"), (math.nan, "not finite"),
])
def test_out_of_domain_values_are_errors_not_defaults(telecom: ir.Scenario, value: Any, fragment: str) -> None:
    with pytest.raises(DecideError) as info:
        interpret(telecom, {"ConsumptionType": "Cancel", "Penalty": value})
    assert fragment in info.value.message


def test_integral_float_is_accepted_for_an_int(telecom: ir.Scenario) -> None:
    d = decide(telecom, {"ConsumptionType": "Cancel", "Penalty": 0.0})
    assert d.finals["Action"] == "ChangeOrder"


def test_first_true_guard_wins_and_outputs_default() -> None:
    s = sopgraph.load(text='field A: bool\nfield B: bool\naction X "x"\naction Y "y"\noutput O: P | Q = P\n'
                           "stage s { when A -> do X { O = Q } when B -> do Y otherwise -> do Y }")
    assert decide(s, {"A": True, "B": True}).finals == {"Action": "X", "O": "Q"}
    assert decide(s, {"A": False, "B": True}).finals == {"Action": "Y", "O": "P"}


def test_short_circuit_does_not_require_unread_values() -> None:
    s = sopgraph.load(text='field A: bool\nfield B: bool\naction X "x"\naction Y "y"\n'
                           "stage s { when A or B -> do X otherwise -> do Y }")
    assert decide(s, {"A": True}).finals["Action"] == "X"
    with pytest.raises(DecideError, match="missing value for `B`"):
        decide(s, {"A": False})


def test_non_exhaustive_stage_raises() -> None:
    s = sopgraph.load(text='system N: int\naction X "x"\nstage s { when N > 0 -> do X }', check=False)
    with pytest.raises(DecideError) as info:
        engine_for(s).decide({"N": 0})
    assert info.value.message == "no branch of `s` applies to these values"


def test_division_by_zero_in_a_derived_value() -> None:
    s = sopgraph.load(text='system N: int\nlet R = 10 / N\naction X "x"\naction Y "y"\n'
                           "stage s { when R > 1 -> do X otherwise -> do Y }")
    with pytest.raises(DecideError, match="division by zero"):
        decide(s, {"N": 0})


def test_a_loop_is_an_error_not_a_hang() -> None:
    s = sopgraph.load(text='field A: bool\naction X "x"\nstage a { -> b }\nstage b { when A -> a otherwise -> do X }',
                      check=False)
    for eng in (Engine(s), interpret):
        with pytest.raises(DecideError):
            eng.decide({"A": True}) if isinstance(eng, Engine) else eng(s, {"A": True})


def test_decide_many_continues_past_failures(telecom: ir.Scenario) -> None:
    rows = [{"ConsumptionType": "Enquiry", "ApplicationTendency": "Hesitate"}, {"ConsumptionType": "Bogus"},
            {"ConsumptionType": "Cancel", "Penalty": 0}]
    out = list(engine_for(telecom).decide_many(rows))
    assert isinstance(out[0], Decision) and isinstance(out[1], DecideError) and isinstance(out[2], Decision)


def test_engine_is_cached_on_the_scenario(telecom: ir.Scenario) -> None:
    assert engine_for(telecom) is engine_for(telecom)


def test_validate_value_normalises_ints() -> None:
    var = ir.Variable(name="N", role="system", type=ir.NumType(kind="int", lo=0))
    assert validate_value(var, 3.0) == 3 and isinstance(validate_value(var, 3.0), int)


# ---------------------------------------------------------------------------------------------
# Differential test: generated engine (tree and loop forms) against the reference interpreter


def _same(scenario: ir.Scenario, engines: list[Engine], values: dict[str, Any]) -> None:
    try:
        expected: Decision | str = interpret(scenario, values)
    except DecideError as exc:
        expected = exc.message
    for eng in engines:
        try:
            got: Decision | str = eng.decide(values)
        except DecideError as exc:
            got = exc.message
        assert got == expected, f"{eng.mode} engine disagrees on {values!r}"


def _numeric_literals(node: Any) -> set[float]:
    """Every number written in the program (guards, derived values, case arms), wherever it stands."""
    found: set[float] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ir.Lit):
            if isinstance(item.value, (int, float)) and not isinstance(item.value, bool):
                found.add(item.value)
        elif isinstance(item, ir.Node):
            stack.extend(getattr(item, name) for name in type(item).model_fields)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


def _value_strategy(var: ir.Variable, literals: frozenset[float] = frozenset(), *,
                    well_typed: bool = False) -> st.SearchStrategy[Any]:
    """Mostly values of the domain, numbers often at the program's own boundaries (each literal and ±1:
    `<` and `<=` differ only there); sometimes missing, off-domain or of the wrong type."""
    t = var.type
    if isinstance(t, ir.EnumType):
        good: st.SearchStrategy[Any] = st.sampled_from(t.values)
    elif isinstance(t, ir.BoolType):
        good = st.booleans()
    elif isinstance(t, ir.NumType):
        lo = -50 if t.lo is None else int(math.ceil(t.lo))
        hi = 150 if t.hi is None else int(math.floor(t.hi))
        ints = st.integers(min(lo, hi), max(lo, hi)) if lo <= hi else st.just(lo)
        good = ints if t.kind == "int" else st.one_of(ints, st.floats(lo, max(lo, hi), allow_nan=False))
        edges = sorted({v for c in literals for v in (c - 1, c, c + 1)
                        if lo <= v <= hi and (t.kind != "int" or float(v).is_integer())}
                       | {lo, hi})
        good = st.one_of(good, st.sampled_from([int(v) if t.kind == "int" else v for v in edges]))
    else:
        good = st.none()
    if well_typed:
        return good
    bad = st.one_of(st.none(), st.just("Bogus"), st.integers(-1000, 1000), st.booleans(),
                    st.floats(allow_nan=False, allow_infinity=False), st.just(2.5))
    return st.one_of(good, good, good, bad)


def _assignments(scenario: ir.Scenario) -> st.SearchStrategy[dict[str, Any]]:
    inputs = [v for v in scenario.variables.values() if v.role != "derived"]
    literals = frozenset(_numeric_literals(scenario))
    # half the time every input is present and well typed, so that decisions (not only errors) are
    # compared, at the program's boundaries as often as anywhere else
    complete = st.fixed_dictionaries({v.name: _value_strategy(v, literals, well_typed=True) for v in inputs
                                      if not isinstance(v.type, (ir.TimeType, ir.StringType, ir.ListType,
                                                                 ir.RecordType))})
    return st.one_of(complete, st.fixed_dictionaries({}, optional={v.name: _value_strategy(v, literals)
                                                                   for v in inputs}))


def _engines(scenario: ir.Scenario) -> list[Engine]:
    tree = Engine(scenario)
    expanded_size = engine_mod._expanded_size
    engine_mod._expanded_size = lambda s: None  # force the table-driven loop form (big or cyclic SOPs)
    try:
        loop = Engine(scenario)
    finally:
        engine_mod._expanded_size = expanded_size
    assert loop.mode == "loop"
    return [tree, loop]


KNOWN_PROGRAMS = (sorted((ROOT / "scenarios").glob("*.sop")) + sorted(GOLDEN.glob("valid_*.sop"))
                  + sorted((ROOT / "examples").glob("*.sop")) + [ROOT / "tests" / "data" / "engine_boundaries.sop"])


@pytest.mark.parametrize("path", KNOWN_PROGRAMS, ids=lambda p: p.stem)
def test_engine_matches_interpreter_on_known_programs(path: Path) -> None:
    scenario = sopgraph.load(path)
    engines = _engines(scenario)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(_assignments(scenario))
    def run(values: dict[str, Any]) -> None:
        _same(scenario, engines, values)

    run()


# Random well-typed programs: acyclic stages over enum/bool/int/float inputs and derived values.

ENUMS = {"E1": ["A", "B", "C"], "E2": ["X", "Y"]}


@st.composite
def _guard(draw, depth: int = 0) -> str:
    atoms = [
        st.builds(lambda v: f"E1 == {v}", st.sampled_from(ENUMS["E1"])),
        st.builds(lambda v: f"E2 != {v}", st.sampled_from(ENUMS["E2"])),
        st.builds(lambda vs: "E1 in {" + ", ".join(vs) + "}", st.lists(st.sampled_from(ENUMS["E1"]), min_size=1,
                                                                       max_size=3, unique=True)),
        st.sampled_from(["B1", "not B2", "Big", "not Big"]),
        st.builds(lambda op, c: f"N {op} {c}", st.sampled_from(["<", "<=", ">", ">=", "==", "!="]),
                  st.integers(-5, 105)),
        st.builds(lambda op, c: f"F {op} {c}", st.sampled_from(["<", ">="]), st.integers(0, 10)),
        st.builds(lambda c: f"Score >= {c}", st.integers(0, 3)),
        st.builds(lambda c: f"Fee > {c}", st.integers(0, 300)),
        st.builds(lambda c: f"Ratio < {c}", st.integers(-2, 30)),
        st.just("Tier == Gold"),
        # dates, durations, strings, optionals, defaults, abs (docs/language.md §7)
        st.builds(lambda op, n: f"Day {op} now - {n} days", st.sampled_from(["<", ">=", "=="]), st.integers(0, 3)),
        st.builds(lambda n: f"At <= Day + {n} hours", st.integers(0, 48)),
        st.builds(lambda n: f"days_between(Day, At) >= {n}", st.integers(-2, 2)),
        st.builds(lambda n: f"Wait > {n} minutes", st.integers(0, 200)),
        st.sampled_from(['Code matches "^[A-Z]{2}\\d$"', 'Code == "AB1"', "Code != Other", "missing(Opt)",
                         "not missing(Opt) and Opt > 2", "Opt > 2", "Dflt >= 3", "abs(F - 5) < 3",
                         "abs(Wait) >= 1 hours", "Late"]),
    ]
    data = [  # lists, records and weighted counts
        st.builds(lambda c: f"any(s in Segs where s.flown and s.price > {c})", st.integers(-1, 101)),
        st.builds(lambda v: f"all(s in Segs where s.cabin != {v})", st.sampled_from(ENUMS["E1"])),
        st.builds(lambda c: f"count(s in Segs where s.cabin in {{A, B}}) == {c}", st.integers(0, 3)),
        st.builds(lambda op, c: f"Flown {op} {c}", st.sampled_from(["<", ">="]), st.integers(0, 3)),
        st.builds(lambda c: f"len(Segs) > {c}", st.integers(0, 3)),
        st.builds(lambda c: f"Met.lat > {c}", st.integers(-1, 1001)),
        st.sampled_from(["Met.ok", "not Met.ok", "X in Tags", "Y not in Tags", "E2 in Tags",
                         "any(t in Tags where t == Y and any(s in Segs where s.cabin == C))"]),
        st.builds(lambda c: f"Heavy >= {c}", st.sampled_from([0, 1, 1.5, 2, 3.5, 5, 6.5])),
        # optional record fields, quoted enum values (docs/language.md §4)
        st.sampled_from(['any(s in Segs where not missing(s.note) and s.note == "x")',
                         'any(s in Segs where s.note == "x")', "all(s in Segs where missing(s.note))",
                         'E3 == "5+ times"', 'E3 in {Low, "5+ times"}']),
    ]
    atoms = [st.one_of(atoms), st.one_of(data)]
    if depth < 2:
        atoms.append(st.builds(lambda a, op, b: f"({a} {op} {b})", _guard(depth + 1), st.sampled_from(["and", "or"]),
                               _guard(depth + 1)))
    return draw(st.one_of(atoms))


@st.composite
def _program(draw) -> str:
    n = draw(st.integers(1, 7))
    lines = [
        "field E1: A | B | C", "field E2: X | Y", "field B1: bool", "field B2: bool",
        "system N: int[0..100]", "system F: float", "system D: int[0..4]",
        "let Fee = N * 2 + 1", "let Ratio = F / D", "let Big = N > 50",
        "let Score = count(B1, B2, E1 == A)",
        "let Tier = case { when Big -> Gold when B1 -> Silver otherwise -> Bronze }",
        "type Seg = record { flown: bool, cabin: A | B | C, price: int[0..100], note: string? }",
        "system Segs: list[..3] of Seg", "system Met: record open { lat: int[0..1000], ok: bool }",
        'field E3: Low | "5+ times"', "output Kinds: list[..2] of A | B | C = []",
        "system Tags: list[1..3] of X | Y",
        "let Flown = count(s in Segs where s.flown)", "let Heavy = count(2: B1, 1.5: Met.ok, 3: N > 50)",
        "system Day: date", "system At: datetime", "system Wait: duration", "field Code: string",
        "field Other: string", "system Opt: float?", "system Dflt: int[0..10] = 3",
        "let Late = now - At > Wait", "output When: date",
        'action Go "go"', 'action Stop "stop"', 'action Ask "ask"',
        "output Plan: Gold | Silver | Bronze | none = none", "output Amount: float = 0",
        "output Charge: int[0..150] = 0",
    ]

    def target(i: int) -> str:
        choices = [f"s{j}" for j in range(i + 1, n)]
        leaf = draw(st.sampled_from(["do Go", "do Stop", "do Ask", "do Go { Plan = Tier }",
                                     "do Stop { Amount = Fee, Plan = Silver }", "do Ask { Amount = F * 2 }",
                                     "do Go { Charge = Fee - 50 }", "do Stop { Amount = Heavy + len(Segs) }",
                                     "do Ask { When = Day + 1 days }",
                                     "do Ask { Kinds = [A, B when B1, C when Met.ok] }",
                                     "do Go { Kinds = case { when Big -> [C] otherwise -> [B, B when B2] } }"]))
        return draw(st.sampled_from(choices + [leaf, leaf])) if choices else leaf

    for i in range(n):
        kind = draw(st.sampled_from(["goto", "match_enum", "match_bool", "when", "when"]))
        if kind == "goto":
            body = f"-> {target(i)}"
        elif kind == "match_enum":
            arms = [f"A -> {target(i)}", f"B, C -> {target(i)}"] if draw(st.booleans()) else \
                [f"A -> {target(i)}", f"otherwise -> {target(i)}"]
            body = "match E1 { " + " ".join(arms) + " }"
        elif kind == "match_bool":
            body = f"match B1 {{ true -> {target(i)} false -> {target(i)} }}"
        else:
            arms = [f"when {draw(_guard())} -> {target(i)}" for _ in range(draw(st.integers(1, 3)))]
            if draw(st.integers(0, 4)):  # sometimes non-exhaustive: both engines must raise alike
                arms.append(f"otherwise -> {target(i)}")
            body = " ".join(arms)
        lines.append(f"stage s{i} {{ {body} }}")
    return "\n".join(lines) + "\n"


VALUES = st.fixed_dictionaries({}, optional={
    "E1": st.one_of(st.sampled_from(ENUMS["E1"]), st.just("Z"), st.just(1)),
    "E2": st.sampled_from(ENUMS["E2"] + ["Q"]),
    "B1": st.one_of(st.booleans(), st.just(1), st.just("true")),
    "B2": st.booleans(),
    "N": st.one_of(st.integers(-3, 103), st.just(7.0), st.just(7.5), st.just(True), st.just("7")),
    "F": st.one_of(st.floats(-100, 100), st.integers(-5, 5), st.just(None)),
    "D": st.one_of(st.integers(0, 4), st.just(5)),
    "Day": st.one_of(st.sampled_from(["2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23"]),
                     st.just("2026-02-30"), st.just(20261123), st.just("23/11/2026")),
    "At": st.one_of(st.sampled_from(["2026-11-21T10:00", "2026-11-22T23:59:59Z", "2026-11-23T01:00+02:00",
                                     "2026-11-22"]), st.just("noon")),
    "now": st.one_of(st.sampled_from(["2026-11-23T10:00", "2026-11-24"]), st.just("tomorrow")),
    "Wait": st.one_of(st.sampled_from(["90 minutes", "2 hours", "PT1H", "1 day 2 hours"]), st.just(3600)),
    "Code": st.one_of(st.sampled_from(["AB1", "ab1", "AB12", ""]), st.just(7)),
    "Other": st.sampled_from(["AB1", "ZZ"]),
    "Opt": st.one_of(st.none(), st.floats(0, 5), st.just("x")),
    "Dflt": st.one_of(st.none(), st.integers(0, 10), st.just(11)),
    "E3": st.sampled_from(["Low", "5+ times", "5 times"]),
})
DATA_VALUES = st.fixed_dictionaries({
    "Segs": st.one_of(
        st.lists(st.fixed_dictionaries({"flown": st.booleans(), "cabin": st.sampled_from(ENUMS["E1"]),
                                        "price": st.integers(0, 100)}), min_size=2, max_size=3),
        st.lists(st.fixed_dictionaries({"flown": st.booleans(), "cabin": st.sampled_from(ENUMS["E1"]),
                                        "price": st.integers(0, 100)},
                                       optional={"note": st.one_of(st.none(), st.sampled_from(["x", "y"]))}),
                 max_size=3),
        st.lists(st.fixed_dictionaries({"flown": st.booleans(), "cabin": st.sampled_from(["A", "Z"])},
                                       optional={"price": st.one_of(st.integers(-1, 101), st.just(5.0)),
                                                 "prise": st.just(1)}), max_size=4),
        st.just({"flown": True}), st.just(3)),
    "Met": st.one_of(st.fixed_dictionaries({"lat": st.integers(0, 1000), "ok": st.booleans()}),
                     st.fixed_dictionaries({}, optional={"lat": st.integers(-1, 1001), "ok": st.just(1),
                                                         "okay": st.booleans()}),
                     st.just([1])),
    "Tags": st.one_of(st.lists(st.sampled_from(["X", "Y"]), min_size=1, max_size=3),
                      st.lists(st.sampled_from(["X", "Y", "Q"]), max_size=4)),
})
ROWS = st.builds(lambda a, b: {**a, **b}, VALUES, DATA_VALUES)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(_program(), st.lists(ROWS, min_size=1, max_size=8))
def test_engine_matches_interpreter_on_random_programs(text: str, rows: list[dict[str, Any]]) -> None:
    scenario = sopgraph.load(text=text, check=False)
    engines = _engines(scenario)
    for values in rows:
        _same(scenario, engines, values)


SCALAR_DECLS = [
    "system F: float", "system Day: date", "system At: datetime", "system Wait: duration", "field Code: string",
    "field Other: string", "system Opt: float?", "system Dflt: int[0..10] = 3", "let Late = now - At > Wait",
    'action Go(on: date, code: string, wait: duration) "go"', 'action Stop "stop"', "output When: datetime",
]
SCALAR_ATOMS = st.one_of(
    st.builds(lambda op, n: f"Day {op} now - {n} days", st.sampled_from(["<", ">=", "==", "!="]), st.integers(0, 3)),
    st.builds(lambda n: f"At <= Day + {n} hours", st.integers(0, 48)),
    st.builds(lambda op, n: f"days_between(Day, At) {op} {n}", st.sampled_from([">=", "=="]), st.integers(-2, 2)),
    st.builds(lambda n: f"Wait > {n} minutes", st.integers(0, 200)),
    *(st.just(a) for a in ['Code matches "^[A-Z]{2}\\d$"', 'Code == "AB1"', "Code != Other",
                           'Code in {"AB1", "ZZ"}', "missing(Opt)", "not missing(Opt) and Opt > 2", "Opt > 2",
                           "Dflt == 3", "abs(F - 5) < 3", "abs(Wait) >= 1 hours", "Late", "At - Day > -(2 hours)",
                           "Wait * 2 < 3 hours"]),
)


@st.composite
def _scalar_program(draw) -> str:
    n = draw(st.integers(1, 4))
    lines = list(SCALAR_DECLS)
    leaves = ["do Stop", "do Go(on = Day + 1 days, code = Code, wait = Wait * 2)", "do Stop { When = At - Wait }",
              'do Go(on = Day, code = "X", wait = 1 weeks) { When = Day }']
    for i in range(n):
        targets = [f"s{j}" for j in range(i + 1, n)] + leaves
        arms = []
        for _ in range(draw(st.integers(1, 3))):
            guard = draw(SCALAR_ATOMS)
            if draw(st.booleans()):
                guard = f"({guard}) {draw(st.sampled_from(['and', 'or']))} ({draw(SCALAR_ATOMS)})"
            arms.append(f"when {guard} -> {draw(st.sampled_from(targets))}")
        if draw(st.integers(0, 4)):
            arms.append(f"otherwise -> {draw(st.sampled_from(targets))}")
        lines.append(f"stage s{i} {{ {' '.join(arms)} }}")
    return "\n".join(lines) + "\n"


def _good_or_bad(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Bad one time in 25 per key: rows with many keys must mostly decide, not fail."""
    return st.integers(0, 24).flatmap(lambda k: bad if k == 0 else good)


SCALAR_VALUES = st.fixed_dictionaries({
    "F": _good_or_bad(st.floats(0, 10), st.just("x")),
    "Day": _good_or_bad(st.sampled_from(["2026-11-20", "2026-11-21", "2026-11-22", "2026-11-23"]),
                        st.sampled_from(["2026-02-30", 20261123, "23/11/2026", None])),
    "At": _good_or_bad(st.sampled_from(["2026-11-21T10:00", "2026-11-22T23:59:59Z", "2026-11-23T01:00+02:00",
                                        "2026-11-22", "2026-11-21T00:00:00.5"]), st.sampled_from(["noon", None])),
    "now": _good_or_bad(st.sampled_from(["2026-11-23T10:00", "2026-11-24", "2026-11-22T12:00Z"]),
                        st.sampled_from(["tomorrow", None])),
    "Wait": _good_or_bad(st.sampled_from(["90 minutes", "2 hours", "PT1H", "1 day 2 hours", "0 seconds"]),
                         st.sampled_from([3600, "soon", None])),
    "Code": _good_or_bad(st.sampled_from(["AB1", "ab1", "AB12", "", "ZZ"]), st.sampled_from([7, None, "x" * 1001])),
    "Other": _good_or_bad(st.sampled_from(["AB1", "ZZ"]), st.just(None)),
    "Opt": _good_or_bad(st.one_of(st.none(), st.floats(0, 5), st.floats(0, 5)), st.just("x")),
    "Dflt": _good_or_bad(st.one_of(st.none(), st.integers(0, 10)), st.just(11)),
})


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(_scalar_program(), st.lists(SCALAR_VALUES, min_size=1, max_size=6))
def test_engine_matches_interpreter_on_random_programs_with_dates_strings_optionals(
        text: str, rows: list[dict[str, Any]]) -> None:
    scenario = sopgraph.load(text=text, check=False)
    engines = _engines(scenario)
    for values in rows:
        _same(scenario, engines, values)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_engine_rejects_non_finite_floats_like_the_interpreter(value: float) -> None:
    s = sopgraph.load(text='system F: float\naction X "x"\naction Y "y"\n'
                           "stage s { when F > 1 -> do X otherwise -> do Y }")
    for eng in _engines(s):
        with pytest.raises(DecideError, match="not finite"):
            eng.decide({"F": value})


# Random procedures (issue 9): actions with arguments on the way, observed values (a list per
# variable, one value per look), and loops back to earlier stages bounded by `up to N times`.

PROC_HEAD = [
    "field E1: A | B | C", "field B1: bool", "system N: int[0..100]",
    "system Sig: bool", "system Lvl: int[0..3]",
    "let Up = Sig and Lvl > 1", "let Fee = N * 2 + Lvl",
    'action Ping(k: int[0..1000], tag: A | B | C) "ping"', 'action Note "note"',
    'action Go "go"', 'action Stop(amount: int[0..1000]) "stop"',
]


@st.composite
def _proc_guard(draw) -> str:
    return draw(st.sampled_from([
        "Sig", "not Sig", "Up", "Lvl >= 2", "Lvl == 0", "E1 == A", "B1", "N > 50", "Fee > 20",
        "Sig and B1", "Lvl > 0 or E1 == C",
    ]))


@st.composite
def _procedure(draw) -> str:
    n = draw(st.integers(1, 5))
    lines = list(PROC_HEAD)

    def steps() -> str:
        calls = draw(st.lists(st.sampled_from(["do Note -> ", "do Ping(k = Fee, tag = E1) -> ",
                                               "do Ping(k = Lvl, tag = A) -> "]), max_size=2))
        return "".join(calls)

    def target(i: int) -> str:
        leaf = draw(st.sampled_from(["do Go", "do Stop(amount = N)", "do Stop(amount = Lvl)"]))
        forward = [f"s{j}" for j in range(i + 1, n)]
        choice = draw(st.sampled_from(forward + [leaf, leaf]))
        return steps() + choice

    def back(i: int) -> str:
        j = draw(st.integers(0, i))
        return f"{steps()}s{j} up to {draw(st.integers(1, 2))} times"

    for i in range(n):
        observe = "observe Sig, Lvl " if i == 0 else draw(st.sampled_from(["", "observe Sig ", "observe Lvl "]))
        arms = []
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["fwd", "fwd", "back"]))
            arms.append(f"when {draw(_proc_guard())} -> {target(i) if kind == 'fwd' else back(i)}")
        if draw(st.booleans()):
            arms.insert(0, f"-> {back(i)}") if not arms or draw(st.booleans()) else None
            arms = [a for a in arms if a is not None]
            if arms[0].startswith("->"):
                arms = [arms[0], f"otherwise -> {target(i)}"]
            else:
                arms.append(f"otherwise -> {target(i)}")
        elif draw(st.integers(0, 4)):
            arms.append(f"otherwise -> {target(i)}")
        lines.append(f"stage s{i} {{ {observe}{' '.join(arms)} }}")
    return "\n".join(lines) + "\n"


def _mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(good, good, good, good, bad)


PROC_VALUES = st.fixed_dictionaries({
    "E1": _mostly(st.sampled_from(ENUMS["E1"]), st.just("Z")),
    "B1": st.booleans(),
    "N": _mostly(st.integers(0, 100), st.sampled_from([-3, 7.0, "7"])),
    "Sig": _mostly(st.lists(st.booleans(), min_size=3, max_size=10),
                   st.one_of(st.just(True), st.lists(st.booleans(), max_size=2), st.just([True, 3]))),
    "Lvl": _mostly(st.lists(st.integers(0, 3), min_size=3, max_size=10),
                   st.one_of(st.just(2), st.lists(st.integers(-1, 4), max_size=3))),
})


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(_procedure(), st.lists(PROC_VALUES, min_size=1, max_size=8))
def test_engine_matches_interpreter_on_random_procedures(text: str, rows: list[dict[str, Any]]) -> None:
    scenario = sopgraph.load(text=text, check=False)
    assert scenario.procedural
    engines = _engines(scenario)
    for values in rows:
        _same(scenario, engines, values)


# ---------------------------------------------------------------------------------------------
# Output ranges are enforced at decide time, identically in every engine form

FEE = """
field Reason: Sick | Other "why"
system NightlyRate: int[0..) "rate"
output Fee: float[0..) "fee"
output Nights: int[1..30] = 1 "nights"
action PartialRefund "part" [moves_money]
action FullRefund "all" [moves_money]
stage s1 { match Reason { Sick -> do FullRefund { Nights = NightlyRate / 100 }
                          Other -> do PartialRefund { Fee = NightlyRate - 500 } } }
"""


@pytest.mark.parametrize("values, fragment", [
    ({"Reason": "Other", "NightlyRate": 89}, "output `Fee` = -411 is outside float[0..) "
                                              "(set by `Fee = NightlyRate - 500` at s1)"),
    ({"Reason": "Sick", "NightlyRate": 250}, "output `Nights` = 2.5 is not an integer"),
    ({"Reason": "Sick", "NightlyRate": 5000}, "output `Nights` = 50.0 is outside int[1..30]"),
])
def test_an_output_outside_its_declared_range_is_a_decide_error(values: dict[str, Any], fragment: str) -> None:
    scenario = sopgraph.load(text=FEE, check=False)  # the checker would refuse it (E204, see test_checker)
    with pytest.raises(DecideError, match=re.escape(fragment)) as caught:
        interpret(scenario, values)
    assert caught.value.output is not None and caught.value.stage == "s1"
    for eng in _engines(scenario):
        with pytest.raises(DecideError) as got:
            eng.decide(values)
        assert got.value.message == caught.value.message, eng.mode
    ok = {"Reason": "Other", "NightlyRate": 620}
    assert [e.decide(ok).finals for e in _engines(scenario)] == [{"Action": "PartialRefund", "Fee": 120,
                                                                  "Nights": 1}] * 2


QUOTED_VALUES = ROOT / "tests" / "data" / "lang_quoted_values.sop"


def test_quoted_enum_values_decide_alike_in_every_engine_form() -> None:
    """`"5+ times"`, `"Traffic/URL Cloaking"`: values that are not names are values like any other; a value
    off the domain is refused with the domain shown as written."""
    scenario = sopgraph.load(QUOTED_VALUES)
    engines = _engines(scenario)
    cases = [({"Reports": "5+ times"}, {"Action": "Remove", "Severity": "Very high"}),
             ({"Reports": "1-2 times", "Kind": "Traffic/URL Cloaking"}, {"Action": "Remove", "Severity": "Very high"}),
             ({"Reports": "1-2 times", "Kind": "count"}, {"Action": "Review", "Severity": "Low"}),
             ({"Reports": "Never"}, {"Action": "Keep", "Severity": "Low"})]
    for values, finals in cases:
        assert interpret(scenario, values).finals == finals
        _same(scenario, engines, values)
    with pytest.raises(DecideError, match=re.escape('value "5 times" is not in the domain of `Reports` '
                                                    '(Never | "1-2 times" | "5+ times")')):
        interpret(scenario, {"Reports": "5 times"})
    _same(scenario, engines, {"Reports": "5 times"})

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(_assignments(scenario))
    def run(values: dict[str, Any]) -> None:
        _same(scenario, engines, values)

    run()


LIST_OUTPUTS = ROOT / "tests" / "data" / "lang_list_outputs.sop"


def test_a_list_output_is_a_set_in_the_enums_order_in_every_engine_form() -> None:
    """`ProblemTypes = [Device, Network when NoSignal, Billing when BillingIssue]`: the items whose condition
    holds, each once, reported in the enum's declaration order; unset, the default `[]`."""
    scenario = sopgraph.load(LIST_OUTPUTS)
    engines = _engines(scenario)
    cases = [({"DeviceBroken": True, "NoSignal": True, "BillingIssue": True}, ["Billing", "Network", "Device"]),
             ({"DeviceBroken": True, "NoSignal": False, "BillingIssue": False}, ["Device"]),
             ({"DeviceBroken": False, "NoSignal": True, "BillingIssue": False}, ["Network"]),
             ({"DeviceBroken": False, "NoSignal": False, "BillingIssue": False}, [])]
    for values, problems in cases:
        assert interpret(scenario, values).finals["ProblemTypes"] == problems
        _same(scenario, engines, values)
    assert "[*((" in engines[0].source  # the generated form builds the list itself

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(_assignments(scenario))
    def run(values: dict[str, Any]) -> None:
        _same(scenario, engines, values)

    run()


def test_a_list_output_outside_its_length_is_refused_in_every_engine_form() -> None:
    text = LIST_OUTPUTS.read_text().replace("list[..3] of", "list[1..2] of")
    scenario = sopgraph.load(text=text, check=False)
    values = {"DeviceBroken": True, "NoSignal": True, "BillingIssue": True}
    with pytest.raises(DecideError, match=re.escape(
            'output `ProblemTypes` = ["Device", "Network", "Billing"] has 3 values; it holds at most 2')):
        interpret(scenario, values)
    for row in (values, {"DeviceBroken": False, "NoSignal": True, "BillingIssue": False}):
        _same(scenario, _engines(scenario), row)
    at_least = sopgraph.load(text=text.replace("list[1..2] of", "list[2..3] of"), check=False)
    with pytest.raises(DecideError, match="has 1 value; it holds at least 2"):
        interpret(at_least, {"DeviceBroken": False, "NoSignal": True, "BillingIssue": False})
    _same(at_least, _engines(at_least), {"DeviceBroken": False, "NoSignal": True, "BillingIssue": False})


# ---------------------------------------------------------------------------------------------
# For-each steps and list positions: one action per item, a read past the end fails the decision

REFUNDS_SOP = Path(__file__).resolve().parent / "data" / "refunds.sop"
TWO_REFUNDABLE = {
    "Fees": [[{"id": "A1", "amount": 5, "refundable": True}, {"id": "B2", "amount": 7, "refundable": False},
              {"id": "C3", "amount": 9, "refundable": True}]],
    "Legs": [{"origin": "CDG", "flown": True}, {"origin": "JFK", "flown": False}], "Attempts": []}


def _forms(scenario: ir.Scenario) -> list[Any]:
    tree = Engine(scenario)
    saved = engine_mod._expanded_size
    engine_mod._expanded_size = lambda s: None  # the table-driven loop form
    try:
        loop = Engine(scenario)
    finally:
        engine_mod._expanded_size = saved
    assert (tree.mode, loop.mode) == ("tree", "loop")
    return [tree.decide, loop.decide, lambda v: interpret(scenario, v)]


def test_a_for_each_step_carries_the_action_out_once_per_item() -> None:
    REFUNDS = sopgraph.load(REFUNDS_SOP)  # noqa: N806 - the program under test
    statement = {"name": "Statement", "args": {"fees": TWO_REFUNDABLE["Fees"][0], "origin": "CDG"}}
    expected = [{"name": "Refund", "args": {"fee_id": "A1", "amount": 5}},
                {"name": "Refund", "args": {"fee_id": "C3", "amount": 9}}, statement, {"name": "Close", "args": {}}]
    for decide_with in _forms(REFUNDS):
        d = decide_with(TWO_REFUNDABLE)
        assert (d.path, d.actions) == (["fees", "done"], expected)
    none = {**TWO_REFUNDABLE, "Fees": [[{"id": "A1", "amount": 5, "refundable": False}]]}
    assert [a["name"] for a in decide(REFUNDS, none).actions] == ["Nothing"]


def test_a_list_position_past_the_end_fails_the_decision() -> None:
    REFUNDS = sopgraph.load(REFUNDS_SOP)  # noqa: N806 - the program under test
    no_legs = {**TWO_REFUNDABLE, "Legs": []}
    with pytest.raises(DecideError, match="has 0 items; it holds at least 1"):
        decide(REFUNDS, no_legs)
    text = REFUNDS_SOP.read_text(encoding="utf-8")
    unguarded = sopgraph.load(text=text.replace("len(Attempts) > 0 and last(Attempts) > 3", "last(Attempts) > 3"),
                              check=False)
    plain = {**TWO_REFUNDABLE, "Fees": [[]]}
    for decide_with in _forms(unguarded):
        with pytest.raises(DecideError, match=r"`last\(Attempts\)` is past the end: the list is empty"):
            decide_with(plain)
        assert decide_with({**plain, "Attempts": [1, 5]}).finals == {"Action": "Retry"}
