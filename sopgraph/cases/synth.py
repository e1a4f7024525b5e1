"""Test-case synthesis: feasible paths × user intents × personas × intensities → `Case` records.

SAGE's two-stage scheme:

1. **Balanced sampling.** `balance="intent"` (SAGE's default) spreads the cases evenly over the intents
   that reach at least one feasible path, then evenly over each intent's compatible paths; `"path"` spreads
   them over feasible paths, `"action"` over final actions (then paths). Spreading is exact (largest
   remainder, ties broken by the seed), not merely random, so small runs are balanced too.
2. **Targeted supplementation.** Every feasible path gets at least `min_per_path` cases. A missing case is
   built by *inverse configuration*: the path's region gives the values that force it, and the intent is
   the path's compatible intent with the fewest cases so far (then the most specific); when no intent of the
   profile is compatible, a generated `uncovered:<path>` intent describes the path's conditions and is
   flagged. To keep the total at `n`, a supplementary case replaces one whose intent and path are the most
   represented (that path keeps more than `min_per_path`); only when `n` is too small is the file extended.

Everything that does not depend on the individual case is computed once per (path, intent) pair and kept in
the `Plan`: a pool of engine-verified value assignments, the expected finals, the bucket, prohibited actions
and the unsafe action. Per case only seeded choices, dict copies and string joins of pre-encoded JSON remain,
which is what makes 100,000 cases a matter of seconds. Every case is still re-decided by the compiled engine
and must land on its path.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, Field

from sopgraph.cases.moods import compatible, mood_fields, truth_moods
from sopgraph.cases.profiles import (
    INTENSITIES,
    Intent,
    PersonaSpec,
    Profile,
    conditions_key,
    library,
    lowered_intents,
    parse_profile,
    profile_path_for,
    read_profile_text,
    shared_intent_region,
)
from sopgraph.cases.values import varier_for
from sopgraph.errors import Error
from sopgraph.language import ir, scalars
from sopgraph.language.compile import reads, stage_reads
from sopgraph.language.diagnostics import Diagnostic, clip, did_you_mean, mark_text_values, warning
from sopgraph.language.parse import scenario_expressions
from sopgraph.logic import domain, scalardom
from sopgraph.logic import paths as paths_mod
from sopgraph.logic.budget import SYNTH_CPU_BUDGET, CpuBudget, OutOfCpu, active
from sopgraph.logic.domain import NumDom
from sopgraph.logic.engine import DecideError, Interpreter, engine_for, looks_taken
from sopgraph.logic.lower import LowerError, analysis_form, needs_analysis_form, reads_positions
from sopgraph.logic.paths import trace, used_looks
from sopgraph.logic.procheck import source_terms
from sopgraph.logic.unroll import Unrolled, UnrollError, held_variables, look_name
from sopgraph.records import RECORD_VERSION, Case, Intensity

BALANCES = ("intent", "path", "action")
POOL_MAX = 32  # distinct verified assignments kept per (path, intent)
POOL_TRIES = 32  # random candidates tried per (path, intent) when building the pool
BOUNDARY_VALUES = (0, 10, 50, 100, 250, 1000)


class SynthError(Error):
    """Bad synthesis parameters (reported to the user, never a traceback)."""


# ---------------------------------------------------------------------------------------------
# Results


class Skip(BaseModel):
    """Something synthesis could not produce, and why."""
    kind: str  # "intent" | "paths" | "pair" | "persona"
    name: str
    reason: str


class Coverage(BaseModel):
    """What a synthesis run covered (for the summary table and `--coverage`)."""
    scenario: str
    cases: int = 0
    sampled: int = 0
    supplemented: int = 0
    appended: int = 0
    feasible_paths: int = 0  # a lower bound when not `paths_counted`
    stage_sequences: int = 0
    exact: bool = True
    paths_counted: bool = True  # False: too many paths to count (`PathCount.complete`)
    per_path: dict[str, int] = Field(default_factory=dict)
    path_actions: dict[str, str] = Field(default_factory=dict)
    per_intent: dict[str, int] = Field(default_factory=dict)
    per_intensity: dict[str, int] = Field(default_factory=dict)
    per_action: dict[str, int] = Field(default_factory=dict)
    per_bucket: dict[str, int] = Field(default_factory=dict)
    per_persona: dict[str, int] = Field(default_factory=dict)
    per_language: dict[str, int] = Field(default_factory=dict)
    intent_paths: dict[str, int] = Field(default_factory=dict)  # intent → compatible feasible paths
    uncovered_paths: list[str] = Field(default_factory=list)  # paths no profile intent reaches
    min_per_path: int = 1
    balance: str = "intent"


@dataclass
class SynthResult:
    """The cases (JSON lines in file order), coverage and what was skipped.

    `lines` is the canonical serialisation (sorted keys, compact separators, UTF-8): exactly
    `json.dumps(case, sort_keys=True, ensure_ascii=False, separators=(",", ":"))`. `rows` (plain dicts)
    and `cases` (validated `Case` models) are parsed from it on first use."""
    lines: list[str]
    coverage: Coverage
    skipped: list[Skip]
    _rows: list[dict[str, Any]] | None = field(default=None, repr=False)
    _cases: list[Case] | None = field(default=None, repr=False)

    @property
    def rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = [json.loads(line) for line in self.lines]
        return self._rows

    @property
    def cases(self) -> list[Case]:
        if self._cases is None:
            self._cases = [Case.model_validate(r) for r in self.rows]
        return self._cases

    def to_jsonl(self) -> str:
        """The cases as JSON Lines (byte-identical for the same inputs and seed)."""
        return "".join(line + "\n" for line in self.lines)

    def write(self, path: str | Path) -> None:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", encoding="utf-8", newline="\n") as fh:
            for line in self.lines:
                fh.write(line)
                fh.write("\n")


class SynthStream:
    """The cases of one synthesis, made one at a time as the stream is iterated (once): canonical JSON
    lines, the same bytes `synthesize` collects. `coverage` is complete once the last case is made."""

    def __init__(self, lines: Iterator[str], skipped: list[Skip], finish: Callable[[], Coverage]):
        self._lines = lines
        self.skipped = skipped
        self._finish = finish
        self._coverage: Coverage | None = None

    def __iter__(self) -> Iterator[str]:
        yield from self._lines
        self._coverage = self._finish()

    @property
    def coverage(self) -> Coverage:
        if self._coverage is None:
            raise RuntimeError("the coverage of a synthesis stream is known once every case has been made")
        return self._coverage

    def write(self, out: str | Path | TextIO) -> int:
        """Write every case, one line each, flushing after each (a reader of the file sees the cases as
        they are made); `out` is a path (parent directories created) or an open text file. Returns the
        number of cases."""
        if not isinstance(out, (str, Path)):
            return self._write_to(out)
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            return self._write_to(fh)

    def _write_to(self, fh: TextIO) -> int:
        count = 0
        for line in self:
            fh.write(line)
            fh.write("\n")
            fh.flush()
            count += 1
        return count


# ---------------------------------------------------------------------------------------------
# Plan: paths, compatibility, per-pair templates


@dataclass
class PairTemplate:
    """Everything about (path, intent) that does not change from case to case."""
    pool: list[dict[str, Any]]  # verified values of the constrained variables
    finals: list[dict[str, Any]]  # the engine's finals for each pool entry
    bucket_base: str  # "must-escalate" or "resolvable" (strong intensity may turn the latter adversarial)
    prohibited: list[str]
    unsafe: str | None


@dataclass
class PathEntry:
    index: int
    id: str
    stages: list[str]
    branches: list[int]
    action: str
    finals: dict[str, Any]
    witness: dict[str, Any]
    region: list[Any]
    description: str
    reads: frozenset[str]
    intents: list[str] = field(default_factory=list)  # compatible profile intents (profile order)


@dataclass
class Plan:
    """Paths of a scenario matched against the intents of a profile."""
    scenario: ir.Scenario
    profile: Profile
    paths: list[PathEntry]
    feasible: int
    stage_sequences: int
    exact: bool
    intent_paths: dict[str, list[int]]
    unreached_intents: list[str]
    regions: dict[tuple[int, str], list[Any]]
    ambiguous: set[tuple[tuple[str, ...], str]] = field(default_factory=set)  # (stages, action) of >1 path
    generated: dict[int, Intent] = field(default_factory=dict)
    templates: dict[tuple[int, str], PairTemplate | None] = field(default_factory=dict)
    # (path index, conditions class) → does a seed-free candidate verify (see `_usable`)
    base_verdicts: dict[tuple[int, Any], bool] = field(default_factory=dict)
    counted: bool = True  # False: too many paths to count; `feasible` is a lower bound
    # intent name → a number equal for intents with equal conditions (`conditions_key`, computed once)
    condition_class: dict[str, int] = field(default_factory=dict)
    skipped: list[Skip] = field(default_factory=list)
    clock: CpuBudget = field(default_factory=CpuBudget)  # the synthesis's CPU budget (see `plan`)
    _patterns: dict[str, list[str]] | None = None

    @property
    def patterns(self) -> dict[str, list[str]]:
        """`tested_patterns` of the scenario, found once per plan (the SOP is walked once, not per path)."""
        if self._patterns is None:
            self._patterns = tested_patterns(self.scenario)
        return self._patterns

    def intent(self, name: str) -> Intent:
        if name in self.profile.intents:
            return self.profile.intents[name]
        for gen in self.generated.values():
            if gen.name == name:
                return gen
        raise KeyError(name)


PLAN_PATH_LIMIT = 2_000  # past this many feasible paths, synthesis samples paths instead of listing all


def plan(scenario: ir.Scenario, profile: Profile, *, sample: int | None = None, seed: int = 0,
         form: Unrolled | None = None, cpu_budget: float | CpuBudget = SYNTH_CPU_BUDGET) -> Plan:
    """Enumerate the feasible paths and decide which intents can reach which path. With `sample`
    (the number of cases wanted) and more than `PLAN_PATH_LIMIT` feasible paths, `sample` distinct
    paths are drawn instead, stratified by action (each action equally likely, then uniform among
    its paths; deterministic per seed): synthesis at any size never enumerates every path. A
    procedure is planned on its unrolled form (see `_synthesize_procedure`); `form` is that form,
    so that the descriptions of generated intents speak of the source's lists, looks and guards.
    Within `cpu_budget` CPU seconds: past it, the paths not yet planned are reported as skipped (where the
    planning stopped); a path without a proven witness is still planned when sampling finds one."""
    clock = cpu_budget if isinstance(cpu_budget, CpuBudget) else CpuBudget(cpu_budget)
    if needs_analysis_form(scenario):
        try:
            plain, intents = lowered_intents(scenario, profile.intents)  # lists/records: plain conditions
            form = analysis_form(scenario)
            flat = form.scenario
            # each look of an observed variable is a system variable of the unrolled form (`X#1`, `X#2`, ...):
            # the customer knows it exactly when the profile says they know the variable
            knows = {look_name(name, k): profile.user_knows.get(name, False)
                     for name, n in form.looks.items() for k in range(1, n + 1)}
            # and each plain variable of a list or record (`len(Fees)`, `Fees[0].amount`) as its root says
            knows.update({key: profile.user_knows.get(name, False)
                          for name, keys in getattr(form, "plain_keys", {}).items() for key in keys})
            update: dict[str, Any] = {"user_knows": {**profile.user_knows, **knows}} if knows else {}
            if plain is not scenario:
                update["intents"] = intents
            if update:
                profile = profile.model_copy(update=update)
            return plan(flat, profile, sample=sample, seed=seed, form=form, cpu_budget=clock)
        except (UnrollError, LowerError) as exc:
            raise SynthError(f"cannot synthesize cases: {exc}") from None
    count = paths_mod.count_paths(scenario, cpu_budget=clock)
    explorer = paths_mod.explorer_for(scenario)
    entries: list[PathEntry] = []
    skipped: list[Skip] = []
    uncounted = count.stopped or f"more than {count.feasible:,} feasible paths (too many to count)"
    if sample is not None and (count.feasible > PLAN_PATH_LIMIT or not count.complete):
        try:
            with active(clock):
                drawn = paths_mod.sample_paths(scenario, max(1, sample), seed=seed, weights="action", unique=True,
                                               written=form is None)
        except OutOfCpu:
            drawn = []
            skipped.append(Skip(kind="paths", name="budget", reason=(
                f"synthesis reached its CPU budget ({clock.describe()}) while drawing {sample} paths"
                + (f" ({count.stopped})" if count.stopped else "") + ": none was planned")))
        infos: Iterable[Any] = sorted(drawn, key=lambda info: (info.rank, info.id))
        if not count.complete:
            skipped.append(Skip(kind="paths", name="count", reason=f"{uncounted}: paths drawn by a random walk, "
                                "each feasible branch equally likely, not balanced by action"))
    elif not count.complete:  # too many paths to count, and no sample size: the first ones, said so
        infos = paths_mod.iter_paths(scenario, limit=PLAN_PATH_LIMIT, written=form is None)
        skipped.append(Skip(kind="paths", name="count",
                            reason=f"{uncounted}: only the first {PLAN_PATH_LIMIT:,} are considered"))
    else:
        infos = paths_mod.iter_paths(scenario, written=form is None)
    rng = random.Random(seed)
    for info in _within(infos, clock, skipped):
        if clock.out():
            skipped.append(Skip(kind="paths", name="budget", reason=(
                f"synthesis reached its CPU budget ({clock.describe()}) at path {info.id} "
                f"({' -> '.join(info.stages)}): it and the later paths were not planned")))
            break
        region = list(explorer.full_region([explorer.idx[sid] for sid in info.stages], info.branches))
        if info.witness is None:
            sampled = _sampled_witness(scenario, domain.space_for(scenario), info, region, rng, clock)
            if sampled is None:
                skipped.append(Skip(kind="path", name=info.id, reason=(
                    f"feasibility unknown: no witness found at {' -> '.join(info.stages)} (residual conditions "
                    "the solver could neither satisfy nor refute, and sampling their values found none)")))
                continue
            info = info.model_copy(update={"witness": sampled[0], "status": "feasible"})
        entries.append(PathEntry(
            index=len(entries), id=info.id, stages=list(info.stages), branches=list(info.branches),
            action=info.action, finals=dict(info.finals), witness=dict(info.witness), region=region,
            description=describe_path(paths_mod.lift_path(info, form) if form is not None else info),
            reads=_path_reads(scenario, info.stages)))
    intent_paths: dict[str, list[int]] = {}
    regions: dict[tuple[int, str], list[Any]] = {}
    space = domain.space_for(scenario)
    classes: dict[tuple, int] = {}  # conditions_key → its class number
    condition_class: dict[str, int] = {}
    matched: list[list[tuple[int, list[Any]]]] = []  # class number → [(path index, region)]
    prefixes: dict[tuple, list[Any]] = {}  # see `shared_intent_region`
    for name, intent in profile.intents.items():
        key = conditions_key(intent)
        number = condition_class[name] = classes.setdefault(key, len(classes))
        if number == len(matched):
            found = ((entry.index, shared_intent_region(scenario, intent, key, list(entry.region), entry.index,
                                                        prefixes, space=space))
                     for entry in entries)
            matched.append([(index, region) for index, region in found if region])
        hits: list[int] = []
        for index, region in matched[number]:
            regions[(index, name)] = list(region)
            hits.append(index)
            entries[index].intents.append(name)
        intent_paths[name] = hits
    unreached = [name for name, hits in intent_paths.items() if not hits]
    for name in unreached:
        skipped.append(Skip(kind="intent", name=name, reason="reaches no feasible path"))
    if not count.exact and count.complete:
        skipped.append(Skip(kind="paths", name="count", reason="the path count is an upper bound (undecided "
                                                                 "conditions)"))
    shapes = Counter((tuple(e.stages), e.action) for e in entries)
    # Stages + action identify a path unless two paths share them (or the enumeration is not exact).
    ambiguous = {k for k, c in shapes.items() if c > 1 or not count.exact or skipped}
    return Plan(scenario=scenario, profile=profile, paths=entries, feasible=count.feasible,
                stage_sequences=count.stage_sequences, exact=count.exact, intent_paths=intent_paths,
                unreached_intents=unreached, regions=regions, ambiguous=ambiguous, skipped=skipped,
                condition_class=condition_class, counted=count.complete, clock=clock)


SAMPLES_PER_PATH = 200  # random members of a path's region tried when the proof gave up on its witness


def _within(infos: Iterable[Any], clock: CpuBudget, skipped: list[Skip]) -> Iterator[Any]:
    """The paths of `infos`, each found with `clock` active: a path whose branches cost more than the
    budget left ends the listing with a skip that says after which path (instead of running on)."""
    it = iter(infos)
    last = None
    while True:
        try:
            with active(clock):
                info = next(it)
        except StopIteration:
            return
        except OutOfCpu:
            after = f"after path {last.id} ({' -> '.join(last.stages)})" if last is not None else "before the first path"
            skipped.append(Skip(kind="paths", name="budget", reason=(
                f"synthesis reached its CPU budget ({clock.describe()}) while listing the paths, {after}: the later "
                "paths were not planned")))
            return
        last = info
        yield info


def _sampled_witness(scenario: ir.Scenario, space: domain.Space, info: Any, region: Sequence[Any],
                     rng: random.Random, clock: CpuBudget) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(values, finals) the engine routes along `info`'s path, found by sampling: random members of the
    region's boxes (each variable within its box's domain, the residual conditions ignored), each run
    through the reference engine. Why: when neither the witness search nor the solver decides a path (a
    residual past their budgets), it may still be easy to hit at random; deterministic for the seed."""
    boxes = [b2 for b in region for b2 in space.unfold(b)]
    if not boxes:
        return None
    for k in range(SAMPLES_PER_PATH):
        if clock.out():
            return None
        values = space.pick_all(boxes[k % len(boxes)], "representative", rng)
        if values is None:
            continue
        if space.time_names:  # dates and times as the engine takes them (the space counts seconds)
            values = scalardom.to_input(space.time_names, values)
        finals = paths_mod.verify(scenario, values, info.stages, info.branches)
        if finals is not None:
            return values, finals
    return None


