"""Output ranges: can a leaf's assignment give an output a value outside its declared range?

`output Fee: float[0..)` with `do PartialRefund { Fee = NightlyRate - 500 }` type-checks (a number
for a number), but a nightly rate below 500 makes the fee negative. The engine refuses such a value
when it decides (see `engine.output_problem`); this pass finds it statically: for every feasible path
that ends in a leaf assigning a bounded numeric output, it constrains the path's region with "the
value is below the lower bound, or above the upper bound" and looks for a witness. A witness is
reported only after the reference engine has routed it along that very path and refused the output,
so a diagnostic is never a guess. The search is bounded (paths and engine runs); past the bounds it
says nothing more, and the decide-time check still holds. Past its CPU budget it says where it stopped
(I304: the stage, and the assignment it was checking), for the assignments from there on are unchecked.
"""

from __future__ import annotations

import json
from typing import Any

from sopgraph.language import ir
from sopgraph.language.diagnostics import Diagnostic, clip, error
from sopgraph.logic.budget import CHECK_CPU_BUDGET, CpuBudget, OutOfCpu, active, budget_of
from sopgraph.logic.engine import DecideError, Interpreter, interpret
from sopgraph.logic.formula import Formula
from sopgraph.logic.paths import explorer_for, trace

MAX_PATHS = 5_000  # feasible paths enumerated looking for leaves that set bounded outputs
MAX_CHECKS = 200  # engine runs to verify witnesses
_LISTING = "listing the paths that end in a leaf setting a checked output"


