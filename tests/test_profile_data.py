"""Profile intents over lists and records: record fields as keys, `any`/`all`/`count`/`len` under `when:`,
lowered like the `.sop`'s guards so synthesis reaches exactly the paths they allow and builds values that
satisfy them; lists and records used as one value are located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sopgraph.cases.profiles import parse_profile
from sopgraph.cases.synth import plan, synthesize
from sopgraph.language import ir
from sopgraph.language.parse import load_source

ROOT = Path(__file__).resolve().parents[1]

SOP = """scenario trip "Trips"
type Segment = record { flown: bool, cabin: Economy | Business }
field Request: Cancel | Ask "What the caller wants. Cancel = cancel; Ask = asks."
system Segments: list[1..4] of Segment "The segments."
system Metrics: record { latency: int[0..1000], errors: int[0..) } "Service metrics."
system Insurance: record { active: bool } "The insurance."
action Explain "Explain."
action Refund "Refund the unflown part." [moves_money]
action Credit "Give a travel credit."
action Slow "Report the slow service."
action Nothing "Nothing to cancel."
stage s1 "triage" {
    when Request == Ask -> do Explain
    when Metrics.latency > 200 -> do Slow
    when all(s in Segments where s.flown) -> do Nothing
    when Insurance.active -> do Refund
    otherwise -> do Credit
}
"""


@pytest.fixture(scope="module")
def trip() -> ir.Scenario:
    loaded = load_source(None, text=SOP, name="trip.sop")
    assert loaded.scenario is not None, [d.message for d in loaded.diagnostics]
    return loaded.scenario


def profile_of(trip: ir.Scenario, intents: str):
    profile, diags = parse_profile("intents:\n" + intents, trip, file="trip.profile.yaml")
    return profile, diags


def test_record_fields_as_keys_and_list_conditions_select_exactly_their_paths(trip: ir.Scenario) -> None:
    profile, diags = profile_of(trip, """
  slow:
    requires: {Request: Cancel, Metrics.latency: "> 200"}
  midtrip_insured:
    requires: {Request: Cancel, Insurance.active: true, Metrics.latency: "<= 200"}
    when: "any(s in Segments where s.flown) and len(Segments) >= 2"
  all_flown:
    requires: {Request: Cancel, Metrics.latency: 0}
    excludes: {Insurance.active: true}
    when: ["count(s in Segments where s.flown) == len(Segments)"]
""")
    assert diags == [], [d.message for d in diags]
    p = plan(trip, profile)
    reached = {name: sorted(e.action for e in p.paths if name in e.intents) for name in profile.intents}
    assert reached == {"slow": ["Slow"], "midtrip_insured": ["Nothing", "Refund"], "all_flown": ["Nothing"]}
    result = synthesize(trip, profile, 30, seed=2)
    seen = set()
    for row in result.rows:
        s = row["system"]
        if row["intent"] == "midtrip_insured":
            seen.add(row["intent"])
            assert s["Insurance"]["active"] is True and s["Metrics"]["latency"] <= 200
            assert len(s["Segments"]) >= 2 and any(x["flown"] for x in s["Segments"])
        elif row["intent"] == "slow":
            seen.add(row["intent"])
            assert s["Metrics"]["latency"] > 200
        elif row["intent"] == "all_flown":
            seen.add(row["intent"])
            assert all(x["flown"] for x in s["Segments"]) and s["Insurance"]["active"] is False
            assert s["Metrics"]["latency"] == 0
    assert seen == {"slow", "midtrip_insured", "all_flown"}


def test_impossible_list_conditions_are_e607(trip: ir.Scenario) -> None:
    _profile, diags = profile_of(trip, """
  never:
    when: "len(Segments) == 0"
  contradiction:
    requires: {Insurance.active: true}
    excludes: {Insurance.active: true}
""")
    assert sorted(d.code for d in diags) == ["E607", "E607"]


@pytest.mark.parametrize("intents, code, needle", [
    ("  x:\n    requires: {Segments: true}\n", "E605", "`Segments` is a list"),
    ("  x:\n    requires: {Insurance: true}\n", "E605", "`Insurance` is a record"),
    ("  x:\n    when: \"Insurance\"\n", "E606", "`Insurance` is a record, not a condition"),
    ("  x:\n    requires: {Metrics.latncy: 3}\n", "E604", "`Metrics.latncy` is not a variable"),
    ("  x:\n    requires: {Metrics.latency: 5000}\n", "E605", "5000"),
])
def test_lists_and_records_as_one_value_are_located_errors(trip: ir.Scenario, intents: str, code: str,
                                                           needle: str) -> None:
    _profile, diags = profile_of(trip, intents)
    assert [d.code for d in diags] == [code], [d.message for d in diags]
    assert needle in diags[0].message
    assert diags[0].span is not None and diags[0].span.line >= 2


def test_flight_cancellation_profile_uses_list_and_record_conditions() -> None:
    sop = ROOT / "examples" / "flight_cancellation.sop"
    loaded = load_source(sop)
    assert loaded.scenario is not None
    text = (ROOT / "examples" / "flight_cancellation.profile.yaml").read_text()
    profile, diags = parse_profile(text, loaded.scenario, file="flight_cancellation.profile.yaml")
    assert diags == [], [d.message for d in diags]
    p = plan(loaded.scenario, profile)
    leg = [e for e in p.paths if "return_leg_only" in e.intents]
    assert leg and all(e.action != "NothingToCancel" for e in leg)  # something is still unflown
    ill = [e for e in p.paths if "ill_traveller" in e.intents]
    assert ill