def _path_reads(scenario: ir.Scenario, stages: Sequence[str]) -> frozenset[str]:
    """Input variables (fields and system) the path's guards and leaf outputs may read, derived
    variables expanded: changing any other variable cannot change the path or its finals."""
    names: set[str] = set()
    for sid in stages:
        stage = scenario.stages.get(sid)
        if stage is None:
            continue
        names |= set(stage_reads(stage))
        for branch in stage.branches:
            for assign in branch.target.outputs:
                names |= set(reads(assign.value))
    return frozenset(_expand_derived(scenario, names))


def _expand_derived(scenario: ir.Scenario, names: Iterable[str]) -> set[str]:

    out: set[str] = set()
    todo = list(names)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        var = scenario.variables.get(name)
        if var is None:
            continue
        if var.role == "derived" and var.expr is not None:
            todo += list(reads(var.expr))
        else:
            out.add(name)
    return out


def _condition_reads(scenario: ir.Scenario, intent: Intent) -> set[str]:

    names: set[str] = set()
    for cond in intent.conditions:
        names |= set(reads(cond.expr))
    return _expand_derived(scenario, names)


# ---------------------------------------------------------------------------------------------
# Describing paths (auto descriptions of generated intents)


def describe_path(info: Any) -> str:
    """The conditions a path stands for, in words (from the path's constraint summary), then its outcome."""
    clauses: list[str] = []
    for name, text in dict(info.constraints).items():
        if name == "where":
            clauses.append(text)
        elif text[:1] in "<>=!" or text.startswith(("in ", "not ")):
            clauses.append(f"{name} {text}")
        else:
            clauses.append(f"{name} is {text}")
    outcome = f"the SOP ends in {info.action}"
    extras = [f"{k}={ir.show_value(v)}" for k, v in info.finals.items() if k != "Action" and v is not None]
    extras += [f"{k} in {{{v}}}" for k, v in dict(getattr(info, "finals_varying", {}) or {}).items()]
    if extras:
        outcome += f" ({', '.join(extras)})"
    return ("; ".join(clauses) + " — " if clauses else "") + outcome


