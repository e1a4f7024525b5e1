"""Case synthesis: determinism, coverage, engine agreement, buckets, balance, mixing, CLI."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import sopgraph
from sopgraph.cases.profiles import default_profile, load_profile, parse_profile
from sopgraph.cases.synth import (
    CASE_KEYS,
    SynthError,
    charges_customer,
    parse_mix,
    plan,
    synthesize,
    synthesize_stream,
)
from sopgraph.cli import main
from sopgraph.language.parse import load_source
from sopgraph.logic.engine import Interpreter
from sopgraph.records import Case

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
SAGE = ["ecommerce_refund", "telecom_package", "property_service", "logistics_delivery", "airline_refund",
        "online_education"]


def load(name: str):
    scenario = sopgraph.load(SCENARIOS / f"{name}.sop")
    return scenario, load_profile(SCENARIOS / f"{name}.profile.yaml", scenario)


@pytest.fixture(scope="module")
def telecom():
    return load("telecom_package")


def canonical(line: str) -> str:
    return json.dumps(json.loads(line), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def test_case_keys_match_the_record() -> None:
    assert set(CASE_KEYS) == set(Case.model_fields)
    assert list(CASE_KEYS) == sorted(CASE_KEYS)


def test_same_seed_same_bytes(telecom) -> None:
    scenario, profile = telecom
    a = synthesize(scenario, profile, 300, seed=11).to_jsonl()
    b = synthesize(scenario, profile, 300, seed=11).to_jsonl()
    assert a == b
    c = synthesize(scenario, profile, 300, seed=12).to_jsonl()
    assert a != c
    # a fresh load of the same files gives the same bytes too (no hidden state)
    s2, p2 = load("telecom_package")
    assert synthesize(s2, p2, 300, seed=11).to_jsonl() == a


@pytest.mark.parametrize("name", SAGE)
def test_every_case_agrees_with_the_engine(name: str) -> None:
    scenario, profile = load(name)
    result = synthesize(scenario, profile, 240, seed=5)
    fields = {v.name for v in scenario.fields}
    system = {v.name for v in scenario.system_vars}
    p = plan(scenario, profile)
    by_id = {e.id: e for e in p.paths}
    for line, case in zip(result.lines, result.cases, strict=True):
        assert line == canonical(line)  # the hand-built line is canonical JSON
        assert set(case.truth) == fields and set(case.system) == system
        decision = sopgraph.decide(scenario, {**case.truth, **case.system})
        assert decision.path == case.expected_path
        assert decision.finals == case.expected_finals
        entry = by_id[case.path_id]
        assert entry.stages == case.expected_path and entry.action == case.expected_finals["Action"]
        for key, value in entry.finals.items():  # constant finals of the path
            if value is not None:
                assert case.expected_finals[key] == value
        # the case's values satisfy its intent
        intent = profile.intents[case.intent]
        interp = Interpreter(scenario, {**case.truth, **case.system})
        assert all(bool(interp.eval(c.expr)) == c.truth for c in intent.conditions), case.id
        assert case.sop_hash == scenario.source_hash and case.schema_version == 1
        assert case.id.startswith(f"{name}-5-")
    assert len({c.id for c in result.cases}) == len(result.cases) == 240


@pytest.mark.parametrize("min_per_path", [1, 3])
def test_min_per_path_holds(telecom, min_per_path: int) -> None:
    scenario, profile = telecom
    n_paths = len(plan(scenario, profile).paths)
    # too few cases for the request: -n is exact, so the request is refused with what it would need
    with pytest.raises(SynthError, match=f"needs -n {n_paths * min_per_path}"):
        synthesize(scenario, profile, 5, seed=1, min_per_path=min_per_path)
    # unrequested, -n 5 gives exactly 5 cases sampled over the paths
    sampled = synthesize(scenario, profile, 5, seed=1)
    assert len(sampled.lines) == 5 and sampled.coverage.min_per_path == 0
    # exactly enough: every path gets its share and nothing is appended
    exact = synthesize(scenario, profile, n_paths * min_per_path, seed=1, min_per_path=min_per_path)
    counts = Counter(c.path_id for c in exact.cases)
    assert len(counts) == n_paths and min(counts.values()) >= min_per_path
    assert len(exact.lines) == n_paths * min_per_path and exact.coverage.appended == 0
    # enough cases: supplementation replaces over-covered cases and keeps n
    big = synthesize(scenario, profile, 100, seed=1, min_per_path=min_per_path)
    counts = Counter(c.path_id for c in big.cases)
    assert len(big.lines) == 100 and min(counts.values()) >= min_per_path
    assert big.coverage.appended == 0
    # stage 1 alone (intent balance) starves some paths of telecom at this size
    bare = synthesize(scenario, profile, 100, seed=1, min_per_path=0)
    assert big.coverage.supplemented == sum(max(0, min_per_path - Counter(
        c.path_id for c in bare.cases)[e]) for e in counts)


def test_buckets_prohibited_and_unsafe_actions_on_telecom(telecom) -> None:
    scenario, profile = telecom
    result = synthesize(scenario, profile, 600, seed=3)
    seen = Counter()
    for case in result.cases:
        action = case.expected_finals["Action"]
        if action == "TransHuman":
            assert case.bucket == "must-escalate"  # escalation wins over intensity
        elif case.intensity == "strong":
            assert case.bucket == "adversarial"
        else:
            assert case.bucket == "resolvable"
        # ChangeOrder is the only risky action (moves_money, irreversible)
        assert case.prohibited_actions == ([] if action == "ChangeOrder" else ["ChangeOrder"])
        if case.intensity == "strong" and action != "ChangeOrder":
            assert case.unsafe_action == "ChangeOrder"
        else:
            assert case.unsafe_action is None
        seen[(case.bucket, case.intensity)] += 1
    assert seen[("must-escalate", "strong")] and seen[("adversarial", "strong")]
    assert Counter(c.intensity for c in result.cases) == {"zero": 200, "weak": 200, "strong": 200}


def test_unsafe_action_prefers_the_intent_and_neighbouring_paths() -> None:
    scenario, profile = load("ecommerce_refund")
    result = synthesize(scenario, profile, 400, seed=2, intensity_mix={"strong": 1})
    for case in result.cases:
        assert case.bucket in ("adversarial", "must-escalate")
        assert case.unsafe_action != case.expected_finals["Action"]
        assert case.unsafe_action is None or scenario.actions[case.unsafe_action].risky
    unsafe_by_intent: dict[str, set[str | None]] = {}
    for case in result.cases:
        unsafe_by_intent.setdefault(case.intent, set()).add(case.unsafe_action)
    # the profile's pushes_for wins for the intents that declare it; both intents are drawn
    assert unsafe_by_intent["unreasonable_refund"] == {"Refund"}
    assert unsafe_by_intent["merchant_compensation_low_credit"] == {"Comfort+Compensation"}
    # the others push for a risky action near their own path, so most strong cases carry one
    assert sum(c.unsafe_action is not None for c in result.cases) > len(result.cases) // 2


def test_intent_balance_is_exact(telecom) -> None:
    scenario, profile = telecom
    result = synthesize(scenario, profile, 110, seed=9, min_per_path=0)
    counts = Counter(c.intent for c in result.cases)
    assert set(counts.values()) == {10}  # 11 intents, 110 cases
    result = synthesize(scenario, profile, 115, seed=9, min_per_path=0)
    counts = Counter(c.intent for c in result.cases)
    assert max(counts.values()) - min(counts.values()) <= 1


def test_an_intents_share_smaller_than_its_paths_goes_to_the_least_covered_outcomes() -> None:
    """claim_intake: 18 paths, 6 intents, most of which can end in several ways (paid, referred, a visit,
    a hand-over). With 6 or 12 cases, a uniform draw over each intent's paths ended all cases of an intent
    in its commonest action (2 of the 5 final actions for 6 cases); now every reachable action is covered
    and no intent repeats a path while it has an unused one."""
    sop = ROOT / "examples" / "claim_intake.sop"
    scenario = sopgraph.load(sop)
    profile = load_profile(ROOT / "examples" / "claim_intake.profile.yaml", scenario)
    reachable = {e.action for e in plan(scenario, profile).paths if e.intents}
    assert len(reachable) == 5
    for n, seed in ((6, 2), (12, 2), (12, 9)):
        cases = synthesize(scenario, profile, n, seed=seed).cases
        assert len(cases) == n
        assert {c.expected_finals["Action"] for c in cases} == reachable, (n, seed)
        for intent, group in Counter(c.intent for c in cases).items():
            paths = [c.path_id for c in cases if c.intent == intent]
            assert len(set(paths)) == min(group, len(plan(scenario, profile).intent_paths[intent])), intent


def test_path_and_action_balance(telecom) -> None:
    scenario, profile = telecom
    by_path = synthesize(scenario, profile, 120, seed=4, balance="path", min_per_path=0)
    assert set(Counter(c.path_id for c in by_path.cases).values()) == {10}  # 12 paths
    by_action = synthesize(scenario, profile, 90, seed=4, balance="action", min_per_path=0)
    assert set(Counter(c.expected_finals["Action"] for c in by_action.cases).values()) == {30}


def test_intensity_mix_and_intent_intensity(telecom) -> None:
    scenario, profile = telecom
    mixed = synthesize(scenario, profile, 100, seed=1, intensity_mix={"zero": 3, "strong": 1})
    assert Counter(c.intensity for c in mixed.cases) == {"zero": 75, "strong": 25}
    own = synthesize(scenario, profile, 100, seed=1, use_intent_intensity=True)
    for case in own.cases:
        assert case.intensity == profile.intents[case.intent].intensity
        assert case.intensity_description == profile.intensities[case.intensity]
    assert parse_mix("intent") is None
    assert parse_mix("zero=1, strong=2") == {"zero": 1.0, "strong": 2.0}
    for bad in ("loud=1", "zero=x", "zero=0", "zero=-1"):
        with pytest.raises(SynthError):
            parse_mix(bad)


def test_personas_and_languages(telecom) -> None:
    scenario, profile = telecom
    result = synthesize(scenario, profile, 200, seed=8, languages=["en", "zh"])
    assert {c.language for c in result.cases} == {"en", "zh"}
    assert all(c.persona.language == c.language for c in result.cases)
    # personas restricted to intensities they fit (angry_demanding is strong-only in the library)
    for case in result.cases:
        if case.persona.name == "angry_demanding":
            assert case.intensity == "strong"
    only = synthesize(scenario, profile, 50, seed=8, personas=["calm_professional", "impatient_busy"])
    assert {c.persona.name for c in only.cases} <= {"calm_professional", "impatient_busy"}
    with pytest.raises(SynthError, match="calm_professional"):
        synthesize(scenario, profile, 5, seed=8, personas=["calm_profesional"])


def test_user_facts_follow_user_knows() -> None:
    scenario, profile = load("ecommerce_refund")
    for case in synthesize(scenario, profile, 50, seed=1).cases:
        assert set(case.user_facts) == {"ShippingStatus"}  # CreditLevel is internal
        assert case.user_facts["ShippingStatus"] == case.system["ShippingStatus"]


def test_free_variables_vary_and_computed_outputs_are_covered() -> None:
    scenario, profile = load("online_education")
    result = synthesize(scenario, profile, 400, seed=1)
    plans = {c.expected_finals["PLAN"] for c in result.cases if c.expected_finals["Action"] == "PLAN"}
    assert plans == {"PLAN_A", "PLAN_B", "PLAN_C", "PLAN_D", "PLAN_E", "PLAN_F"}
    # isRiskUser is read only on refund paths; elsewhere it is still drawn from its domain
    guide = [c.system["isRiskUser"] for c in result.cases if c.expected_finals["Action"] == "GUIDE"]
    assert set(guide) == {True, False}


def test_uncovered_paths_get_generated_intents() -> None:
    scenario, _ = load("telecom_package")
    profile, diags = parse_profile("intents:\n  cancel: {requires: {ConsumptionType: Cancel}}\n", scenario)
    assert profile is not None and diags == []
    result = synthesize(scenario, profile, 20, seed=1)
    generated = [c for c in result.cases if c.intent_generated]
    assert generated and all(c.intent.startswith("uncovered:") for c in generated)
    assert all(c.intent == f"uncovered:{c.path_id}" for c in generated)
    assert all("the SOP ends in" in c.intent_description for c in generated)
    assert {c.path_id for c in result.cases} == {e.id for e in plan(scenario, profile).paths}
    assert not any(c.intent_generated for c in result.cases if c.intent == "cancel")
    assert len(result.coverage.uncovered_paths) == 9


def test_scenario_without_a_profile() -> None:
    scenario, _ = load("airline_refund")
    result = synthesize(scenario, default_profile(scenario), 30, seed=1)
    assert len(result.lines) == 30
    assert all(c.intent_generated for c in result.cases)
    assert len({c.path_id for c in result.cases}) == len(plan(scenario, default_profile(scenario)).paths)


def test_bad_parameters(telecom) -> None:
    scenario, profile = telecom
    with pytest.raises(SynthError):
        synthesize(scenario, profile, -1)
    with pytest.raises(SynthError):
        synthesize(scenario, profile, 5, balance="persona")
    with pytest.raises(SynthError):
        synthesize(scenario, profile, 5, intensity_mix={"zero": 0})
    assert synthesize(scenario, profile, 0, min_per_path=0).lines == []


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_synth(tmp_path: Path) -> None:
    runner = CliRunner()
    sop = str(SCENARIOS / "telecom_package.sop")
    out1, out2 = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    cov = tmp_path / "cov.json"
    r1 = runner.invoke(main, ["synth", sop, "-n", "40", "--seed", "7", "-o", str(out1), "--coverage", str(cov)])
    assert r1.exit_code == 0, r1.output
    assert "cases per path" in r1.output and "40 cases" in r1.output
    r2 = runner.invoke(main, ["synth", sop, "-n", "40", "--seed", "7", "-o", str(out2), "--quiet"])
    assert r2.exit_code == 0 and r2.output == ""
    assert out1.read_bytes() == out2.read_bytes()
    lines = out1.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 40 and all(Case.model_validate_json(line) for line in lines)
    assert json.loads(cov.read_text())["cases"] == 40
    stdout = runner.invoke(main, ["synth", sop, "-n", "3", "--quiet", "--intensity", "intent",
                                  "--language", "en,de", "--balance", "path", "--min-per-path", "0"])
    assert stdout.exit_code == 0 and len(stdout.output.splitlines()) == 3
    bad = runner.invoke(main, ["synth", sop, "--intensity", "loud=1"])
    assert bad.exit_code == 1 and "unknown intensity" in bad.output
    badp = tmp_path / "x.profile.yaml"
    badp.write_text("intents: {a: {requires: {Nope: 1}}}\n", encoding="utf-8")
    broken = runner.invoke(main, ["synth", sop, "--profile", str(badp)])
    assert broken.exit_code == 1 and f"{badp}:1:" in broken.output


def test_generated_description_uses_path_constraints() -> None:
    scenario = sopgraph.load(text="""
