"""Feasible paths of an SOP: enumerate, count and sample them without brute force.

A *path* is the sequence of decisions (stage, branch index) the engine takes from the entry stage
to a leaf (`do Action`). It is *feasible* when some assignment of the fields and system variables
makes the engine take exactly those decisions. Paths are explored as regions (unions of
`domain.Box`) of the assignments still possible; a prefix whose region is proven empty is pruned.

Public API (stable; the synthesis engineer builds on it):

- `PathInfo` — pydantic record of one path: `id` ("P" + 1-based rank in depth-first, declaration
  order, zero-padded to the digits of the total — or to 12 digits when the total would cost more
  than 50,000 DP states; stable across runs and independent of `limit`), `rank`, `stages`, `branches`,
  `labels`, `action`, `finals` (constant values, `None` where an output varies along the path, see
  `finals_varying`), `constraints` (variable → text of its remaining domain; `where` holds the
  conditions relating several variables, as the path's decisions write them: see `as_written`),
  `status` ("feasible": a witness was verified by the engine; "unknown": not proven either way),
  `witness`/`witness_finals` (representative assignment of every field and system variable and the
  finals the engine gives it), `boundary_witness`/`boundary_finals`.
- `iter_paths(scenario, *, limit=None, witnesses=True) -> Iterator[PathInfo]` — lazy, depth-first in
  declaration order; `limit` stops early without exploring the rest.
- `iter_decisions(scenario) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]` — the same paths
  as bare (stage ids, branch indices), the fast form for bulk use.
- `count_paths(scenario) -> PathCount(feasible, stage_sequences, exact)` — dynamic programming over
  (stage, region projected onto the variables still read downstream); never enumerates.
  `stage_sequences` counts distinct stage-id lists (paths differing only in the leaf's branch share
  one). `exact` is False only when residual predicates could be neither satisfied nor refuted (the
  counts are then upper bounds).
- `sample_paths(scenario, n, *, seed=0, weights=None, unique=False) -> list[PathInfo]` — i.i.d.
  draws, uniform over feasible paths by default (each branch chosen with probability ∝ its number
  of completions). `weights` may be a mapping action → weight (a path weighs its action's weight,
  default 1), the string "action" (every reachable action equally likely, uniform within it), or a
  callable `(stage_id, branch_index) -> float` whose product along the path is its weight.
  `unique=True` draws distinct paths. Deterministic for a seed.
- `path_by_decisions(scenario, stages, branches) -> PathInfo | None` — the record (and rank) of one
  decision sequence, computed from the counts (e.g. for the engine's answer on given values).
- `decision_conditions(scenario, stages, branches)` — the single conditions a path's decisions state,
  as written, with the variables each reads.
- `trace(scenario, values) -> (stage ids, branch indices)` — the engine's decisions for values;
  `verify(scenario, values, stages, branches) -> finals | None` — the check every witness passes.
- `explorer_for(scenario)` — the memoised machinery behind all of the above (`full_region(stage
  indices, branches)` gives a path's region as `domain.Box`es).

Cycles: the engine's values never change while it walks the graph, so an assignment that revisits
a stage loops forever. Paths are therefore simple; revisits are pruned.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, Literal

from pydantic import BaseModel, Field

from sopgraph.language import ir
from sopgraph.language.compile import reads as compile_reads
from sopgraph.logic.budget import CpuBudget, OutOfCpu, active, check_active
from sopgraph.logic.domain import Box, variables_signature
from sopgraph.logic.engine import DecideError, Interpreter, interpret, looks_taken, run
from sopgraph.logic.guards import NEGATED_OP
from sopgraph.logic.lower import Lowered, analysis_form, needs_analysis_form
from sopgraph.logic.pathgraph import Child, Region, RegionGraph
from sopgraph.logic.unroll import LOOK_SEP, Unrolled, held_variables, path_looks

ID_COUNT_BUDGET = 50_000  # DP states spent on the id width before falling back to WIDE_IDS
COUNT_BUDGET = 100_000  # DP states of one count (paths or stage sequences) before it stops, incomplete
WIDE_IDS = 12
FULL_REGION_CAP = 128  # boxes of one path's whole region; past it, the next guard is kept as a residual literal


class _Budget(Exception):
    """Internal: a bounded dynamic program ran out of states."""
Weights = Mapping[str, float] | Callable[[str, int], float] | str | None


class PathInfo(BaseModel):
    """One feasible path (see the module docstring for the fields)."""

    id: str
    rank: int
    stages: list[str]
    branches: list[int]
    labels: list[str] = Field(default_factory=list)
    action: str
    finals: dict[str, Any]
    finals_varying: dict[str, str] = Field(default_factory=dict)
    constraints: dict[str, str] = Field(default_factory=dict)
    status: Literal["feasible", "unknown"] = "feasible"
    actions: list[str] = Field(default_factory=list)  # the action trace: steps, then the final action
    witness: dict[str, Any] | None = None
    witness_finals: dict[str, Any] | None = None
    boundary_witness: dict[str, Any] | None = None
    boundary_finals: dict[str, Any] | None = None


class PathCount(BaseModel):
    """Counts of feasible paths and of distinct stage sequences."""

    feasible: int  # when not `complete`: a lower bound (the paths through one counted state)
    stage_sequences: int  # when not `complete`: a lower bound likewise, 0 when not reached
    exact: bool
    complete: bool = True  # False: the count stopped at COUNT_BUDGET states (the paths are too many) or its CPU budget
    stopped: str | None = None  # past the CPU budget: where and on what the count stopped (else None)


# A child of a state: (branch index, kind, target, child region, uncertain)
#   kind "action": target is the action name, child region is the leaf's region (projected)
#   kind "stage": target is the stage index, child region is projected onto the target's live set


class Explorer(RegionGraph):
    """Per-scenario path machinery: the region graph (`pathgraph.RegionGraph`) with memoised counts,
    enumeration and path records. Obtain with `explorer_for(scenario)`."""

    def __init__(self, scenario: ir.Scenario):
        super().__init__(scenario)
        self.count_memo: dict[tuple, int] = {}
        self.seq_memo: dict[tuple, int] = {}
        self._total: PathCount | None = None
        self._counting: int | None = None  # the stage whose branches the count is deciding (for `stopped`)
        self._width: int | None = None

    # -- dynamic programming ---------------------------------------------------------------------

    def _evaluate(self, root: tuple, expand: Callable[[tuple], tuple[Any, list[tuple[Any, tuple]]]],
                  memo: dict, max_states: int | None = None) -> Any:
        """Post-order evaluation of value(key) = base + Σ coef·value(child), iteratively. Raises
        `_Budget` after `max_states` new states (the memo keeps what was completed)."""
        if root in memo:
            return memo[root]
        pending: dict[tuple, tuple[Any, list[tuple[Any, tuple]]]] = {}
        stack = [root]
        expanded = 0
        while stack:
            key = stack[-1]
            if key in memo:
                stack.pop()
                continue
            exp = pending.get(key)
            if exp is None:
                expanded += 1
                if max_states is not None and expanded > max_states:
                    raise _Budget
                self._counting = key[0]
                check_active()  # a count past its CPU budget stops here (`count`)
                exp = expand(key)
                pending[key] = exp
            missing = [ck for _, ck in exp[1] if ck not in memo and ck not in pending]
            if missing:
                stack.extend(reversed(missing))
                continue
            total = exp[0]
            for coef, ck in exp[1]:
                v = memo.get(ck)
                if v is None:  # a cycle in the key graph (cannot happen with visited sets)
                    self.uncertain = True
                    continue
                total = total + coef * v
            memo[key] = total
            del pending[key]
            stack.pop()
        return memo[root]

    def _expand_paths(self, key: tuple) -> tuple[int, list[tuple[int, tuple]]]:
        si, region, vk = key
        base = 0
        kids: list[tuple[int, tuple]] = []
        nvk = self.next_visited(si, vk)
        for _bi, kind, tgt, creg, unsure in self.children(si, region):
            if unsure:
                self.uncertain = True
            if kind == "action":
                base += 1
            elif tgt not in nvk:
                kids.append((1, (tgt, creg, nvk)))
        return base, kids

    def _expand_seqs(self, key: tuple) -> tuple[int, list[tuple[int, tuple]]]:
        si, region, vk = key
        base = 0
        nvk = self.next_visited(si, vk)
        groups: dict[int, list[Box]] = {}
        for _bi, kind, tgt, creg, _u in self.children(si, region):
            if kind == "action":
                base = 1
            elif tgt not in nvk:
                groups.setdefault(tgt, []).extend(creg)
        kids = [(1, (t, self.sp.normalize(boxes), nvk)) for t, boxes in groups.items()]
        return base, kids

    def root_key(self) -> tuple | None:
        if self.start is None:
            return None
        return (self.start, self.root_region(), frozenset())

    def count(self, clock: CpuBudget | None = None) -> PathCount:
        """The counts, within `clock` when given: past it, an incomplete count with lower bounds whose
        `stopped` says at which stage it was deciding the branches (not kept: a later call goes on)."""
        if self._total is not None:
            return self._total
        rk = self.root_key()
        if rk is None:
            self._total = PathCount(feasible=0, stage_sequences=0, exact=True)
            return self._total
        # `uncertain` is sticky: set whenever an undecided child was met
        try:
            with active(clock) if clock is not None else nullcontext():
                n = self._evaluate(rk, self._expand_paths, self.count_memo, COUNT_BUDGET)
                s = self._evaluate(rk, self._expand_seqs, self.seq_memo, COUNT_BUDGET)
        except OutOfCpu as stop:
            at = self.ids[self._counting] if self._counting is not None else self.ids[rk[0]]
            return PathCount(feasible=max(self.count_memo.values(), default=0),
                             stage_sequences=max(self.seq_memo.values(), default=0), exact=False, complete=False,
                             stopped=f"the count reached its CPU budget ({stop.clock.describe()}) at stage `{at}` "
                                     "while deciding which of its branches the values reaching it can take")
        except _Budget:  # too many paths to count: say so, with lower bounds, instead of running on
            lower = max(self.count_memo.values(), default=1)
            seqs = max(self.seq_memo.values(), default=0)
            self._total = PathCount(feasible=max(1, lower), stage_sequences=seqs, exact=False, complete=False)
            return self._total
        self._total = PathCount(feasible=n, stage_sequences=s, exact=not self.uncertain)
        return self._total

    def subcount(self, key: tuple) -> int:
        return self._evaluate(key, self._expand_paths, self.count_memo)

    # -- enumeration -----------------------------------------------------------------------------

    def iter_raw(self) -> Iterator[tuple[list[int], list[int], str]]:
        """Depth-first (stage indices, branch indices, action); the lists are reused: copy them."""
        rk = self.root_key()
        if rk is None:
            return
        si0, reg0, vk0 = rk
        frames: list[list[Any]] = [[si0, vk0, self.children(si0, reg0), 0]]
        stages = [si0]
        branches: list[int] = []
        children = self.children
        cyclic = self.cyclic
        while frames:
            fr = frames[-1]
            kids = fr[2]
            pos = fr[3]
            if pos >= len(kids):
                frames.pop()
                stages.pop()
                if branches:
                    branches.pop()
                continue
            fr[3] = pos + 1
            bi, kind, tgt, creg, _u = kids[pos]
            if kind == "action":
                branches.append(bi)
                yield stages, branches, tgt
                branches.pop()
                continue
            si = fr[0]
            vk = fr[1] | {si} if si in cyclic else fr[1]
            if tgt in vk or tgt == si:
                continue
            frames.append([tgt, vk, children(tgt, creg), 0])
            stages.append(tgt)
            branches.append(bi)

    # -- path records ----------------------------------------------------------------------------

    def full_region(self, stages: Sequence[int], branches: Sequence[int]) -> Region:
        """Region of the whole path over all variables (nothing projected away)."""
        sp = self.sp
        region: Region = (sp.full,)
        for si, bi in zip(stages, branches, strict=True):
            region = sp.constrain_region(region, self.fire(si, bi), FULL_REGION_CAP)
            if not region:
                break
        return region

    def prefix_regions(self) -> Callable[[Sequence[int], Sequence[int]], Region]:
        """A `full_region` that reuses the regions of the previous call's common prefix (cheap for
        paths listed in depth-first order)."""
        sp = self.sp
        fulls: list[Region] = [(sp.full,)]
        prev: list[tuple[int, int]] = []

        def region(stages: Sequence[int], branches: Sequence[int]) -> Region:
            dec = list(zip(stages, branches, strict=True))
            k = 0
            limit = min(len(dec), len(prev), len(fulls) - 1)
            while k < limit and dec[k] == prev[k]:
                k += 1
            del fulls[k + 1:]
            for si, bi in dec[k:]:
                cur = fulls[-1]
                fulls.append(sp.constrain_region(cur, self.fire(si, bi), FULL_REGION_CAP) if cur else ())
            prev[:] = dec
            return fulls[-1]

        return region

    def width(self) -> int:
        """Digits of the path ids: those of the total count, or WIDE_IDS when counting would take
        more than ID_COUNT_BUDGET states (so that `--limit` stays instant on huge graphs)."""
        if self._width is None:
            if self._total is not None and self._total.complete:
                self._width = max(2, len(str(self._total.feasible)))
            else:
                rk = self.root_key()
                try:
                    n = 0 if rk is None else self._evaluate(rk, self._expand_paths, self.count_memo,
                                                            ID_COUNT_BUDGET)
                    self._width = max(2, len(str(n)))
                except _Budget:
                    self._width = WIDE_IDS
        return self._width

    def make_info(self, rank: int, stages: Sequence[int], branches: Sequence[int], action: str,
                  region: Region | None = None, witnesses: bool = True) -> PathInfo:
        if region is None:
            region = self.full_region(stages, branches)
        stage_ids = [self.ids[s] for s in stages]
        labels = [self.label(si, bi) for si, bi in zip(stages, branches, strict=True)]
        leaf = self.stage_objs[stages[-1]].branches[branches[-1]].target
        finals, varying = self.leaf_finals(leaf, region)
        info: dict[str, Any] = {
            "id": f"P{rank:0{self.width()}d}" if rank > 0 else walk_id(stage_ids, branches),
            "rank": rank,
            "stages": stage_ids,
            "branches": list(branches),
            "labels": labels,
            "action": action,
            "finals": finals,
            "finals_varying": varying,
            "constraints": self.sp.describe_region(region),
            "status": "unknown",
            "actions": self.action_trace(stages, branches),
        }
        if witnesses:
            for style, wkey, fkey in (("representative", "witness", "witness_finals"),
                                      ("boundary", "boundary_witness", "boundary_finals")):
                found = self.find_witness(region, stage_ids, branches, style)
                if found is not None:
                    info[wkey], info[fkey] = found
                    info["status"] = "feasible"
        elif self.sp.decide_region(region):
            info["status"] = "feasible"
        return PathInfo.model_construct(**{**_DEFAULTS, **info})

    def action_trace(self, stages: Sequence[int], branches: Sequence[int]) -> list[str]:
        """The actions a path carries out, as written (`Reset(mode = Soft)`), the final one last."""
        return written_actions([self.stage_objs[si] for si in stages], branches)

    def find_witness(self, region: Region, stage_ids: list[str], branches: Sequence[int], style: str,
                     rng: random.Random | None = None) -> tuple[dict, dict] | None:
        """A witness of the region that the engine verifiably routes along exactly this path."""
        for box in region:
            w = self.sp.witness(box, style, rng)
            if w is None:
                continue
            finals = verify(self.scenario, w, stage_ids, branches)
            if finals is not None:
                return w, finals
        return None

    def leaf_finals(self, target: ir.Target, region: Region) -> tuple[dict[str, Any], dict[str, str]]:
        finals: dict[str, Any] = {"Action": target.action}
        varying: dict[str, str] = {}
        assigned = {a.name: a.value for a in target.outputs}
        for name, out in self.scenario.outputs.items():
            if name not in assigned:
                finals[name] = out.default.value if out.default is not None else None
                continue
            expr = assigned[name]
            if isinstance(expr, ir.Lit):
                finals[name] = expr.value
                continue
            values, opaque = self.possible_values(expr, region)
            if not opaque and len(values) == 1:
                finals[name] = values[0]
            else:
                finals[name] = None
                if not opaque and values:
                    varying[name] = " | ".join(ir.show_enum_value(v) if isinstance(v, str) else ir.show_value(v)
                                               for v in values)
                else:
                    varying[name] = ir.show(expr)
        return finals, varying

    def possible_values(self, expr: Any, region: Region) -> tuple[list[Any], bool]:
        """Constant values an expression can take on the region; bool = some value is not constant."""
        sp = self.sp
        values: list[Any] = []
        opaque = False
        for g, v in sp.term(expr):
            sub = sp.constrain_region(region, g)
            if not sub or sp.decide_region(sub) is False:
                continue
            if v[0] == "c":
                if v[1] not in values:
                    values.append(v[1])
            elif v[0] == "v":
                i = v[1]
                doms = {b.doms[i] for b in sub}
                if len(doms) == 1:
                    (d,) = doms
                    k = sp.kinds[i]
                    if k in ("enum", "bool"):
                        vals = sp.dom_values(i, d)
                        if len(vals) == 1:
                            if vals[0] not in values:
                                values.append(vals[0])
                            continue
                    elif k in ("int", "float") and d.lo == d.hi:
                        x = int(d.lo) if k == "int" else float(d.lo)
                        if x not in values:
                            values.append(x)
                        continue
                opaque = True
            else:
                opaque = True
        return values, opaque


_DEFAULTS: dict[str, Any] = {
    "labels": [], "actions": [], "finals_varying": {}, "constraints": {}, "status": "feasible", "witness": None,
    "witness_finals": None, "boundary_witness": None, "boundary_finals": None,
}



def _structure(scenario: ir.Scenario) -> tuple:
    """What an Explorer depends on besides the variables: entry, stages, guards and targets (so a
    scenario edited in place gets a fresh Explorer)."""
    return (scenario.start, tuple(
        (sid, tuple((id(br.guard), br.target.kind, br.target.stage, br.target.action) for br in st.branches))
        for sid, st in scenario.stages.items()))


def explorer_for(scenario: ir.Scenario) -> Explorer:
    """The scenario's explorer, built once per scenario and structure (and rebuilt with its space)."""
    signature = (_structure(scenario), variables_signature(scenario))  # the space's signature too
    return scenario.cached_analysis("explorer", signature, lambda: Explorer(scenario))


