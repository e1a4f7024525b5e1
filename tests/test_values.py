"""Synthesized cases look like production data (issue 33): ids vary and never repeat inside a list, amounts
are not 0 unless the decision needs 0, and every varied case still decides to what it says."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sopgraph
from sopgraph.cases.values import random_match
from sopgraph.language import ir, scalars
from sopgraph.logic.engine import engine_for

ROOT = Path(__file__).resolve().parents[1]
FEES = ROOT / "tests" / "data" / "fee_refund.sop"
SHIPPED = sorted((ROOT / "scenarios").glob("*.sop")) + sorted((ROOT / "examples").glob("*.sop"))


@pytest.fixture(scope="module")
def fee_cases() -> list:
    return sopgraph.synthesize(sopgraph.load(FEES), 60, seed=4).cases


def test_pattern_tested_ids_are_varied(fee_cases: list) -> None:
    ids = [c.system["AccountId"] for c in fee_cases if "AccountId" in c.system]
    assert len(set(ids)) >= 0.9 * len(ids)


def test_no_two_records_of_a_list_share_an_id_and_ids_vary_across_cases(fee_cases: list) -> None:
    all_ids = []
    for c in fee_cases:
        ids = [f["id"] for f in c.system.get("Fees") or []]
        assert len(set(ids)) == len(ids), ids
        all_ids += ids
    assert len(set(all_ids)) >= 0.9 * len(all_ids)


def test_amounts_are_not_zero_and_vary(fee_cases: list) -> None:
    amounts = [f["amount"] for c in fee_cases for f in c.system.get("Fees") or []]
    assert amounts and 0 not in amounts
    assert len(set(amounts)) >= 0.8 * len(amounts)
    balances = [c.system["Balance"] for c in fee_cases if "Balance" in c.system]
    assert len(set(balances)) >= 0.8 * len(balances)


def test_every_varied_case_decides_to_what_it_says(fee_cases: list) -> None:
    engine = engine_for(sopgraph.load(FEES))
    for c in fee_cases:
        path, finals, actions = engine.decide_trace_raw({**c.truth, **c.system})
        assert (path, finals) == (c.expected_path, c.expected_finals)
        assert actions == [a if isinstance(a, dict) else a.model_dump() for a in c.expected_actions]


def test_varying_is_deterministic(tmp_path: Path) -> None:
    """Same file and seed, same bytes (each run in a process of its own, as `sop synth` runs)."""
    code = ("import sys; from sopgraph.cli import main; "
            "main(['synth', sys.argv[1], '-n', '20', '--seed', '9', '-q', '-o', sys.argv[2]])")
    outs = []
    for k in range(2):
        out = tmp_path / f"c{k}.jsonl"
        proc = subprocess.run([sys.executable, "-c", code, str(FEES), str(out)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_money_is_zero_only_where_the_decision_needs_it(path: Path) -> None:
    scenario = sopgraph.load(path)
    money = [v for v in scenario.variables.values() if v.money and isinstance(v.type, ir.NumType)
             and not v.observed and v.role != "derived"]
    if not money:
        pytest.skip("no money input")
    engine = engine_for(scenario)
    for case in sopgraph.synthesize(scenario, 40, seed=2).cases:
        values = {**case.truth, **case.system}
        for var in money:
            if values.get(var.name) != 0:
                continue
            for step in (1, 5, 50):  # a zero the decision does not need would survive some small amount
                trial = {**values, var.name: step}
                try:
                    path, finals, _ = engine.decide_trace_raw(trial)
                except Exception:  # noqa: BLE001 - out of the variable's range: the step is no witness
                    continue
                assert (path, finals.get("Action")) != (case.expected_path, case.expected_finals.get("Action")), (
                    f"{case.id}: {var.name}=0 although {var.name}={step} decides the same")


@settings(max_examples=60, deadline=None)
@given(pattern=st.sampled_from([r"^AC-[0-9]{6}$", r"[A-Z]{2}\d{4}", r"(REF|INV)-\d{3,5}", r"E[0-9]{5}",
                                r"[a-z]+@example\.com", r"\w{3}-\d\d"]), seed=st.integers(0, 10_000))
def test_random_match_matches_its_pattern(pattern: str, seed: int) -> None:
    text = random_match(pattern, random.Random(seed))
    assert text is not None and scalars.compiled(pattern).fullmatch(text)


# ---------------------------------------------------------------------------------------------
# The Done-when statistics of issue 33 over every shipped scenario and example (and the fee refund)

ALL_SHIPPED = [*SHIPPED, *sorted((ROOT / "examples" / "authoring").glob("*.sop")), FEES]


def _amount_like(name: str) -> bool:
    from sopgraph.cases.values import AMOUNT_NAME
    return AMOUNT_NAME.search(name) is not None


def _strings(vtype: object, value: object, at: str, out: dict[str, list[str]]) -> None:
    """Every string value inside `value`, by where it sits (`Fees[].id`)."""
    if isinstance(vtype, ir.StringType) and isinstance(value, str):
        out.setdefault(at, []).append(value)
    elif isinstance(vtype, ir.ListType) and isinstance(value, list):
        for item in value:
            _strings(vtype.item, item, at + "[]", out)
    elif isinstance(vtype, ir.RecordType) and isinstance(value, dict):
        for f in vtype.fields:
            _strings(f.type, value.get(f.name), f"{at}.{f.name}", out)


def _zero_amounts(vtype: object, value: object, money: bool) -> int:
    if isinstance(vtype, ir.NumType) and money:
        return int(value == 0 and not isinstance(value, bool))
    if isinstance(vtype, ir.ListType) and isinstance(value, list):
        return sum(_zero_amounts(vtype.item, item, money) for item in value)
    if isinstance(vtype, ir.RecordType) and isinstance(value, dict):
        return sum(_zero_amounts(f.type, value.get(f.name), _amount_like(f.name)) for f in vtype.fields)
    return 0


def _needs_zero(engine: object, scenario: ir.Scenario, case: object, name: str) -> bool:
    """Whether no small non-zero amount in place of the variable's 0 keeps the case's path, action and intent."""
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.values import _holds
    values = {**case.truth, **case.system}
    intent = profile_for(scenario.span.file, scenario).intents.get(case.intent)
    for step in (1, 5, 50, 0.01):
        trial = {**values, name: step}
        try:
            path, finals, _ = engine.decide_trace_raw(trial)
        except Exception:  # noqa: BLE001 - out of the variable's range: the step is no witness
            continue
        if (path, finals.get("Action")) == (case.expected_path, case.expected_finals.get("Action")) and (
                intent is None or _holds(scenario, intent, trial)):
            return False
    return True


@pytest.mark.parametrize("path", ALL_SHIPPED, ids=lambda p: p.stem)
def test_shipped_cases_look_real(path: Path) -> None:
    """Issue 33's Done-when: ≥ 90 % distinct ids per pattern-tested or id-like string variable (and no id twice
    in one list), no 0 amount the decision does not need, no system or observed value among the customer's
    facts unless the profile says `user_knows: true`, and every case in the scenario's language."""
    import yaml

    from sopgraph.cases.profiles import profile_path_for
    scenario = sopgraph.load(path)
    cases = sopgraph.synthesize(scenario, 40, seed=5).cases
    assert cases
    engine = engine_for(scenario)
    profile_file = profile_path_for(path)
    declared = yaml.safe_load(profile_file.read_text()) if profile_file.exists() else {}
    told = {n for n, spec in ((declared or {}).get("variables") or {}).items() if (spec or {}).get("user_knows")}
    inputs = [v for v in scenario.variables.values() if v.role != "derived"]
    strings: dict[str, list[str]] = {}
    for case in cases:
        values = {**case.truth, **case.system}
        in_case: dict[str, list[str]] = {}
        for var in inputs:
            _strings(var.type, values.get(var.name), var.name, in_case)
            if isinstance(var.type, ir.NumType) and (var.money or _amount_like(var.name)) and not var.observed:
                if values.get(var.name) == 0:
                    assert _needs_zero(engine, scenario, case, var.name), f"{case.id}: {var.name} = 0"
            elif isinstance(var.type, ir.ListType | ir.RecordType):
                assert _zero_amounts(var.type, values.get(var.name), False) == 0, (case.id, var.name)
        for at, texts in in_case.items():
            if "[]" in at and any(c.isdigit() for t in texts for c in t):
                assert len(set(texts)) == len(texts), (case.id, at, texts)  # no id twice in one list
            strings.setdefault(at, []).extend(texts)
        assert set(case.user_facts) <= told, (case.id, sorted(set(case.user_facts) - told))
        if scenario.meta.get("language"):
            assert case.language == scenario.meta["language"], case.id
    id_like = set(sopgraph.cases.values.matched_patterns(scenario)) | {
        at for at, texts in strings.items() if any(c.isdigit() for t in texts for c in t)}
    for at in sorted(id_like):
        texts = strings.get(at, [])
        assert len(set(texts)) >= 0.9 * len(texts), (at, len(set(texts)), len(texts))


