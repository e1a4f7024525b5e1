"""Agents that act through tool calls: a function-calling model, your own agent over HTTP, or a
Python callable.

Why: teams evaluate *their* agent — their prompt, their tools, often a service — not sopgraph's
prompt with one JSON reply per turn (SAGE mode, `dialogue.simulate_dialogue` through the gateway).
Three more kinds plug in here, chosen by the `--model agent=...` string (docs/agents.md):

- `tools:PROVIDER/MODEL`: any litellm model that supports function calling, through the gateway
  (`Gateway.complete(..., tools=...)`), with a short SOP prompt and no JSON reply format;
- `http://HOST:PORT/PATH` (or https): an agent server speaking the JSON protocol `sopgraph.agent/1`;
- `python:MODULE:FUNCTION`: a function `f(request: dict) -> dict` (sync or async), same protocol.

All three are offered the same tools (`tool_schemas`: the SOP's actions with their typed
parameters, and a `lookup` of system values), and their calls are answered by the simulated
backend (`simulation/backend.py`) from the case, observation sequences included. They report no
classification and no path: the classification comes from the judges alone (scoring marks such
turns `source="tools"`), and the path is inferred from the tool-call trace (`infer_path`: the
feasible path of the SOP whose actions the agent carried out, the case's reference path when several do). A tool call whose name is not
a tool, or whose arguments do not fit its schema, is a format error, like an unreadable SAGE reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.logic.paths import iter_paths
from sopgraph.records import AgentOutput
from sopgraph.simulation import providers
from sopgraph.simulation.backend import Backend, BackendSpec, visible_system, with_assigned_outputs
from sopgraph.simulation.gateway import DEFAULT_MAX_ANSWER_BYTES, InfraFailure, ModelSpec, answer_size

if TYPE_CHECKING:
    import aiohttp  # imported where an HTTP agent is called: ~0.1 s of every command's start-up

PROTOCOL = "sopgraph.agent/1"
AGENT_KINDS = ("sage", "tools", "http", "python", "guided")
TOOLS_PREFIX = "tools:"
MAX_TOOL_ROUNDS = 8  # agent answers within one turn (tool calls, results, ask again)
DEFAULT_TIMEOUT = 60.0  # seconds an HTTP or Python agent has for one answer (per model: timeout=)
_JSON_HEADERS = {"Content-Type": "application/json"}


class AgentError(Error):
    """The agent could not be reached or answered outside the protocol (an infrastructure failure)."""


def agent_kind(model: str) -> str:
    """`http` for an agent URL, `python` for `python:module:function`, `tools` for `tools:MODEL` (a
    litellm model acting through function calls), `guided` for the graph-guided baseline
    `baseline/guided:MODEL` (simulation/guided.py), else `sage` (a litellm model, JSON replies)."""
    if providers.guided_inner(model) is not None:
        return "guided"
    if model.startswith(("http://", "https://")):
        return "http"
    if model.startswith("python:"):
        return "python"
    if model.startswith(TOOLS_PREFIX) or model in providers.TOOL_MODELS:
        return "tools"
    return "sage"


def action_outputs(scenario: ir.Scenario) -> dict[str, list[str]]:
    """Action → the outputs some branch doing it assigns, in SOP order (what a SAGE agent's finals
    carry as the final action's arguments; trace scoring compares those)."""
    return with_assigned_outputs(scenario, {a: [] for a in scenario.actions})


def tool_schemas(scenario: ir.Scenario) -> list[dict[str, Any]]:
    """The tools an agent is offered: the SOP's actions as OpenAI-style function tools (declared
    parameters typed, and the outputs their branches assign, e.g. `do PartialRefund { Fee = NightlyRate }`
    gives PartialRefund a `Fee`), then the backend's `lookup` tool. One source: `BackendSpec`."""
    return BackendSpec.of(scenario).tools


def infer_path(paths: Sequence[Mapping[str, Any]], action: str | None,
               trace: Sequence[str] | None = None, preferred: Sequence[str] | None = None) -> list[str]:
    """The agent's path from its tool-call trace: the stages of the feasible path whose action trace
    (`actions`, for procedures) is the dialogue's actions so far, else of a feasible path ending in the
    last action called (empty when it called none, or no path ends there). Among several such paths,
    `preferred` (the case's reference path) when it is one of them, else the first. Why: the agent
    acted on the case's facts, and on those facts only the reference path carries out these actions;
    an action reached from several stages (a hand-over) would otherwise always read as the first."""
    if action is None:
        return []
    want = list(preferred or ())
    if trace:
        wanted = list(trace)
        found = [list(map(str, p.get("stages") or ())) for p in paths if p.get("actions") == wanted]
        if found:
            return want if want in found else found[0]
    found = [list(map(str, p.get("stages") or ())) for p in paths
             if str((p.get("finals") or {}).get("Action")) == action]
    if found:
        return want if want in found else found[0]
    return []


def path_table(scenario: ir.Scenario, limit: int = 2000) -> list[dict[str, Any]]:
    """The feasible paths with their stages, finals and action traces, for `infer_path` (once per run)."""
    try:
        # `actions` entries read `Name(param = expr)`: the names are what a trace is matched on
        return [{"stages": list(p.stages), "finals": dict(p.finals), "actions": [a.split("(")[0] for a in p.actions]}
                for p in iter_paths(scenario, limit=limit, witnesses=False)]
    except Exception:  # noqa: BLE001 - path inference is best effort: no table, no inferred path
        return []


def where_raised(exc: BaseException) -> str:
    """` (at FILE:LINE in FUNCTION)`: the innermost frame of the traceback, so that a Python agent's
    failure, stored as one line in the run, says where it happened."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"


def decode_call(call: Any) -> tuple[str, Any, str | None]:
    """(name, arguments, problem) of one tool call as an agent sent it: `{"name", "arguments"}`
    (the protocol) or `{"function": {...}}` (OpenAI); arguments may be an object or JSON text."""
    if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
        call = call["function"]
    if not isinstance(call, Mapping) or not isinstance(call.get("name"), str) or not call.get("name"):
        return "", None, "a tool call must be an object with a string `name`"
    name, args = call["name"], call.get("arguments")
    if args is None or args == "":
        args = {}
    if isinstance(args, str):  # OpenAI sends the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return name, None, f"tool call {name}: arguments are not JSON"
    return name, args, None


def to_output(scenario: ir.Scenario, paths: Sequence[Mapping[str, Any]], reply: Any,
              spec: BackendSpec | None = None) -> tuple[AgentOutput | None, str | None]:
    """Check a one-shot protocol response and turn it into the turn's AgentOutput (None + why on a
    format error). The dialogue loop uses `tool_turn`, which also runs the calls on the backend."""
    exchange, problem = exchange_from_reply(reply, 0.0)
    if exchange is None:
        return None, problem
    spec = spec or BackendSpec.of(scenario)
    trace = []
    for call in exchange.calls:
        name, args, problem = decode_call(call)
        problem = problem or spec.check(name, args)
        if problem is not None:
            return None, problem
        if name != spec.lookup:
            trace.append({"name": name, "args": dict(args)})
    return output_for(paths, exchange.text, trace), None


def final_actions(scenario: ir.Scenario) -> frozenset[str]:
    """The actions the procedure can end on (some branch's final `do X`); the others are only steps."""
    return frozenset(b.target.action for s in scenario.stages.values() for b in s.branches
                     if b.target.kind == "action" and b.target.action is not None)


def output_for(paths: Sequence[Mapping[str, Any]], text: str, trace: list[dict[str, Any]],
               so_far: Sequence[str] | None = None, preferred: Sequence[str] | None = None,
               finals_of: Collection[str] | None = None) -> AgentOutput:
    """The turn's AgentOutput: finals from the last action called that the procedure can end on
    (`finals_of`; every action when not given: a step such as `AskRestart` is not an answer, so a turn of
    steps only decides nothing yet), the path inferred from it and from the dialogue's action trace so
    far (`so_far`, this turn's actions included; `preferred`: the case's reference path, see `infer_path`)."""
    answer = next((c for c in reversed(trace) if finals_of is None or c["name"] in finals_of), None)
    finals = {"Action": answer["name"], **answer["args"]} if answer is not None else {}
    now_path = infer_path(paths, finals.get("Action"), so_far, preferred)
    return AgentOutput(classification_output={}, cot="", now_path=now_path,
                       finals=finals, chat=text, source="tools", tool_calls=trace)


def request_for(scenario: ir.Scenario, tools: list[dict[str, Any]], dialogue_id: str, turn: int,
                messages: Sequence[Mapping[str, Any]], system: Mapping[str, Any]) -> dict[str, Any]:
    """One protocol request (docs/agents.md): the conversation in OpenAI chat format (no system
    message), the tools, and the system values the agent may see up front."""
    return {
        "protocol": PROTOCOL,
        "dialogue_id": dialogue_id,
        "turn": turn,
        "messages": [m for m in messages if m["role"] != "system"],
        "tools": tools,
        "context": {"scenario": scenario.name, "system": visible_system(scenario, system)},
    }


@dataclass
class Exchange:
    """One answer of the agent within a turn: text, tool calls as sent, whether to ask again."""

    text: str
    calls: list[Any]
    more: bool  # run the calls, then ask the agent again within this turn
    latency: float
    completion: Any = None  # the gateway's Completion (tool-calling models): usage and cost


def exchange_from_reply(reply: Any, latency: float) -> tuple[Exchange | None, str | None]:
    """An HTTP or Python agent's response as an Exchange (None + why when it is outside the protocol)."""
    if not isinstance(reply, Mapping):
        return None, f"the response is {type(reply).__name__}, not a JSON object"
    text = reply.get("reply", "")
    calls = reply.get("tool_calls") or []
    if not isinstance(text, str) or not isinstance(calls, list):
        return None, "`reply` must be a string and `tool_calls` a list"
    return Exchange(text, calls, bool(reply.get("continue")) and bool(calls), latency), None


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
    """The agent of a run when it acts through tools (kinds `tools`, `http`, `python`); shared by every
    dialogue of the run, so the tools, the backend specification and the HTTP connection pool are
    built once, not per turn."""

    def __init__(self, model: str, scenario: ir.Scenario, *, timeout: float = DEFAULT_TIMEOUT,
                 model_spec: ModelSpec | None = None, paths: Sequence[Mapping[str, Any]] = ()):
        self.model, self.kind, self.scenario = model, agent_kind(model), scenario
        self.backend = BackendSpec.of(scenario)
        self.tools = self.backend.tools
        self.paths = paths or path_table(scenario)
        self.final_actions = final_actions(scenario)
        params = model_spec.params if model_spec is not None else None
        self.timeout = float(params.timeout) if params is not None and params.timeout else timeout
        self.max_answer_bytes = (params.max_answer_bytes if params is not None and params.max_answer_bytes
                                 else DEFAULT_MAX_ANSWER_BYTES)
        self._threads = _AgentThreads(8)
        self._fn = load_callable(model) if self.kind == "python" else None
        self.model_spec: ModelSpec | None = None
        if self.kind == "tools":
            inner = model.removeprefix(TOOLS_PREFIX)
            if not inner or (providers.is_builtin(inner) and inner not in providers.TOOL_MODELS):
                raise AgentError(f"{model}: `tools:` needs a litellm model that supports function calling "
                                 f"(e.g. tools:openai/gpt-4o-mini), not {inner or 'nothing'!r}")
            base = model_spec or ModelSpec(role="agent", model=inner)
            self.model_spec = base.model_copy(update={"model": inner, "structured": False})
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None

    def limit(self, concurrency: int) -> None:
        """At most `concurrency` requests in flight (the run's `--concurrency`, as for models), and as many
        threads for a synchronous Python agent."""
        self._slots = asyncio.Semaphore(max(1, concurrency))
        self._threads = _AgentThreads(max(1, concurrency))

    async def ask(self, gateway: Any, messages: Sequence[Mapping[str, Any]], *, dialogue_id: str, turn: int,
                  system: Mapping[str, Any], context: Mapping[str, Any] | None = None
                  ) -> tuple[Exchange | None, str | None]:
        """One answer of the agent: (exchange, None), or (None, why) when it is outside the protocol.
        `AgentError` when the agent cannot be had (the gateway's `InfraFailure` for models). `context`:
        the dialogue's facts for a built-in tool-calling model (never sent to a real provider)."""
        if self.model_spec is not None:
            ctx = {**(context or {}), "tools": self.tools} if self.model_spec.is_builtin else None
            completion = await gateway.complete(self.model_spec, messages, tools=self.tools, context=ctx)
            calls = [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in completion.tool_calls]
            return Exchange(completion.text, calls, bool(calls), completion.latency, completion), None
        request = request_for(self.scenario, self.tools, dialogue_id, turn, messages, system)
        reply, latency = await self.respond(request)
        return exchange_from_reply(reply, latency)

    async def respond(self, request: dict[str, Any]) -> tuple[Any, float]:
        """(the decoded response, seconds taken); AgentError if the agent cannot be had.
        A slot of the cap (`limit`) is held while the agent has the request: for an HTTP agent, from
        sending it to reading the answer (encoding and decoding JSON are not the agent's time).
        Redirects are not followed (a 3xx is an error naming the Location: following one re-sent the
        case's values to another host), and an answer over `max_answer_bytes` is not read further."""
        if self._fn is not None:
            async with self._slot():
                started = time.perf_counter()
                result = await self._call_python(self._fn, request)
                latency = time.perf_counter() - started
            size = _serialized_size(result, self.max_answer_bytes)
            if size > self.max_answer_bytes:
                raise AgentError(f"{self.model}: the answer is {size:,} bytes serialized, over the limit of "
                                 f"{self.max_answer_bytes:,} (max_answer_bytes=)")
            return result, latency
        import aiohttp  # here: only an HTTP agent needs it (start-up of every other command)

        session = self._http()
        data = json.dumps(request, ensure_ascii=False).encode()
        location: str | None = None
        body: bytes | None
        try:
            async with self._slot():
                started = time.perf_counter()
                async with session.post(self.model, data=data, headers=_JSON_HEADERS, allow_redirects=False) as r:
                    status = r.status
                    if 300 <= status < 400:
                        body, size = b"", 0
                        location = r.headers.get("Location", "")
                    else:
                        body, size = await _read_capped(r, self.max_answer_bytes)
                latency = time.perf_counter() - started
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AgentError(f"{self.model}: {type(exc).__name__}: {exc}") from None
        if location is not None:
            raise AgentError(f"{self.model} answered HTTP {status}, a redirect to {location[:200] or '(no Location)'}; "
                             "redirects are not followed (give the agent's final URL)")
        if body is None:
            raise AgentError(f"{self.model}: the answer is {size:,} bytes, over the limit of "
                             f"{self.max_answer_bytes:,} (max_answer_bytes=); not read further")
        text = body.decode("utf-8", "replace")
        if status != 200:
            raise AgentError(f"{self.model} answered HTTP {status}: {text[:200]}")
        try:
            return json.loads(text), latency
        except ValueError:
            return text, latency

    async def _call_python(self, fn: Callable[[dict[str, Any]], Any], request: dict[str, Any]) -> Any:
        """The Python agent's answer within `timeout` seconds: an `async` function on the loop, any other
        in a thread of `_AgentThreads` (a synchronous agent would otherwise hold the loop, and with it
        every other dialogue). Whatever it raises — `SystemExit` and `KeyboardInterrupt` included — is an
        AgentError for this dialogue; a real Ctrl-C (see `_real_interrupt`) still stops the run."""
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                if inspect.iscoroutinefunction(fn):
                    result = await fn(request)
                else:
                    ok, result = await self._threads.run(fn, request)
                    if not ok:
                        raise self._raised(result)
                if inspect.isawaitable(result):
                    result = await result
        except AgentError:
            raise
        except TimeoutError as exc:
            if deadline.expired():
                raise AgentError(f"{self.model} did not answer within {self.timeout:g} s (timeout=); "
                                 "a synchronous agent's thread is left to finish on its own") from None
            raise self._raised(exc) from None
        except (KeyboardInterrupt, SystemExit) as exc:
            if _real_interrupt(exc):
                raise
            raise self._raised(exc) from None
        except Exception as exc:  # noqa: BLE001 - the user's agent failing is an infra failure
            raise self._raised(exc) from None
        return result

    def _raised(self, exc: BaseException) -> AgentError:
        text = str(exc)
        return AgentError(f"{self.model} raised {type(exc).__name__}{': ' + text if text else ''}{where_raised(exc)}")

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._slots if self._slots is not None else contextlib.nullcontext()

    def _http(self) -> aiohttp.ClientSession:
        """This loop's keep-alive pool (one per run and loop; no connection limit: `limit` is the cap).
        aiohttp, not httpx: httpx's pool assigns requests to connections in O(in flight × connections),
        which at 64 requests in flight cost more CPU than the rest of the harness."""
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._session_loop is not loop:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=self.timeout),
                # no per-request proxy and ~/.netrc lookups unless a proxy is configured
                trust_env=bool(urllib.request.getproxies()))
            self._session_loop = loop
        return self._session

    async def aclose(self) -> None:
        session, self._session, self._session_loop = self._session, None, None
        if session is not None and not session.closed:
            await session.close()


