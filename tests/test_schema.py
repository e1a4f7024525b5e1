"""JSON Schemas: the per-scenario agent reply (oracle replies pass, malformed ones fail with a reason),
the judge reply, the registry and `sop schema`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main
from sopgraph.language import ir
from sopgraph.language import schema as S
from sopgraph.logic.engine import decide
from sopgraph.records import AgentOutput

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"
EDUCATION = ROOT / "scenarios" / "online_education.sop"
VECTORS = ROOT / "tests" / "data" / "sage_vectors"

NUMS = '''
scenario nums
field Score: float(0..10] "a score"
field Count: int[1..]
field Ok: bool
system Level: Low | High
output Fee: float
output Tier: A | B = A
action Go "go"
stage s1 { when Ok -> do Go { Fee = Score * 2 } otherwise -> do Go }
'''


@pytest.fixture(scope="module")
def telecom():
    return sopgraph.load(TELECOM)


@pytest.fixture(scope="module")
def nums():
    return sopgraph.load(text=NUMS)


def oracle(scenario, classification, system):
    """The reply a perfect agent gives: full classification, the engine's path and finals."""
    fields = {}
    for var in scenario.fields:
        value = classification.get(var.name)
        if value is None:  # not read on this path: any allowed value
            value = var.type.values[0] if isinstance(var.type, ir.EnumType) else False
        fields[var.name] = value
    decision = decide(scenario, {**fields, **system})
    return {"classification_output": fields, "cot": "followed the SOP", "now_path": decision.path,
            "finals": decision.finals, "chat": "Done."}


@pytest.mark.parametrize("name", ["telecom_package", "online_education"])
def test_oracle_replies_pass(name):
    scenario = sopgraph.load(ROOT / "scenarios" / f"{name}.sop")
    vectors = json.loads((VECTORS / f"{name}.vectors.json").read_text())
    for vec in vectors:
        system = {k: v for k, v in vec["system"].items() if v not in (None, "none")}
        reply = oracle(scenario, vec["classification"], system)
        assert S.validate_agent_output(scenario, reply) == [], vec["id"]
        assert S.validate_agent_output(scenario, json.dumps(reply)) == []  # a JSON string works too
        assert S.validate_agent_output(scenario, AgentOutput.model_validate(reply)) == []


def test_schema_shape(telecom):
    schema = S.agent_output_schema(telecom)
    assert schema["required"] == ["classification_output", "cot", "now_path", "finals", "chat"]
    assert schema["additionalProperties"] is False
    co = schema["properties"]["classification_output"]
    assert co["required"] == ["ConsumptionType", "ApplicationTendency", "ConsumptionProfile", "EmotionTag"]
    assert co["properties"]["ConsumptionType"]["enum"] == ["Enquiry", "Change", "Cancel"]
    assert schema["properties"]["now_path"]["items"]["enum"] == list(telecom.stages)
    finals = schema["properties"]["finals"]
    assert finals["properties"]["Action"]["enum"] == ["ChangeOrder", "GoodBye", "TransHuman"]
    assert finals["required"] == ["Action"] and finals["additionalProperties"] is False
    assert "description" not in json.dumps(S.agent_output_schema(telecom, descriptions=False))


def test_numeric_and_output_types(nums):
    schema = S.agent_output_schema(nums)
    props = schema["properties"]["classification_output"]["properties"]
    assert props["Score"] == {"description": "a score", "type": "number", "exclusiveMinimum": 0, "maximum": 10}
    assert props["Count"] == {"type": "integer", "minimum": 1}
    assert props["Ok"] == {"type": "boolean"}
    finals = schema["properties"]["finals"]["properties"]
    assert finals["Fee"] == {"type": ["number", "null"]}  # no default: null allowed
    assert finals["Tier"] == {"type": "string", "enum": ["A", "B"]}


def reply_for(scenario, **changes):
    reply = oracle(scenario, {}, {"PackageStatus": "NoContract", "Penalty": 0}) if scenario.name == \
        "telecom_package" else None
    reply.update(changes)
    return reply


def test_wrong_enum_value_fails(telecom):
    reply = reply_for(telecom)
    reply["classification_output"] = {**reply["classification_output"], "ConsumptionType": "Query"}
    errors = S.validate_agent_output(telecom, reply)
    assert errors == ['classification_output.ConsumptionType: "Query" is not one of "Enquiry", "Change", "Cancel"']
    reply = reply_for(telecom, finals={"Action": "Refund"})
    assert S.validate_agent_output(telecom, reply) == [
        'finals.Action: "Refund" is not one of "ChangeOrder", "GoodBye", "TransHuman"']