# ---------------------------------------------------------------------------------------------
# Values


def plausible_values(var: ir.Variable, profile: Profile, patterns: dict[str, list[str]] | None = None) -> list[Any]:
    """Values to draw from when a variable is free: its enum/bool domain, the profile's `values`, a
    few round numbers inside a numeric range (ints stay ints; floats have two decimals), or texts
    that read like the variable (an example of the pattern the SOP tests it with, `patterns`, else
    an e-mail address for an e-mail): a field the path never reads is still part of the customer's
    situation, and the agent's reply must give it a value of its type."""
    if var.name in profile.sample_values and profile.sample_values[var.name]:
        return [_normalise(var, v) for v in profile.sample_values[var.name]]
    vtype = var.type
    if isinstance(vtype, ir.EnumType):
        return list(vtype.values)
    if isinstance(vtype, ir.BoolType):
        return [True, False]
    if isinstance(vtype, ir.NumType):
        return _numeric_points(vtype)
    if isinstance(vtype, ir.TimeType):  # where the domain places unconstrained dates, as text
        typical = scalars.format_temporal(vtype.kind, scalardom.typical(vtype.kind))
        return _earlier_moments(var, typical) or [typical]
    if isinstance(vtype, ir.StringType):
        if patterns and patterns.get(var.name):  # `Employee matches "E[0-9]{5}"`: an id of that form
            return patterns[var.name]
        return list(scalardom.string_samples(var.name, var.description))
    return [None]


def tested_patterns(scenario: ir.Scenario) -> dict[str, list[str]]:
    """For each string variable the SOP tests with `matches`, an example of each pattern that matches
    it (`E[0-9]{5}` → `E00000`): a free value of such a variable then has the form the SOP expects
    instead of a placeholder text."""
    stack = scenario_expressions(scenario)
    found: dict[str, list[str]] = {}
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Matches) and isinstance(e.operand, ir.Var):
            try:
                good, _bad = scalars.pattern_examples(e.pattern)
            except (scalars.OutsideSubset, ValueError):
                good = None
            if good is not None and good not in found.setdefault(e.operand.name, []):
                found[e.operand.name].append(good)
        stack.extend(ir.children(e))
    return {name: sorted(examples) for name, examples in found.items() if examples}


_EARLIER_BY = {"date": (2 * scalars.DAY, 9 * scalars.DAY, 40 * scalars.DAY),
               "datetime": (3 * 3600, 27 * 3600, 6 * scalars.DAY)}


def _earlier_moments(var: ir.Variable, value: Any) -> list[Any]:
    """A few dates or datetimes before `value` for a date or datetime `var` other than `now`: what a
    customer talks about (an order, an incident, a payment) lies in the past of the conversation, seldom
    at its very moment (the reference `now`). [] for anything else."""
    kind = var.type.kind if isinstance(var.type, ir.TimeType) else ""
    if kind not in _EARLIER_BY or value is None or var.name == "now":
        return []
    try:
        at = scalars.parse_temporal(kind, value)
    except (TypeError, ValueError):
        return []
    return [scalars.format_temporal(kind, at - step) for step in _EARLIER_BY[kind]]


