"""Reads of optional values: can some feasible path read an optional `X` while it is missing? (W306, I303)

An optional variable (`system Voucher: float? …`) may be left out of the input; the engine then refuses
any read of it except `missing(Voucher)`. This pass proves, for every place a value is read (guards in
evaluation order, actions' arguments on the way, the final action's arguments and outputs), that no
feasible path reaches the read with the value missing — or reports a verified example.

How. The program (its analysis form: procedures unrolled, lists and records lowered) is rewritten with one
bool variable `missing(X)` per optional `X`: `missing(X)` tests read it, and `X` itself always has a value.
For each read site the pass builds the condition "evaluation gets to this read of `X`" — short-circuit
`and`/`or` and `case` arms included, derived variables followed — conjoined with `missing(X)`, and asks
the constraint domain whether it holds on some region reaching the stage (the same bounded exploration
as the flow checks). A candidate is reported only when the reference engine, given the example with
`X` left out, refuses it with "`X` is missing" at that stage. A work budget and a CPU budget bound the
exploration; what it cannot settle is reported as I303 (never assumed safe silently), located at the stage
where it stopped and naming the read it was deciding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sopgraph.language import ir
from sopgraph.language.diagnostics import Diagnostic, warning
from sopgraph.logic.budget import CHECK_CPU_BUDGET, CpuBudget, OutOfCpu, active, budget_of
from sopgraph.logic.domain import Box
from sopgraph.logic.engine import DecideError, optional_field_names, run
from sopgraph.logic.lower import (
    Lowered,
    analysis_form,
    needs_analysis_form,
    optional_field_keys,
    presence_key,
)
from sopgraph.logic.paths import Explorer
from sopgraph.logic.unroll import Unrolled, UnrollError

MAX_STATES = 5_000  # (stage, region) states explored
STEP_BUDGET = 60_000  # region operations (constrain / decide) of the whole pass
MAX_NODES = 4_000  # nodes of one read condition (long `and` chains grow quadratically)
MAX_WITNESSES = 8  # example assignments tried per candidate read
_EXPLORING = "exploring which values reach each stage"


class _TooBig(Exception):
    """A read condition over `MAX_NODES` nodes: that site is reported as not proven."""


def flag_name(name: str) -> str:
    """The bool variable standing for "`name` is missing" in the rewritten program."""
    return f"missing({name})"


def _true() -> ir.Lit:
    return ir.Lit(value=True)


def _and(parts: list[Any]) -> Any:
    parts = [p for p in parts if not (isinstance(p, ir.Lit) and p.value is True)]
    if not parts:
        return _true()
    return parts[0] if len(parts) == 1 else ir.BoolOp(op="and", operands=parts)


def _or(parts: list[Any]) -> Any | None:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else ir.BoolOp(op="or", operands=parts)


def _not(e: Any) -> Any:
    return ir.Unary(op="not", operand=e)


def _rewrite(e: Any, optional: set[str]) -> Any:
    """`missing(X)` → the variable `missing(X)` (everything else copied as is)."""
    if e is None or isinstance(e, (ir.Lit, ir.Var, ir.TimeLit)):
        return e
    if (isinstance(e, ir.Func) and e.name == "missing" and len(e.args) == 1 and isinstance(e.args[0], ir.Var)
            and e.args[0].name in optional):
        return ir.Var(name=flag_name(e.args[0].name), span=e.span)
    return ir.map_children(e, lambda sub: _rewrite(sub, optional))


def _assigns(items: list[ir.OutputAssign], optional: set[str]) -> list[ir.OutputAssign]:
    return [a.model_copy(update={"value": _rewrite(a.value, optional)}) for a in items]


def rewritten(scenario: ir.Scenario, optional: set[str]) -> ir.Scenario:
    """The program with a bool `missing(X)` per optional `X`, which is no longer optional."""
    variables: dict[str, ir.Variable] = {}
    for name, var in scenario.variables.items():
        if name in optional:
            variables[name] = var.model_copy(update={"optional": False})
            flag = flag_name(name)
            variables[flag] = ir.Variable(name=flag, role="system", type=ir.BoolType(), span=var.span,
                                          description=f"whether `{name}` is left out of the input")
        elif var.role == "derived" and var.expr is not None:
            variables[name] = var.model_copy(update={"expr": _rewrite(var.expr, optional)})
        else:
            variables[name] = var
    stages: dict[str, ir.Stage] = {}
    for sid, st in scenario.stages.items():
        branches = []
        for b in st.branches:
            t = b.target
            target = t.model_copy(update={
                "outputs": _assigns(t.outputs, optional), "args": _assigns(t.args, optional),
                "steps": [c.model_copy(update={"args": _assigns(c.args, optional)}) for c in t.steps]})
            branches.append(b.model_copy(update={"guard": _rewrite(b.guard, optional), "target": target}))
        stages[sid] = st.model_copy(update={"branches": branches, "subject": _rewrite(st.subject, optional)})
    out = scenario.model_copy(update={"variables": variables, "stages": stages})
    out._engine = None
    out._analyses = ir.AnalysisCache()
    return out


@dataclass(frozen=True)
class _Optional:
    """One optional input as the analysis form sees it: `flag` is the plain variable whose `missing(…)`
    stands for it (the variable itself; `len(L)` or a record's first field for a list or record), and a
    read of any name in `reads` is a read of it."""
    name: str
    flag: str
    reads: frozenset[str]


class _Reads:
    """"Evaluating e gets to a read of X" as a condition, in the engine's evaluation order."""

    def __init__(self, scenario: ir.Scenario, names: frozenset[str]):
        self.s = scenario
        self.names = names
        self.memo: dict[str, Any] = {}
        self.nodes = 0

    def of(self, e: Any) -> Any | None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _TooBig
        if e is None or isinstance(e, (ir.Lit, ir.TimeLit)):
            return None
        if isinstance(e, ir.Var):
            if e.name in self.names:
                return _true()
            var = self.s.variables.get(e.name)
            if var is None or var.role != "derived" or var.expr is None:
                return None
            if e.name not in self.memo:
                self.memo[e.name] = None  # a cycle (a checker error elsewhere) reads nothing more
                self.memo[e.name] = self.of(var.expr)
            return self.memo[e.name]
        if isinstance(e, ir.BoolOp):
            alts: list[Any] = []
            prefix: list[Any] = []
            for o in e.operands:  # `and` goes on while operands hold, `or` while they fail
                r = self.of(o)
                if r is not None:
                    alts.append(_and(prefix + [r]))
                prefix.append(o if e.op == "and" else _not(o))
            return _or(alts)
        if isinstance(e, ir.CaseExpr):
            alts = []
            prefix = []
            for arm in e.arms:
                r = self.of(arm.when)
                if r is not None:
                    alts.append(_and(prefix + [r]))
                r = self.of(arm.then)
                if r is not None:
                    alts.append(_and(prefix + [arm.when, r]))
                prefix.append(_not(arm.when))
            r = self.of(e.otherwise)
            if r is not None:
                alts.append(_and(prefix + [r]))
            return _or(alts)
        return _or([r for r in (self.of(c) for c in ir.children(e)) if r is not None])

    def site(self, e: Any) -> ir.Span:
        """Where the read shows in the source: the first `X` (or derived variable reading it) in `e`."""
        stack = [e]
        while stack:
            node = stack.pop()
            if (isinstance(node, ir.Var) and node.span.line
                    and (node.name in self.names or self.of(node) is not None)):
                return node.span
            stack.extend(reversed(ir.children(node)))
        return e.span


@dataclass
class _Check:
    name: str  # the optional variable
    cond: Any  # expression: the read happens with the variable missing
    span: ir.Span
    where: str  # "in the condition of …" for the message


def _stage_checks(scenario: ir.Scenario, stage: ir.Stage,
                  optionals: list[_Optional]) -> tuple[list[_Check], list[_Check]]:
    """The read sites of one stage, per optional variable; and those too large to analyse."""
    out: list[_Check] = []
    too_big: list[_Check] = []
    for opt in optionals:
        name = opt.name
        reads = _Reads(scenario, opt.reads)
        flag = ir.Var(name=flag_name(opt.flag))
        earlier: list[Any] = []
        prior: list[Any] = []  # earlier reads of the variable in this stage: reaching them fails first
        for bi, b in enumerate(stage.branches):
            sites: list[tuple[Any, Any, str]] = []  # (expression, condition it is evaluated under, what)
            if b.guard is not None:
                sites.append((b.guard, _and(list(earlier)), "its condition"))
            fire = _and(earlier + ([b.guard] if b.guard is not None else []))
            t = b.target
            for call in t.steps:
                sites += [(a.value, fire, f"argument `{a.name}` of `do {call.action}`") for a in call.args]
            if t.kind == "action":
                sites += [(a.value, fire, f"argument `{a.name}` of `do {t.action}`") for a in t.args]
                sites += [(a.value, fire, f"output `{a.name}`") for a in t.outputs]
            for expr, before, what in sites:
                try:
                    r = reads.of(expr)
                except _TooBig:
                    if _mentions(scenario, expr, opt.reads):  # a site that cannot read it proves nothing
                        too_big.append(_Check(name, None, expr.span if expr.span.line else b.span,
                                              f"branch {bi + 1} of `{stage.id}` ({what})"))
                    continue
                if r is None:
                    continue
                span = reads.site(expr)
                out.append(_Check(name, _and([flag, before, r] + [_not(p) for p in prior]),
                                  span if span.line else b.span, f"branch {bi + 1} of `{stage.id}` ({what})"))
                prior.append(_and([before, r]))
            if b.guard is not None:
                earlier.append(_not(b.guard))
    return out, too_big


def _mentions(scenario: ir.Scenario, e: Any, names: frozenset[str]) -> bool:
    """Whether `e` names one of `names`, directly or through derived variables (one walk, each derived
    variable followed once: linear where `_Reads` is not)."""
    stack, seen = [e], set()
    while stack:
        node = stack.pop()
        if isinstance(node, ir.Var):
            if node.name in names:
                return True
            var = scenario.variables.get(node.name)
            if var is not None and var.expr is not None and node.name not in seen:
                seen.add(node.name)
                stack.append(var.expr)
        elif node is not None:
            stack.extend(ir.children(node))
    return False


def _live(ex: Explorer, checks: list[list[_Check]]) -> list[frozenset[int]]:
    """Variables each stage and its successors read, the read conditions included (so a `missing(X)`
    test upstream is remembered until the read it guards)."""
    sp = ex.sp
    n = len(ex.ids)
    live: list[set[int]] = [set(ex.live[si]) for si in range(n)]
    for si in range(n):
        for c in checks[si]:
            live[si].update(sp.base_reads(c.cond))
    preds: list[list[int]] = [[] for _ in range(n)]
    for si, row in enumerate(ex.targets):
        for kind, t in row:
            if kind == "stage" and t >= 0:
                preds[t].append(si)
    work = list(range(n))
    while work:
        t = work.pop()
        for p in preds[t]:
            before = len(live[p])
            live[p] |= live[t]
            if len(live[p]) != before:
                work.append(p)
    return [frozenset(s) for s in live]


def _needed(ex: Explorer, checks: list[list[_Check]]) -> list[bool]:
    """Per stage: whether it or a stage after it reads an optional value (the walk stops elsewhere)."""
    n = len(ex.ids)
    preds: list[list[int]] = [[] for _ in range(n)]
    for si, row in enumerate(ex.targets):
        for kind, t in row:
            if kind == "stage" and t >= 0:
                preds[t].append(si)
    needed = [bool(checks[si]) for si in range(n)]
    work = [si for si in range(n) if needed[si]]
    while work:
        for p in preds[work.pop()]:
            if not needed[p]:
                needed[p] = True
                work.append(p)
    return needed


class _Pass:
    def __init__(self, form: ir.Scenario, optionals: list[_Optional], source_id: Callable[[str], str],
                 lift: Callable[[dict[str, Any]], dict[str, Any]],
                 example: Callable[[dict[str, Any]], None], clock: CpuBudget | None = None):
        self.clock = clock or CpuBudget()
        self.out_of_time = False  # stopped at the CPU budget (`stopped_at`: where; `asking`: on what)
        self.asking = _EXPLORING
        self.at = 0  # the stage being explored
        self.form = form
        self.optionals = optionals
        self.source_id = source_id
        self.lift = lift
        self.example = example  # runs the engine on an example of the form (raises DecideError)
        self.t = rewritten(form, {o.flag for o in optionals})
        self.ex = Explorer(self.t)
        self.sp = self.ex.sp
        self.checks: list[list[_Check]] = []
        self.too_big: list[tuple[_Check, int]] = []  # (read site, stage index)
        big_keys: set[tuple[str, int, int, str]] = set()
        for si, st in enumerate(self.ex.stage_objs):
            found, big = _stage_checks(self.t, st, optionals)
            self.checks.append([c for c in found if not self._guarded_where_read(c)])
            for c in big:  # once per read as written (copies of a stage share it)
                if (c.name, c.span.line, c.span.col, c.span.file) not in big_keys:
                    big_keys.add((c.name, c.span.line, c.span.col, c.span.file))
                    self.too_big.append((c, si))
        self.ex.live = _live(self.ex, self.checks)
        self.needed = _needed(self.ex, self.checks)
        self.steps = STEP_BUDGET
        self.states = 0
        self.complete = True
        self.stopped_at: int | None = None  # stage index where the budget ran out
        self.unproven: list[tuple[_Check, int]] = []  # reads left undecided (and their stage index)
        self.open_keys: set[tuple[str, int, int, str]] = set()  # their (variable, line, col, file)
        self.done: set[tuple[str, int, int, str]] = set()  # (variable, line, col, file) reported or proven
        self.out: list[Diagnostic] = []

    def _guarded_where_read(self, c: _Check) -> bool:
        """Whether the read cannot happen with its value missing whatever the path (`not missing(X) and X …`):
        its condition is empty on every value, so no path needs exploring for it (this pass walked every
        stage before such a read, deciding which branches each region takes)."""
        try:
            return not self.sp.constrain(self.sp.full, self.sp.formula(c.cond, True))
        except Exception:  # noqa: BLE001 - not settled here: the walk decides it as before
            return False

    def spend(self, n: int, si: int) -> bool:
        self.steps -= n
        self.at = si
        if self.steps >= 0 and self.clock.out():
            self.out_of_time = True
            self.steps = -1
        if self.steps < 0:
            self.complete = False
            self.stopped_at = si if self.stopped_at is None else self.stopped_at
        return self.steps >= 0

    def run(self) -> list[Diagnostic]:
        """The reads reported, and the note on what was not proven; within the CPU budget."""
        try:
            with active(self.clock):
                self.explore()
        except OutOfCpu:
            self.out_of_time, self.complete = True, False
            self.stopped_at = self.at if self.stopped_at is None else self.stopped_at
        return self.out + self.note()

    def explore(self) -> None:
        ex = self.ex
        rk = ex.root_key()
        if rk is None:
            return
        seen = {rk}
        stack: list[tuple[tuple, Any]] = [(rk, None)]
        while stack:
            key, prefix = stack.pop()
            si, region, vk = key
            self.states += 1
            if self.states > MAX_STATES or not self.spend(len(region), si):
                self.complete = False
                self.stopped_at = si if self.stopped_at is None else self.stopped_at
                break
            for c in self.checks[si]:
                self.check(c, si, region, prefix)
            nvk = ex.next_visited(si, vk)
            nxt = []
            # only stages from which a read is still ahead are walked (`needed`): a stage whose branches
            # all end in actions, or lead only where nothing optional is read, needs no children, and
            # deciding which of them are feasible was half of this pass on a list of records (the reads'
            # own conditions are decided by `check`)
            self.asking = _EXPLORING
            onward = any(kind == "stage" and t >= 0 and self.needed[t] for kind, t in ex.targets[si])
            for bi, kind, tgt, creg, _u in ex.children(si, region) if onward else ():
                if kind == "stage" and tgt not in nvk and self.needed[tgt]:
                    ck = (tgt, creg, nvk)
                    if ck not in seen:
                        seen.add(ck)
                        nxt.append((ck, (prefix, si, bi)))
            stack.extend(reversed(nxt))

    def check(self, c: _Check, si: int, region: tuple[Box, ...], prefix: Any) -> None:
        key = (c.name, c.span.line, c.span.col, c.span.file)
        if key in self.done or not self.spend(len(region), si):
            return
        self.asking = f"deciding whether {self._read_text(c, si)} can be read while it is missing"
        sp = self.sp
        f = sp.formula(c.cond, True)
        boxes = [b2 for b in region for b2 in sp.split(b, f)]
        status = sp.decide_region(boxes) if boxes else False
        if status is False:
            return
        stages, branches = _steps(prefix)
        full = sp.constrain_region(self.ex.full_region(stages, branches), f)
        if not self.spend(len(full) + 1, si):
            return
        explained = False
        for box in full[:MAX_WITNESSES]:
            for style in ("representative", "boundary"):
                w = sp.witness(box, style)
                verdict = self.confirm(c, si, w, prefix) if w is not None else "no"
                if verdict == "yes":
                    self.done.add(key)
                    return
                explained = explained or verdict == "earlier"
        if not explained and key not in self.open_keys:
            self.open_keys.add(key)  # once per read as written (copies of a stage share it)
            self.unproven.append((c, si))

    def confirm(self, c: _Check, si: int, w: dict[str, Any], prefix: Any) -> str:
        """"yes" (the engine refuses the example at this read), "earlier" (it refuses it at an earlier
        read of an optional value, reported there), or "no"."""
        values = {k: v for k, v in w.items() if k not in {flag_name(o.flag) for o in self.optionals}}
        for o in self.optionals:
            if w.get(flag_name(o.flag)) is True:
                values[o.flag] = None
        sid = self.ex.ids[si]
        try:
            self.example(values)
        except DecideError as exc:
            if "is missing: it is optional" not in exc.message:
                return "no"
            if (exc.part or exc.variable) != c.name or exc.stage != sid:  # `part`: an optional record field
                return "earlier"
            shown = exc.read or c.name  # an optional record field: as the program reads it (`b.note`)
        except Exception:  # noqa: BLE001 - an example the engine cannot run proves nothing
            return "no"
        else:
            return "no"
        stages, _ = _steps(prefix)
        via = [self.source_id(self.ex.ids[s]) for s in stages] + [self.source_id(sid)]
        if len(via) > 8:
            via = via[:3] + ["..."] + via[-4:]
        src = self.source_id(sid)
        named = f"`{shown}`" if shown == c.name else f"`{shown}` (`{c.name}`)"
        message = f"{named} is optional and may be read while it is missing, at "
        if any(d.span == c.span and d.message.startswith(f"`{shown}` ") for d in self.out):
            return "yes"  # the same read of another item of the list: reported once
        self.out.append(warning(
            "W306", message + f"{c.where.replace(f'`{sid}`', f'`{src}`')}",
            c.span,
            f"test it first: `when missing({shown}) -> …` before this branch, or `not missing({shown}) and …` "
            f"in the condition; or give it an input default (`= value`) instead of `?`",
            witness=self.lift(values), notes=["reached via " + " -> ".join(via)]))
        return "yes"

    def note(self) -> list[Diagnostic]:
        """I303 when reads stayed unproven: located at the first such read (or where the budget ran out),
        naming each read's variable and branch, so the user knows what to test or rewrite."""
        what = []
        where = f" at stage `{self.source_id(self.ex.ids[self.stopped_at])}`" if self.stopped_at is not None else ""
        if self.out_of_time:
            what.append(f"the analysis reached its CPU budget ({self.clock.describe()}){where} while {self.asking}; "
                        "reads of optional values from there on were not checked")
        elif not self.complete:
            what.append(f"the analysis reached its work budget ({MAX_STATES:,} states, {STEP_BUDGET:,} region "
                        f"operations){where}")
        if self.unproven:
            what.append(f"{len(self.unproven)} read(s) of optional values stayed undecided (no example the engine "
                        "refuses was found, and no proof that none exists)")
        if self.too_big:
            what.append(f"{len(self.too_big)} condition(s) were too large to analyse for reads of optional values")
        if not what:
            return []
        notes = []
        if self.unproven:
            notes.append("undecided: " + "; ".join(self._read_text(c, si) for c, si in self.unproven[:3]))
        if self.too_big:
            notes.append("too large: " + "; ".join(self._read_text(c, si) for c, si in self.too_big[:3]))
        first = (self.unproven or self.too_big)[:1]
        if not self.complete and self.stopped_at is not None:  # where the message says it stopped
            span = self.ex.stage_objs[self.stopped_at].span
        else:
            span = first[0][0].span if first else self.form.span
        return [Diagnostic(code="I303", severity="info",
                           message="optional-value analysis incomplete: " + what[0], span=span,
                           hint="reads of optional values there were not proven guarded; test them with "
                                "`sop decide` on inputs that leave them out", notes=what[1:] + notes)]

    def _read_text(self, c: _Check, si: int) -> str:
        """`Voucher` in branch 2 of `check` (its condition), in the source's stage ids."""
        sid = self.ex.ids[si]
        return f"`{c.name}` in {c.where.replace(f'`{sid}`', f'`{self.source_id(sid)}`')}"


def _steps(prefix: Any) -> tuple[list[int], list[int]]:
    out: list[tuple[int, int]] = []
    while prefix is not None:
        prefix, si, bi = prefix
        out.append((si, bi))
    out.reverse()
    return [s for s, _ in out], [b for _, b in out]


def _optionals(scenario: ir.Scenario, names: list[str], unrolled: Unrolled | None,
               form: ir.Scenario) -> list[_Optional]:
    """The optional inputs in the analysis form's terms (lists and records by their plain variables)."""
    out = []
    for n in names:
        vtype = scenario.variables[n].type
        if ir.is_structured(vtype):
            if isinstance(unrolled, Lowered) and n in unrolled.plain_keys:
                out.append(_Optional(n, presence_key(n, vtype), frozenset(unrolled.plain_keys[n])))
        elif n in form.variables:
            out.append(_Optional(n, n, frozenset((n,))))
    if isinstance(unrolled, Lowered):  # optional record fields (`note: string?`), item by item
        out += [_Optional(path, key, keys) for path, key, keys in optional_field_keys(unrolled.roots)]
    return out


def _example_runner(unrolled: Unrolled | None, form: ir.Scenario) -> Callable[[dict[str, Any]], None]:
    """The engine on an example of the analysis form: on the program with its lists and records (the
    engine refuses a read of a missing list there, under the list's own name), else on the form."""
    if isinstance(unrolled, Lowered):
        lowered = unrolled

        def on_structures(values: dict[str, Any]) -> None:
            run(lowered.inner.scenario, lowered.lift_structures(values))

        return on_structures
    def on_form(values: dict[str, Any]) -> None:
        run(form, values)

    return on_form


def optional_read_diagnostics(scenario: ir.Scenario, *,
                              cpu_budget: float | CpuBudget = CHECK_CPU_BUDGET) -> list[Diagnostic]:
    """W306 for each read of an optional value that some feasible path reaches with the value missing
    (a verified example in `witness`); I303 when the bounded analysis could not settle every read (past
    `cpu_budget`, CPU seconds or a command's `CpuBudget`, it says where it stopped and on which read)."""
    names = [n for n, v in scenario.variables.items() if v.optional and v.role != "derived"]
    if (not names and not optional_field_names(scenario)) or not scenario.stages:
        return []
    unrolled: Unrolled | None = None
    form = scenario
    if needs_analysis_form(scenario):
        try:
            unrolled = analysis_form(scenario)
        except UnrollError:
            return []
        if unrolled.premature:
            return []
        form = unrolled.scenario
    optionals = _optionals(scenario, names, unrolled, form)
    if not optionals:
        return []

    def source_id(sid: str) -> str:
        return unrolled.origin.get(sid, sid) if unrolled is not None else sid

    def lift(values: dict[str, Any]) -> dict[str, Any]:
        if unrolled is None:
            return values
        return unrolled.lift(values)

    try:
        return _Pass(form, optionals, source_id, lift, _example_runner(unrolled, form),
                     budget_of(cpu_budget, CHECK_CPU_BUDGET)).run()
    except RecursionError:
        return []
    except Exception:  # noqa: BLE001 - `sop check` must never crash on an analysis bug
        return []


__all__ = ["flag_name", "optional_read_diagnostics", "rewritten"]