class _AgentThreads:
    """Daemon threads for a synchronous Python agent, at most `size` alive at once (per event loop).

    Why daemon threads and not a ThreadPoolExecutor: a thread cannot be killed, so an agent that never
    returns keeps its thread; the executor's threads are joined at interpreter exit, which would hang
    `sop run` after its summary. A thread abandoned by a timeout still counts against `size` until it
    ends, so a stuck agent cannot make the run start threads without bound (later calls wait for a
    free thread, within their own timeout)."""

    def __init__(self, size: int):
        self.size = size
        self._free: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, fn: Callable[[dict[str, Any]], Any], arg: dict[str, Any]) -> tuple[bool, Any]:
        """(True, the result) or (False, the exception `fn` raised, BaseExceptions included)."""
        loop = asyncio.get_running_loop()
        if self._free is None or self._loop is not loop:
            self._free, self._loop = asyncio.Semaphore(self.size), loop
        free = self._free
        await free.acquire()
        answer: asyncio.Future[tuple[bool, Any]] = loop.create_future()

        def deliver(outcome: tuple[bool, Any]) -> None:
            free.release()
            if not answer.done():
                answer.set_result(outcome)

        def work() -> None:
            try:
                outcome: tuple[bool, Any] = (True, fn(arg))
            except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the agent's too
                outcome = (False, exc)
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
                loop.call_soon_threadsafe(deliver, outcome)

        try:
            threading.Thread(target=work, name="sop-python-agent", daemon=True).start()
        except BaseException:
            free.release()
            raise
        return await answer


