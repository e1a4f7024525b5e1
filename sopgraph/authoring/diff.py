"""`sop diff`: what a change to an SOP changes.

Three answers: the feasible paths added, removed and changed (by stage sequence and branch labels);
concrete inputs on which the two versions decide differently (an equivalence check with witnesses);
and, given test cases, the cases whose reference path or finals change.

The equivalence check walks the product of the two programs over one *joint* variable space: the
inputs of both versions (a variable declared in both with different domains keeps only the values
valid in both), plus each version's `let`s under a private name. From the entry of OLD, every branch
narrows the region (via the constraint domain); at each OLD leaf the walk continues through NEW
inside that region; a NEW leaf whose outcome differs from the OLD leaf's, in a region not proven
empty, yields a witness, which is only reported once the engine has decided it with both versions
and they disagree. The walk is bounded (`budget` regions); what it could not settle is reported.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.language.compile import reads as compile_reads
from sopgraph.language.diagnostics import text_names
from sopgraph.language.fmt import show_expr
from sopgraph.logic import domain
from sopgraph.logic.budget import CpuBudget, OutOfCpu, active, budget_of
from sopgraph.logic.engine import DecideError, Decision, interpret
from sopgraph.logic.lower import analysis_form, needs_analysis_form
from sopgraph.logic.paths import iter_paths, used_looks
from sopgraph.logic.unroll import Unrolled, UnrollError
from sopgraph.records import Case

DEFAULT_BUDGET = 20_000  # regions explored by the product walk
PATH_LIMIT = 5_000  # paths listed per version
RETRY_BUDGET = 2_000  # regions of the second, lowered comparison (lists and records)
MAX_WITNESSES = 20
CPU_BUDGET = 20.0  # CPU seconds of the whole comparison (paths, product walk, witnesses) before it answers


class DiffError(Error):
    """The two versions cannot be compared (a message for the user)."""


class PathChange(BaseModel):
    key: str  # stages and branch labels, e.g. "step1 -> step2 [Change] -> step4 [NoContract]"
    old_key: str | None = None  # for a changed path whose labels changed: its old form
    old: str | None = None  # outcome, e.g. "do ChangeOrder"
    new: str | None = None


class Witness(BaseModel):
    values: dict[str, Any]
    old_path: list[str]
    old_finals: dict[str, Any]
    new_path: list[str]
    new_finals: dict[str, Any]
    # the action traces (`Decision.actions`: steps on the way, then the final action, with argument values)
    old_actions: list[dict[str, Any]] = Field(default_factory=list)
    new_actions: list[dict[str, Any]] = Field(default_factory=list)


class CaseChange(BaseModel):
    id: str
    old_path: list[str]
    new_path: list[str] | None
    old_finals: dict[str, Any]
    new_finals: dict[str, Any] | None
    error: str | None = None
    old_actions: list[dict[str, Any]] | None = None  # only when the case records its trace and it changes
    new_actions: list[dict[str, Any]] | None = None


class DiffReport(BaseModel):
    old: str
    new: str
    paths_old: int
    paths_new: int
    added: list[PathChange] = Field(default_factory=list)
    removed: list[PathChange] = Field(default_factory=list)
    changed: list[PathChange] = Field(default_factory=list)
    paths_truncated: bool = False
    witnesses: list[Witness] = Field(default_factory=list)
    text_inputs: list[str] = Field(default_factory=list)  # `string` inputs: quoted in the witnesses' text
    differing_regions: int = 0
    unproven: list[str] = Field(default_factory=list)  # what the bounded check could not settle
    notes: list[str] = Field(default_factory=list)
    compared: bool = True  # False when no input is valid for both versions: nothing could be compared
    cases_checked: int = 0
    cases_changed: list[CaseChange] = Field(default_factory=list)

    @property
    def equivalent(self) -> bool:
        """No decision differs within the analysis (paths may still be relabelled or reordered).
        Versions whose decisions could not be compared at all are not equivalent."""
        return self.compared and not self.witnesses and not self.cases_changed

    @property
    def proven(self) -> bool:
        return not self.unproven


# ---------------------------------------------------------------------------------------------
# Paths added, removed, changed


def _path_table(scenario: ir.Scenario, clock: CpuBudget) -> tuple[dict[str, str], bool]:
    table: dict[str, str] = {}
    truncated = False
    infos = iter_paths(scenario, witnesses=False)
    for i in itertools.count():
        try:
            with active(clock):  # one path whose branches cost more than the budget left ends the listing too
                info = next(infos)
        except StopIteration:
            break
        except OutOfCpu:
            truncated = True
            break
        if i >= PATH_LIMIT or clock.out():
            truncated = True
            break
        parts = [f"{s} [{label}]" if label else s for s, label in zip(info.stages, info.labels, strict=False)]
        # the actions as written, steps on the way and arguments included (`do Pay(amount = Payout)`):
        # a changed argument or step is a changed outcome
        outcome = " -> ".join(call if call.startswith("for ") else f"do {call}" for call in (info.actions or [info.action]))
        fixed = {k: v for k, v in info.finals.items() if k != "Action" and v is not None}
        if fixed:
            outcome += " {" + ", ".join(f"{k} = {_show(v)}" for k, v in fixed.items()) + "}"
        table[" -> ".join(parts)] = outcome
    return table, truncated


def _show(value: Any) -> str:
    """A witness value as the user writes it: plain text and numbers, JSON for lists and records."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null (missing)"
    if isinstance(value, (bool, int, float)):
        return show_expr(ir.Lit(value=value))
    return json.dumps(value, ensure_ascii=False)


