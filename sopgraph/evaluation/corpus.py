"""Training corpora from runs: export scored dialogues, or synthesize gold-path dialogues.

Why: the same machinery that grades agents can make data to train them (SAGE's "automated dialogue
data synthesis"). Two sources:

- **export** (`export_run`): done dialogues of a run whose agent turns meet a score bar, as chat
  transcripts in OpenAI (`messages`) or ShareGPT (`conversations`) form. The assistant messages are the
  agent's SAGE-protocol JSON (with the `actions` it reports, for procedures); with `reference=True` the
  classification, path and finals of each turn are replaced by the reference (the judges' consensus
  labels and the rule engine's path/finals; the case's truth where a turn has no scorable reference)
  and the `cot` is dropped (it would argue for the agent's own, possibly wrong, answer). An agent that
  acts through tools (`tools:MODEL`, HTTP, Python; `AgentOutput.source == "tools"`) is exported as
  what it did: the tool-calling system prompt, its tool calls and the backend's results
  (`tool_messages`), and the tools (`record["tools"]`); `reference=True` is refused for it.
- **gold-path synthesis** (`synthesize_dialogues`): the agent model is told the reference
  classification, path and finals of the case and only has to write the conversation; dialogues are
  produced by the same simulator and gateway as `sop run` (offline with `baseline/oracle`), scored
  against the case truth, and written in the same formats.

Every record carries the case id, the SOP hash and the scores it was selected on.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from sopgraph.cases.validate import CaseFileError, check_cases
from sopgraph.evaluation.score import (
    ScoreConfig,
    ScoredRun,
    ScoreError,
    dialogue_means,
    open_run,
    score_records,
    score_run,
)
from sopgraph.language import ir
from sopgraph.records import Case, Consensus, Dialogue, Turn
from sopgraph.simulation.agents import agent_kind, tool_schemas
from sopgraph.simulation.dialogue import DialogueSetup, scenario_context, simulate_dialogue
from sopgraph.simulation.gateway import Gateway, InfraFailure, ModelOptionError
from sopgraph.simulation.prompts import (
    agent_system_prompt,
    agent_tools_prompt,
    guided_final_prompt,
    guided_stage_prompt,
    user_system_prompt,
)
from sopgraph.simulation.runner import normalize_models

Format = Literal["openai", "sharegpt"]
FORMATS = ("openai", "sharegpt")


class CorpusStats(BaseModel):
    """What an export or synthesis produced (printed by the CLI)."""
    source: str
    format: str
    dialogues_seen: int = 0
    written: int = 0
    turns_written: int = 0
    skipped_format_error: int = 0
    skipped_below_bar: int = 0
    skipped_unscored: int = 0
    skipped_not_done: int = 0
    reference_fallback_turns: int = 0
    infra_failures: int = 0
    min_overall: float | None = None
    reasons: dict[str, int] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Record building


def agent_json(classification: Mapping[str, Any], now_path: Sequence[Any], finals: Mapping[str, Any], chat: str,
               cot: str = "", actions: Sequence[Mapping[str, Any]] = ()) -> str:
    """The SAGE-protocol reply the assistant message holds (compact, key order fixed; `actions`, the
    actions a procedure's reply reports having carried out, only when there are any)."""
    reply: dict[str, Any] = {"classification_output": dict(classification), "cot": cot, "now_path": list(now_path),
                             "finals": dict(finals), "chat": chat}
    if actions:
        reply["actions"] = [dict(a) for a in actions]
    return json.dumps(reply, ensure_ascii=False)


def tool_messages(turn: Turn) -> list[dict[str, Any]]:
    """The OpenAI-format messages of a tool-acting agent's turn, from its stored answers
    (`Turn.agent_raw`, `agents.tool_turn`): per answer, an assistant message with its text and tool calls,
    then one `tool` message per call with the backend's result. Call ids are renumbered
    `call_<turn>_<answer>_<call>` (an agent's own ids are not kept)."""
    out: list[dict[str, Any]] = []
    for r, answer in enumerate(json.loads(turn.agent_raw)):
        if not isinstance(answer, Mapping) or "error" in answer:
            continue
        calls: list[dict[str, Any]] = []
        for i, c in enumerate(answer.get("tool_calls") or []):
            args = c.get("arguments")
            calls.append({"id": f"call_{turn.index}_{r}_{i}", "type": "function", "function": {
                "name": str(c.get("name")),
                "arguments": args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)}})
        msg: dict[str, Any] = {"role": "assistant", "content": answer.get("reply") or ""}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
        for call, result in zip(calls, answer.get("results") or [], strict=False):
            fn: dict[str, Any] = call["function"]
            out.append({"role": "tool", "tool_call_id": call["id"], "name": fn["name"],
                        "content": json.dumps(result, ensure_ascii=False, sort_keys=True)})
    return out


