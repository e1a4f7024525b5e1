"""Values that look like production data.

A synthesized case starts from the witness its path was proven with: the analysis picks representative
values (`AC-000000`, a fee of 0.0, the same fee id in every record, the same amounts in every case of a
path). Real conversations do not look like that, and a model trained or evaluated on such cases learns the
placeholders. So each case is then varied, one value at a time, wherever the SOP allows it:

- a string the SOP tests with `matches` gets a fresh random string of that pattern;
- any other string with digits in it (ids, references, phone numbers) gets fresh digits, in lists too, so
  that no two records of a list share an id unless the case's decision needs it;
- a money amount (a `money` variable, or a record field named like an amount) that is 0 gets a non-zero
  amount, and every money amount is moved a little, so amounts differ from case to case;
- a made-up name, e-mail address or street address becomes another of its kind;
- the case's calendar moves (every date by the same offset), then each date; a date the analysis put after
  `now` comes back before it where the path allows;
- a variable with a generator (declared in the profile, or fitted from real rows by `sop synth --like`) is
  drawn from it.

A change is kept only when the engine still takes the case's path to the case's final action and the
case's intent still holds; the case's expected finals and action arguments are then decided again on the
varied values (where several paths share stages and action, the branches must stay too). Variables whose
values the profile lists (`values:`) keep the listed values unless a generator draws them. Each case is
varied with its own seed: same inputs and seed, same bytes.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sopgraph.cases.moods import mood_fields
from sopgraph.cases.patterns import random_match
from sopgraph.cases.profiles import Generator, Intent
from sopgraph.language import ir, scalars
from sopgraph.language.parse import scenario_expressions
from sopgraph.logic.engine import DecideError, Interpreter, engine_for
from sopgraph.logic.paths import trace

AMOUNT_NAME = re.compile(r"(?i)(amount|price|fee|cost|total|balance|fare|charge|refund|credit|paid|payment|sum)")
TRIES = 3  # proposals per value before it keeps its witness value
_DIGIT = re.compile(r"\d")


def matched_patterns(scenario: ir.Scenario) -> dict[str, list[str]]:
    """Each variable the SOP tests with `matches`, with the patterns it is tested with."""
    found: dict[str, list[str]] = {}
    stack = scenario_expressions(scenario)
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Matches) and isinstance(e.operand, ir.Var) and e.pattern not in found.get(
                e.operand.name, []):
            found.setdefault(e.operand.name, []).append(e.pattern)
        stack.extend(ir.children(e))
    return {name: sorted(patterns) for name, patterns in found.items()}


class Varier:
    """Varies the values of one scenario's cases (see the module docstring)."""

    def __init__(self, scenario: ir.Scenario, intents: Mapping[str, Intent], fixed: Iterable[str] = (),
                 generators: Mapping[str, Generator] | None = None,
                 ambiguous: Iterable[tuple[tuple[str, ...], str]] = ()):
        self.scenario = scenario
        self.ambiguous = set(ambiguous)  # (stages, action) several paths share: their branches tell them apart
        self.engine = engine_for(scenario)
        self.intents = intents
        self.patterns = matched_patterns(scenario)
        keep = set(fixed)  # the profile lists their values: cases use those, as listed
        own = [v for v in scenario.variables.values() if v.role != "derived" and not v.observed]
        # a field that tells the customer's mood stays as drawn: the case's persona was chosen to fit it
        moody = set(mood_fields(scenario))
        self.generators = {v.name: generators[v.name] for v in own
                           if generators and v.name in generators and v.name not in moody}
        inputs = [v for v in own if v.name not in keep or v.name in self.generators]
        self.types = {v.name: v.type for v in inputs}
        self.money_vars = {v.name for v in own if v.money or AMOUNT_NAME.search(v.name) is not None}
        self.money = {v.name for v in inputs if v.money or (isinstance(v.type, ir.NumType) and
                                                            AMOUNT_NAME.search(v.name) is not None)}
        # the case's calendar moves only when no date is drawn from a generator (its range anchors the calendar)
        self.dated = [] if any(_has_moment(v.type) for v in own if v.name in self.generators) else sorted(
            v.name for v in inputs if _has_moment(v.type))

    @property
    def useful(self) -> bool:
        """Whether any value of this scenario can vary (else cases are left as they are, at no cost)."""
        return any(self._varies(t) for t in self.types.values()) or bool(self.money) or bool(self.generators)

    def _varies(self, vtype: Any) -> bool:
        if isinstance(vtype, ir.StringType) or _has_moment(vtype):
            return True
        if isinstance(vtype, ir.ListType):
            return self._varies(vtype.item)
        if isinstance(vtype, ir.RecordType):
            return any(self._varies(f.type) or (isinstance(f.type, ir.NumType) and AMOUNT_NAME.search(f.name))
                       for f in vtype.fields)
        return False

    def vary(self, row: dict[str, Any]) -> None:
        """Vary the case in place; its path, final action and intent stay, its finals are decided again."""
        truth, system = dict(row.get("truth") or {}), dict(row.get("system") or {})
        values = {**truth, **system}
        path, action = row.get("expected_path"), (row.get("expected_finals") or {}).get("Action")
        intent = self.intents.get(str(row.get("intent")))

        shared = path is not None and (tuple(path), action) in self.ambiguous
        branches = _branches(self.scenario, values) if shared else None

        def keeps(trial: dict[str, Any]) -> tuple | None:
            try:
                got = self.engine.decide_trace_raw(trial)
            except DecideError:
                return None
            if got[0] != path or got[1].get("Action") != action:
                return None
            if shared and _branches(self.scenario, trial) != branches:
                return None  # the same stages and action by another branch: another path
            if intent is not None and not _holds(self.scenario, intent, trial):
                return None
            return got

        if keeps(values) is None:
            return  # the case is not one this form of the SOP decides as written: leave it be
        rng = random.Random(row.get("seed", 0))
        if self.dated:  # the whole calendar first: every date moves together, so their distances stay
            offset = rng.choice((-1, 1)) * rng.randint(1, 120) * scalars.DAY
            shifted = {**values, **{n: _shift_time(self.types[n], values[n], offset)
                                    for n in self.dated if values.get(n) is not None}}
            if keeps(shifted) is not None:
                values = shifted
        for name in sorted(self.types):
            if name not in values or values[name] is None:
                continue
            for attempt in range(TRIES):
                proposal = _into_the_past(self.types[name], values, name, rng, attempt)
                if proposal is None:
                    proposal = self._propose(name, self.types[name], values[name], rng, attempt)
                if proposal == values[name]:
                    break
                if not _same_side_of_now(self.types[name], values, values[name], proposal):
                    continue
                if keeps({**values, name: proposal}) is not None:
                    values[name] = proposal
                    break
        final = keeps(values)
        assert final is not None
        _path, finals, actions = final
        for key, target in (("truth", truth), ("system", system)):
            row[key] = {k: values[k] for k in target}
        facts = row.get("user_facts")
        if isinstance(facts, dict):
            row["user_facts"] = {k: values.get(k, v) if k in system or k in truth else v for k, v in facts.items()}
        row["expected_finals"] = finals
        if "expected_actions" in row:
            row["expected_actions"] = actions

    def _propose(self, name: str, vtype: Any, value: Any, rng: random.Random, attempt: int) -> Any:
        """A new value for `name` (attempt 0 the boldest; later attempts stay closer to the witness); a
        variable with a generator draws from it on every attempt."""
        gen = self.generators.get(name)
        if gen is not None and attempt < TRIES - 1:  # the last attempt: the built-in proposal, closer in
            drawn = draw(gen, vtype, rng, money=name in self.money_vars)
            if drawn is not None:
                return drawn
        if isinstance(vtype, ir.StringType) and isinstance(value, str):
            if name in self.patterns and attempt == 0:  # a case may need a value that does not match
                fresh = random_match(rng.choice(self.patterns[name]), rng)
                return value if fresh is None else fresh
            return _fresh_digits(_fresh_text(value, rng), rng)
        if isinstance(vtype, ir.NumType) and name in self.money:
            return _amount(vtype, value, rng, attempt)
        if isinstance(vtype, ir.TimeType) and vtype.kind != "duration" and name != "now":
            # a day or a few weeks either way; `keeps` refuses a date the path's window or the intent refuses
            days = rng.randint(1, (30, 7, 2)[min(attempt, 2)])
            return _shift_time(vtype, value, rng.choice((-1, 1)) * days * scalars.DAY)
        if isinstance(vtype, ir.ListType) and isinstance(value, list):
            return _distinct([self._propose(name, vtype.item, item, rng, attempt) for item in value], value)
        if isinstance(vtype, ir.RecordType) and isinstance(value, dict):
            out = dict(value)
            for f in vtype.fields:
                if f.name not in out or out[f.name] is None:
                    continue
                if isinstance(f.type, ir.StringType) and isinstance(out[f.name], str):
                    out[f.name] = _fresh_digits(_fresh_text(out[f.name], rng), rng)
                elif isinstance(f.type, ir.NumType) and AMOUNT_NAME.search(f.name):
                    out[f.name] = _amount(f.type, out[f.name], rng, attempt)
            return out
        return value