def path_changes(old: ir.Scenario, new: ir.Scenario, report: DiffReport, clock: CpuBudget | None = None) -> None:
    """Paths added, removed and changed; the listings stop at `PATH_LIMIT` paths or a quarter of the CPU
    budget each (`[listing truncated]`), which leaves the comparison of decisions its time."""
    clock = clock or CpuBudget(CPU_BUDGET)
    a, ta = _path_table(old, clock.share(0.25))
    b, tb = _path_table(new, clock.share(0.25))
    report.paths_old, report.paths_new, report.paths_truncated = len(a), len(b), ta or tb
    added = [k for k in b if k not in a]
    removed = [k for k in a if k not in b]
    report.changed = [PathChange(key=k, old=a[k], new=b[k]) for k in a if k in b and a[k] != b[k]]
    # a path through the same stages whose labels changed (an edited guard) is changed, not added/removed
    by_stages: dict[str, list[str]] = {}
    for k in removed:
        by_stages.setdefault(_stages_only(k), []).append(k)
    for k in list(added):
        olds = by_stages.get(_stages_only(k))
        if olds:
            o = olds.pop(0)
            removed.remove(o)
            added.remove(k)
            report.changed.append(PathChange(key=k, old_key=o, old=a[o], new=b[k]))
    report.added = [PathChange(key=k, new=b[k]) for k in added]
    report.removed = [PathChange(key=k, old=a[k]) for k in removed]


def _stages_only(key: str) -> str:
    return re.sub(r" \[[^\]]*\]", "", key)


# ---------------------------------------------------------------------------------------------
# The joint space


def _type_key(t: Any) -> Any:
    """A type as plain data without source spans (or aliases), for comparing declarations."""
    def strip(data: Any) -> Any:
        if isinstance(data, dict):
            return {k: strip(v) for k, v in data.items() if k not in ("span", "alias")}
        if isinstance(data, list):
            return [strip(v) for v in data]
        return data
    return strip(t.model_dump())


