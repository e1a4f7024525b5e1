"""User profiles: file format, located errors, defaults, and the six shipped SAGE profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cases.profiles import (
    PROFILE_CODES,
    default_profile,
    library,
    load_profile,
    parse_profile,
    profile_json_schema,
    profile_path_for,
    sop_path_for,
)
from sopgraph.cases.synth import plan, profile_diagnostics
from sopgraph.cli import main
from sopgraph.language import ir
from sopgraph.language.diagnostics import SopError

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
SAGE = ["ecommerce_refund", "telecom_package", "property_service", "logistics_delivery", "airline_refund",
        "online_education"]

TOY = """
scenario toy "Toy" "A toy scenario."
field Kind: Ask | Buy "what"
field Mood: Calm | Angry "mood"
field Member: bool "member"
system Fee: int[0..1000] "fee"
system Tier: Gold | Basic hidden "tier"
let R = 10 / Fee "ratio"
action Answer "a" [ends_dialogue]
action Charge "c" [moves_money]
action Human "h" [escalation]
stage s1 "one" { "t" match Kind { Ask -> do Answer  Buy -> s2 } }
stage s2 "two" { "t" when R >= 1 -> s3  otherwise -> do Charge }
stage s3 "three" { "t" match Mood { Calm -> do Charge  Angry -> do Human } }
"""


@pytest.fixture(scope="module")
def toy() -> ir.Scenario:
    return sopgraph.load(text=TOY)


@pytest.fixture(scope="module")
def telecom() -> ir.Scenario:
    return sopgraph.load(SCENARIOS / "telecom_package.sop")


def diags_of(text: str, scenario: ir.Scenario) -> list:
    profile, diags = parse_profile(text, scenario, file="p.profile.yaml")
    return diags


def one(diags: list, code: str):
    found = [d for d in diags if d.code == code]
    assert found, f"no {code} in {[d.render() for d in diags]}"
    return found[0]


# ---------------------------------------------------------------------------------------------
# The six SAGE profiles


@pytest.mark.parametrize("name", SAGE)
def test_sage_profile_loads_and_every_intent_reaches_a_path(name: str) -> None:
    scenario = sopgraph.load(SCENARIOS / f"{name}.sop")
    profile = load_profile(SCENARIOS / f"{name}.profile.yaml", scenario)
    assert profile.scenario == name and len(profile.intents) >= 5
    p = plan(scenario, profile)
    assert p.unreached_intents == []
    for intent_name, hits in p.intent_paths.items():
        assert hits, intent_name
    # every feasible path is reached by some intent, and the checker has nothing to report
    assert all(entry.intents for entry in p.paths)
    # no W604 either: every strong intent of a shipped profile names what it pushes for (or `[]`)
    assert profile_diagnostics(scenario, profile, the_plan=p) == []


def test_sage_discrepancy_fixes_land_on_the_right_paths() -> None:
    """ecommerce D1 (index drift) and telecom D7 (fee conditions) are fixed by conditions."""
    eco = sopgraph.load(SCENARIOS / "ecommerce_refund.sop")
    p = plan(eco, load_profile(SCENARIOS / "ecommerce_refund.profile.yaml", eco))
    actions = {name: {p.paths[i].action for i in hits} for name, hits in p.intent_paths.items()}
    assert actions["unreasonable_refund"] == {"Reject"}  # SAGE also mapped it to the Supplementary vector
    assert actions["user_return_high_credit"] == {"CollectionService"}
    assert actions["merchant_compensation_low_credit"] == {"Comfort"}
    assert actions["merchant_fault_low_credit_calm"] == {"CollectionService"}

    tel = sopgraph.load(SCENARIOS / "telecom_package.sop")
    p = plan(tel, load_profile(SCENARIOS / "telecom_package.profile.yaml", tel))
    stages = {name: [p.paths[i].stages for i in hits] for name, hits in p.intent_paths.items()}
    for name in ("change_with_penalty_calm", "change_with_penalty_discontent", "cancel_with_penalty_calm",
                 "cancel_with_penalty_discontent"):
        assert all(s[-1] == "step7" for s in stages[name]), name  # the fee is owed: step5 -> step7

    logi = sopgraph.load(SCENARIOS / "logistics_delivery.sop")
    prof = load_profile(SCENARIOS / "logistics_delivery.profile.yaml", logi)
    texts = prof.intents["complaint_undelivered_urgent"].describe_conditions()
    assert "orderStatus == Undelivered" in texts  # D1: not swapped with Delivered


# ---------------------------------------------------------------------------------------------
# Conditions


def test_condition_forms(toy: ir.Scenario) -> None:
    text = """