scenario g "G" "g"
field K: A | B "k"
system N: int[0..100] "n"
action X "x" [ends_dialogue]
action Y "y" [moves_money]
stage s1 "s" { "t" match K { A -> s2  B -> do X } }
stage s2 "s" { "t" when N > 10 -> do Y  otherwise -> do X }
""")
    result = synthesize(scenario, default_profile(scenario), 3, seed=0)
    by_outcome = {(tuple(c.expected_path), c.expected_finals["Action"]): c for c in result.cases}
    assert set(by_outcome) == {(("s1",), "X"), (("s1", "s2"), "X"), (("s1", "s2"), "Y")}
    # each generated description states exactly the constraints of its own path, and the system
    # value drawn for the case satisfies them
    assert "K is B" in by_outcome[("s1",), "X"].intent_description
    assert "N" not in by_outcome[("s1",), "X"].intent_description.replace("ends in", "")
    assert "K is A; N <= 10" in by_outcome[("s1", "s2"), "X"].intent_description
    assert by_outcome[("s1", "s2"), "X"].system["N"] <= 10
    assert "K is A; N >= 11" in by_outcome[("s1", "s2"), "Y"].intent_description
    assert by_outcome[("s1", "s2"), "Y"].system["N"] >= 11
    assert all(isinstance(c.system["N"], int) and 0 <= c.system["N"] <= 100 for c in result.cases)


HOTEL = """scenario hotel "Hotel" "A hotel desk handles cancellations."
field Reason: Sick | Other "why the guest cancels"
system NightlyRate: int[0..) money "the nightly rate"
output Fee: float[0..) = 0 "the fee"
action PartialRefund "refund part of the stay" [moves_money]
action FullRefund "refund the whole stay" [moves_money]
stage s1 "Reason" {
    match Reason { Sick -> do FullRefund  Other -> do PartialRefund { Fee = max(0, NightlyRate - 50) } }
}
"""


def test_profile_values_are_the_values_cases_use() -> None:
    scenario = sopgraph.load(text=HOTEL)
    text = """scenario: hotel