def _meet_types(name: str, a: Any, b: Any) -> Any:
    """The values valid for both declarations of an input, or DiffError when they share none."""
    if a is None or b is None:
        return a if a is not None else b
    if _type_key(a) == _type_key(b):  # the same type written in two files (spans differ)
        return a
    if isinstance(a, ir.ListType) and isinstance(b, ir.ListType):
        shortest, longest = max(a.min_len, b.min_len), min(a.max_len, b.max_len)
        if shortest <= longest:
            return ir.ListType(item=_meet_types(f"{name}[]", a.item, b.item), min_len=shortest, max_len=longest)
    if isinstance(a, ir.RecordType) and isinstance(b, ir.RecordType) \
            and [f.name for f in a.fields] == [f.name for f in b.fields]:
        return ir.RecordType(fields=[ir.RecordField(name=fa.name, type=_meet_types(f"{name}.{fa.name}", fa.type, fb.type))
                                     for fa, fb in zip(a.fields, b.fields, strict=True)])
    if isinstance(a, ir.EnumType) and isinstance(b, ir.EnumType):
        common = [v for v in a.values if v in b.values]
        if len(common) >= 1:
            return ir.EnumType(values=common if len(common) > 1 else common * 2)
    if isinstance(a, ir.BoolType) and isinstance(b, ir.BoolType):
        return a
    if isinstance(a, (ir.TimeType, ir.StringType)) and isinstance(b, (ir.TimeType, ir.StringType)) \
            and a.kind == b.kind:
        return a
    if isinstance(a, ir.NumType) and isinstance(b, ir.NumType):
        lo, lo_open = _tighter(a.lo, a.lo_open, b.lo, b.lo_open, max)
        hi, hi_open = _tighter(a.hi, a.hi_open, b.hi, b.hi_open, min)
        empty = lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_open or hi_open)))
        if not empty:
                return ir.NumType(kind="int" if "int" in (a.kind, b.kind) else "float", lo=lo, hi=hi,
                              lo_open=lo_open, hi_open=hi_open)
    raise DiffError(f"`{name}` is {ir.describe_type(a)} in one version and {ir.describe_type(b)} in the other: "
                    "no input is valid for both")


def _tighter(x: float | None, xo: bool, y: float | None, yo: bool, pick: Any) -> tuple[float | None, bool]:
    if x is None:
        return y, yo
    if y is None or x == y:
        return x, xo or (y is not None and yo)
    return (x, xo) if pick(x, y) == x else (y, yo)


def _renamer(prefix: str, derived: set[str]) -> Any:
    def rename(e: Any) -> Any:
        if isinstance(e, ir.Var):
            return e.model_copy(update={"name": prefix + e.name}) if e.name in derived else e
        return e if isinstance(e, ir.Lit) else ir.map_children(e, rename)
    return rename


class _Side:
    """One version inside the joint space: its stages, with the names of the `let`s it defines
    differently from the other version (`shared` are the same in both) made private."""

    def __init__(self, scenario: ir.Scenario, prefix: str, shared: frozenset[str] = frozenset()):
        self.scenario = scenario
        self.label = "OLD" if prefix == "__old__" else "NEW"
        derived = {v.name for v in scenario.variables.values() if v.role == "derived"} - shared
        self.rename = _renamer(prefix, derived)
        self.derived = {prefix + v.name: v.model_copy(update={"name": prefix + v.name,
                                                              "expr": self.rename(v.expr)})
                        for v in scenario.variables.values() if v.name in derived}


def _shared_lets(old: ir.Scenario, new: ir.Scenario) -> frozenset[str]:
    """The `let`s both versions define alike, reading only such `let`s: one variable in the joint space.
    Two private copies of one definition would make "old holds and new does not" a question the domain
    cannot always settle (a quantifier over a list), instead of plainly impossible."""
    def lets(sc: ir.Scenario) -> dict[str, ir.Variable]:
        return {n: v for n, v in sc.variables.items() if v.role == "derived" and v.expr is not None}

    mine, theirs = lets(old), lets(new)
    shared = {n for n in mine.keys() & theirs.keys() if show_expr(mine[n].expr) == show_expr(theirs[n].expr)}
    changed = True
    while changed:  # a `let` reading a `let` that differs differs too
        changed = False
        for name in sorted(shared):
            reads = {r for r in compile_reads(mine[name].expr) if r in mine or r in theirs}
            if not reads <= shared:
                shared.discard(name)
                changed = True
    return frozenset(shared)