def test_missing_keys_fail(telecom):
    reply = reply_for(telecom)
    del reply["cot"]
    assert S.validate_agent_output(telecom, reply) == ["cot: missing"]
    reply = reply_for(telecom)
    reply["classification_output"] = {k: v for k, v in reply["classification_output"].items() if k != "EmotionTag"}
    assert S.validate_agent_output(telecom, reply) == ["classification_output.EmotionTag: missing"]
    assert S.validate_agent_output(telecom, reply_for(telecom, finals={})) == ["finals.Action: missing"]


def test_extra_stage_id_and_extra_keys_fail(telecom):
    reply = reply_for(telecom, now_path=["step1", "step2", "step9"])
    ids = ", ".join(f'"{sid}"' for sid in telecom.stages)
    assert S.validate_agent_output(telecom, reply) == [f'now_path[2]: "step9" is not one of {ids}']
    reply = reply_for(telecom, notes="hi")
    assert S.validate_agent_output(telecom, reply) == ["notes: unexpected key"]
    reply = reply_for(telecom, finals={"Action": "GoodBye", "PLAN": "x"})
    assert S.validate_agent_output(telecom, reply) == ["finals.PLAN: unexpected key"]


def test_wrong_types_fail(telecom, nums):
    assert S.validate_agent_output(telecom, reply_for(telecom, now_path="step1")) == [
        'now_path: expected an array, got "step1"']
    assert S.validate_agent_output(telecom, reply_for(telecom, chat=None)) == ["chat: expected a string, got null"]
    assert S.validate_agent_output(telecom, [1]) == ["reply: expected an object, got [1]"]
    assert S.validate_agent_output(telecom, "{nope")[0].startswith("reply: not valid JSON")
    base = {"cot": "", "now_path": ["s1"], "finals": {"Action": "Go"}, "chat": ""}

    def errs(**fields):
        co = {"Score": 5, "Count": 1, "Ok": True} | fields
        return S.validate_agent_output(nums, {**base, "classification_output": co})

    assert errs() == []
    assert errs(Count=2.0) == []  # JSON: 2.0 is an integer
    assert errs(Count=1.5) == ["classification_output.Count: expected an integer, got 1.5"]
    assert errs(Count=0) == ["classification_output.Count: 0 must be at least 1"]
    assert errs(Score=0) == ["classification_output.Score: 0 must be greater than 0"]
    assert errs(Score=10.5) == ["classification_output.Score: 10.5 must be at most 10"]
    assert errs(Ok=1) == ["classification_output.Ok: expected true or false, got 1"]
    assert errs(Count=True) == ["classification_output.Count: expected an integer, got true"]
    assert errs(Score=float("nan"))[0].startswith("classification_output.Score: expected a number")
    ok = {**base, "classification_output": {"Score": 5, "Count": 1, "Ok": True}}
    assert S.validate_agent_output(nums, {**ok, "finals": {"Action": "Go", "Fee": None}}) == []
    assert S.validate_agent_output(nums, {**ok, "finals": {"Action": "Go", "Tier": None}}) == [
        "finals.Tier: expected a string, got null"]


def test_judge_schema(telecom):
    good = {"labels": {"ConsumptionType": "Cancel", "ApplicationTendency": "Agree", "ConsumptionProfile": "Data",
                       "EmotionTag": "Calm"},
            "scores": {"linguistic": 9, "anthropomorphism": 6, "content_utility": 3, "satisfaction": 6,
                       "instruction": 9},
            "reasons": {"labels": "because", "linguistic": "fluent"}}
    assert S.validate_judge_output(telecom, good) == []
    bad = json.loads(json.dumps(good))
    bad["scores"]["linguistic"] = 7
    bad["labels"]["EmotionTag"] = "Angry"
    assert S.validate_judge_output(telecom, bad) == [
        'labels.EmotionTag: "Angry" is not one of "Calm", "Discontent"',
        "scores.linguistic: 7 is not one of 3, 6, 9"]
    bad = json.loads(json.dumps(good))
    bad["reasons"]["labels"] = 3
    assert S.validate_judge_output(telecom, bad) == ["reasons.labels: expected a string, got 3"]


def test_agrees_with_jsonschema(telecom, nums):
    jsonschema = pytest.importorskip("jsonschema")
    samples = [reply_for(telecom), reply_for(telecom, now_path=["x"]), reply_for(telecom, extra=1),
               reply_for(telecom, finals={"Action": 3}), {"cot": 1}, [], "x"]
    for schema in (S.agent_output_schema(telecom), S.agent_output_schema(nums)):
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema)
        for sample in samples:
            assert (not S.validate(schema, sample)) == validator.is_valid(sample), sample
    for name in S.schema_names():
        scenario = telecom if S.BUILTIN_SCHEMAS.entries[name].needs_scenario else None
        jsonschema.Draft202012Validator.check_schema(S.get_schema(name, scenario))