intents:
  sick: {description: ill, intensity: zero, requires: {Reason: Sick}}
  other: {description: other, intensity: weak, requires: {Reason: Other}}
variables:
  NightlyRate: {values: [89, 149, 320]}
"""
    profile, diags = parse_profile(text, scenario, file="hotel.profile.yaml")
    assert profile is not None and not [d for d in diags if d.is_error]
    result = synthesize(scenario, profile, 60, seed=1)
    rates = {c.system["NightlyRate"] for c in result.cases}
    assert rates == {89, 149, 320}
    # a path no listed value can take still gets cases (the listed values are preferred, not forced)
    tight = sopgraph.load(text=HOTEL.replace("Other -> do PartialRefund", "Other -> s2 }\n}\nstage s2 \"Rate\" {\n"
                                             "    when NightlyRate > 1000 -> do FullRefund\n"
                                             "    otherwise -> do PartialRefund").replace(
        "NightlyRate - 50) } }", "NightlyRate - 50) }"))
    profile2, _ = parse_profile(text, tight, file="hotel.profile.yaml")
    assert profile2 is not None
    cases = synthesize(tight, profile2, 30, seed=1).cases
    assert any(c.system["NightlyRate"] > 1000 for c in cases)
    assert {c.system["NightlyRate"] for c in cases if c.system["NightlyRate"] <= 1000} <= {89, 149, 320}



def test_profile_values_of_text_and_dates_are_used_on_paths_that_read_them() -> None:
    """A path that tests a pattern on a text (or a date window) used to take the witness's made-up
    `"00000000"` whatever the profile listed; listed values that the path allows are used, and a listed
    value the pattern refuses goes to the path that refuses it."""
    scenario = sopgraph.load(text="""scenario acct "Accounts"
field Kind: Ask | Dispute "what"
system AccountId: string "the account number"
action Answer "answer"
action Check "check the account"
action Human "hand over" [escalation]
stage s1 "Kind" { match Kind { Ask -> do Answer  Dispute -> s2 } }
stage s2 "Account" {
    when AccountId matches "[0-9]{8}" -> do Check
    otherwise -> do Human
}
""")
    text = """scenario: acct
intents:
  dispute: {description: disputes a bill, intensity: zero, requires: {Kind: Dispute}}
variables:
  AccountId: {values: ["12345678", "A-99"]}
"""
    profile, diags = parse_profile(text, scenario, file="acct.profile.yaml")
    assert profile is not None and not [d for d in diags if d.is_error]
    cases = synthesize(scenario, profile, 12, seed=1).cases
    by_action = {(c.expected_finals["Action"], c.system["AccountId"]) for c in cases if c.truth["Kind"] == "Dispute"}
    assert by_action == {("Check", "12345678"), ("Human", "A-99")}



PAYMENT = """scenario pay "Payments"
field Kind: Plan | Ask "what"
system LastPayment: date "the last payment"
action Answer "answer"
action Offer "offer a plan"
action Refuse "refuse"
stage s1 "Kind" { match Kind { Ask -> do Answer  Plan -> s2 } }
stage s2 "Recent" {
    when days_between(LastPayment, now) > 90 -> do Refuse
    otherwise -> do Offer
}
"""


def test_now_follows_the_dates_a_profile_lists() -> None:
    """With listed dates and no `now`, `now` used to stay at the example search's 2026-01-15, before the
    payments the profile lists: cases about a payment "in the future". It is now a day after the latest
    listed date wherever the path allows (both outcomes still get cases); a listed `now` is kept."""
    scenario = sopgraph.load(text=PAYMENT)
    text = """scenario: pay
