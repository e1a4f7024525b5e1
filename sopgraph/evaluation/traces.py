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

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sopgraph.language import ir
from sopgraph.logic.engine import DecideError, engine_for
from sopgraph.records import Case
from sopgraph.simulation.agents import action_outputs

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
    fits = [[j for j, c in enumerate(agent) if str(c.get("name")) == str(want.get("name")) and all(
        same((c.get("args") or {}).get(k), v) for k, v in (want.get("args") or {}).items())] for want in ref]
    owner: dict[int, int] = {}

    def place(i: int, seen: set[int]) -> bool:
        for j in fits[i]:
            if j not in seen:
                seen.add(j)
                if j not in owner or place(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(place(i, set()) for i in range(len(ref)))


def journey_coverage(visited: set[str], ref_path: Sequence[str]) -> float:
    """Share of the reference path's stages the agent's reported paths visited."""
    ref = set(ref_path)
    return len(ref & visited) / len(ref) if ref else float("nan")
