"""The one door to language models: litellm behind retries, a cache, a concurrency cap and redaction.

Why one module: every model call of sopgraph (agent under test, user
simulator, judges, built-in baselines) goes through ``Gateway.complete`` so
that retry policy, infrastructure-failure reporting, caching, cost accounting
and secret hygiene are uniform.  This is the only module that imports
litellm, and it does so lazily (the import takes about two seconds) and
offline-safe (``LITELLM_LOCAL_MODEL_COST_MAP`` is set for the import only and
restored after it, so litellm never fetches its cost map and the process keeps its environment).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import difflib
import email.utils
import hashlib
import json
import logging
import os
import random
import re
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sopgraph.errors import ArgumentError, Error
from sopgraph.simulation import providers

__all__ = [
    "CONTEXT_METADATA_KEY",
    "DEFAULT_JUDGE_MODEL",
    "DEFAULT_USER_MODEL",
    "Completion",
    "Gateway",
    "GatewayStats",
    "InfraFailure",
    "InlinePreparationExecutor",
    "ModelOptionError",
    "ModelParams",
    "ModelSpec",
    "ResponseCache",
    "RoleSet",
    "Usage",
    "default_cache_dir",
    "load_litellm",
    "network_used",
    "parse_model_option",
    "redact",
    "roles_from_options",
]

DEFAULT_USER_MODEL: Final = "scripted/user"
DEFAULT_JUDGE_MODEL: Final = "scripted/truth"
JUDGE_ROLES: Final = ("judge1", "judge2", "judge3")
ROLE_NAMES: Final = ("agent", "user", "judge", *JUDGE_ROLES, "author")  # author: `sop draft`

DEFAULT_RETRIES: Final = 6
DEFAULT_BASE_DELAY: Final = 1.0
DEFAULT_MAX_DELAY: Final = 20.0
DEFAULT_MAX_ANSWER_BYTES: Final = 1 << 20
"""The largest answer a model or an agent may give (UTF-8 bytes; per model: ``max_answer_bytes=``). Why: a
100 MB answer was read, kept and stored twice (a 420 MB run store, 1.5 GB of memory, a run that never ended)."""
"""Retry policy: waits of 0.5-1, 1-2, 2-4, 4-8, 8-16 and 10-20 s, i.e. 25-51 s in all, so a call
rides out a local server restarting (tens of seconds). ``Gateway.retry_window()`` computes it."""

CONTEXT_METADATA_KEY: Final = "sopgraph_context"
"""Built-in providers receive the context as ``metadata[CONTEXT_METADATA_KEY]`` of the litellm call."""

_CACHE_VERSION: Final = 1
_log = logging.getLogger(__name__)

AIOHTTP_PROVIDERS: Final = frozenset({"aiohttp_openai"})
"""litellm providers that call through an aiohttp session: the gateway gives them one per event loop."""
_BUILTIN_CALL_OPTIONS: Final = {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0}
"""The zero per-call price of a built-in call that litellm logs (``Gateway(litellm_logging=True)``): documented
per-call options (litellm keeps the price on the call's logging object and never writes it to
``litellm.model_cost``) that let the logging payload take the call's own price entry instead of searching the
cost map for the model (about 3,040 → 2,750 Python function calls per call). A call litellm does not log
(the default, see ``_unlogged_mark``) goes without: the built-in's answer states its cost (0) already, and the
price only made litellm build the call's catalog entry (~7 % of a built-in call; docs/agents.md, "Speed").
Every built-in call names its provider (``custom_llm_provider``), which saves resolving it from the model."""


def _unpriced_call_options(model: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Per-call options of a model litellm could not price: its zero per-call price, and that price as the
    call's deployment entry (``litellm_metadata["model_info"]``, as litellm's router hands each deployment's
    prices to a call; never sent to the provider). Why: a call priced at zero makes litellm look for the
    model's pricing to explain the zero, through every cost-map entry and generalisation rule, unless the call
    brings its entry (about 7,900 → 6,800 Python function calls per call; benchmarks/bench_agents.py)."""
    metadata = dict(kwargs.get("litellm_metadata") or {})
    metadata.setdefault("model_info", {"id": model, "key": model, **_BUILTIN_CALL_OPTIONS})
    return {**_BUILTIN_CALL_OPTIONS, "litellm_metadata": metadata}


_INLINE_PREPARATION: ContextVar[object | None] = ContextVar("sopgraph_inline_preparation", default=None)
"""The task making a litellm call whose synchronous preparation is CPU only (see below), while it makes it.
A task, not a flag: tasks that litellm starts during the call inherit the variable, and must not inherit
inline execution (whatever they hand to the executor may block)."""


def _inline_here() -> bool:
    owner = _INLINE_PREPARATION.get()
    if owner is None:
        return False
    try:
        return owner is asyncio.current_task()
    except RuntimeError:  # no running loop in this thread: submitted from elsewhere
        return False


class InlinePreparationExecutor(concurrent.futures.ThreadPoolExecutor):
    """The default executor of an event loop sopgraph owns (a `--workers` process, the `sop run` command):
    runs the synchronous preparation of a gateway call inline when that is CPU only.

    Why: ``litellm.acompletion`` hands every call's synchronous part (``completion()``: building the
    request, or for a built-in provider making the coroutine that answers) to the loop's default
    executor. For built-in providers and aiohttp routes that part never blocks, and the thread hop only
    adds GIL hand-offs: with 64 dialogues in flight, each hop waits for a pool thread and then for the
    GIL, and a model call held its concurrency slot ~40 ms longer than the model took (benchmarks/
    bench_agents.py; docs/agents.md, "Speed"). Everything else (other litellm routes, whose preparation
    may refresh credentials over the network, and any other ``run_in_executor(None, ...)``) still runs
    on the pool's threads. Installed with ``loop.set_default_executor`` by the code that owns the loop;
    library calls never change a caller's loop."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if not _inline_here():
            return super().submit(fn, *args, **kwargs)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller, as a pool thread would
            future.set_exception(exc)
        else:
            future.set_result(result)
        return future


class _WireSlot:
    """The concurrency slot of one gateway call, held only while its HTTP request is at the provider.

    Why: the cap (``--concurrency``) is on requests a provider is serving. Held around the whole
    ``litellm.acompletion``, a slot also covered litellm's preparation of the request, its handling of
    the answer and the event-loop turns between them: with 64 calls in flight, ~30 ms a request beyond the
    provider's latency, so a 200 ms model was sent ~13 % fewer requests than the cap allows
    (benchmarks/bench_agents.py; docs/agents.md, "Speed"). The gateway's aiohttp session takes it when a
    request starts (an aiohttp ``TraceConfig`` hook) and gives it back when the answer's headers arrive or
    the request fails; the gateway gives it back in any case when the call ends. The call's guard
    timeout stands still while the call waits for a slot and starts again on the wire: waiting for a
    slot is not the call."""

    __slots__ = ("_sem", "_guard", "_seconds", "held", "used")

    def __init__(self, sem: asyncio.Semaphore, guard: asyncio.Timeout, seconds: float) -> None:
        self._sem, self._guard, self._seconds = sem, guard, seconds
        self.held = self.used = False

    async def take(self) -> None:
        if self.held:
            return
        waits = self._sem.locked() and not self._guard.expired()
        if waits:
            self._guard.reschedule(None)
        await self._sem.acquire()
        self.held = self.used = True
        if waits:
            self._guard.reschedule(asyncio.get_running_loop().time() + self._seconds)

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._sem.release()


_WIRE_SLOT: ContextVar[_WireSlot | None] = ContextVar("sopgraph_wire_slot", default=None)
"""The slot of the gateway call being made (see ``_WireSlot``); None outside one."""


async def _take_wire_slot(*_: Any) -> None:
    """aiohttp ``on_request_start`` hook of the gateway's session."""
    slot = _WIRE_SLOT.get()
    if slot is not None:
        await slot.take()


async def _give_back_wire_slot(*_: Any) -> None:
    """aiohttp ``on_request_end`` and ``on_request_exception`` hook of the gateway's session."""
    slot = _WIRE_SLOT.get()
    if slot is not None:
        slot.give_back()


_RAW_USAGE: ContextVar[dict[str, Any] | None] = ContextVar("sopgraph_raw_usage", default=None)
"""Where the gateway's aiohttp responses put the `usage` of a chat-completions body during a call."""
_RESPONSE_CLASS: Any = None


def _usage_keeping_response() -> Any:
    """An ``aiohttp.ClientResponse`` that keeps the body's ``usage`` for the gateway (``_RAW_USAGE``).

    Why: litellm's ``aiohttp_openai/`` route builds its answer from the body without ``usage``, so every
    call counted 0 tokens, and a model priced per call cost 0, whatever the server reported. Given to the
    gateway's session as its ``response_class`` (a documented aiohttp option); built once, on first use."""
    global _RESPONSE_CLASS
    if _RESPONSE_CLASS is None:
        import aiohttp

        class UsageKeepingResponse(aiohttp.ClientResponse):
            async def json(self, *args: Any, **kwargs: Any) -> Any:
                body = await super().json(*args, **kwargs)
                sink = _RAW_USAGE.get()
                if sink is not None and isinstance(body, dict) and isinstance(body.get("usage"), dict):
                    sink.update(body["usage"])
                return body

        _RESPONSE_CLASS = UsageKeepingResponse
    return _RESPONSE_CLASS