def used_looks(scenario: ir.Scenario, values: Mapping[str, Any], stages: Sequence[str] | None = None) -> dict[str, Any]:
    """`values` (in source form) with each observed variable's list of looks cut to the looks the path
    takes, and left out when it takes none: an example that gives `IdentityOk=[true, false, false]` for
    a path that looks once reads as if three looks mattered. `stages`: the path's source stage ids;
    else the engine's path for `values` (which are returned unchanged when the engine refuses them)."""
    observed = {n for st in scenario.stages.values() for n in st.observe}
    if not observed:
        return dict(values)
    if stages is None:
        try:
            stages = trace(scenario, values)[0]
        except DecideError:
            return dict(values)
    looks: dict[str, int] = {}
    for sid in stages:
        stage = scenario.stages.get(sid)
        for name in stage.observe if stage is not None else ():
            looks[name] = looks.get(name, 0) + 1
    held = held_variables(scenario)
    if held:  # a look at a held variable with nothing done since is the previous one: ask the engine
        looks.update({name: n for name, n in looks_taken(scenario, values).items() if name in held})
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in observed and isinstance(value, list):
            if looks.get(name):
                out[name] = value[:looks[name]]
            continue
        out[name] = value
    return out


def trace(scenario: ir.Scenario, values: Mapping[str, Any]) -> tuple[list[str], list[int]]:
    """The engine's decisions for `values`: stage ids and the index of the branch taken at each.
    Raises DecideError like the engine."""
    if scenario.procedural:
        decision, taken = run(scenario, values)
        return decision.path, taken
    it = Interpreter(scenario, values)
    stages: list[str] = []
    branches: list[int] = []
    sid = scenario.start
    limit = len(scenario.stages) + 1
    while sid is not None:
        if len(stages) >= limit:
            raise DecideError("the SOP loops", stage=sid)
        stage = scenario.stages.get(sid)
        if stage is None:
            raise DecideError(f"undefined stage `{sid}`", stage=sid)
        stages.append(sid)
        for i, br in enumerate(stage.branches):
            if br.guard is None or it.eval(br.guard):
                branches.append(i)
                if br.target.kind == "action":
                    return stages, branches
                sid = br.target.stage
                break
        else:
            raise DecideError(f"no branch of `{sid}` applies to these values", stage=sid)
    raise DecideError("the SOP has no entry stage")