@pytest.mark.parametrize("name,var", [("claim_intake", "IncidentDate"), ("flight_cancellation", "BookedAt")])
def test_dates_vary_across_cases_and_stay_in_the_past(name: str, var: str) -> None:
    """The analysis proves a path with a few representative dates (4 distinct incident dates in 40 cases);
    each case moves its calendar (every date together) and its dates, where the path allows, and a date
    the customer reports as past stays before `now`."""
    scenario = sopgraph.load(ROOT / "examples" / f"{name}.sop")
    cases = sopgraph.synthesize(scenario, 40, seed=5).cases
    dates = [c.system[var] for c in cases]
    assert len(set(dates)) >= 0.75 * len(dates)
    assert len({c.system["now"] for c in cases}) >= 0.75 * len(cases)
    for c in cases:
        assert c.system[var][:10] <= c.system["now"][:10], c.id


# ---------------------------------------------------------------------------------------------
# Author-declared generators (`variables: {X: {examples | pattern | min/max}}`)

GENERATORS = """
variables:
  AccountId: {pattern: "CU-[0-9]{5}"}
  Balance: {min: 60, max: 5000, distribution: log-uniform}
  Request: {examples: [Refund]}
"""


def test_declared_generators_dress_cases_where_the_decision_leaves_room() -> None:
    from sopgraph.cases.profiles import parse_profile
    from sopgraph.cases.synth import synthesize
    scenario = sopgraph.load(FEES)
    profile, diags = parse_profile(GENERATORS, scenario, file="fees.profile.yaml")
    assert diags == [] and profile is not None and set(profile.generators) == {"AccountId", "Balance", "Request"}
    cases = synthesize(scenario, profile, 40, seed=3).cases
    engine = engine_for(scenario)
    def drawn(c: object) -> bool:
        return scalars.compiled("CU-[0-9]{5}").fullmatch(c.system["AccountId"]) is not None
    free = [c for c in cases if c.expected_finals["Action"] == "Explain"]  # the id is never read there
    assert free and all(drawn(c) for c in free)
    ids = [c.system["AccountId"] for c in cases if drawn(c)]
    assert len(set(ids)) >= 0.9 * len(ids)
    refund = [c for c in cases if c.expected_finals["Action"] == "Refund"]
    assert refund and all(60 <= c.system["Balance"] <= 5000 for c in refund)
    # the decision wins: the refund needs an AC- id, a path that needs a small balance keeps one, Explain
    # needs a question
    assert all(c.system["AccountId"].startswith("AC-") for c in refund)
    assert any(c.expected_finals["Action"] == "Escalate" and c.system["Balance"] < 50 for c in cases)
    assert all(c.truth["Request"] == "Question" for c in free)
    for c in cases:
        path, finals, _ = engine.decide_trace_raw({**c.truth, **c.system})
        assert (path, finals) == (c.expected_path, c.expected_finals)