def _branches(scenario: ir.Scenario, values: Mapping[str, Any]) -> list[int] | None:
    try:
        return list(trace(scenario, values)[1])
    except DecideError:
        return None


def _holds(scenario: ir.Scenario, intent: Intent, values: Mapping[str, Any]) -> bool:
    it = Interpreter(scenario, values)
    try:
        return all(bool(it.eval(c.expr)) == c.truth for c in intent.conditions)
    except (DecideError, KeyError, TypeError, ValueError):
        return False


def _has_moment(vtype: Any) -> bool:
    """Whether a type holds a date or a datetime (itself, or inside a list or record)."""
    if isinstance(vtype, ir.TimeType):
        return vtype.kind != "duration"
    if isinstance(vtype, ir.ListType):
        return _has_moment(vtype.item)
    if isinstance(vtype, ir.RecordType):
        return any(_has_moment(f.type) for f in vtype.fields)
    return False


def _same_side_of_now(vtype: Any, values: Mapping[str, Any], before: Any, after: Any) -> bool:
    """Whether a moved date stays on its side of `now`: what a customer reports as past (an incident, a
    payment) does not drift into the future of the conversation even where the path would not notice."""
    now = _now_seconds(values)
    if now is None or not (isinstance(vtype, ir.TimeType) and vtype.kind != "duration"):
        return True
    try:
        was, moved = (scalars.parse_temporal(vtype.kind, v) for v in (before, after))
    except (TypeError, ValueError):
        return True
    return was > now or moved <= now  # a date after `now` may only come back