def _sharegpt_turn(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """ShareGPT turns of one agent turn (its OpenAI messages), in LLaMA-Factory's names and order: per
    answer with tool calls a `function_call` (one JSON object, or a list when several), then one
    `observation` with their results (one result, or a JSON list when several), and the turn's text last
    as `gpt`. Why: LLaMA-Factory reads `human`/`observation` only at odd positions and `gpt`/`function_call`
    only at even ones (and wants an even count), and skips any other conversation as broken: a reply's text
    and its calls cannot be two turns in a row, nor two results, nor a conversation end on a result."""
    out: list[dict[str, str]] = []
    texts: list[str] = []
    results: list[Any] = []

    def flush_results() -> None:
        if results:
            value = results[0] if len(results) == 1 else json.dumps(
                [_arguments(r) for r in results], ensure_ascii=False)
            out.append({"from": "observation", "value": str(value)})
            results.clear()

    for message in messages:
        if message["role"] == "tool":
            results.append(str(message["content"]))
            continue
        flush_results()
        if message.get("content"):
            texts.append(str(message["content"]))
        calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
                 for c in message.get("tool_calls") or []]
        if calls:
            out.append({"from": "function_call", "value": json.dumps(calls[0] if len(calls) == 1 else calls,
                                                                     ensure_ascii=False)})
    flush_results()
    if texts or not out or out[-1]["from"] == "observation":
        out.append({"from": "gpt", "value": "\n\n".join(texts)})
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


Exchange = tuple[str, "str | list[dict[str, Any]]"]


def to_record(system: str, exchanges: Sequence[Exchange], metadata: Mapping[str, Any], fmt: Format,
              tools: Sequence[Mapping[str, Any]] | None = None) -> dict:
    """One corpus line: system prompt, then (user, assistant) pairs — the assistant part a reply's text,
    or the OpenAI messages of a tool-acting turn (`tool_messages`) — plus metadata, and the `tools` offered
    (OpenAI: the tool list; ShareGPT: the functions as JSON text, as LLaMA-Factory reads them)."""
    if fmt == "openai":
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for user, assistant in exchanges:
            messages.append({"role": "user", "content": user})
            messages += assistant if isinstance(assistant, list) else [{"role": "assistant", "content": assistant}]
        record: dict[str, Any] = {"messages": messages}
        if tools is not None:
            record["tools"] = [dict(t) for t in tools]
        return {**record, "metadata": dict(metadata)}
    if fmt == "sharegpt":
        conv = [{"from": "system", "value": system}]
        for user, assistant in exchanges:
            conv.append({"from": "human", "value": user})
            if isinstance(assistant, list):
                conv += _sharegpt_turn(assistant)
            else:
                conv.append({"from": "gpt", "value": assistant})
        record = {"conversations": conv}
        if tools is not None:
            record["tools"] = json.dumps([t["function"] for t in tools], ensure_ascii=False)
        return {**record, "metadata": dict(metadata)}
    raise ScoreError(f"unknown corpus format {fmt!r}; use {' or '.join(FORMATS)}")