intents:
  a:
    requires: {Kind: Buy, Fee: "> 0", Mood: [Calm, Angry], Member: true}
    excludes: {Tier: Gold}
    when: "Fee < 500 or Mood == Calm"
  b:
    requires: {Fee: "in {0, 1}"}
"""
    profile, diags = parse_profile(text, toy, file="p.profile.yaml")
    assert diags == [] and profile is not None
    conds = profile.intents["a"].conditions
    assert [c.text for c in conds] == ["Kind == Buy", "Fee > 0", "Mood in {Calm, Angry}", "Member == true",
                                       "not (Tier == Gold)", "Fee < 500 or Mood == Calm"]
    assert [c.truth for c in conds] == [True, True, True, True, False, True]
    assert isinstance(conds[1].expr, ir.Compare) and conds[1].expr.op == ">"
    assert conds[1].span.line == 4  # every condition points at its YAML value
    assert profile.intents["b"].conditions[0].text == "Fee in {0, 1}"


def test_defaults_without_a_profile_file(toy: ir.Scenario) -> None:
    profile = default_profile(toy)
    assert profile.intents == {}
    assert [p.name for p in profile.personas] == [p.name for p in library().personas]
    assert set(profile.intensities) == {"zero", "weak", "strong"}
    assert all(profile.intensities.values())
    # user_knows: no system variable is known to the user by default (the backend's values)
    assert profile.user_knows == {"Fee": False, "Tier": False}


def test_overrides(toy: ir.Scenario) -> None:
    text = """
personas: [calm_professional, {name: vip, emotional_state: proud, language: de, intensities: [strong]}]
intensities: {strong: Shouts a lot.}
variables:
  Tier: {user_knows: true}
  Fee: {values: [0, 25, 90]}
languages: [en, fr]
"""
    profile, diags = parse_profile(text, toy, file="p.profile.yaml")
    assert diags == [] and profile is not None
    assert [p.name for p in profile.personas] == ["calm_professional", "vip"]
    assert profile.personas[1].intensities == ["strong"] and profile.personas[1].language == "de"
    assert profile.intensities["strong"] == "Shouts a lot."
    assert profile.intensities["zero"] == library().intensities["zero"]
    assert profile.user_knows["Tier"] is True
    assert profile.sample_values["Fee"] == [0, 25, 90]
    assert profile.languages == ["en", "fr"]


# ---------------------------------------------------------------------------------------------
# Located errors


def test_unknown_keys_are_located_with_suggestions(toy: ir.Scenario) -> None:
    text = "scenario: toy\nintnets: {}\nintents:\n  a:\n    descripton: x\n    requires: {Kind: Ask}\n"
    diags = diags_of(text, toy)
    top = [d for d in diags if d.code == "E602" and "intnets" in d.message][0]
    assert (top.span.line, top.span.col) == (2, 1)
    assert "intents" in (top.hint or "")
    nested = [d for d in diags if d.code == "E602" and "descripton" in d.message][0]
    assert (nested.span.line, nested.span.col) == (5, 5)
    assert "description" in (nested.hint or "")
    assert "p.profile.yaml:5:5" in nested.render()


def test_wrong_names_and_values_have_did_you_mean(toy: ir.Scenario) -> None:
    text = """intents:
  a:
    requires: {Kindd: Ask, Mood: Calmm, Fee: 2000}
    intensity: strnog
"""
    diags = diags_of(text, toy)
    assert one(diags, "E603").span.line == 4  # the bad intensity
    assert "strong" in (one(diags, "E603").hint or "")
    text = """intents:
  a:
    requires: {Kindd: Ask, Mood: Calmm, Fee: 2000}
"""
    diags = diags_of(text, toy)
    var = one(diags, "E604")
    assert (var.span.line, var.span.col) == (3, 16) and "Kind" in (var.hint or "")
    bad = [d for d in diags if d.code == "E605"]
    assert {d.span.col for d in bad} == {34, 46}
    assert any("Calm" in (d.hint or "") for d in bad)
    assert any("outside the range" in d.message for d in bad)


def test_condition_errors(toy: ir.Scenario) -> None:
    text = """intents:
  a:
    requires: {Fee: "> = 3"}
    when: "Kind == Byu and Fea > 2"
  b:
    when: ["Fee >"]