@pytest.mark.parametrize("text,code,line,col,words", [
    ('variables:\n  AccountId: {pattern: "AC-(?=x)"}\n', "E603", 2, 24, "cannot make strings"),
    ('variables:\n  AccountId: {pattern: "AC-[0-9"}\n', "E603", 2, 24, "not a regular expression"),
    ("variables:\n  Request: {pattern: x}\n", "E603", 2, 22, "applies to strings"),
    ("variables:\n  Request: {examples: [Refundd]}\n", "E605", 2, 24, "not a value of `Request`"),
    ("variables:\n  Balance: {min: 600, max: 50}\n", "E603", 2, 18, "above its `max`"),
    ("variables:\n  Balance: {min: -5, max: 50}\n", "E605", 2, 18, "outside the range"),
    ("variables:\n  Balance: {min: 5}\n", "E603", 2, 13, "needs both"),
    ("variables:\n  Balance: {min: 0, max: 5, distribution: log-uniform}\n", "E603", 2, 43, "above 0"),
    ("variables:\n  Request: {min: 1, max: 2}\n", "E603", 2, 18, "apply to numbers"),
    ("variables:\n  Balance: {distribution: normal}\n", "E603", 2, 13, "give both"),
])
def test_generator_mistakes_are_located_errors(text: str, code: str, line: int, col: int, words: str) -> None:
    from sopgraph.cases.profiles import parse_profile
    _profile, diags = parse_profile(text, sopgraph.load(FEES), file="fees.profile.yaml")
    hits = [d for d in diags if d.code == code and words in d.message]
    assert hits, [(d.code, d.message) for d in diags]
    assert (hits[0].span.line, hits[0].span.col) == (line, col), (hits[0].span.line, hits[0].span.col)


