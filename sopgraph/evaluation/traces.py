"""Action-trace scores: the actions an agent took against the procedure's reference trace.

Why: benchmarks of SOP-following agents (tau2-bench, JourneyBench) score the sequence of tool calls,
not only the final answer. Per dialogue (docs/metrics.md, "Trace scores"):

- agent trace: the tool calls of an agent acting through tools, in order (every turn); for a SAGE
  agent, the final turn's Action with its outputs as arguments;
- reference trace: `reference_trace` — the one place that decides it (today the final action along
  the case's reference path with the outputs it assigns; when the engine's decision carries its
  own action list, only this function changes);
- precision = matched / |agent|, recall = matched / |reference| (multiset match on names), order =
  LCS(agent names, reference names) / |reference|, journey coverage = |stages the agent's paths
  visited ∩ reference stages| / |reference stages|, tau2 pass = every reference action called with
  the right arguments and no prohibited action called.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sopgraph.language import ir
from sopgraph.records import Case
from sopgraph.simulation.agents import action_outputs

Call = Mapping[str, Any]  # {"name": str, "args": dict}


def reference_trace(scenario: ir.Scenario, case: Case, params: Mapping[str, list[str]] | None = None
                    ) -> list[dict[str, Any]]:
    """The ordered actions the procedure requires for this case, with their arguments."""
    action = case.expected_finals.get("Action")
    if action is None:
        return []
    names = (params or action_outputs(scenario)).get(str(action), [])
    return [{"name": str(action), "args": {k: case.expected_finals[k] for k in names if k in case.expected_finals}}]


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
    ok = not any(n in prohibited for n in a_names)
    for want in ref:
        args = want.get("args") or {}
        if not any(str(c.get("name")) == want["name"] and all(same((c.get("args") or {}).get(k), v)
                                                               for k, v in args.items()) for c in agent):
            ok = False
            break
    return precision, recall, order, ok


def journey_coverage(visited: set[str], ref_path: Sequence[str]) -> float:
    """Share of the reference path's stages the agent's reported paths visited."""
    ref = set(ref_path)
    return len(ref & visited) / len(ref) if ref else float("nan")