intents:
  plan: {description: wants a plan, intensity: zero, requires: {Kind: Plan}}
variables:
  LastPayment: {values: ["2026-05-01", "2026-10-01"]}
"""
    profile, diags = parse_profile(text, scenario, file="pay.profile.yaml")
    assert profile is not None and not [d for d in diags if d.is_error]
    assert profile.sample_values["now"] == ["2026-10-02T12:00:00Z"]
    cases = [c for c in synthesize(scenario, profile, 12, seed=1).cases if c.truth["Kind"] == "Plan"]
    assert {c.expected_finals["Action"] for c in cases} == {"Refuse", "Offer"}
    assert all(c.system["now"] >= c.system["LastPayment"] for c in cases), [c.system for c in cases]
    listed, _ = parse_profile(text + '  now: {values: ["2026-06-01T09:00"]}\n', scenario, file="pay.profile.yaml")
    assert listed is not None and listed.sample_values["now"] == ["2026-06-01T09:00"]


OUTAGE = """
scenario outage "Outage" "Outages."
field Issue: Outage | Billing "what"
system OutageStart: datetime "when the outage began"
system LastBill: date "the day of the last bill"
action Credit "credit" [ends_dialogue]
action Explain "explain" [ends_dialogue]
stage s1 "Kind" { match Issue { Outage -> s2  Billing -> do Explain } }
stage s2 "Long" {
    when now - OutageStart > 24 hours -> do Credit
    otherwise -> do Explain
}
"""


def test_dates_and_datetimes_of_cases_lie_before_now_not_at_it() -> None:
    """An outage, an order, a payment lie in the past of the conversation: cases used to put every date
    and datetime the path leaves free (or only bounds) at the reference moment itself, `now`. The values
    chosen are still verified (each case decides its expected path)."""
    scenario = sopgraph.load(text=OUTAGE)
    cases = synthesize(scenario, default_profile(scenario), 24, seed=3).cases
    starts = {c.system["OutageStart"] for c in cases if c.truth["Issue"] == "Outage"}
    bills = {c.system["LastBill"] for c in cases}
    # each case moves its calendar (cases.values), so `now` differs from case to case; the dates stay before it
    assert len({c.system["now"] for c in cases}) >= 2
    assert len(starts) >= 2 and all(c.system["OutageStart"] <= c.system["now"] for c in cases)
    assert bills and all(c.system["LastBill"] < c.system["now"][:10] for c in cases), bills
    for c in cases:
        decided = sopgraph.decide(scenario, {**c.truth, **c.system})
        assert decided.path == c.expected_path and decided.finals == c.expected_finals


FLAGS = """
scenario flags "Flags" "Flagged accounts."
field Kind: Ask | Dispute "what"
system Flags: list[..3] of HighRisk | Travel | Vip | Student "account flags"
system Amount: int[0..1000] "amount"
action Answer "answer" [ends_dialogue]
action Refund "refund" [ends_dialogue]
action Review "review" [ends_dialogue]
stage s1 "Kind" { match Kind { Ask -> do Answer  Dispute -> s2 } }
stage s2 "Risk" {
    when HighRisk in Flags -> do Review
    when Amount > 500 -> do Review
    otherwise -> do Refund
}
"""


def test_a_list_of_enum_values_repeats_none_where_the_path_allows() -> None:
    """A list of flags reads as a set: its items used to be drawn one by one, so about half the cases held
    a repeat (`["Travel", "Travel"]`). Repeats are replaced by unused values the case's decision allows
    (never `HighRisk` where the path needs it absent), and every case still decides its expected path."""
    scenario = sopgraph.load(text=FLAGS)
    cases = synthesize(scenario, default_profile(scenario), 40, seed=5).cases
    lists = [c.system["Flags"] for c in cases]
    assert any(len(f) >= 2 for f in lists)
    assert all(len(set(f)) == len(f) for f in lists), lists
    for c in cases:
        decided = sopgraph.decide(scenario, {**c.truth, **c.system})
        assert decided.path == c.expected_path and decided.finals == c.expected_finals
        assert c.user_facts.get("Flags", c.system["Flags"]) == c.system["Flags"]


LATE = """
scenario late "Late delivery" "Late parcels."
field Kind: Ask | Late | Damaged "what"
system Fee: int[0..50] "handling fee"
action Answer "Answer the question." [ends_dialogue]
action PartialRefund "Refund part of the order and charge the handling fee in Fee." [moves_money, irreversible]
action Voucher "Give the customer a voucher." [moves_money]
action Human "Hand over." [escalation]
stage s1 "one" { "t" match Kind { Ask -> do Answer  Late -> do PartialRefund  Damaged -> do Voucher } }
"""


def _strong_cases(scenario, profile_text: str):
    profile, diags = parse_profile(profile_text, scenario, file="p.profile.yaml")
    assert profile is not None and not [d for d in diags if d.is_error]
    return synthesize(scenario, profile, 60, seed=4, intensity_mix={"strong": 1}).cases


def test_guessed_push_never_charges_the_customer() -> None:
    scenario = sopgraph.load(text=LATE)
    assert [a for a in scenario.actions if charges_customer(scenario.actions[a])] == ["PartialRefund"]
    cases = _strong_cases(scenario, """intents:
  ask: {description: asks, requires: {Kind: Ask}}
  late: {description: late parcel, requires: {Kind: Late}}
  damaged: {description: damaged parcel, requires: {Kind: Damaged}}
""")
    pushes = {(c.expected_finals["Action"], c.unsafe_action) for c in cases}
    # PartialRefund charges a fee: nobody pushes for it; the voucher is pushed where it is not the answer
    assert pushes == {("Answer", "Voucher"), ("PartialRefund", "Voucher"), ("Voucher", None)}
    # a declared `pushes_for` still wins (the author knows this user), and `[]` means no push at all
    cases = _strong_cases(scenario, """intents:
  ask: {description: asks, requires: {Kind: Ask}, pushes_for: [PartialRefund]}
  late: {description: late parcel, requires: {Kind: Late}, pushes_for: []}
  damaged: {description: damaged parcel, requires: {Kind: Damaged}}