def verify(scenario: ir.Scenario, values: Mapping[str, Any], stages: Sequence[str],
           branches: Sequence[int]) -> dict[str, Any] | None:
    """Finals if the reference engine (`interpret`) routes `values` along exactly this path."""
    try:
        decision = interpret(scenario, values)
        got_stages, got_branches = trace(scenario, values)
    except (DecideError, TypeError, ValueError, ArithmeticError, RecursionError):
        return None
    if decision.path != list(stages) or got_stages != list(stages) or got_branches != list(branches):
        return None
    return decision.finals


# ---------------------------------------------------------------------------------------------
# Public functions


def _unrolled(scenario: ir.Scenario) -> Unrolled | None:
    """The unrolled form of a procedure (observations, bounded loops), else None: paths of a
    procedure are the paths of its unrolled form, shown with the source's stage ids and values."""
    return analysis_form(scenario) if needs_analysis_form(scenario) else None


def written_actions(stages: Sequence[ir.Stage], branches: Sequence[int]) -> list[str]:
    """The actions of the branches taken, as written (`Reset(mode = Soft)`), the final one last."""
    out: list[str] = []
    for st, bi in zip(stages, branches, strict=True):
        t = st.branches[bi].target
        out += [ir.show_step(c) for c in t.steps]
        if t.kind == "action":
            out.append(ir.show_call(t.action or "", t.args))
    return out