def joint_scenario(old: ir.Scenario, new: ir.Scenario) -> tuple[ir.Scenario, _Side, _Side]:
    variables: dict[str, ir.Variable] = {}
    for scenario in (old, new):
        for var in scenario.variables.values():
            if var.role == "derived":
                continue
            if var.name in variables:
                merged = _meet_types(var.name, variables[var.name].type, var.type)
                variables[var.name] = variables[var.name].model_copy(update={"type": merged})
            else:
                variables[var.name] = var
    shared = _shared_lets(old, new)
    a, b = _Side(old, "__old__", shared), _Side(new, "__new__", shared)
    variables.update({n: old.variables[n] for n in sorted(shared)})
    variables.update(a.derived)
    variables.update(b.derived)
    return ir.Scenario(name="joint", variables=variables), a, b


# ---------------------------------------------------------------------------------------------
# The product walk


class _Walk:
    def __init__(self, joint: ir.Scenario, old: _Side, new: _Side, budget: int, clock: CpuBudget):
        self.joint = joint
        self.old = old
        self.new = new
        self.budget = budget
        self.clock = clock
        self.steps = 0
        self.exhausted = False
        self.out_of_time = False
        self.where = ""  # the stage the walk was at when a budget stopped it

    def leaves(self, side: _Side, boxes: list[domain.Box]) -> Iterator[_Leaf]:
        """(leaf target, the actions carried out on the way, region) for every route of one version
        inside `boxes`."""
        start = side.scenario.start
        if start is None:
            return
        yield from self._walk(side, start, boxes, frozenset(), ())

    def _walk(self, side: _Side, stage_id: str, boxes: list[domain.Box], seen: frozenset[str],
              steps: tuple[ir.ActionCall, ...]) -> Iterator[_Leaf]:
        stage = side.scenario.stages.get(stage_id)
        if stage is None or stage_id in seen:
            return  # a revisit loops forever in the engine: no decision there
        seen = seen | {stage_id}
        rest = boxes
        for branch in stage.branches:
            if not rest or self.exhausted:
                if self.exhausted and not self.where:
                    self.where = f"stage `{stage_id}` of {side.label}"
                return
            if branch.guard is None:
                taken, rest = rest, []
            else:
                guard = side.rename(branch.guard)
                taken = self._constrain(rest, guard, True)
                rest = self._constrain(rest, guard, False)
            if not taken:
                continue
            route = (*steps, *branch.target.steps)
            if branch.target.kind == "action":
                yield branch.target, route, taken
            elif branch.target.stage is not None:
                yield from self._walk(side, branch.target.stage, taken, seen, route)

    def outputs_differ(self, old_leaf: _Leaf, new_leaf: _Leaf, region: list[domain.Box]) -> list[domain.Box]:
        """The part of `region` where a value the two leaves compute differently differs: an output
        (`Months = PlanMonths` after a changed threshold inside `PlanMonths`) or an argument of the same
        action (`do Pay(amount = Payout + 1)`): a witness of the region as a whole usually lies where both
        still agree. Empty when the actions differ (every member differs)."""
        old_target, new_target = old_leaf[0], new_leaf[0]
        old_calls, new_calls = _calls(old_leaf), _calls(new_leaf)
        if [name for name, _ in old_calls] != [name for name, _ in new_calls]:
            return []
        pairs: list[tuple[Any, Any]] = []
        for name, out in self.old.scenario.outputs.items():
            other = self.new.scenario.outputs.get(name)
            if other is not None:
                pairs.append((_output_expr(old_target, name, out.default), _output_expr(new_target, name, other.default)))
        for (name, old_args), (_, new_args) in zip(old_calls, new_calls, strict=True):
            if name.startswith("for "):
                continue  # arguments over an item: compared as written (`_outcome`), not as values
            by_name = {arg.name: arg.value for arg in new_args}
            pairs += [(arg.value, by_name.get(arg.name)) for arg in old_args]
        found: list[domain.Box] = []
        for left, right in pairs:
            if left is None or right is None:
                continue
            differ = ir.Compare(op="!=", left=self.old.rename(left), right=self.new.rename(right))
            found += self._constrain(region, differ, True)
        return found

    def _constrain(self, boxes: list[domain.Box], expr: Any, truth: bool) -> list[domain.Box]:
        out: list[domain.Box] = []
        for box in boxes:
            self.steps += 1
            if self.steps > self.budget or self.clock.out():
                self.exhausted = True
                self.out_of_time = self.steps <= self.budget
                return out
            out += domain.constrain(self.joint, box, expr, truth)
        return out


