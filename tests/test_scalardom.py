"""Dates, durations, strings and optionals in the constraint domain: paths, witnesses (boundary values
on both sides of a date cut-off, strings that match a pattern and strings that do not), E301 examples and
synthesized cases (dates as ISO strings) — every witness verified by the engine."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import sopgraph
from sopgraph.language import ir
from sopgraph.logic.checker import check_file
from sopgraph.logic.engine import decide
from sopgraph.logic.paths import iter_paths

HEAD = ('system Departure: date "d"\nsystem BookedAt: datetime "b"\nsystem Waited: duration "w"\n'
        'field Code: string "c"\nfield Other: string "o"\nsystem Voucher: float? "v"\n'
        'action A "a"\naction B "b"\n')


def _paths(body: str) -> tuple[ir.Scenario, list[Any]]:
    scenario = sopgraph.load(text=HEAD + 'stage s1 "x" { ' + body + " }", check=False)
    return scenario, list(iter_paths(scenario))


def _verified(scenario: ir.Scenario, info: Any, which: str = "witness") -> dict[str, Any]:
    """The path's witness, checked to decide that very path with the engine."""
    values = getattr(info, which)
    assert values is not None, f"{info.id} has no {which}"
    assert decide(scenario, values).finals["Action"] == info.action
    return dict(values)


@pytest.mark.parametrize(("op", "inside", "outside"), [
    (">", "2026-03-02", "2026-03-01"),  # the day after the cut-off / the cut-off itself
    ("<", "2026-02-28", "2026-03-01"),  # the day before / the cut-off
    (">=", "2026-03-01", "2026-02-28"),
])
def test_boundary_witnesses_sit_on_both_sides_of_a_date_cutoff(op: str, inside: str, outside: str) -> None:
    scenario, paths = _paths(f'when Departure {op} date("2026-03-01") -> do A otherwise -> do B')
    assert [p.action for p in paths] == ["A", "B"] and all(p.status == "feasible" for p in paths)
    assert _verified(scenario, paths[0], "boundary_witness")["Departure"] == inside
    assert _verified(scenario, paths[1], "boundary_witness")["Departure"] == outside


def test_a_window_relative_to_now_has_witnesses_on_both_sides() -> None:
    scenario, paths = _paths("when BookedAt > now - 24 hours -> do A otherwise -> do B")
    assert [p.action for p in paths] == ["A", "B"]
    for p in paths:
        w = _verified(scenario, p)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", w["BookedAt"]) and w["now"].startswith("20")


def test_durations_and_days_between_have_witnesses() -> None:
    scenario, paths = _paths("when Waited > 2 hours and days_between(Departure, BookedAt) >= 3 -> do A "
                             "otherwise -> do B")
    assert [p.status for p in paths] == ["feasible", "feasible"]
    w = _verified(scenario, paths[0])
    assert w["Waited"] != "2 hours"


def test_pattern_witnesses_match_and_do_not_match() -> None:
    pattern = r"^[A-Z]{3}-\d{5}$"
    scenario, paths = _paths(f'when Code matches "{pattern}" -> do A otherwise -> do B')
    assert re.fullmatch(pattern, _verified(scenario, paths[0])["Code"])
    assert not re.fullmatch(pattern, _verified(scenario, paths[1])["Code"])


def test_string_equality_between_variables_has_witnesses() -> None:
    scenario, paths = _paths('when Code != Other and Code == "W1" -> do A otherwise -> do B')
    a = _verified(scenario, paths[0])
    assert a["Code"] == "W1" and a["Other"] != "W1"
    _verified(scenario, paths[1])


def test_a_missing_optional_is_a_witness_of_its_own() -> None:
    scenario, paths = _paths("when missing(Voucher) -> do A when Voucher > 10 -> do B otherwise -> do A")
    first = _verified(scenario, paths[0])
    assert first["Voucher"] is None
    assert _verified(scenario, paths[1])["Voucher"] > 10


def test_abs_is_solved_like_max() -> None:
    text = 'system X: int[-10..10] "x"\naction A "a"\naction B "b"\nstage s "x" { when abs(X) > 7 -> do A otherwise -> do B }'
    scenario = sopgraph.load(text=text)
    paths = list(iter_paths(scenario))
    assert [p.status for p in paths] == ["feasible", "feasible"]
    assert abs(_verified(scenario, paths[0], "boundary_witness")["X"]) > 7
    assert abs(_verified(scenario, paths[1], "boundary_witness")["X"]) <= 7
    assert all(p.constraints.get("X") for p in paths)  # solved into the domain of X, not a residual