def lift_path(info: PathInfo, u: Unrolled) -> PathInfo:
    """A path of the unrolled form in the source's terms: stage ids, observed values as lists, the actions
    as the source writes them (the analysis form leaves list and record arguments out)."""
    stages = [u.origin.get(s, s) for s in info.stages]
    update: dict[str, Any] = {"stages": stages}
    source = u.scenario_source.stages
    if all(s in source and 0 <= b < len(source[s].branches) for s, b in zip(stages, info.branches, strict=True)):
        update["actions"] = written_actions([source[s] for s in stages], info.branches)
    # the path's own looks (a held variable looked at again with nothing done is the same look):
    # later entries of the lists are never read
    looks = path_looks(u.scenario_source, stages, list(info.branches))
    for key in ("witness", "boundary_witness"):
        w = getattr(info, key)
        if w is not None:
            lifted = u.lift(w)
            for name in u.looks:
                lifted[name] = lifted.get(name, [])[:looks.get(name, 0)]
            update[key] = lifted if not _past_the_end(u, lifted, stages) else None
    constraints = dict(info.constraints)
    if isinstance(u, Lowered):
        constraints = {k: u.missing_in_source_terms(v) for k, v in constraints.items()}
        constraints = _source_constraints(u, constraints, stages, info.branches)
    else:  # said as the unrolled copies' decisions are written (looks numbered, named below)
        constraints = dict(as_written(u.scenario, info).constraints)
    if u.looks:
        constraints = {_look_text(k, looks): _look_text(v, looks) for k, v in constraints.items()}
    update["constraints"] = constraints
    update["labels"] = _source_labels(u.scenario_source, stages, info.branches, info.labels, looks)
    return info.model_copy(update=update)


def _past_the_end(u: Unrolled, values: Mapping[str, Any], stages: list[str]) -> bool:
    """Whether the source refuses a witness the analysis form routes along the path: a list position read
    past the end (W309) fails the source's run, where the analysis form reads an item variable."""
    if not (isinstance(u, Lowered) and u.positions):
        return False
    try:
        return trace(u.scenario_source, values)[0] != stages
    except DecideError:
        return True


_LOOK = re.compile(rf"([^\W\d][\w.]*){re.escape(LOOK_SEP)}(\d+)\b((?:\[\d+\]|\.[^\W\d]\w*)*)")


def _look_text(text: str, looks: Mapping[str, int]) -> str:
    """`Fixed#2` (the analysis' name for the second look at `Fixed`) as `Fixed (look 2)`, and as
    plain `Fixed` when the path looks once."""
    def one(m: re.Match[str]) -> str:
        name, k, read = m.group(1), int(m.group(2)), m.group(3)  # the look said after an item or field read of it
        return name + read if k == 1 and looks.get(name, 0) <= 1 else f"{name}{read} (look {k})"
    return _LOOK.sub(one, text) if LOOK_SEP in text else text


def _source_labels(src: ir.Scenario, stages: Sequence[str], branches: Sequence[int], labels: Sequence[str],
                   looks: Mapping[str, int]) -> list[str]:
    """Branch labels as the SOP writes them (the analysis form's guards read lowered list items and
    numbered looks)."""
    out: list[str] = []
    for sid, bi, label in zip(stages, branches, labels, strict=True):
        stage = src.stages.get(sid)
        if stage is None or bi >= len(stage.branches):
            out.append(_look_text(label, looks))
        else:
            out.append(ir.branch_label(stage, stage.branches[bi]))
    return out


def _negated_text(guard: Any) -> str:
    if isinstance(guard, ir.Compare):
        return ir.show(guard.model_copy(update={"op": NEGATED_OP[guard.op]}))
    if isinstance(guard, (ir.InSet, ir.Member)):
        return ir.show(guard.model_copy(update={"negated": not guard.negated}))
    if isinstance(guard, ir.Unary) and guard.op == "not":
        return ir.show(guard.operand)
    return f"not {ir.show(guard, 3)}"