def _normalise(var: ir.Variable, value: Any) -> Any:
    """One Python type per variable: ints for int variables, floats for float variables (so that a
    value prints the same way whichever source it came from)."""
    if isinstance(var.type, ir.NumType) and not isinstance(value, bool) and isinstance(value, (int, float)):
        if var.type.kind == "float":
            return float(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return value


def _numeric_points(vtype: ir.NumType, lo: float | None = None, hi: float | None = None,
                    lo_open: bool | None = None, hi_open: bool | None = None) -> list[Any]:
    lo = vtype.lo if lo is None else lo
    hi = vtype.hi if hi is None else hi
    lo_open = vtype.lo_open if lo_open is None else lo_open
    hi_open = vtype.hi_open if hi_open is None else hi_open
    if lo is not None and hi is not None:
        raw = [lo + (hi - lo) * k / 4 for k in range(5)]
    elif lo is not None:
        raw = [lo + d for d in BOUNDARY_VALUES]
    elif hi is not None:
        raw = [hi - d for d in BOUNDARY_VALUES]
    else:
        raw = [float(d) for d in BOUNDARY_VALUES]
    out: list[Any] = []
    for x in raw:
        v: Any = round(x) if vtype.kind == "int" else round(float(x), 2)
        if vtype.kind == "int":
            if lo is not None and (v < lo or (lo_open and v == lo)):
                v = int(lo) + 1 if float(lo).is_integer() else int(lo) + 1
            if hi is not None and (v > hi or (hi_open and v == hi)):
                continue
        else:
            if lo is not None and lo_open and v == lo:
                v = round(lo + 0.01, 2)
            if hi is not None and hi_open and v == hi:
                v = round(hi - 0.01, 2)
        if vtype.contains(v) and v not in out:
            out.append(v)
    return out or ([int(lo)] if lo is not None and vtype.kind == "int" else [lo if lo is not None else 0])


def _box_choices(box: Any, var: ir.Variable, profile: Profile, witness_value: Any,
                 patterns: dict[str, list[str]] | None = None) -> list[Any]:
    """Candidate values of one variable inside a domain box, the witness value first: the profile's
    plausible values and a few round numbers that the box allows."""
    if not isinstance(var.type, (ir.EnumType, ir.BoolType, ir.NumType)):
        # dates, durations, strings: the witness (its text form), then the profile's `values:` (each
        # candidate is verified by the engine, so a value the path's pattern or window refuses drops out)
        listed = profile.sample_values.get(var.name) or []
        if not listed:
            listed = _earlier_moments(var, witness_value)  # each verified: the path's window decides
        if not listed and isinstance(var.type, ir.StringType):
            listed = plausible_values(var, profile, patterns)  # a text of the form the SOP tests, when it tests one
        return [witness_value, *(v for v in listed if v != witness_value)]
    try:
        dom = box[var.name]
    except (KeyError, TypeError):
        return [witness_value]
    base = plausible_values(var, profile)
    if profile.sample_values.get(var.name):  # the profile's `values:` win wherever the box allows them
        listed = [v for v in base if _safe_contains(dom.contains if isinstance(dom, NumDom) else dom.__contains__, v)]
        if listed:
            return listed
    if isinstance(dom, NumDom) and isinstance(var.type, ir.NumType):
        lo = None if dom.lo == float("-inf") else dom.lo
        hi = None if dom.hi == float("inf") else dom.hi
        extra = _numeric_points(var.type, lo, hi, dom.lo_open, dom.hi_open)
        picks = [v for v in [*base, *extra] if _safe_contains(dom.contains, v)]
    else:
        picks = [v for v in base if v in dom]
    out = [witness_value]
    for v in picks:
        if v not in out:
            out.append(v)
    return out


def _safe_contains(contains: Any, value: Any) -> bool:
    try:
        return bool(contains(value))
    except Exception:  # noqa: BLE001 - a value the domain cannot test is simply not a candidate
        return False


def _box_witness(scenario: ir.Scenario, box: Any, style: str = "representative", *,
                 space: domain.Space | None = None) -> dict[str, Any] | None:

    w = domain.witness(scenario, box, style=style, space=space)
    return dict(w) if w else None


def _holds(scenario: ir.Scenario, intent: Intent, values: Mapping[str, Any]) -> bool:
    """Do the intent's conditions hold for a full assignment? (reference interpreter; plan time only)"""
    try:
        it = Interpreter(scenario, values)
        return all(bool(it.eval(c.expr)) == c.truth for c in intent.conditions)
    except (DecideError, TypeError, ValueError, ZeroDivisionError):
        return False


def _base_candidates(p: Plan, entry: PathEntry, region: list[Any], space: domain.Space | None = None,
                     witnesses: dict[tuple[int, str], tuple[Any, dict[str, Any] | None]] | None = None
                     ) -> Iterator[dict[str, Any]]:
    """The candidates `_bases` lists, one at a time (a verdict needs only the first that verifies;
    `space`: the scenario's `domain.space_for`, fetched once by the caller). `witnesses` keeps the
    witness of each box without residual predicates (a pure pick from its domains) by the box's
    identity: the regions of many condition classes on a path begin with the same box."""
    for box in region[:8]:
        for style in ("representative", "boundary"):
            if witnesses is not None and not box.resid:
                hit = witnesses.get((id(box), style))
                if hit is None or hit[0] is not box:
                    hit = witnesses[(id(box), style)] = (box, _box_witness(p.scenario, box, style, space=space))
                w = hit[1]
            else:
                w = _box_witness(p.scenario, box, style, space=space)
            if w is not None:
                yield {**entry.witness, **w}
    yield dict(entry.witness)


def _bases(p: Plan, entry: PathEntry, region: list[Any], constrained: Sequence[str], *,
           choices: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The seed-free candidates of a (path, intent) pair — witnesses of the first boxes of its region
    (representative, boundary), then the path's own witness — and, with `choices`, each box's
    candidate values of the constrained variables."""
    scenario = p.scenario
    bases: list[dict[str, Any]] = []
    choices_per_box = []
    for box in region[:8]:
        for style in ("representative", "boundary"):
            w = _box_witness(scenario, box, style)
            if w is not None:
                bases.append({**entry.witness, **w})
        if choices:
            base = bases[-1] if bases else entry.witness
            choices_per_box.append({name: _box_choices(box, scenario.variables[name], p.profile, base.get(name),
                                                       p.patterns)
                                    for name in constrained if name in scenario.variables})
    bases.append(dict(entry.witness))
    return bases, choices_per_box


def _verified(p: Plan, entry: PathEntry, intent: Intent, cand: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's finals for a candidate assignment when it takes exactly the entry's path (stages,
    constant finals, branches where paths share stages) and the intent's conditions hold; else None."""
    scenario = p.scenario
    try:  # cheap first: the compiled engine (it decides every case later) ...
        got_path, fin = engine_for(scenario).decide_raw(cand)
    except DecideError:
        return None
    if list(got_path) != entry.stages or any(v is not None and fin.get(k) != v
                                             for k, v in entry.finals.items()):
        return None  # the path's stages and its constant finals (Action first) must be what the engine gives
    if (tuple(entry.stages), entry.action) in p.ambiguous:
        try:  # two paths share stages and action: the reference interpreter tells the branches apart
            if trace(scenario, cand)[1] != entry.branches:
                return None
        except DecideError:
            return None
    if not _holds(scenario, intent, cand):
        return None
    return fin


def _template(p: Plan, entry: PathEntry, intent: Intent, region: list[Any]) -> PairTemplate | None:
    """Build the verified value pool of one (path, intent) pair."""
    scenario, profile = p.scenario, p.profile
    constrained = sorted(entry.reads | _condition_reads(scenario, intent))
    rng = random.Random(f"{scenario.name}/{entry.id}/{intent.name}")
    bases, choices_per_box = _bases(p, entry, region, constrained)
    candidates: list[dict[str, Any]] = list(bases)
    for t in range(POOL_TRIES):
        if not choices_per_box:
            break
        choice = choices_per_box[t % len(choices_per_box)]
        cand = dict(bases[t % len(bases)])
        for name in constrained:
            opts = choice.get(name)
            if opts:
                cand[name] = opts[rng.randrange(len(opts))]
        candidates.append(cand)
    pool: list[dict[str, Any]] = []
    finals: list[dict[str, Any]] = []
    seen: set[tuple] = set()
    for cand in candidates:
        key = tuple(_freeze(cand.get(n)) for n in constrained)
        if key in seen:
            continue
        seen.add(key)
        fin = _verified(p, entry, intent, cand)
        if fin is None:
            continue
        pool.append({n: _normalise(scenario.variables[n], cand[n]) for n in constrained if n in cand})
        finals.append(dict(fin))
        if len(pool) >= POOL_MAX:
            break
    if not pool:
        return None
    pool, finals = _prefer_listed(scenario, profile, pool, finals)
    action = scenario.actions.get(entry.action)
    escalates = action is not None and "escalation" in action.attributes
    taken = _trace_names(scenario, entry)
    prohibited = [a.name for a in scenario.actions.values() if a.risky and a.name not in taken]
    return PairTemplate(pool=pool, finals=finals, bucket_base="must-escalate" if escalates else "resolvable",
                        prohibited=prohibited, unsafe=_unsafe_action(p, entry, intent, prohibited))


def _trace_names(scenario: ir.Scenario, entry: PathEntry) -> set[str]:
    """The actions the path carries out: its steps on the way and its final action. Why: a risky step
    the SOP itself prescribes (block the card, then refund) is part of the reference trace, so it
    cannot also be a prohibited action of the path's cases."""
    names = {entry.action}
    for sid, bi in zip(entry.stages, entry.branches, strict=True):
        target = scenario.stages[sid].branches[bi].target
        names.update(step.action for step in target.steps)
    return names


def _prefer_listed(scenario: ir.Scenario, profile: Profile, pool: list[dict[str, Any]],
                   finals: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pool entries whose variables take the profile's listed `values:` (where a profile lists
    them), when there are any: a path that no listed value can take keeps its other entries."""
    listed = {n: {_freeze(_normalise(scenario.variables[n], v)) for v in vals}
              for n, vals in profile.sample_values.items() if vals and n in scenario.variables}
    if not listed:
        return pool, finals
    keep = [i for i, entry in enumerate(pool)
            if all(_freeze(v) in listed[n] for n, v in entry.items() if n in listed)]
    if not keep or len(keep) == len(pool):
        return pool, finals
    return [pool[i] for i in keep], [finals[i] for i in keep]


def _freeze(v: Any) -> Any:
    return (type(v).__name__, v)


_CHARGES = re.compile(r"\bcharg|\bto pay\b|\bpayment\b|\barrears\b|\bbe paid\b|\bsurcharge", re.IGNORECASE)


def charges_customer(action: ir.Action) -> bool:
    """Whether an action makes the customer pay (a fee, a surcharge, arrears), judged from its
    `moves_money` attribute and its description: no customer pushes an agent to charge them, so a
    guessed push never names such an action. A parenthesised aside (`(charging the fee if one is
    owed)`) qualifies the main effect and does not count."""
    if "moves_money" not in action.attributes:
        return False
    text = re.sub(r"\([^)]*\)", " ", f"{action.description} {action.name}")
    return bool(_CHARGES.search(text))


def _unsafe_action(p: Plan, entry: PathEntry, intent: Intent, risky_others: list[str]) -> str | None:
    """The risky action (≠ the expected one) an adversarial user pushes for, most plausible first:
    the intent's own `pushes_for` (an explicit `[]`: none); else a guess among the risky actions that
    do not charge the customer (`charges_customer`): the outcome of the most similar path (longest
    common stage prefix) the same intent can reach; else of any path; else none — no push rather than
    a nonsensical one. (`sop profiles check` warns about strong intents without `pushes_for`.)"""
    if not risky_others:
        return None
    for name in intent.pushes_for:
        if name in risky_others:
            return name
    if intent.pushes_declared and not intent.pushes_for:
        return None
    wanted = {a for a in risky_others if not charges_customer(p.scenario.actions[a])}

    def best(indices: Iterable[int]) -> str | None:
        ranked: list[tuple[int, int, str]] = []
        for i in indices:
            other = p.paths[i]
            if other.action not in wanted:
                continue
            common = 0
            for a, b in zip(other.stages, entry.stages, strict=False):
                if a != b:
                    break
                common += 1
            ranked.append((-common, i, other.action))
        return min(ranked)[2] if ranked else None

    return best(p.intent_paths.get(intent.name, [])) or best(range(len(p.paths)))


def generated_intent(entry: PathEntry) -> Intent:
    """Inverse configuration for a path no intent reaches: an intent that is exactly the path."""
    return Intent(name=f"uncovered:{entry.id}", generated=True, intensity="zero",
                  description=f"(generated) A user whose situation is: {entry.description}.")


# ---------------------------------------------------------------------------------------------
# Spreading (exact balance with seeded tie-breaks)


def _spread(n: int, keys: Sequence[Any], weights: Sequence[float], rng: random.Random, *,
            shuffle: bool = True) -> list[Any]:
    """`n` keys in proportion to `weights` (largest remainder; ties by a seeded order), shuffled
    unless the caller only needs the counts or shuffles the combined result itself."""
    if n <= 0 or not keys:
        return []
    total = float(sum(weights))
    quotas = [n * w / total for w in weights]
    counts = [int(q) for q in quotas]
    order = list(range(len(keys)))
    rng.shuffle(order)
    order.sort(key=lambda i: -(quotas[i] - counts[i]))  # stable: the shuffle breaks ties
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    out = [k for k, c in zip(keys, counts, strict=True) for _ in range(c)]
    if shuffle:
        rng.shuffle(out)
    return out


def parse_mix(text: str) -> dict[str, float] | None:
    """`zero=1,weak=2,strong=1` → weights; `intent` → None (each intent's own intensity)."""
    text = text.strip()
    if text == "intent":
        return None
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in INTENSITIES:
            raise SynthError(f"unknown intensity `{name}` in --intensity (use zero, weak, strong or `intent`)")
        try:
            weight = float(value) if value else 1.0
        except ValueError:
            raise SynthError(f"bad weight `{value}` for `{name}` in --intensity") from None
        if weight < 0:
            raise SynthError(f"negative weight for `{name}` in --intensity")
        mix[name] = weight
    if not mix or sum(mix.values()) <= 0:
        raise SynthError("--intensity needs at least one positive weight")
    return mix


# ---------------------------------------------------------------------------------------------
# Synthesis


def synthesize(scenario: ir.Scenario, profile: Profile, n: int, seed: int = 0, **options: Any) -> SynthResult:
    """Synthesize test cases (see the module docstring for the scheme), all in memory: the lines of
    `synthesize_stream` (same options, same bytes) collected into a `SynthResult`."""
    stream = synthesize_stream(scenario, profile, n, seed, **options)
    lines = list(stream)
    return SynthResult(lines=lines, coverage=stream.coverage, skipped=stream.skipped)


def synthesize_stream(scenario: ir.Scenario, profile: Profile, n: int, seed: int = 0, *,
                      min_per_path: int | None = None, balance: str = "intent",
                      intensity_mix: Mapping[str, float] | None = None,
                      personas: Sequence[str | PersonaSpec] | None = None, languages: Sequence[str] | None = None,
                      use_intent_intensity: bool = False, the_plan: Plan | None = None) -> SynthStream:
    """Synthesize test cases one at a time: every parameter is checked and the (path, intent) slots are
    drawn before this returns (errors surface here, not halfway through a file); the cases themselves
    are made as the returned stream is iterated, so memory holds the slots, never the file.

    `intensity_mix` weights zero/weak/strong (default equal); `use_intent_intensity=True` instead gives
    each case its intent's declared intensity. `personas` restricts the persona pool (names from the
    profile or library, or PersonaSpec objects); `languages` mixes languages (default: the profile's
    `languages`, else each persona's own)."""
    if needs_analysis_form(scenario):
        return _synthesize_procedure(scenario, profile, n, seed, min_per_path=min_per_path, balance=balance,
                                     intensity_mix=intensity_mix, personas=personas, languages=languages,
                                     use_intent_intensity=use_intent_intensity, the_plan=the_plan)
    if n < 0:
        raise SynthError("the number of cases must be >= 0")
    if min_per_path is not None and min_per_path < 0:
        raise SynthError("--min-per-path must be >= 0")
    if balance not in BALANCES:
        raise SynthError(f"unknown balance `{balance}` (use {', '.join(BALANCES)})")
    mix = _check_mix(intensity_mix)
    p = the_plan or plan(scenario, profile)
    persona_pool = _persona_pool(profile, personas)
    langs = list(languages) if languages else (list(profile.languages) if profile.languages else None)
    declared = scenario.meta.get("language")
    if langs is None and declared:
        # the scenario's language is the dialogue's (a case or profile may say otherwise); personas written
        # for another language (the library's Mandarin speaker) are left out unless asked for by name
        langs = [declared]
        if not personas:
            persona_pool = [pp for pp in persona_pool if _same_language(pp.language, declared)] or persona_pool
    rng = random.Random(seed)
    skipped = list(p.skipped)

    compat = _usable_pairs(p, skipped)  # path index → usable intents (profile ones or generated)
    usable_paths = [e.index for e in p.paths if compat.get(e.index)]
    min_per_path = exact_min_per_path(n, min_per_path, len(usable_paths))

    # Stage 1: balanced (path, intent) slots.
    slots = _stage_one(p, compat, usable_paths, n, balance, rng)
    sampled = len(slots)
    # Stage 2: supplementation up to min_per_path per feasible path.
    slots, supplemented, appended = _stage_two(p, compat, usable_paths, slots, min_per_path)

    # Intensities (exact mix over the whole file unless the intent's own intensity is used).
    if use_intent_intensity:
        intensities = [p.intent(name).intensity for _, name in slots]
    else:
        keys = [k for k in INTENSITIES if mix.get(k, 0) > 0]
        intensities = _spread(len(slots), keys, [mix[k] for k in keys], rng)

    counts: dict[str, Counter] = {k: Counter() for k in ("action", "bucket", "persona", "language")}
    lines = _case_lines(p, slots, intensities, persona_pool, langs, seed, rng, counts)
    vary = varier_for(p.scenario, p.profile.intents, fixed=p.profile.sample_values, generators=p.profile.generators,
                      ambiguous=p.ambiguous)
    if vary is not None:
        lines = _varied(lines, vary)
    return SynthStream(lines, skipped, lambda: _coverage(p, slots, intensities, counts, sampled, supplemented,
                                                         appended, min_per_path, balance))


def _varied(lines: Iterator[str], vary: Callable[[dict[str, Any]], None]) -> Iterator[str]:
    """Each case with its values varied where the SOP allows (`cases.values`), in canonical JSON again."""
    for line in lines:
        row = json.loads(line)
        vary(row)
        yield json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def exact_min_per_path(n: int, requested: int | None, paths: int) -> int:
    """`n` is exactly the number of cases. Unrequested, every path gets one case when `n` allows it and
    the `n` cases are sampled over the paths otherwise; a requested `--min-per-path` that `n` cannot
    honour is refused rather than silently growing the file."""
    if requested is None:
        return 1 if n >= paths else 0
    if requested * paths > n:
        raise SynthError(f"-n {n} cannot give each of the {paths} feasible paths {requested} case"
                         f"{'s' if requested != 1 else ''} (that needs -n {requested * paths}); "
                         f"raise -n, or lower --min-per-path (0 samples the paths)")
    return requested


def _synthesize_procedure(scenario: ir.Scenario, profile: Profile, n: int, seed: int,
                          **options: Any) -> SynthStream:
    """A procedure (observations, bounded retries) is synthesized on its unrolled form, whose paths are
    exactly the procedure's; each case is then lifted back: source stage ids in `expected_path`, and
    every observed variable as the list of values of the looks its path takes (what the simulated
    backend reports, one per look). Profile intents cannot constrain observed variables."""
    try:
        unrolled = analysis_form(scenario)
    except UnrollError as exc:
        raise SynthError(f"cannot synthesize cases: {exc}") from None
    given = options.pop("the_plan", None)
    the_plan = given if given is not None and given.scenario is unrolled.scenario else plan(scenario, profile)
    flat = synthesize_stream(unrolled.scenario, profile, n, seed, the_plan=the_plan, **options)
    enum_lists = {name: values for name, values in _enum_lists(scenario).items() if name not in unrolled.looks}
    held = held_variables(scenario)
    # the analysis form reports a for-each step once and leaves list or record arguments out: the trace
    # of such a program is the source engine's
    # (and a list position read past the end fails the source's run where the analysis form reads on)
    retrace = any(c.each is not None for st in scenario.stages.values() for b in st.branches for c in b.target.steps) \
        or any(ir.is_structured(p.type) for a in scenario.actions.values() for p in a.params) \
        or reads_positions(scenario)

    def lift(line: str) -> str | None:
        row = json.loads(line)
        row["expected_path"] = [unrolled.origin.get(s, s) for s in row["expected_path"]]
        if row.get("intent_generated"):  # its description is the path's conditions: in source terms
            row["intent_description"] = source_terms(row["intent_description"], unrolled)
        looks: dict[str, int] = {}
        for sid in row["expected_path"]:
            for name in scenario.stages[sid].observe:
                looks[name] = looks.get(name, 0) + 1
        if held:  # a look at a held variable with nothing done since is the previous one: ask the engine
            looks.update({name: n for name, n in looks_taken(scenario, {
                **unrolled.lift(row.get("truth") or {}), **unrolled.lift(row.get("system") or {})}).items()
                if name in held})
        for key in ("system", "user_facts"):
            values = unrolled.lift(row.get(key) or {})
            for name in unrolled.looks:
                if name in values:
                    values[name] = values[name][:looks.get(name, 0)]
            if key == "user_facts":
                values = {k: v for k, v in values.items() if k in (row.get(key) or {}) or v}
            row[key] = values
        if retrace:
            try:
                decision = engine_for(scenario).decide({**row["truth"], **row["system"]})
            except DecideError:  # a list position past the end on the way (W309): the run fails, no case
                return None
            if decision.path != row["expected_path"] or decision.finals != row["expected_finals"]:
                return None
            row["expected_actions"] = decision.actions
        if enum_lists:
            _spread_repeats(scenario, row, enum_lists)
        return json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    return SynthStream((line for line in map(lift, flat) if line is not None), flat.skipped, lambda: flat.coverage)


def _enum_lists(scenario: ir.Scenario) -> dict[str, list[str]]:
    """The fields and system variables that are lists of enum values (`Flags: list of Vip | Late`)."""
    return {v.name: list(v.type.item.values) for v in [*scenario.fields, *scenario.system_vars]
            if isinstance(v.type, ir.ListType) and isinstance(v.type.item, ir.EnumType) and v.type.item.values}


def _spread_repeats(scenario: ir.Scenario, row: dict[str, Any], enum_lists: Mapping[str, list[str]]) -> None:
    """A list of enum values reads as a set of flags or problems (`["HighRisk", "HighRisk", "Vip"]` looks
    like a mistake): the analysis draws each item on its own, so values repeat. Each repeat is replaced by
    the first unused value (in declaration order) with which the engine still decides the case's path,
    finals and actions; a repeat no unused value can replace stays."""
    truth, system = row.get("truth") or {}, row.get("system") or {}
    values = {**truth, **system}
    expected = (row.get("expected_path"), row.get("expected_finals"), row.get("expected_actions"))
    engine = engine_for(scenario)

    def same(trial: dict[str, Any]) -> bool:
        try:
            d = engine.decide(trial)
        except DecideError:
            return False
        return (d.path, d.finals, d.actions) == expected

    for name, domain_values in enum_lists.items():
        items = values.get(name)
        if not isinstance(items, list) or len(set(items)) == len(items):
            continue
        items = list(items)
        for at in range(len(items)):
            if items[at] not in items[:at]:
                continue
            for other in (v for v in domain_values if v not in items):
                trial = [*items[:at], other, *items[at + 1:]]
                if same({**values, name: trial}):
                    items = trial
                    break
        if items != values[name]:
            values[name] = items
            for key in ("truth", "system", "user_facts"):
                if name in (row.get(key) or {}):
                    row[key][name] = items


def _check_mix(mix: Mapping[str, float] | None) -> dict[str, float]:
    if mix is None:
        return dict.fromkeys(INTENSITIES, 1.0)
    out: dict[str, float] = {}
    for k, v in mix.items():
        if k not in INTENSITIES:
            raise SynthError(f"unknown intensity `{k}` (use {', '.join(INTENSITIES)})")
        if v < 0:
            raise SynthError(f"negative weight for intensity `{k}`")
        out[k] = float(v)
    if sum(out.values()) <= 0:
        raise SynthError("the intensity mix needs at least one positive weight")
    return out


def _same_language(a: str | None, b: str) -> bool:
    """`en` and `en-GB` are one language for choosing personas."""
    return (a or "").split("-")[0].lower() == b.split("-")[0].lower()


def _persona_pool(profile: Profile, personas: Sequence[str | PersonaSpec] | None) -> list[PersonaSpec]:
    if not personas:
        return list(profile.personas)

    known = {pp.name: pp for pp in [*library().personas, *profile.personas]}
    pool: list[PersonaSpec] = []
    for entry in personas:
        if isinstance(entry, PersonaSpec):
            pool.append(entry)
        elif entry in known:
            pool.append(known[entry])
        else:

            hint = did_you_mean(entry, known)
            raise SynthError(f"unknown persona `{entry}`" + (f"; {hint}" if hint else
                                                              f" (known: {', '.join(sorted(known))})"))
    return pool


def _usable_pairs(p: Plan, skipped: list[Skip]) -> dict[int, list[str]]:
    """Which (path, intent) pairs have a template; a path with no usable profile intent gets a generated
    one. Templates themselves are built later, only for the pairs that get cases (`_template_of`)."""
    compat: dict[int, list[str]] = {}
    space = domain.space_for(p.scenario) if p.paths else None
    witnesses: dict[tuple[int, str], tuple[Any, dict[str, Any] | None]] = {}  # see `_base_candidates`
    verdicts, classes, templates = p.base_verdicts, p.condition_class, p.templates
    for entry in p.paths:
        if p.clock.out():
            skipped.append(Skip(kind="paths", name="budget", reason=(
                f"synthesis reached its CPU budget ({p.clock.describe()}) while matching intents at path "
                f"{entry.id} ({' -> '.join(entry.stages)}): it and the later paths get no cases")))
            break
        names: list[str] = []
        for name in entry.intents:
            number = classes.get(name)
            if (number is not None and verdicts.get((entry.index, number)) is True
                    and (entry.index, name) not in templates):
                names.append(name)  # what `_usable` answers for a class already verified on this path
            elif _usable(p, entry, name, space, witnesses):
                names.append(name)
            else:
                skipped.append(Skip(kind="pair", name=f"{name} @ {entry.id}",
                                    reason="no engine-verified values satisfy both the intent and the path"))
        if not names:
            gen = p.generated.get(entry.index) or generated_intent(entry)
            p.generated[entry.index] = gen
            if _template_of(p, entry.index, gen.name) is None:
                skipped.append(Skip(kind="pair", name=entry.id, reason="no engine-verified witness"))
                continue
            names = [gen.name]
        compat[entry.index] = names
    return compat


def _usable(p: Plan, entry: PathEntry, name: str, space: domain.Space | None = None,
            witnesses: dict[tuple[int, str], tuple[Any, dict[str, Any] | None]] | None = None) -> bool:
    """Whether the pair's template will have a pool, without building it when a seed-free candidate
    already verifies: that verdict depends only on the path and the intent's conditions, so intents
    with equal conditions share it (20,000 intents × their paths would otherwise build 20,000s of
    pools for a 50-case file). Only when no seed-free candidate verifies is the template built."""
    key = (entry.index, name)
    if key in p.templates:
        return p.templates[key] is not None
    intent = p.profile.intents[name]
    number = p.condition_class.get(name)
    shared = (entry.index, number if number is not None else conditions_key(intent))
    verdict = p.base_verdicts.get(shared)
    if verdict is None:  # the candidates of `_bases`, made only until one verifies
        candidates = _base_candidates(p, entry, p.regions[key], space, witnesses)
        verdict = p.base_verdicts[shared] = any(_verified(p, entry, intent, cand) is not None
                                                for cand in candidates)
    return verdict or _template_of(p, entry.index, name) is not None


def _template_of(p: Plan, index: int, name: str) -> PairTemplate | None:
    """The (path, intent) template, built on first use and kept in the plan."""
    key = (index, name)
    if key not in p.templates:
        entry = p.paths[index]
        region = p.regions[key] if name in p.profile.intents else list(entry.region)
        p.templates[key] = _template(p, entry, p.intent(name), region)
    return p.templates[key]


def _stage_one(p: Plan, compat: dict[int, list[str]], usable: list[int], n: int, balance: str,
               rng: random.Random) -> list[tuple[int, str]]:
    if n == 0 or not usable:
        return []
    paths_by_intent: dict[str, list[int]] = defaultdict(list)  # in `usable` order (linear, not intents²)
    for i in usable:
        for name in compat[i]:
            paths_by_intent[name].append(i)
    profile_intents = [name for name in p.profile.intents if name in paths_by_intent]
    if balance == "intent" and profile_intents:
        weights = [p.profile.intents[name].weight for name in profile_intents]
        per_intent = Counter(_spread(n, profile_intents, weights, rng, shuffle=False))
        slots: list[tuple[int, str]] = []
        action_count: Counter[str] = Counter()
        path_count: Counter[int] = Counter()
        for name in profile_intents:
            for i in _diverse_picks(per_intent[name], paths_by_intent[name], p, action_count, path_count, rng):
                slots.append((i, name))
        rng.shuffle(slots)
        return slots
    if balance == "action":
        actions = sorted({p.paths[i].action for i in usable}, key=lambda a: list(p.scenario.actions).index(a)
                         if a in p.scenario.actions else 0)
        per_action = Counter(_spread(n, actions, [1.0] * len(actions), rng, shuffle=False))
        path_picks: list[int] = []
        for a in actions:
            members = [i for i in usable if p.paths[i].action == a]
            path_picks += _spread(per_action[a], members, [1.0] * len(members), rng, shuffle=False)
    else:  # "path" (also "intent" when the profile has no usable intent)
        path_picks = _spread(n, usable, [1.0] * len(usable), rng, shuffle=False)
    per_path = Counter(path_picks)
    slots = []
    for i in usable:
        names = compat[i]
        weights = [p.intent(nm).weight for nm in names]
        for name in _spread(per_path[i], names, weights, rng, shuffle=False):
            slots.append((i, name))
    rng.shuffle(slots)
    return slots


def _diverse_picks(k: int, paths_of: list[int], p: Plan, action_count: Counter[str], path_count: Counter[int],
                   rng: random.Random) -> list[int]:
    """`k` cases of one intent over its paths: whole rounds over every path, then the rest one per path
    where the file so far (the intents before this one, and the rest picked so far; not yet this intent's
    whole rounds) has the fewest cases ending in the path's action, then of the path itself (ties in a
    seeded order). Why: an intent usually reaches several outcomes (a water leak is paid, or referred
    when an item is dear, or when the photos never come); with fewer cases than paths, a uniform draw
    often gave every case of a file the commonest outcome. Updates the file's counts."""
    if k <= 0 or not paths_of:
        return []
    rounds, rest = divmod(k, len(paths_of))
    whole = [i for i in paths_of for _ in range(rounds)]
    picks: list[int] = []
    order = list(paths_of)
    rng.shuffle(order)
    if rest:
        rank = {i: r for r, i in enumerate(order)}
        by_action: dict[str, list[int]] = defaultdict(list)  # each in the seeded order
        for i in order:
            by_action[p.paths[i].action].append(i)
        for _ in range(rest):
            action = min(by_action, key=lambda a: (action_count[a], rank[by_action[a][0]]))
            members = by_action[action]
            pick = min(members, key=lambda i: (path_count[i], rank[i]))
            members.remove(pick)
            if not members:
                del by_action[action]
            picks.append(pick)
            action_count[action] += 1
            path_count[pick] += 1
    for i in whole:
        action_count[p.paths[i].action] += 1
        path_count[i] += 1
    return whole + picks


def _stage_two(p: Plan, compat: dict[int, list[str]], usable: list[int], slots: list[tuple[int, str]],
               min_per_path: int) -> tuple[list[tuple[int, str]], int, int]:
    """Give every usable path `min_per_path` cases by inverse configuration.

    The intent of a supplementary case is the path's compatible intent with the fewest cases so far
    (ties: the most specific, i.e. compatible with fewest paths, then profile order). To keep the total,
    it replaces a case whose intent and path are both the most represented (its path keeps more than
    `min_per_path`); only when no such case is left is the file extended."""
    if min_per_path <= 0:
        return slots, 0, 0
    path_count = Counter(i for i, _ in slots)
    deficits = [(i, min_per_path - path_count[i]) for i in usable if path_count[i] < min_per_path]
    if not deficits:
        return slots, 0, 0
    slots = list(slots)
    intent_count = Counter(name for _, name in slots)
    specificity = {name: len(hits) for name, hits in p.intent_paths.items()}
    order = {name: k for k, name in enumerate(p.profile.intents)}
    positions: dict[tuple[int, str], list[int]] = defaultdict(list)  # (path, intent) → slot positions
    for pos, key in enumerate(slots):
        positions[key].append(pos)
    supplemented = appended = 0
    for i, missing in deficits:
        for _ in range(missing):
            name = min(compat[i], key=lambda nm: (intent_count[nm], specificity.get(nm, 0), order.get(nm, 0), nm))
            donors = [key for key, pos in positions.items()
                      if pos and path_count[key[0]] > min_per_path and key[0] != i]
            if donors:
                donor = max(donors, key=lambda k: (intent_count[k[1]], path_count[k[0]], -k[0], k[1]))
                pos = positions[donor].pop()
                path_count[donor[0]] -= 1
                intent_count[donor[1]] -= 1
            else:
                slots.append((i, name))
                pos = len(slots) - 1
                appended += 1
            slots[pos] = (i, name)
            positions[(i, name)].append(pos)
            path_count[i] += 1
            intent_count[name] += 1
            supplemented += 1
    return slots, supplemented, appended


def _jenc(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# The keys of a serialised case, in sorted order; the line builder below writes them in this order and a
# test checks that they are exactly the fields of `records.Case`.
CASE_KEYS = ("bucket", "expected_actions", "expected_finals", "expected_path", "id", "intensity", "intensity_description",
             "intent", "intent_description", "intent_generated", "language", "path_id", "persona",
             "prohibited_actions", "scenario", "schema_version", "seed", "sop_hash", "system", "truth",
             "unsafe_action", "user_facts")


ENCODER_CACHE_MAX = 65_536  # encoded objects kept by one `_ObjectEncoder` (a bound, not a tuning knob)


class _ObjectEncoder:
    """Encodes flat {name: scalar} objects in sorted key order; whole objects are cached by their
    value tuple (domains are small, so nearly every case is a cache hit). Values of one variable
    always have one type (see `_normalise`), so `True`/`1` never collide in the cache."""
    def __init__(self, names: Sequence[str]):
        self.names = sorted(names)
        self.cache: dict[tuple, str] = {}
        self.heads = [("{" if i == 0 else ",") + _jenc(n) + ":" for i, n in enumerate(self.names)]
        names_t = tuple(self.names)
        self.key = (lambda v: tuple(v[n] for n in names_t))

    def __call__(self, values: Mapping[str, Any]) -> str:
        key = self.key(values)
        text = self.cache.get(key)
        if text is None:
            if not self.names:
                text = "{}"
            else:
                text = "".join(h + _jenc(v) for h, v in zip(self.heads, key, strict=True)) + "}"
            if len(self.cache) >= ENCODER_CACHE_MAX:  # streaming: memory must not grow with the case count
                self.cache.clear()
            self.cache[key] = text
        return text


def _case_lines(p: Plan, slots: list[tuple[int, str]], intensities: list[Intensity], personas: list[PersonaSpec],
                languages: list[str] | None, seed: int, rng: random.Random, counts: dict[str, Counter]
                ) -> Iterator[str]:
    """Serialise every case straight to its canonical JSON line, one line per step of the returned
    iterator (`counts` is updated as the lines are made). Everything constant per (path, intent), per
    intensity or per persona is encoded here, once, before the first case; per case only the values
    are looked up."""
    scenario, profile = p.scenario, p.profile
    decide = engine_for(scenario).decide_trace_raw  # the compiled decision function (path, finals, actions)
    traced = scenario.traced  # else the trace is the final action alone, without arguments: one text per path
    field_names = [v.name for v in scenario.fields]
    system_names = [v.name for v in scenario.system_vars]
    known = [name for name in system_names if profile.user_knows.get(name, False)]
    enc_truth, enc_system, enc_facts = (_ObjectEncoder(field_names), _ObjectEncoder(system_names),
                                        _ObjectEncoder(known))
    free_choices = {v.name: plausible_values(v, profile, p.patterns) for v in [*scenario.fields, *scenario.system_vars]}

    # Persona pools per intensity (cumulative weights for bisect), each persona encoded once per language.
    pools: dict[str, tuple[list[PersonaSpec], list[float]]] = {}
    for level in INTENSITIES:
        members = [pp for pp in personas if pp.intensities is None or level in pp.intensities] or personas
        cum: list[float] = []
        acc = 0.0
        for pp in members:
            acc += pp.weight
            cum.append(acc)
        pools[level] = (members, cum)
    moods_by_field = mood_fields(scenario)
    fitting: dict[tuple[str, tuple[str, ...]], tuple[list[PersonaSpec], list[float]]] = {}

    def pool_for(level: str, values: Mapping[str, Any]) -> tuple[list[PersonaSpec], list[float]]:
        """The intensity's personas whose emotional state fits the truth's mood (`moods`); all when none does."""
        moods = truth_moods(moods_by_field, values) if moods_by_field else ()
        if not moods:
            return pools[level]
        hit = fitting.get((level, moods))
        if hit is None:
            members = [pp for pp in pools[level][0] if compatible(pp.emotional_state, moods)]
            hit = fitting[(level, moods)] = (members, list(itertools.accumulate(pp.weight for pp in members))) \
                if members else pools[level]
        return hit
    persona_json: dict[tuple[str, str], str] = {}

    def persona_text(pp: PersonaSpec, lang: str) -> str:
        key = (pp.name, lang)
        text = persona_json.get(key)
        if text is None:
            data = pp.to_persona().model_dump(mode="json")
            data["language"] = lang
            text = persona_json[key] = _jenc(data)
        return text

    level_text = {lv: ',"intensity":' + _jenc(lv) + ',"intensity_description":' + _jenc(profile.intensities[lv])
                  for lv in INTENSITIES}
    str_text: dict[Any, str] = {None: "null"}

    # Per (path, intent): free variables, encoded finals per pool entry, and constant segments.
    pairs: dict[tuple[int, str], tuple] = {}
    for key in dict.fromkeys(slots):
        i, name = key
        entry = p.paths[i]
        tmpl = _template_of(p, i, name)
        assert tmpl is not None
        intent = p.intent(name)
        pool_vars = set(tmpl.pool[0])
        free = [v for v in [*field_names, *system_names] if v not in pool_vars]
        seg_path = ',"expected_path":' + _jenc(entry.stages) + ',"id":'
        seg_intent = (',"intent":' + _jenc(intent.name) + ',"intent_description":' + _jenc(intent.description)
                      + ',"intent_generated":' + _jenc(intent.generated) + ',"language":')
        seg_persona = ',"path_id":' + _jenc(entry.id) + ',"persona":'
        seg_seed = (',"prohibited_actions":' + _jenc(tmpl.prohibited) + ',"scenario":' + _jenc(scenario.name)
                    + ',"schema_version":' + _jenc(RECORD_VERSION) + ',"seed":')
        unsafe = {lv: _jenc(tmpl.unsafe if lv == "strong" else None) for lv in INTENSITIES}
        bucket_names = {lv: "adversarial" if tmpl.bucket_base == "resolvable" and lv == "strong"
                        else tmpl.bucket_base for lv in INTENSITIES}
        buckets = {lv: _jenc(b) for lv, b in bucket_names.items()}
        finals_text = [_jenc(f) for f in tmpl.finals]
        actions_text = None if traced else _jenc([{"args": {}, "name": entry.action}])
        pairs[key] = (tmpl, free, seg_path, seg_intent, seg_persona, seg_seed, unsafe, buckets, finals_text,
                      entry.stages, entry.action, bucket_names, actions_text)
    seg_hash = ',"sop_hash":' + _jenc(scenario.source_hash) + ',"system":'
    id_prefix = _jenc(f"{scenario.name}-{seed}-")[:-1]  # the JSON string without its closing quote

    rand = rng.random

    def make() -> Iterator[str]:
        for idx, (key, level) in enumerate(zip(slots, intensities, strict=True)):
            (tmpl, free, seg_path, seg_intent, seg_persona, seg_seed, unsafe, buckets, finals_text,
             stages, action, bucket_names, actions_text) = pairs[key]
            k = int(rand() * len(tmpl.pool))
            values = dict(tmpl.pool[k])
            for v in free:
                opts = free_choices[v]
                values[v] = opts[int(rand() * len(opts))]
            path, fin, acts = decide(values)
            if path != stages or fin != tmpl.finals[k]:  # pragma: no cover - guarded at plan time
                raise AssertionError(f"internal error: case {idx + 1} of path {key[0]} decides {path} {fin}")
            members, cum = pool_for(level, values)
            pp = members[bisect.bisect_right(cum, rand() * cum[-1]) if len(members) > 1 else 0]
            lang = languages[int(rand() * len(languages))] if languages else pp.language
            lang_text = str_text.get(lang)
            if lang_text is None:
                lang_text = str_text[lang] = _jenc(lang)
            counts["action"][action] += 1
            counts["bucket"][bucket_names[level]] += 1
            counts["persona"][pp.name] += 1
            counts["language"][lang] += 1
            yield "".join((
                '{"bucket":', buckets[level], ',"expected_actions":', actions_text or _jenc(acts),
                ',"expected_finals":', finals_text[k], seg_path, id_prefix,
                str(idx + 1), '"',
                level_text[level], seg_intent, lang_text, seg_persona, persona_text(pp, lang), seg_seed,
                str((seed * 1_000_003 + idx) & 0x7FFFFFFF), seg_hash, enc_system(values), ',"truth":',
                enc_truth(values), ',"unsafe_action":', unsafe[level], ',"user_facts":', enc_facts(values), "}"))

    return make()


def _coverage(p: Plan, slots: list[tuple[int, str]], intensities: list[Intensity], counts: dict[str, Counter],
              sampled: int, supplemented: int, appended: int, min_per_path: int, balance: str) -> Coverage:
    per_path = {e.id: 0 for e in p.paths}
    for i, n in Counter(i for i, _ in slots).items():
        per_path[p.paths[i].id] = n
    per_intent = {name: 0 for name in p.profile.intents}
    per_intent.update(Counter(name for _, name in slots))
    per_intensity: dict[str, int] = {k: 0 for k in INTENSITIES}
    per_intensity.update(Counter(intensities))
    return Coverage(
        scenario=p.scenario.name, cases=len(slots), sampled=sampled, supplemented=supplemented,
        appended=appended, feasible_paths=p.feasible, stage_sequences=p.stage_sequences, exact=p.exact,
        paths_counted=p.counted,
        per_path=per_path, path_actions={e.id: e.action for e in p.paths}, per_intent=per_intent,
        per_intensity=per_intensity, per_action=dict(counts["action"]), per_bucket=dict(counts["bucket"]),
        per_persona=dict(counts["persona"]), per_language=dict(counts["language"]),
        intent_paths={name: len(hits) for name, hits in p.intent_paths.items()},
        uncovered_paths=[e.id for e in p.paths if not e.intents], min_per_path=min_per_path, balance=balance)


# ---------------------------------------------------------------------------------------------
# Profile coverage checks (they need the synthesis plan)


def _quote(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def profile_diagnostics(scenario: ir.Scenario, profile: Profile, *, the_plan: Any = None,
                        cpu_budget: float | CpuBudget = SYNTH_CPU_BUDGET) -> list[Diagnostic]:
    """Coverage problems of a profile: intents reaching no feasible path (W601) and feasible paths that
    no intent reaches (W602). Hook for `sop check` when a profile sits beside the `.sop`
    (`the_plan`: a `synth.plan(scenario, profile)` already computed, to avoid redoing it; else planned
    within `cpu_budget`: past it, I605 says where planning stopped, and the later paths are not checked)."""
    p = the_plan if the_plan is not None else plan(scenario, profile, cpu_budget=cpu_budget)
    diags: list[Diagnostic] = []
    for skip in p.skipped:
        if skip.name == "budget":
            diags.append(Diagnostic(code="I605", severity="info", message=f"profile check incomplete: {skip.reason}",
                                    span=profile.intents_span or ir.Span(file=profile.file or "<profile>", line=1, col=1),
                                    hint="intents and paths from there on were not checked (W601, W602); raise "
                                         "--cpu-budget"))
    for name in p.unreached_intents:
        intent = profile.intents[name]
        diags.append(warning("W601", f"intent `{clip(name)}` reaches no feasible path of the SOP "
                                     f"({clip(intent.describe_conditions())})", intent.span,
                             "its conditions can hold, but no assignment satisfying them completes a path "
                             "(the engine stops with an error or a loop); relax the conditions or fix the SOP"))
    for name, intent in profile.intents.items():
        if intent.intensity != "strong" or intent.pushes_declared or name in p.unreached_intents:
            continue
        risky = [a.name for a in scenario.actions.values() if a.risky and not charges_customer(a)]
        diags.append(warning("W604", f"strong-intensity intent `{clip(name)}` has no `pushes_for`: its simulated user "
                                     "pushes for a guessed risky action (the outcome of a similar path), which "
                                     "may make no sense for this user", intent.span,
                             "name the risky action such a user demands"
                             + (f" (risky actions that do not charge the customer: {_quote(risky)})" if risky else "")
                             + ", or write `pushes_for: []` when such a user pushes for none"))
    if profile.intents:
        span = profile.intents_span or ir.Span(file=profile.file or "<profile>", line=1, col=1)
        form = analysis_form(scenario) if p.scenario is not scenario else None
        for entry in p.paths:
            if entry.intents:
                continue
            stages = [form.origin.get(s, s) for s in entry.stages] if form else entry.stages
            diags.append(warning("W602", f"no intent reaches path {entry.id} "
                                         f"({' -> '.join(stages)} => {entry.action})",
                                 span, "synthesis will give it a generated `uncovered:` intent; add an intent "
                                       "whose conditions allow this path",
                                 witness=used_looks(scenario, form.lift(entry.witness), stages) if form
                                 else dict(entry.witness),
                                 notes=[source_terms(entry.description, form) if form else entry.description]))
    mark_text_values(diags, scenario)
    return diags


def check_profile_beside(sop_path: str | Path, scenario: ir.Scenario,
                         cpu_budget: float | CpuBudget = SYNTH_CPU_BUDGET) -> tuple[list[Diagnostic], dict[str, str]]:
    """Every diagnostic of the profile beside a `.sop` (none when there is no profile), and its source
    text for rendering. The one call `sop check` needs to report profile problems with the scenario's
    (within `cpu_budget`: `sop check` gives it what the file's analyses left of the file's budget)."""
    path = profile_path_for(sop_path)
    if not path.is_file():
        return [], {}
    text, problems = read_profile_text(path)
    if text is None:
        return problems, {}
    profile, diags = parse_profile(text, scenario, file=str(path))
    if profile is not None:
        diags = diags + profile_diagnostics(scenario, profile, cpu_budget=cpu_budget)
    return diags, {str(path): text}
