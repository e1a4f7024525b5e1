"""The engine as a session: a procedure run step by step against values that become known as it goes.

`start(scenario, values=…, now=…)` begins a run; `Session.next()` advances it to its next event:

- `Need(variable, look, stage)` — the run reads a value it has not been given: a field, a system value,
  or the `look`-th look (1-based) of an observed variable. Answer with `provide(variable, value)`
  (`None` means "missing": the variable's default, or the same error `decide` gives); `next()` then
  continues from where the run stopped.
- `Act(action, args, final)` — an action is carried out, with its arguments (the steps on the way, then
  the final action with `final=True`).
- `End(decision)` — the run is over: the `Decision` (path, finals, actions) that `decide` gives for the
  same values.

The session runs the engine's stepping form (the generated code of `Engine`, as a generator that yields
where it needs a value or carries out an action). Given every value up front it never asks, and ends
exactly as `decide` does: `decide` *is* a session run to its end on the values it was given
(`Session.run()`). A value that is wrong (off its domain, not a list of looks) fails the run with
the same `DecideError` as `decide`.
"""

from __future__ import annotations

import weakref
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sopgraph.language import ir
from sopgraph.language.diagnostics import did_you_mean
from sopgraph.logic.engine import (
    NOW,
    DecideError,
    Decision,
    NeedValue,
    OpenValues,
    Trace,
    engine_for,
    validate_value,
)

_FAILURES = (DecideError, TypeError, ValueError, OverflowError, AttributeError, RecursionError, ArithmeticError)


@dataclass(slots=True)
class Need:
    """The run reads a value it was not given: `variable` (a field or system variable) or, for an
    observed variable, its `look`-th look (1-based; `None` otherwise), first read at `stage`. A look
    is the value *as the observing stage saw it on entry*."""

    variable: str
    look: int | None
    stage: str | None

    def record(self) -> dict[str, Any]:
        """The JSON object `sop step` writes for this event."""
        out: dict[str, Any] = {"need": self.variable}
        if self.look is not None:
            out["look"] = self.look
        out["stage"] = self.stage
        return out


@dataclass(slots=True)
class Act:
    """An action carried out, with its arguments as reported (`final`: the action that ends the run)."""

    action: str
    args: dict[str, Any]
    final: bool = False

    def record(self) -> dict[str, Any]:
        return {"act": self.action, "args": self.args, "final": self.final}


@dataclass(slots=True)
class End:
    """The run is over: the decision `decide` gives for the values the session was given."""

    decision: Decision

    def record(self) -> dict[str, Any]:
        d = self.decision
        return {"end": {"path": d.path, "finals": d.finals, "actions": d.actions}}


Event = Need | Act | End