def _source_constraints(u: Lowered, constraints: dict[str, str], stages: Sequence[str],
                        branches: Sequence[int]) -> dict[str, str]:
    """A path's region over the items of lists, said as the SOP says it. The region's boxes name
    each item (`len(Items) >= 2 and Items[0].category in {…} and Items[1].category = Jewellery`, or
    "one of 20 combinations of len(Items), Items[0].value, … (not listed)"); the decisions the path
    takes say the same exactly (`any(i in Items where i.category == Jewellery)`). So `where` becomes
    those decisions that read a list (directly or through a `let`) or relate several variables;
    constraints on single plain variables stay as they are."""
    item_keys = {k for keys in u.plain_keys.values() for k in keys if "[" in k or k.startswith("len(")}
    where = constraints.get("where", "")
    if not item_keys or not any(k in item_keys or k in where for k in item_keys):
        return constraints
    src = u.scenario_source
    relates = _relations_for(src)
    # the roots of an observed list are its looks (`Fees#2`); the source's relations know `Fees`
    lists = relates.readers({n.rpartition(LOOK_SEP)[0] if n.rpartition(LOOK_SEP)[0] in u.inner.looks else n
                             for n in u.roots if any(k in item_keys for k in u.plain_keys[n])})
    clauses = _decision_clauses(src, relates, stages, branches, constraints, lists)
    if clauses is None:
        return constraints  # not the source's shape: keep the summary
    out = {k: v for k, v in constraints.items() if k != "where" and k not in item_keys}
    if clauses:
        out["where"] = " and ".join(clauses)
    return out


def _relations_for(scenario: ir.Scenario) -> _Relations:
    """The scenario's `_Relations`, built once per scenario and set of variables, not per path."""
    return scenario.cached_analysis("path_relations", variables_signature(scenario), lambda: _Relations(scenario))


def _decision_clauses(src: ir.Scenario, relates: _Relations, stages: Sequence[str], branches: Sequence[int],
                      constraints: Mapping[str, str], lists: set[str]) -> list[str] | None:
    """The conditions a path's decisions state, as the SOP writes them: each earlier arm of a stage
    negated, then the arm taken. Conditions that the per-variable constraints already say exactly
    (and that read no list in `lists`) are left out. None when the path does not fit `src`."""
    pairs = _path_conditions(src, stages, branches)
    if pairs is None:
        return None
    known: dict[str, frozenset[Any]] = {}
    for name, text in constraints.items():  # the values the per-variable constraints leave (`Calm | Upset`)
        var = src.variables.get(name)
        values = text.split(" | ")
        if var is not None and isinstance(var.type, ir.EnumType) and set(values) <= set(var.type.values):
            known[name] = frozenset(values)
        elif var is not None and isinstance(var.type, ir.BoolType) and text in ("true", "false"):
            known[name] = frozenset({text == "true"})
    known.update((name, frozenset({value})) for name, value in
                 (e for e in (_equality(g, n) for g, n in pairs) if e is not None))
    clauses: list[str] = []
    for guard, negated in pairs:
        reads = set(compile_reads(guard))
        listed = relates.listed(reads)
        if not reads & lists and ((listed and relates.per_variable(guard, not negated)
                                   and not _unsaid_presence(guard, constraints))
                                  or relates.implied(guard, not negated, constraints)):
            continue  # constraints on single variables: listed per variable (and they imply this one)
        if _settled(guard, negated, known):
            continue  # `Tier != High` next to `Tier == Medium`
        guard = _without_known(guard, negated, known)
        text = _negated_text(guard) if negated else ir.show(guard, 2)
        if text not in clauses:
            clauses.append(text)
    return clauses


def _unsaid_presence(guard: Any, constraints: Mapping[str, str]) -> bool:
    """Whether `guard` tests `missing(X)` for an `X` the per-variable constraints do not name: whether
    a value is there is said by no per-variable constraint, so the condition must stay in `where`."""
    stack = [guard]
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Func) and e.name == "missing":
            if any(not (isinstance(a, ir.Var) and a.name in constraints) for a in e.args):
                return True
            continue
        stack.extend(ir.children(e))
    return False


def _path_conditions(src: ir.Scenario, stages: Sequence[str],
                     branches: Sequence[int]) -> list[tuple[Any, bool]] | None:
    """The single conditions (guard, passed by) a path's decisions state in order: each earlier arm of a
    stage negated, then the arm taken, split by `_conjuncts`; None when the path does not fit `src`."""
    pairs: list[tuple[Any, bool]] = []
    for sid, bi in zip(stages, branches, strict=True):
        stage = src.stages.get(sid)
        if stage is None or bi >= len(stage.branches):
            return None
        if stage.kind == "goto":
            continue
        guards = [(b.guard, True) for b in stage.branches[:bi] if b.guard is not None]
        own = stage.branches[bi].guard
        if own is not None:
            guards.append((own, False))
        pairs += _conjuncts(guards)
    return pairs


def _equality(guard: Any, negated: bool) -> tuple[str, Any] | None:
    """(name, value) when the condition says a variable equals one value (`Tier == High`, a passed-by
    `Tier != High`, `Report in {Lost}`); else None."""
    if isinstance(guard, ir.Compare) and guard.op in ("==", "!=") and (guard.op == "==") != negated:
        if isinstance(guard.left, ir.Var) and isinstance(guard.right, ir.Lit):
            return guard.left.name, guard.right.value
        if isinstance(guard.right, ir.Var) and isinstance(guard.left, ir.Lit):
            return guard.right.name, guard.left.value
    if (isinstance(guard, ir.InSet) and isinstance(guard.operand, ir.Var) and len(guard.values) == 1
            and guard.negated == negated):
        return guard.operand.name, guard.values[0].value
    return None


def _settled(guard: Any, negated: bool, known: Mapping[str, frozenset[Any]]) -> bool:
    """Whether the values the path leaves its enums and bools (`known`) already make this condition
    hold: `Tier != High`, or `not (Tier == High and …)`, next to `Tier = Medium`."""
    if negated and isinstance(guard, ir.BoolOp) and guard.op == "and":
        # one operand of a passed-by `and` that cannot hold settles the whole
        return any(_known_truth(part, known) is False for part in guard.operands)
    if negated:  # `X == w` passed by (a taken `X == w` is where the value comes from: kept)
        return _equality(guard, False) is not None and _known_truth(guard, known) is False
    return _equality(guard, True) is not None and _known_truth(guard, known) is True  # `X != w` taken


def _known_truth(condition: Any, known: Mapping[str, frozenset[Any]]) -> bool | None:
    """Whether `X == w` or `X != w` (`X in {w}`, `X not in {w}`) holds given the values the path
    leaves `X` elsewhere (`known`); None when it is not one of those, or it may go either way."""
    for negated in (False, True):
        eq = _equality(condition, negated)  # `X == w`, or (negated) `X != w`
        if eq is not None and eq[0] in known:
            values = known[eq[0]]
            if eq[1] not in values:
                return negated
            if values == {eq[1]}:
                return not negated
    return None