# =========================================================================== preflight
PREFLIGHT_PROMPT: Final = "sopgraph preflight: a one-call check that this model answers. Reply with OK."
"""The one message of a preflight call (test servers recognise it by its first two words)."""
_PREFLIGHT_SCHEMA: Final = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


async def preflight(gateway: Gateway, specs: Iterable[ModelSpec]) -> list[InfraFailure]:
    """One uncached call per distinct non-built-in model, concurrently; the failures that doom a run.

    Why: a missing key or an unknown provider would otherwise fail every dialogue of a run, after
    retries. A server that answers garbage (``malformed``) passes: it is reachable and the run's own
    checks will count its replies. A structured spec is checked with a small schema, so a server
    rejecting ``json_schema`` is found (and, in ``auto`` mode, switched to ``json_object``) here."""
    distinct: dict[str, ModelSpec] = {}
    for spec in specs:
        if not spec.is_builtin:
            key = spec.model_dump_json(exclude={"role"})
            distinct.setdefault(key, spec.model_copy(update={"cache": False}))

    async def one(spec: ModelSpec) -> InfraFailure | None:
        context = {"response_schema": _PREFLIGHT_SCHEMA, "response_schema_name": "preflight"}
        try:
            await gateway.complete(spec, [{"role": "user", "content": PREFLIGHT_PROMPT}], context=context)
        except InfraFailure as exc:
            return None if exc.kind == "malformed" else exc
        return None

    found = await asyncio.gather(*(one(s) for s in distinct.values()))
    return [f for f in found if f is not None]


def preflight_message(failure: InfraFailure) -> str:
    """One line saying what is wrong with a model and what to do about it."""
    who = f"{failure.role or 'model'} {failure.model}"
    first = " ".join(failure.message.split(": ", 2)[-1].split())
    if failure.kind == "auth":
        return (f"{who}: authentication failed ({_short(first, 160)}); put the key in the environment "
                "(e.g. OPENAI_API_KEY) or name its variable with api_key_env=VAR")
    if "LLM Provider NOT provided" in failure.message:
        provider = failure.model.split("/", 1)[0] if "/" in failure.model else failure.model
        return (f"{who}: unknown provider {provider!r}; write PROVIDER/MODEL with a litellm provider "
                "(openai/, anthropic/, ollama/, hosted_vllm/, aiohttp_openai/, ...) or a built-in "
                "(baseline/..., scripted/...)")
    if failure.kind in ("connection", "timeout"):
        head = " ".join(failure.message.split(": ", 2)[1].split()) if failure.message.count(": ") >= 2 else ""
        return f"{who}: {head or failure.kind}; is the server running and reachable? ({_short(first, 160)})"
    return f"{who}: {_short(' '.join(failure.message.split()), 300)}"


# =========================================================================== records
class ModelParams(BaseModel):
    """Sampling and transport parameters of one role's model."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = None
    max_tokens: int | None = None
    api_base: str | None = None
    timeout: float | None = Field(default=None, gt=0)
    max_answer_bytes: int | None = Field(default=None, gt=0)
    """The largest answer taken from this model or agent (default ``DEFAULT_MAX_ANSWER_BYTES``)."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Passed through to ``litellm.acompletion`` (e.g. ``top_p``, ``seed``, ``drop_params``)."""