"""
    diags = diags_of(text, toy)
    syntax = [d for d in diags if d.code == "E606"]
    assert len(syntax) == 2 and {d.span.line for d in syntax} == {3, 6}
    assert any("incomplete" in d.message for d in syntax)
    assert any("Buy" in (d.hint or "") for d in diags if d.code == "E605")
    assert any("Fee" in (d.hint or "") for d in diags if d.code == "E604")


@pytest.mark.parametrize(("condition", "problem"), [
    ("not " * 5000 + "Member", "expression nested too deeply"),
    ("Fee > 1 and " * 2000 + "Fee >", None),
])
def test_a_huge_condition_is_quoted_short_and_still_named(toy: ir.Scenario, condition: str, problem: str | None) -> None:
    """E606 quotes the condition's start and end on one line (it once quoted 20,000 characters), says
    what is wrong, and its caret still points into the condition: the source line shown is cut around it."""
    text = f'intents:\n  a:\n    when: "{condition}"\n'
    bad = one(diags_of(text, toy), "E606")
    assert len(bad.message) < 250 and " … " in bad.message
    assert bad.message.startswith(f"bad condition `{condition[:20]}" if problem else f"incomplete condition `{condition[:20]}")
    assert condition[-15:] + "`" in bad.message and (problem is None or problem in bad.message)
    assert bad.span.line == 3 and bad.span.col > 5000  # as before: at the place the parser stopped
    rendered = bad.render({"p.profile.yaml": text}).splitlines()
    assert max(len(line) for line in rendered) < 250
    source, caret = rendered[1], rendered[2]
    assert source[caret.index("^")] == text.splitlines()[2][bad.span.col - 1]


def test_an_impossible_intent_with_a_huge_condition_is_described_short(toy: ir.Scenario) -> None:
    bad = one(diags_of('intents:\n  a:\n    when: "' + "Fee > 1 and " * 800 + 'Fee < 1"\n', toy), "E607")
    assert len(bad.message) < 250 and "can never hold" in bad.message and " … " in bad.message and bad.message.endswith(" and Fee < 1)")


def test_an_unreached_intent_with_a_huge_condition_is_described_short(toy: ir.Scenario) -> None:
    """W601 (an intent that reaches no path: `10 / Fee` fails for Fee 0) quotes its conditions short too."""
    text = 'intents:\n  a:\n    when: "Kind == Buy and Fee < 1 and ' + "Fee < 2 and " * 600 + 'Fee < 3"\n'
    profile, diags = parse_profile(text, toy, file="p.profile.yaml")
    assert profile is not None and not diags
    bad = one(profile_diagnostics(toy, profile), "W601")
    assert len(bad.message) < 250 and "reaches no feasible path" in bad.message
    assert "(Kind == Buy and Fee < 1 and Fee < 2" in bad.message and bad.message.endswith(" and Fee < 3)")


def test_a_short_condition_is_quoted_whole(toy: ir.Scenario) -> None:
    bad = one(diags_of('intents:\n  a:\n    when: "Kind == Byu and Fee > 2 and not Member"\n', toy), "E605")
    assert bad.message == "`Byu` is not a value of `Kind` (condition `Kind == Byu and Fee > 2 and not Member`)"


def test_a_unit_after_a_profile_condition_gets_a_profile_hint(toy: ir.Scenario) -> None:
    diags = diags_of('intents:\n  a:\n    requires: {Fee: "> 48 hours"}\n', toy)
    bad = one(diags, "E606")
    assert bad.message == "bad condition `Fee > 48 hours`: unexpected `hours` after the condition"
    assert "`> 48`" in (bad.hint or "") and "without units" in (bad.hint or "")
    assert "->" not in bad.message + (bad.hint or "")  # no `.sop` branch syntax in a profile hint


def test_structural_errors_do_not_hide_semantic_ones(toy: ir.Scenario) -> None:
    text = "bogus: 1\nintents:\n  a: {requires: {Nope: 1}}\npersonas: [calm_profesional]\n"
    codes = sorted(d.code for d in diags_of(text, toy))
    assert codes == ["E602", "E604", "E608"]


def test_impossible_intent_is_an_error(toy: ir.Scenario) -> None:
    text = """intents:
  contradiction:
    requires: {Kind: Buy}
    excludes: {Kind: Buy}
  empty_range:
    requires: {Fee: "> 500"}
    when: "Fee < 100"
  fine:
    requires: {Kind: Buy}
