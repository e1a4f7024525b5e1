"""Environments: a Python model of the world a procedure acts on (docs/environments.md).

Why: the case-scripted backend answers an agent from a fixed list of looks, so an agent that does
something the case did not foresee still sees the case's next value. An environment is a small
program whose methods are the SOP's actions (they change its state) and which answers system and
observed values from its state, so the world reacts to what the agent really did. One environment
serves the reference trace (the session stepped against a fresh copy), the backend a tool-acting
agent acts on during the dialogue, and the end-state check (both traces replayed on fresh copies).

The protocol (`--env python:MODULE:FACTORY`):

- `FACTORY(system, seed)` returns a fresh environment for one case: `system` is the case's system
  values (an observed variable: its list of looks, which the factory may read as the case's story),
  `seed` the case's seed.
- One method per SOP action, named as the action, taking its arguments as keywords
  (`env.PushSettings(profile="Home")`); its return value is ignored.
- `observe(name)` returns the current value of a system or observed variable.
- `state()` returns a JSON-able snapshot of everything the actions can change (compared at the end).

Every answer is checked (JSON-able, at most `MAX_ANSWER_BYTES`, inside the variable's domain); a
method that is missing, raises, answers badly or takes more than `CALL_TIMEOUT` seconds is an
`EnvError` naming the call and where it raised.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.logic.engine import DecideError, validate_value
from sopgraph.records import Case
from sopgraph.simulation.agents import AgentError, load_callable, where_raised
from sopgraph.simulation.backend import Backend, BackendSpec
from sopgraph.simulation.gateway import InfraFailure

PREFIX = "python:"
MAX_ANSWER_BYTES = 65536  # an observed value or a state snapshot larger than this is an error, not a memory hog
CALL_TIMEOUT = 10.0  # seconds one call of the environment may take before it is an error (nothing hangs)
_PROTOCOL = ("observe", "state")


class EnvError(Error):
    """An environment that cannot be loaded, lacks a method, raises, or answers outside the protocol."""


def _bounded(what: str, value: Any) -> str:
    """`value` as canonical JSON (EnvError when it is not JSON-able or over `MAX_ANSWER_BYTES`)."""
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise EnvError(f"{what} is not JSON: {exc}") from None
    if len(text) > MAX_ANSWER_BYTES:
        raise EnvError(f"{what} is {len(text)} bytes of JSON, over the {MAX_ANSWER_BYTES} allowed")
    return text


@dataclass(frozen=True)
class EnvSpec:
    """A loaded `python:MODULE:FACTORY` for one scenario: makes a fresh, checked environment per case."""

    spec: str
    factory: Callable[..., Any]
    scenario: ir.Scenario
    timeout: float = CALL_TIMEOUT

    @classmethod
    def load(cls, spec: str, scenario: ir.Scenario) -> EnvSpec:
        """Import the factory (the same module rules as a `python:` agent); EnvError with one line."""
        if not spec.startswith(PREFIX):
            raise EnvError(f"--env {spec!r}: expected python:MODULE:FACTORY")
        try:
            factory = load_callable(spec)
        except AgentError as exc:
            raise EnvError(f"--env: {exc}") from None
        return cls(spec, factory, scenario)

    def make(self, system: Mapping[str, Any], seed: int = 0) -> Environment:
        """A fresh environment for one case's system values (deep-copied: the env may change them)."""
        name = self.spec.removeprefix(PREFIX)
        copy = json.loads(json.dumps(dict(system), default=str))
        obj = _bounded_call("environment ", f"{name}(system, seed)", lambda: self.factory(copy, seed), self.timeout)
        env = Environment(obj, self)
        env.check()
        return env

    def for_case(self, case: Case) -> Environment:
        return self.make(case.system, case.seed)


