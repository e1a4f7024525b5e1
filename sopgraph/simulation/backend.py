"""The simulated backend that answers an agent's tool calls from the case (docs/agents.md, "Backend").

Why: an agent acting through tools (a function-calling model, your HTTP service, a Python callable)
looks things up and carries out actions; the answers must come from the case so that the dialogue
stays consistent with the reference decision the engine makes for the same case.

- `lookup(name)` returns a system variable's value (hidden ones are not offered). An *observed*
  variable (docs/language.md §8) has one value per look: the first lookup takes the first look, and
  a lookup after an action has been carried out since the previous look takes the next one; a
  lookup with no action in between repeats the current value (asking twice is not a new look).
- An action returns `{"status": "done"}`. When the SOP looks at an observed variable right after
  the action (the action is the last step before a stage that `observe`s it), the result also
  reports that look: `{"status": "done", "observed": {"ServiceRestored": false}}`.
- Past the end of a variable's list of looks, the last value repeats.

An agent that follows the SOP therefore sees exactly the sequence of values the engine reads for
the case; the specification is per scenario (`BackendSpec`, built once per run) and the state
per dialogue (`Backend`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sopgraph.language import ir
from sopgraph.language.schema import type_schema, validate
from sopgraph.records import Case

LOOKUP = "lookup"


def action_params(scenario: ir.Scenario) -> dict[str, list[str]]:
    """Action → its parameters: the declared ones (`action Pay(amount: ...)`), then the outputs some
    branch ending in it assigns (`do Refund { Fee = Rate }`), in SOP order."""
    declared = {name: [p.name for p in a.params] for name, a in scenario.actions.items()}
    return with_assigned_outputs(scenario, declared)


def with_assigned_outputs(scenario: ir.Scenario, found: dict[str, list[str]]) -> dict[str, list[str]]:
    """`found` (action → names) extended, in SOP order, by the outputs some branch ending in that action
    assigns: one walk shared by the tool schemas and the finals trace scoring reads."""
    for stage in scenario.stages.values():
        for branch in stage.branches:
            t = branch.target
            if t.kind == "action" and t.action in found:
                for assign in t.outputs:
                    if assign.name not in found[t.action]:
                        found[t.action].append(assign.name)
    return found


def _always_assigned(scenario: ir.Scenario) -> dict[str, set[str]]:
    """Action → the outputs every final use of it assigns (required in its tool schema)."""
    seen: dict[str, set[str]] = {}
    for stage in scenario.stages.values():
        for branch in stage.branches:
            t = branch.target
            if t.kind == "action" and t.action is not None:
                names = {a.name for a in t.outputs}
                seen[t.action] = seen[t.action] & names if t.action in seen else names
    return seen


def action_tools(scenario: ir.Scenario) -> list[dict[str, Any]]:
    """The SOP's actions as OpenAI-style function tools, parameters typed from the declarations."""
    params = action_params(scenario)
    always = _always_assigned(scenario)
    tools = []
    for name, action in scenario.actions.items():
        declared = {p.name: p for p in action.params}
        props: dict[str, Any] = {}
        required = []
        for pname in params[name]:
            if pname in declared:
                props[pname] = {**type_schema(declared[pname].type), "description": pname}
                required.append(pname)
            else:
                out = scenario.outputs[pname]
                props[pname] = {**type_schema(out.type), "description": " ".join(out.description.split()) or pname}
                if pname in always.get(name, ()):
                    required.append(pname)
        tools.append({"type": "function", "function": {
            "name": name, "description": " ".join(action.description.split()) or name,
            "parameters": {"type": "object", "properties": props, "required": required,
                           "additionalProperties": False}}})
    return tools


def lookup_name(scenario: ir.Scenario) -> str:
    """`lookup`, unless the SOP has an action of that name (then `sop_lookup`)."""
    return LOOKUP if LOOKUP not in scenario.actions else "sop_lookup"


def lookup_tool(scenario: ir.Scenario) -> dict[str, Any] | None:
    """The one lookup tool over the visible system variables (None when there are none)."""
    names = [v.name for v in scenario.system_vars if not v.hidden]
    if not names:
        return None
    observed = set(scenario.observed)
    lines = [f"{v.name}: {' '.join(v.description.split()) or v.name}"
             + (" (may change after an action: look again)" if v.name in observed else "")
             for v in scenario.system_vars if not v.hidden]
    return {"type": "function", "function": {
        "name": lookup_name(scenario),
        "description": "Look up a value in the back office for this customer. " + "; ".join(lines),
        "parameters": {"type": "object", "properties": {"name": {"type": "string", "enum": names}},
                       "required": ["name"], "additionalProperties": False}}}