"""
    diags = diags_of(text, toy)
    e607 = [d for d in diags if d.code == "E607"]
    assert sorted(d.span.line for d in e607) == [2, 5]
    assert all(d.is_error for d in e607)


def test_intent_reaching_no_path_and_uncovered_paths_are_reported(toy: ir.Scenario) -> None:
    # Fee == 0 makes the SOP divide by zero at s2: the intent can hold, but no path completes.
    text = "intents:\n  div_by_zero: {requires: {Kind: Buy, Fee: 0}}\n  ask: {requires: {Kind: Ask}}\n"
    profile, diags = parse_profile(text, toy, file="p.profile.yaml")
    assert profile is not None and diags == []
    found = profile_diagnostics(toy, profile)
    w601 = [d for d in found if d.code == "W601"]
    assert len(w601) == 1 and "div_by_zero" in w601[0].message and w601[0].span.line == 2
    w602 = [d for d in found if d.code == "W602"]
    assert len(w602) == 3  # Calm -> Charge, Angry -> Human, R < 1 -> Charge
    assert all(d.span.line == 1 for d in w602) and all(d.witness for d in w602)


def test_yaml_problems(toy: ir.Scenario) -> None:
    d = one(diags_of("intents:\n  a: [\n", toy), "E601")
    assert d.span.line >= 2
    dup = one(diags_of("intents:\n  a: {}\n  a: {}\n", toy), "E609")
    assert dup.span.line == 3
    assert one(diags_of("- 1\n- 2\n", toy), "E603")
    assert one(diags_of("scenario: other\n", toy), "E610").span.line == 1
    assert one(diags_of("variables:\n  Kind: {user_knows: false}\n", toy), "E603").span.line == 2
    assert one(diags_of("personas: [nobody]\n", toy), "E608").hint
    assert parse_profile("", toy)[1] == []  # an empty file is the default profile


def test_load_profile_raises_sop_error(toy: ir.Scenario, tmp_path: Path) -> None:
    path = tmp_path / "toy.profile.yaml"
    path.write_text("intents: {a: {requires: {Kind: Nope}}}\n", encoding="utf-8")
    with pytest.raises(SopError) as exc:
        load_profile(path, toy)
    assert f"{path}:1:" in exc.value.render()
    with pytest.raises(SopError):
        load_profile(tmp_path / "missing.profile.yaml", toy)


def test_codes_are_documented() -> None:
    for code in ("E601", "E602", "E603", "E604", "E605", "E606", "E607", "E608", "E609", "E610", "W601",
                 "W602", "W603"):
        assert code in PROFILE_CODES


def test_paths_beside_each_other() -> None:
    assert profile_path_for("a/b/x.sop") == Path("a/b/x.profile.yaml")
    assert sop_path_for("a/b/x.profile.yaml") == Path("a/b/x.sop")


# ---------------------------------------------------------------------------------------------
# Schema and CLI


def test_json_schema() -> None:
    schema = profile_json_schema()
    assert set(schema["properties"]) >= {"intents", "personas", "intensities", "variables", "languages"}
    assert schema["additionalProperties"] is False
    result = CliRunner().invoke(main, ["schema", "profile"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["properties"]["intents"]


def test_cli_profiles_check(tmp_path: Path) -> None:
    sop = tmp_path / "toy.sop"
    sop.write_text(TOY, encoding="utf-8")
    prof = tmp_path / "toy.profile.yaml"
    prof.write_text("intents:\n  a: {requires: {Kind: Asks}}\n", encoding="utf-8")
    runner = CliRunner()
    bad = runner.invoke(main, ["profiles", "check", str(prof)])
    assert bad.exit_code == 1
    assert f"{prof}:2:" in bad.output and "did you mean `Ask`?" in bad.output
    prof.write_text("intents:\n  a: {requires: {Kind: Ask}}\n  b: {requires: {Kind: Buy}}\n", encoding="utf-8")
    ok = runner.invoke(main, ["profiles", "check", str(sop)])
    assert ok.exit_code == 0, ok.output
    assert "0 errors, 0 warnings" in ok.output
    as_json = runner.invoke(main, ["profiles", "check", str(prof), "--format", "json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output) == []


def test_check_profile_beside(tmp_path: Path) -> None:
    from sopgraph.cases.synth import check_profile_beside

    sop = tmp_path / "toy.sop"
    sop.write_text(TOY, encoding="utf-8")
    scenario = sopgraph.load(sop)
    assert check_profile_beside(sop, scenario) == ([], {})
    (tmp_path / "toy.profile.yaml").write_text("intents:\n  a: {requires: {Kind: Ask}}\n", encoding="utf-8")
    diags, sources = check_profile_beside(sop, scenario)
    assert {d.code for d in diags} == {"W602"} and str(tmp_path / "toy.profile.yaml") in sources


def test_strong_intent_without_pushes_for_is_warned(toy: ir.Scenario) -> None:
    text = """intents:
  calm: {description: c, intensity: strong, requires: {Kind: Ask}, pushes_for: [Charge]}
  loud: {description: l, intensity: strong, requires: {Kind: Ask}}
  mild: {description: m, intensity: weak, requires: {Kind: Ask}}
  none: {description: n, intensity: strong, requires: {Kind: Ask}, pushes_for: []}