_Leaf = tuple[ir.Target, tuple[ir.ActionCall, ...], list[domain.Box]]  # target, steps on the way, region


def _outcome(side: _Side, leaf: _Leaf) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A leaf's outcome as text: the actions carried out (steps on the way, then the final action, with
    their arguments as written), every output's expression (or default), and the definitions of the
    `let`s those expressions read (so a changed `let` is a changed outcome)."""
    target = leaf[0]
    calls = _calls(leaf)
    assigned = {a.name: a.value for a in target.outputs}
    outs: list[tuple[str, str]] = []
    lets: set[str] = set()
    for name, out in side.scenario.outputs.items():
        expr = assigned.get(name, out.default)
        outs.append((name, show_expr(expr) if expr is not None else "none"))
        if expr is not None:
            _lets_read(side.scenario, expr, lets)
    for _, args in calls:
        for arg in args:
            _lets_read(side.scenario, arg.value, lets)
    for call in leaf[1]:
        for expr in call.exprs()[:2 if call.cond is not None else 1] if call.each is not None else ():
            _lets_read(side.scenario, expr, lets)
    outs += [(f"let {n}", show_expr(side.scenario.variables[n].expr)) for n in sorted(lets)]
    return " -> ".join(ir.show_step(step) for step in leaf[1]) + (" -> " if leaf[1] else "") \
        + ir.show_call(*calls[-1]), tuple(outs)


def _calls(leaf: _Leaf) -> list[tuple[str, list[ir.OutputAssign]]]:
    """The actions a route carries out, in order, with their arguments: the steps, then the final action."""
    target, steps, _ = leaf
    return [*((_step_name(c), c.args) for c in steps), (str(target.action), target.args)]


def _step_name(call: ir.ActionCall) -> str:
    """A step's action, with the head of a for-each step (`for f in Fees where f.ok do Refund`): a
    changed list or condition is a changed outcome."""
    if call.each is None:
        return call.action
    where = "" if call.cond is None else f" where {ir.show(call.cond)}"
    return f"for {call.each} in {ir.show(call.source)}{where} do {call.action}"


def _output_expr(target: ir.Target, name: str, default: Any) -> Any:
    """The expression a leaf gives an output: its assignment, else the output's default (None: null)."""
    for assign in target.outputs:
        if assign.name == name:
            return assign.value
    return default


def _lets_read(scenario: ir.Scenario, expr: Any, found: set[str]) -> None:
    if isinstance(expr, ir.Var):
        var = scenario.variables.get(expr.name)
        if var is not None and var.expr is not None and expr.name not in found:
            found.add(expr.name)
            _lets_read(scenario, var.expr, found)
    for child in ir.children(expr):
        _lets_read(scenario, child, found)


def _decide(scenario: ir.Scenario, values: Mapping[str, Any]) -> Decision | None:
    own = {k: v for k, v in values.items() if k in scenario.variables}
    try:
        return interpret(scenario, own)
    except DecideError:
        return None


