"""The graph-guided baseline `baseline/guided:MODEL`: any model, fed the SOP one stage at a time.

Why: JourneyBench (2026) found that an agent shown only the current state of a procedure, with the
engine moving the state on (a "dynamic prompt"), follows it better than one given the whole SOP — a
small model so guided beat a big one. This wrapper makes that design a baseline beside the plain model.

Per agent turn (`dialogue._guided_turn` drives it):
1. `walk` runs the SOP from its start on the values known so far (the case's visible system values
   plus what the model has read from the conversation) and stops at the first stage whose decision
   needs a value nobody knows yet, or at a leaf.
2. At a stage, the wrapped model sees only that stage (`prompts.guided_stage_prompt`: its text, its
   branches, the values it needs, the system values) and the conversation, and answers
   `{"values": {...}, "chat": ...}`. Values that fit their declaration are kept; the walk goes on.
   When the model cannot fill the missing value, its chat (a question) is the turn's reply.
3. At a leaf, values that the walked stages classify and nobody knows yet are asked for first, once
   each (`open_classified`: the model sees the stage that classifies them; what it cannot read from the
   conversation, its chat asks the customer for: the turn reports the decision but does not carry it
   out, `GuidedState.asking`). Then the engine's finals are
   the decision; the model writes the closing message (`prompts.guided_final_prompt`).
The turn's output is a normal SAGE output — classification (the field values known), `now_path`
(the stages walked), `finals` (the engine's, once a leaf is reached) — scored like any agent's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sopgraph.language import ir
from sopgraph.logic.engine import (
    DecideError,
    Interpreter,
    export_arg,
    leaf_finals,
    max_steps,
    validate_value,
)
from sopgraph.simulation.providers import guided_inner

__all__ = ["GuidedState", "Walk", "accept_values", "guided_inner", "open_classified", "output_json", "walk"]


@dataclass
class Walk:
    """Where the SOP stands on the known values: the stages walked (the waiting stage last), the actions
    carried out on the way (`do A(args) -> next`, with their arguments, as the engine's trace has them;
    at a leaf the final action last), and either the finals of the leaf reached or the stage waiting for
    `missing`."""
    path: list[str]
    stage: str | None = None
    missing: str | None = None
    finals: dict[str, Any] | None = None
    error: str | None = None
    actions: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class GuidedState:
    """What one dialogue's guided agent knows (values read so far) and which values it has asked the
    customer for at a leaf (`asked`: each at most once), kept across its turns."""
    known: dict[str, Any] = field(default_factory=dict)
    asked: set[str] = field(default_factory=set)
    asking: bool = False  # this turn asks before acting: its finals are the decision, not yet carried out


def open_classified(scenario: ir.Scenario, w: Walk, askable: set[str], state: GuidedState
                    ) -> tuple[str | None, list[str]]:
    """At a leaf: (the walked stage the model is shown, the values of the walked stages' `classify` lists
    nobody knows yet — those not asked for yet first). Why: those stages' work is to read those values
    (the reply reports them); an agent that acts as soon as the decision is known skips them, and every
    offline dialogue on a path with one decision value would last two turns. (None, []) when all are known."""
    fresh: list[tuple[str, str]] = []
    asked: list[tuple[str, str]] = []
    for sid in w.path:
        for name in scenario.stages[sid].classify:
            if name in askable and name not in state.known and all(name != n for _, n in fresh + asked):
                (asked if name in state.asked else fresh).append((sid, name))
    both = fresh + asked
    return (both[0][0], [n for _, n in both]) if both else (None, [])


def walk(scenario: ir.Scenario, known: Mapping[str, Any]) -> Walk:
    """Run the SOP on `known` until a decision needs an unknown value, or a leaf (bounded by the same
    step limit as the engine)."""
    it = Interpreter(scenario, known)
    path: list[str] = []
    actions: list[dict[str, Any]] = []
    fired: dict[tuple[str, int], int] = {}
    stage_id: str | None = scenario.start
    for _ in range(max_steps(scenario)):
        stage = scenario.stages.get(stage_id or "")
        if stage is None:
            return Walk(path, error=f"undefined stage `{stage_id}`", actions=actions)
        path.append(stage.id)
        it.stage = stage.id
        if stage.observe:
            it.observe(stage.observe)
        try:
            chosen = _choose(it, stage, fired)
            if chosen is None:
                return Walk(path, stage=stage.id, error=f"no branch of `{stage.id}` applies to these values",
                            actions=actions)
            steps = [a for c in chosen.target.steps
                     for a in (it.each_calls(c) if c.each is not None else [_call(it, c.action, c.args)])]
            if chosen.target.kind == "action":
                finals = leaf_finals(scenario, chosen.target, it.eval, stage.id)
                final = _call(it, chosen.target.action or "", chosen.target.args)
                return Walk(path, stage=stage.id, finals=finals, actions=[*actions, *steps, final])
        except DecideError as exc:
            if exc.variable is not None and exc.variable not in known:
                return Walk(path, stage=stage.id, missing=exc.variable, actions=actions)
            return Walk(path, stage=stage.id, error=exc.message, actions=actions)
        actions += steps
        stage_id = chosen.target.stage
    return Walk(path, error="the SOP loops", actions=actions)


def _call(it: Interpreter, name: str, args: list[ir.OutputAssign]) -> dict[str, Any]:
    """One action carried out, `{"name", "args"}`, its arguments evaluated now and reported as the
    engine's trace reports them (`Decision.actions`)."""
    action = it.s.actions.get(name)
    types = {p.name: p.type for p in action.params} if action is not None else {}
    return {"name": name, "args": {a.name: export_arg(types.get(a.name), it.eval(a.value)) for a in args}}


def _choose(it: Interpreter, stage: ir.Stage, fired: dict[tuple[str, int], int]) -> ir.Branch | None:
    for bi, branch in enumerate(stage.branches):
        if branch.limit is not None and fired.get((stage.id, bi), 0) >= branch.limit:
            continue
        if branch.guard is None or it.eval(branch.guard):
            if branch.limit is not None:
                fired[(stage.id, bi)] = fired.get((stage.id, bi), 0) + 1
            return branch
    return None


def accept_values(scenario: ir.Scenario, values: Mapping[str, Any], askable: set[str]) -> dict[str, Any]:
    """The values of a reply that the engine can use: declared fields or hidden system variables in
    `askable`, within their domain (a value outside it is dropped, as if unknown)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        var = scenario.variables.get(str(name))
        if var is None or var.name not in askable or value is None:
            continue
        try:
            out[var.name] = validate_value(var, value)
        except DecideError:
            continue
    return out


def output_json(classification: Mapping[str, Any], path: list[str], finals: Mapping[str, Any], chat: str,
                cot: str, actions: list[dict[str, Any]] | None = None) -> str:
    """The turn as the agent's raw reply (SAGE keys; `actions` when the procedure has carried any out),
    for transcripts and corpora."""
    out: dict[str, Any] = {"classification_output": dict(classification), "cot": cot, "now_path": path,
                           "finals": dict(finals), "chat": chat}
    if actions:
        out["actions"] = actions
    return json.dumps(out, ensure_ascii=False)