def _now_seconds(values: Mapping[str, Any]) -> int | float | None:
    now = values.get("now")
    if not isinstance(now, str):
        return None
    try:
        return scalars.parse_temporal("datetime" if "T" in now else "date", now)
    except (TypeError, ValueError):
        return None


def _into_the_past(vtype: Any, values: Mapping[str, Any], name: str, rng: random.Random, attempt: int) -> Any:
    """For a date (other than `now`) that the analysis placed after `now`, an earlier one (a booking made
    next week, an incident tomorrow read as a mistake): a few hours to weeks before `now`, closer with each
    attempt, so a path that needs it recent (`BookedAt > now - 24 hours`) still gets one. None otherwise."""
    now = _now_seconds(values)
    if now is None or name == "now" or not (isinstance(vtype, ir.TimeType) and vtype.kind != "duration"):
        return None
    try:
        at = scalars.parse_temporal(vtype.kind, values[name])
    except (TypeError, ValueError):
        return None
    if at <= now:
        return None
    if vtype.kind == "date":
        back = rng.randint(0, (20, 3, 0)[min(attempt, 2)]) * scalars.DAY
    else:
        back = rng.randint(600, (20 * scalars.DAY, 20 * 3600, 3600)[min(attempt, 2)])
    return scalars.format_temporal(vtype.kind, now - back)