def decision_differences(old: ir.Scenario, new: ir.Scenario, report: DiffReport, budget: int,
                         max_witnesses: int = MAX_WITNESSES, clock: CpuBudget | None = None) -> None:
    """Inputs on which OLD and NEW decide differently. A procedure is compared in its unrolled form
    (one variable per look, one stage copy per visit: `unroll`), where every look can take its own
    value. Lists and records are compared as they are written (the witness search tries sample lists);
    when that leaves regions undecided, they are compared again lowered (one variable per item field,
    `lower`: item conditions decided exactly) within `RETRY_BUDGET` regions, and that answer is kept
    when it is complete. Witnesses are lifted back to the source form and verified there by the engine.
    Everything runs within `clock` (CPU seconds): past it, the answer says where the walk stopped."""
    clock = clock or CpuBudget(CPU_BUDGET)
    for name in sorted(set(old.variables) | set(new.variables)):
        in_old, in_new = name in old.variables, name in new.variables
        if in_old != in_new and (old.variables.get(name) or new.variables[name]).role != "derived":
            report.notes.append(f"`{name}` is read only by the {'old' if in_old else 'new'} version")
    report.text_inputs = sorted(text_names(old) | text_names(new))
    try:
        forms = (analysis_form(old), analysis_form(new)) if old.procedural or new.procedural else None
        with active(clock):  # a question past the budget stops the walk (`budget.OutOfCpu`, below)
            first = _compare(old, new, forms, budget, max_witnesses, clock)
            if first.undecided and not first.exhausted and (needs_analysis_form(old) or needs_analysis_form(new)):
                lowered = (analysis_form(old), analysis_form(new))
                if lowered != forms:
                    retry = _compare(old, new, lowered, min(budget, RETRY_BUDGET), max_witnesses, clock)
                    if not retry.exhausted and retry.undecided < first.undecided:
                        first = retry
    except OutOfCpu:
        report.unproven.append(f"the comparison stopped at its CPU budget of {clock.seconds:g} s while deciding "
                               "which branches the values reaching a stage can take: routes not reached may "
                               "still differ (raise --cpu-budget)")
        return
    except UnrollError as exc:
        report.unproven.append(f"the programs could not be put in analysis form for the comparison: {exc}")
        report.compared = False
        return
    except DiffError as exc:
        report.unproven.append(str(exc))
        report.compared = False
        return
    report.witnesses += first.witnesses
    report.differing_regions += first.differing
    if first.out_of_time:
        report.unproven.append(f"the comparison stopped at its CPU budget of {clock.seconds:g} s"
                               + (f", at {first.where}" if first.where else "")
                               + f" ({first.witness_checks} region(s) checked for a witness): routes not "
                               "reached may still differ (raise --cpu-budget)")
    elif first.exhausted:
        report.unproven.append(f"the product walk stopped at its budget of {budget} regions"
                               + (f", at {first.where}" if first.where else "")
                               + ": routes not reached may still differ (raise --budget)")
    if first.undecided:
        report.unproven.append(f"{first.undecided} region(s) where the two versions end differently as written "
                               "(other actions, arguments or outputs as written) but no input was found "
                               "there on which the engine decides differently: the region may hold no input "
                               "at all, or equal values from different expressions, under constraints the "
                               "analysis could not decide")


class _Compared(BaseModel):
    witnesses: list[Witness] = Field(default_factory=list)
    differing: int = 0
    undecided: int = 0
    exhausted: bool = False
    out_of_time: bool = False
    where: str = ""
    witness_checks: int = 0


def _compare(old: ir.Scenario, new: ir.Scenario, forms: tuple[Unrolled, Unrolled] | None, budget: int,
             max_witnesses: int, clock: CpuBudget) -> _Compared:
    """One product walk of the two versions (in `forms` when given), raising DiffError when no input
    is valid for both."""
    flat_old, flat_new = (forms[0].scenario, forms[1].scenario) if forms else (old, new)
    joint, a, b = joint_scenario(flat_old, flat_new)
    walk = _Walk(joint, a, b, budget, clock)
    out = _Compared()
    try:
        _walk_leaves(walk, out, joint, forms, (old, new, flat_old, flat_new), max_witnesses, clock)
    except OutOfCpu:  # inside a feasibility question (`budget.active`): what was found so far stands
        walk.exhausted = walk.out_of_time = True
        walk.where = walk.where or "a feasibility question of the product walk"
    # a witness search cut short by the clock left its region undecided: say that the budget did it
    out.exhausted, out.out_of_time, out.where = walk.exhausted, walk.out_of_time or clock.out(), walk.where
    return out


