"""Training corpora: export with a score bar and reference substitution; gold-path synthesis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import floor_run

import sopgraph
from sopgraph.cli import main
from sopgraph.evaluation.corpus import (
    GOLD_HEADER,
    dialogue_records,
    export_run,
    gold_prompt_addition,
    synthesize_dialogues_sync,
    to_record,
)
from sopgraph.evaluation.score import ScoreError, score_records
from sopgraph.logic.engine import decide
from sopgraph.records import CHAT_DIMENSIONS, AgentOutput, Case, Consensus, Dialogue, Persona, Turn
from sopgraph.simulation.runner import read_cases

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"
TRUTH = {"ConsumptionType": "Cancel", "ApplicationTendency": "Agree", "ConsumptionProfile": "Data",
         "EmotionTag": "Discontent"}
SYSTEM = {"PackageStatus": "Contracted", "Penalty": 100}


@pytest.fixture(scope="module")
def telecom() -> sopgraph.Scenario:
    return sopgraph.load(TELECOM)


def _case(scenario, cid: str = "c1") -> Case:
    d = decide(scenario, {**TRUTH, **SYSTEM})
    return Case(id=cid, scenario=scenario.name, path_id="P", intent="i", persona=Persona(name="p"), truth=TRUTH,
                system=SYSTEM, expected_path=d.path, expected_finals=d.finals, prohibited_actions=["ChangeOrder"],
                sop_hash=scenario.source_hash)


def _turn(did: str, i: int, labels: dict, path: list, action: str, fmt: bool = False) -> Turn:
    if fmt:
        return Turn(dialogue_id=did, index=i, user_text=f"u{i}", agent_raw="oops", format_error=True)
    return Turn(dialogue_id=did, index=i, user_text=f"u{i}", agent_raw="{}",
                output=AgentOutput(classification_output=labels, cot="my reasoning", now_path=path,
                                   finals={"Action": action}, chat=f"reply {i}"))


def _cons(did: str, i: int, labels: dict, score: int = 9) -> Consensus:
    return Consensus(dialogue_id=did, turn_index=i, labels=labels, chat_scores=dict.fromkeys(CHAT_DIMENSIONS, score),
                     judges_scored=3)


def _scored(telecom):
    """Three dialogues: perfect, mediocre (wrong action), and one with a format error."""
    case = _case(telecom)
    good, bad, broken = (Dialogue(id=f"c1#{t}", case_id="c1", trial=t, models={"agent": "m"}, status="done")
                         for t in range(3))
    calm = {**TRUTH, "EmotionTag": "Calm"}
    turns = [
        _turn(good.id, 1, TRUTH, case.expected_path, "TransHuman"),
        _turn(bad.id, 1, calm, case.expected_path, "ChangeOrder"), _turn(bad.id, 2, calm, ["step1"], "ChangeOrder"),
        _turn(broken.id, 1, TRUTH, case.expected_path, "TransHuman"), _turn(broken.id, 2, {}, [], "", fmt=True),
    ]
    consensus = [_cons(good.id, 1, TRUTH), _cons(bad.id, 1, TRUTH, 6), _cons(broken.id, 1, TRUTH)]
    run = score_records(telecom, [case], [good, bad, broken], turns, consensus, keep_labels=True)
    by_id: dict[str, list[Turn]] = {}
    for t in turns:
        by_id.setdefault(t.dialogue_id, []).append(t)
    return run, (lambda did: by_id.get(did, []))


def test_export_bar_and_formats(telecom) -> None:
    run, turns_of = _scored(telecom)
    records, stats = dialogue_records(run, turns_of, min_overall=0.9)
    assert [r["metadata"]["dialogue_id"] for r in records] == ["c1#0"]
    assert stats.skipped_below_bar == 1 and stats.skipped_format_error == 1
    rec = records[0]
    msgs = rec["messages"]
    assert msgs[0]["role"] == "system" and "Telecom package" in msgs[0]["content"]
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant"]
    reply = json.loads(msgs[2]["content"])
    assert reply["finals"] == {"Action": "TransHuman"} and reply["cot"] == "my reasoning"
    meta = rec["metadata"]
    assert meta["case_id"] == "c1" and meta["sop_hash"] == telecom.source_hash
    assert meta["scores"]["overall"] == pytest.approx(1.0) and meta["scores"]["pass"] is True
    everything, _ = dialogue_records(run, turns_of, fmt="sharegpt")
    assert len(everything) == 2  # the format-error dialogue is never exported
    assert [c["from"] for c in everything[0]["conversations"][:3]] == ["system", "human", "gpt"]
    with pytest.raises(ScoreError):
        to_record("s", [], {}, "alpaca")  # type: ignore[arg-type]


def test_export_with_reference_substitutes_consensus_and_engine(telecom) -> None:
    run, turns_of = _scored(telecom)
    records, stats = dialogue_records(run, turns_of, reference=True)
    bad = next(r for r in records if r["metadata"]["dialogue_id"] == "c1#1")
    first, second = (json.loads(m["content"]) for m in bad["messages"][2::2])
    assert first["classification_output"] == TRUTH  # consensus labels replace the agent's "Calm"
    assert first["now_path"] == ["step1", "step2", "step5", "step7"] and first["finals"]["Action"] == "TransHuman"
    assert first["cot"] == "" and first["chat"] == "reply 1"
    # turn 2 was not judged: the case truth stands in, and it is counted
    assert second["finals"]["Action"] == "TransHuman" and second["classification_output"] == TRUTH
    assert stats.reference_fallback_turns == 1
    assert bad["metadata"]["reference"] is True


def test_gold_prompt_addition(telecom) -> None:
    text = gold_prompt_addition(telecom, _case(telecom))
    assert GOLD_HEADER in text and '"TransHuman"' in text and '"step7"' in text and "Discontent" in text


def test_gold_synthesis_offline(telecom) -> None:
    cases = [_case(telecom, f"g{i}") for i in range(3)]
    records, stats = synthesize_dialogues_sync(telecom, cases, ["agent=baseline/oracle"], trials=2, min_logic=1.0)
    assert stats.written == 6 and stats.infra_failures == 0
    meta = records[0]["metadata"]
    assert meta["source"] == "gold:baseline/oracle" and meta["scores"]["logic"] == 1.0
    # the corpus system prompt is the plain agent prompt: the gold answer is not leaked into training data
    assert GOLD_HEADER not in records[0]["messages"][0]["content"]
    with pytest.raises(ScoreError):
        synthesize_dialogues_sync(telecom, cases, ["user=scripted/user"])


_floor_run = floor_run


def test_export_and_synth_cli(tmp_path_factory, tmp_path) -> None:
    run = _floor_run(tmp_path_factory, "baseline/always-comply")
    out = tmp_path / "corpus.jsonl"
    res = CliRunner().invoke(main, ["export", str(run), "--min-overall", "60", "-o", str(out)])
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines and all(r["metadata"]["scores"]["overall"] >= 0.6 for r in lines)  # one-turn dialogues
    records, _ = export_run(run, fmt="sharegpt", reference=True)
    assert all(r["metadata"]["reference"] for r in records)
    cases = tmp_path_factory.getbasetemp() / "floor_runs" / "cases.jsonl"
    out2 = tmp_path / "gold.jsonl"
    res = CliRunner().invoke(main, ["synth-dialogues", str(TELECOM), "--cases", str(cases), "--model",
                                    "agent=baseline/oracle", "-o", str(out2), "--format", "sharegpt"])
    assert res.exit_code == 0, res.output
    gold = [json.loads(x) for x in out2.read_text().splitlines()]
    assert len(gold) == len(read_cases(cases))
    assert all(r["metadata"]["scores"]["action"] == 1.0 for r in gold)
    res = CliRunner().invoke(main, ["synth-dialogues", str(TELECOM), "--cases", str(cases), "--model", "agent"])
    assert res.exit_code != 0


@pytest.fixture(scope="module")
def no_service_runs(tmp_path_factory) -> tuple[Path, Path, list[Case]]:
    """examples/no_service.sop (actions on the way, a bounded retry) run by the oracle in SAGE mode and by
    the oracle acting through tool calls."""
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import synthesize
    from sopgraph.simulation.runner import run_sync
    path = ROOT / "examples" / "no_service.sop"
    sop = sopgraph.load(path)
    cases = list(synthesize(sop, profile_for(path, sop), 14, seed=5, min_per_path=1).cases)
    base = tmp_path_factory.mktemp("no_service_runs")
    for name, model in (("sage", "baseline/oracle"), ("tools", "baseline/oracle-tools")):
        run_sync(sop, cases, [f"agent={model}"], str(base / name), trials=1, progress=False, judge_turns="final")
    return base / "sage", base / "tools", cases


def test_export_of_a_tool_acting_agent_holds_its_calls_results_and_tools(no_service_runs, tmp_path) -> None:
    """Before, a tool-acting agent's dialogues were exported as empty SAGE replies under the SAGE prompt
    (no tool call, no tool, no result): a corpus that taught the opposite of what the agent did."""
    from sopgraph.simulation.agents import tool_schemas
    from sopgraph.simulation.prompts import agent_tools_prompt
    _sage, tools_run, cases = no_service_runs
    sop = sopgraph.load(ROOT / "examples" / "no_service.sop")
    expected = {c.id: [a["name"] for a in c.expected_actions or []] for c in cases}
    records, stats = export_run(tools_run)
    assert stats.written == len(cases)
    for rec in records:
        msgs = rec["messages"]
        assert msgs[0] == {"role": "system", "content": agent_tools_prompt(sop)}
        assert rec["tools"] == tool_schemas(sop)
        assert not any(str(m.get("content") or "").startswith('{"classification_output"') for m in msgs)
        called = [c for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        assert [c["function"]["name"] for c in called if c["function"]["name"] != "lookup"] == \
            expected[rec["metadata"]["case_id"]]  # the oracle's calls, in order
        answered = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
        assert answered == [c["id"] for c in called]  # every call has its result, in order
    share, _ = export_run(tools_run, fmt="sharegpt")
    kinds = {t["from"] for r in share for t in r["conversations"]}
    assert {"function_call", "observation", "human", "system"} <= kinds
    assert json.loads(share[0]["tools"]) == [t["function"] for t in tool_schemas(sop)]
    res = CliRunner().invoke(main, ["export", str(tools_run), "--reference", "-o", str(tmp_path / "x.jsonl")])
    assert res.exit_code != 0 and "acts through tools" in res.output


def test_export_keeps_the_actions_a_sage_reply_reports(no_service_runs) -> None:
    sage, _tools, cases = no_service_runs
    by_case = {c.id: c for c in cases}
    records, _ = export_run(sage)
    for rec in records:
        last = json.loads(rec["messages"][-1]["content"])
        assert last["actions"] == by_case[rec["metadata"]["case_id"]].expected_actions
    records, _ = export_run(sage, reference=True)
    for rec in records:  # the reference reply carries the reference trace beside the reference path
        last = json.loads(rec["messages"][-1]["content"])
        assert last["actions"] == by_case[rec["metadata"]["case_id"]].expected_actions


def _llama_factory_accepts(conversation: list[dict[str, str]]) -> bool:
    """LLaMA-Factory's ShareGPT rule (SharegptDatasetConverter): after an optional leading system turn,
    `human`/`observation` at even indexes, `gpt`/`function_call` at odd ones, and an even count."""
    turns = conversation[1:] if conversation and conversation[0]["from"] == "system" else conversation
    allowed = (("human", "observation"), ("gpt", "function_call"))
    return len(turns) % 2 == 0 and all(t["from"] in allowed[i % 2] for i, t in enumerate(turns))


def test_sharegpt_export_of_tool_calls_alternates_as_llama_factory_reads_it(no_service_runs) -> None:
    """Before, a reply's text and its calls were two assistant-side turns in a row, each result its own
    observation and the conversation ended on a result: LLaMA-Factory skipped every such dialogue."""
    sage, tools_run, _cases = no_service_runs
    for run in (sage, tools_run):
        share, _ = export_run(run, fmt="sharegpt")
        openai, _ = export_run(run)
        for rec, twin in zip(share, openai, strict=True):
            conv = rec["conversations"]
            assert _llama_factory_accepts(conv), [t["from"] for t in conv]
            calls = [c for m in twin["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
            shared = [json.loads(t["value"]) for t in conv if t["from"] == "function_call"]
            flat = [c for v in shared for c in (v if isinstance(v, list) else [v])]
            assert [c["name"] for c in flat] == [c["function"]["name"] for c in calls]
    from sopgraph.evaluation.corpus import _sharegpt_turn
    two = [{"role": "assistant", "content": "Blocking and refunding.", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "Block", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "Refund", "arguments": '{"amount": 5}'}}]},
        {"role": "tool", "tool_call_id": "a", "name": "Block", "content": '{"status": "done"}'},
        {"role": "tool", "tool_call_id": "b", "name": "Refund", "content": '{"status": "done"}'}]
    assert _sharegpt_turn(two) == [
        {"from": "function_call", "value": '[{"name": "Block", "arguments": {}}, '
                                           '{"name": "Refund", "arguments": {"amount": 5}}]'},
        {"from": "observation", "value": '[{"status": "done"}, {"status": "done"}]'},
        {"from": "gpt", "value": "Blocking and refunding."}]
    assert _sharegpt_turn([]) == [{"from": "gpt", "value": ""}]  # an answer that failed still answers


def test_synth_dialogues_refuses_cases_of_another_sop_and_tool_agents(tmp_path) -> None:
    """Before: cases that do not fit the scenario, or an agent acting through tools, gave a corpus of 0
    dialogues ('N with format errors') and exit 0."""
    cases = tmp_path / "cases.jsonl"
    made = CliRunner().invoke(main, ["synth", str(TELECOM), "-n", "6", "--seed", "2", "-q", "-o", str(cases)])
    assert made.exit_code == 0, made.output
    other = tmp_path / "other.sop"  # the same scenario with a moved threshold: some expectations change
    other.write_text(TELECOM.read_text(encoding="utf-8").replace("Penalty == 0", "Penalty <= 1000"),
                     encoding="utf-8")
    assert other.read_text(encoding="utf-8") != TELECOM.read_text(encoding="utf-8")
    res = CliRunner().invoke(main, ["synth-dialogues", str(other), "--cases", str(cases), "--model",
                                    "agent=baseline/oracle", "-o", str(tmp_path / "c.jsonl")])
    assert res.exit_code != 0 and f"{cases}: case " in res.output and "re-synthesize" in res.output, res.output
    tools = CliRunner().invoke(main, ["synth-dialogues", str(TELECOM), "--cases", str(cases), "--model",
                                      "agent=baseline/oracle-tools", "-o", str(tmp_path / "t.jsonl")])
    assert tools.exit_code != 0 and "acts through tool calls" in tools.output and "sop export" in tools.output
    fine = CliRunner().invoke(main, ["synth-dialogues", str(TELECOM), "--cases", str(cases), "--model",
                                     "agent=baseline/oracle", "-o", str(tmp_path / "ok.jsonl")])
    assert fine.exit_code == 0 and len((tmp_path / "ok.jsonl").read_text(encoding="utf-8").splitlines()) == 6
