"""Agents that act through tool calls: your own agent over HTTP, or a Python callable.

Why: teams evaluate *their* agent — their prompt, their tools, often a service — not sopgraph's
prompt with one JSON reply per turn (SAGE mode, `dialogue.simulate_dialogue` through the gateway).
Two more kinds plug in here, chosen by the `--model agent=...` string:

- `http://HOST:PORT/PATH` (or https): an agent server speaking the JSON protocol of docs/agents.md;
- `python:MODULE:FUNCTION`: a function `f(request: dict) -> dict` (sync or async) with the same
  request and response as the HTTP protocol.

Protocol `sopgraph.agent/1` (one request per agent turn): the request carries the conversation so
far, the SOP's actions as OpenAI-style tool schemas, and the case context the agent may see (the
system state, as a SAGE agent's prompt shows it); the response carries the reply text and the tool
calls made this turn. The agent reports no classification and no path: the classification then
comes from the judges alone (scoring marks such turns `source="tools"`), and the path is inferred
from the tool-call trace (`infer_path`: the first feasible path of the SOP that ends in the last
action called). A tool call whose name is not an action, or whose arguments do not fit the
action's outputs, is a format error, like an unreadable SAGE reply.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from sopgraph.language import ir
from sopgraph.language.schema import type_schema
from sopgraph.records import AgentOutput
from sopgraph.simulation.providers import guided_inner

PROTOCOL = "sopgraph.agent/1"
AGENT_KINDS = ("sage", "http", "python", "guided")


class AgentError(Exception):
    """The agent could not be reached or answered outside the protocol (an infrastructure failure)."""


def agent_kind(model: str) -> str:
    """`http` for an agent URL, `python` for `python:module:function`, `guided` for the graph-guided
    baseline `baseline/guided:MODEL` (simulation/guided.py), else `sage` (a litellm model)."""
    if guided_inner(model) is not None:
        return "guided"
    if model.startswith(("http://", "https://")):
        return "http"
    if model.startswith("python:"):
        return "python"
    return "sage"


def action_outputs(scenario: ir.Scenario) -> dict[str, list[str]]:
    """Action → the outputs some branch doing it assigns (the action's parameters), in SOP order."""
    found: dict[str, list[str]] = {a: [] for a in scenario.actions}
    for stage in scenario.stages.values():
        for branch in stage.branches:
            t = branch.target
            if t.kind == "action" and t.action in found:
                for assign in t.outputs:
                    if assign.name not in found[t.action]:
                        found[t.action].append(assign.name)
    return found


def tool_schemas(scenario: ir.Scenario) -> list[dict[str, Any]]:
    """The SOP's actions as OpenAI-style function tools; an action's parameters are the outputs its
    branches assign (e.g. `do PartialRefund { Fee = NightlyRate }` gives PartialRefund a `Fee`)."""
    params = action_outputs(scenario)
    tools = []
    for name, action in scenario.actions.items():
        props = {}
        for out in params[name]:
            o = scenario.outputs[out]
            props[out] = {**type_schema(o.type, nullable=False), "description": o.description or out}
        tools.append({"type": "function", "function": {
            "name": name, "description": action.description or name,
            "parameters": {"type": "object", "properties": props, "required": list(props),
                           "additionalProperties": False}}})
    return tools


def infer_path(paths: Sequence[Mapping[str, Any]], action: str | None) -> list[str]:
    """The agent's path from its tool-call trace: the stages of the first feasible path ending in the
    last action it called (empty when it called none, or no path ends there)."""
    if action is None:
        return []
    for path in paths:
        if str((path.get("finals") or {}).get("Action")) == action:
            return [str(s) for s in path.get("stages") or ()]
    return []


def to_output(scenario: ir.Scenario, paths: Sequence[Mapping[str, Any]], reply: Any
              ) -> tuple[AgentOutput | None, str | None]:
    """Check a protocol response and turn it into the turn's AgentOutput (None + why on a format error)."""
    if not isinstance(reply, Mapping):
        return None, f"the response is {type(reply).__name__}, not a JSON object"
    text = reply.get("reply", "")
    calls = reply.get("tool_calls") or []
    if not isinstance(text, str) or not isinstance(calls, list):
        return None, "`reply` must be a string and `tool_calls` a list"
    params = action_outputs(scenario)
    finals: dict[str, Any] = {}
    trace = []
    for call in calls:
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            return None, "a tool call must be an object with a string `name`"
        name, args = call["name"], call.get("arguments") or {}
        if isinstance(args, str):  # OpenAI sends the arguments as a JSON string
            try:
                args = json.loads(args)
            except ValueError:
                return None, f"tool call {name}: arguments are not JSON"
        if name not in scenario.actions:
            return None, f"tool call {name!r} is not an action of the SOP"
        if not isinstance(args, Mapping) or set(args) - set(params[name]):
            return None, f"tool call {name}: unknown arguments {sorted(set(args) - set(params[name]))}"
        trace.append({"name": name, "args": dict(args)})
        finals = {"Action": name, **dict(args)}
    action = finals.get("Action")
    return AgentOutput(classification_output={}, cot="", now_path=infer_path(paths, action), finals=finals,
                       chat=text, source="tools", tool_calls=trace), None


def request_for(scenario: ir.Scenario, tools: list[dict[str, Any]], dialogue_id: str, turn: int,
                messages: Sequence[Mapping[str, Any]], system: Mapping[str, Any]) -> dict[str, Any]:
    """One protocol request (docs/agents.md)."""
    return {
        "protocol": PROTOCOL,
        "dialogue_id": dialogue_id,
        "turn": turn,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"],
        "tools": tools,
        "context": {"scenario": scenario.name, "system": dict(system)},
    }


def load_callable(spec: str) -> Callable[[dict[str, Any]], Any]:
    """`python:package.module:function` → the function (an AgentError with one line if it is not there)."""
    _, _, target = spec.partition(":")
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise AgentError(f"expected python:MODULE:FUNCTION, got {spec!r}")
    try:
        module = _import(module_name)
        fn = getattr(module, attr)
    except (ImportError, AttributeError, OSError, SyntaxError) as exc:
        raise AgentError(f"cannot load {target}: {exc}") from None
    if not callable(fn):
        raise AgentError(f"{target} is not callable")
    return fn


def _import(module_name: str) -> ModuleType:
    """An importable module, else `a/b/c.py` (or `a/b/c/__init__.py`) under the working directory —
    loaded without touching `sys.path` (the `sop` script's path does not hold the working directory)."""
    try:
        return importlib.import_module(module_name)
    except ImportError:
        base = Path.cwd().joinpath(*module_name.split("."))
        for file in (base.with_suffix(".py"), base / "__init__.py"):
            if file.is_file():
                spec = importlib.util.spec_from_file_location(module_name, file)
                if spec is not None and spec.loader is not None:
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    return module
        raise


class ToolAgent:
    """Calls an HTTP or Python agent once per turn; shared by every dialogue of a run."""

    def __init__(self, model: str, scenario: ir.Scenario, *, timeout: float = 60.0):
        self.model, self.kind, self.scenario = model, agent_kind(model), scenario
        self.tools = tool_schemas(scenario)
        self.timeout = timeout
        self._fn = load_callable(model) if self.kind == "python" else None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    def limit(self, concurrency: int) -> None:
        """At most `concurrency` requests in flight (the run's `--concurrency`, as for models)."""
        self._slots = asyncio.Semaphore(max(1, concurrency))

    async def respond(self, request: dict[str, Any]) -> tuple[Any, float]:
        """(the decoded response, seconds taken); AgentError if the agent cannot be had."""
        if self._slots is None:
            return await self._respond(request)
        async with self._slots:
            return await self._respond(request)

    async def _respond(self, request: dict[str, Any]) -> tuple[Any, float]:
        started = time.perf_counter()
        if self._fn is not None:
            try:
                result = self._fn(request)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:  # noqa: BLE001 - the user's agent failing is an infra failure
                raise AgentError(f"{self.model} raised {type(exc).__name__}: {exc}") from None
            return result, time.perf_counter() - started
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=256))
        try:
            r = await self._client.post(self.model, json=request)
        except httpx.HTTPError as exc:
            raise AgentError(f"{self.model}: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            raise AgentError(f"{self.model} answered HTTP {r.status_code}: {r.text[:200]}")
        try:
            return r.json(), time.perf_counter() - started
        except ValueError:
            return r.text, time.perf_counter() - started

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

