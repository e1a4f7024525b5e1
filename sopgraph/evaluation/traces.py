"""Action-trace scores: the actions an agent took against the procedure's reference trace.

Why: benchmarks of SOP-following agents (tau2-bench, JourneyBench) score the sequence of tool calls,
not only the final answer. Per dialogue (docs/metrics.md, "Trace scores"):

- agent trace: the tool calls of an agent acting through tools, in order (every turn); for a SAGE
  agent, the `actions` its final turn reports (procedures), else its final Action, the final action
  carrying the outputs the reply assigns as arguments (`sage_trace`);
- reference trace: `reference_trace` — the engine's action trace (`Decision.actions`: every action
  the procedure carries out, in order, with its arguments, the final action last) for the values the
  dialogue is scored against (`score._trace_columns`: the case's truth + system state + observation
  sequences, or the final turn's consensus labels + system state under `pass_reference=consensus`),
  the final action also carrying the outputs its branch assigns (`do SettleReturn { Fee = LateFee }`);
- precision = matched / |agent|, recall = matched / |reference| (multiset match on names), order =
  LCS(agent names, reference names) / |reference|, journey coverage = |stages the agent's paths
  visited ∩ reference stages| / |reference stages|, tau2 pass = every reference action called with
  the right arguments (each call matching at most one reference action) and no prohibited action.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sopgraph.language import ir
from sopgraph.logic.engine import DecideError, Decision, engine_for
from sopgraph.logic.session import End, Need, start
from sopgraph.records import Case
from sopgraph.simulation.agents import action_outputs
from sopgraph.simulation.backend import Backend, BackendSpec
from sopgraph.simulation.environment import EnvError, EnvSpec, backend_for, replay_state
from sopgraph.simulation.gateway import InfraFailure

Call = Mapping[str, Any]  # {"name": str, "args": dict}


def with_final_outputs(actions: Sequence[Call], finals: Mapping[str, Any], params: Mapping[str, list[str]]
                       ) -> list[dict[str, Any]]:
    """`actions` with the final Action's assigned outputs (`params[action]`, from `finals`) added to its
    arguments: to the last entry when it is that action, else as a new last entry (a SAGE reply that
    lists the steps but not yet the final action). Why: a branch `do A { Fee = X }` gives A a `Fee`,
    which the engine's trace does not carry but a tool call (its schema) and a SAGE reply's finals do."""
    out: list[dict[str, Any]] = [{"name": str(a.get("name")), "args": dict(a.get("args") or {})} for a in actions]
    action = finals.get("Action")
    if action is None:
        return out
    extra = {k: finals[k] for k in params.get(str(action), []) if k in finals}
    if not out or out[-1]["name"] != str(action):
        out.append({"name": str(action), "args": {}})
    out[-1]["args"] = {**extra, **out[-1]["args"]}
    return out


def reference_trace(scenario: ir.Scenario, values: Mapping[str, Any],
                    params: Mapping[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """The ordered actions the procedure carries out for `values` (truth or labels, system state,
    observation sequences), with their arguments: the engine's trace, the final action with its
    assigned outputs. Raises DecideError when the values do not decide."""
    _path, finals, actions = engine_for(scenario).decide_trace_raw({k: v for k, v in values.items() if v is not None})
    return with_final_outputs(actions, finals, params if params is not None else action_outputs(scenario))


def case_reference_trace(scenario: ir.Scenario, case: Case, params: Mapping[str, list[str]] | None = None
                         ) -> list[dict[str, Any]]:
    """The reference trace of a case: for its truth and system state; when these do not decide (a case
    the SOP has since changed under), the trace it recorded (`expected_actions`), else its final action."""
    params = params if params is not None else action_outputs(scenario)
    try:
        return reference_trace(scenario, {**case.truth, **case.system}, params)
    except DecideError:
        return with_final_outputs(case.expected_actions or [], case.expected_finals, params)


def sage_trace(final_output: Mapping[str, Any] | None, params: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    """The trace of an agent answering in SAGE JSON, from its final turn's output: the `actions` it
    reports having carried out (procedures) with its final Action, else the final Action alone."""
    if not final_output:
        return []
    finals = final_output.get("finals") or {}
    reported = final_output.get("actions") or []
    if finals.get("Action") is None and not reported:
        return []
    return with_final_outputs([a for a in reported if isinstance(a, Mapping)], finals, params)


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    """Longest common subsequence length (traces are short)."""
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def trace_scores(agent: Sequence[Call], ref: Sequence[Call], prohibited: frozenset[str] | set[str],
                 same: Callable[[Any, Any], bool]) -> tuple[float, float, float, bool]:
    """(precision, recall, order, tau2 pass) of one dialogue; NaN where the denominator is empty."""
    nan = float("nan")
    a_names = [str(c.get("name")) for c in agent]
    r_names = [str(c.get("name")) for c in ref]
    matched = sum((Counter(a_names) & Counter(r_names)).values())
    precision = matched / len(a_names) if a_names else nan
    recall = matched / len(r_names) if r_names else nan
    order = _lcs(a_names, r_names) / len(r_names) if r_names else nan
    forbidden = set(prohibited) - set(r_names)  # a risky step the reference itself takes is required
    ok = not any(n in forbidden for n in a_names) and _all_matched(agent, ref, same)
    return precision, recall, order, ok


def _all_matched(agent: Sequence[Call], ref: Sequence[Call], same: Callable[[Any, Any], bool]) -> bool:
    """Whether every reference action can be paired with its own call of that name whose arguments
    agree (a bipartite matching: an action required twice needs two calls)."""
    return _matching(agent, ref, same) == len(ref)


def journey_coverage(visited: set[str], ref_path: Sequence[str]) -> float:
    """Share of the reference path's stages the agent's reported paths visited."""
    ref = set(ref_path)
    return len(ref & visited) / len(ref) if ref else float("nan")


# ---------------------------------------------------------------------------------------------
# Procedures stepped against a world (docs/metrics.md, "Procedure steps")

MAX_STEP_EVENTS = 100_000  # a session that neither ends nor fails within this many events is refused


@dataclass(frozen=True)
class Divergence:
    """Where an agent first left the procedure: the 1-based step, the step the session expected there
    (None: the procedure had ended) and the call the agent made (None: it stopped)."""

    step: int
    expected: dict[str, Any] | None
    done: dict[str, Any] | None

    def describe(self) -> str:
        return (f"step {self.step}: expected {_call_text(self.expected, 'the end')}, "
                f"done {_call_text(self.done, 'nothing')}")

    def record(self) -> dict[str, Any]:
        return {"step": self.step, "expected": self.expected, "done": self.done}


def _call_text(call: Mapping[str, Any] | None, none: str) -> str:
    if call is None:
        return none
    args = ", ".join(f"{k}={v!r}" for k, v in (call.get("args") or {}).items())
    return f"{call.get('name')}({args})"


@dataclass(frozen=True)
class StepScores:
    """One dialogue's procedure-step scores against the online reference (NaN where undefined)."""

    reference: list[dict[str, Any]]  # the steps the session took, given the world the agent's calls made
    recall: float
    precision: float
    order: float
    divergence: Divergence | None


