"""Flow diagnostics: what the guards do to the values that actually reach each stage.

`flow_diagnostics(scenario)` explores the stage graph with constraint regions (see `domain` and
`paths`): the context of a stage is the set of assignments that reach it along some path. On those
contexts it reports

- E301 non-exhaustive branching: some reachable assignment makes no branch fire (the witness is a
  full assignment the engine refuses at that stage);
- W301 overlapping `when` guards: a later guard is also true where an earlier branch fires, for
  values that reach the stage (the earlier branch wins; the witness shows such values);
- W305 duplicate `match` values (a static check: the later arm never sees that value);
- W303 infeasible path: a branch whose guard can hold in general, but never for values reaching its
  stage (the note shows what the paths reaching it imply);
- W304 branch that can never be taken: its guard is contradictory, or the earlier guards of the
  same stage already cover every case.

Every witness is verified with the reference engine. The exploration is bounded (`budget` states;
regions of bounded size): when a bound is hit, the "never" claims (W303/W304) are not made, because
they need the whole exploration, and E301/W301 found so far are still reported. Cyclic graphs
terminate because a path never revisits a stage (values do not change while the engine walks, so a
revisit is an endless loop; E302 is reported by the checker). Nothing here raises: an internal
failure yields no flow diagnostics rather than a crashed `sop check`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sopgraph.language import ir
from sopgraph.language.compile import reads
from sopgraph.language.diagnostics import Diagnostic, clip, error, warning
from sopgraph.logic.budget import CHECK_CPU_BUDGET, FLOW_SHARE, CpuBudget, OutOfCpu, active, budget_of
from sopgraph.logic.domain import Box, Space, relation_text
from sopgraph.logic.engine import DecideError, Interpreter
from sopgraph.logic.paths import Explorer, explorer_for, trace

DEFAULT_BUDGET = 10_000  # states (stage, region) explored
MAX_CONTEXTS = 200  # contexts examined per stage for E301/W301 witnesses
MAX_REGION = 256  # boxes in one region before the exploration is considered too large
MAX_WITNESS_CHECKS = 200  # engine runs to verify E301/W301 witnesses (each costs a walk of the path)


_T = TypeVar("_T")
MAX_WORK = 10_000_000  # stages x variables: regions are dense tuples over every variable
STEP_BUDGET = 200_000  # region operations (constrain/decide) of the whole analysis: a deterministic bound


@dataclass
class FlowWork:
    """What one flow analysis spent (filled in when passed to `flow_diagnostics`). Why: the bounds
    are deterministic counts, so tests can check that a huge SOP costs no more than they allow."""

    states: int = 0  # (stage, region) states explored
    steps: int = 0  # region operations charged against STEP_BUDGET
    contexts: int = 0  # contexts kept for the witness searches
    skipped: bool = False  # too large to start (I301)
    out_of_time: bool = False  # stopped at its CPU budget


def flow_diagnostics(scenario: ir.Scenario, *, budget: int = DEFAULT_BUDGET,
                     work: FlowWork | None = None,
                     cpu_budget: float | CpuBudget = CHECK_CPU_BUDGET * FLOW_SHARE) -> list[Diagnostic]:
    """E301/W301/W303/W304/W305 for a scenario whose names resolve (see the module docstring).
    Pass a `FlowWork` as `work` to learn what the analysis spent. Past `cpu_budget` CPU seconds (or a
    `CpuBudget`: a part of a command's) the analysis stops and I302 says at which stage and on which
    question (`math.inf`: no CPU budget)."""
    work = FlowWork() if work is None else work
    n_vars = sum(1 for v in scenario.variables.values() if v.role != "derived")
    if n_vars * len(scenario.stages) > MAX_WORK:
        work.skipped = True
        # the analysis is linear in states but each state costs O(variables); past this size it
        # would take minutes, and `sop check` must stay fast: say so instead of guessing
        return [Diagnostic(
            code="I301", severity="info",
            message=f"flow analysis skipped: {len(scenario.stages)} stages x {n_vars} variables is over "
                    f"the analysis budget ({MAX_WORK:,})",
            span=scenario.span,
            hint="exhaustiveness, overlap and infeasible-branch checks need fewer distinct variables; "
                 "the engine still refuses values no branch covers at run time",
        )]
    try:
        flow = _Flow(scenario, budget, budget_of(cpu_budget, CHECK_CPU_BUDGET * FLOW_SHARE))
        try:
            with active(flow.clock):
                return flow.run()
        finally:
            work.states, work.steps = flow.states, STEP_BUDGET - flow.steps_left
            work.out_of_time = flow.out_of_time
            work.contexts = sum(len(c) for c in flow.contexts.values())
    except RecursionError:
        return []
    except Exception:  # noqa: BLE001 - `sop check` must never crash on a flow analysis bug
        return []


def _guarded(flow: _Flow, part: Callable[..., _T], *args: Any) -> _T | None:
    """`part(*args)`, or None when the CPU budget ran out inside one of its questions (`budget.OutOfCpu`,
    raised by the space once `flow_diagnostics` made the budget active): the analysis stops where it was asked."""
    try:
        return part(*args)
    except OutOfCpu:
        flow.complete, flow.out_of_time = False, True
        flow.stopped_at = flow.at if flow.stopped_at is None else flow.stopped_at
        return None


def _where(span: ir.Span) -> tuple[str, int, int]:
    return span.file, span.line, span.col


def _steps(prefix: Any) -> list[tuple[int, int]]:
    """The (stage, branch) decisions of a parent-linked prefix, from the entry on."""
    out: list[tuple[int, int]] = []
    while prefix is not None:
        prefix, si, bi = prefix
        out.append((si, bi))
    out.reverse()
    return out


class _Flow:
    def __init__(self, scenario: ir.Scenario, budget: int, clock: CpuBudget | None = None):
        self.s = scenario
        self.budget = budget
        self.clock = clock or CpuBudget()
        self.out_of_time = False  # the CPU budget ran out (`stopped_at`: where; `asking`: on what)
        self.asking = "exploring which values reach each stage"  # the question being decided, for I302
        self.ex: Explorer = explorer_for(scenario)
        self.sp: Space = self.ex.sp
        self.complete = True
        # stage index -> list of (projected region, prefix [(stage idx, branch idx)])
        self.contexts: dict[int, list[tuple[tuple[Box, ...], list[tuple[int, int]]]]] = {}
        self.fired: set[tuple[int, int]] = set()
        self.checks_left = MAX_WITNESS_CHECKS
        self.steps_left = STEP_BUDGET
        self.stopped_at: int | None = None  # stage index where the step budget ran out
        self.undecided_at: int | None = None  # stage where the first feasibility question stayed open
        self.bounded_at: int | None = None  # stage where the exploration met its bound on states or region size
        self.reads: dict[tuple[int, int], frozenset[int]] = {}
        self.states = 0  # states explored so far
        self.at = 0  # the stage of the latest charge (where a question cut short by the CPU budget was asked)

    def spend(self, si: int, n: int = 1) -> bool:
        """Charge `n` region operations at stage `si`; False once the budget is spent (the rest
        of the analysis is then skipped and reported as not proven, never guessed)."""
        self.steps_left -= n
        self.at = si
        if self.steps_left < 0 or self.clock.out():
            self.out_of_time = self.out_of_time or self.steps_left >= 0
            if self.stopped_at is None:
                self.stopped_at = si
            self.complete = False
            return False
        return True

    def guard_reads(self, si: int, bi: int, guard: Any) -> frozenset[int]:
        key = (si, bi)
        hit = self.reads.get(key)
        if hit is None:
            hit = frozenset(self.sp.base_reads(guard)) if guard is not None else frozenset()
            self.reads[key] = hit
        return hit

    def _spend_check(self) -> bool:
        """Witness checks are bounded so that huge SOPs stay linear; past the bound, stop looking."""
        self.checks_left -= 1
        return self.checks_left >= 0 and not self.clock.out()

    def run(self) -> list[Diagnostic]:
        out: list[Diagnostic] = []
        out += self.duplicate_match_values()
        if self.ex.start is None:
            return out
        _guarded(self, self.explore)
        overlaps: list[tuple[int, int, Diagnostic]] = []
        for si in range(len(self.ex.ids)):
            ctxs = self.contexts.get(si)
            if not ctxs:
                continue
            stage = self.ex.stage_objs[si]
            undecided = self.sp.undecided
            d = _guarded(self, self.non_exhaustive, si, stage, ctxs)
            if d is not None:
                out.append(d)
            if stage.kind == "when":
                overlaps += _guarded(self, self.overlaps, si, stage, ctxs) or []
            if self.sp.undecided > undecided and self.undecided_at is None:
                self.undecided_at = si
        dead = (_guarded(self, self.dead_branches) or []) if self.complete else []
        dead_keys = {(si, bi) for si, bi, _d in dead}
        # a later guard that is entirely shadowed gets W303/W304 instead of W301
        out += [d for si, bi, d in overlaps if (si, bi) not in dead_keys]
        out += [d for _si, _bi, d in dead]
        note = self.not_proven()
        if note is not None:
            out.append(note)
        return out

    def not_proven(self) -> Diagnostic | None:
        """I302 when a bound cut the analysis short or a question stayed open: says what was not
        proven and where (the stage, and the question), so a clean result is never mistaken for a proof."""
        what: list[str] = []
        at: int | None = None  # the stage the note points at
        if self.stopped_at is not None and self.out_of_time:
            at = self.stopped_at
            what.append(f"the analysis reached its CPU budget ({self.clock.describe()}) at stage `{self.ex.ids[at]}` "
                        f"while {self.asking}; overlaps, exhaustiveness and never-taken branches from there on were "
                        "not checked")
        elif self.stopped_at is not None:
            at = self.stopped_at
            what.append(f"the analysis reached its work budget ({STEP_BUDGET:,} region operations) at stage "
                        f"`{self.ex.ids[at]}`; overlaps, exhaustiveness and never-taken branches from there on were "
                        "not checked")
        elif not self.complete:
            at = self.bounded_at
            where = f" at stage `{self.ex.ids[at]}`" if at is not None else ""
            what.append(f"the exploration reached its bound on states or region size{where}; never-taken branches "
                        "(W303/W304) were not checked")
        if self.sp.undecided:
            asked = self.undecided_at
            at = asked if at is None else at
            where = f", the first at stage `{self.ex.ids[asked]}`" if asked is not None else ""
            what.append(f"{self.sp.undecided} feasibility question(s) stayed undecided{where} (no example found and "
                        "no proof within the solver's budget), so branches there may be reported as reachable")
        if not what:
            return None
        notes = []
        if self.sp.undecided_texts:
            notes.append("undecided: " + "; ".join(self.sp.undecided_texts[:3]))
        if self.sp.unproven:
            notes.append("kept whole and decided by the solver: " + "; ".join(f"`{t}`" for t in self.sp.unproven[:3]))
        return Diagnostic(code="I302", severity="info", message="flow analysis incomplete: " + what[0],
                          span=self.ex.stage_objs[at].span if at is not None else self.s.span,
                          hint="split large conditions into smaller derived variables, or test "
                          "the SOP with `sop paths` and `sop decide`", notes=what[1:] + notes)

    # -- exploration -----------------------------------------------------------------------------

    def explore(self) -> None:
        ex = self.ex
        rk = ex.root_key()
        assert rk is not None
        seen: set[tuple] = {rk}
        # prefixes are parent-linked (parent, stage, branch) nodes, materialised only for a diagnostic:
        # copying a list per state would be quadratic in the depth of the graph
        stack: list[tuple[tuple, Any]] = [(rk, None)]
        while stack:
            key, prefix = stack.pop()
            si, region, vk = key
            self.states += 1
            if self.states > self.budget or len(region) > MAX_REGION or not self.spend(si, len(region)):
                self.complete = False
                self.bounded_at = si
                return
            ctxs = self.contexts.setdefault(si, [])
            if len(ctxs) < MAX_CONTEXTS:
                ctxs.append((region, prefix))
            nvk = ex.next_visited(si, vk)
            undecided = self.sp.undecided
            kids = ex.children(si, region)
            if self.sp.undecided > undecided and self.undecided_at is None:
                self.undecided_at = si
            nxt = []
            for bi, kind, tgt, creg, _u in kids:
                self.fired.add((si, bi))
                if kind == "stage" and tgt not in nvk:
                    ck = (tgt, creg, nvk)
                    if ck not in seen:
                        seen.add(ck)
                        nxt.append((ck, (prefix, si, bi)))
            stack.extend(reversed(nxt))  # depth-first in declaration order

    def full_context(self, prefix: Any, si: int, *formulas: Any) -> tuple[Box, ...] | None:
        """The region of the whole route to `si` over every variable, then constrained by `formulas`;
        None when it grows past MAX_REGION boxes or the budget (each step is charged): a route whose
        region splits at every stage made one witness search cost minutes (issue 31)."""
        sp = self.sp
        region: tuple[Box, ...] = (sp.full,)
        for f in [self.ex.fire(s, b) for s, b in _steps(prefix)] + list(formulas):
            region = sp.constrain_region(region, f)
            if not region:
                break
            if len(region) > MAX_REGION or not self.spend(si, len(region)):
                self.complete = False
                if self.bounded_at is None:
                    self.bounded_at = si
                return None
        return region

    def via(self, prefix: Any, si: int) -> str:
        ids = [self.ex.ids[s] for s, _ in _steps(prefix)] + [self.ex.ids[si]]
        if len(ids) > 8:
            ids = ids[:3] + ["..."] + ids[-4:]
        return " -> ".join(ids)

    # -- E301 ------------------------------------------------------------------------------------

    def non_exhaustive(self, si: int, stage: ir.Stage, ctxs: Sequence[Any]) -> Diagnostic | None:
        if not stage.branches or stage.branches[-1].guard is None:
            return None
        sp = self.sp
        falses = [g[1] for g in self.ex.guards(si) if g is not None]
        for region, prefix in ctxs[:MAX_CONTEXTS]:
            if not self.spend(si, len(region) * max(1, len(falses))):
                return None
            rest: Sequence[Box] = region
            for f in falses:
                rest = [b2 for b in rest for b2 in sp.split(b, f)]
                if not rest:
                    break
            if not rest or sp.decide_region(rest) is False:
                continue
            self.asking = f"looking for values no branch of `{stage.id}` covers"
            full = self.full_context(prefix, si, *falses)
            if full is None:
                return None
            for box in full:
                w = sp.witness(box, "representative")
                if w is not None and self._refused_at(w, stage.id):
                    sid = stage.id
                    return error(
                        "E301", f"no branch of `{sid}` applies to some values that reach it",
                        stage.span,
                        "add `otherwise -> ...`, or a branch for the missing case",
                        witness=w,
                        notes=[f"reached via {self.via(prefix, si)}",
                               "uncovered: " + _describe(sp, [box], self._stage_vars(stage))],
                    )
        return None

    def _refused_at(self, values: dict[str, Any], sid: str) -> bool:
        if not self._spend_check():
            return False
        try:
            trace(self.s, values)
        except DecideError as exc:
            return exc.stage == sid and exc.message.startswith("no branch")
        except Exception:  # noqa: BLE001
            return False
        return False

    def _stage_vars(self, stage: ir.Stage) -> set[str]:
        names: set[str] = set()
        for br in stage.branches:
            if br.guard is not None:
                names.update(self.sp.names[i] for i in self.sp.base_reads(br.guard))
        return names

    # -- W301 ------------------------------------------------------------------------------------

    def overlaps(self, si: int, stage: ir.Stage, ctxs: Sequence[Any]) -> list[tuple[int, int, Diagnostic]]:
        sp = self.sp
        guards = self.ex.guards(si)
        out: list[tuple[int, int, Diagnostic]] = []
        for j in range(1, len(stage.branches)):
            gj = guards[j]
            if gj is None or stage.branches[j].ordered:
                continue  # `otherwise when`: the author states that the earlier arms come first
            found = None
            guard_j_vars = set(sp.base_reads(stage.branches[j].guard))
            direct_j = set(reads(stage.branches[j].guard))
            for i in range(j):
                if guards[i] is None:
                    break
                if not self.spend(si):
                    return out
                if len(guard_j_vars) == 1 and self.guard_reads(si, i, stage.branches[i].guard) == guard_j_vars:
                    # ordered guards on one variable (`when N < 10 / when N < 50`) are the
                    # threshold idiom: first match wins by design, so no ambiguity to report
                    continue
                if len(direct_j) == 1 and set(reads(stage.branches[i].guard)) == direct_j:
                    continue  # the same idiom on one derived value (`when Total > 10 / when Total > 5`)
                if _same_effect(stage.branches[i], stage.branches[j]):
                    continue  # either arm does the same thing: the overlap cannot matter
                if self._special_case_first(si, guards[i], gj, ctxs):
                    continue  # `when A and B -> …` before `when A -> …`: the special case written first
                fire_i = self.ex.fire(si, i)
                self.asking = (f"checking whether `{clip(ir.show(stage.branches[j].guard))}` overlaps "
                               f"`{clip(ir.show(stage.branches[i].guard))}` in `{stage.id}`")
                for region, prefix in ctxs[:MAX_CONTEXTS]:
                    if not self.spend(si, len(region)):
                        return out
                    both = [b3 for b in region for b2 in sp.split(b, fire_i)
                            for b3 in sp.split(b2, gj[0])]
                    if not both or sp.decide_region(both) is False:
                        continue
                    full = self.full_context(prefix, si, fire_i, gj[0])
                    if full is None:
                        return out
                    w = self._overlap_witness(full, prefix, si, i, stage.branches[j].guard)
                    if w is not None:
                        found = (i, prefix, w)
                        break
                if found:
                    break
            if not found:
                continue
            i, prefix, w = found
            bi_, bj_ = stage.branches[i], stage.branches[j]
            took, missed = _effects(bi_.target, bj_.target)
            w = self._route_values(w, prefix, si)
            out.append((si, j, warning(
                "W301",
                f"guard `{clip(ir.show(bj_.guard))}` overlaps the earlier guard `{clip(ir.show(bi_.guard))}` "
                f"of `{stage.id}`: both hold for some values that reach it, and the earlier branch wins",
                bj_.guard.span if bj_.guard is not None and bj_.guard.span.line else bj_.span,
                ("make the guards exclusive, or put the more specific one first; if the earlier branch "
                 f"should win, write `otherwise when {clip(ir.show(bj_.guard))}` to say so"),
                witness=w,
                notes=[f"reached via {self.via(prefix, si)}",
                       f"for these values the engine takes `{clip(ir.branch_label(stage, bi_))} -> {took}`, "
                       f"never `{missed}`"],
            )))
        return out

    def _special_case_first(self, si: int, gi: tuple[Any, Any] | None, gj: tuple[Any, Any],
                            ctxs: Sequence[Any]) -> bool:
        """Whether the earlier guard implies the later one wherever the stage is reached (proven: no
        context has a value where the earlier holds and the later does not). Then the later arm is
        "the rest of the general case": the usual way to write a special case first, not an overlap
        to warn about. Undecided or out of budget counts as not proven."""
        if gi is None:
            return False
        sp = self.sp
        for region, _prefix in ctxs[:MAX_CONTEXTS]:
            if not self.spend(si, len(region)):
                return False
            rest = [b3 for b in region for b2 in sp.split(b, gi[0]) for b3 in sp.split(b2, gj[1])]
            if rest and sp.decide_region(rest) is not False:
                return False
        return True

    def _route_values(self, w: dict[str, Any], prefix: Any, si: int) -> dict[str, Any]:
        """The witness restricted to the variables the route's guards read (the example then
        names what matters, not every variable of the program). A list or record (lowered into
        one plain variable per length, item and field, all sharing its declaration) is kept whole:
        a part of it is not a value the engine can take."""
        names: set[str] = set()
        for s_idx in [s for s, _ in _steps(prefix)] + [si]:
            names |= self._stage_vars(self.ex.stage_objs[s_idx])
        variables = self.s.variables
        declared = {_where(variables[n].span) for n in names if n in variables}
        kept = {k: v for k, v in w.items()
                if k in names or (k in variables and _where(variables[k].span) in declared)}
        return kept or w

    def _overlap_witness(self, full: Sequence[Box], prefix: Any, si: int, i: int,
                         guard_j: Any) -> dict[str, Any] | None:
        steps = _steps(prefix)
        want_stages = [self.ex.ids[s] for s, _ in steps] + [self.ex.ids[si]]
        want_branches = [b for _, b in steps] + [i]
        for box in full:
            w = self.sp.witness(box, "representative")
            if w is None:
                continue
            if not self._spend_check():
                return None
            try:
                stages, branches = trace(self.s, w)
            except Exception:  # noqa: BLE001
                continue
            n = len(want_stages)
            if stages[:n] != want_stages or branches[:n] != want_branches:
                continue
            try:
                if Interpreter(self.s, w).eval(guard_j):
                    return w
            except Exception:  # noqa: BLE001
                continue
        return None

    # -- W305 ------------------------------------------------------------------------------------

    def duplicate_match_values(self) -> list[Diagnostic]:
        out: list[Diagnostic] = []
        for stage in self.s.stages.values():
            if stage.kind != "match":
                continue
            first: dict[Any, int] = {}
            for bi, br in enumerate(stage.branches):
                for lit in br.values:
                    key = (type(lit.value).__name__, lit.value)
                    if key in first:
                        prev = stage.branches[first[key]]
                        subj = ir.show(stage.subject) if stage.subject is not None else "the subject"
                        witness = None
                        if isinstance(stage.subject, ir.Var):
                            witness = {stage.subject.name: lit.value}
                        out.append(warning(
                            "W305",
                            f"`{ir.show_value(lit.value)}` is matched twice in `{stage.id}`: this arm "
                            f"never sees it",
                            lit.span if lit.span.line else br.span,
                            "remove the duplicate value",
                            witness=witness,
                            notes=[f"{subj} == {ir.show_value(lit.value)} already goes to "
                                   f"`{prev.target.describe()}` (arm {first[key] + 1})"],
                        ))
                    else:
                        first[key] = bi
        return out

    # -- W303 / W304 -----------------------------------------------------------------------------

    def dead_branches(self) -> list[tuple[int, int, Diagnostic]]:
        sp = self.sp
        out: list[tuple[int, int, Diagnostic]] = []
        for si, ctxs in self.contexts.items():
            stage = self.ex.stage_objs[si]
            undecided = sp.undecided
            for bi, br in enumerate(stage.branches):
                if (si, bi) in self.fired:
                    continue
                if br.target.kind == "stage" and br.target.stage not in self.s.stages:
                    continue  # undefined target: the checker's E103
                label = clip(ir.branch_label(stage, br) or "->")
                target = br.target.describe()
                span = br.guard.span if br.guard is not None and br.guard.span.line else br.span
                if stage.kind == "match" and br.values and all(
                        (type(v.value).__name__, v.value) in self._earlier_values(stage, bi) for v in br.values):
                    continue  # every value is a duplicate: already W305
                local = sp.split(sp.full, self.ex.fire(si, bi))
                if not local or sp.decide_region(local) is False:
                    own = sp.split(sp.full, sp.formula(br.guard, True)) if br.guard is not None else [sp.full]
                    if br.guard is not None and (not own or sp.decide_region(own) is False):
                        why = f"the guard `{clip(ir.show(br.guard))}` is never true"
                    else:
                        earlier = [clip(ir.branch_label(stage, b)) for b in stage.branches[:bi]]
                        why = "the earlier branches already cover every case: " + "; ".join(
                            f"`{e}`" for e in earlier)
                    out.append((si, bi, warning(
                        "W304", f"branch `{label} -> {target}` of `{stage.id}` can never be taken", span,
                        "remove the branch, or fix its guard",
                        notes=[why],
                    )))
                    continue
                names = self._stage_vars(stage)
                boxes = [b for region, _p in ctxs for b in region]
                reach = _describe(sp, boxes, names) if names else ""
                notes = []
                if reach:
                    notes.append(f"every path reaching `{stage.id}` has {reach}")
                if br.guard is not None:
                    notes.append(f"this branch needs `{clip(ir.show(br.guard))}`"
                                 + (" after the earlier guards are false" if bi else ""))
                else:
                    notes.append("the earlier guards already hold for every value that reaches it")
                ways = sorted({self.via(p, si) for _r, p in ctxs})
                notes.append("reached via " + "; ".join(ways[:3]) + (" ..." if len(ways) > 3 else ""))
                hint = "remove the branch, or fix the guards on the way to it"
                rechecked = [n for n in names if (v := self.s.variables.get(n)) is not None and v.role == "field"
                             and re.search(rf"(?<![\w.]){re.escape(n)}(?![\w.])", reach)]
                if rechecked:  # `do AskReference -> recheck` then `when missing(Reference)` again
                    hint += (f"; `{rechecked[0]}` keeps one value for the whole conversation and the way here "
                             "already decided it (asking again does not change it): test it once; a backend value "
                             "read again after an action is a system variable with `observe`")
                out.append((si, bi, warning(
                    "W303",
                    f"infeasible path: branch `{label} -> {target}` of `{stage.id}` is never taken "
                    f"by the values that reach `{stage.id}`",
                    span, hint,
                    notes=notes,
                )))
            if sp.undecided > undecided and self.undecided_at is None:
                self.undecided_at = si
        return out

    def _earlier_values(self, stage: ir.Stage, bi: int) -> set[tuple[str, Any]]:
        return {(type(v.value).__name__, v.value) for b in stage.branches[:bi] for v in b.values}


def _same_effect(a: ir.Branch, b: ir.Branch) -> bool:
    """Two branches that go to the same place doing the same actions with the same arguments and outputs,
    compared as written: the expressions' structure, not where they stand (every node has its own span)."""
    ta, tb = a.target, b.target
    if (ta.kind, ta.stage, ta.action, a.limit) != (tb.kind, tb.stage, tb.action, b.limit):
        return False
    return _without_spans(ta.model_dump()) == _without_spans(tb.model_dump())


