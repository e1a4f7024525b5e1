"""`sop compile` and `sop decide` through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sopgraph.cli import main

TELECOM = str(Path(__file__).parent.parent / "scenarios" / "telecom_package.sop")


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input)


def test_compile_formats(tmp_path):
    for fmt in ("json", "graphml", "dot"):
        out = tmp_path / f"g.{fmt}"
        res = run("compile", TELECOM, "--format", fmt, "-o", str(out))
        assert res.exit_code == 0, res.output
        first = out.read_bytes()
        run("compile", TELECOM, "--format", fmt, "-o", str(out))
        assert out.read_bytes() == first  # deterministic
    assert json.loads((tmp_path / "g.json").read_text())["graph"]["name"] == "telecom_package"
    assert "digraph" in (tmp_path / "g.dot").read_text()


def test_decide_single_values():
    res = run("decide", TELECOM, "--values", '{"ConsumptionType": "Cancel", "Penalty": 0}')
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"path": ["step1", "step2", "step5"], "finals": {"Action": "ChangeOrder"}}


def test_decide_batch_continues_past_errors():
    lines = [
        {"ConsumptionType": "Cancel", "Penalty": 0},
        {"ConsumptionType": "Cancel"},  # Penalty needed at step5
        {"ConsumptionType": "Refund"},  # not in the enum
        {"ConsumptionType": "Change", "PackageStatus": "NoContract", "Unrelated": 1},
    ]
    stdin = "\n".join(json.dumps(x) for x in lines) + "\nnot json\n"
    res = run("decide", TELECOM, input=stdin)
    assert res.exit_code == 1
    out = [json.loads(line) for line in res.stdout.strip().splitlines()]
    assert len(out) == 5
    assert out[0]["finals"] == {"Action": "ChangeOrder"}
    assert "Penalty" in out[1]["error"] and "step5" in out[1]["error"]
    assert "Refund" in out[2]["error"]
    assert out[3] == {"path": ["step1", "step2", "step4"], "finals": {"Action": "ChangeOrder"}}
    assert "invalid JSON" in out[4]["error"]


def test_malformed_sop_gives_located_error_not_traceback(tmp_path):
    bad = tmp_path / "bad.sop"
    bad.write_text('scenario x "X"\nfield A: P | Q\nstage s1 "S" {\n  match A { P step2 Q -> do X }\n}\n')
    res = run("compile", str(bad))
    assert res.exit_code == 1
    assert f"{bad}:4:15: error[E001]: missing `->`" in res.output
    assert "^" in res.output and "hint:" in res.output
    assert "Traceback" not in res.output


FEE_SOP = """scenario hotel "Hotel" "A hotel desk handles cancellations."
field Reason: Sick | Other "why the guest cancels"
system NightlyRate: int[0..) "the nightly rate"
output Fee: float[0..) "the fee"
action PartialRefund "refund part" [moves_money]
action FullRefund "refund all" [moves_money]
stage s1 "Reason" {
    match Reason { Sick -> do FullRefund  Other -> do PartialRefund { Fee = NightlyRate - 500 } }
}
"""


def test_decide_refuses_an_output_outside_its_range(tmp_path, monkeypatch):
    sop = tmp_path / "fee.sop"
    sop.write_text(FEE_SOP)
    check = run("check", str(sop))
    assert check.exit_code == 1 and "E204" in check.output  # statically, with a witness
    refused = run("decide", str(sop), "--values", '{"Reason": "Sick"}')
    assert refused.exit_code == 1 and "E204" in refused.output  # decide loads only checked programs
    # where the static search finds no witness (bounded), decide time still enforces the range
    monkeypatch.setattr("sopgraph.logic.checker.output_range_diagnostics", lambda scenario, **_budget: [])
    one = run("decide", str(sop), "--values", '{"Reason": "Other", "NightlyRate": 89}')
    assert one.exit_code == 1
    assert json.loads(one.stdout) == {
        "error": "output `Fee` = -411 is outside float[0..) (set by `Fee = NightlyRate - 500` at s1)"}
    rows = [{"Reason": "Other", "NightlyRate": 89}, {"Reason": "Other", "NightlyRate": 900}, {"Reason": "Sick"}]
    batch = run("decide", str(sop), input="".join(json.dumps(r) + "\n" for r in rows))
    assert batch.exit_code == 1
    out = [json.loads(line) for line in batch.stdout.splitlines()]
    assert len(out) == 3 and "outside float[0..)" in out[0]["error"]
    assert out[1]["finals"] == {"Action": "PartialRefund", "Fee": 400}
    assert out[2]["finals"] == {"Action": "FullRefund", "Fee": None}
    assert "1 of 3 inputs failed" in batch.stderr


def test_decide_warns_about_undeclared_keys_without_failing():
    rows = [{"ConsumptionType": "Cancel", "Penalty": 0, "Penalyt": 3},
            {"ConsumptionType": "Cancel", "Penalty": 0, "Penalyt": 4, "Action": "X"}]
    res = run("decide", TELECOM, input="".join(json.dumps(r) + "\n" for r in rows))
    assert res.exit_code == 0, res.output
    assert [json.loads(x)["finals"] for x in res.stdout.splitlines()] == [{"Action": "ChangeOrder"}] * 2
    warnings = res.stderr.splitlines()
    assert warnings == [
        "warning: line 1: `Penalyt` is not a field or system variable of `telecom_package`; it is ignored "
        "(did you mean `Penalty`?)",
        "warning: line 2: `Action` is an output, not an input: the given value is ignored",
    ]
    single = run("decide", TELECOM, "--values", '{"ConsumptionType": "Cancel", "Penalty": 0, "Reqest": 1}')
    assert single.exit_code == 0 and "`Reqest` is not a field" in single.stderr


DATA = Path(__file__).parent / "data"


def _no_traceback(*args: str) -> str:
    res = run(*args)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output, res.output
    assert res.exit_code == 0, res.output
    return res.output


def test_quoted_enum_values_through_check_paths_synth_prompt_schema_render(tmp_path):
    sop = str(DATA / "lang_quoted_values.sop")
    assert "0 errors" in _no_traceback("check", sop)
    paths = json.loads(_no_traceback("paths", sop, "--format", "json"))
    assert any(p["constraints"].get("Reports") == '"5+ times"' for p in paths)
    _no_traceback("synth", sop, "-n", "4", "-o", str(tmp_path / "c.jsonl"), "-q")
    cases = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert {c["truth"]["Reports"] for c in cases} >= {"5+ times"}
    assert 'one of: Never, "1-2 times", "5+ times"' in _no_traceback("prompt", sop)
    assert '"5+ times"' in _no_traceback("schema", "agent-output", sop)
    _no_traceback("render", sop, "-o", str(tmp_path / "g.mmd"))
    assert "#quot;5+ times#quot;" in (tmp_path / "g.mmd").read_text()  # the label escapes the quotes
    _no_traceback("render", sop, "-o", str(tmp_path / "g.dot"))
    assert '\\"Traffic/URL' in (tmp_path / "g.dot").read_text()
    out = _no_traceback("decide", sop, "--values", '{"Reports": "5+ times"}')
    assert json.loads(out)["finals"] == {"Action": "Remove", "Severity": "Very high"}


def test_optional_record_fields_through_check_paths_synth_prompt(tmp_path):
    sop = str(DATA / "lang_optional_fields.sop")
    assert "0 errors, 0 warnings" in _no_traceback("check", sop)
    paths = json.loads(_no_traceback("paths", sop, "--format", "json"))
    assert any(p["witness"]["Contact"]["email"] is None for p in paths)
    _no_traceback("synth", sop, "-n", "7", "-o", str(tmp_path / "c.jsonl"), "-q")
    cases = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert any(c["system"]["Contact"].get("email") is None for c in cases)
    assert "email (text, may be absent)" in _no_traceback("prompt", sop)
    out = _no_traceback("decide", sop, "--values", '{"Contact": {"phone": "1"}, "Bills": [{"amount": 5, "note": "urgent"}]}')
    assert json.loads(out)["finals"] == {"Action": "Call"}


def test_open_records_through_check_paths_synth_prompt(tmp_path):
    sop = str(DATA / "lang_open_records.sop")
    assert "0 errors, 0 warnings" in _no_traceback("check", sop)
    assert len(json.loads(_no_traceback("paths", sop, "--format", "json"))) >= 3
    _no_traceback("synth", sop, "-n", "3", "-o", str(tmp_path / "c.jsonl"), "-q")
    assert "other fields may appear too" in _no_traceback("prompt", sop)
    seg = {"flown": False, "fare": 5, "cabin": "Economy", "price": 99, "carrier": "LH"}
    out = _no_traceback("decide", sop, "--values", json.dumps({"Segments": [seg], "Account": {"vip": False}}))
    assert json.loads(out)["finals"] == {"Action": "Refund"}


def test_list_outputs_through_check_paths_synth_prompt_schema(tmp_path):
    sop = str(DATA / "lang_list_outputs.sop")
    assert "0 errors, 0 warnings" in _no_traceback("check", sop)
    paths = json.loads(_no_traceback("paths", sop, "--format", "json"))
    assert {tuple(p["witness_finals"]["ProblemTypes"]) for p in paths} >= {()}
    assert any("Network when NoSignal" in (p.get("finals_varying") or {}).get("ProblemTypes", "") for p in paths)
    _no_traceback("synth", sop, "-n", "6", "-o", str(tmp_path / "c.jsonl"), "-q")
    cases = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert all(isinstance(c["expected_finals"]["ProblemTypes"], list) for c in cases)
    prompt = _no_traceback("prompt", sop)
    assert "ProblemTypes — a list of at most 3 items, each one of: Billing, Network, Device" in prompt
    assert "in any order (compared as a set)" in prompt and "[] when the final action does not set it" in prompt
    assert '"type":"array"' in _no_traceback("schema", "agent-output", sop).replace(" ", "").replace("\n", "")
    _no_traceback("render", sop, "-o", str(tmp_path / "g.svg"))
    out = _no_traceback("decide", sop, "--values", '{"DeviceBroken": true, "NoSignal": true, "BillingIssue": false}')
    assert json.loads(out)["finals"] == {"Action": "Repair", "ProblemTypes": ["Network", "Device"]}


def test_validate_compares_a_list_output_as_a_set(tmp_path):
    data = tmp_path / "log.csv"
    data.write_text('DeviceBroken,NoSignal,BillingIssue,Action,ProblemTypes\n'
                    'true,true,false,Repair,"[""Device"",""Network"",""Device""]"\n'
                    'false,true,true,Resolve,"[""Network""]"\n', encoding="utf-8")
    res = run("validate", str(DATA / "lang_list_outputs.sop"), "--data", str(data))
    assert "Traceback" not in res.output
    assert "1/2 rows agree" in res.output, res.output


# ---------------------------------------------------------------------------------------------
# `sop step`: the session over JSON Lines

NO_SERVICE = str(Path(__file__).parent.parent / "examples" / "no_service.sop")


def _records(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines()]


def test_step_transcript_asks_acts_and_ends():
    answers = [{"AccountSuspended": False}, {"AreaOutage": False}, {"ServiceRestored": False},
               {"SimDetected": True}, {"AirplaneMode": True}, {"ServiceRestored": False},
               {"Registered": "Home"}, {"ServiceRestored": True}]
    res = run("step", NO_SERVICE, input="".join(json.dumps(a) + "\n" for a in answers))
    assert res.exit_code == 0, res.output
    assert _records(res.output) == [
        {"need": "AccountSuspended", "stage": "account"}, {"need": "AreaOutage", "stage": "account"},
        {"need": "ServiceRestored", "look": 1, "stage": "status"}, {"need": "SimDetected", "stage": "status"},
        {"need": "AirplaneMode", "stage": "status"}, {"act": "AskAirplaneOff", "args": {}, "final": False},
        {"need": "ServiceRestored", "look": 2, "stage": "recheck"}, {"need": "Registered", "stage": "fix"},
        {"act": "PushSettings", "args": {"profile": "Home"}, "final": False},
        {"act": "AskRestart", "args": {}, "final": False},
        {"need": "ServiceRestored", "look": 3, "stage": "retest"},
        {"act": "CloseFixed", "args": {}, "final": True},
        {"end": {"path": ["account", "status", "recheck", "fix", "retest"], "finals": {"Action": "CloseFixed"},
                 "actions": [{"name": "AskAirplaneOff", "args": {}}, {"name": "PushSettings", "args": {"profile": "Home"}},
                             {"name": "AskRestart", "args": {}}, {"name": "CloseFixed", "args": {}}]}}]
    # the same run as `sop decide` on the values it was given
    decided = run("decide", NO_SERVICE, "--values", json.dumps(
        {**{k: v for a in answers for k, v in a.items() if k != "ServiceRestored"},
         "ServiceRestored": [False, False, True]}))
    assert json.loads(decided.output) == _records(res.output)[-1]["end"]


def test_step_bad_lines_get_an_error_and_the_request_again():
    lines = ["not json", "[1]", "", '{"AccountSuspended": "yes"}', '{"AcountSuspended": true}',
             '{"Mood": "Calm", "AccountSuspended": true}']
    res = run("step", NO_SERVICE, input="\n".join(lines) + "\n" + "\xff\n")
    assert res.exit_code == 0, res.output
    records = _records(res.output)
    need = {"need": "AccountSuspended", "stage": "account"}
    assert records[0] == need
    errors = [r["error"] for r in records if "error" in r]
    assert [r for r in records if "error" not in r] == [need] * 6 + [
        {"act": "ExplainPayment", "args": {}, "final": True},
        {"end": {"path": ["account"], "finals": {"Action": "ExplainPayment"},
                 "actions": [{"name": "ExplainPayment", "args": {}}]}}]
    assert errors[0].startswith("line 1: invalid JSON object")
    assert errors[1] == "line 2: invalid JSON object: expected a JSON object"
    assert errors[2] == "line 3: empty line (expected a JSON object of values)"
    assert errors[3] == 'line 4: value "yes" of `AccountSuspended` is not a bool'
    assert errors[4] == ("line 5: `AcountSuspended` is not a field or system variable of `no_service` "
                         "(did you mean `AccountSuspended`?)")
    assert len(errors) == 5  # the line after the end is never read
    assert "Traceback" not in res.output


def test_step_input_ending_early_and_a_failing_run_end_with_a_message(tmp_path: Path):
    res = run("step", NO_SERVICE, input='{"AccountSuspended": false}\n')
    assert res.exit_code == 1
    assert _records(res.output)[-1] == {
        "error": "input ended while the run waits for `AreaOutage` at account; nothing was decided"}
    res = run("step", NO_SERVICE, "--values", '{"AccountSuspended": false, "AreaOutage": false}', input="")
    assert res.exit_code == 1
    assert _records(res.output)[-1]["error"].startswith("input ended while the run waits for `ServiceRestored` "
                                                        "(look 1) at status")
    res = run("step", str(_division(tmp_path)), input='{"Count": 0}\n')
    assert res.exit_code == 1
    assert _records(res.output) == [{"need": "Count", "stage": "s"}, {"error": "division by zero (at s)"}]


def _division(tmp_path: Path) -> Path:
    path = tmp_path / "division.sop"
    path.write_text('system Count: int[0..9] "c"\nlet Share = 10 / Count\naction A "a"\naction B "b"\n'
                    'stage s { when Share > 1 -> do A otherwise -> do B }\n', encoding="utf-8")
    return path


def test_step_values_up_front_and_now():
    res = run("step", NO_SERVICE, "--values", json.dumps({**{"AccountSuspended": False, "AreaOutage": True},
                                                         "OutageHours": 3}))
    assert res.exit_code == 0, res.output
    assert _records(res.output)[0] == {"act": "ReportOutage", "args": {"hours": 3}, "final": True}
    res = run("step", NO_SERVICE, "--values", "{bad")
    assert res.exit_code == 2 and "--values" in res.output


def test_step_is_interactive_over_pipes():
    """A caller that writes each answer only after reading the request (a real pipe, no buffering
    deadlock): the tool flushes every line."""
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    proc = subprocess.Popen([sys.executable, "-c", "from sopgraph.cli import entry; entry()", "step", NO_SERVICE],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root,
                            env={"PYTHONPATH": str(root)})
    assert proc.stdin is not None and proc.stdout is not None
    answers = {"AccountSuspended": True}
    seen = []
    while True:
        record = json.loads(proc.stdout.readline())
        seen.append(record)
        if "need" in record:
            proc.stdin.write(json.dumps({record["need"]: answers[record["need"]]}) + "\n")
            proc.stdin.flush()
        if "end" in record:
            break
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert seen[-1]["end"]["finals"] == {"Action": "ExplainPayment"}