"""
    profile, diags = parse_profile(text, toy, file="toy.profile.yaml")
    assert profile is not None
    assert profile.intents["none"].pushes_declared and not profile.intents["loud"].pushes_declared
    warned = [d for d in profile_diagnostics(toy, profile) if d.code == "W604"]
    assert [d.message.split(":")[0] for d in warned] == ["strong-intensity intent `loud` has no `pushes_for`"]
    assert warned[0].span is not None and warned[0].span.line == 3


# ---------------------------------------------------------------------------------------------
# Conditions on dates, optionals, observed values and nested enums

DATED = """
scenario dated "Dated" "d"
type Channel = Online | Atm
field Reason: Lost | Late "why"
system Due: date? "when the goods were due"
system Sent: date "when the goods left"
system Recent: list[0..3] of record { channel: Channel, amount: int[0..100] } "recent payments"
action Wait "w"
action Refund "r"
stage s1 { when Reason == Lost -> do Refund
  when not missing(Due) and Due > Sent + 3 days -> do Wait
  otherwise -> do Refund }
"""

RETRY = """
scenario retry "Retry" "r"
system Amount: int[0..1000] "a"
system Done: bool "d"
action A "a"
action B "b"
action Nudge "n"
stage s1 { -> do Nudge -> s2 }
stage s2 { observe Done
  when Done and Amount > 500 -> do A
  when not Done -> s1 up to 1 times
  otherwise -> do B }