# ---------------------------------------------------------------------------------------------
# Simulated dialogues: the customer speaks the scenario's language and never pastes data or field names

_CJK = re.compile(r"[\u4e00-\u9fff]")


def _dialogue_cases(path: Path, language: str | None) -> tuple[ir.Scenario, list]:
    """A few cases of a shipped scenario (or of its copy declaring another `language`); for the fee refund,
    a profile that tells the customer the backend's fee list (the issue's raw-JSON customer)."""
    from sopgraph.cases.profiles import parse_profile, profile_for
    from sopgraph.cases.synth import synthesize
    text = path.read_text(encoding="utf-8")
    override = language.removeprefix("case-") if language and language.startswith("case-") else None
    if language is not None and override is None:
        text = re.sub(r'language "[a-z]+"', f'language "{language}"', text, count=1)
    scenario = sopgraph.load(text=text) if language is not None else sopgraph.load(path)
    profile = profile_for(path, scenario)
    if path == FEES:
        profile, _ = parse_profile("variables:\n  Fees: {user_knows: true}\n  Balance: {user_knows: true}\n",
                                   scenario, file="fees.profile.yaml")
    languages = [override] if override else None  # the cases say otherwise than the scenario
    return scenario, list(synthesize(scenario, profile, 6, seed=4, languages=languages).cases)


@pytest.mark.parametrize("path,language", [*[(p, None) for p in ALL_SHIPPED
                                             if p.stem not in ("late_delivery", "late_delivery_draft")],
                                           (ROOT / "scenarios" / "telecom_package.sop", "zh"),
                                           (ROOT / "examples" / "claim_intake.sop", "zh"),
                                           (ROOT / "examples" / "no_service.sop", "case-zh")],
                         ids=lambda v: v.stem if isinstance(v, Path) else str(v))
def test_simulated_customers_speak_the_language_and_never_paste_data(path: Path, language: str | None,
                                                                    tmp_path: Path) -> None:
    """Issue 33: some dialogues came out in Chinese although the scenario said `language "en"`, and a customer
    who "knew" the backend's fee list pasted it ("For reference, fees: [{"amount": 0.0, …}]"). Built-in models
    (oracle agent, scripted customer) over every shipped scenario, and over copies declaring Chinese."""
    from sopgraph.simulation.runner import run_sync
    from sopgraph.simulation.store import RunStore
    scenario, cases = _dialogue_cases(path, language)
    want = (language or scenario.meta.get("language") or "").removeprefix("case-")
    assert want and all(c.language == want for c in cases)
    run_sync(scenario, cases, ["agent=baseline/oracle"], str(tmp_path / "run"), progress=False, judge_turns="final")
    names = {v.name for v in scenario.variables.values() if v.role != "derived"}
    names |= {f.name for v in scenario.variables.values() for f in _record_fields(v.type)}
    raw = {n for n in names if re.search(r"[a-z][A-Z]|_", n)}  # identifiers no customer types
    with RunStore.open(tmp_path / "run") as store:
        said = [t.user_text for t in store.turns()]
    assert said
    for text in said:
        assert not re.search(r"[\[{\]}]", text) and '":' not in text, text
        assert not any(re.search(rf"\b{re.escape(n)}\b", text) for n in raw), text
        assert bool(_CJK.search(text)) == (want == "zh"), text


def _record_fields(vtype: object) -> list:
    if isinstance(vtype, ir.ListType):
        return _record_fields(vtype.item)
    return list(vtype.fields) if isinstance(vtype, ir.RecordType) else []