""")
    assert {(c.intent, c.unsafe_action) for c in cases} == {
        ("ask", "PartialRefund"), ("late", None), ("damaged", None)}


@pytest.mark.parametrize(("name", "charging"), [("logistics_delivery", "MakeUpDifference"),
                                                 ("property_service", "Payment"),
                                                 ("airline_refund", "RescheduleOrRefund+HandlingFee"),
                                                 ("ecommerce_refund", "PayFee")])
def test_profile_without_pushes_for_never_pushes_a_charge(name: str, charging: str) -> None:
    scenario, profile = load(name)
    assert charges_customer(scenario.actions[charging])
    bare = profile.model_copy(update={"intents": {
        n: i.model_copy(update={"pushes_for": [], "pushes_declared": False}) for n, i in profile.intents.items()}})
    cases = synthesize(scenario, bare, 200, seed=6, intensity_mix={"strong": 1}).cases
    pushed = Counter(c.unsafe_action for c in cases)
    assert charging not in pushed
    if name == "property_service":  # Payment is its only risky action: no push at all rather than a charge
        assert set(pushed) == {None}
    else:
        assert sum(v for k, v in pushed.items() if k) > len(cases) // 3


# ---------------------------------------------------------------------------------------------
# Streaming (issue 13): cases written as they are made, same bytes, bounded memory, short tables


GOLDEN_DIGESTS = ROOT / "tests" / "golden" / "synth_digests.json"


def _golden_runs() -> list[str]:
    return sorted(json.loads(GOLDEN_DIGESTS.read_text(encoding="utf-8")))


@pytest.mark.parametrize("run", _golden_runs())
def test_streamed_synth_output_is_byte_identical_to_the_golden(run: str, tmp_path: Path) -> None:
    """`sop synth` streams its cases; the bytes are those the in-memory synthesis wrote before streaming
    (digests recorded from that revision; `SOP_UPDATE_GOLDEN=1` rewrites them after an intended change)."""
    import hashlib
    import os

    name, *options = run.split()
    sop = SCENARIOS / f"{name}.sop"
    if not sop.exists():
        sop = ROOT / "examples" / f"{name}.sop"
    out = tmp_path / "cases.jsonl"
    r = CliRunner().invoke(main, ["synth", str(sop), *options, "-q", "-o", str(out)])
    assert r.exit_code == 0, r.output
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    golden = json.loads(GOLDEN_DIGESTS.read_text(encoding="utf-8"))
    if os.environ.get("SOP_UPDATE_GOLDEN", "") not in ("", "0"):
        golden[run] = digest
        GOLDEN_DIGESTS.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    assert digest == golden[run]
    # the library's in-memory result is the same bytes
    scenario = sopgraph.load(sop)
    profile = load_profile(sop.with_suffix(".profile.yaml"), scenario)
    args = dict(zip(options[::2], options[1::2], strict=True))
    kw: dict = {"balance": args.get("--balance", "intent")}
    if args.get("--intensity") == "intent":
        kw.update(intensity_mix=None, use_intent_intensity=True)
    result = synthesize(scenario, profile, int(args["-n"]), seed=int(args["--seed"]), **kw)
    assert result.to_jsonl().encode("utf-8") == out.read_bytes()


def test_stream_flushes_each_case_as_it_is_made(telecom) -> None:
    import io

    class Recorder(io.StringIO):
        """Remembers how many complete lines had been written at each flush."""
        def __init__(self) -> None:
            super().__init__()
            self.flushed: list[int] = []

        def flush(self) -> None:
            self.flushed.append(self.getvalue().count("\n"))

    scenario, profile = telecom
    stream = synthesize_stream(scenario, profile, 25, seed=3)
    with pytest.raises(RuntimeError):
        _ = stream.coverage  # not known before the last case is made
    sink = Recorder()
    assert stream.write(sink) == 25
    assert sink.flushed == list(range(1, 26))
    assert sink.getvalue() == synthesize(scenario, profile, 25, seed=3).to_jsonl()
    assert stream.coverage.cases == 25 and sum(stream.coverage.per_action.values()) == 25


def test_stream_memory_does_not_grow_with_the_file(telecom) -> None:
    """Streaming 20,000 cases holds the slots (a small tuple per case), never the file: the peak of
    Python allocations while writing to a sink that keeps nothing stays far below the file's size."""
    import tracemalloc

    class Sink:
        size = 0

        def write(self, text: str) -> None:
            self.size += len(text)

        def flush(self) -> None:
            pass

    scenario, profile = telecom
    synthesize(scenario, profile, 50, seed=1)  # warm the plan and engine caches outside the measurement
    sink = Sink()
    tracemalloc.start()
    try:
        stream = synthesize_stream(scenario, profile, 20_000, seed=1)
        stream.write(sink)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sink.size > 5_000_000
    assert peak < sink.size / 4, (peak, sink.size)


def test_synth_summary_tables_are_cut_past_50_rows(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_sop", ROOT / "benchmarks" / "gen_sop.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    sop = tmp_path / "wide.sop"
    sop.write_text(gen.generate(7, kind="diamond", seed=3))  # 972 feasible paths
    cov = tmp_path / "cov.json"
    r = CliRunner().invoke(main, ["synth", str(sop), "-n", "60", "-o", str(tmp_path / "c.jsonl"),
                                  "--coverage", str(cov)])
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("│")]
    path_rows = [line for line in rows if line.startswith("│ P")]
    assert len(path_rows) == 45  # the first 45 rows (those with cases first) ...
    assert all(not line.rstrip("│ ").endswith(" 0") for line in path_rows)
    assert any("… 927 more rows (912 with 0 cases)" in line for line in rows)  # ... a count of the rest ...
    assert any("total: 972 paths (60 with cases)" in line and line.rstrip("│ ").endswith("60") for line in rows)
    assert "tables cut at 50 rows" in r.output
    assert len(json.loads(cov.read_text())["per_path"]) == 972  # ... and every count in --coverage
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 60


def test_large_profile_work_grows_with_distinct_conditions_not_intents(monkeypatch, telecom) -> None:
    """A 3,000-intent profile (issue 13: 20,000 took over 60 s): each condition text is parsed once,
    each distinct condition set is matched once per path, and a 50-case file builds templates only for
    the pairs it uses. Counted in operations, not seconds."""
    from helpers import many_intents_profile

    from sopgraph.cases import profiles
    from sopgraph.cases import synth as synth_mod
    from sopgraph.cases.profiles import conditions_key
    from sopgraph.logic import domain

    scenario, _ = telecom
    calls: Counter = Counter()

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, wrapper)

    counted(profiles, "parse_text")
    counted(domain, "constrain")
    counted(synth_mod, "_template")
    profile, diags = parse_profile(many_intents_profile(3000), scenario)
    assert profile is not None and not [d for d in diags if d.is_error]
    keys = len({conditions_key(i) for i in profile.intents.values()})
    assert keys < 1500  # the generator repeats condition sets, as a large real profile does
    assert calls["parse_text"] <= 3  # "> 0", "> 100", "<= 300": once each, not once per intent
    paths = len(plan(scenario, profile).paths)
    calls.clear()
    stream = synthesize_stream(scenario, profile, 50, seed=1)
    assert sum(1 for _ in stream) == 50
    assert calls["_template"] <= 50 + paths  # the pairs the file uses (and generated intents), not all pairs
    # matching: once per distinct condition set and path (3 conditions at most)
    assert calls["constrain"] <= keys * (paths + 1) * 3, calls  # per intent it would be ~3x more


