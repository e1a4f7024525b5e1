"""Procedures with observations and bounded retries, unrolled into a plain acyclic program.

A procedure that observes values (`observe X`) or bounds a branch (`-> fix up to 2 times`) is not
a function of fixed values: the k-th look at `X` may differ from the first, and a bounded branch
stops firing once spent. `unroll(scenario)` turns such a program into an ordinary one that every
analysis (paths, counting, witnesses, flow checks, synthesis, the generated engine) already handles:

- one stage copy per reachable *state* (stage, times each bounded branch fired, looks taken so
  far); the first copy of a stage keeps its id, later ones are `id#2`, `id#3`, … (`origin` maps
  every copy back);
- the k-th look at an observed variable `X` becomes its own variable `X#k` (same type), and every
  read of `X` in that state (guards, action arguments, outputs, derived variables reading `X`,
  which are inlined) reads `X#k`;
- a spent bounded branch keeps its place with the guard `false` (branch indices stay those of the
  source, so a path's decisions mean the same in both forms).

Values convert both ways: `flatten` (`{"X": [a, b]}` → `{"X#1": a, "X#2": b}`) and `lift`.
A bounded branch is what makes a loop finite, so a cycle that avoids every bounded branch cannot be
unrolled (`UnrollError`; the checker reports it as E302).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sopgraph.errors import Error
from sopgraph.language import ir

UNROLL_LIMIT = 20_000  # stage copies before giving up (the analyses would be too slow anyway)
LOOK_SEP = "#"
SPENT = "#spent"  # the action of a spent bounded branch in the unrolled form (never taken)


class UnrollError(Error):
    """The procedure has an unbounded cycle or unrolls to more than UNROLL_LIMIT stage copies."""


class Unrolled:
    """An unrolled procedure: the plain scenario, copy → source stage ids, and looks per variable."""

    def __init__(self, scenario: ir.Scenario, origin: dict[str, str], looks: dict[str, int],
                 premature: list[tuple[str, str]] | None = None, source: ir.Scenario | None = None):
        self.scenario = scenario
        self.scenario_source = source or scenario
        self.origin = origin
        self.looks = looks
        self.premature = premature or []  # (stage, variable): read before any look on some path

    def flatten(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Input values with one key per look (`X#1`, `X#2`, …) instead of a list per variable."""
        out = dict(values)
        for name, n in self.looks.items():
            seq = out.pop(name, None)
            if isinstance(seq, (list, tuple)):
                for k in range(min(n, len(seq))):
                    out[look_name(name, k + 1)] = seq[k]
        return out

    def lift(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Flat values back to the source form: a list in order of looks per observed variable."""
        out: dict[str, Any] = {}
        for key, value in values.items():
            base, sep, num = key.rpartition(LOOK_SEP)
            if sep and base in self.looks and num.isdigit():
                continue
            out[key] = value
        for name, n in self.looks.items():
            seq = []
            for k in range(1, n + 1):
                key = look_name(name, k)
                if key not in values:
                    break
                seq.append(values[key])
            out[name] = seq
        return out


def affects_of(scenario: ir.Scenario) -> dict[str, frozenset[str]]:
    """Per action, the observed variables it can change (`action A "…" affects X, Y`)."""
    return _world(scenario)[0]


def held_variables(scenario: ir.Scenario) -> frozenset[str]:
    """The observed variables a look sees anew only after an action that affects them (otherwise the
    previous look's value again). A procedure that says how its world changes (some `affects`, or
    some `volatile` variable) holds every observed variable not marked `volatile`; one that says
    neither holds none: every look is a new value, as before `affects` existed."""
    return _world(scenario)[1]


def _world(scenario: ir.Scenario) -> tuple[dict[str, frozenset[str]], frozenset[str]]:
    observed = scenario.observed
    variables = scenario.variables
    signature = (tuple((id(a), tuple(a.affects)) for a in scenario.actions.values()) + (tuple(observed),)
                 + tuple(name in variables and variables[name].volatile for name in observed))
    return scenario.cached_analysis("affects", signature, lambda: _affects(scenario))


def _affects(scenario: ir.Scenario) -> tuple[dict[str, frozenset[str]], frozenset[str]]:
    observed = scenario.observed
    seen = set(observed)
    affects = {a.name: frozenset(n for n in a.affects if n in seen) for a in scenario.actions.values()
               if any(n in seen for n in a.affects)}
    volatile = {n for n in observed if n in scenario.variables and scenario.variables[n].volatile}
    held = frozenset(n for n in observed if n not in volatile) if affects or volatile else frozenset()
    return affects, held


def path_looks(scenario: ir.Scenario, stages: list[str], branches: list[int]) -> dict[str, int]:
    """The looks a path of the source program takes at each observed variable (a look at a held
    variable with no affecting action since the previous one is that same look)."""
    affects = affects_of(scenario)
    held = held_variables(scenario)
    looks: dict[str, int] = {}
    changed: set[str] = set()
    for sid, bi in zip(stages, branches, strict=False):
        stage = scenario.stages.get(sid)
        if stage is None:
            break
        for name in stage.observe:
            if looks.get(name, 0) and name in held and name not in changed:
                continue
            looks[name] = looks.get(name, 0) + 1
            changed.discard(name)
        if 0 <= bi < len(stage.branches):
            for call in stage.branches[bi].target.steps:
                changed |= affects.get(call.action, frozenset())
    return looks


def look_name(name: str, k: int) -> str:
    """The variable standing for the k-th look (1-based) at an observed variable."""
    return f"{name}{LOOK_SEP}{k}"


def unbounded_cycle(scenario: ir.Scenario) -> list[str] | None:
    """A cycle of stages that avoids every bounded branch (a loop nothing stops), or None."""
    succ: dict[str, list[str]] = {}
    for sid, st in scenario.stages.items():
        succ[sid] = [b.target.stage for b in st.branches
                     if b.limit is None and b.target.kind == "stage" and b.target.stage in scenario.stages]
    color: dict[str, int] = {}
    for root in scenario.stages:
        if root in color:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        trail: list[str] = []
        while stack:
            sid, i = stack.pop()
            if i == 0:
                color[sid] = 1
                trail.append(sid)
            kids = succ[sid]
            if i < len(kids):
                stack.append((sid, i + 1))
                nxt = kids[i]
                if color.get(nxt) == 1:
                    return trail[trail.index(nxt):] + [nxt]
                if nxt not in color:
                    stack.append((nxt, 0))
            else:
                color[sid] = 2
                trail.pop()
    return None


class _Renamer:
    """Copies expressions with observed variables (and derived variables reading them) renamed to
    the current look."""

    def __init__(self, scenario: ir.Scenario, observed: list[str]):
        self.s = scenario
        self.observed = set(observed)
        self.dynamic = self._dynamic_derived()
        self.premature: list[str] = []

    def _dynamic_derived(self) -> set[str]:
        dyn: set[str] = set()
        changed = True
        while changed:
            changed = False
            for var in self.s.derived:
                if var.name not in dyn and var.expr is not None and self._reads(var.expr, dyn):
                    dyn.add(var.name)
                    changed = True
        return dyn

    def _reads(self, e: Any, dyn: set[str]) -> bool:
        if isinstance(e, ir.Var):
            return e.name in self.observed or e.name in dyn
        return any(self._reads(c, dyn) for c in ir.children(e))

    def observed_reads(self, e: Any, depth: int = 0) -> set[str]:
        """Observed variables an expression reads, through derived variables."""
        if e is None or depth > 100 or not self.needs(e):
            return set()
        if isinstance(e, ir.Var):
            if e.name in self.observed:
                return {e.name}
            return self.observed_reads(self.s.variables[e.name].expr, depth + 1)
        out: set[str] = set()
        for c in ir.children(e):
            out |= self.observed_reads(c, depth)
        return out

    def needs(self, e: Any) -> bool:
        return e is not None and self._reads(e, self.dynamic)

    def rename(self, e: Any, looks: Mapping[str, int], depth: int = 0) -> Any:
        if e is None or not self.needs(e):
            return e
        if isinstance(e, ir.Var):
            if e.name in self.observed:
                if looks.get(e.name, 0) == 0:
                    self.premature.append(e.name)
                return ir.Var(name=look_name(e.name, max(1, looks.get(e.name, 0))), span=e.span)
            var = self.s.variables[e.name]
            if depth > 100:
                raise UnrollError("derived variables nest too deeply")
            return self.rename(var.expr, looks, depth + 1)
        # every kind of sub-expression, list and record ones included (`count(f in Fees where …)`
        # reads the look of `Fees` through `source`; a `sum`'s value through `value`)
        return ir.map_children(e, lambda sub: self.rename(sub, looks, depth))


def _relevance(scenario: ir.Scenario, bounded: list[tuple[str, int]], observed: list[str],
               rn: _Renamer) -> tuple[dict[str, tuple[bool, ...]], dict[str, tuple[bool, ...]]]:
    """Per stage: which bounded branches can still fire from it (their stage is reachable), and which
    observed variables are still read or observed from it."""
    succ = {sid: {b.target.stage for b in st.branches if b.target.kind == "stage" and b.target.stage in
                  scenario.stages} for sid, st in scenario.stages.items()}
    uses: dict[str, set[str]] = {}
    for sid, st in scenario.stages.items():
        names = set(st.observe)
        exprs = [st.subject, *(b.guard for b in st.branches)]
        for b in st.branches:
            exprs += [a.value for a in [*b.target.outputs, *b.target.args]]
            exprs += [x for c in b.target.steps for x in c.exprs()]
        for e in exprs:
            names |= rn.observed_reads(e)
        uses[sid] = names
    keep_count: dict[str, tuple[bool, ...]] = {}
    keep_look: dict[str, tuple[bool, ...]] = {}
    for sid in scenario.stages:
        reach = {sid}
        todo = [sid]
        while todo:
            for nxt in succ[todo.pop()]:
                if nxt not in reach:
                    reach.add(nxt)
                    todo.append(nxt)
        used = set().union(*(uses[r] for r in reach))
        keep_count[sid] = tuple(s in reach for s, _ in bounded)
        keep_look[sid] = tuple(name in used for name in observed)
    return keep_count, keep_look


def _rename_assigns(assigns: list[ir.OutputAssign], rn: _Renamer, looks: Mapping[str, int]) -> list[ir.OutputAssign]:
    return [ir.OutputAssign(name=a.name, value=rn.rename(a.value, looks), span=a.span) for a in assigns]


def _rename_target(t: ir.Target, rn: _Renamer, looks: Mapping[str, int], stage: str | None) -> ir.Target:
    return ir.Target(
        kind=t.kind, stage=stage, action=t.action, span=t.span,
        outputs=_rename_assigns(t.outputs, rn, looks), args=_rename_assigns(t.args, rn, looks),
        steps=[ir.ActionCall(action=c.action, args=_rename_assigns(c.args, rn, looks), span=c.span, each=c.each,
                             source=rn.rename(c.source, looks), cond=rn.rename(c.cond, looks)) for c in t.steps])


def unroll(scenario: ir.Scenario, limit: int = UNROLL_LIMIT) -> Unrolled:
    """The plain program equivalent to a procedure (see the module docstring)."""
    cycle = unbounded_cycle(scenario)
    if cycle is not None:
        raise UnrollError("unbounded cycle: " + " -> ".join(cycle))
    observed = scenario.observed
    rn = _Renamer(scenario, observed)
    bounded = [(sid, bi) for sid, st in scenario.stages.items()
               for bi, b in enumerate(st.branches) if b.limit is not None]
    bpos = {key: i for i, key in enumerate(bounded)}
    opos = {name: i for i, name in enumerate(observed)}
    ids: dict[tuple, str] = {}
    copies_of: dict[str, int] = {}
    stages: dict[str, ir.Stage] = {}
    origin: dict[str, str] = {}
    max_looks = dict.fromkeys(observed, 0)

    keep_count, keep_look = _relevance(scenario, bounded, observed, rn)
    affects = affects_of(scenario)
    held = held_variables(scenario)

    def copy_id(key: tuple) -> str:
        # counters of loops that cannot fire again, and looks at values never read or observed again,
        # do not change what happens next: dropping them keeps the unrolled form small
        sid, counts, seen, changed = key
        kc, kl = keep_count[sid], keep_look[sid]
        key = (sid, tuple(c if k else 0 for c, k in zip(counts, kc, strict=True)),
               tuple(n if k else 0 for n, k in zip(seen, kl, strict=True)),
               tuple(d if k else 0 for d, k in zip(changed, kl, strict=True)))
        if key not in ids:
            sid = key[0]
            n = copies_of.get(sid, 0) + 1
            copies_of[sid] = n
            new = sid if n == 1 else f"{sid}{LOOK_SEP}{n}"
            ids[key] = new
            origin[new] = sid
            work.append(key)
            if len(ids) > limit:
                raise UnrollError(f"the procedure unrolls to more than {limit:,} stage visits")
        return ids[key]

    if scenario.start is None or scenario.start not in scenario.stages:
        return Unrolled(scenario, {sid: sid for sid in scenario.stages}, {})
    work: list[tuple] = []
    premature: list[tuple[str, str]] = []
    copy_id((scenario.start, (0,) * len(bounded), (0,) * len(observed), (0,) * len(observed)))
    while work:
        key = work.pop()
        sid, counts, seen, changed = key
        st = scenario.stages[sid]
        looks_t = list(seen)
        changed_t = list(changed)  # held variables an action changed since their last look
        for name in st.observe:
            if name in opos:
                i = opos[name]
                if name in held and looks_t[i] and not changed_t[i]:
                    continue  # nothing changed it: this look sees the previous look's value
                looks_t[i] += 1
                changed_t[i] = 0
                max_looks[name] = max(max_looks[name], looks_t[i])
        looks = {name: looks_t[i] for name, i in opos.items()}
        branches: list[ir.Branch] = []
        spent_any = False
        rn.premature.clear()
        for bi, b in enumerate(st.branches):
            guard = rn.rename(b.guard, looks)
            new_counts = counts
            if b.limit is not None:
                i = bpos[(sid, bi)]
                if counts[i] >= b.limit:
                    guard = ir.Lit(value=False, span=b.span)
                    spent_any = True
                else:
                    new_counts = counts[:i] + (counts[i] + 1,) + counts[i + 1:]
            t = b.target
            nxt = None
            if isinstance(guard, ir.Lit) and guard.value is False and b.limit is not None:
                # spent: never taken again; a dead leaf keeps the branch index without a successor
                branches.append(ir.Branch(guard=guard, span=b.span, target=ir.Target(
                    kind="action", action=SPENT, span=t.span)))
                continue
            if t.kind == "stage" and t.stage in scenario.stages:
                after = list(changed_t)
                for call in t.steps:
                    for name in affects.get(call.action, ()):
                        after[opos[name]] = 1
                nxt = copy_id((t.stage, new_counts, tuple(looks_t), tuple(after)))
            elif t.kind == "stage":
                nxt = t.stage
            branches.append(ir.Branch(guard=guard, values=list(b.values), span=b.span, ordered=b.ordered,
                                      target=_rename_target(t, rn, looks, nxt)))
        premature += [(sid, name) for name in dict.fromkeys(rn.premature) if (sid, name) not in premature]
        kind = "when" if spent_any and st.kind == "match" else st.kind
        subject = rn.rename(st.subject, looks)
        stages[ids[key]] = st.model_copy(update={
            "id": ids[key], "branches": branches, "observe": [], "kind": kind, "subject": subject})
    variables: dict[str, ir.Variable] = {}
    for name, var in scenario.variables.items():
        if name in opos:
            for k in range(1, max(1, max_looks[name]) + 1):
                lk = look_name(name, k)
                variables[lk] = var.model_copy(update={"name": lk, "observed": False})
        elif name not in rn.dynamic:  # derived values reading a look are inlined where read
            variables[name] = var
    ordered = {sid: stages[sid] for sid in sorted(stages, key=_copy_order(scenario, origin))}
    flat = scenario.model_copy(update={"stages": ordered, "variables": variables})
    flat._engine = None
    flat._analyses = ir.AnalysisCache()  # the flat program builds its own space and explorer
    return Unrolled(flat, origin, {name: max(1, n) for name, n in max_looks.items()}, premature,
                    scenario)


def _copy_order(scenario: ir.Scenario, origin: dict[str, str]):
    """Copies in the source's stage order, then by copy number (so declaration order is kept)."""
    pos = {sid: i for i, sid in enumerate(scenario.stages)}

    def key(cid: str) -> tuple[int, int]:
        base = origin[cid]
        n = 1 if cid == base else int(cid.rpartition(LOOK_SEP)[2])
        return (pos[base], n)

    return key


def unrolled_for(scenario: ir.Scenario) -> Unrolled:
    """The scenario's unrolled form, built once per scenario and structure (raises UnrollError)."""
    result = scenario.cached_analysis("unrolled", _signature(scenario), lambda: _unroll_or_error(scenario))
    if isinstance(result, UnrollError):
        raise result
    return result


def _unroll_or_error(scenario: ir.Scenario) -> Unrolled | UnrollError:
    try:
        return unroll(scenario)
    except UnrollError as exc:
        return exc


def structure_signature(scenario: ir.Scenario) -> tuple:
    """What analyses of the stage structure are built from (see `_signature`)."""
    return _signature(scenario)


def _signature(scenario: ir.Scenario) -> tuple:
    """What the unrolled form is built from: entry, stages (by identity) and their branches."""
    return (scenario.start, tuple(
        (sid, id(st), tuple(st.observe), tuple((id(b.guard), b.limit, b.target.stage, b.target.action)
                                               for b in st.branches))
        for sid, st in scenario.stages.items()), tuple(id(v) for v in scenario.variables.values()))