def _bounded_call(what: str, call: str, fn: Callable[[], Any], timeout: float) -> Any:
    """`fn()` in a thread of its own, at most `timeout` seconds: an exception or a call that does not
    return in time is an EnvError naming the call (and where it raised), never a traceback or a hang."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the user's code: any failure is reported
            box["error"] = exc

    worker = threading.Thread(target=target, name="sopgraph-env", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise EnvError(f"{what}{call} did not return within {timeout:g} s")
    if "error" in box:
        exc = box["error"]
        raise EnvError(f"{what}{call} raised {type(exc).__name__}: {exc}{where_raised(exc)}")
    return box.get("value")


@dataclass
class Environment:
    """One case's environment, every call guarded (see the module docstring)."""

    obj: Any
    spec: EnvSpec

    def _what(self, call: str) -> str:
        return f"environment {self.spec.spec.removeprefix(PREFIX)}: {call}"

    def check(self) -> None:
        """EnvError naming what the object lacks: `observe`, `state`, a method per SOP action."""
        try:
            missing = [n for n in (*_PROTOCOL, *self.spec.scenario.actions)
                       if not callable(getattr(self.obj, n, None))]
        except Exception as exc:  # noqa: BLE001 - a __getattr__ or property of the user's class that raises
            raise EnvError(self._what(f"looking up its methods raised {type(exc).__name__}: {exc}{where_raised(exc)}")
                           ) from None
        if missing:
            raise EnvError(self._what(f"{type(self.obj).__name__} has no method " + ", ".join(missing)
                                      + " (an environment needs observe(name), state() and one method per "
                                      "action of the SOP)"))

    def _run(self, call: str, fn: Callable[[], Any]) -> Any:
        return _bounded_call(self._what(""), call, fn, self.spec.timeout)

    def observe(self, name: str) -> Any:
        """The current value of a system or observed variable, checked against its declared domain."""
        value = self._run(f"observe({name!r})", lambda: self.obj.observe(name))
        _bounded(self._what(f"observe({name!r})"), value)
        var = self.spec.scenario.variables.get(name)
        if var is not None:
            try:
                value = validate_value(var, value)
            except DecideError as exc:
                raise EnvError(self._what(f"observe({name!r}) answered outside the domain: {exc}")) from None
        return value

    def act(self, action: str, args: Mapping[str, Any]) -> None:
        """Carry out one action (its method with the arguments as keywords)."""
        shown = ", ".join(f"{k}={v!r}" for k, v in args.items())[:200]
        method = getattr(self.obj, action, None)  # (there: `check` looked it up when the environment was made)
        if not callable(method):
            raise EnvError(self._what(f"no method {action} for the action {action}"))
        self._run(f"{action}({shown})", lambda: method(**dict(args)))

    def state(self) -> str:
        """The snapshot as canonical JSON (two states are equal when these strings are)."""
        return _bounded(self._what("state()"), self._run("state()", lambda: self.obj.state()))


@dataclass
class EnvBackend(Backend):
    """The backend a tool-acting agent acts on, answered by an environment instead of the case's looks:
    lookups call `observe`, actions call the env's method; results are shaped as the scripted backend's
    (`{"name", "value"}`, `{"status": "done", "observed": {...}, "note": ...}`), so an agent cannot tell
    them apart. An environment failure is an infrastructure failure of the dialogue."""

    env: Environment | None = None

    @classmethod
    def with_env(cls, spec: BackendSpec, case: Case, env: Environment) -> EnvBackend:
        return cls(spec, case.system, expected_path=list(case.expected_path or ()), env=env)

    def call(self, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        env = self.env
        assert env is not None
        try:
            if name == self.spec.lookup:
                var = str(args.get("name"))
                return {"name": var, "value": env.observe(var)}
            env.act(name, args)
            self.actions.append(name)
            result: dict[str, Any] = {"status": "done"}
            observed = {var: env.observe(var) for var in self.spec.reports.get(name, ())}
        except EnvError as exc:
            raise InfraFailure(str(exc), kind="environment", role="environment", model=env.spec.spec) from None
        if observed:
            result["observed"] = observed
        if name in self.spec.enders:
            result["note"] = "this action ends the conversation"
        return result


def backend_for(spec: BackendSpec, case: Case, env: EnvSpec | None) -> Backend:
    """The dialogue's backend: the case-scripted one, or one answered by a fresh environment (an
    environment that cannot be made is an infrastructure failure of the dialogue)."""
    if env is None:
        return Backend.for_case(spec, case)
    try:
        made = env.for_case(case)
    except EnvError as exc:
        raise InfraFailure(str(exc), kind="environment", role="environment", model=env.spec) from None
    return EnvBackend.with_env(spec, case, made)


def replay_state(env: EnvSpec, case: Case, calls: Sequence[Mapping[str, Any]]) -> str:
    """The end state of a fresh environment after `calls` (actions with their arguments), in order."""
    made = env.for_case(case)
    for c in calls:
        made.act(str(c.get("name")), dict(c.get("args") or {}))
    return made.state()
