"""Checks of procedures: actions carried out on the way, their arguments, observations and bounded
retries (docs/language.md §8 and §12, codes E104, E109–E112, E302 for loops without a bound).

Kept apart from `checker` so the procedure rules read as one unit; `checker` runs them as the
`procedures` pass and, for programs that observe or bound branches, runs the flow analysis on
the unrolled form (`unroll`) and maps its findings back to the source (`procedure_flow`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sopgraph.language import ir
from sopgraph.language.compile import reads as compile_reads
from sopgraph.language.compile import stage_reads
from sopgraph.language.diagnostics import Diagnostic, clip, did_you_mean, error, warning
from sopgraph.logic.budget import CpuBudget
from sopgraph.logic.lower import Lowered, analysis_form
from sopgraph.logic.paths import explorer_for, used_looks
from sopgraph.logic.unroll import (
    LOOK_SEP,
    Unrolled,
    UnrollError,
    affects_of,
    held_variables,
    unbounded_cycle,
    unrolled_for,
)

# output_value(output, expr, span) of the checker's typer: checks a value against a declared type
ValueCheck = Callable[[ir.Output, Any, ir.Span], None]


def _calls(scenario: ir.Scenario) -> list[tuple[ir.Stage, ir.Branch, str, list[ir.OutputAssign], ir.Span,
                                              ir.ActionCall | None]]:
    """Every action call: (stage, branch, action, arguments, span, the step or None for a final action)."""
    out: list[tuple[ir.Stage, ir.Branch, str, list[ir.OutputAssign], ir.Span, ir.ActionCall | None]] = []
    for stage in scenario.stages.values():
        for branch in stage.branches:
            t = branch.target
            for call in t.steps:
                out.append((stage, branch, call.action, call.args, call.span if call.span.line else t.span, call))
            if t.kind == "action" and (t.args or (t.action in scenario.actions
                                                   and scenario.actions[t.action].params)):
                out.append((stage, branch, t.action or "", t.args, t.span, None))
    return out


def check_calls(scenario: ir.Scenario, value_check: ValueCheck,
                scope: Callable[[ir.ActionCall | None, ir.Branch], AbstractContextManager[Any]] | None = None,
                ) -> list[Diagnostic]:
    """Undefined actions in steps (E104); arguments that are unknown, missing, repeated or of the
    wrong type for the action's parameters (E109). `scope(call, branch)`: the context the arguments are
    typed in (the item variable of a for-each step; what the branch's condition says)."""
    out: list[Diagnostic] = []
    for stage, branch, name, args, span, call in _calls(scenario):
        if scope is not None:
            with scope(call, branch):
                out += _check_call(scenario, value_check, stage, branch, name, args, span)
        else:
            out += _check_call(scenario, value_check, stage, branch, name, args, span)
    return out


def _check_call(scenario: ir.Scenario, value_check: ValueCheck, stage: ir.Stage, branch: ir.Branch, name: str,
                args: list[ir.OutputAssign], span: ir.Span) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    action = scenario.actions.get(name)
    if action is None:
        if any(c.action == name for c in branch.target.steps):
            out.append(error("E104", f"undefined action `{name}`", span,
                             did_you_mean(name, scenario.actions)
                             or f'declare it with `action {name} "what it does"`'))
        return out
    params = {p.name: p for p in action.params}
    given: set[str] = set()
    for arg in args:
        param = params.get(arg.name)
        if param is None:
            hint = did_you_mean(arg.name, params) or (
                f"its parameters are {', '.join(f'`{p}`' for p in params)}" if params
                else f"`{name}` takes no arguments")
            out.append(error("E109", f"action `{name}` has no parameter `{arg.name}`", arg.span, hint))
            continue
        if arg.name in given:
            out.append(error("E102", f"argument `{arg.name}` is given twice", arg.span, "keep one"))
        given.add(arg.name)
        value_check(ir.Output(name=f"{name}.{arg.name}", type=param.type), arg.value,
                    arg.value.span if arg.value.span.line else arg.span)
    missing = [p for p in params if p not in given]
    if missing:
        out.append(error("E109", f"`do {name}` at stage `{stage.id}` does not give "
                         f"{', '.join(f'`{m}`' for m in missing)}", span,
                         f"write `do {name}({', '.join(f'{m} = ...' for m in missing)})`"))
    return out


def check_observations(scenario: ir.Scenario) -> list[Diagnostic]:
    """`observe` of undeclared or non-system variables (E101/E110); zero bounds (E112); `affects`
    naming a variable no stage observes (E101/E110)."""
    out: list[Diagnostic] = check_affects(scenario) + check_constant_looks(scenario)
    for stage in scenario.stages.values():
        for name in stage.observe:
            var = scenario.variables.get(name)
            if var is None:
                out.append(error("E101", f"undefined variable `{name}` in `observe` of stage `{stage.id}`",
                                 stage.span, did_you_mean(name, [v.name for v in scenario.system_vars])
                                 or f"declare it: `system {name}: bool \"…\"`"))
            elif var.role != "system":
                out.append(error("E110", f"`observe` lists `{name}`, which is a {var.role} variable",
                                 stage.span, "only system variables are observed: each look is a new value "
                                 "the backend reports after an action"))
        for branch in stage.branches:
            if branch.limit is not None and branch.limit < 1:
                out.append(error("E112", f"`up to {branch.limit} times` never fires", branch.span,
                                 "write a bound of at least 1, or remove the branch"))
    return out


def check_affects(scenario: ir.Scenario) -> list[Diagnostic]:
    """`action A "…" affects X`: X must be a system variable that some stage observes."""
    out: list[Diagnostic] = []
    observed = set(scenario.observed)
    for action in scenario.actions.values():
        for name, span in zip(action.affects, action.affects_spans, strict=False):
            var = scenario.variables.get(name)
            if var is None:
                out.append(error("E101", f"undefined variable `{name}` in `affects` of action `{action.name}`",
                                 span, did_you_mean(name, sorted(observed)) or "name an observed system variable"))
            elif name not in observed:
                out.append(error("E110", f"action `{action.name}` affects `{name}`, which no stage observes",
                                 span, f"an action changes what the next look sees: add `observe {name}` to the "
                                 "stage that checks it again, or remove it from `affects`"))
    return out


def check_volatile(scenario: ir.Scenario) -> list[Diagnostic]:
    """`volatile` on a variable no stage observes (E110): only looks can change."""
    out: list[Diagnostic] = []
    observed = set(scenario.observed)
    for var in scenario.variables.values():
        if var.volatile and var.name not in observed:
            what = "a field: the agent infers it once" if var.role == "field" else "it is never looked at anew"
            out.append(error("E110", f"`{var.name}` is marked `volatile` but no stage observes it ({what})",
                             var.span, f"add `observe {var.name}` to the stages that look at it, or drop `volatile`"))
    return out


def check_constant_looks(scenario: ir.Scenario) -> list[Diagnostic]:
    """W308: in a procedure that says how its world changes, a variable looked at again that no
    action affects and that is not `volatile`: every look sees the value of the first."""
    out: list[Diagnostic] = []
    held = held_variables(scenario)
    affected = set().union(*affects_of(scenario).values())
    sites: dict[str, list[ir.Stage]] = {}
    for stage in scenario.stages.values():
        for name in stage.observe:
            sites.setdefault(name, []).append(stage)
    succ = {sid: {b.target.stage for b in st.branches if b.target.kind == "stage" and b.target.stage}
            for sid, st in scenario.stages.items()}
    for name, stages in sites.items():
        if name not in held or name in affected:
            continue
        again = stages[1] if len(stages) > 1 else next(
            (st for st in stages if any(st.id in _reach(succ, n) for n in succ.get(st.id, ()))), None)
        if again is None:
            continue
        out.append(warning("W308", f"`{name}` is looked at again at stage `{again.id}`, but no action affects it: "
                           "every look sees the value of the first", again.span,
                           f"add `affects {name}` to the actions that change it, or mark it `volatile` "
                           f"(`system {name}: … volatile`) if it changes on its own"))
    return out


def check_loops(scenario: ir.Scenario) -> list[Diagnostic]:
    """For procedures: a cycle no bounded branch stops (E302), reads before the first look (E111)."""
    if not scenario.procedural:
        return []
    cycle = unbounded_cycle(scenario)
    if cycle is not None:
        closing = scenario.stages[cycle[-2]]
        branch = next(b for b in closing.branches if b.target.kind == "stage" and b.target.stage == cycle[0])
        return [error("E302", "cycle in the stage graph: " + " -> ".join(cycle),
                      branch.target.span if branch.target.span.line else branch.span,
                      "a loop must pass a bounded branch: add `up to N times` to one of its branches "
                      "(and say what happens once it is spent)")]
    try:
        unrolled = unrolled_for(scenario)
    except UnrollError as exc:
        return [error("E302", f"the procedure cannot be analysed: {exc}", scenario.span,
                      "lower the `up to N times` bounds")]
    out: list[Diagnostic] = []
    for sid, name in unrolled.premature:
        out.append(error("E111", f"`{name}` is read at stage `{sid}` before it is observed on some path",
                         scenario.stages[sid].span,
                         f"add `observe {name}` to this stage or to one every path passes first"))
    return out


def check_still_retries(scenario: ir.Scenario) -> list[Diagnostic]:
    """W307: a bounded branch back into a loop on which no stage observes anything. Fields and system
    values stay the same for a whole dialogue unless a stage takes a new look, so every round takes the
    same branches until the bound is spent: the retry can never succeed, which is rarely what a
    procedure that "asks again" means (the usual slip: `observe` left out of the re-checking stage)."""
    succ = {sid: {b.target.stage for b in st.branches if b.target.kind == "stage" and b.target.stage}
            for sid, st in scenario.stages.items()}
    pred: dict[str, set[str]] = {sid: set() for sid in succ}
    for sid, nxt in succ.items():
        for t in nxt:
            pred.setdefault(t, set()).add(sid)
    out: list[Diagnostic] = []
    for sid, stage in scenario.stages.items():
        for branch in stage.branches:
            head = branch.target.stage if branch.target.kind == "stage" else None
            if branch.limit is None or head is None or head not in succ:
                continue
            loop = _reach(succ, head) & _reach(pred, sid)  # the stages of some round head ->* sid
            if not loop or any(scenario.stages[x].observe for x in loop):
                continue
            rechecked = _system_reads(scenario, [scenario.stages[x] for x in sorted(loop)])
            looks = ", ".join(f"`observe {n}`" for n in rechecked[:3]) or "`observe X`"
            out.append(warning(
                "W307", f"`up to {branch.limit} times` repeats `{head}`, but no stage of that loop observes "
                "anything: every round reads the same values, so it takes the same branches until the bound "
                "is spent", branch.span,
                f"add {looks} to `{head}` if the retry re-checks {'them' if len(rechecked) > 1 else 'it'} (each `observe` is a new look after the "
                "actions on the way); fields and unobserved system values never change during a dialogue"))
    return out


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = {start}, [start]
    while stack:
        for nxt in edges.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _system_reads(scenario: ir.Scenario, stages: list[ir.Stage]) -> list[str]:
    """System variables the stages' guards read, directly or through derived variables (first-seen order)."""
    found: dict[str, None] = {}
    todo = [n for st in stages for n in stage_reads(st)]
    seen: set[str] = set()
    while todo:
        name = todo.pop(0)
        var = scenario.variables.get(name)
        if name in seen or var is None:
            continue
        seen.add(name)
        if var.role == "system":
            found[name] = None
        elif var.role == "derived" and var.expr is not None:
            todo.extend(compile_reads(var.expr))
    return list(found)


def procedure_flow(scenario: ir.Scenario, flow: Callable[[ir.Scenario], list[Diagnostic]],
                   clock: CpuBudget | None = None) -> list[Diagnostic]:
    """The flow analysis of a procedure, run on its unrolled form and mapped back: a finding about
    any copy of a stage is a finding about the stage; "never" claims (W303/W304) hold only if they
    hold for every copy where the branch is live (known from a path count within `clock`, when given)."""
    try:
        unrolled = analysis_form(scenario)
    except UnrollError:
        return []
    if unrolled.premature:
        return []
    flat = unrolled.scenario
    found = flow(flat)
    # only "never" claims need the branches some path takes: a count over every path, not asked otherwise
    taken = _taken_branches(flat, unrolled.origin, clock) if any(d.code in ("W303", "W304") for d in found) else None
    spans: dict[tuple[int, int, str], tuple[str, int]] = {}
    for sid, st in scenario.stages.items():
        for bi, b in enumerate(st.branches):
            for sp in (b.span, b.guard.span if b.guard is not None else ir.NO_SPAN, b.target.span):
                if sp.line:
                    spans.setdefault((sp.line, sp.col, sp.file), (sid, bi))
    out: list[Diagnostic] = []
    for d in found:
        update: dict[str, Any] = {"message": source_terms(d.message, unrolled),
                                  "notes": [source_terms(n, unrolled) for n in d.notes]}
        if isinstance(d.witness, dict):
            update["witness"] = used_looks(scenario, unrolled.lift(d.witness))
        if d.code == "W301" and d.hint and d.span is not None:
            # the hint quotes the guard to write after `otherwise when`: as written, not a copy's looks
            source = spans.get((d.span.line, d.span.col, d.span.file))
            guard = scenario.stages[source[0]].branches[source[1]].guard if source is not None else None
            if guard is not None:
                # spliced in by position: the guard is user text (backslashes, backticks), never a template
                start, end = d.hint.find("`otherwise when "), d.hint.rfind("` to say so")
                if 0 <= start < end:
                    update["hint"] = f"{d.hint[:start]}`otherwise when {clip(ir.show(guard))}{d.hint[end:]}"
        d = d.model_copy(update=update)
        if d.code in ("W303", "W304"):
            # a "never" claim about one copy holds for the stage only if no copy ever takes the branch
            at = d.span or ir.NO_SPAN
            branch = spans.get((at.line, at.col, at.file))
            if branch is None or taken is None or branch in taken:
                continue
        out.append(d)
    seen: set[tuple] = set()
    unique = []
    for d in out:  # one finding per source position, whichever copy showed it first
        at = d.span or ir.NO_SPAN
        key = (d.code, at.line, at.col, at.file)
        if key not in seen and "#spent" not in d.message:
            seen.add(key)
            unique.append(d)
    return unique


def _taken_branches(flat: ir.Scenario, origin: dict[str, str],
                    clock: CpuBudget | None = None) -> set[tuple[str, int]] | None:
    """(source stage, branch) pairs some feasible path of the unrolled form takes (None when the
    exploration is not exact or ran out of `clock`: then no "never" claim is made)."""
    ex = explorer_for(flat)
    total = ex.count(clock)
    if not total.exact:
        return None
    out: set[tuple[str, int]] = set()
    for key in list(ex.count_memo):
        si, region, _vk = key
        for bi, _kind, _tgt, _creg, _u in ex.children(si, region):
            out.add((origin.get(ex.ids[si], ex.ids[si]), bi))
    return out


def source_terms(text: str, form: Unrolled) -> str:
    """A text about the analysis form (stage copies `check#3`, looks `X#2`, lowered list parts) in
    the source program's terms, as the user wrote it."""
    text = _source_ids(text, form.origin, form.looks)
    return form.source_text(text) if isinstance(form, Lowered) else text


def _source_ids(text: str, origin: dict[str, str], looks: dict[str, int]) -> str:
    """Copies and looks in source terms: `check#3` → `check` (on a later visit), `X#2` → `X` (look 2)."""
    for cid in sorted(origin, key=len, reverse=True):
        if cid != origin[cid]:
            text = text.replace(f"`{cid}`", f"`{origin[cid]}` (on a later visit)").replace(cid, origin[cid])
    if looks:
        names = "|".join(re.escape(n) for n in sorted(looks, key=len, reverse=True))
        # the look is said after the item or field read of it: `Fees#1[0].refundable` → `Fees[0].refundable (look 1)`,
        # and not at all for a variable looked at once
        text = re.sub(rf"\b({names}){re.escape(LOOK_SEP)}(\d+)((?:\[\d+\]|\.[^\W\d]\w*)*)",
                      lambda m: m.group(1) + m.group(3) + (f" (look {m.group(2)})" if looks.get(m.group(1), 0) > 1
                                                            else ""), text)
    return text