def _shift_time(vtype: Any, value: Any, seconds: int) -> Any:
    """`value` with every date and datetime in it moved by `seconds` (whole days for a date)."""
    if isinstance(vtype, ir.TimeType) and vtype.kind != "duration" and isinstance(value, str):
        try:
            at = scalars.parse_temporal(vtype.kind, value)
        except (TypeError, ValueError):
            return value
        return scalars.format_temporal(vtype.kind, at + seconds)
    if isinstance(vtype, ir.ListType) and isinstance(value, list):
        return [_shift_time(vtype.item, item, seconds) for item in value]
    if isinstance(vtype, ir.RecordType) and isinstance(value, dict):
        out = dict(value)
        for f in vtype.fields:
            if out.get(f.name) is not None:
                out[f.name] = _shift_time(f.type, out[f.name], seconds)
        return out
    return value


_FIRST = ("Alex", "Sam", "Maria", "Wei", "Priya", "Jonas", "Fatima", "Lucas", "Aisha", "Tom", "Elena", "Kenji",
          "Chloe", "Omar", "Ingrid", "Diego", "Hannah", "Yusuf", "Grace", "Mateo", "Sofia", "Daniel", "Mei", "Noah")
_LAST = ("Morgan", "Lee", "Garcia", "Chen", "Patel", "Schmidt", "Okafor", "Silva", "Khan", "Walsh", "Rossi", "Tanaka",
         "Dubois", "Haddad", "Larsen", "Lopez", "Fischer", "Demir", "Brown", "Novak", "Costa", "Murphy", "Wang", "Nowak")
_STREETS = ("Harbour Street", "Mill Lane", "Station Road", "Church Street", "Park Avenue", "Queen's Road",
            "Victoria Street", "Elm Grove", "High Street", "Riverside Walk")
_TOWNS = ("Leeds", "York", "Bristol", "Glasgow", "Cardiff", "Norwich", "Brighton", "Bath", "Derby", "Exeter")
_EMAIL = re.compile(r"^[a-z]+\.[a-z]+@example\.(?:com|org|net)$")
_FULL_NAME = re.compile(r"^[A-Z][a-z]+ [A-Z][a-z]+$")
_ADDRESS = re.compile(r"^\d+ [A-Z][A-Za-z' ]+, [A-Z][a-z]+$")


def _fresh_text(text: str, rng: random.Random) -> str:
    """Another text of the same kind as a made-up one: a person's name, an e-mail address or a street address
    (the two samples every case started from, `Alex Morgan`, `alex.morgan@example.com`); other texts as they are."""
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    if _EMAIL.match(text):
        return f"{first.lower()}.{last.lower()}@example.{rng.choice(('com', 'org', 'net'))}"
    if _FULL_NAME.match(text):
        return f"{first} {last}"
    if _ADDRESS.match(text):
        return f"{rng.randint(1, 240)} {rng.choice(_STREETS)}, {rng.choice(_TOWNS)}"
    return text


def _fresh_digits(text: str, rng: random.Random) -> str:
    """The same text with every digit drawn anew (`REF-20417` → `REF-83920`): ids keep their form."""
    return _DIGIT.sub(lambda _m: str(rng.randint(0, 9)), text)