def fits(call: Call, want: Call, same: Callable[[Any, Any], bool]) -> bool:
    """The agent's call is the step wanted: same name, every argument the step has agreeing."""
    if str(call.get("name")) != str(want.get("name")):
        return False
    args = call.get("args") or {}
    return all(same(args.get(k), v) for k, v in (want.get("args") or {}).items())


def step_session(scenario: ir.Scenario, truth: Mapping[str, Any], world: Any,
                 follow: Sequence[Call] | None, same: Callable[[Any, Any], bool],
                 params: Mapping[str, list[str]] | None = None) -> tuple[list[dict[str, Any]], Divergence | None]:
    """Step the engine session against `world` (a backend: `call(name, args)` answers a lookup
    `{"name": var}` and carries out an action): fields from `truth`, system and observed values
    asked of the world when the session needs them.

    `follow=None`: the session's own actions change the world (the reference run). Otherwise the
    agent's calls do: the k-th step the session takes is compared with the agent's k-th call, and the
    agent's call (not the step) is carried out, so each next step is what the procedure says given
    what the agent did to the world. Returns the session's steps (the final one with the outputs its
    branch assigns) and the first divergence. DecideError when the values do not decide."""
    steps, divergence, _ = _step(scenario, truth, world, follow, same, params)
    return steps, divergence


class _Waits(Exception):  # noqa: N818 - not an error: the run stopped where it needs a value not shown yet
    def __init__(self, stage: str | None, steps: list[dict[str, Any]]):
        super().__init__(stage)
        self.stage = stage
        self.steps = steps