def _without_known(guard: Any, negated: bool, known: Mapping[str, frozenset[Any]]) -> Any:
    """A passed-by `not (A and B)` whose `A` the path already makes true said as `not B`: on a path
    with `Reason = Other`, `not (Reason != Fraud and Days > 120)` is `Days <= 120`."""
    if not (negated and isinstance(guard, ir.BoolOp) and guard.op == "and"):
        return guard
    rest = [part for part in guard.operands if _known_truth(part, known) is not True]
    if not rest or len(rest) == len(guard.operands):
        return guard
    return rest[0] if len(rest) == 1 else guard.model_copy(update={"operands": rest})


def _conjuncts(guards: list[tuple[Any, bool]]) -> Iterator[tuple[Any, bool]]:
    """Each (guard, negated) split into the conditions that must all hold: the operands of an `and`
    taken, of an `or` passed by (`not (A or B)` is `not A` and `not B`), so each is left out or
    kept on its own (`Loyal and Mood == Calm` next to `Mood = Calm` keeps `Loyal`)."""
    for guard, negated in guards:
        if isinstance(guard, ir.BoolOp) and guard.op == ("or" if negated else "and"):
            yield from _conjuncts([(o, negated) for o in guard.operands])
        else:
            yield guard, negated


def decision_conditions(scenario: ir.Scenario, stages: Sequence[str],
                        branches: Sequence[int]) -> list[tuple[str, frozenset[str], Any, bool]]:
    """The single conditions a plain program's path states (`_conjuncts` of each earlier arm negated
    and of the arm taken): each as written, the variables it reads (derived ones by name), the guard and
    whether the path passes it by (negated); [] when the path does not fit the program. For tools that
    reuse a path's own words (a starter profile's `when:`)."""
    out: list[tuple[str, frozenset[str], Any, bool]] = []
    for guard, negated in _path_conditions(scenario, stages, branches) or []:
        text = _negated_text(guard) if negated else ir.show(guard, 2)
        if all(text != t for t, *_ in out):
            out.append((text, frozenset(compile_reads(guard)), guard, negated))
    return out


def as_written(scenario: ir.Scenario, info: PathInfo) -> PathInfo:
    """A plain program's path with its `where` said as its decisions are written. Why: the region's
    own text is the solver's normal form (operands flipped, `let`s inlined, a disjunction of every
    way past the earlier arms), which is exact but unreadable once several variables are related;
    the decisions the path takes say the same (`not (Hardship and Remaining > 100) and …`)."""
    if "where" not in info.constraints:
        return info
    relates = _relations_for(scenario)
    clauses = _decision_clauses(scenario, relates, info.stages, info.branches, info.constraints, set())
    if clauses is None:
        return info
    constraints = {k: v for k, v in info.constraints.items() if k != "where"}
    if clauses:
        constraints["where"] = " and ".join(clauses)
    return info.model_copy(update={"constraints": constraints})


class _Relations:
    """Which conditions per-variable constraints can show, and which need saying as written."""

    def __init__(self, scenario: ir.Scenario):
        self.scenario = scenario
        self.bases: dict[str, frozenset[str]] = {}

    def base(self, name: str, trail: frozenset[str] = frozenset()) -> frozenset[str]:
        var = self.scenario.variables.get(name)
        if var is None or var.role != "derived" or var.expr is None or name in trail:
            return frozenset({name})
        if name not in self.bases:
            self.bases[name] = frozenset(b for n in compile_reads(var.expr) for b in self.base(n, trail | {name}))
        return self.bases[name]

    IMPLIED_BUDGET = 256  # value combinations tried by `implied`

    def implied(self, expr: Any, positive: bool, constraints: Mapping[str, str]) -> bool:
        """Whether the per-variable constraints already make `expr` (or its negation) true, when it
        reads only enum and bool inputs: `not (Report == Found and CardStatus == Blocked)` next to
        `Report: Lost | Stolen` says nothing more."""
        choices: list[list[Any]] = []
        names = sorted({b for n in compile_reads(expr) for b in self.base(n)})
        for name in names:
            var = self.scenario.variables.get(name)
            if var is None or var.role == "derived" or var.observed or not isinstance(var.type, (ir.EnumType, ir.BoolType)):
                return False
            text = constraints.get(name)
            domain: list[Any] = [True, False] if isinstance(var.type, ir.BoolType) else list(var.type.values)
            if text is not None:
                given = [{"true": True, "false": False}.get(v, v) for v in text.split(" | ")]
                if any(v not in domain for v in given):
                    return False
                domain = given
            choices.append(domain)
        combos = 1
        for c in choices:
            combos *= len(c)
        if not names or combos > self.IMPLIED_BUDGET:
            return False
        try:
            return all(bool(Interpreter(self.scenario, dict(zip(names, combo, strict=True))).eval(expr)) == positive
                       for combo in itertools.product(*choices))
        except (DecideError, ArithmeticError, TypeError, ValueError):
            return False

    def listed(self, names: set[str]) -> bool:
        """Whether the per-variable constraints can say conditions on these variables (a string's
        conditions are residual relations: they stay in `where`)."""
        for name in names:
            for base in self.base(name):
                var = self.scenario.variables.get(base)
                if var is not None and isinstance(var.type, ir.StringType):
                    return False
        return True

    def readers(self, roots: set[str]) -> set[str]:
        """`roots` and every derived variable that reads one of them, directly or through others."""
        return roots | {v.name for v in self.scenario.variables.values()
                        if v.role == "derived" and self.base(v.name) & roots}

    def per_variable(self, expr: Any, positive: bool, trail: frozenset[str] = frozenset()) -> bool:
        """Whether `expr` (or its negation) is a conjunction of conditions on one input each — what
        per-variable constraints say exactly. A disjunction over several inputs (also a negated
        `and`) or a comparison relating several inputs is not."""
        if isinstance(expr, ir.BoolOp) and (expr.op == "and") == positive:
            return all(self.per_variable(o, positive, trail) for o in expr.operands)
        if isinstance(expr, ir.Unary) and expr.op == "not":
            return self.per_variable(expr.operand, not positive, trail)
        if isinstance(expr, ir.Var):
            var = self.scenario.variables.get(expr.name)
            if var is not None and var.role == "derived" and var.expr is not None and expr.name not in trail:
                return self.per_variable(var.expr, positive, trail | {expr.name})
        return len({b for n in compile_reads(expr) for b in self.base(n)}) <= 1


def iter_decisions(scenario: ir.Scenario) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]:
    """Feasible paths as (stage ids, branch indices), depth-first in declaration order."""
    u = _unrolled(scenario)
    ex = explorer_for(u.scenario if u else scenario)
    ids = [u.origin[i] for i in ex.ids] if u else ex.ids
    for stages, branches, _action in ex.iter_raw():
        yield tuple(ids[s] for s in stages), tuple(branches)