def _real_interrupt(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt met while awaiting an `async` agent is the user's Ctrl-C rather than
    the agent's own: asyncio's SIGINT handler raised it (its frame is innermost), or a first Ctrl-C is
    already cancelling the run. Agents in threads never see the user's Ctrl-C (signals go to the main thread)."""
    if not isinstance(exc, KeyboardInterrupt):
        return False
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].name == "_on_sigint"


def _serialized_size(result: Any, cap: int) -> int:
    """UTF-8 bytes of a Python agent's answer as JSON (0 when it is not JSON: the protocol check says why)."""
    try:
        text = json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return 0
    return answer_size(text, cap)


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> tuple[bytes | None, int]:
    """(the body, its size), or (None, the size known so far) when it is over `cap` bytes: a declared
    Content-Length over it is not read at all, a body without one is read in pieces up to just past it."""
    declared = response.content_length
    if declared is not None:
        if declared > cap:
            return None, declared
        body = await response.read()
        return body, len(body)
    parts = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        parts += chunk
        if len(parts) > cap:
            return None, len(parts)
    return bytes(parts), len(parts)


@dataclass
class TurnResult:
    """One agent turn of a tool-acting agent: what is stored on the `Turn`."""

    output: AgentOutput | None
    problem: str | None  # why the turn is a format error
    raw: str  # the turn's exchanges as JSON: replies, tool calls, backend results
    latency: float
    completions: list[Any]  # gateway Completions (tool-calling models), for usage rows