def _outside(value: Any, otype: ir.NumType | ir.ListType) -> ir.Expr | None:
    """The condition "value is outside otype's interval", or None if the interval is unbounded."""
    if isinstance(otype, ir.ListType):
        return _outside_length(value, otype)
    parts: list[ir.Expr] = []
    if otype.lo is not None:
        parts.append(ir.Compare(op="<=" if otype.lo_open else "<", left=value, right=ir.Lit(value=otype.lo)))
    if otype.hi is not None:
        parts.append(ir.Compare(op=">=" if otype.hi_open else ">", left=value, right=ir.Lit(value=otype.hi)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else ir.BoolOp(op="or", operands=parts)


def _outside_length(value: Any, otype: ir.ListType) -> ir.Expr | None:
    """For a list output set to `[A, B when C, …]` (values, each kept when its condition holds): "the number of
    distinct values kept is outside the declared length", or None when no choice of conditions can be."""
    if not isinstance(value, ir.ListLit):
        return None
    kept: dict[Any, list[Any]] = {}  # each distinct value -> the conditions that keep it
    for item, cond in zip(value.items, value.conds, strict=True):
        if not isinstance(item, ir.Lit):
            return None
        kept.setdefault(item.value, []).append(cond)
    held = [conds[0] if len(conds) == 1 else ir.BoolOp(op="or", operands=conds) for conds in kept.values()]
    count = ir.Call(func="count", args=held) if held else ir.Lit(value=0)
    parts: list[ir.Expr] = []
    if len(held) > otype.max_len:
        parts.append(ir.Compare(op=">", left=count, right=ir.Lit(value=otype.max_len)))
    if otype.min_len > 0:
        parts.append(ir.Compare(op="<", left=count, right=ir.Lit(value=otype.min_len)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else ir.BoolOp(op="or", operands=parts)


def _checked(otype: Any) -> bool:
    """A bounded numeric output, or a list output (its length is bounded)."""
    if isinstance(otype, ir.ListType):
        return isinstance(otype.item, ir.EnumType)
    return isinstance(otype, ir.NumType) and (otype.lo is not None or otype.hi is not None)


def has_checked_outputs(scenario: ir.Scenario) -> bool:
    """Whether the program has an output this pass checks (else there is nothing to search)."""
    return any(_checked(o.type) for o in scenario.outputs.values())


def _checked_leaves(scenario: ir.Scenario) -> dict[tuple[str, int], list[tuple[ir.OutputAssign, ir.Output]]]:
    """(stage id, branch index) -> the assignments of bounded numeric outputs (and list outputs) that are not
    literals (literals are checked by the type pass)."""
    out: dict[tuple[str, int], list[tuple[ir.OutputAssign, ir.Output]]] = {}
    if not has_checked_outputs(scenario):
        return out  # no bounded numeric output: no assignment to check, no walk over every branch
    for sid, stage in scenario.stages.items():
        for bi, branch in enumerate(stage.branches):
            for assign in branch.target.outputs:
                output = scenario.outputs.get(assign.name)
                if output is None or isinstance(assign.value, ir.Lit):
                    continue
                if _checked(output.type):
                    out.setdefault((sid, bi), []).append((assign, output))
    return out


def output_range_diagnostics(scenario: ir.Scenario, *,
                             cpu_budget: float | CpuBudget = CHECK_CPU_BUDGET) -> list[Diagnostic]:
    """E204 for each assignment that some feasible path can drive outside its output's range; past
    `cpu_budget` (CPU seconds or a command's `CpuBudget`), the ones found so far and an I304 note."""
    leaves = _checked_leaves(scenario)
    if not leaves:
        return []
    search = _Search(scenario, leaves, budget_of(cpu_budget, CHECK_CPU_BUDGET))
    try:
        with active(search.clock):
            search.run()
    except OutOfCpu:
        search.out_of_time = True
    except (RecursionError, DecideError):
        return []
    return search.found + search.note()


class _Search:
    """The walk over the feasible paths that end in a leaf setting a checked output (see the module)."""

    def __init__(self, scenario: ir.Scenario,
                 leaves: dict[tuple[str, int], list[tuple[ir.OutputAssign, ir.Output]]], clock: CpuBudget):
        self.scenario = scenario
        self.leaves = leaves
        self.clock = clock
        self.ex = explorer_for(scenario)
        self.found: list[Diagnostic] = []
        self.out_of_time = False
        self.at: int | None = None  # the stage of the path (its last) being looked at
        self.asking = _LISTING

    def note(self) -> list[Diagnostic]:
        """I304 when the CPU budget cut the search short: where (the stage) and on what."""
        if not self.out_of_time:
            return []
        ex = self.ex
        stage = ex.stage_objs[self.at if self.at is not None else (ex.start or 0)] if ex.stage_objs else None
        where = f" at stage `{stage.id}`" if stage is not None else ""
        return [Diagnostic(
            code="I304", severity="info",
            message=f"output-range check incomplete: it reached its CPU budget ({self.clock.describe()}){where} "
                    f"while {self.asking}; assignments from there on were not checked against their outputs' ranges",
            span=stage.span if stage is not None else self.scenario.span,
            hint="the engine still refuses an output outside its range when it decides; raise --cpu-budget "
                 "to check them statically")]

    def run(self) -> None:
        ex, leaves = self.ex, self.leaves
        region_of = ex.prefix_regions()
        formulas: dict[int, Formula] = {}
        done: set[int] = set()  # ids of assignments already reported
        checks = MAX_CHECKS
        wanted = sum(len(v) for v in leaves.values())
        for n, (stages, branches, _action) in enumerate(ex.iter_raw()):
            if n >= MAX_PATHS or checks <= 0 or len(done) >= wanted:
                break
            if self.clock.out():
                self.out_of_time = True
                return
            self.at = stages[-1]
            sid = ex.ids[stages[-1]]
            todo = [(a, o) for a, o in leaves.get((sid, branches[-1]), []) if id(a) not in done]
            if not todo:
                continue
            region = region_of(stages, branches)
            stage_ids = [ex.ids[s] for s in stages]
            checks = self._leaf(todo, region, stage_ids, list(branches), formulas, done, checks)
            self.asking = _LISTING

    def _leaf(self, todo: list[tuple[ir.OutputAssign, ir.Output]], region: Any, stage_ids: list[str],
              branches: list[int], formulas: dict[int, Formula], done: set[int], checks: int) -> int:
        """Look for values that drive each assignment of one leaf outside its range; the checks left."""
        sp, scenario, found = self.ex.sp, self.scenario, self.found
        for assign, output in todo:
            self.asking = f"looking for values that drive `{assign.name} = {clip(ir.show(assign.value))}` outside its range"
            f = formulas.get(id(assign))
            if f is None:
                bad = _outside(assign.value, output.type)  # type: ignore[arg-type]
                if bad is None:
                    continue
                f = formulas[id(assign)] = sp.formula(bad, True)
            for box in sp.constrain_region(region, f)[:4]:
                w = sp.witness(box, "representative") or sp.witness(box, "boundary")
                if w is None:
                    continue
                checks -= 1
                value = _refused(scenario, w, stage_ids, list(branches), output.name)
                if value is not None:
                    done.add(id(assign))
                    found.append(_diagnostic(assign, output, w, value, stage_ids))
                    break
                if checks <= 0:
                    break
        return checks


def _refused(scenario: ir.Scenario, values: dict[str, Any], stages: list[str], branches: list[int],
             output: str) -> Any:
    """The out-of-range value if the engine routes `values` along this path and refuses `output`."""
    try:
        if trace(scenario, values) != (stages, branches):
            return None
    except (DecideError, TypeError, ValueError, ArithmeticError):
        return None
    try:
        interpret(scenario, values)
    except DecideError as exc:
        return _value_of(scenario, values, stages, branches, output) if exc.output == output else None
    except (TypeError, ValueError, ArithmeticError):
        return None
    return None


def _value_of(scenario: ir.Scenario, values: dict[str, Any], stages: list[str], branches: list[int],
              output: str) -> Any:
    """The value the leaf computes for `output` (for the message; the evaluator has no range check)."""
    target = scenario.stages[stages[-1]].branches[branches[-1]].target
    expr = next(a.value for a in target.outputs if a.name == output)
    return Interpreter(scenario, values).eval(expr)


def _diagnostic(assign: ir.OutputAssign, output: ir.Output, witness: dict[str, Any], value: Any,
                stages: list[str]) -> Diagnostic:
    otype = output.type
    via = " -> ".join(stages if len(stages) <= 8 else [*stages[:3], "...", *stages[-4:]])
    if isinstance(otype, ir.ListType):
        n = len(set(value)) if isinstance(value, list) else 0
        return error(
            "E204", f"`{assign.name} = {clip(ir.show(assign.value))}` can hold {n} values, outside the {otype.min_len} to "
            f"{otype.max_len} of output `{output.name}`", assign.value.span if assign.value.span.line else assign.span,
            "make the conditions exclusive, or widen the declaration (`list[..N] of ...`)", witness=witness,
            notes=[f"with these values the engine computes {output.name} = {json.dumps(value)} and refuses it "
                   f"(via {via})"])
    assert isinstance(otype, ir.NumType)
    shown = ir.show_value(value) if isinstance(value, (int, float)) else repr(value)
    return error(
        "E204",
        f"`{assign.name} = {clip(ir.show(assign.value))}` can be outside the range {otype.describe()} "
        f"of output `{output.name}`",
        assign.value.span if assign.value.span.line else assign.span,
        "clamp the value (e.g. `max(0, ...)`), add a branch for these values, or widen the declaration",
        witness=witness,
        notes=[f"with these values the engine computes {output.name} = {shown} and refuses it (via {via})"],
    )


__all__ = ["MAX_CHECKS", "MAX_PATHS", "has_checked_outputs", "output_range_diagnostics"]