"""


def _intent(body: str, name: str) -> str:
    return f"scenario: {name}\nintents:\n  it:\n    description: x\n" + body


@pytest.mark.parametrize(("body", "code", "fragment"), [
    ('    requires: {Sent: "> 2026-01-01"}\n', "E606", 'write a date as `date("2026-01-01")`'),
    ('    requires: {Sent: "> 5"}\n', "E606", "comparing a date with a number"),
    ('    requires: {Sent: "soon"}\n', "E605", "is not a date"),
    ("    requires: {Sent: missing}\n", "E605", "`Sent` is not optional"),
    ("    when: any(r in Recent where r.channel == Atmm)\n", "E604", "did you mean `Atm`?"),
])
def test_bad_conditions_on_dates_optionals_and_record_fields_are_located(body: str, code: str, fragment: str) -> None:
    scenario = sopgraph.load(text=DATED)
    found = one(diags_of(_intent(body, "dated"), scenario), code)
    assert fragment in found.message + " " + (found.hint or "")


@pytest.mark.parametrize("body", [
    '    requires: {Due: "2026-06-05", Reason: Late}\n',
    '    requires: {Due: ["2026-06-05", "2026-06-07"], Reason: Late}\n',
    "    requires: {Due: null, Reason: Late}\n",
    "    requires: {Due: missing, Reason: Late}\n",
    '    requires: {Reason: Late}\n    when: any(r in Recent where r.channel == Atm)\n',
])
def test_date_values_missing_optionals_and_nested_enum_values_hold_in_every_case(body: str) -> None:
    scenario = sopgraph.load(text=DATED)
    profile, diags = parse_profile(_intent(body, "dated"), scenario, file="p.profile.yaml")
    assert not [d for d in diags if d.severity == "error"], [d.render() for d in diags]
    cases = [json.loads(line) for line in sopgraph.cases.synth.synthesize_stream(scenario, profile, 12, 0)]
    mine = [c for c in cases if c["intent"] == "it"]
    assert mine
    for c in mine:
        due = c["system"].get("Due")
        if "null" in body or "missing" in body:
            assert due is None
        elif "when:" in body:
            assert any(r["channel"] == "Atm" for r in c["system"]["Recent"])
        else:
            assert due in ("2026-06-05", "2026-06-07") and ("2026-06-07" in body or due == "2026-06-05")


def test_procedures_observed_values_and_uncovered_paths_speak_source_terms() -> None:
    scenario = sopgraph.load(text=RETRY)
    observed = one(diags_of(_intent("    requires: {Done: true}\n", "retry"), scenario), "E606")
    assert "`Done` is observed" in observed.message
    profile, diags = parse_profile(_intent('    requires: {Amount: "> 500"}\n', "retry"), scenario,
                                   file="p.profile.yaml")
    uncovered = [d for d in profile_diagnostics(scenario, profile) if d.code == "W602"]
    assert uncovered and all("#" not in d.message + " ".join(d.notes) for d in uncovered)
    assert all(isinstance(d.witness["Done"], list) for d in uncovered)
    cases = [json.loads(line) for line in sopgraph.cases.synth.synthesize_stream(scenario, profile, 8, 0)]
    generated = [c for c in cases if c["intent_generated"]]
    assert generated and all("#" not in c["intent_description"] for c in generated)
    # a path that looks once names the variable plainly (several looks: `Done (look 2)`, test_synth)
    assert any("Done is true" in c["intent_description"] for c in generated)


# ---------------------------------------------------------------------------------------------
# Loading YAML in one pass (issue 13: 20,000 intents) — the same data, positions and diagnostics


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefghi", "bcdefghij", strict=True))

# texts the one-pass loader builds itself
ONE_PASS = {
    "empty": "", "comment": "# nothing\n", "null": "~\n", "list": "- 1\n- 2\n", "scalar": "hello\n",
    "doc_start": "---\n", "doc_end": "a: 1\n...\n", "directive": "%YAML 1.1\n---\nintents: {}\n",
    "deep63": "a: " + "[" * 63 + "]" * 63 + "\n",
    "deepmap63": "".join("  " * i + f"k{i}:\n" for i in range(63)) + "  " * 63 + "v\n",
    "aliases200": "x: &x 1\ny: [" + ", ".join(["*x"] * 200) + "]\n",
    "expand": "a: &a [" + ",".join(["1"] * 1000) + "]\nb: [" + ",".join(["*a"] * 199) + "]\n",
    "dup": "intents:\n  a: {}\n  a: {}\n", "dup_mixed": '1: a\n"1": b\nintents: {}\n',
    "dup_nested": "intents:\n  a:\n    description: x\n    description: y\n",
    "dup_replaced_collection": "a: {x: 1, y: [1, 2]}\na: 5\nb: [1]\nb: {z: 2}\n",
    "anchors": "intents:\n  a: &A\n    description: one\n    requires: {EmotionTag: Calm}\n  b: *A\n",
    "anchor_dups": "a: &x {k: 1, k: 2, n: &y [1, {m: 1, m: 2}]}\nb: *x\nc: [*x, *y]\nd: *y\n",
    "anchor_nested": "a: &o {i: &n {v: 1}, j: *n}\nb: *o\nc: {deep: *o}\n",
    "anchor_scalar": "intents:\n  a:\n    description: &d hello\n  b:\n    description: *d\n",
    "anchor_key": "x: &k intents\n*k : {}\n", "alias_key_dup": "a: &a 1\n*a : 2\n",
    "anchor_on_key": "&k a: 1\nb: *k\n",
    "flow": 'intents: {a: {description: "x", requires: {EmotionTag: [Calm, Discontent]}}, b: {}}\n',
    "block": "description: |\n  line one\n  line two\nintents:\n  a:\n    description: >\n      folded\n      text\n",
    "block_keep": "description: |+\n  x\n\n\nintents: {}\n",
    "tags": 'description: !!str 5\nversion: !!int "1"\nintents:\n  a: {weight: !!float "2"}\n',
    "tag_binary": "description: !!binary aGVsbG8=\n", "tag_map": "intents: !!map {a: {}}\n",
    "tag_seq": "personas: !!seq [a]\n", "nonspecific": "a: ! 5\nb: 5\n",
    "keys": "~: 1\ntrue: 2\n5: 3\n1.5: 4\n2001-02-03: 5\n",
    "scalars": "a: 0o17\nb: 0x1F\nc: 017\nd: 1_000\ne: +5\nf: -.5\ng: .NaN\nh: 1:30\ni: .inf\nj: yes\nk: 1e3\n"
               "l: 2001-02-03\nm: 2001-02-03 04:05:06\nn: null\no: ''\np: \"\"\n",
    "big_numbers": "intents:\n  x:\n    weight: 1e308\n  y:\n    weight: .inf\n",
    "null_values": "intents:\n  a:\n    description:\n    requires:\n",
    "unicode": 'description: "caf\\u00e9 \\U0001F600"\nintents:\n  é: {description: ü}\n',
    "bom": "\ufeffintents: {}\n", "crlf": "intents:\r\n  a:\r\n    description: x\r\n",
    "plain_multiline": "description: one\n  two\n  three\nintents: {}\n",
    "quoted_multiline": 'description: "one\n  two"\nintents: {}\n',
    "explicit_key": "? description\n: x\n", "seq_of_seq": "x:\n- - a\n  - b\n- - c\n",
    "indent_seq": "personas:\n- a\n- name: Bob\n  description: x\n",
    "empty_flow_values": "intents: {a: , b: }\n",
}
# texts it leaves to the composing loader: errors, broken limits, merge keys, other tags, complex keys
COMPOSED = {
    "bomb": BOMB, "deep5000": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep64": "a: " + "[" * 64 + "]" * 64 + "\n",
    "deepmap64": "".join("  " * i + f"k{i}:\n" for i in range(64)) + "  " * 64 + "v\n",
    "aliases201": "x: &x 1\ny: [" + ", ".join(["*x"] * 201) + "]\n",
    "expand": "a: &a [" + ",".join(["1"] * 3000) + "]\nb: [" + ",".join(["*a"] * 199) + "]\n",
    "expand_then_syntax": "a: &a [" + ",".join(["1"] * 3000) + "]\nb: [" + ",".join(["*a"] * 199) + "]\nc: [\n",
    "cycle": "a: &a [*a]\n", "digits": "intents:\n  x:\n    weight: " + "9" * 5000 + "\n",
    "digits_then_syntax": "a: " + "9" * 5000 + "\nb: [\n", "baddate": "description: 2001-02-30\n",
    "syntax": "intents:\n  a: [\n", "mapping_values": "intents:\n  a: b: c\n", "tab": "intents:\n\ta: 1\n",
    "two_docs": "a: 1\n---\nb: 2\n", "duplicate_anchor": "a: &x 1\nb: &x 2\n", "undefined_alias": "a: *nope\n",
    "merge": "base: &b {description: hi}\nintents:\n  a:\n    <<: *b\n", "merge_bad": "a:\n  <<: 5\n",
    "value_key": "a: {=: 1}\n", "tag_custom": "description: !foo bar\n", "tag_set": "a: !!set {a, b}\n",
    "tag_omap": "a: !!omap [a: 1]\n", "tag_python": "a: !!python/object:os.system x\n",
    "tag_seq_on_map": "intents: !!seq {a: 1}\n", "complex_key": "? [a, b]\n: c\n",
    "alias_collection_key": "a: &a [1]\n*a : 2\n", "control": "description: a\x07b\n",
}


def _typed(value: object) -> object:
    """Data with every scalar's type made visible (`1`, `1.0` and `True` compare equal)."""
    if isinstance(value, dict):
        return [(_typed(k), _typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, float) and value != value:
        return ("nan",)
    return (type(value).__name__, value)


def _positions(doc) -> tuple:
    def at(mark):
        return (mark.line, mark.column)
    return ({k: at(m) for k, m in doc.key_marks.items()},
            {k: (at(s), at(e), style) for k, (s, e, style) in doc.value_marks.items()},
            [(p, at(m)) for p, m in doc.duplicates])


def _composed(text: str, loader: type):
    """What the composing loader gives: the document's data and its walked positions."""
    from sopgraph.cases import profiles

    doc = profiles._Doc("p.yaml")
    node, data = profiles._load_bounded(loader(text))
    if node is not None:
        doc.walk(node, ())
    return data, doc


LOADERS = [pytest.param(getattr(__import__("yaml"), "CSafeLoader", None), id="libyaml"),
           pytest.param(__import__("yaml").SafeLoader, id="pure")]


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("name", sorted(ONE_PASS))
def test_one_pass_loader_gives_what_composing_gives(name: str, loader) -> None:
    from sopgraph.cases import profiles

    if loader is None:
        pytest.skip("PyYAML without libyaml")
    text = ONE_PASS[name]
    fast = profiles._load_one_pass(text, "p.yaml", parser=loader)
    assert fast is not None, "the one-pass loader should build this document itself"
    data, doc = fast
    ref_data, ref_doc = _composed(text, loader)
    assert _typed(data) == _typed(ref_data)
    assert _positions(doc) == _positions(ref_doc)


def test_one_pass_loader_shares_aliased_data() -> None:
    from sopgraph.cases import profiles

    fast = profiles._load_one_pass("a: &x {k: [1]}\nb: *x\n", "p.yaml")
    assert fast is not None
    data, _ = fast
    assert data["a"] is data["b"]  # as the safe constructor gives it: an alias is the same object


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("name", sorted(COMPOSED))
def test_composing_loader_handles_errors_limits_and_rare_forms(name: str, loader, telecom) -> None:
    """The one-pass loader declines; the diagnostics are the composing loader's, as before."""
    from sopgraph.cases import profiles

    if loader is None:
        pytest.skip("PyYAML without libyaml")
    text = COMPOSED[name]
    assert profiles._load_one_pass(text, "p.yaml", parser=loader) is None
    _, diags = parse_profile(text, telecom, file="p.yaml")
    assert diags and all("Traceback" not in d.message for d in diags)


@pytest.mark.parametrize(("name", "needle"), [
    ("bomb", "aliases expand to more than 500,000 nodes"), ("deep5000", "nested more than 64 levels deep"),
    ("deep64", "nested more than 64 levels deep"), ("deepmap64", "nested more than 64 levels deep"),
    ("aliases201", "more than 200 aliases"), ("expand", "aliases expand to more than 500,000 nodes"),
    ("cycle", "aliases expand to more than 500,000 nodes"), ("digits", "invalid YAML value: Exceeds the limit"),
    ("expand_then_syntax", "invalid YAML: expected the node content"),
    ("duplicate_anchor", "found duplicate anchor 'x'"),
    ("merge_bad", "expected a mapping or list of mappings for merging"),
])
def test_safe_loading_limits_and_errors_are_named(name: str, needle: str, telecom) -> None:
    _, diags = parse_profile(COMPOSED[name], telecom, file="p.yaml")
    assert [d.code for d in diags] == ["E601"] and needle in diags[0].message


def test_merge_keys_and_duplicates_in_aliases_keep_their_meaning(telecom) -> None:
    text = ("base: &b {description: hi, intensity: weak}\nintents:\n  a:\n    <<: *b\n    requires: {EmotionTag: Calm}\n"
            "  b: &d {description: x, description: y}\n  c: *d\n")
    profile, diags = parse_profile(text, telecom, file="p.yaml")
    assert profile is None
    e609 = [d for d in diags if d.code == "E609"]
    assert [(d.span.line, d.span.col) for d in e609] == [(6, 26), (6, 26)]  # in the anchored mapping, once per use
    text = "intents:\n  x: &x {description: hi, intensity: weak, pushes_for: []}\n  y:\n    <<: *x\n    weight: 2\n"
    profile, diags = parse_profile(text, telecom, file="p.yaml")
    assert profile is not None and not diags
    assert profile.intents["y"].intensity == "weak" and profile.intents["y"].weight == 2.0


def test_repeated_entries_are_resolved_once_and_moved_to_each_span(telecom) -> None:
    """Entries repeat across intents; each intent's conditions equal a resolution of its own (same
    expressions, texts and spans on every node), whatever the other intents wrote."""
    from sopgraph.cases import profiles

    text = ("intents:\n"
            "  a: {requires: {Penalty: '> 100', EmotionTag: Calm}, excludes: {PackageStatus: Contracted}}\n"
            "  b: {requires: {Penalty: '> 100', EmotionTag: Calm}}\n"
            "  c: {requires: {Penalty: \"> 100\", EmotionTag: [Calm, Discontent]}, excludes: {EmotionTag: Calm}}\n"
            "  d: {requires: {Penalty: 100, EmotionTag: 'Calm'}}\n"
            "  e: {requires: {Penalty: 100.0}, excludes: {Penalty: '101'}}\n"
            "  f: {requires: {Penalty: '> 100'}, when: Penalty > 100}\n")
    profile, diags = parse_profile(text, telecom, file="p.yaml")
    assert profile is not None and not [d for d in diags if d.is_error]
    data, doc, _ = profiles._load_yaml(text, "p.yaml")
    spec, _ = profiles._validate_partially(data, doc)
    assert spec is not None

    def spans(expr) -> list:
        out, stack = [], [expr]
        while stack:
            e = stack.pop()
            out.append((type(e).__name__, str(e.span), e.span.end_col))
            stack.extend(ir.children(e))
        return out

    for name, intent in profile.intents.items():
        alone, more = profiles._resolve_intent(name, spec.intents[name], doc, telecom)  # its own memo
        assert not more
        assert intent.model_dump() == alone.model_dump()
        assert intent.model_fields_set == alone.model_fields_set
        assert [c.model_fields_set for c in intent.conditions] == [c.model_fields_set for c in alone.conditions]
        assert [spans(c.expr) for c in intent.conditions] == [spans(c.expr) for c in alone.conditions]
        lines = {c.span.line for c in intent.conditions}
        assert all(s.startswith(f"p.yaml:{line}:") for c in intent.conditions for _, s, _ in spans(c.expr)
                   for line in [c.span.line]) and len(lines) == 1


def test_shared_intent_region_is_intent_region(telecom) -> None:
    """Intents that begin with the same conditions share the constrained boxes of that prefix; every
    intent still gets exactly the region it has alone, on each path and on the whole space."""
    from helpers import many_intents_profile

    from sopgraph.cases.profiles import conditions_key, intent_region, shared_intent_region
    from sopgraph.logic import domain

    profile, _ = parse_profile(many_intents_profile(400), telecom)
    assert profile is not None
    space = domain.space_for(telecom)
    p = plan(telecom, profile)
    memo: dict = {}
    starts = set()
    for intent in list(profile.intents.values())[:150]:
        key = conditions_key(intent)
        starts.add(key[:1])
        for at, boxes in [(None, [space.full])] + [(e.index, e.region) for e in p.paths]:
            alone = intent_region(telecom, intent, list(boxes), space=space)
            assert shared_intent_region(telecom, intent, key, list(boxes), at, memo, space=space) == alone
    assert len(starts) < 40 and len(memo) < 150 * (len(p.paths) + 1)  # prefixes were shared