def _walk_leaves(walk: _Walk, out: _Compared, joint: ir.Scenario, forms: tuple[Unrolled, Unrolled] | None,
                 programs: tuple[ir.Scenario, ir.Scenario, ir.Scenario, ir.Scenario], max_witnesses: int,
                 clock: CpuBudget) -> None:
    """The pairs of leaves (OLD, NEW) that end differently, each checked for a verified witness (into `out`)."""
    old, new, flat_old, flat_new = programs
    a, b = walk.old, walk.new
    for old_leaf in walk.leaves(a, [domain.full_box(joint)]):
        want = _outcome(a, old_leaf)
        for new_leaf in walk.leaves(b, old_leaf[2]):
            if _outcome(b, new_leaf) == want:
                continue
            if clock.out():
                walk.exhausted = walk.out_of_time = True
                walk.where = walk.where or f"a leaf `{ir.show_call(*_calls(new_leaf)[-1])}` of NEW"
                break
            both = new_leaf[2]
            out.differing += 1
            out.witness_checks += 1
            found = _verified_witness(joint, walk.outputs_differ(old_leaf, new_leaf, both) + both,
                                      flat_old, flat_new, clock)
            if found is not None and forms is not None:
                found = _lifted(found, forms, old, new)
            if found is None:
                out.undecided += 1
            elif len(out.witnesses) < max_witnesses:
                out.witnesses.append(found)
        if walk.exhausted:
            break


def _lifted(found: Witness, forms: tuple[Unrolled, Unrolled], old: ir.Scenario,
            new: ir.Scenario) -> Witness | None:
    """A witness of the unrolled forms in source terms (a list of looks per observed variable, the
    longer of the two versions' lists), decided again by the engine on the two source programs."""
    values = forms[0].lift(found.values)
    for name, value in forms[1].lift(found.values).items():
        mine = values.get(name)
        if name not in values or (isinstance(value, list) and isinstance(mine, list) and len(value) > len(mine)):
            values[name] = value
    found_here = _differing(values, old, new)
    if found_here is None:
        return None
    # each observed variable's looks: as many as the longer of the two paths takes
    trimmed = used_looks(old, values, found_here.old_path)
    for name, value in used_looks(new, values, found_here.new_path).items():
        mine = trimmed.get(name)
        if name not in trimmed or (isinstance(value, list) and isinstance(mine, list) and len(value) > len(mine)):
            trimmed[name] = value
    return found_here.model_copy(update={"values": trimmed})


def _differing(values: dict[str, Any], old: ir.Scenario, new: ir.Scenario) -> Witness | None:
    """`values` as a witness when the engine decides them differently in the two versions: other
    finals, or the same finals reached by carrying out other actions (or the same with other arguments)."""
    da, db = _decide(old, values), _decide(new, values)
    if da is None or db is None or (da.finals == db.finals and da.actions == db.actions):
        return None
    return Witness(values=values, old_path=da.path, old_finals=da.finals, new_path=db.path, new_finals=db.finals,
                   old_actions=da.actions, new_actions=db.actions)


def _verified_witness(joint: ir.Scenario, boxes: Sequence[domain.Box], old: ir.Scenario,
                      new: ir.Scenario, clock: CpuBudget) -> Witness | None:
    for box in boxes:
        if clock.out():
            return None
        for style in ("representative", "boundary"):
            values = domain.witness(joint, box, style=style)
            if values is None:
                continue
            found = _differing({k: v for k, v in values.items() if not k.startswith("__")}, old, new)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------------------------------------
# Cases


def case_changes(new: ir.Scenario, cases: Sequence[Case], report: DiffReport) -> None:
    """Cases whose reference path or finals under NEW differ from the ones they were made with."""
    report.cases_checked = len(cases)
    for case in cases:
        values = {**case.truth, **case.system}
        values = {k: v for k, v in values.items() if v is not None}
        actions: list[dict[str, Any]] | None
        try:
            d = interpret(new, {k: v for k, v in values.items() if k in new.variables})
            path, finals, actions, error = d.path, d.finals, d.actions, None
        except DecideError as exc:
            path, finals, actions, error = None, None, None, exc.message
        trace_changed = case.expected_actions is not None and actions is not None and actions != case.expected_actions
        if path != case.expected_path or finals != case.expected_finals or trace_changed:
            report.cases_changed.append(CaseChange(
                id=case.id, old_path=case.expected_path, new_path=path, old_finals=case.expected_finals,
                new_finals=finals, error=error, old_actions=case.expected_actions if trace_changed else None,
                new_actions=actions if trace_changed else None))