def iter_paths(scenario: ir.Scenario, *, limit: int | None = None,
               witnesses: bool = True, written: bool = True) -> Iterator[PathInfo]:
    """Feasible paths, lazily, depth-first in declaration order (ranks 1, 2, ...). `written=False`
    keeps the region's own `where` (for an analysis form, whose paths `lift_path` reads)."""
    u = _unrolled(scenario)
    ex = explorer_for(u.scenario if u else scenario)
    if limit is not None and limit <= 0:
        return
    region_of = ex.prefix_regions()
    for rank, (stages, branches, action) in enumerate(ex.iter_raw(), 1):
        info = ex.make_info(rank, stages, branches, action, region_of(stages, branches), witnesses=witnesses)
        yield lift_path(info, u) if u else (as_written(scenario, info) if written else info)
        if limit is not None and rank >= limit:
            return


def count_paths(scenario: ir.Scenario, *, cpu_budget: float | CpuBudget | None = None) -> PathCount:
    """Number of feasible paths and of distinct stage sequences, without enumerating them. For a
    procedure, `stage_sequences` counts sequences of stage visits of the unrolled form. Past `cpu_budget`
    (CPU seconds or a command's `CpuBudget`; None: no limit but the count of states) the count is
    incomplete, with lower bounds, and `stopped` says where (in the source's stage ids)."""
    clock = CpuBudget(cpu_budget) if isinstance(cpu_budget, (int, float)) else cpu_budget
    u = _unrolled(scenario)
    counted = explorer_for(u.scenario if u else scenario).count(clock)
    if u is not None and counted.stopped:
        for cid in sorted(u.origin, key=len, reverse=True):  # a copy `check#3` is stage `check`
            if f"`{cid}`" in counted.stopped and u.origin[cid] != cid:
                counted.stopped = counted.stopped.replace(f"`{cid}`", f"`{u.origin[cid]}`")
                break
    return counted


def path_by_decisions(scenario: ir.Scenario, stages: Sequence[str], branches: Sequence[int],
                      *, witnesses: bool = True, written: bool = True) -> PathInfo | None:
    """The PathInfo (with its rank) of a decision sequence, or None if it is not a feasible path."""
    u = _unrolled(scenario)
    if u is not None:
        flat_ids = _flat_stage_ids(u, stages, branches)
        if flat_ids is None:
            return None
        found = path_by_decisions(u.scenario, flat_ids, branches, witnesses=witnesses, written=False)
        return lift_path(found, u) if found is not None else None
    ex = explorer_for(scenario)
    ranked = ex.count().complete  # too many paths to count: no rank (the path is named by `walk_id`)
    rk = ex.root_key()
    if rk is None or not stages or ex.idx.get(stages[0]) != rk[0] or len(stages) != len(branches):
        return None
    si, region, vk = rk
    rank = 1 if ranked else 0
    sidx = []
    for pos, (sid, bi) in enumerate(zip(stages, branches, strict=True)):
        if ex.idx.get(sid) != si:
            return None
        sidx.append(si)
        nvk = ex.next_visited(si, vk)
        chosen = None
        for child in ex.children(si, region):
            cbi, kind, tgt, creg, _u = child
            if cbi == bi:
                chosen = child
                break
            if not ranked:
                continue
            if kind == "action":
                rank += 1
            elif tgt not in nvk:
                rank += ex.subcount((tgt, creg, nvk))
        if chosen is None:
            return None
        _, kind, tgt, creg, _u = chosen
        last = pos == len(stages) - 1
        if kind == "action":
            if not last:
                return None
            info = ex.make_info(rank, sidx, list(branches), tgt, witnesses=witnesses)
            return as_written(scenario, info) if written else info
        if last or tgt in nvk:
            return None
        si, region, vk = tgt, creg, nvk
    return None


def _flat_stage_ids(u: Unrolled, stages: Sequence[str], branches: Sequence[int]) -> list[str] | None:
    """The unrolled copies a source decision sequence walks through (None if it does not fit)."""
    flat = u.scenario
    sid = flat.start
    out: list[str] = []
    for src, bi in zip(stages, branches, strict=False):
        if sid is None or u.origin.get(sid) != src:
            return None
        out.append(sid)
        st = flat.stages[sid]
        if bi >= len(st.branches):
            return None
        t = st.branches[bi].target
        sid = t.stage if t.kind == "stage" else None
    return out


def sample_paths(scenario: ir.Scenario, n: int, *, seed: int = 0, weights: Weights = None,
                 unique: bool = False, witnesses: bool = True, written: bool = True) -> list[PathInfo]:
    """`n` paths drawn at random (see the module docstring for `weights`); deterministic per seed.
    `written=False` keeps the region's own `where` (the unrolled form's, which `lift_path` reads)."""
    u = _unrolled(scenario)
    if u is not None:
        if callable(weights):
            user = weights
            origin = u.origin

            def weights(sid: str, bi: int) -> float:
                return user(origin.get(sid, sid), bi)

        return [lift_path(info, u) for info in sample_paths(u.scenario, n, seed=seed, weights=weights,
                                                        unique=unique, witnesses=witnesses, written=False)]
    ex = explorer_for(scenario)
    counted = ex.count()
    total = counted.feasible if counted.complete else float("inf")
    if n <= 0 or total == 0:
        return []
    rng = random.Random(seed)
    draw = _drawer(ex, weights, rng) if counted.complete else _walker(ex, rng)
    out: list[PathInfo] = []
    seen: set[Any] = set()
    attempts = 0
    max_attempts = 50 * n + 100
    while len(out) < n:
        if unique and len(seen) >= total:
            break
        attempts += 1
        if unique and attempts > max_attempts:
            break
        got = draw()
        if got is None:
            break
        rank, stages, branches, action = got
        if unique:
            key = rank if rank > 0 else (tuple(stages), tuple(branches))
            if key in seen:
                continue
            seen.add(key)
        info = ex.make_info(rank, stages, branches, action, witnesses=witnesses)
        out.append(as_written(scenario, info) if written else info)
    return out


def walk_id(stages: Sequence[str], branches: Sequence[int]) -> str:
    """The id of a path drawn when the paths are too many to count (no rank): `W` and a digest of its
    decisions, the same in every run."""
    digest = hashlib.blake2b(json.dumps([list(stages), list(branches)]).encode("utf-8"), digest_size=5)
    return "W" + digest.hexdigest()