class ModelSpec(BaseModel):
    """Which model plays a role, and how it is called."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str
    model: str
    """litellm model string (``openai/gpt-4o``, ``ollama/llama3``, ``hosted_vllm/...``) or a built-in."""
    params: ModelParams = Field(default_factory=ModelParams)
    structured: bool = False
    """Ask for JSON-schema structured output (schema from ``context['response_schema']``)."""
    structured_mode: Literal["auto", "json_schema", "json_object"] = "auto"
    """How ``structured`` is asked for: ``json_schema`` (the schema itself), ``json_object`` (any JSON
    object; for servers without schema support, e.g. llama.cpp's), or ``auto``: the schema, falling
    back once to ``json_object`` when the server rejects ``json_schema`` (400/422/500) but takes that."""
    cache: bool | None = None
    """``None``: cache when temperature == 0; ``True``/``False`` forces it on/off."""

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("model name is empty")
        problem = unknown_builtin_message(value)
        if problem:
            raise ValueError(problem)
        return value

    @property
    def provider(self) -> str:
        """The litellm provider prefix (``openai``, ``baseline``, ...), or '' if none."""
        return self.model.split("/", 1)[0] if "/" in self.model else ""

    @property
    def is_builtin(self) -> bool:
        """Whether an offline built-in provider answers (no network, context-driven)."""
        return providers.is_builtin(self.model)

    def with_role(self, role: str) -> ModelSpec:
        """A copy playing another role."""
        return self.model_copy(update={"role": role})


class Usage(BaseModel):
    """Token counts reported by the provider (zero when it reports none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0


class Completion(BaseModel):
    """One model answer, with its accounting."""

    text: str
    model: str
    role: str
    usage: Usage = Field(default_factory=Usage)
    cost: float = 0.0
    """USD spent by this call (0 for cache hits and built-ins)."""
    cost_known: bool = True
    """False when litellm's cost map does not price the model (cost is then 0)."""
    latency: float = 0.0
    """Seconds from the call to the answer, including retries and waiting for a slot."""
    cached: bool = False
    attempts: int = 0
    """Provider calls made (0 for a cache hit)."""
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    """Function calls of the answer (``complete(..., tools=...)``), in order: ``{"id", "name",
    "arguments"}`` with ``arguments`` the provider's raw JSON text (the caller decides what is malformed)."""


class GatewayStats(BaseModel):
    """Totals over a gateway's lifetime."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    cache_hits: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0
    unknown_cost_calls: int = 0


class InfraFailure(Error):
    """The model could not be reached or answered garbage: an infrastructure failure, never a model failure.

    Raised after retries are exhausted, or at once for non-retryable errors
    (authentication, bad request).  The message is redacted of secrets and no
    provider exception is chained (``__cause__`` is None) so that tracebacks
    cannot leak keys either.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        role: str = "",
        model: str = "",
        attempts: int = 0,
        status_code: int | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.role = role
        self.model = model
        self.attempts = attempts
        self.status_code = status_code
        self.retryable = retryable

    def __reduce__(self) -> tuple[Any, ...]:
        """Picklable (e.g. across a process pool) despite keyword-only fields."""
        fields = {
            "kind": self.kind,
            "role": self.role,
            "model": self.model,
            "attempts": self.attempts,
            "status_code": self.status_code,
            "retryable": self.retryable,
        }
        return (_rebuild_infra_failure, (self.message, fields))


def _rebuild_infra_failure(message: str, fields: dict[str, Any]) -> InfraFailure:
    return InfraFailure(message, **fields)


class ModelOptionError(Error, ValueError):
    """A ``--model`` option that cannot be understood."""


# =========================================================================== --model parsing
_FLOAT_KEYS: Final = frozenset({"temperature", "timeout"})
_INT_KEYS: Final = frozenset({"max_tokens", "max_answer_bytes"})
_BOOL_KEYS: Final = frozenset({"structured", "cache"})
_FORBIDDEN_KEYS: Final = frozenset({"api_key", "key", "token", "secret", "authorization"})


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _coerce(text: str) -> Any:
    """Best-effort typed value for an unknown ``key=value`` (bool, int, float, JSON, else str)."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        with contextlib.suppress(ValueError):
            return conv(text)
    if text[:1] in "[{":
        with contextlib.suppress(ValueError):
            return json.loads(text)
    return text


def parse_model_option(text: str) -> ModelSpec:
    """Parse ``ROLE=NAME[,key=value...]`` (the CLI's repeatable ``--model`` option).

    Known keys: ``temperature``, ``max_tokens``, ``api_base``, ``timeout``,
    ``structured``, ``cache``; anything else goes to ``params.extra`` with a
    guessed type.  ``api_key`` is refused: keys come from the environment
    (``api_key_env=VAR`` names the variable holding it).
    """
    pieces = [p.strip() for p in text.split(",")]
    head, rest = pieces[0], [p for p in pieces[1:] if p]
    role, sep, model = head.partition("=")
    role, model = role.strip().lower(), model.strip()
    if not sep or not role or not model:
        raise ModelOptionError(f"expected ROLE=MODEL[,key=value...], got {text!r}")
    if role not in ROLE_NAMES:
        raise ModelOptionError(f"unknown role {role!r} in {text!r}; roles: {', '.join(ROLE_NAMES)}")
    params: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    for piece in rest:
        key, sep, value = piece.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not key:
            raise ModelOptionError(f"expected key=value, got {piece!r} in {text!r}")
        if key in _FORBIDDEN_KEYS or key.endswith("api_key"):
            raise ModelOptionError(
                f"{key!r} is not accepted on the command line: put the key in an environment variable "
                "(e.g. OPENAI_API_KEY) or name it with api_key_env=VAR"
            )
        try:
            if key in _FLOAT_KEYS:
                params[key] = float(value)
            elif key in _INT_KEYS:
                params[key] = int(value)
            elif key == "api_base":
                params[key] = value
            elif key == "structured" and value.lower() in ("auto", "json_schema", "json_object"):
                flags["structured"], flags["structured_mode"] = True, value.lower()
            elif key in _BOOL_KEYS:
                flags[key] = _parse_bool(value)
            else:
                extra[key] = _coerce(value)
        except ValueError as exc:
            raise ModelOptionError(f"bad value for {key!r} in {text!r}: {exc}") from None
    if _has_userinfo(params.get("api_base")):
        raise ModelOptionError(f"--model {role}={model}: {_USERINFO_HINT}; got api_base="
                               f"{_sanitize_url(params['api_base'])} with credentials")
    problem = unknown_builtin_message(model)
    if problem:
        raise ModelOptionError(f"--model {text!r}: {problem}")
    try:
        return ModelSpec(role=role, model=model, params=ModelParams(**params, extra=extra), **flags)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise ModelOptionError(f"invalid --model {text!r}: {where + ': ' if where else ''}{msg}") from None


def unknown_builtin_message(model: str) -> str | None:
    """One line naming the closest built-in for a misspelled ``baseline/...`` or ``scripted/...``; None if fine.
    ``baseline/guided:MODEL`` is fine when MODEL is (any litellm model, or a built-in)."""
    if model.startswith(providers.GUIDED_PREFIX) or model == providers.GUIDED_PREFIX.rstrip(":"):
        inner = providers.guided_inner(model)
        if inner is None or inner.startswith(providers.GUIDED_PREFIX):
            return (f"{providers.GUIDED_PREFIX}MODEL wraps one model, e.g. {providers.GUIDED_PREFIX}openai/gpt-4o-mini "
                    f"or, offline, {providers.GUIDED_PREFIX}baseline/oracle")
        return unknown_builtin_message(inner)
    if not providers.is_builtin(model) or model in providers.BUILTIN_MODELS:
        return None
    known = sorted(providers.BUILTIN_MODELS)
    close = difflib.get_close_matches(model, known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown built-in model {model!r}; {hint}known: {', '.join(known)}"


class RoleSet(BaseModel):
    """The models for one evaluation run: agent, user simulator and three judges."""

    model_config = ConfigDict(frozen=True)

    agent: ModelSpec | None
    user: ModelSpec
    judges: tuple[ModelSpec, ModelSpec, ModelSpec]

    def by_role(self, role: str) -> ModelSpec:
        """The spec for ``agent``, ``user`` or ``judge1``..``judge3``."""
        if role == "agent":
            if self.agent is None:
                raise KeyError("no agent model configured")
            return self.agent
        if role == "user":
            return self.user
        if role in JUDGE_ROLES:
            return self.judges[JUDGE_ROLES.index(role)]
        raise KeyError(role)

    def all(self) -> list[ModelSpec]:
        """Every configured spec (agent first if set)."""
        head = [self.agent] if self.agent is not None else []
        return [*head, self.user, *self.judges]


def roles_from_options(options: Iterable[str | ModelSpec], *, require_agent: bool = True) -> RoleSet:
    """Resolve repeated ``--model`` options into a ``RoleSet`` with defaults.

    ``judge`` may be given up to three times (filling judge1..judge3 in order,
    after any explicit ``judgeN``); one judge is used for all three slots; two
    is ambiguous and refused.  Defaults: user ``scripted/user``, judges
    ``scripted/truth`` x3.
    """
    agent: ModelSpec | None = None
    user: ModelSpec | None = None
    slots: dict[str, ModelSpec] = {}
    generic: list[ModelSpec] = []
    for option in options:
        spec = option if isinstance(option, ModelSpec) else parse_model_option(option)
        if spec.role == "agent":
            if agent is not None:
                raise ModelOptionError("the agent model is given twice")
            agent = spec
        elif spec.role == "user":
            if user is not None:
                raise ModelOptionError("the user model is given twice")
            user = spec
        elif spec.role in JUDGE_ROLES:
            if spec.role in slots:
                raise ModelOptionError(f"{spec.role} is given twice")
            slots[spec.role] = spec
        elif spec.role == "judge":
            generic.append(spec)
        else:
            raise ModelOptionError(f"unknown role {spec.role!r}")
    given = len(slots) + len(generic)
    if given > 3:
        raise ModelOptionError(f"at most three judges, got {given}")
    if given == 2:
        raise ModelOptionError("give one judge (used for all three slots) or three judges, not two")
    if given == 0:
        judges = [ModelSpec(role=r, model=DEFAULT_JUDGE_MODEL) for r in JUDGE_ROLES]
    elif given == 1:
        only = next(iter(slots.values())) if slots else generic[0]
        judges = [only.with_role(r) for r in JUDGE_ROLES]
    else:
        free = iter(generic)
        judges = [slots[r] if r in slots else next(free).with_role(r) for r in JUDGE_ROLES]
    if agent is None and require_agent:
        raise ModelOptionError("no agent model: pass --model agent=PROVIDER/MODEL")
    return RoleSet(
        agent=agent,
        user=user or ModelSpec(role="user", model=DEFAULT_USER_MODEL),
        judges=(judges[0], judges[1], judges[2]),
    )


# =========================================================================== parameters that may be stored
SAFE_PARAMS: Final = frozenset(
    {
        # ModelParams fields (api_base is stored without userinfo, query or fragment)
        "temperature", "max_tokens", "api_base", "timeout", "max_answer_bytes",
        # sampling and decoding (OpenAI and the usual OpenAI-compatible servers)
        "top_p", "top_k", "min_p", "seed", "n", "stop", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "repeat_penalty", "logit_bias", "logprobs", "top_logprobs",
        "max_completion_tokens", "reasoning_effort", "response_format", "parallel_tool_calls",
        "num_ctx", "num_predict", "mirostat", "typical_p", "tfs_z", "cache_prompt",
        # litellm routing flags
        "drop_params", "api_version", "custom_llm_provider", "stream",
    }
)
"""Model parameters known to carry no secret. Why an allow-list: a deny-list of secret-looking names
misses ``passwd=`` or ``auth=``; anything not named here is redacted wherever parameters are stored
(run.sqlite, summaries), kept out of cache keys, and its value scrubbed from error messages.
``api_key_env`` is stored only when its value is an environment variable *name*."""

_SPEC_FIELDS: Final = frozenset({"role", "model", "params", "extra", "structured", "structured_mode", "cache"})
_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REDACTED_PARAM: Final = "***REDACTED***"


def is_safe_param(name: str, value: Any = None) -> bool:
    """Whether a model parameter may be stored and shown (on the allow-list; see ``SAFE_PARAMS``)."""
    low = name.lower()
    if low == "api_key_env":
        return isinstance(value, str) and _ENV_NAME.match(value) is not None
    return low in SAFE_PARAMS


def public_params(obj: Any) -> Any:
    """A copy of a ``ModelSpec`` dump (or of its params) in which every parameter not on the allow-list is
    replaced by a marker and ``api_base`` is stripped of credentials. Spec fields (``role``, ``model``,
    ``params``, ``extra``, ...) are walked into; allowed parameters are kept as they are."""
    if isinstance(obj, list | tuple):
        return [public_params(v) for v in obj]
    if not isinstance(obj, Mapping):
        return obj
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = str(k)
        if key in _SPEC_FIELDS:
            out[key] = public_params(v) if isinstance(v, Mapping) else v
        elif key == "api_base" and isinstance(v, str):
            out[key] = _sanitize_url(v) if "://" in v else v
        elif v is None or is_safe_param(key, v):
            out[key] = v
        else:
            out[key] = REDACTED_PARAM
    return out


def _unsafe_values(extra: Mapping[str, Any]) -> list[str]:
    """String forms of parameter values that are not on the allow-list (scrubbed from error messages)."""
    return [str(v) for k, v in extra.items() if v is not None and not is_safe_param(k, v) and len(str(v)) >= 4]


# =========================================================================== redaction
_SECRET_PATTERNS: Final = (
    re.compile(r"sk-[A-Za-z0-9_\-]{6,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9_\-\.=:+/]{8,}"),
)
_SECRET_ENV_SUFFIXES: Final = ("_API_KEY", "_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
_REDACTED: Final = "***REDACTED***"


_SECRET_ENV_SUFFIXES_B: Final = tuple(sfx.encode() for sfx in _SECRET_ENV_SUFFIXES)
_secret_cache: tuple[tuple[tuple[bytes, bytes], ...], list[str]] = ((), [])


def _secret_env_values() -> list[str]:
    """Values of secret-looking environment variables, longest first (≥ 8 chars to spare real words).

    Runs on every completion, so it scans the raw bytes environment (decoding
    all of ``os.environ`` costs ~0.5 ms) and memoises on the matching entries.
    """
    global _secret_cache
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict) and os.name == "posix":  # bytes keys on POSIX
        found = tuple(
            (k, v) for k, v in data.items() if k.upper().endswith(_SECRET_ENV_SUFFIXES_B) and len(v) >= 8
        )
        if found == _secret_cache[0]:
            return _secret_cache[1]
        values = sorted({v.decode("utf-8", "surrogateescape") for _, v in found}, key=len, reverse=True)
        _secret_cache = (found, values)
        return values
    values_set = {
        v for k, v in os.environ.items() if k.upper().endswith(_SECRET_ENV_SUFFIXES) and v and len(v) >= 8
    }
    return sorted(values_set, key=len, reverse=True)


def redact(text: str, extra_secrets: Iterable[str] = ()) -> str:
    """Remove API-key-like strings (``sk-...``, bearer tokens, values of ``*_API_KEY`` etc. env vars)."""
    if not text:
        return text
    for secret in [*_secret_env_values(), *(s for s in extra_secrets if s and len(s) >= 4)]:
        if secret in text:
            text = text.replace(secret, _REDACTED)
    text = _SECRET_PATTERNS[0].sub(_REDACTED, text)
    return _SECRET_PATTERNS[1].sub(lambda m: m.group(1) + _REDACTED, text)


# =========================================================================== cache
def default_cache_dir() -> Path:
    """``$SOPGRAPH_CACHE_DIR`` or ``~/.cache/sopgraph/llm``."""
    env = os.environ.get("SOPGRAPH_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sopgraph" / "llm"


class _CacheEntry(BaseModel):
    v: int = _CACHE_VERSION
    model: str
    text: str
    usage: Usage
    finish_reason: str | None = None
    cost: float = 0.0
    created: float = 0.0
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ResponseCache:
    """On-disk response cache: one small JSON file per key, sharded by the first two hex digits.

    Why files, not one database: concurrent runs (several CLI processes) can
    share it safely: writes go to a temp file then ``os.replace``, which is
    atomic, and readers never see a half-written entry.  Only responses are
    stored (no prompts, no keys).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    @staticmethod
    def key(payload: Mapping[str, Any]) -> str:
        """sha256 of the canonical JSON of ``payload``."""
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> _CacheEntry | None:
        """The entry for ``key``, or None (also for unreadable or stale-version files)."""
        try:
            raw = self._path(key).read_bytes()
            entry = _CacheEntry.model_validate_json(raw)
        except (OSError, ValueError):
            return None
        return entry if entry.v == _CACHE_VERSION else None

    def put(self, key: str, entry: _CacheEntry) -> None:
        """Store atomically; a failure to write is logged, never raised (the cache is an optimisation)."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(entry.model_dump_json().encode())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            _log.warning("response cache write failed: %s", exc)


# =========================================================================== litellm loading
_LITELLM: ModuleType | None = None
_LOAD_LOCK = threading.Lock()
_NETWORK_USED = False


def network_used() -> bool:
    """Whether this process has called a non-built-in provider (so litellm may hold HTTP clients
    with open connections, which a forked child must not inherit)."""
    return _NETWORK_USED


_QUIET = False


def quiet_litellm_output() -> None:
    """Silence litellm's own output in this process: its loggers and the "Give Feedback / Get Help" lines
    it prints to stdout on errors. For applications (the `sop` CLI calls it); library code never does,
    since it changes the whole process. ``SOPGRAPH_LITELLM_DEBUG=1`` keeps litellm talking."""
    global _QUIET
    if os.environ.get("SOPGRAPH_LITELLM_DEBUG"):
        return
    _QUIET = True
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    loaded: Any = _LITELLM
    if loaded is not None:
        loaded.suppress_debug_info = True


def load_litellm() -> ModuleType:
    """Import litellm once, offline, with the built-in providers registered.

    Nothing process-wide is changed: litellm's callbacks, loggers, cost map and the garbage
    collector stay as the process has them. Each call opts out of litellm's logging callbacks on its
    own (``"no-log": True``, see ``Gateway(litellm_logging=...)``)."""
    global _LITELLM
    if _LITELLM is not None:
        return _LITELLM
    with _LOAD_LOCK:
        if _LITELLM is not None:
            return _LITELLM
        with _offline_cost_map():
            import litellm

        if _QUIET:
            litellm.suppress_debug_info = True
            for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
        _register_builtins(litellm)
        global _UNLOGGED_MARK
        _UNLOGGED_MARK = _unlogged_mark()
        _LITELLM = litellm
        return litellm


@contextlib.contextmanager
def _offline_cost_map() -> Iterator[None]:
    """``LITELLM_LOCAL_MODEL_COST_MAP=True`` while litellm is imported, the environment as it was after.

    Why: litellm reads the variable once, at import, to decide whether to fetch its cost map from the
    internet; sopgraph never lets it. Setting it for the whole process (as earlier versions did at the
    gateway's import) changed what every later subprocess and library of the user sees."""
    before = os.environ.get(_OFFLINE_COST_MAP)
    os.environ[_OFFLINE_COST_MAP] = "True"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_OFFLINE_COST_MAP, None)
        else:
            os.environ[_OFFLINE_COST_MAP] = before


_OFFLINE_COST_MAP: Final = "LITELLM_LOCAL_MODEL_COST_MAP"

_UNLOGGED_MARK: ContextVar[bool] | None = None
"""litellm's own per-context mark of a call it neither logs nor bills (``is_internal_call``), or None when
the installed litellm has none. See ``_unlogged_mark``."""


def _unlogged_mark() -> ContextVar[bool] | None:
    """The context variable litellm reads to skip a call's success logging, where this litellm has it.

    Why: with litellm's callbacks off (each call's ``no-log``, the gateway's default), litellm still built a
    standard logging payload for every call after it answered (``async_success_handler``: the response's
    cost again, model info, a copy of the messages) and then gave it to no one: ~0.35 ms of CPU per call,
    a quarter of a built-in call's cost (docs/agents.md, "Speed"). litellm marks the calls it makes
    itself (``litellm._internal_context.is_internal_call``) so that they are not logged; the gateway sets that
    mark in the calling task's context for the call only, never process-wide, and only when the gateway
    was not asked for litellm's logging. It is not public API: a litellm without it gives None, and calls
    are then logged and discarded as before."""
    try:
        from litellm._internal_context import is_internal_call
    except ImportError:
        return None
    return is_internal_call if isinstance(is_internal_call, ContextVar) else None


WARM_UP_MODEL: Final = "scripted/user"
"""The built-in model `warm_up_litellm` calls (offline, free, answers without a case)."""


def warm_up_litellm() -> None:
    """One call to a built-in model through litellm, in an event loop of its own on a thread that has ended
    when this returns, and litellm's logging of that call finished in that loop. Why: litellm's first call in
    a process imports about 65 modules and loads a tokenizer (~0.4 s of CPU); a process about to fork does it
    once for all its children, and then has no other thread and nothing pending in litellm's logging queue
    for them to inherit. A failure only leaves the work to the first real call."""

    async def one_call() -> None:
        asyncio.get_running_loop().set_default_executor(InlinePreparationExecutor())
        gateway = Gateway(concurrency=1, cache=False)
        try:
            await gateway.complete(ModelSpec(role="user", model=WARM_UP_MODEL), [{"role": "user", "content": "hello"}],
                                   context={})
        finally:
            await gateway.aclose()
        # litellm's own queue of logging work (``flush``: wait until every enqueued task has completed)
        logging_worker = sys.modules.get("litellm.litellm_core_utils.logging_worker")
        queue = getattr(logging_worker, "GLOBAL_LOGGING_WORKER", None)
        if queue is not None:
            await asyncio.wait_for(queue.flush(), 5.0)

    def in_thread() -> None:
        try:
            asyncio.run(one_call())
        except Exception as exc:  # noqa: BLE001 - a warm-up only: the run's own calls report what fails
            _log.debug("litellm warm-up failed: %r", exc)

    thread = threading.Thread(target=in_thread, name="sop-litellm-warm-up", daemon=True)
    thread.start()
    thread.join()


def _register_builtins(litellm: Any) -> None:
    """Register ``baseline/*`` and ``scripted/*`` as litellm custom providers, priced at zero."""
    from litellm.llms.custom_llm import CustomLLMError
    from litellm.types.utils import ChatCompletionMessageToolCall, Function

    class _BuiltinLLM(litellm.CustomLLM):
        """Answers from ``sopgraph.simulation.providers`` using the context passed in the call's metadata."""

        def __init__(self, provider: str) -> None:
            super().__init__()
            self.provider = provider

        def _answer(self, kwargs: Mapping[str, Any]) -> Any:
            name = f"{self.provider}/{kwargs['model']}"
            litellm_params = kwargs.get("litellm_params") or {}
            metadata = litellm_params.get("metadata") or {}
            context = metadata.get(CONTEXT_METADATA_KEY) or {}
            try:
                text = providers.respond(name, kwargs.get("messages") or [], context)
            except Exception as exc:
                # 400: a provider bug or bad context is deterministic, so never retried.
                raise CustomLLMError(status_code=400, message=f"built-in {name} failed: {exc!r}") from exc
            response = kwargs["model_response"]
            text, calls = providers.split_tool_reply(name, text)  # a built-in acting through tool calls
            response.choices[0].message.content = text
            response.choices[0].finish_reason = "tool_calls" if calls else "stop"
            if calls:
                response.choices[0].message.tool_calls = [
                    ChatCompletionMessageToolCall(id=c["id"], type="function",
                                                  function=Function(name=c["name"], arguments=c["arguments"]))
                    for c in calls]
            response.model = name
            # A built-in is free and reads no tokens, and says so the way a provider can: its answer
            # states its cost (as a proxy's ``x-litellm-response-cost`` would) and carries no usage.
            # litellm then skips pricing it: a model missing from its cost map is otherwise searched
            # for through every map entry and generalisation rule, several times per call (a built-in
            # call went from ~4,150 to ~2,210 Python function calls; docs/architecture.md, perf).
            response._hidden_params["response_cost"] = 0.0
            response.usage = None
            return response

        def completion(self, *args: Any, **kwargs: Any) -> Any:
            return self._answer(kwargs)

        async def acompletion(self, *args: Any, **kwargs: Any) -> Any:
            return self._answer(kwargs)

    existing = [
        item
        for item in litellm.custom_provider_map
        if item.get("provider") not in providers.BUILTIN_PROVIDERS
    ]
    litellm.custom_provider_map = existing + [
        {"provider": p, "custom_handler": _BuiltinLLM(p)} for p in sorted(providers.BUILTIN_PROVIDERS)
    ]


# =========================================================================== errors
class _MalformedResponse(Exception):
    """The provider answered 200 but without a usable message."""


class _TooLarge(Exception):
    """The answer is over the model's ``max_answer_bytes``: refused (not retried), never stored."""


def answer_size(text: str, cap: int) -> int:
    """UTF-8 bytes of ``text``, exactly when it could matter for ``cap`` (encoding is skipped when even
    four bytes a character stay within it, and a text over ``cap`` characters is over it anyway)."""
    n = len(text)
    return n if n > cap or 4 * n <= cap else len(text.encode("utf-8", "replace"))


_RETRYABLE_STATUS: Final = frozenset({408, 409, 425, 429})
_MISSING_KEY: Final = re.compile(
    r"(?i)missing credentials|api_key client option must be set|missing \w+ api key|no api key"
    r"|incorrect api key|invalid api key|invalid x-api-key"
)
_AUTH_STATUS: Final = frozenset({401, 403})


def _chain(exc: BaseException, limit: int = 8) -> Iterable[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (bounded, cycle-safe)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < limit:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _aiohttp_http_error(exc: BaseException) -> BaseException | None:
    """The aiohttp HTTP error behind ``exc``, if any.

    litellm's ``aiohttp_openai/`` route reports every HTTP error as a 500 (it reads ``status_code``
    where aiohttp has ``status``); the original, with the real status and headers, is in the chain.
    """
    for item in _chain(exc):
        if type(item).__module__.startswith("aiohttp") and isinstance(getattr(item, "status", None), int):
            return item
    return None


def _retry_after(exc: BaseException) -> float | None:
    """Seconds from a ``Retry-After`` header on the error, if any."""
    origin = _aiohttp_http_error(exc)
    for attr in ("litellm_response_headers", "headers"):
        headers = getattr(exc, attr, None)
        if headers:
            break
    else:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    if origin is not None and getattr(origin, "headers", None):
        headers = origin.headers  # type: ignore[attr-defined]
    if not headers:
        return None
    try:
        value = headers.get("retry-after") or headers.get("Retry-After")
    except AttributeError:
        return None
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    with contextlib.suppress(TypeError, ValueError):
        when = email.utils.parsedate_to_datetime(str(value))
        return max(when.timestamp() - time.time(), 0.0)
    return None


def _classify(exc: BaseException) -> tuple[str, bool, int | None]:
    """(kind, retryable, status) for an exception raised while calling a provider."""
    if isinstance(exc, _MalformedResponse):
        return "malformed", True, None
    if isinstance(exc, _TooLarge):
        return "too_large", False, None
    if _MISSING_KEY.search(str(exc)):
        # The SDK refused before any request (litellm reports it as a 500): retrying cannot help.
        return "auth", False, 401
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timeout", True, None
    litellm = _LITELLM
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    origin = _aiohttp_http_error(exc)
    if origin is not None:
        status = origin.status  # type: ignore[attr-defined]
    elif (status is None or status >= 500) and any(isinstance(i, json.JSONDecodeError) for i in _chain(exc)):
        return "malformed", True, status  # a 200 body that is not JSON (aiohttp_openai/: "connection error")
    elif litellm is not None:
        if isinstance(exc, litellm.Timeout):
            return "timeout", True, status
        if isinstance(exc, litellm.AuthenticationError):
            return "auth", False, status
        if isinstance(exc, litellm.UnsupportedParamsError | litellm.ContextWindowExceededError):
            return "bad_request", False, status
        if isinstance(exc, litellm.APIConnectionError):
            return "connection", True, status
    if status is not None:
        if status == 429:
            return "rate_limit", True, status
        if status in _RETRYABLE_STATUS or status >= 500:
            message = str(exc)
            if "Connection error" in message:
                return "connection", True, status
            if "Expecting value" in message or "Unterminated" in message or "JSON" in message:
                return "malformed", True, status
            return "server_error", True, status
        if status in _AUTH_STATUS:
            return "auth", False, status
        if 400 <= status < 500:
            return "bad_request", False, status
    if isinstance(exc, ConnectionError | OSError) or "Connection" in name:
        return "connection", True, status
    if isinstance(exc, ValueError | KeyError | IndexError | AttributeError | TypeError):
        # Response parsing blew up inside litellm/openai: the body was not what a provider should send.
        return "malformed", True, status
    return "unknown", True, status


def _short(message: str, limit: int = 600) -> str:
    message = message.split("\nTraceback", 1)[0].strip()
    return message if len(message) <= limit else message[: limit - 3] + "..."


_USERINFO_HINT: Final = ("the api_base URL carries credentials (user:password@), which litellm's HTTP clients "
                         "refuse beside the API key header; give the key through the provider's environment "
                         "variable (docs/models.md)")


def _has_userinfo(url: str | None) -> bool:
    """Whether ``url`` has ``user:password@`` (refused before any call: the request could never be sent)."""
    if not url:
        return False
    parts = urlsplit(url)
    return parts.username is not None or parts.password is not None


def _sanitize_url(url: str | None) -> str | None:
    """``url`` without userinfo, query or fragment (those may carry credentials)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _is_secret_key(name: str) -> bool:
    """Whether a call parameter is a credential or transport detail, kept out of cache keys (so that a
    new key still hits the cache). Every other parameter changes the answer and is part of the key,
    which is a sha256: no value is ever readable from it."""
    low = name.lower()
    if low in ("key", "token", "secret", "password", "authorization", "headers", "extra_headers",
               "api_key_env", "no-log"):
        return True
    return low.endswith(("_key", "_token", "_secret", "_password"))


class _Wire:
    """The way to the providers, per event loop: the concurrency cap (an ``asyncio.Semaphore`` over all
    provider calls of all roles) and, for aiohttp routes, this gateway's keep-alive session, whose hooks hold
    a slot of the cap only while a request is at the provider (``_WireSlot``).

    Why apart from ``Gateway``: it knows nothing of retries, caching or accounting, and what it holds is
    bound to one event loop (recreated when the loop changes, e.g. across tests)."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None
        self.slots_on_wire = True  # aiohttp routes hold a slot only on the wire (``_WireSlot``)
        self.session: Any = None  # aiohttp.ClientSession of ``_session_loop`` (aiohttp_openai/)
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._session_keeper: AsyncIterator[None] | None = None

    async def send(self, litellm: Any, kwargs: dict[str, Any], guard: float) -> Any:
        """One request to a real model within ``guard`` seconds: on this wire's session a slot is held only
        while the request is at the provider, otherwise around the whole call (after waiting for it:
        waiting for a slot is not the call)."""
        if self.slots_on_wire and kwargs.get("client") is not None and kwargs["client"] is self.session:
            return await self._on_the_wire(litellm, kwargs, guard)
        async with self.semaphore(), asyncio.timeout(guard):
            return await litellm.acompletion(**kwargs)

    async def aiohttp_session(self) -> Any:
        """This loop's aiohttp session for ``aiohttp_openai/`` (litellm's own is bound to the first loop).

        One keep-alive pool per gateway and loop; no connection limit (the semaphore is the cap).
        It is closed by ``aclose`` (the gateway's) or, at the latest, when ``asyncio.run`` shuts the loop down:
        a suspended async generator holds it, and asyncio finalizes those at shutdown.
        """
        loop = asyncio.get_running_loop()
        if self.session is not None and self._session_loop is loop and not self.session.closed:
            return self.session
        import urllib.request

        import aiohttp

        litellm = load_litellm()
        # Like litellm's own session, honour HTTP(S)_PROXY; but with no proxy configured, skip
        # aiohttp's per-request environment and ~/.netrc lookups (two thread hops, ~0.3 ms a call).
        trust_env = bool(urllib.request.getproxies()) and not getattr(litellm, "disable_aiohttp_trust_env", False)
        tracing = aiohttp.TraceConfig()
        tracing.on_request_start.append(_take_wire_slot)
        tracing.on_request_end.append(_give_back_wire_slot)
        tracing.on_request_exception.append(_give_back_wire_slot)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=trust_env,
                                        response_class=_usage_keeping_response(), trace_configs=[tracing])
        keeper = _close_at_loop_end(session)
        await keeper.__anext__()
        self.session, self._session_loop, self._session_keeper = session, loop, keeper
        return session

    def semaphore(self) -> asyncio.Semaphore:
        """The concurrency cap of the running loop (recreated if the loop changed, e.g. across tests)."""
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem = asyncio.Semaphore(self.concurrency)
            self._sem_loop = loop
        return self._sem

    async def _on_the_wire(self, litellm: Any, kwargs: dict[str, Any], guard: float) -> Any:
        """``litellm.acompletion`` over this gateway's aiohttp session, holding a slot of the cap only while
        the request is at the provider (``_WireSlot``). Should a litellm version not send the request through
        the session it was given (the slot never taken), later calls hold the slot around the whole call."""
        async with asyncio.timeout(guard) as deadline:
            slot = _WireSlot(self.semaphore(), deadline, guard)
            token = _WIRE_SLOT.set(slot)
            try:
                response = await litellm.acompletion(**kwargs)
            finally:
                _WIRE_SLOT.reset(token)
                slot.give_back()
        if not slot.used:  # answered, yet never on this session's wire
            self.slots_on_wire = False
            _log.warning("litellm did not send the request through the gateway's aiohttp session: "
                         "the concurrency cap now holds each call's slot around the whole call")
        return response

    async def aclose(self) -> None:
        session, self.session, self._session_loop = self.session, None, None
        keeper, self._session_keeper = self._session_keeper, None
        if session is not None and not session.closed:
            await session.close()
        if keeper is not None:
            with contextlib.suppress(Exception):
                await keeper.aclose()  # type: ignore[attr-defined]


class _ServedModels:
    """What the gateway learns about a model as served (its name and where, ``_schema_key``) from its answers:
    that it rejects ``json_schema`` structured output (asked ``json_object`` from then on, and noted for the
    run), and that litellm cannot price it (later calls go with a zero per-call price, see
    ``_unpriced_call_options``)."""

    def __init__(self) -> None:
        self._no_json_schema: set[tuple[str, str]] = set()
        self._unpriced: set[tuple[str, str]] = set()
        self.notes: list[str] = []

    def uses_json_object(self, spec: ModelSpec) -> bool:
        if spec.structured_mode == "json_object":
            return True
        return spec.structured_mode == "auto" and _schema_key(spec) in self._no_json_schema

    def is_unpriced(self, spec: ModelSpec) -> bool:
        return _schema_key(spec) in self._unpriced

    def learn_unpriced(self, spec: ModelSpec) -> None:
        self._unpriced.add(_schema_key(spec))

    def learn_no_json_schema(self, spec: ModelSpec) -> None:
        key = _schema_key(spec)
        if key in self._no_json_schema:
            return
        self._no_json_schema.add(key)
        where = f" at {key[1]}" if key[1] else ""
        self.notes.append(
            f"structured output: {spec.model}{where} rejected response_format json_schema but accepts "
            "json_object; its calls use json_object from now on (set structured=json_object to skip the check)"
        )


def _call_options(spec: ModelSpec, messages: list[dict[str, Any]], context: Mapping[str, Any] | None, *,
                  timeout: float, logged: bool, json_object: bool) -> dict[str, Any]:
    """litellm's options for one call of ``spec``'s model (no I/O): our timeout and no retries of the SDK's
    (we count attempts and classify failures), the key, the built-in's context, the structured output."""
    p = spec.params
    extra = dict(p.extra)
    kwargs: dict[str, Any] = {
        "model": spec.model,
        "messages": messages,
        "timeout": p.timeout or timeout,
        "max_retries": 0,  # ours, not the SDK's: we count attempts and classify failures
        "num_retries": 0,
    }
    if not logged:
        kwargs["no-log"] = True  # per call: litellm's callbacks (if the process has any) skip it
    if p.temperature is not None:
        kwargs["temperature"] = p.temperature
    if p.max_tokens is not None:
        kwargs["max_tokens"] = p.max_tokens
    if p.api_base:
        kwargs["api_base"] = p.api_base
    key_env = extra.pop("api_key_env", None)
    if key_env:
        value = os.environ.get(str(key_env))
        if value:
            kwargs["api_key"] = value
    elif (
        p.api_base
        and (spec.provider == "openai" or spec.provider in AIOHTTP_PROVIDERS)
        and not os.environ.get("OPENAI_API_KEY")
    ):
        # Local OpenAI-compatible servers (llama.cpp, vLLM) need no key, but the SDK insists on one.
        kwargs["api_key"] = "no-key-required"
    if spec.is_builtin:
        kwargs["custom_llm_provider"] = spec.provider
        if logged:
            kwargs.update(_BUILTIN_CALL_OPTIONS)
    kwargs.update(extra)
    if spec.is_builtin:
        kwargs["metadata"] = {CONTEXT_METADATA_KEY: _plain(context or {})}
    elif spec.structured:
        schema = (context or {}).get("response_schema")
        if isinstance(schema, Mapping) and not json_object:
            name = str((context or {}).get("response_schema_name") or "response")
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": dict(schema)},
            }
        else:
            kwargs["response_format"] = {"type": "json_object"}
    return kwargs


def _cache_key(spec: ModelSpec, messages: list[dict[str, Any]], kwargs: Mapping[str, Any]) -> str:
    """Key over model, messages and sampling params; never keys, headers or credentials."""
    params = {
        k: v
        for k, v in kwargs.items()
        if k not in ("model", "messages", "api_key", "timeout", "max_retries", "num_retries", "metadata")
        and not _is_secret_key(k)
    }
    if "api_base" in params:
        params["api_base"] = _sanitize_url(params["api_base"])
    return ResponseCache.key(
        {"v": _CACHE_VERSION, "model": spec.model, "messages": messages, "params": params}
    )


# =========================================================================== gateway
class Gateway:
    """Async model gateway shared by every role of a run.

    One instance per run: it owns the concurrency cap (an ``asyncio.Semaphore``
    over all provider calls of all roles; on its aiohttp session, held only while a request is at
    the provider: ``_WireSlot``; both in ``wire``), the retry policy, the response cache, what it
    learns about served models (``served``) and the running totals.  Built-in providers bypass the cap and the cache
    (they are local, free and deterministic), but not litellm: every model call, built-in
    or real, goes through ``litellm.acompletion``, so offline runs exercise the same code
    path real models take. ``builtins_via_litellm=False`` calls the function litellm's
    registered custom provider calls (``providers.respond``) directly; it exists only so
    ``benchmarks/bench_agents.py --builtins-direct`` can show how much of a run's harness
    cost is litellm's per-call work (about 2–4 ms of CPU).

    Nothing process-wide is configured: each call carries its own options. ``litellm_logging=True``
    lets litellm's callbacks (``litellm.success_callback`` etc., if the process installed any) see
    the calls; by default each call is sent with litellm's per-call ``no-log`` flag instead.
    """

    def __init__(
        self,
        *,
        concurrency: int = 16,
        max_retries: int = DEFAULT_RETRIES,
        base_delay: float = DEFAULT_BASE_DELAY,
        max_delay: float = DEFAULT_MAX_DELAY,
        default_timeout: float = 120.0,
        cache: bool = True,
        cache_dir: str | Path | None = None,
        seed: int | None = None,
        litellm_logging: bool = False,
        builtins_via_litellm: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ArgumentError("concurrency must be >= 1")
        if max_retries < 0:
            raise ArgumentError("max_retries must be >= 0")
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.default_timeout = default_timeout
        self.cache_enabled = cache
        self.litellm_logging = litellm_logging
        self.builtins_via_litellm = builtins_via_litellm
        self.cache = ResponseCache(cache_dir if cache_dir is not None else default_cache_dir())
        self._rng = random.Random(seed)
        self._stats = GatewayStats()
        self.wire = _Wire(concurrency)
        self.served = _ServedModels()
        self.notes = self.served.notes
        """Things a run should record, e.g. a structured-output fallback (one line each)."""
        self._listeners: list[Callable[[Gateway], None]] = []
        self._retry_listeners: list[Callable[[str], None]] = []

    # ------------------------------------------------------------------ public
    def add_listener(self, fn: Callable[[Gateway], None]) -> None:
        """Call ``fn(gateway)`` after every answered call (e.g. a progress display reading ``stats``)."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[Gateway], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(fn)

    def add_retry_listener(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(line)`` before each retry's wait: ``retrying ROLE at API_BASE (attempt k/n, next in s): KIND``.
        Why: a run (or its model check) waiting out an outage said nothing for minutes."""
        self._retry_listeners.append(fn)

    def remove_retry_listener(self, fn: Callable[[str], None]) -> None:
        with contextlib.suppress(ValueError):
            self._retry_listeners.remove(fn)

    def _notify(self) -> None:
        for fn in list(self._listeners):
            fn(self)

    @property
    def stats(self) -> GatewayStats:
        """A snapshot of the running totals."""
        return self._stats.model_copy()

    async def complete(
        self,
        spec: ModelSpec,
        messages: Sequence[Mapping[str, Any]],
        *,
        context: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Completion:
        """Ask ``spec``'s model for the next message; raise ``InfraFailure`` if it cannot be had.

        ``context`` carries per-dialogue facts for built-in providers (sent as
        litellm call metadata, never in the prompt; not sent to real
        providers) and, with ``spec.structured``, the ``response_schema``.
        ``tools`` (OpenAI-style function tools) lets the model answer with function calls
        (``Completion.tool_calls``); retries, cache and accounting are the same as for text.
        """
        started = time.perf_counter()
        self._stats.calls += 1
        msgs = [dict(m) for m in messages]
        kwargs = self._call_kwargs(spec, msgs, context)
        if tools and not spec.is_builtin:
            kwargs["tools"] = [dict(t) for t in tools]
            # litellm would otherwise look for MCP tools among them, importing its proxy's MCP server
            # (which needs the `mcp` package); these are plain function tools.
            kwargs["_skip_mcp_handler"] = True
            kwargs.pop("response_format", None)  # the answer is function calls or text, not a JSON reply
        key = _cache_key(spec, msgs, kwargs) if self._use_cache(spec) else None
        if key is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self._stats.cache_hits += 1
                self._notify()
                return Completion(
                    text=hit.text,
                    model=spec.model,
                    role=spec.role,
                    usage=hit.usage,
                    cost=0.0,
                    cost_known=True,
                    latency=time.perf_counter() - started,
                    cached=True,
                    attempts=0,
                    finish_reason=hit.finish_reason,
                    tool_calls=hit.tool_calls,
                )
        completion = await self._call_with_retries(spec, kwargs, started)
        self._notify()
        if key is not None:
            self.cache.put(
                key,
                _CacheEntry(
                    model=spec.model,
                    text=completion.text,
                    usage=completion.usage,
                    finish_reason=completion.finish_reason,
                    cost=completion.cost,
                    created=time.time(),
                    tool_calls=completion.tool_calls,
                ),
            )
        return completion

    def complete_sync(
        self,
        spec: ModelSpec,
        messages: Sequence[Mapping[str, Any]],
        *,
        context: Mapping[str, Any] | None = None,
    ) -> Completion:
        """``complete`` for synchronous callers (runs its own event loop)."""
        return asyncio.run(self.complete(spec, messages, context=context))

    async def aclose(self) -> None:
        """Close the HTTP session this gateway opened for aiohttp routes (also done when the loop ends)."""
        await self.wire.aclose()

    async def __aenter__(self) -> Gateway:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ internals
    def _use_cache(self, spec: ModelSpec) -> bool:
        if not self.cache_enabled or spec.is_builtin:
            return False
        if spec.cache is not None:
            return spec.cache
        return spec.params.temperature == 0

    def retry_window(self) -> tuple[float, float]:
        """(shortest, longest) total wait over all retries of one call, without ``Retry-After``."""
        ceilings = [min(self.max_delay, self.base_delay * (2**i)) for i in range(self.max_retries)]
        return sum(c / 2 for c in ceilings), sum(ceilings)

    def uses_json_object(self, spec: ModelSpec) -> bool:
        """Whether ``spec``'s structured output must be asked as ``json_object`` (set, or learnt)."""
        return self.served.uses_json_object(spec)

    def _call_kwargs(
        self, spec: ModelSpec, messages: list[dict[str, Any]], context: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        return _call_options(spec, messages, context, timeout=self.default_timeout, logged=self.litellm_logging,
                             json_object=self.uses_json_object(spec))

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with equal jitter, at least ``Retry-After`` (both capped by ``max_delay``).

        Why equal jitter (half fixed, half random) rather than full: the retries must ride out a
        server restart of tens of seconds, so the window has a floor (see ``retry_window``)."""
        ceiling = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        delay = self._rng.uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_delay))
        return delay

    def _builtin(self, spec: ModelSpec, kwargs: Mapping[str, Any], started: float) -> Completion:
        """A built-in's answer without litellm (see the class docstring); the same errors as its path
        through litellm: a provider exception is a non-retryable ``bad_request``."""
        self._stats.attempts += 1
        context = kwargs["metadata"][CONTEXT_METADATA_KEY]
        try:
            text = providers.respond(spec.model, kwargs["messages"], context)
        except Exception as exc:  # noqa: BLE001 - a provider bug or bad context is deterministic
            self._stats.failures += 1
            raise InfraFailure(
                f"{spec.role or 'model'} {spec.model}: bad_request (not retryable): built-in {spec.model} "
                f"failed: {_short(repr(exc))}",
                kind="bad_request", role=spec.role, model=spec.model, attempts=1, status_code=400, retryable=False,
            ) from None
        text, calls = providers.split_tool_reply(spec.model, text)
        return Completion(text=text, model=spec.model, role=spec.role, latency=time.perf_counter() - started,
                          attempts=1, finish_reason="tool_calls" if calls else "stop", tool_calls=calls or [])

    async def _call_with_retries(self, spec: ModelSpec, kwargs: dict[str, Any], started: float) -> Completion:
        global _NETWORK_USED
        if spec.is_builtin and not self.builtins_via_litellm:
            return self._builtin(spec, kwargs, started)
        loading = time.perf_counter()
        load_litellm()
        if not spec.is_builtin:
            _NETWORK_USED = True
        started += time.perf_counter() - loading  # the one-time import is not the model's latency
        secrets = [kwargs["api_key"]] if "api_key" in kwargs else []
        secrets += _unsafe_values(spec.params.extra)
        if _has_userinfo(spec.params.api_base):
            self._stats.failures += 1
            raise InfraFailure(f"{spec.role or 'model'} {spec.model}: bad_request (not retryable): {_USERINFO_HINT} "
                               f"(api_base {_sanitize_url(spec.params.api_base)})",
                               kind="bad_request", role=spec.role, model=spec.model, attempts=0, retryable=False)
        timeout = float(kwargs["timeout"])
        # A guard above the transport timeout, so a wedged call can never hang a run. litellm's
        # aiohttp route does not apply ``timeout`` itself, so there the guard is the timeout.
        guard = timeout * 1.5 + 5.0
        if spec.provider in AIOHTTP_PROVIDERS and "client" not in kwargs:
            kwargs = {**kwargs, "client": await self.wire.aiohttp_session()}
            guard = timeout
        # A model litellm could not price stays unpriced (its cost map is never written to): later calls
        # carry a zero per-call price, which spares litellm searching its whole cost map for the model on
        # every call, and are recorded as of unknown cost all the same. Not when the user priced it.
        unpriced = (not spec.is_builtin and self.served.is_unpriced(spec)
                    and not any(k in kwargs for k in _BUILTIN_CALL_OPTIONS))
        if unpriced:
            kwargs = {**kwargs, **_unpriced_call_options(spec.model, kwargs)}
        cpu_only = spec.is_builtin or spec.provider in AIOHTTP_PROVIDERS
        inline = _INLINE_PREPARATION.set(asyncio.current_task() if cpu_only else None)
        mark = None if self.litellm_logging else _UNLOGGED_MARK
        unlogged = mark.set(True) if mark is not None else None
        try:
            return await self._attempts(spec, kwargs, started, secrets, guard, unpriced)
        finally:
            if mark is not None and unlogged is not None:
                mark.reset(unlogged)
            _INLINE_PREPARATION.reset(inline)

    async def _attempts(self, spec: ModelSpec, kwargs: dict[str, Any], started: float, secrets: list[str],
                        guard: float, unpriced: bool) -> Completion:
        """Call litellm until an answer, a failure that is not retryable, or the retries run out."""
        litellm = load_litellm()
        attempts = 0
        fallback_tried = False
        schema_format: Any = kwargs.get("response_format")
        while True:
            attempts += 1
            self._stats.attempts += 1
            try:
                if spec.is_builtin:
                    async with asyncio.timeout(guard):
                        response = await litellm.acompletion(**kwargs)
                else:
                    raw_usage: dict[str, Any] = {}
                    kept = _RAW_USAGE.set(raw_usage)
                    try:
                        response = await self.wire.send(litellm, kwargs, guard)
                    finally:
                        _RAW_USAGE.reset(kept)
                    _restore_usage(spec, response, raw_usage, priced=not unpriced)
                completion = self._to_completion(spec, response, attempts, started, secrets, unpriced)
                if fallback_tried and _format_type(kwargs) == "json_object":
                    self.served.learn_no_json_schema(spec)
                return completion
            except Exception as exc:  # noqa: BLE001 - every provider failure is classified below
                kind, retryable, status = _classify(exc)
                if fallback_tried and _format_type(kwargs) == "json_object":
                    kwargs = {**kwargs, "response_format": schema_format}  # not the cause: back to the schema
                elif not fallback_tried and _schema_rejected(spec, kwargs, kind, status):
                    # A server without json_schema support (llama.cpp answers 500): try json_object once.
                    fallback_tried = True
                    kwargs = {**kwargs, "response_format": {"type": "json_object"}}
                    continue
                if not retryable or attempts > self.max_retries:
                    self._stats.failures += 1
                    detail = redact(_short(str(exc) or type(exc).__name__), secrets)
                    what = f"after {attempts} attempts" if retryable else "(not retryable)"
                    raise InfraFailure(
                        f"{spec.role or 'model'} {spec.model}: {kind} {what}{_where(spec, kind)}: {detail}",
                        kind=kind,
                        role=spec.role,
                        model=spec.model,
                        attempts=attempts,
                        status_code=status,
                        retryable=retryable,
                    ) from None
                self._stats.retries += 1
                delay = self._backoff(attempts, _retry_after(exc))
                if self._retry_listeners:
                    line = (f"retrying {spec.role or 'model'} at {_sanitize_url(spec.params.api_base) or spec.model} "
                            f"(attempt {attempts + 1}/{self.max_retries + 1}, next in {delay:.1f} s): {kind}")
                    for fn in list(self._retry_listeners):
                        fn(line)
                await asyncio.sleep(delay)

    def _to_completion(
        self, spec: ModelSpec, response: Any, attempts: int, started: float, secrets: list[str],
        unpriced: bool = False,
    ) -> Completion:
        choices = getattr(response, "choices", None)
        if not choices:
            raise _MalformedResponse("response has no choices")
        message = getattr(choices[0], "message", None)
        text = getattr(message, "content", None)
        calls = _tool_calls(message)
        if text is None and calls:
            text = ""  # a function-calling answer may carry no text
        if not isinstance(text, str):
            raise _MalformedResponse("response message has no text content")
        cap = spec.params.max_answer_bytes or DEFAULT_MAX_ANSWER_BYTES
        size = answer_size(text, cap) + sum(answer_size(str(c.get("arguments") or ""), cap) for c in calls)
        if size > cap:
            raise _TooLarge(f"the answer is {size:,} bytes, over the limit of {cap:,} (max_answer_bytes=)")
        usage = _usage(getattr(response, "usage", None))
        cost, known = (0.0, False) if unpriced else self._cost(spec, response)
        if not known:
            self.served.learn_unpriced(spec)
        self._stats.prompt_tokens += usage.prompt_tokens
        self._stats.completion_tokens += usage.completion_tokens
        self._stats.reasoning_tokens += usage.reasoning_tokens
        self._stats.cost += cost
        self._stats.unknown_cost_calls += 0 if known else 1
        return Completion(
            text=redact(text, secrets),
            model=spec.model,
            role=spec.role,
            usage=usage,
            cost=cost,
            cost_known=known,
            latency=time.perf_counter() - started,
            cached=False,
            attempts=attempts,
            finish_reason=getattr(choices[0], "finish_reason", None),
            tool_calls=[{**c, "arguments": redact(c["arguments"], secrets)} for c in calls],
        )

    @staticmethod
    def _cost(spec: ModelSpec, response: Any) -> tuple[float, bool]:
        """(USD, known) from litellm: its computed ``response_cost`` first, else ``completion_cost``."""
        if spec.is_builtin:
            return 0.0, True
        hidden = getattr(response, "_hidden_params", None) or {}
        if "response_cost" in hidden:
            value = hidden.get("response_cost")
            if isinstance(value, int | float):
                return float(value), True
            # litellm tried and could not price the model (its cost map is never written to: an
            # unpriced model stays unpriced, and every such call says so).
            return 0.0, False
        litellm = _LITELLM
        if litellm is None:
            return 0.0, False
        try:
            return float(litellm.completion_cost(completion_response=response, model=spec.model)), True
        except Exception:  # noqa: BLE001 - an unpriced model is not an error
            return 0.0, False


def _schema_key(spec: ModelSpec) -> tuple[str, str]:
    """A model as served (its name and where): what a learnt fact about it (no `json_schema`, unpriced)
    is kept by."""
    return spec.model, _sanitize_url(spec.params.api_base) or ""


def _format_type(kwargs: Mapping[str, Any]) -> str | None:
    fmt = kwargs.get("response_format")
    return fmt.get("type") if isinstance(fmt, Mapping) else None


def _schema_rejected(spec: ModelSpec, kwargs: Mapping[str, Any], kind: str, status: int | None) -> bool:
    """Whether a failure may be the server refusing ``json_schema`` (worth one ``json_object`` try)."""
    return (
        spec.structured_mode == "auto"
        and _format_type(kwargs) == "json_schema"
        and kind in ("bad_request", "server_error")
        and status in (400, 422, 500)
    )


def _where(spec: ModelSpec, kind: str) -> str:
    """`` at API_BASE`` for failures to reach a server, so the message says which one."""
    if kind not in ("connection", "timeout"):
        return ""
    base = _sanitize_url(spec.params.api_base)
    return f" at {base}" if base else " at the provider's default endpoint"


async def _close_at_loop_end(session: Any) -> AsyncIterator[None]:
    """Suspended at ``yield`` while the loop runs; ``asyncio.run``'s shutdown closes it, and the session."""
    try:
        yield
    finally:
        if not session.closed:
            await session.close()


def _plain(value: Any) -> Any:
    """JSON-like copy of a context: pydantic models dumped, mappings and sequences copied.

    Exact-type checks first: contexts are mostly plain dicts, lists and scalars, and ABC
    ``isinstance`` checks on every node cost about a millisecond per call on a case context."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        return {k if type(k) is str else str(k): _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _tool_calls(message: Any) -> list[dict[str, Any]]:
    """The function calls of a response message as plain dicts (missing parts become empty strings:
    a call without a name is the caller's format error, not a transport failure)."""
    out = []
    for i, call in enumerate(getattr(message, "tool_calls", None) or ()):
        fn = getattr(call, "function", None)
        args = getattr(fn, "arguments", None)
        if args is not None and not isinstance(args, str):
            args = json.dumps(_plain(args), ensure_ascii=False)
        out.append({"id": str(getattr(call, "id", None) or f"call_{i}"),
                    "name": str(getattr(fn, "name", None) or ""), "arguments": args or ""})
    return out


def _restore_usage(spec: ModelSpec, response: Any, raw: Mapping[str, Any], *, priced: bool = True) -> None:
    """Put the server's ``usage`` back on a response litellm built without it (``aiohttp_openai/``), and
    price it again when it is priced: per call (the model's ``input_cost_per_token``/``output_cost_per_token``
    options) or by litellm's cost map; not when the gateway's own zero price stands in for an unpriced
    model (``priced=False``). A response that has its usage is left as it is."""
    usage = getattr(response, "usage", None)
    if not raw or (usage is not None and (getattr(usage, "prompt_tokens", None)
                                          or getattr(usage, "completion_tokens", None))):
        return
    try:
        prompt, completion = int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0)
    except (TypeError, ValueError):
        return
    if not prompt and not completion:
        return
    litellm = load_litellm()
    response.usage = litellm.Usage(prompt_tokens=prompt, completion_tokens=completion,
                                   total_tokens=prompt + completion)
    hidden = getattr(response, "_hidden_params", None)
    if not priced or not isinstance(hidden, dict) or not isinstance(hidden.get("response_cost"), int | float):
        return  # litellm could not price the model: it stays of unknown cost
    extra = spec.params.extra
    try:
        if "input_cost_per_token" in extra or "output_cost_per_token" in extra:
            cost = (prompt * float(extra.get("input_cost_per_token") or 0)
                    + completion * float(extra.get("output_cost_per_token") or 0))
        else:
            cost = float(litellm.completion_cost(completion_response=response, model=spec.model))
    except Exception:  # noqa: BLE001 - cannot price after all: unknown, as litellm says for an unpriced model
        hidden["response_cost"] = None
        return
    hidden["response_cost"] = cost


def _usage(raw: Any) -> Usage:
    if raw is None:
        return Usage()
    details = getattr(raw, "completion_tokens_details", None)
    reasoning = getattr(details, "reasoning_tokens", None) if details is not None else None
    return Usage(
        prompt_tokens=int(getattr(raw, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(raw, "completion_tokens", 0) or 0),
        reasoning_tokens=int(reasoning or 0),
    )