def _effects(a: ir.Target, b: ir.Target) -> tuple[str, str]:
    """Two targets in words, short (`do Refund -> check`) unless only their arguments or outputs tell
    them apart: then as written (`do Refund(amount = Total) { Channel = Voucher }`)."""
    short_a, short_b = a.describe(), b.describe()
    if short_a != short_b:
        return short_a, short_b
    return _written(a), _written(b)


def _written(t: ir.Target) -> str:
    steps = [text if text.startswith("for ") else f"do {text}" for text in map(ir.show_step, t.steps)]
    if t.kind == "stage":
        return " -> ".join([*steps, str(t.stage)])
    sets = ", ".join(f"{o.name} = {ir.show(o.value)}" for o in t.outputs)
    return " -> ".join([*steps, f"do {ir.show_call(str(t.action), t.args)}" + (f" {{ {sets} }}" if sets else "")])


def _without_spans(value: Any) -> Any:
    """A dumped IR node without its positions (`span`, `pattern_span`, …) at any depth."""
    if isinstance(value, dict):
        return {k: _without_spans(v) for k, v in value.items() if k != "span" and not k.endswith("_span")}
    if isinstance(value, list):
        return [_without_spans(v) for v in value]
    return value


def _describe(sp: Space, boxes: Sequence[Box], names: set[str]) -> str:
    text = sp.describe_region(tuple(boxes))
    parts = [f"{k} {relation_text(v)}" for k, v in text.items() if k in names]
    if "where" in text:
        parts.append(text["where"])
    return ", ".join(parts) if parts else "no constraint on the variables it reads"


__all__ = ["FlowWork", "flow_diagnostics"]
