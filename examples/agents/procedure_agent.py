"""An example tool agent that follows a procedure with the engine session (docs/tutorial-environment.md).

It speaks sopgraph's agent protocol (`sopgraph.agent/1`, docs/agents.md) and takes its steps from the
SOP itself: every request replays `sopgraph.start(scenario)` over the calls it made so far (their results
are in the conversation), then makes the next ones — a `lookup` for each value the procedure needs (asked
again within the turn with `"continue": true`), and each action the procedure takes. It reads the
caller's mood from their words (a keyword rule, no model), the one fact the SOP asks of the customer.

    --model agent=python:examples.agents.procedure_agent:respond          follows examples/no_service.sop
    --model agent=python:examples.agents.procedure_agent:forgets_restart  never asks for the restart

The second is the kind of agent the procedure-step scores are for: it does every fix but one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import sopgraph

SOP = Path(__file__).resolve().parents[1] / "no_service.sop"
_UPSET = re.compile(r"angry|furious|ridiculous|unacceptable|hurry|again|waste|annoy|fed up|!!", re.IGNORECASE)
_scenario: Any = None


def _load() -> Any:
    global _scenario
    if _scenario is None:
        _scenario = sopgraph.load(SOP)
    return _scenario


def _calls_so_far(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(tool name, result) of the agent's earlier calls, in order."""
    results = {m.get("tool_call_id"): json.loads(m["content"]) for m in messages if m["role"] == "tool"}
    return [(c["function"]["name"], results.get(c.get("id")))
            for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]


def _next(request: dict[str, Any], skip: str | None) -> dict[str, Any]:
    scenario = _load()
    said = " ".join(m["content"] for m in request["messages"] if m["role"] == "user")
    mood = "Upset" if _UPSET.search(said) else "Calm"
    session = sopgraph.start(scenario, {"Mood": mood})
    known, history = request["context"]["system"], _calls_so_far(request["messages"])
    done, calls = 0, []
    for event in session:
        if isinstance(event, sopgraph.Need):
            if event.variable in known and event.look is None:
                session.provide(event.variable, known[event.variable])
            elif done < len(history) and history[done][0] == "lookup":
                session.provide(event.variable, (history[done][1] or {}).get("value"))
                done += 1
            else:
                calls.append({"name": "lookup", "arguments": {"name": event.variable}})
                return {"reply": "", "tool_calls": calls, "continue": True}
        elif isinstance(event, sopgraph.Act):
            if event.action == skip:
                continue
            if done < len(history):
                done += 1  # carried out already
                continue
            calls.append({"name": event.action, "arguments": event.args})
            if event.final:
                break
    return {"reply": "I have taken care of it: " + ", ".join(c["name"] for c in calls if c["name"] != "lookup")
            if calls else "Thank you, that is all.", "tool_calls": calls}


def respond(request: dict[str, Any]) -> dict[str, Any]:
    """Follow examples/no_service.sop step by step."""
    return _next(request, None)


def forgets_restart(request: dict[str, Any]) -> dict[str, Any]:
    """The same, but it never asks the caller to restart the phone."""
    return _next(request, "AskRestart")