def test_registry():
    assert {"ir", "case", "turn", "judgment", "agent-output", "judge-output"} <= set(S.schema_names())
    assert S.get_schema("ir")["title"] == "Scenario"
    assert "truth" in S.get_schema("case")["properties"]
    with pytest.raises(S.SchemaError, match="give a .sop FILE"):
        S.get_schema("agent-output")
    with pytest.raises(S.SchemaError, match="unknown schema `nope`"):
        S.get_schema("nope")
    with pytest.raises(ValueError, match="already in the catalogue"):
        S.BUILTIN_SCHEMAS.with_entries(S.SchemaEntry("case", "", lambda s: {}))
    extended = S.BUILTIN_SCHEMAS.with_entries(S.SchemaEntry("test-extra", "added by a test",
                                                            lambda s: {"type": "object"}))
    assert extended.get("test-extra") == {"type": "object"}
    assert "test-extra" in extended.names() and "test-extra" not in S.schema_names()  # no global edit


def test_cli_schema(tmp_path, telecom):
    runner = CliRunner()
    res = runner.invoke(main, ["schema"])
    assert res.exit_code == 0 and "agent-output" in res.output and "[needs FILE]" in res.output
    res = runner.invoke(main, ["schema", "agent-output", str(TELECOM)])
    assert res.exit_code == 0 and json.loads(res.output) == S.agent_output_schema(telecom)
    res = runner.invoke(main, ["schema", "ir"])
    assert res.exit_code == 0 and "stages" in json.loads(res.output)["properties"]
    out = tmp_path / "s.json"
    res = runner.invoke(main, ["schema", "judge-output", str(EDUCATION), "-o", str(out)])
    assert res.exit_code == 0 and json.loads(out.read_text())["required"] == ["labels", "scores", "reasons"]
    res = runner.invoke(main, ["schema", "agent-output"])
    assert res.exit_code == 1 and "give a .sop FILE" in res.output
    res = runner.invoke(main, ["schema", "bogus"])
    assert res.exit_code == 1 and "unknown schema" in res.output


def test_quoted_enum_values_are_the_schema_enums_as_written():
    scenario = sopgraph.load(ROOT / "tests" / "data" / "lang_quoted_values.sop")
    schema = S.agent_output_schema(scenario)
    assert schema["properties"]["classification_output"]["properties"]["Reports"]["enum"] == [
        "Never", "1-2 times", "5+ times"]
    finals = schema["properties"]["finals"]["properties"]
    assert finals["Severity"]["enum"] == ["Low", "Very high"]
    reply = {"classification_output": {"Reports": "5+ times"}, "cot": "c", "now_path": ["reports"],
             "finals": {"Action": "Remove", "Severity": "Very high"}, "chat": "done"}
    assert S.validate_agent_output(scenario, reply) == []
    assert S.validate_agent_output(scenario, {**reply, "finals": {"Action": "Remove", "Severity": "very high"}})


def test_optional_record_fields_are_nullable_and_not_required_in_the_decide_input():
    scenario = sopgraph.load(ROOT / "tests" / "data" / "lang_optional_fields.sop")
    props = S.decide_input_schema(scenario)["properties"]
    assert props["Contact"]["required"] == ["phone"]
    assert props["Contact"]["properties"]["email"]["type"] == ["string", "null"]
    bill = props["Bills"]["items"]
    assert bill["required"] == ["amount"] and bill["properties"]["due"]["type"] == ["string", "null"]


def test_open_records_allow_other_properties_in_the_decide_input():
    scenario = sopgraph.load(ROOT / "tests" / "data" / "lang_open_records.sop")
    props = S.decide_input_schema(scenario)["properties"]
    assert props["Segments"]["items"]["additionalProperties"] is True
    assert props["Account"]["additionalProperties"] is False
    seg = {"flown": True, "fare": 3, "cabin": "Economy", "carrier": "LH"}
    assert S.validate(props["Segments"], [seg]) == []
    assert S.validate(props["Account"], {"vip": True, "tier": 1}) != []


def test_a_list_output_is_an_array_of_its_values_in_the_agent_reply():
    scenario = sopgraph.load(ROOT / "tests" / "data" / "lang_list_outputs.sop")
    finals = S.agent_output_schema(scenario)["properties"]["finals"]["properties"]
    assert finals["ProblemTypes"]["type"] == "array"
    assert finals["ProblemTypes"]["items"]["enum"] == ["Billing", "Network", "Device"]
    assert finals["ProblemTypes"]["maxItems"] == 3
    reply = {"classification_output": {"BillingIssue": True, "NoSignal": True, "DeviceBroken": False}, "cot": "c",
             "now_path": ["triage"], "finals": {"Action": "Resolve", "ProblemTypes": ["Network", "Billing"]},
             "chat": "done"}
    assert S.validate_agent_output(scenario, reply) == []
    assert S.validate_agent_output(scenario, {**reply, "finals": {"Action": "Resolve", "ProblemTypes": "Billing"}})
    assert S.validate_agent_output(scenario, {**reply, "finals": {"Action": "Resolve", "ProblemTypes": ["Bill"]}})