def _step(scenario: ir.Scenario, truth: Mapping[str, Any], world: Any, follow: Sequence[Call] | None,
          same: Callable[[Any, Any], bool], params: Mapping[str, list[str]] | None,
          wait_for: frozenset[str] = frozenset()) -> tuple[list[dict[str, Any]], Divergence | None, Decision | None]:
    """`step_session`, also returning the session's decision (path, finals) when it reached its end.
    `wait_for`: fields not shown yet; the first one the run needs raises `_Waits` (its stage, the steps so far)."""
    params = params if params is not None else action_outputs(scenario)
    lookup = world.spec.lookup
    session = start(scenario, {k: v for k, v in truth.items()
                               if v is not None and k in scenario.variables
                               and scenario.variables[k].role == "field"})
    steps: list[dict[str, Any]] = []
    divergence: Divergence | None = None
    decision: Decision | None = None
    for _ in range(MAX_STEP_EVENTS):
        event = session.next()
        if isinstance(event, Need):
            var = scenario.variables[event.variable]
            if event.variable in wait_for:
                raise _Waits(event.stage, steps)
            value = (truth.get(event.variable) if var.role == "field"
                     else world.call(lookup, {"name": event.variable})["value"])
            session.provide(event.variable, value)
            continue
        if isinstance(event, End):
            decision = event.decision
            break
        step: dict[str, Any] = {"name": event.action, "args": dict(event.args)}
        if event.final:
            end = session.next()
            assert isinstance(end, End)
            decision = end.decision
            step = with_final_outputs([step], decision.finals, params)[-1]
        steps.append(step)
        if follow is None:
            world.call(step["name"], step["args"])
            continue
        k = len(steps)
        done = follow[k - 1] if k <= len(follow) else None
        if divergence is None and (done is None or not fits(done, step, same)):
            divergence = Divergence(k, step, None if done is None else _plain(done))
        if done is not None:
            world.call(str(done.get("name")), dict(done.get("args") or {}))
        if event.final:
            break
    else:
        raise DecideError(f"the procedure took more than {MAX_STEP_EVENTS} events without ending")
    if follow is not None and len(follow) > len(steps):
        if divergence is None:
            divergence = Divergence(len(steps) + 1, None, _plain(follow[len(steps)]))
        for done in follow[len(steps):]:
            world.call(str(done.get("name")), dict(done.get("args") or {}))
    return steps, divergence, decision


def _plain(call: Call) -> dict[str, Any]:
    return {"name": str(call.get("name")), "args": dict(call.get("args") or {})}


def step_scores(agent: Sequence[Call], steps: Sequence[Call], divergence: Divergence | None,
                same: Callable[[Any, Any], bool]) -> StepScores:
    """Recall and precision of the steps with their arguments (each call matching at most one step),
    order (longest common subsequence of calls and steps / steps), and the first divergence."""
    nan = float("nan")
    matched = _matching(agent, steps, same)
    recall = matched / len(steps) if steps else nan
    precision = matched / len(agent) if agent else nan
    order = _lcs_by(agent, steps, lambda a, b: fits(a, b, same)) / len(steps) if steps else nan
    return StepScores([dict(s) for s in steps], recall, precision, order, divergence)


def _matching(agent: Sequence[Call], ref: Sequence[Call], same: Callable[[Any, Any], bool]) -> int:
    """Size of a maximum matching of reference steps to agent calls that fit them."""
    fits_of = [[j for j, c in enumerate(agent) if fits(c, want, same)] for want in ref]
    owner: dict[int, int] = {}

    def place(i: int, seen: set[int]) -> bool:
        for j in fits_of[i]:
            if j not in seen:
                seen.add(j)
                if j not in owner or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return sum(1 for i in range(len(ref)) if place(i, set()))