def _round(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def _scores(run: ScoredRun, d: int, means: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "overall": _round(float(run.d_overall[d])),
        "logic": _round(float(means["logic"][d])),
        "chat": _round(float(means["chat"][d])),
        "classification": _round(float(means["classification"][d])),
        "path": _round(float(means["path"][d])),
        "action": _round(float(means["action"][d])),
        "finals": _round(float(means["finals"][d])),
        "pass": bool(run.d_pass[d]),
        "catastrophic_turns": int(run.d_cat_turns[d]),
    }


def dialogue_records(run: ScoredRun, turns_of: Any, *, fmt: Format = "openai", min_overall: float | None = None,
                     reference: bool = False, source: str = "") -> tuple[list[dict], CorpusStats]:
    """Corpus lines for the dialogues of a scored run that meet the bar (see the module docstring).

    `min_overall` (a fraction) must be reached by every turn of the dialogue that has a per-turn
    overall score; a dialogue with a format error, or with no scored turn while a bar is set, is left
    out. Output order: dialogue id."""
    if reference and run.counts.get("judged_turns") and not run.consensus_labels:
        raise ScoreError("reference export needs the consensus labels: score with keep_labels=True")
    stats = CorpusStats(source=source or run.run, format=fmt, min_overall=min_overall)
    means = dialogue_means(run)
    prompts: dict[str, str] = {}
    out: list[dict] = []
    order = sorted(range(len(run.dialogues)), key=lambda d: run.dialogues[d].id)
    for d in order:
        stats.dialogues_seen += 1
        if run.d_status[d] != 0:
            stats.skipped_not_done += 1
            continue
        rows = run.turn_rows(d)
        if rows.size == 0 or np.any(run.t_format_error[rows]):
            stats.skipped_format_error += 1
            continue
        overall = run.t_overall[rows]
        scored = overall[~np.isnan(overall)]
        if min_overall is not None:
            if scored.size == 0:
                stats.skipped_unscored += 1
                continue
            if float(scored.min()) < min_overall - 1e-12:
                stats.skipped_below_bar += 1
                continue
        case = run.case_of(d)
        if case is None:
            continue
        scenario = run.scenarios.get(case.scenario) or next(iter(run.scenarios.values()))
        turns = {t.index: t for t in turns_of(run.dialogues[d].id)}
        tools = any(t.output is not None and t.output.source == "tools" for t in turns.values())
        if tools and reference:
            raise ScoreError(f"--reference rewrites SAGE replies (classification, path, finals), but the agent of "
                             f"{run.dialogues[d].id} acts through tools: export this run without --reference")
        key = f"{scenario.name}\x00" + ("tools" if tools else json.dumps(case.system, sort_keys=True, default=str))
        if key not in prompts:
            prompts[key] = agent_tools_prompt(scenario) if tools else agent_system_prompt(scenario, case.system)
        exchanges: list[Exchange] = []
        fallback = 0
        for r in rows:
            t = turns.get(int(run.t_index[r]))
            if t is None or t.output is None:
                continue
            o = t.output
            reply: str | list[dict[str, Any]]
            if tools:
                reply = tool_messages(t)
            elif reference:
                ref_id = int(run.t_ref[r])
                if ref_id >= 0:
                    ref = run.refs[ref_id]
                    labels = dict(o.classification_output)
                    cons_labels = _consensus_labels(run, r)
                    labels.update(cons_labels)
                    # a turn where the SOP still waits for a value: the stages passed and the actions done so
                    # far, heading for the case's decision (what the reference oracle says while it asks)
                    finals = case.expected_finals if ref.pending else ref.finals
                    reply = agent_json(labels, list(ref.path), finals, o.chat,
                                       actions=ref.actions if scenario.traced else ())
                else:
                    fallback += 1
                    reply = agent_json(case.truth, case.expected_path, case.expected_finals, o.chat,
                                       actions=(case.expected_actions or []) if scenario.traced else ())
            else:
                reply = agent_json(o.classification_output, o.now_path, o.finals, o.chat, o.cot, o.actions)
            exchanges.append((t.user_text, reply))
        if not exchanges:
            stats.skipped_format_error += 1
            continue
        stats.reference_fallback_turns += fallback
        meta = {
            "case_id": case.id, "dialogue_id": run.dialogues[d].id, "trial": run.dialogues[d].trial,
            "scenario": scenario.name, "sop_hash": case.sop_hash or scenario.source_hash,
            "model": run.model_of(d), "intensity": case.intensity, "bucket": case.bucket,
            "language": case.language, "source": stats.source, "reference": reference,
            "scores": _scores(run, d, means),
        }
        out.append(to_record(prompts[key], exchanges, meta, fmt, tool_schemas(scenario) if tools else None))
        stats.written += 1
        stats.turns_written += len(exchanges)
    return out, stats


def _consensus_labels(run: ScoredRun, row: int) -> dict[str, Any]:
    """The judges' consensus labels of one turn (fields with consensus only)."""
    labels = run.consensus_labels.get((run.dialogues[int(run.t_dlg[row])].id, int(run.t_index[row])))
    return dict(labels) if labels else {}


def export_run(run_dir: str | Path, *, fmt: Format = "openai", min_overall: float | None = None,
               reference: bool = False, config: ScoreConfig | None = None) -> tuple[list[dict], CorpusStats]:
    """Export a run directory as corpus lines (`min_overall` is a fraction)."""
    cfg = config or ScoreConfig()
    run = score_run(run_dir, cfg, keep_labels=reference)
    store = open_run(run_dir)
    try:
        return dialogue_records(run, lambda did: store.turns(dialogue_id=did), fmt=fmt, min_overall=min_overall,
                                reference=reference, source=f"run:{run.run}")
    finally:
        store.close()


def write_jsonl(records: Iterable[Mapping[str, Any]], out: str | Path | None) -> str:
    """JSON Lines text (written to `out` when given)."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if out is not None:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return text


# ---------------------------------------------------------------------------------------------
# Gold-path synthesis


GOLD_HEADER = "## Reference answer for this conversation (gold path)"


def gold_prompt_addition(scenario: ir.Scenario, case: Case) -> str:
    """Text appended to the agent's system prompt: the reference classification, path and finals.

    The agent keeps the output protocol (so the transcript is a valid training example) and only has
    to write the conversation that leads the customer to this outcome."""
    labels = json.dumps(case.truth, ensure_ascii=False, sort_keys=True)
    finals = json.dumps(case.expected_finals, ensure_ascii=False, sort_keys=True)
    path = json.dumps(case.expected_path, ensure_ascii=False)
    return (
        f"\n\n{GOLD_HEADER}\n"
        "The correct handling of this customer has already been worked out. In every reply use exactly:\n"
        f"- classification_output: {labels}\n"
        f"- now_path: {path}\n"
        f"- finals: {finals}\n"
        "Your task is only the `chat`: write what an excellent, empathetic service agent would say at this "
        "point of the conversation to lead the customer to this outcome, asking for any details the customer "
        "has not given yet and explaining the decision in plain words. Never mention these instructions, the "
        "procedure's step ids or the JSON fields in the chat. Keep the `cot` short and consistent with the "
        "reference above.\n"
    )


async def synthesize_dialogues(scenario: ir.Scenario, cases: Sequence[Case], models: Sequence[str], *,
                               trials: int = 1, max_turns: int = 15, concurrency: int = 8, gateway: Any = None,
                               fmt: Format = "openai", min_logic: float | None = None,
                               config: ScoreConfig | None = None, source: str = "cases"
                               ) -> tuple[list[dict], CorpusStats]:
    """Gold-path dialogues for `cases` (agent model from `models`, e.g. ["agent=baseline/oracle"];
    `source`: the cases file, named when a case does not fit the scenario).

    Each dialogue is scored against the case truth (a "gold" judgment set whose labels are the truth;
    chat quality is not judged) and kept if every turn's logic score reaches `min_logic`."""
    cfg = (config or ScoreConfig()).model_copy(update={"judgment_set": "gold", "turns": "all"})

    try:
        roles = normalize_models(list(models))
    except ModelOptionError as exc:
        raise ScoreError(str(exc)) from None
    if roles.agent is None:
        raise ScoreError("no agent model: pass --model agent=PROVIDER/MODEL")
    kind = agent_kind(roles.agent.model)
    if kind in ("http", "python", "tools"):
        raise ScoreError(f"synth-dialogues tells the agent the reference answer inside SAGE's JSON reply protocol; "
                         f"`{roles.agent.model}` acts through tool calls ({kind}) and cannot be given it: run it "
                         "with `sop run` and export the run with `sop export`")
    try:  # what `sop run` refuses, refused here too: otherwise every dialogue is a silent "format error"
        warnings = check_cases(scenario, cases, source=source)
    except CaseFileError as exc:
        raise ScoreError(str(exc)) from None
    gw = gateway if gateway is not None else Gateway(concurrency=concurrency)
    info = scenario_context(scenario)
    dialogues: list[Dialogue] = []
    turns: list[Turn] = []
    failures = 0
    sem = asyncio.Semaphore(max(1, 2 * concurrency))

    async def one(case: Case, trial: int) -> None:
        nonlocal failures
        did = f"{case.id}#{trial}"
        setup = DialogueSetup(scenario=scenario, case=case, dialogue_id=did, trial=trial,
                              agent_system=agent_system_prompt(scenario, case.system)
                              + gold_prompt_addition(scenario, case),
                              user_system=user_system_prompt(case, scenario), scenario_info=info,
                              sop_hash=scenario.source_hash, agent_context={"gold": True},
                              guided_prompts=(guided_stage_prompt, guided_final_prompt))
        async with sem:
            try:
                result = await simulate_dialogue(gw, roles.agent, roles.user, setup, max_turns=max_turns)
            except InfraFailure:
                failures += 1
                return
        dialogues.append(Dialogue(id=did, case_id=case.id, trial=trial, models={"agent": roles.agent.model},
                                  status="done", end_reason=result.end_reason, turns=len(result.turns),
                                  sop_hash=scenario.source_hash))
        turns.extend(result.turns)

    await asyncio.gather(*(one(c, t) for c in cases for t in range(trials)))
    dialogues.sort(key=lambda d: d.id)
    turns.sort(key=lambda t: (t.dialogue_id, t.index))
    truth = {c.id: c.truth for c in cases}  # by id: a shard of thousands of cases is not scanned per turn
    gold = [Consensus(judgment_set="gold", dialogue_id=t.dialogue_id, turn_index=t.index,
                      labels=dict(truth[t.dialogue_id.rsplit("#", 1)[0]]), judges_scored=0) for t in turns]
    run = score_records(scenario, list(cases), dialogues, turns, gold, cfg, run="gold-synthesis")
    by_dialogue: dict[str, list[Turn]] = {}
    for t in turns:
        by_dialogue.setdefault(t.dialogue_id, []).append(t)
    records, stats = dialogue_records(run, lambda did: by_dialogue.get(did, []), fmt=fmt, min_overall=None,
                                      reference=False, source=f"gold:{roles.agent.model}")
    if min_logic is not None:
        kept = []
        for rec in records:
            did = rec["metadata"]["dialogue_id"]
            d = run.dialogue_index(did)
            assert d is not None  # the records were made from this run's dialogues
            rows = run.turn_rows(d)
            logic = run.t_logic[rows]
            if logic.size and not np.any(np.isnan(logic)) and float(logic.min()) >= min_logic - 1e-12:
                kept.append(rec)
            else:
                stats.skipped_below_bar += 1
        stats.written = len(kept)
        records = kept
    stats.infra_failures = failures
    stats.warnings = warnings
    return records, stats


def synthesize_dialogues_sync(*args: Any, **kwargs: Any) -> tuple[list[dict], CorpusStats]:
    return asyncio.run(synthesize_dialogues(*args, **kwargs))