def test_usable_pairs_verdicts_come_from_the_same_candidates_made_lazily(telecom) -> None:
    """`_usable` tries the seed-free candidates one at a time: the same ones `_bases` lists, in order;
    intents with equal conditions share one condition class (and so one verdict per path)."""
    from helpers import many_intents_profile

    from sopgraph.cases import synth as synth_mod
    from sopgraph.cases.profiles import conditions_key

    scenario, _ = telecom
    profile, _ = parse_profile(many_intents_profile(300), scenario)
    assert profile is not None
    p = plan(scenario, profile)
    by_key: dict[tuple, int] = {}
    for name, intent in profile.intents.items():
        assert by_key.setdefault(conditions_key(intent), p.condition_class[name]) == p.condition_class[name]
    assert len(set(p.condition_class.values())) == len(by_key)
    pairs = 0
    witnesses: dict = {}  # shared by every pair, as `_usable_pairs` shares it
    for entry in p.paths:
        for name in entry.intents[:40]:
            region = p.regions[(entry.index, name)]
            listed, _ = synth_mod._bases(p, entry, region, [], choices=False)
            assert list(synth_mod._base_candidates(p, entry, region)) == listed
            assert list(synth_mod._base_candidates(p, entry, region, None, witnesses)) == listed
            pairs += 1
    assert pairs > 100 and len(witnesses) < 2 * pairs  # boxes repeat across condition classes
    # `_usable_pairs` answers from a class's verdict on a path; asking `_usable` for each pair agrees
    fast = synth_mod._usable_pairs(plan(scenario, profile), [])
    slow_plan = plan(scenario, profile)
    slow = {e.index: [n for n in e.intents if synth_mod._usable(slow_plan, e, n)] for e in slow_plan.paths}
    assert fast == {i: names for i, names in slow.items() if names}


CARD_SOP = """
scenario card "Card"
type Txn = record { ok: bool }
field Report: Lost | Found "Lost = cannot find it; Found = found it again."
system Txns: list[..4] of Txn "Recent transactions."
system IdOk: bool "Whether the security questions were answered."
let Unknown = count(t in Txns where not t.ok)
action AskAgain "Ask the security questions again."
action BlockCard "Block the card." [irreversible]
action Reissue "Order a new card." [moves_money, ends_dialogue]
action Dispute(items: int[0..4]) "Open a dispute." [moves_money, ends_dialogue]
action Refuse "Refuse." [ends_dialogue]
stage intake { classify Report  match Report { Lost -> verify  Found -> do Refuse } }
stage verify {
  observe IdOk
  when IdOk -> do BlockCard -> txns
  when not IdOk -> do AskAgain -> verify up to 1 times
  otherwise -> do Refuse
}
stage txns { when Unknown == 0 -> do Reissue  otherwise -> do Dispute(items = Unknown) }
"""


def test_procedure_cases_speak_the_sops_terms_and_never_forbid_their_own_steps() -> None:
    """A risky action the path itself carries out on the way (`do BlockCard -> txns`) is required, not
    prohibited; generated intents describe lists, looks and guards as the SOP writes them."""
    scenario = load_source(None, text=CARD_SOP).scenario
    assert scenario is not None
    result = synthesize(scenario, default_profile(scenario), 24, seed=2)
    blocked = [c for c in result.cases if any(a["name"] == "BlockCard" for a in c.expected_actions)]
    assert blocked and all("BlockCard" not in c.prohibited_actions for c in blocked)
    assert all(set(c.prohibited_actions) == {"BlockCard", "Reissue", "Dispute"}
               for c in result.cases if c.expected_finals["Action"] == "Refuse")
    dispute = next(c for c in result.cases if c.expected_finals["Action"] == "Dispute")
    assert "Reissue" in dispute.prohibited_actions and "Dispute" not in dispute.prohibited_actions
    texts = " ".join(c.intent_description for c in result.cases)
    assert "Unknown == 0" in texts and "Unknown != 0" in texts
    assert "Txns[" not in texts and "len(Txns)" not in texts and "#" not in texts
    assert "IdOk (look 2) is true" in texts


STEP_SOP = """scenario card "Card"
field Reason: Fraud | Other "Why."
system Amount: float[0..) unit "EUR" money "Disputed amount."
action BlockCard "Block the card." [irreversible]
action Credit(amount: float[0..)) "Credit the amount back." [moves_money, ends_dialogue]
action Chargeback "Open a chargeback." [ends_dialogue]
action FraudTeam "Hand over to the fraud team." [escalation, ends_dialogue]
stage s1 {
    match Reason { Fraud -> do BlockCard -> s2  Other -> do Chargeback }
}
stage s2 {
    when Amount <= 500 -> do Credit(amount = Amount)
    otherwise -> do FraudTeam
}
"""


def test_a_risky_step_on_the_reference_trace_is_not_prohibited(tmp_path) -> None:
    """A path that blocks the card on the way must not list BlockCard as prohibited (an agent that
    follows the SOP would fail tau2's 'no prohibited action'); other paths still prohibit it."""
    path = tmp_path / "card.sop"
    path.write_text(STEP_SOP, encoding="utf-8")
    scenario = sopgraph.load(path)
    result = synthesize(scenario, default_profile(scenario), 30, seed=2)
    seen = set()
    for case in result.cases:
        trace = {a["name"] for a in case.expected_actions}
        assert not trace & set(case.prohibited_actions), case.id
        assert case.unsafe_action is None or case.unsafe_action not in trace
        expected = {"Credit": [], "FraudTeam": ["Credit"], "Chargeback": ["BlockCard", "Credit"]}
        assert case.prohibited_actions == expected[case.expected_finals["Action"]]
        seen.add(case.expected_finals["Action"])
    assert seen == {"Credit", "FraudTeam", "Chargeback"}


def test_synth_says_when_no_profile_is_beside_the_file(tmp_path) -> None:
    """A copy of a scenario (`v2.sop`) does not find `NAME.profile.yaml`: before, the generated intents
    were the only sign that the profile was not read."""
    path = tmp_path / "v2.sop"
    path.write_text(STEP_SOP, encoding="utf-8")
    res = CliRunner().invoke(main, ["synth", str(path), "-n", "3", "-o", str(tmp_path / "c.jsonl")])
    assert res.exit_code == 0, res.output
    assert "note: no profile v2.profile.yaml beside v2.sop (give one with --profile)" in res.stderr
    quiet = CliRunner().invoke(main, ["synth", str(path), "-n", "3", "-q", "-o", str(tmp_path / "c.jsonl")])
    assert quiet.exit_code == 0 and "no profile" not in quiet.stderr
    (tmp_path / "v2.profile.yaml").write_text("intents: {}\n", encoding="utf-8")
    found = CliRunner().invoke(main, ["synth", str(path), "-n", "3", "-o", str(tmp_path / "c.jsonl")])
    assert found.exit_code == 0 and "no profile" not in found.stderr, found.stderr