def _amount(vtype: ir.NumType, value: Any, rng: random.Random, attempt: int = 0) -> Any:
    """A money amount near `value` (for 0, anywhere from a cent up, on a scale that shrinks with each
    attempt so a decision that needs a small amount still gets one), inside the declared bounds."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return value
    lo = 0.0 if vtype.lo is None else float(vtype.lo)
    hi = float(vtype.hi) if vtype.hi is not None else max(lo + 1000.0, abs(float(value)) * 3)
    if value == 0:
        scale = (500.0, 50.0, 5.0)[min(attempt, 2)]
        start = max(lo, 1.0 if vtype.kind == "int" else 0.01)
        target = rng.uniform(start, min(hi, start + scale))
    else:
        target = float(value) * rng.uniform(1 - 0.4 / (attempt + 1), 1 + 0.4 / (attempt + 1))
    if target > hi:  # reflected at the bounds: a witness at a bound moves inside, not onto it again
        target = max(lo, 2 * hi - target)
    if target < lo:
        target = min(hi, 2 * lo - target)
    if vtype.kind == "int":
        return int(round(target))
    return round(target, 2)


def _distinct(items: list[Any], before: list[Any]) -> list[Any]:
    """The proposed items, or the old ones when the proposal made two items equal that were not."""
    def key(x: Any) -> str:
        return repr(x)
    if len({key(x) for x in items}) < len({key(x) for x in before}):
        return before
    return items


def draw(gen: Generator, vtype: Any, rng: random.Random, *, money: bool = False) -> Any:
    """One value from a generator, in the variable's input form (None when it cannot make one): a fresh
    string of its `pattern`, else one of its `examples` (by weight), else a value at a random quantile of
    its fitted `quantiles`, else one between `lo` and `hi` by its `distribution`. An amount (`money`) is
    drawn again rather than 0; a 0 the decision needs comes from the path, not from a generator."""
    for _ in range(TRIES):
        value = _draw_once(gen, vtype, rng)
        if not (money and value == 0 and not isinstance(value, bool)):
            return value
    return None


def _draw_once(gen: Generator, vtype: Any, rng: random.Random) -> Any:
    if gen.pattern is not None:
        return random_match(gen.pattern, rng)
    if gen.examples:
        if gen.weights and len(gen.weights) == len(gen.examples):
            return rng.choices(gen.examples, weights=gen.weights)[0]
        return rng.choice(gen.examples)
    if gen.quantiles:
        at = rng.random() * (len(gen.quantiles) - 1)
        k = min(int(at), len(gen.quantiles) - 2) if len(gen.quantiles) > 1 else 0
        x = gen.quantiles[k] if len(gen.quantiles) == 1 else \
            gen.quantiles[k] + (gen.quantiles[k + 1] - gen.quantiles[k]) * (at - k)
    elif gen.lo is not None and gen.hi is not None:
        lo, hi = gen.lo, gen.hi
        if gen.distribution == "log-uniform" and lo > 0:
            x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        elif gen.distribution == "normal":
            x = min(hi, max(lo, rng.gauss((lo + hi) / 2, (hi - lo) / 6)))
        else:
            x = rng.uniform(lo, hi)
    else:
        return None
    return _typed(vtype, x, gen.decimals, gen.step)


def _typed(vtype: Any, x: float, decimals: int | None, step: int | None = None) -> Any:
    """A drawn number as the variable's input: an int, a rounded float inside the range, a date's text."""
    if isinstance(vtype, ir.NumType):
        if vtype.kind == "int":
            value: Any = int(round(x))
        else:
            value = round(x, 2 if decimals is None else decimals)
        if vtype.lo is not None and value < vtype.lo:
            value = type(value)(vtype.lo)
        if vtype.hi is not None and value > vtype.hi:
            value = type(value)(vtype.hi)
        return value
    if isinstance(vtype, ir.TimeType):
        unit = scalars.DAY if vtype.kind == "date" else max(1, step or 1)
        seconds = int(x) - int(x) % unit
        return scalars.format_temporal(vtype.kind, seconds)
    return None


def varier_for(scenario: ir.Scenario, intents: Mapping[str, Intent], fixed: Iterable[str] = (),
               generators: Mapping[str, Generator] | None = None,
               ambiguous: Iterable[tuple[tuple[str, ...], str]] = ()) -> Callable[[dict[str, Any]], None] | None:
    """The varying step for a scenario's cases (`fixed`: variables left as drawn unless a generator
    draws them; `ambiguous`: the (stages, action) pairs that several paths share), or None when nothing
    in it can vary."""
    varier = Varier(scenario, intents, fixed, generators, ambiguous)
    return varier.vary if varier.useful else None