def _lcs_by(a: Sequence[Call], b: Sequence[Call], eq: Callable[[Call, Call], bool]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if eq(x, y) else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def final_actions(scenario: ir.Scenario) -> frozenset[str]:
    """The actions that can end the procedure (some branch's final `do X`); the others are only steps."""
    return frozenset(b.target.action for s in scenario.stages.values() for b in s.branches
                     if b.target.kind == "action" and b.target.action is not None)


def tool_finals(calls: Sequence[Call], finals: frozenset[str]) -> dict[str, Any]:
    """A tool agent's answer on one turn: its last call of an action that can end the procedure
    (`Action` = its name, the outputs = its arguments), `{}` when it only took steps (pending)."""
    for call in reversed(calls):
        if str(call.get("name")) in finals:
            return {"Action": str(call.get("name")), **dict(call.get("args") or {})}
    return {}


STEP_KEYS = ("step_recall", "step_precision", "step_order", "steps_followed", "first_divergence", "end_state")


class ProcedureScorer:
    """Scores tool agents' calls on one scenario as procedure steps (docs/metrics.md, "Procedure steps"):
    the online reference stepped against the world the agent's calls changed — the case-scripted
    backend, or a fresh environment when the run has one — and, with an environment, the end state of
    the agent's calls against that of the reference run's, both replayed on fresh copies."""

    def __init__(self, scenario: ir.Scenario, env: EnvSpec | None, same: Callable[[Any, Any], bool]):
        self.scenario, self.env, self.same = scenario, env, same
        self.spec = BackendSpec.of(scenario)
        self.params = action_outputs(scenario)
        self._refs: dict[Any, tuple[list[dict[str, Any]], Decision]] = {}  # (case id, fields) → steps, decision
        self._ref_states: dict[str, str] = {}  # case id → end state after its reference trace (replayed once)

    def _world(self, case: Case) -> Backend:
        try:
            return backend_for(self.spec, case, self.env)
        except InfraFailure as exc:
            raise EnvError(exc.message) from None

    def reference(self, case: Case) -> list[dict[str, Any]]:
        """The reference trace of a case against a fresh environment (the session's own actions change
        it); DecideError when the values do not decide, EnvError when the environment fails."""
        return self.decision(case)[0]

    def decision(self, case: Case, fields: Mapping[str, Any] | None = None) -> tuple[list[dict[str, Any]], Decision]:
        """The reference trace and the decision (path, finals) of the session stepped against a fresh
        world for the case, its fields from `fields` (judges' labels) or else the case's truth; memoised.
        DecideError when the values do not decide, EnvError when the environment fails."""
        truth = case.truth if fields is None else fields
        key = (case.id, None if fields is None else json.dumps(fields, sort_keys=True, default=str))
        if key not in self._refs:
            try:
                steps, _, decision = _step(self.scenario, truth, self._world(case), None, self.same, self.params)
            except InfraFailure as exc:
                raise EnvError(exc.message) from None
            if decision is None:  # (a session that ends always gives its decision)
                raise DecideError("the procedure did not reach its end")
            self._refs[key] = (steps, decision)
        return self._refs[key]

    def waiting(self, case: Case, fields: Mapping[str, Any], unshown: Sequence[str]
                ) -> tuple[tuple[str, ...], list[dict[str, Any]]] | None:
        """Where the session stepped against a fresh world on the judges' `fields` stops for one of the
        `unshown` fields: (the stages passed before that stage, the steps taken so far), or None when it
        needs none of them. The stages passed are read off the run on the case's truth for the unshown
        fields (the world answers the same up to there). DecideError / EnvError as `decision`."""
        try:
            _step(self.scenario, fields, self._world(case), None, self.same, self.params, frozenset(unshown))
            return None
        except _Waits as waits:
            _, decision = self.decision(case, {**{f: case.truth[f] for f in unshown if f in case.truth}, **fields})
            path = decision.path
            prefix = tuple(path[:path.index(waits.stage)]) if waits.stage in path else ()
            return prefix, waits.steps
        except InfraFailure as exc:
            raise EnvError(exc.message) from None

    def score(self, case: Case, agent: Sequence[Call]) -> tuple[dict[str, float], Divergence | None]:
        """The step metrics of one dialogue (NaN where undefined: values that do not decide)."""
        nan = float("nan")
        out = dict.fromkeys(STEP_KEYS, nan)
        try:
            steps, divergence = step_session(self.scenario, case.truth, self._world(case), agent, self.same,
                                             self.params)
            if self.env is not None:
                if case.id not in self._ref_states:
                    self._ref_states[case.id] = replay_state(self.env, case, self.reference(case))
                out["end_state"] = float(replay_state(self.env, case, agent) == self._ref_states[case.id])
        except DecideError:
            return out, None
        except InfraFailure as exc:
            raise EnvError(exc.message) from None
        s = step_scores(agent, steps, divergence, self.same)
        out.update(step_recall=s.recall, step_precision=s.precision, step_order=s.order,
                   steps_followed=float(divergence is None),
                   first_divergence=nan if divergence is None else float(divergence.step))
        return out, divergence