def test_a_non_exhaustive_date_branch_gives_an_example() -> None:
    diags = check_file("t.sop", text=HEAD + 'stage s1 "x" { when Departure > date("2026-03-01") -> do A '
                                            'when Departure < date("2026-03-01") -> do B }').diagnostics
    e301 = [d for d in diags if d.code == "E301"]
    assert e301 and e301[0].witness is not None and e301[0].witness["Departure"] == "2026-03-01"
    assert "uncovered: Departure = 2026-03-01" in e301[0].notes


def test_synthesized_cases_carry_dates_as_iso_strings(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sopgraph.cli import main

    sop = tmp_path / "t.sop"
    sop.write_text(HEAD + 'stage s1 "x" { when Departure > now + 2 days and Code matches "^[A-Z]{2}$" -> do A '
                          'otherwise -> do B }', encoding="utf-8")
    out = tmp_path / "cases.jsonl"
    res = CliRunner().invoke(main, ["synth", str(sop), "-n", "4", "-o", str(out)])
    assert res.exit_code == 0, res.output
    scenario = sopgraph.load(sop)
    cases = [json.loads(line) for line in out.read_text().splitlines()]
    assert {c["expected_finals"]["Action"] for c in cases} == {"A", "B"}
    for case in cases:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", case["system"]["Departure"])
        assert decide(scenario, {**case["truth"], **case["system"]}).finals == case["expected_finals"]


def test_observed_dates_take_one_value_per_look_in_witnesses() -> None:
    text = ('system LastSeen: datetime "last seen"\naction Restart "r"\naction Done "d"\naction Human "h"\n'
            'stage s1 "look" { observe LastSeen when LastSeen > now - 10 minutes -> do Done '
            "otherwise -> do Restart -> s2 }\n"
            'stage s2 "again" { observe LastSeen when LastSeen > now - 10 minutes -> do Done otherwise -> do Human }')
    scenario = sopgraph.load(text=text)
    paths = list(iter_paths(scenario))
    assert [p.action for p in paths] == ["Done", "Done", "Human"]
    for p in paths:
        w = _verified(scenario, p)
        assert isinstance(w["LastSeen"], list) and len(w["LastSeen"]) == len(p.stages)
        assert all(re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", x) for x in w["LastSeen"])


@pytest.mark.parametrize(("name", "description", "first"), [
    ("GivenEmail", "The account e-mail address the caller gives.", "alex.morgan@example.com"),
    ("OnFile", "the e-mail address on the account", "alex.morgan@example.com"),
    ("PhoneNumber", "", "+44 7700 900123"),
    ("OrderRef", "The order reference.", "REF-20417"),
    ("CustomerName", "", "Alex Morgan"),
    ("Channel", "Where the order came from.", "text"),
])
def test_string_samples_read_like_the_variable(name: str, description: str, first: str) -> None:
    """A simulated customer who gives "text" as an e-mail address tests no agent: a string's sample values
    come from what its name and description say it is, two different ones (for `A != B` witnesses)."""
    from sopgraph.logic.scalardom import string_samples

    a, b = string_samples(name, description)
    assert a == first and a != b


def test_a_case_s_strings_read_like_their_variables() -> None:
    import sopgraph
    from sopgraph.cases.profiles import default_profile
    from sopgraph.cases.synth import synthesize

    sc = sopgraph.load(text='field Given: string "the e-mail address the caller gives"\n'
                            'system OnFile: string "the e-mail address on the account"\naction Refuse "r"\n'
                            'action Help "h"\nstage s { when Given != OnFile -> do Refuse\n otherwise -> do Help }\n')
    cases = synthesize(sc, default_profile(sc), 4, seed=0, min_per_path=1).cases
    values = {c.truth["Given"] for c in cases} | {c.system["OnFile"] for c in cases}
    assert values and all("@example." in v for v in values)
    assert any(c.truth["Given"] != c.system["OnFile"] for c in cases)


def _strings_sop(n: int) -> str:
    """A string compared with `n` literals, and a list of records whose string field is tested inside
    `any(…)` (the shape that left hundreds of feasibility questions open, issue 31)."""
    words = [f"c{i:03d}" for i in range(n)]
    known = ", ".join(f'"{w}"' for w in words[::2])
    special = ", ".join(f'"{w}"' for w in words[1::3])
    return f"""scenario strings "Strings"
type Seg = record {{ kind: string, flown: bool }}
field Code: string "the reason code"
field Region: string "the region"
field Segments: list[0..4] of Seg "the segments"
let Known = Code in {{{known}}}
let Special = any(s in Segments where s.kind in {{{special}}} and not s.flown)
action Accept "accept" [ends_dialogue]
action Reject "reject"
action Ask "ask again"
stage s1 "Classify" {{
    when Known and Special -> do Accept
    when Code == "{words[0]}" or Region in {{"north", "south"}} -> s2
    when Known -> do Ask
    otherwise -> do Reject
}}
stage s2 "Region" {{
    when any(s in Segments where s.kind == "{words[1]}") -> do Accept
    when Region == "north" -> do Ask
    otherwise -> do Reject
}}
"""


@pytest.mark.parametrize("n", [10, 30])
def test_strings_compared_with_literals_are_decided_exactly(n: int) -> None:
    """Membership in literal lists, also inside `any(…)`: no question left open (I302/I303), every path
    has a witness the engine takes, and the constraint listing names the literals."""
    checked = check_file("strings.sop", text=_strings_sop(n))
    codes = [d.code for d in checked.diagnostics]
    assert "I302" not in codes and "I303" not in codes, [d.message for d in checked.diagnostics]
    scenario = sopgraph.load(text=_strings_sop(n), check=False)
    infos = list(iter_paths(scenario))
    assert len(infos) == 6
    for info in infos:
        _verified(scenario, info)
    texts = " ".join(f"{k} {v}" for info in infos for k, v in info.constraints.items())
    assert '"c000"' in texts and "any other text" in texts


def test_only_strings_read_against_literals_become_finite_domains() -> None:
    """`==`/`in` against quoted literals: the literals plus one other text (listed first: the plausible
    sample); `matches`, a comparison with another string or a copy keep the witness search."""
    from sopgraph.logic.scalardom import finite_strings
    text = HEAD + ('field Email: string "the customer\'s e-mail"\nfield Copy: string "c"\nlet C2 = Copy\n'
                   'stage s1 "x" {\n    when Email in {"a@b.c", "x"} and Code == "K" -> do A\n'
                   '    when Code matches "[0-9]+" -> do B\n    when Other == Code -> do A\n'
                   '    when C2 == "z" -> do A\n    otherwise -> do B\n}\n')
    scenario = sopgraph.load(text=text, check=False)
    found = finite_strings(scenario)
    assert set(found) == {"Email"}
    other, *lits = found["Email"]
    assert lits == ["a@b.c", "x"] and other not in lits and "@" in other


def test_a_literal_outside_a_finite_string_domain_is_still_decided() -> None:
    """The first value of a finite string domain stands for every other text: a condition from outside
    the program (a profile's `requires: {Code: "zzz"}`) that compares it with a literal the program never
    mentions is feasible, with that literal as its witness, and its negation keeps the program's literals."""
    from sopgraph.logic import domain
    scenario = sopgraph.load(text='scenario s "s"\nfield Code: string "c"\naction A "a"\naction B "b"\n'
                                  'stage s { when Code == "a" -> do A\n otherwise -> do B }\n', check=False)
    zzz = ir.Compare(op="==", left=ir.Var(name="Code"), right=ir.Lit(value="zzz"))
    full = domain.full_box(scenario)
    boxes = domain.constrain(scenario, full, zzz, True)
    assert boxes and domain.witness(scenario, boxes[0]) == {"Code": "zzz"}
    both = domain.constrain(scenario, boxes[0], ir.Compare(op="==", left=ir.Var(name="Code"),
                                                           right=ir.Lit(value="a")), True)
    assert not any(domain.is_feasible(scenario, b) for b in both)
    rest = domain.constrain(scenario, full, zzz, False)
    values = {domain.witness(scenario, b)["Code"] for b in rest}
    assert values and "zzz" not in values
