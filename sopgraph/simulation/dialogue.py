"""The dialogue loop: a simulated user talks to the agent under test until the dialogue ends.

One dialogue = one case × one trial. Each agent turn is the user's utterance and the agent's
reply; the reply is parsed into `AgentOutput` (SAGE's JSON protocol) or counted as a format error.

Format-error rule (`parse_agent_reply`, a pure function):
1. strict: the whole reply, trimmed, is one JSON object;
2. else fenced: the first ``` fenced block (```json or bare) whose body is a JSON object
   (note: "extracted from a fenced code block");
3. else embedded: the first `{` of the text at which a complete JSON object decodes, scanning
   left to right (note: "extracted from surrounding text").
The object found is then checked against the scenario's output schema (`schema.validate_agent_output`).
A reply is a format error iff no object was found or the object found violates the schema; lenient
extraction alone (2, 3) is not an error but is flagged in `Turn.format_note`. On a format error the
agent's raw text is what the user sees, and later scoring gives the turn's logic scores zero.

Termination (`Dialogue.end_reason`):
- `ending_action`: the agent takes an action with the `ends_dialogue` or `escalation` attribute:
  a tool call, or a SAGE reply whose `finals.Action` is one and whose `now_path` reaches it (`acts`;
  a reply whose path stops short is still asking, as is a guided turn asking before acting,
  `GuidedState.asking`; format-error turns never end a dialogue);
- `user_stop`: the user's reply contains `###STOP###` (text before it is kept as
  `Dialogue.closing_user_text`; no agent turn follows);
- `max_turns`: the agent has answered `max_turns` times.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from sopgraph.language import ir
from sopgraph.language.compile import reads, stage_reads
from sopgraph.language.schema import validate_agent_output
from sopgraph.logic.engine import Interpreter, leaf_finals
from sopgraph.logic.paths import iter_paths
from sopgraph.records import AgentOutput, Case, EndReason, Turn, Usage
from sopgraph.simulation.agents import ToolAgent, tool_turn
from sopgraph.simulation.backend import Backend
from sopgraph.simulation.environment import EnvSpec, backend_for
from sopgraph.simulation.guided import GuidedState, Walk, accept_values, open_classified, output_json, walk
from sopgraph.simulation.providers import guided_inner, names_value

STOP_TOKEN = "###STOP###"
OPENING_INSTRUCTION = (
    "The customer-service chat window has just opened and the agent is waiting. "
    "Write your first message to the agent now, in character."
)
MAX_EMBEDDED_TRIES = 64  # `{` positions tried in step 3 (bounds the work on adversarial text)
PATHS_IN_CONTEXT = 2000  # reference paths handed to built-in providers (random-path baseline)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[^\n]*\n(.*?)```", re.DOTALL)


# ---------------------------------------------------------------------------------------------
# Parsing


def extract_json_object(text: str) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """Find the JSON object in a model reply: (object or None, how, error).

    `how` is None for a strict parse, "fenced" or "embedded" for lenient extraction; `error` says
    why nothing was found."""
    stripped = text.strip()
    error: str | None = None
    try:
        obj = json.loads(stripped)
        if isinstance(obj, dict):
            return obj, None, None
        error = f"the reply is JSON but not an object ({type(obj).__name__})"
    except json.JSONDecodeError as exc:
        error = f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        error = f"not valid JSON ({exc})"
    for match in _FENCE.finditer(text):
        try:
            obj = json.loads(match.group(2).strip())
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj, "fenced", None
    decoder = json.JSONDecoder()
    start = text.find("{")
    tries = 0
    while start >= 0 and tries < MAX_EMBEDDED_TRIES:
        tries += 1
        try:
            obj, _end = decoder.raw_decode(text, start)
        except ValueError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            return obj, "embedded", None
        start = text.find("{", start + 1)  # pragma: no cover - raw_decode at `{` yields a dict
    if not stripped:
        error = "empty reply"
    return None, None, error


_HOW = {"fenced": "extracted from a fenced code block", "embedded": "extracted from surrounding text"}


def parse_agent_reply(scenario: ir.Scenario, text: str) -> tuple[AgentOutput | None, bool, str | None]:
    """Parse one agent reply: (output or None, format_error, note). See the module docstring."""
    obj, how, error = extract_json_object(text)
    if obj is None:
        return None, True, error or "no JSON object found"
    problems = validate_agent_output(scenario, obj)
    note = _HOW.get(how or "")
    if problems:
        detail = "; ".join(problems[:8]) + (f"; ... ({len(problems)} problems)" if len(problems) > 8 else "")
        return None, True, (f"{note}: " if note else "") + f"schema violation: {detail}"
    try:
        output = AgentOutput.model_validate(obj)
    except ValidationError as exc:  # the schema check should have caught it; never crash on a reply
        return None, True, (f"{note}: " if note else "") + f"schema violation: {exc.errors()[0]['msg']}"
    return output, False, note


def split_stop(text: str) -> tuple[str, bool]:
    """(user text without the stop token, whether the user ended the dialogue)."""
    if STOP_TOKEN not in text:
        return text.strip(), False
    return text.replace(STOP_TOKEN, " ").strip(), True


def ending_actions(scenario: ir.Scenario) -> frozenset[str]:
    """Actions whose use ends a dialogue: `ends_dialogue` or `escalation`."""
    return frozenset(
        a.name for a in scenario.actions.values() if {"ends_dialogue", "escalation"} & set(a.attributes)
    )


# ---------------------------------------------------------------------------------------------
# Provider context


def scenario_context(scenario: ir.Scenario, *, max_paths: int = PATHS_IN_CONTEXT) -> dict[str, Any]:
    """The scenario facts handed to built-in providers (see `sopgraph.simulation.providers`)."""
    fields: dict[str, list[Any]] = {}
    for var in scenario.fields:
        if isinstance(var.type, ir.EnumType):
            fields[var.name] = list(var.type.values)
        elif isinstance(var.type, ir.BoolType):
            fields[var.name] = [True, False]
        else:
            fields[var.name] = []
    paths: list[dict[str, Any]] = []
    try:
        if max_paths > 0:
            for info in iter_paths(scenario, limit=max_paths, witnesses=False):
                path: dict[str, Any] = {"stages": list(info.stages), "finals": dict(info.finals)}
                if info.finals_varying:  # computed per case: see `case_path_finals`
                    path["fill"] = len(paths)
                    path["branches"] = list(info.branches)
                paths.append(path)
    except Exception:  # noqa: BLE001 - path enumeration is a convenience for baselines only
        paths = []
    return {
        "name": scenario.name,
        "fields": fields,
        "needs": stage_needs(scenario),
        "hidden": [v.name for v in scenario.system_vars if v.hidden],
        "escalation_actions": scenario.actions_with("escalation"),
        "ending_actions": scenario.actions_with("ends_dialogue"),
        "actions": list(scenario.actions),
        "traced": scenario.traced,  # replies may (and the oracle does) report the actions carried out
        "output_fillers": {name: output_filler(out) for name, out in scenario.outputs.items()},
        "paths": paths,
    }


def base_reads(scenario: ir.Scenario, names: Sequence[str]) -> list[str]:
    """The fields and system variables behind `names`, derived variables expanded to what they read
    (first-seen order): what a customer or a back office can actually be asked for."""
    out: dict[str, None] = {}
    todo, seen = list(names), set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        var = scenario.variables.get(name)
        if var is None:
            continue
        if var.role == "derived" and var.expr is not None:
            todo[:0] = reads(var.expr)
        else:
            out.setdefault(name, None)
    return list(out)


def stage_needs(scenario: ir.Scenario) -> dict[str, list[str]]:
    """Stage → the values its decision needs: the fields it classifies, then the fields and system
    variables its branches read. Why: the scripted user holds back facts the path's decisions need,
    floor agents ask for them before acting, and the guided baseline asks its model for exactly these."""
    return {sid: base_reads(scenario, [*st.classify, *stage_reads(st)]) for sid, st in scenario.stages.items()}


def acts(scenario: ir.Scenario, output: AgentOutput) -> bool:
    """Whether a reply carries its action out. A tool call always does. A SAGE reply's `finals.Action`
    is what the SOP leads to for what the agent knows so far; the agent has taken it once its
    `now_path` reaches it (the last stage passed has a branch doing it). A reply whose path stops
    short (an agent still asking for the values a decision needs) does not end the dialogue."""
    action = output.finals.get("Action")
    if action is None:
        return False
    if output.source != "sage":
        return True
    stage = scenario.stages.get(output.now_path[-1]) if output.now_path else None
    return stage is not None and any(
        b.target.kind == "action" and b.target.action == action for b in stage.branches)


def output_filler(out: ir.Output) -> Any:
    """A valid value of an output when nothing better is known: its default, else the first value
    of its type (so a floor agent's reply always fits the schema)."""
    if out.default is not None:
        return out.default.value
    t = out.type
    if isinstance(t, ir.EnumType):
        return t.values[0] if t.values else ""
    if isinstance(t, ir.BoolType):
        return False
    if isinstance(t, ir.NumType):
        lo = t.lo if t.lo is not None else (t.hi if t.hi is not None else 0)
        return int(lo) if t.kind == "int" else float(lo)
    if isinstance(t, ir.TimeType):
        return {"date": "1970-01-01", "datetime": "1970-01-01T00:00:00Z", "duration": "0 seconds"}[t.kind]
    return ""


def case_path_finals(scenario: ir.Scenario, info: Mapping[str, Any], case: Case) -> dict[str, dict[str, Any]]:
    """The finals the engine gives each path with computed outputs (e.g. `Fee = NightlyRate`) on
    this case's values, keyed by the path's `fill` number: a floor agent that chooses the path then
    fills its outputs as the engine would. Outputs that cannot be computed get `output_filler`."""
    values = {**case.truth, **case.user_facts, **case.system}
    out: dict[str, dict[str, Any]] = {}
    for path in info.get("paths") or ():
        if "fill" not in path:
            continue
        try:
            stage = scenario.stages[path["stages"][-1]]
            target = stage.branches[path["branches"][-1]].target
            out[str(path["fill"])] = leaf_finals(scenario, target, Interpreter(scenario, values).eval)
        except Exception:  # noqa: BLE001 - a value the case lacks: the filler below stands in
            target_finals = dict(path.get("finals") or {})
            out[str(path["fill"])] = {k: (v if v is not None else output_filler(scenario.outputs[k]))
                                      for k, v in target_finals.items() if k in scenario.outputs or k == "Action"}
    return out


def without_paths(info: Mapping[str, Any]) -> dict[str, Any]:
    """The context minus the path list (only agent baselines need it; it can be large)."""
    return {k: v for k, v in info.items() if k != "paths"}


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass
class DialogueSetup:
    """Everything fixed for one dialogue (built once by the runner)."""
    scenario: ir.Scenario
    case: Case
    dialogue_id: str
    trial: int
    agent_system: str
    user_system: str
    scenario_info: Mapping[str, Any]
    response_schema: Mapping[str, Any] | None = None
    sop_hash: str = ""
    tool_version: str = ""
    case_dump: dict[str, Any] = field(default_factory=dict)
    tool_agent: ToolAgent | None = None  # an agent acting through tools (simulation/agents.py)
    agent_context: dict[str, Any] = field(default_factory=dict)  # extra context keys for built-in agents
    # the guided baseline's prompt builders (prompts.guided_stage_prompt, prompts.guided_final_prompt),
    # handed in by the runner: this module does not import the prompts module (layers, pyproject.toml)
    guided_prompts: tuple[Callable[..., str], Callable[..., str]] | None = None
    env: EnvSpec | None = None  # the environment a tool-acting agent acts on (`--env`), else the case-scripted backend

    def __post_init__(self) -> None:
        if not self.case_dump:
            self.case_dump = self.case.model_dump(mode="json")


@dataclass
class SimResult:
    turns: list[Turn]
    end_reason: EndReason
    closing_user_text: str | None = None


@dataclass
class SimState:
    """Mutable progress, readable by the caller after a failure (usage already spent).

    `on_usage`: called with each model call's usage row as soon as the call returns (the runner writes it
    to the store at once, so that a crash loses no spent tokens); without it, rows wait in `pending_usage`
    and go with the turn (`on_turn`)."""
    turns: list[Turn] = field(default_factory=list)
    pending_usage: list[dict[str, Any]] = field(default_factory=list)
    on_usage: Callable[[dict[str, Any]], None] | None = None

    def spend(self, row: dict[str, Any]) -> None:
        """One model call's usage row: recorded now (`on_usage`) or kept for the turn."""
        if self.on_usage is not None:
            self.on_usage(row)
        else:
            self.pending_usage.append(row)


def usage_row(dialogue_id: str, turn_index: int, role: str, completion: Any,
              judgment_set: str | None = None) -> dict[str, Any]:
    """One usage-table row for a gateway Completion."""
    u = completion.usage
    return {
        "dialogue_id": dialogue_id, "turn_index": turn_index, "role": role, "model": completion.model,
        "judgment_set": judgment_set, "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens, "reasoning_tokens": u.reasoning_tokens,
        "cost": completion.cost, "cost_known": completion.cost_known, "calls": 1,
    }


def record_usage(completion: Any) -> Usage:
    u = completion.usage
    return Usage(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                 reasoning_tokens=u.reasoning_tokens, cost=completion.cost,
                 cost_known=completion.cost_known, calls=1)


OnTurn = Callable[[Turn, list[dict[str, Any]]], "Awaitable[None] | None"]


async def simulate_dialogue(
    gateway: Any,
    agent_spec: Any,
    user_spec: Any,
    setup: DialogueSetup,
    *,
    max_turns: int = 15,
    on_turn: OnTurn | None = None,
    state: SimState | None = None,
) -> SimResult:
    """Run one dialogue to its end. `on_turn(turn, usage_rows)` is called after each agent turn
    (the runner stores it in one transaction). `InfraFailure` from the gateway propagates."""
    state = state if state is not None else SimState()
    enders = ending_actions(setup.scenario)
    base_ctx = {"case": setup.case_dump, "dialogue_id": setup.dialogue_id, "trial": setup.trial}
    agent_info = setup.scenario_info
    path_finals = case_path_finals(setup.scenario, agent_info, setup.case)
    user_info = without_paths(agent_info)
    agent_msgs: list[dict[str, Any]] = [{"role": "system", "content": setup.agent_system}]
    user_msgs: list[dict[str, Any]] = [
        {"role": "system", "content": setup.user_system},
        {"role": "user", "content": OPENING_INSTRUCTION},
    ]
    inner = guided_inner(agent_spec.model) if setup.tool_agent is None else None
    if inner is not None and setup.guided_prompts is None:
        raise ValueError(f"{agent_spec.model}: the guided baseline needs DialogueSetup.guided_prompts")
    guided = GuidedState(known={**setup.case.system}) if inner is not None else None
    index = 1
    backend: Backend | None = None  # the simulated backend of a tool-acting agent (state per dialogue)
    while True:
        reply = await gateway.complete(user_spec, user_msgs, context={**base_ctx, "scenario": user_info, "role": "user", "turn": index})
        state.spend(usage_row(setup.dialogue_id, index, "user", reply))
        user_text, stop = split_stop(reply.text)
        if stop:
            return SimResult(state.turns, "user_stop", user_text)
        user_msgs.append({"role": "assistant", "content": user_text})
        agent_msgs.append({"role": "user", "content": user_text})
        agent_ctx: dict[str, Any] = {**base_ctx, **setup.agent_context, "scenario": agent_info, "role": "agent",
                                     "turn": index, "path_finals": path_finals}
        if setup.response_schema is not None:
            agent_ctx["response_schema"] = setup.response_schema
            agent_ctx["response_schema_name"] = "agent_output"
        if setup.tool_agent is not None:
            if backend is None:
                backend = backend_for(setup.tool_agent.backend, setup.case, setup.env)
            turn = await _tool_agent_turn(gateway, setup, backend, agent_msgs, index, user_text, state)
        elif guided is not None:
            agent_ctx.pop("response_schema", None)
            turn = await _guided_turn(gateway, agent_spec.model_copy(update={"model": inner}), setup, agent_msgs,
                                      index, user_text, guided, state, agent_ctx)
        else:
            started = time.perf_counter()
            answer = await gateway.complete(agent_spec, agent_msgs, context=agent_ctx)
            latency = answer.latency or (time.perf_counter() - started)
            state.spend(usage_row(setup.dialogue_id, index, "agent", answer))
            output, format_error, note = parse_agent_reply(setup.scenario, answer.text)
            turn = Turn(
                sop_hash=setup.sop_hash, dialogue_id=setup.dialogue_id, index=index, user_text=user_text,
                agent_raw=answer.text, output=output, format_error=format_error, format_note=note,
                latency_s=round(latency, 6), usage=record_usage(answer), tool_version=setup.tool_version,
            )
        output = turn.output
        rows, state.pending_usage = state.pending_usage, []
        if on_turn is not None:
            result = on_turn(turn, rows)
            if result is not None:
                await result
        state.turns.append(turn)
        shown = output.chat if output is not None else turn.agent_raw
        if setup.tool_agent is None:  # a tool-acting agent's messages are appended by its turn
            agent_msgs.append({"role": "assistant", "content": turn.agent_raw if guided is None else shown})
        user_msgs.append({"role": "user", "content": shown})
        if output is not None and str(output.finals.get("Action")) in enders and acts(setup.scenario, output) \
                and not (guided is not None and guided.asking):
            return SimResult(state.turns, "ending_action")
        if index >= max_turns:
            return SimResult(state.turns, "max_turns")
        index += 1


async def _tool_agent_turn(gateway: Any, setup: DialogueSetup, backend: Backend, agent_msgs: list[dict[str, Any]],
                           index: int, user_text: str, state: SimState) -> Turn:
    """One turn of an agent acting through tools (simulation/agents.py): its calls answered by the
    backend, the checked output. An unreachable or non-protocol agent is an infrastructure failure."""
    agent = setup.tool_agent
    assert agent is not None
    result = await tool_turn(agent, gateway, backend, agent_msgs, dialogue_id=setup.dialogue_id, turn=index,
                             system=setup.case.system, context={  # for a built-in tool-calling model only
                                 **setup.agent_context, "case": setup.case_dump, "role": "agent", "turn": index,
                                 "scenario": without_paths(setup.scenario_info)})
    usage = Usage()
    for completion in result.completions:
        state.spend(usage_row(setup.dialogue_id, index, "agent", completion))
        u = record_usage(completion)
        usage = Usage(prompt_tokens=usage.prompt_tokens + u.prompt_tokens,
                      completion_tokens=usage.completion_tokens + u.completion_tokens,
                      reasoning_tokens=usage.reasoning_tokens + u.reasoning_tokens, cost=usage.cost + u.cost,
                      cost_known=usage.cost_known and u.cost_known, calls=usage.calls + 1)
    return Turn(sop_hash=setup.sop_hash, dialogue_id=setup.dialogue_id, index=index, user_text=user_text,
                agent_raw=result.raw, output=result.output, format_error=result.output is None,
                format_note=None if result.problem is None else f"protocol violation: {result.problem}",
                latency_s=round(result.latency, 6), usage=usage, tool_version=setup.tool_version)


async def _guided_turn(gateway: Any, spec: Any, setup: DialogueSetup, convo: list[dict[str, Any]], index: int,
                       user_text: str, known: GuidedState, state: SimState, ctx: dict[str, Any]) -> Turn:
    """One turn of the graph-guided baseline (simulation/guided.py): walk the SOP on what is known, ask
    the wrapped model at the stage that waits for a value, keep the values it reads, walk on; at a
    leaf, first the walked stages' classification values still open (`open_classified`, each asked for
    once: a question the customer must answer does not act), then the engine's finals and the model's
    closing message. A reply with no JSON object is a format error (its text is what the customer sees)."""
    scenario = setup.scenario
    assert setup.guided_prompts is not None  # checked by simulate_dialogue
    stage_prompt, final_prompt = setup.guided_prompts
    needs_of = setup.scenario_info.get("needs") or stage_needs(scenario)
    askable = {v.name for v in scenario.fields} | {v.name for v in scenario.system_vars if v.hidden}
    history = convo[1:]  # the conversation, without the SAGE system prompt
    started = time.perf_counter()
    calls: list[Any] = []
    chat, raw_error, asking, leaf_read = "", None, False, False
    for _ in range(len(scenario.stages) + 2):
        w = walk(scenario, known.known)
        if w.stage is None or w.error is not None or (w.finals is not None and leaf_read):
            break
        at, wanted = open_classified(scenario, w, askable, known) if w.finals is not None else (
            w.stage, _guided_needs(scenario, w, needs_of, askable, known.known))
        if at is None:
            break  # a leaf with nothing left to read
        leaf_read = w.finals is not None
        prompt = stage_prompt(scenario, at, wanted, known.known, setup.case.system)
        answer = await gateway.complete(spec, [{"role": "system", "content": prompt}, *history], context={
            **ctx, "guided": {"stage": at, "needs": wanted, "missing": w.missing}})
        calls.append(answer)
        state.spend(usage_row(setup.dialogue_id, index, "agent", answer))
        values, chat = _read_guided(answer.text)
        if values is None:
            raw_error = answer.text
            break
        known.known.update(accept_values(scenario, values, askable))
        if w.finals is not None:
            fresh = [n for n in wanted if n not in known.known and n not in known.asked]
            if fresh:  # its chat asks the customer; each value is asked for once (the ones it names, else all)
                known.asked.update([n for n in fresh if names_value(chat, n)] or fresh)
                asking = True
                break
        elif w.missing is None or w.missing not in known.known:
            break  # the model could not tell: its chat asks the customer
    w = walk(scenario, known.known)
    if raw_error is None and w.finals is not None and not asking:
        answer = await gateway.complete(spec, [{"role": "system", "content": final_prompt(scenario, w.finals)},
                                               *history], context={**ctx, "guided": {"final": w.finals}})
        calls.append(answer)
        state.spend(usage_row(setup.dialogue_id, index, "agent", answer))
        _values, chat = _read_guided(answer.text)
    fields = {v.name: known.known[v.name] for v in scenario.fields if v.name in known.known}
    cot = f"guided: {' -> '.join(w.path)}" + (f" (waiting for {w.missing})" if w.missing else "") + (
        " (asking before acting)" if asking else "")
    finals = dict(w.finals) if w.finals is not None else {}
    known.asking = asking
    # the actions the walk carried out (its trace for the scores); the final one only once it is taken
    actions = w.actions[:-1] if w.finals is not None and asking else list(w.actions)
    output = None if raw_error is not None else AgentOutput(classification_output=fields, cot=cot,
                                                           now_path=w.path, finals=finals, chat=chat,
                                                           actions=actions)
    raw = raw_error if raw_error is not None else output_json(fields, w.path, finals, chat, cot, actions)
    usage = Usage(calls=len(calls), cost_known=all(c.cost_known for c in calls),
                  prompt_tokens=sum(c.usage.prompt_tokens for c in calls),
                  completion_tokens=sum(c.usage.completion_tokens for c in calls),
                  reasoning_tokens=sum(c.usage.reasoning_tokens for c in calls), cost=sum(c.cost for c in calls))
    return Turn(sop_hash=setup.sop_hash, dialogue_id=setup.dialogue_id, index=index, user_text=user_text,
                agent_raw=raw, output=output, format_error=output is None,
                format_note=None if raw_error is None else "guided reply without a JSON object",
                latency_s=round(time.perf_counter() - started, 6), usage=usage, tool_version=setup.tool_version)


def _guided_needs(scenario: ir.Scenario, w: Walk, needs_of: Mapping[str, Any], askable: set[str],
                  known: Mapping[str, Any]) -> list[str]:
    """What the model is asked for at the waiting stage: the value the decision waits for first, then the
    classification values of the stages walked that are still open. Why first: a model (or a floor agent)
    asks for the first open value, and an open value the customer may never give (an optional one they do
    not have) must not hold up the decision."""
    wanted: list[str] = [] if w.missing is None else [w.missing]
    for stage in w.path:
        for name in needs_of.get(stage) or ():
            if name in askable and name not in known and name not in wanted:
                wanted.append(name)
    return wanted


def _read_guided(text: str) -> tuple[dict[str, Any] | None, str]:
    """(the `values` object, the chat) of a guided reply; (None, text) when it holds no JSON object.
    A reply in the SAGE format is read too: its `classification_output` stands in for `values`."""
    obj, _how, _error = extract_json_object(text)
    if obj is None:
        return None, text.strip()
    values = obj.get("values", obj.get("classification_output", {}))
    chat = obj.get("chat")
    return (dict(values) if isinstance(values, Mapping) else {}), (chat if isinstance(chat, str) else "")


def transcript(turns: Sequence[Turn]) -> list[dict[str, str]]:
    """The dialogue as the user saw it: [{"user": ..., "agent": chat-or-raw}, ...]."""
    return [{"user": t.user_text, "agent": t.output.chat if t.output is not None else t.agent_raw}
            for t in turns]