async def tool_turn(agent: ToolAgent, gateway: Any, backend: Backend, messages: list[dict[str, Any]], *,
                    dialogue_id: str, turn: int, system: Mapping[str, Any],
                    context: Mapping[str, Any] | None = None) -> TurnResult:
    """One agent turn: ask, run the tool calls on the backend, and ask again while the agent wants
    to (a model always does after calling tools; an HTTP/Python agent when it sets `continue`), at
    most `MAX_TOOL_ROUNDS` times. The calls and results are appended to `messages` (OpenAI format),
    so the agent sees them in its next request. A malformed call makes the turn a format error."""
    texts: list[str] = []
    trace: list[dict[str, Any]] = []
    rounds: list[dict[str, Any]] = []
    completions: list[Any] = []
    latency = 0.0
    problem: str | None = None
    for round_no in range(MAX_TOOL_ROUNDS):
        try:
            exchange, problem = await agent.ask(gateway, messages, dialogue_id=dialogue_id, turn=turn,
                                                system=system, context=context)
        except AgentError as exc:
            raise InfraFailure(kind="agent", message=str(exc), role="agent", model=agent.model) from None
        if exchange is None:
            rounds.append({"error": problem})
            break
        latency += exchange.latency
        if exchange.completion is not None:
            completions.append(exchange.completion)
        if exchange.text:
            texts.append(exchange.text)
        ended, problem = _run_calls(agent, backend, exchange, messages, trace, rounds, f"call_{turn}_{round_no}")
        if problem is not None or ended or not exchange.more:
            break
    raw = json.dumps(rounds, ensure_ascii=False, sort_keys=True, default=str)
    output = None if problem is not None else output_for(agent.paths, "\n\n".join(texts), trace, backend.actions,
                                                         backend.expected_path, agent.final_actions)
    return TurnResult(output, problem, raw, latency, completions)