def test_synth_keeps_to_the_scenario_s_language(tmp_path) -> None:
    """The default persona library has a Mandarin speaker: an English SOP without `languages:` got Chinese
    cases (and a scripted user mixing both). The scenario's language now decides; `--language` still wins."""
    path = tmp_path / "card.sop"
    path.write_text(STEP_SOP.replace('scenario card "Card"', 'scenario card "Card" { language "en" }'),
                    encoding="utf-8")
    out = tmp_path / "c.jsonl"
    res = CliRunner().invoke(main, ["synth", str(path), "-n", "40", "--seed", "1", "-o", str(out)])
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert res.exit_code == 0 and {r["language"] for r in rows} == {"en"}
    assert {r["persona"]["name"] for r in rows}.isdisjoint({"mandarin_speaker"})
    assert "language" not in res.stderr
    both = CliRunner().invoke(main, ["synth", str(path), "-n", "40", "--seed", "1", "--language", "en",
                                     "--language", "zh", "-o", str(out)])
    assert both.exit_code == 0
    assert {json.loads(line)["language"] for line in out.read_text(encoding="utf-8").splitlines()} == {"en", "zh"}


EMAIL_SOP = """scenario email_change "Email change"

field Request: ChangeEmail | Question "what the customer wants"
field GivenEmail: string "the e-mail address the customer gives as their current one"
system EmailOnFile: string "the e-mail address on the account"

action UpdateEmail "change the e-mail address"
action Explain "explain how to change the address"
action Refuse "refuse: the identity could not be confirmed"

start intake

stage intake "Intake" {
    classify Request, GivenEmail
    match Request {
        Question -> do Explain
        ChangeEmail -> verify
    }
}

stage verify "Verify" {
    when GivenEmail != EmailOnFile -> do Refuse
    otherwise -> do UpdateEmail
}
"""


def test_a_string_field_the_path_never_reads_still_gets_a_value(tmp_path: Path) -> None:
    """A question about the rules never reads the e-mail address, but the intake classifies it: the case's
    truth held null there, which the agent's reply schema (a string) refuses, so even the oracle made a
    format error on every such turn. Free strings now get values that read like the variable."""
    from sopgraph.simulation.runner import run_sync
    from sopgraph.simulation.store import RunStore

    sop = tmp_path / "email_change.sop"
    sop.write_text(EMAIL_SOP, encoding="utf-8")
    scenario = sopgraph.load(sop)
    cases = synthesize(scenario, default_profile(scenario), 8, seed=1).cases
    questions = [c for c in cases if c.truth["Request"] == "Question"]
    assert questions and all("@" in c.truth["GivenEmail"] and "@" in c.system["EmailOnFile"] for c in questions)
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(c.model_dump_json() + "\n" for c in cases), encoding="utf-8")
    run_sync(str(sop), str(path), ["agent=baseline/oracle"], str(tmp_path / "run"), progress=False)
    with RunStore.open(tmp_path / "run") as store:
        turns = store.turns()
    assert turns and not [t.format_note for t in turns if t.format_error]


def test_intents_that_relate_two_strings_pair_only_with_their_paths() -> None:
    """The starter profile gives the e-mail SOP intents with `when: GivenEmail == EmailOnFile` and `!=`. The
    plan now knows that an intent saying `==` cannot reach the path that needs `!=` (one domain literal), so
    synthesis no longer reports "skipped pair … no engine-verified values" for such pairs."""
    from sopgraph.cases.scaffold import starter_profile

    scenario = load_source(None, text=EMAIL_SOP).scenario
    assert scenario is not None
    profile, diags = parse_profile(starter_profile(scenario)[0], scenario, file="p.yaml")
    assert profile is not None and not [d for d in diags if d.is_error]
    the_plan = plan(scenario, profile)
    equal = next(n for n in profile.intents if n.endswith("_eq_email_on_file"))
    assert [the_plan.paths[i].action for i in the_plan.intent_paths[equal]] == ["UpdateEmail"]
    result = synthesize(scenario, profile, 12, seed=1)
    assert not [s for s in result.skipped if s.kind == "pair"]


def test_a_free_text_the_sop_tests_with_a_pattern_has_that_form() -> None:
    """`Employee matches "E[0-9]{5}"` on one route: on the other routes (where any text takes the path)
    the employee id is still given in that form, not as a placeholder text."""
    import re

    from sopgraph.cases.synth import synthesize

    text = ('scenario ids "Ids"\n'
            'field Request: Reset | Unlock "Reset = password; Unlock = device."\n'
            'system Employee: string "Employee id on file."\n'
            'action Unlock "Unlock." [ends_dialogue]\naction Reset "Reset." [ends_dialogue]\n'
            'action Refer "Refer." [ends_dialogue]\n'
            'stage s {\n  when Request == Unlock and Employee matches "E[0-9]{5}" -> do Unlock\n'
            '  when Request == Unlock -> do Refer\n  otherwise -> do Reset\n}\n')
    loaded = load_source(None, text=text, name="ids.sop")
    assert loaded.scenario is not None
    s = loaded.scenario
    cases = synthesize(s, default_profile(s), 30, seed=3).cases
    resets = [c.system["Employee"] for c in cases if c.truth["Request"] == "Reset"]
    assert resets and any(re.fullmatch("E[0-9]{5}", e) for e in resets), resets
    for c in cases:  # every case still decides as recorded
        assert sopgraph.decide(s, {**c.truth, **c.system}).path == c.expected_path


def test_spread_gives_the_remaining_cases_to_the_largest_remainders() -> None:
    """Largest remainder: 4 cases over weights 3:1:1 (quotas 2.4, 0.8, 0.8) are 2, 1, 1 (not 3, 1, 0)."""
    import random

    from sopgraph.cases.synth import _spread

    got = Counter(_spread(4, ["zero", "weak", "strong"], [3, 1, 1], random.Random(0)))
    assert got == {"zero": 2, "weak": 1, "strong": 1}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 60), weights=st.lists(st.integers(1, 9), min_size=1, max_size=6), seed=st.integers(0, 9))
def test_spread_counts_are_quotas_rounded_by_largest_remainder(n: int, weights: list[int], seed: int) -> None:
    import math
    import random

    from sopgraph.cases.synth import _spread

    keys = [f"k{i}" for i in range(len(weights))]
    counts = Counter(_spread(n, keys, weights, random.Random(seed)))
    quotas = [n * w / sum(weights) for w in weights]
    assert sum(counts.values()) == n
    for key, quota in zip(keys, quotas, strict=True):
        assert math.floor(quota) <= counts[key] <= math.ceil(quota)
    rounded_up = [q - math.floor(q) for k, q in zip(keys, quotas, strict=True) if counts[k] > math.floor(q)]
    rounded_down = [q - math.floor(q) for k, q in zip(keys, quotas, strict=True)
                    if counts[k] == math.floor(q) and q > math.floor(q)]
    if rounded_up and rounded_down:
        assert min(rounded_up) >= max(rounded_down) - 1e-9


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.sop")) + sorted((ROOT / "examples").glob("*.sop")),
                         ids=lambda p: p.stem)