@pytest.mark.parametrize("language", ["en", "zh"])
def test_the_scripted_customer_says_a_known_list_in_words(language: str) -> None:
    """The issue's customer volunteered "For reference, fees: [{"amount": 0.0, …}]": a list of records the
    profile lets it know is said in words, without JSON or the records' field names as written."""
    from sopgraph.simulation.dialogue import scenario_context
    from sopgraph.simulation.providers import scripted_user
    scenario = sopgraph.load(FEES)
    fees = [{"amount": 12.5, "id": "FEE-1234", "waived": False}, {"amount": 3.0, "id": "FEE-9876", "waived": True}]
    case = {"id": "c1", "intent": "refund", "intensity": "zero", "language": language, "truth": {"Request": "Refund"},
            "system": {"Fees": fees}, "user_facts": {"Fees": fees}, "persona": {"cooperativeness": "cooperative"},
            "expected_path": ["intake"]}
    ctx = {"case": case, "scenario": scenario_context(scenario), "turn": 2}
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "start"},
                {"role": "assistant", "content": "Hello, I want a refund."},
                {"role": "user", "content": "Thanks. Anything else about your account?"}]
    said = scripted_user(messages, ctx)
    assert "FEE-1234" in said and "FEE-9876" in said, said
    assert not re.search(r"[\[{\]}]", said) and '"amount"' not in said, said


CONTACTS = """
scenario contacts "Contacts" { language "en" }
field Request: ChangeEmail | Ask "what the customer wants"
system CustomerName: string "the account holder's name"
system GivenEmail: string "the e-mail address the customer gives"
system EmailOnFile: string "the e-mail address on the account"
system Address: string "the postal address on file"
action Change "change it" [ends_dialogue]
action Verify "verify first" [ends_dialogue]
action Explain "explain" [ends_dialogue]
stage s {
    when Request == Ask -> do Explain
    when GivenEmail == EmailOnFile -> do Verify
    otherwise -> do Change
}
"""


def test_names_emails_and_addresses_vary_across_cases() -> None:
    """Every case's customer was `Alex Morgan` at `alex.morgan@example.com`, living at `12 Harbour Street`."""
    scenario = sopgraph.load(text=CONTACTS)
    cases = sopgraph.synthesize(scenario, 30, seed=2).cases
    for var, share in (("CustomerName", 0.6), ("GivenEmail", 0.6), ("Address", 0.6)):
        values = [c.system[var] for c in cases]
        assert len(set(values)) >= share * len(values), (var, values)
    assert all(re.fullmatch(r"[a-z]+\.[a-z]+@example\.(com|org|net)", c.system["GivenEmail"]) for c in cases)
    engine = engine_for(scenario)
    for c in cases:  # an equality the decision needs survives (Verify: the same address twice)
        path, finals, _ = engine.decide_trace_raw({**c.truth, **c.system})
        assert (path, finals) == (c.expected_path, c.expected_finals)
    assert any(c.expected_finals["Action"] == "Verify" for c in cases)


def test_a_date_generator_takes_unquoted_yaml_dates_and_anchors_the_calendar() -> None:
    """YAML reads `2026-01-01` as a date; it is the same bound as the quoted text. Dates drawn from a
    generator stay in its range (the calendar does not move under them) and before `now`."""
    from sopgraph.cases.profiles import parse_profile
    from sopgraph.cases.synth import synthesize
    scenario = sopgraph.load(ROOT / "examples" / "claim_intake.sop")
    text = "variables:\n  IncidentDate: {min: 2026-01-01, max: 2026-05-31}\n"
    profile, diags = parse_profile(text, scenario, file="claims.profile.yaml")
    assert diags == [] and profile is not None
    assert profile.generators["IncidentDate"].lo == scalars.parse_temporal("date", "2026-01-01")
    cases = synthesize(scenario, profile, 20, seed=1).cases
    dates = [c.system["IncidentDate"] for c in cases]
    inside = [d for d in dates if "2026-01-01" <= d <= "2026-05-31"]
    assert len(inside) >= 0.8 * len(dates) and len(set(inside)) >= 0.5 * len(inside), dates
    assert all(c.system["IncidentDate"] <= c.system["now"][:10] for c in cases)