def _run_calls(agent: ToolAgent, backend: Backend, exchange: Exchange, messages: list[dict[str, Any]],
               trace: list[dict[str, Any]], rounds: list[dict[str, Any]], id_prefix: str) -> tuple[bool, str | None]:
    """Append the agent's answer and the backend's results to `messages`: (an ending action was
    carried out, the first malformed call's problem). Every call gets a result message (an error
    for malformed ones) so the conversation stays well-formed for the next request. The calls of one
    answer are carried out together, those after an ending action too (a procedure may hand over right
    after a step that ends the dialogue: `do IssueCredit -> do Supervisor`); the dialogue ends after them."""
    spec = backend.spec
    shown: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    ended, problem = False, None
    for i, call in enumerate(exchange.calls):
        name, args, bad = decode_call(call)
        bad = bad or spec.check(name, args)
        raw_args = call.get("arguments") if isinstance(call, Mapping) else None
        call_id = str(call.get("id") or f"{id_prefix}_{i}") if isinstance(call, Mapping) else f"{id_prefix}_{i}"
        shown.append({"id": call_id, "type": "function", "function": {
            "name": name, "arguments": raw_args if isinstance(raw_args, str) else json.dumps(args or {})}})
        if bad is not None or problem is not None:
            problem = problem or bad
            result: dict[str, Any] = {"error": bad or "not carried out"}
        else:
            result = backend.call(name, args)
            if name != spec.lookup:
                trace.append({"name": name, "args": dict(args)})
                ended = ended or name in spec.enders
        results.append({"role": "tool", "tool_call_id": call_id, "name": name,
                        "content": json.dumps(result, ensure_ascii=False, sort_keys=True)})
    msg: dict[str, Any] = {"role": "assistant", "content": exchange.text}
    if shown:
        msg["tool_calls"] = shown
    messages.append(msg)
    messages.extend(results)
    rounds.append({"reply": exchange.text, "tool_calls": [{"name": c["function"]["name"],
                   "arguments": c["function"]["arguments"]} for c in shown],
                   "results": [json.loads(r["content"]) for r in results]})
    return ended, problem