class Session:
    """One run of a procedure (see the module docstring). Not thread-safe; cheap to create."""

    def __init__(self, scenario: ir.Scenario, values: Mapping[str, Any] | None = None, now: Any = None,
                 complete: bool = False):
        self.scenario = scenario
        self._engine = engine_for(scenario)
        self._checks = _input_checks(self._engine)
        self._values: Mapping[str, Any]
        if complete:  # nothing will be asked: the values are read as given (no copy), as `decide` reads them
            given: Mapping[str, Any] = values if values is not None else {}
            if now is not None and NOW in scenario.variables and given.get(NOW) is None:
                given = {**given, NOW: now}
            self._values = given
        else:
            self._values = opened = OpenValues()
            for name, value in (values or {}).items():
                var = scenario.variables.get(name)
                opened[name] = list(value) if var is not None and var.observed and isinstance(
                    value, (list, tuple)) else value
            if now is not None and NOW in scenario.variables:
                opened.setdefault(NOW, now)  # the run's own `now` wins
        self._steps: Generator[Any, None, Trace] = self._closed() if complete else self._engine.steps(self._values)
        self._interpreting = False  # the reference interpreter took over (after a failure of the generated code)
        self._done = 0  # actions on the way reported so far
        self._skip = 0  # actions a replay from the start passes over (already reported)
        self._queue: list[Event] = []
        self._end: End | None = None
        self._error: DecideError | None = None
        self.need: Need | None = None  # the request waiting for an answer, if any

    @property
    def values(self) -> dict[str, Any]:
        """What the session has been given (observed variables: the list of looks so far)."""
        return dict(self._values)

    @property
    def ended(self) -> bool:
        return self._end is not None or self._error is not None

    def __iter__(self) -> Iterator[Event]:
        """Events up to and including `End` (a `Need` left unanswered is asked again)."""
        while True:
            event = self.next()
            yield event
            if event.__class__ is End:
                return

    def next(self) -> Event:
        """Advance to the next event. After `End` it returns `End` again; after a failure it raises
        the same `DecideError` again."""
        if self._queue or self._end is not None or self._error is not None:
            if self._queue:
                return self._queue.pop(0)
            if self._end is not None:
                return self._end
            raise self._error  # type: ignore[misc]
        while True:
            try:
                item = next(self._steps)
            except StopIteration as stop:
                return self._finish(stop.value)
            except _FAILURES as exc:
                self._fail(exc)
                continue
            if item.__class__ is NeedValue:
                need = self.need = Need(item.variable, item.look or None, item.stage)
                return need
            self.need = None
            self._done += 1
            if self._skip:
                self._skip -= 1
                continue
            return Act(item["name"], dict(item["args"]))

    def _closed(self) -> Generator[Any, None, Trace]:
        """The run on values that are all there is: the compiled decision (with its own fallback to
        the interpreter for precise errors), its actions reported in order."""
        path, finals, actions = self._engine.decide_trace_raw(self._values)
        yield from actions[:-1]
        return path, finals, actions

    def _fail(self, exc: Exception) -> None:
        """The generated code failed (a bad value, or something only the interpreter settles): go on
        with the reference interpreter from the start on the same values, passing over the actions
        already reported (the two forms agree on every event), so a failure is the one `decide`
        reports. A failure of the interpreter ends the run."""
        if self._interpreting or self._values.__class__ is not OpenValues:
            self._error = exc if isinstance(exc, DecideError) else DecideError(f"cannot evaluate: {exc}")
            raise self._error from None
        self._interpreting = True
        self._restart()

    def _restart(self) -> None:
        """Run again from the start on the values known now, passing over what was reported."""
        self._steps = (self._engine.walk if self._interpreting else self._engine.steps)(self._values)
        self._skip, self._done = self._done, 0

    def _finish(self, result: Trace) -> Event:
        path, finals, actions = result
        self.need = None
        self._end = End(Decision(path=list(path), finals=dict(finals),
                                 actions=[{"name": a["name"], "args": dict(a["args"])} for a in actions]))
        last = actions[-1]
        self._queue.append(self._end)
        return Act(last["name"], dict(last["args"]), final=True)

    def close(self) -> None:
        """No more values will come: from now on a value not given is *missing* (its default, or
        the error `decide` gives), so the run goes to its end without asking."""
        if self.ended or self._values.__class__ is not OpenValues:
            return
        self._values = dict(self._values)  # a plain mapping: nothing is asked
        self.need = None
        if not self._interpreting:
            self._steps, self._skip, self._done = self._closed(), self._done, 0
        else:
            self._restart()

    def run(self) -> Decision:
        """Run to the end on what is known (`close`, then every event): what `decide` returns."""
        self.close()
        while True:
            event = self.next()
            if event.__class__ is End:
                return event.decision

    def provide(self, name: str, value: Any) -> None:
        """Give the value of `name`: a field or system value, or a look of an observed variable (the
        look asked for; given before it is asked, the next one). `None` means missing. A value outside the variable's
        domain raises DecideError and is not taken (the request stays open)."""
        check = self._checks.get(name)
        if check is None:
            var = self.scenario.variables.get(name)
            if var is not None:
                raise DecideError(f"`{name}` is a derived variable: the engine computes it", name)
            hint = did_you_mean(name, list(self._checks))
            raise DecideError(f"`{name}` is not a field or system variable of `{self.scenario.name}`"
                              + (f" ({hint})" if hint else ""), name)
        if self._end is not None or self._error is not None or self._values.__class__ is not OpenValues:
            raise DecideError("the run is over (or closed): it takes no more values", name)
        var, domain = check
        if value is not None and not (domain is not None and value.__class__ is str and value in domain):
            validate_value(var, value)
        if var.observed:
            looks = self._values.get(name)
            if not isinstance(looks, list):
                looks = self._values[name] = []
            need = self.need
            if need is not None and need.variable == name and need.look is not None:
                # the look asked for: looks the run took but never read were never asked (never read later)
                looks.extend([None] * (need.look - 1 - len(looks)))
                del looks[need.look - 1:]
            looks.append(value)
        else:
            if name in self._values and self._values[name] is not None and self._values[name] != value:
                raise DecideError(f"`{name}` is already {self._values[name]!r}: a field or system value is "
                                  "given once (only the looks of an observed variable change)", name)
            self._values[name] = value


_CHECKS: weakref.WeakKeyDictionary[Any, dict[str, tuple[ir.Variable, frozenset[Any] | None]]] = (
    weakref.WeakKeyDictionary())


def _input_checks(engine: Any) -> dict[str, tuple[ir.Variable, frozenset[Any] | None]]:
    """Per field and system variable of the engine's scenario: the variable and, for an enum, its
    values (a provided value in it needs no further test); built once per engine."""
    checks = _CHECKS.get(engine)
    if checks is None:
        checks = _CHECKS[engine] = {
            name: (var, frozenset(var.type.values) if isinstance(var.type, ir.EnumType) else None)
            for name, var in engine.scenario.variables.items() if var.role != "derived"}
    return checks


def start(scenario: ir.Scenario, values: Mapping[str, Any] | None = None, now: Any = None,
          complete: bool = False) -> Session:
    """Begin a run of `scenario` with the values known so far (`now`: the reference time, used when
    `values` has none). Observed variables take the list of their looks known so far. `complete`:
    these are all the values there are (a value not given is missing; nothing is asked)."""
    return Session(scenario, values, now, complete)


def decide(scenario: ir.Scenario, values: Mapping[str, Any], now: Any = None) -> Decision:
    """Reference path, finals and actions for one assignment of values: a session run to its end on
    exactly these values."""
    return Session(scenario, values, now, complete=True).run()