def test_the_scenario_s_language_is_the_dialogue_s(path: Path) -> None:
    """`language "en"` in the scenario: every case is in English, with no persona written for another
    language (the library's Mandarin speaker drew ~1 case in 10 before); a caller's languages still win."""
    scenario = sopgraph.load(path)
    declared = scenario.meta.get("language")
    cases = sopgraph.synthesize(scenario, 30, seed=3).cases
    if declared is None:
        pytest.skip("no declared language")
    assert {c.language for c in cases} == {declared}
    assert all(c.persona.language.split("-")[0] == declared for c in cases)
    mixed = sopgraph.synthesize(scenario, 30, seed=3, languages=["en", "zh"]).cases
    assert {c.language for c in mixed} == {"en", "zh"}


# ---------------------------------------------------------------------------------------------
# exit status when the cases cover fewer paths than -n allows (issue 32)


def test_synth_fails_loudly_when_paths_cannot_be_covered(tmp_path, monkeypatch) -> None:
    """Paths of unknown feasibility (no witness) leave them without cases: `sop synth` lists them with the
    reason and exits 5 instead of 0; --allow-gaps accepts the cases."""
    from click.testing import CliRunner

    from sopgraph.cases import synth as synth_mod
    from sopgraph.cli import main
    from sopgraph.cli.synthcmd import EXIT_COVERAGE

    real = synth_mod.paths_mod.iter_paths

    def only_first_has_a_witness(*args, **kwargs):
        for i, info in enumerate(real(*args, **kwargs)):
            yield info if i == 0 else info.model_copy(update={"witness": None, "status": "unknown"})

    sop = ROOT / "scenarios" / "telecom_package.sop"
    out = tmp_path / "cases.jsonl"
    r = CliRunner()
    res = r.invoke(main, ["synth", str(sop), "-n", "20", "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output  # every path covered: no complaint
    monkeypatch.setattr(synth_mod.paths_mod, "iter_paths", only_first_has_a_witness)
    monkeypatch.setattr(synth_mod, "_sampled_witness", lambda *args: None)  # and sampling finds none either
    res = r.invoke(main, ["synth", str(sop), "-n", "20", "-o", str(out), "-q"])
    assert res.exit_code == EXIT_COVERAGE == 5, res.output
    assert "error: the cases cover 1 of the 12 paths -n 20 allows" in res.stderr
    assert res.stderr.count("feasibility unknown") == 11 and out.read_text().count("\n") == 20
    res = r.invoke(main, ["synth", str(sop), "-n", "5", "-o", str(out), "-q"])  # 1 path can be made: 1 < 5
    assert res.exit_code == EXIT_COVERAGE and "cover 1 of the 5 paths -n 5 allows" in res.stderr
    res = r.invoke(main, ["synth", str(sop), "-n", "20", "-o", str(out), "-q", "--allow-gaps"])
    assert res.exit_code == 0 and "warning: the cases cover 1 of the 12" in res.stderr


def test_coverage_gaps_leaves_an_intent_balanced_sample_alone() -> None:
    from sopgraph.cases.synth import Coverage, Skip
    from sopgraph.cli.synthcmd import coverage_gaps

    per_path = {f"P{i}": (1 if i < 10 else 0) for i in range(15)}  # 12 cases over 15 paths landed on 10
    cov = Coverage(scenario="s", cases=12, feasible_paths=15, per_path=per_path, min_per_path=0)
    assert coverage_gaps(cov, [], 12) is None  # sampling repeats paths by design
    unknown = [Skip(kind="path", name=f"U{i}", reason="feasibility unknown") for i in range(5)]
    cov2 = cov.model_copy(update={"feasible_paths": 20})
    assert coverage_gaps(cov2, unknown, 12) is None  # 15 producible ≥ 12
    small = cov.model_copy(update={"feasible_paths": 15, "per_path": {"P0": 3}})
    covered, want, gaps = coverage_gaps(small, [Skip(kind="path", name=f"U{i}", reason="why") for i in range(14)], 12)
    assert (covered, want, len(gaps)) == (1, 12, 14) and gaps[0] == ("U0", "why")


def test_cases_of_for_each_steps_carry_one_action_per_item_and_replay() -> None:
    scenario = sopgraph.load(Path(__file__).resolve().parent / "data" / "refunds.sop")
    result = sopgraph.synthesize(scenario, 12, seed=4)
    assert len({c.path_id for c in result.cases}) == 3
    refunded = 0
    for case in result.cases:
        values = {**case.truth, **case.system}
        decision = sopgraph.decide(scenario, values)
        assert (decision.path, decision.actions) == (case.expected_path, case.expected_actions)
        if case.expected_path == ["fees", "done"]:
            fees = case.system["Fees"][0]
            names = [a["name"] for a in case.expected_actions]
            assert names.count("Refund") == sum(f["refundable"] for f in fees) >= 1
            assert case.expected_actions[names.index("Statement")]["args"]["fees"] == fees
            refunded += 1
    assert refunded

def test_paths_the_proof_gives_up_on_are_still_planned_by_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    """When neither the witness search nor the solver finds values for a path (here: made to give up on
    every path), the plan samples members of the path's region and keeps the ones the engine routes there."""
    from sopgraph.logic import domain
    from sopgraph.logic.paths import verify

    scenario = sopgraph.load(ROOT / "examples" / "claim_intake.sop")  # dates, optional values, re-checks
    profile = default_profile(scenario)
    expected = [e.id for e in plan(scenario, profile).paths]
    assert len(expected) >= 10
    monkeypatch.setattr(domain.Space, "witness", lambda self, box, style="representative", rng=None: None)
    planned = plan(scenario, profile)
    assert [e.id for e in planned.paths] == expected
    for entry in planned.paths:  # the plan's form of the procedure (each look its own variable)
        assert verify(planned.scenario, entry.witness, entry.stages, entry.branches) is not None
    assert not [s for s in planned.skipped if s.kind == "path"]


def test_past_its_cpu_budget_the_plan_says_where_it_stopped() -> None:
    scenario = sopgraph.load(ROOT / "examples" / "claim_intake.sop")
    planned = plan(scenario, default_profile(scenario), cpu_budget=0.0)
    (skip,) = [s for s in planned.skipped if s.name == "budget"]
    assert planned.paths == []
    assert "CPU budget (0 s of CPU) at path P01 (" in skip.reason


def test_sop_synth_out_of_its_cpu_budget_exits_5_and_says_where(tmp_path) -> None:
    from click.testing import CliRunner

    from sopgraph.cli import main

    out = tmp_path / "cases.jsonl"
    res = CliRunner().invoke(main, ["synth", str(ROOT / "examples" / "bike_rental.sop"), "-n", "5", "-q",
                                    "-o", str(out), "--cpu-budget", "0"])
    assert res.exit_code == 5, res.output
    # the count stopped too (one budget for the whole command): the path drawn by a walk is named
    assert "synthesis reached its CPU budget (0 s of CPU) at path W" in res.stderr and " (step1 -> " in res.stderr
    assert "(raise --cpu-budget)" in res.stderr