def reports_after(scenario: ir.Scenario) -> dict[str, tuple[str, ...]]:
    """Action → the observed variables the SOP looks at right after it (the stage its step leads to
    observes them): the backend reports those looks in the action's result."""
    out: dict[str, dict[str, None]] = {}
    for stage in scenario.stages.values():
        for branch in stage.branches:
            t = branch.target
            if t.kind != "stage" or not t.steps or t.stage not in scenario.stages:
                continue
            looks = scenario.stages[t.stage].observe
            if looks:
                bucket = out.setdefault(t.steps[-1].action, {})
                for name in looks:
                    bucket.setdefault(name, None)
    return {k: tuple(v) for k, v in out.items()}


def visible_system(scenario: ir.Scenario, system: Mapping[str, Any]) -> dict[str, Any]:
    """The system values an agent may be shown up front: not hidden, not observed (those change
    during the dialogue and come from the backend, one look at a time)."""
    observed = set(scenario.observed)
    return {v.name: system[v.name] for v in scenario.system_vars
            if not v.hidden and v.name not in observed and v.name in system}


@dataclass(frozen=True)
class BackendSpec:
    """Everything the backend needs from the SOP, derived once per scenario (not per turn)."""

    lookup: str
    visible: frozenset[str]
    observed: frozenset[str]
    reports: Mapping[str, tuple[str, ...]]
    params: Mapping[str, list[str]]
    schemas: Mapping[str, Mapping[str, Any]]  # tool name -> its parameters schema
    tools: list[dict[str, Any]]  # actions, then the lookup tool
    enders: frozenset[str]

    @classmethod
    def of(cls, scenario: ir.Scenario) -> BackendSpec:
        tools = action_tools(scenario)
        look = lookup_tool(scenario)
        if look is not None:
            tools.append(look)
        return cls(
            lookup=lookup_name(scenario),
            visible=frozenset(v.name for v in scenario.system_vars if not v.hidden),
            observed=frozenset(scenario.observed),
            reports=reports_after(scenario),
            params=action_params(scenario),
            schemas={t["function"]["name"]: t["function"]["parameters"] for t in tools},
            tools=tools,
            enders=frozenset(a.name for a in scenario.actions.values()
                             if {"ends_dialogue", "escalation"} & set(a.attributes)),
        )

    def check(self, name: str, args: Any) -> str | None:
        """Why a tool call is malformed (unknown tool, arguments outside its schema), else None."""
        schema = self.schemas.get(name)
        if schema is None:
            return f"tool call {name!r} is not an action of the SOP" + (
                f" nor {self.lookup}" if self.lookup in self.schemas else "")
        if not isinstance(args, Mapping):
            return f"tool call {name}: arguments must be a JSON object"
        problems = validate(schema, dict(args))
        if problems:
            return f"tool call {name}: " + "; ".join(problems[:4])
        return None


@dataclass
class Backend:
    """One dialogue's backend: the case's values and how many looks each observed variable has had."""

    spec: BackendSpec
    system: Mapping[str, Any]
    looks: dict[str, int] = field(default_factory=dict)  # observed variable -> index of the current look
    dirty: set[str] = field(default_factory=set)  # observed variables with an action since their last look
    actions: list[str] = field(default_factory=list)  # the actions carried out so far, in order
    expected_path: list[str] = field(default_factory=list)  # the case's reference path (for `infer_path`)

    @classmethod
    def for_case(cls, spec: BackendSpec, case: Case) -> Backend:
        return cls(spec, case.system, expected_path=list(case.expected_path or ()))

    def _look(self, name: str, new: bool) -> Any:
        """The value of a look at `name` (a new look advances the counter)."""
        if new:
            self.looks[name] = self.looks.get(name, -1) + 1
            self.dirty.discard(name)
        seq = self.system.get(name)
        if not isinstance(seq, list):
            return seq
        if not seq:
            return None
        return seq[min(max(self.looks.get(name, 0), 0), len(seq) - 1)]

    def call(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """The result of a well-formed tool call (`BackendSpec.check` passed)."""
        if name == self.spec.lookup:
            var = str(args.get("name"))
            if var in self.spec.observed:
                value = self._look(var, var not in self.looks or var in self.dirty)
            else:
                value = self.system.get(var)
            return {"name": var, "value": value}
        self.dirty.update(self.spec.observed)
        self.actions.append(name)
        result: dict[str, Any] = {"status": "done"}
        observed = {var: self._look(var, True) for var in self.spec.reports.get(name, ())}
        if observed:
            result["observed"] = observed
        if name in self.spec.enders:
            result["note"] = "this action ends the conversation"
        return result