def diff(old: ir.Scenario, new: ir.Scenario, *, cases: Sequence[Case] = (), budget: int = DEFAULT_BUDGET,
         old_name: str = "OLD", new_name: str = "NEW", cpu_budget: float | CpuBudget = CPU_BUDGET) -> DiffReport:
    """The semantic diff of two versions (`sop diff`), answered within `cpu_budget` CPU seconds (past it,
    `unproven` says where the comparison stopped) and `budget` regions of the product walk."""
    report = DiffReport(old=old_name, new=new_name, paths_old=0, paths_new=0)
    clock = budget_of(cpu_budget, CPU_BUDGET)  # seconds, or the command's budget (its loading took a part)
    path_changes(old, new, report, clock)
    decision_differences(old, new, report, budget, clock=clock)
    if cases:
        case_changes(new, cases, report)
    return report


def render_text(report: DiffReport, *, limit: int = 10) -> str:
    out = [f"paths: {report.paths_old} -> {report.paths_new} (+{len(report.added)} added, "
           f"-{len(report.removed)} removed, {len(report.changed)} changed)"
           + (" [listing truncated]" if report.paths_truncated else "")]
    for sign, items, attr in (("+", report.added, "new"), ("-", report.removed, "old")):
        for p in items[:limit]:
            out.append(f"  {sign} {p.key} -> {getattr(p, attr)}")
        if len(items) > limit:
            out.append(f"  {sign} ... {len(items) - limit} more")
    for p in report.changed[:limit]:
        if p.old_key:
            out.append(f"  ~ {p.old_key} -> {p.old}")
            out.append(f"    now {p.key} -> {p.new}")
        else:
            out.append(f"  ~ {p.key}: {p.old} => {p.new}")
    out += [f"note: {n}" for n in report.notes]
    out.append("")
    if report.witnesses:
        out.append(f"decisions differ: {report.differing_regions} region(s); witnesses verified by the engine:")
        for i, w in enumerate(report.witnesses[:limit], 1):
            values = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False) if k in report.text_inputs else _show(v)}"
                               for k, v in sorted(w.values.items()))
            out.append(f"  {i}. {values}")
            traced = w.old_finals == w.new_finals  # the same finals: the actions carried out differ
            out.append(f"     old: {' -> '.join(w.old_path)} => {_finals(w.old_finals)}"
                       + (f"; actions {_trace_text(w.old_actions)}" if traced else ""))
            out.append(f"     new: {' -> '.join(w.new_path)} => {_finals(w.new_finals)}"
                       + (f"; actions {_trace_text(w.new_actions)}" if traced else ""))
    elif not report.compared:
        out.append("decisions: not compared (no input is valid for both versions)")
    else:
        out.append("decisions: equivalent" + (" (proven)" if report.proven else " within the analysis budget"))
    for u in report.unproven:
        out.append(f"  not proven: {u}")
    if report.cases_checked:
        out += ["", f"cases: {len(report.cases_changed)} of {report.cases_checked} change"]
        for c in report.cases_changed[:limit]:
            if c.new_path is None:
                out.append(f"  {c.id}: no longer decidable: {c.error}")
                continue
            parts = []
            if c.new_path != c.old_path:
                parts.append(f"path {' '.join(c.old_path)} => {' '.join(c.new_path)}")
            if c.new_finals != c.old_finals:
                parts.append(f"finals {_finals(c.old_finals)} => {_finals(c.new_finals or {})}")
            if c.old_actions is not None and c.new_actions is not None:
                parts.append(f"actions {_trace_text(c.old_actions)} => {_trace_text(c.new_actions)}")
            out.append(f"  {c.id}: " + "; ".join(parts))
    return "\n".join(out) + "\n"


def _finals(finals: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_show(v)}" for k, v in finals.items())


def _trace_text(actions: Sequence[Mapping[str, Any]]) -> str:
    """An engine action trace as the user writes values: `OpenClaim(peril=Water) -> PayClaim(amount=1200)`."""
    shown = []
    for call in actions:
        args = call.get("args") or {}
        inner = ", ".join(f"{k}={_show(v)}" for k, v in args.items())
        shown.append(f"{call.get('name')}({inner})" if inner else str(call.get("name")))
    return " -> ".join(shown) or "(none)"