def _walker(ex: Explorer, rng: random.Random) -> Callable[[], tuple | None]:
    """Draws for graphs whose paths are too many to count (`PathCount.complete` is False): a random
    walk, each feasible branch of a stage equally likely. Not uniform over paths (a path behind a
    branch with few continuations is more likely), but it needs no counts and every feasible path
    can be drawn. Rank 0: such paths are named by `walk_id`."""
    rk = ex.root_key()
    assert rk is not None

    def walk() -> tuple | None:
        si, region, vk = rk
        stages: list[int] = [si]
        branches: list[int] = []
        for _step in range(len(ex.ids) + 1):  # paths are simple (no stage twice): at most every stage once
            nvk = ex.next_visited(si, vk)
            opts = [c for c in ex.children(si, region) if c[1] == "action" or c[2] not in nvk]
            if not opts:
                return None
            bi, kind, tgt, creg, _u = opts[rng.randrange(len(opts))]
            branches.append(bi)
            if kind == "action":
                return 0, stages, branches, tgt
            si, region, vk = tgt, creg, nvk
            stages.append(si)
        return None

    return walk


def _drawer(ex: Explorer, weights: Weights, rng: random.Random) -> Callable[[], tuple | None]:
    """A function drawing one path: (rank, stage indices, branch indices, action)."""
    rk = ex.root_key()
    assert rk is not None
    ex.count()

    def descend(choose: Callable[[tuple, list[tuple[Child, tuple | None]]], int]) -> tuple | None:
        si, region, vk = rk
        stages: list[int] = [si]
        branches: list[int] = []
        rank = 1
        while True:
            nvk = ex.next_visited(si, vk)
            opts: list[tuple[Child, tuple | None]] = []
            for child in ex.children(si, region):
                _bi, kind, tgt, creg, _u = child
                if kind == "action":
                    opts.append((child, None))
                elif tgt not in nvk:
                    opts.append((child, (tgt, creg, nvk)))
            if not opts:
                return None
            k = choose((si, region, vk), opts)
            if k < 0:
                return None
            for _child, ck in opts[:k]:
                rank += 1 if ck is None else ex.subcount(ck)
            (bi, kind, tgt, creg, _u), ck = opts[k]
            branches.append(bi)
            if kind == "action":
                return rank, stages, branches, tgt
            si, region, vk = tgt, creg, nvk
            stages.append(si)

    if weights is None:
        def uniform(_key: tuple, opts: list[tuple[Child, tuple | None]]) -> int:
            sizes = [1 if ck is None else ex.subcount(ck) for _c, ck in opts]
            r = rng.randrange(sum(sizes))
            for k, s in enumerate(sizes):
                if r < s:
                    return k
                r -= s
            return len(sizes) - 1  # pragma: no cover

        return lambda: descend(uniform)

    if weights == "action":
        memo: dict[tuple, dict[str, int]] = {}

        def per_action(key: tuple) -> dict[str, int]:
            return _action_counts(ex, key, memo)

        def balanced() -> tuple | None:
            counts = per_action(rk)
            actions = sorted(a for a, c in counts.items() if c > 0)
            if not actions:
                return None
            target = rng.choice(actions)

            def choose(_key: tuple, opts: list[tuple[Child, tuple | None]]) -> int:
                sizes = []
                for c, ck in opts:
                    if ck is None:
                        sizes.append(1 if c[2] == target else 0)
                    else:
                        sizes.append(per_action(ck).get(target, 0))
                r = rng.randrange(sum(sizes))
                for k, s in enumerate(sizes):
                    if r < s:
                        return k
                    r -= s
                return -1  # pragma: no cover

            return descend(choose)

        return balanced

    if isinstance(weights, Mapping):
        wmap = dict(weights)

        def leaf_w(si: int, bi: int, action: str) -> float:
            return float(wmap.get(action, 1.0))

        def edge_w(si: int, bi: int) -> float:
            return 1.0
    elif callable(weights):
        fn = weights

        def leaf_w(si: int, bi: int, action: str) -> float:
            return float(fn(ex.ids[si], bi))

        def edge_w(si: int, bi: int) -> float:
            return float(fn(ex.ids[si], bi))
    else:
        raise ValueError(f"unsupported weights: {weights!r}")

    wmemo: dict[tuple, float] = {}

    def expand(key: tuple) -> tuple[float, list[tuple[float, tuple]]]:
        si, region, vk = key
        nvk = ex.next_visited(si, vk)
        base = 0.0
        kids: list[tuple[float, tuple]] = []
        for bi, kind, tgt, creg, _u in ex.children(si, region):
            if kind == "action":
                base += leaf_w(si, bi, tgt)
            elif tgt not in nvk:
                kids.append((edge_w(si, bi), (tgt, creg, nvk)))
        return base, kids

    def weight(key: tuple) -> float:
        return ex._evaluate(key, expand, wmemo)

    if weight(rk) <= 0:
        return lambda: None

    def choose_w(key: tuple, opts: list[tuple[Child, tuple | None]]) -> int:
        si = key[0]
        sizes = []
        for (bi, _kind, tgt, _creg, _u), ck in opts:
            sizes.append(leaf_w(si, bi, tgt) if ck is None else edge_w(si, bi) * weight(ck))
        tot = sum(sizes)
        if tot <= 0:
            return -1
        r = rng.random() * tot
        for k, s in enumerate(sizes):
            if r < s:
                return k
            r -= s
        return max(k for k, s in enumerate(sizes) if s > 0)

    return lambda: descend(choose_w)


def _action_counts(ex: Explorer, key: tuple, memo: dict[tuple, dict[str, int]]) -> dict[str, int]:
    """Feasible paths per action from a state (iterative post-order)."""
    if key in memo:
        return memo[key]
    stack = [key]
    while stack:
        k = stack[-1]
        if k in memo:
            stack.pop()
            continue
        si, region, vk = k
        nvk = ex.next_visited(si, vk)
        kids = ex.children(si, region)
        missing = [(tgt, creg, nvk) for _bi, kind, tgt, creg, _u in kids
                   if kind == "stage" and tgt not in nvk and (tgt, creg, nvk) not in memo]
        missing = [m for m in missing if m not in stack]
        if missing:
            stack.extend(missing)
            continue
        acc: dict[str, int] = {}
        for _bi, kind, tgt, creg, _u in kids:
            if kind == "action":
                acc[tgt] = acc.get(tgt, 0) + 1
            elif tgt not in nvk:
                for a, c in memo.get((tgt, creg, nvk), {}).items():
                    acc[a] = acc.get(a, 0) + c
        memo[k] = acc
        stack.pop()
    return memo[key]


__all__ = [
    "Explorer",
    "PathCount",
    "PathInfo",
    "count_paths",
    "explorer_for",
    "iter_decisions",
    "iter_paths",
    "path_by_decisions",
    "sample_paths",
    "trace",
    "verify",
]
