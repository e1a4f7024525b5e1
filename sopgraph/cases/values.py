"""Values that look like production data.

A synthesized case starts from the witness its path was proven with: the analysis picks representative
values (`AC-000000`, a fee of 0.0, the same fee id in every record, the same amounts in every case of a
path). Real conversations do not look like that, and a model trained or evaluated on such cases learns the
placeholders. So each case is then varied, one value at a time, wherever the SOP allows it:

- a string the SOP tests with `matches` gets a fresh random string of that pattern;
- any other string with digits in it (ids, references, phone numbers) gets fresh digits, in lists too, so
  that no two records of a list share an id unless the case's decision needs it;
- a money amount (a `money` variable, or a record field named like an amount) that is 0 gets a non-zero
  amount, and every money amount is moved a little, so amounts differ from case to case.

A change is kept only when the engine still takes the case's path to the case's final action and the
case's intent still holds; the case's expected finals and action arguments are then decided again on the
varied values. Variables whose values the profile lists (`values:`) keep the listed values. Each case is
varied with its own seed: same inputs and seed, same bytes.
"""

from __future__ import annotations

import random
import re
import sre_constants
import sre_parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sopgraph.cases.profiles import Intent
from sopgraph.language import ir, scalars
from sopgraph.language.parse import scenario_expressions
from sopgraph.logic.engine import DecideError, Interpreter, engine_for

AMOUNT_NAME = re.compile(r"(?i)(amount|price|fee|cost|total|balance|fare|charge|refund|credit|paid|payment|sum)")
TRIES = 3  # proposals per value before it keeps its witness value
_DIGIT = re.compile(r"\d")
_WORD = "abcdefghijklmnopqrstuvwxyz"


def random_match(pattern: str, rng: random.Random) -> str | None:
    """A random string that fully matches `pattern` (repeats between their minimum and a few more), or
    None when the pattern uses constructs this builder does not know."""
    try:
        text = _build(sre_parse.parse(pattern), rng)
    except (sre_constants.error, _Unknown, RecursionError):
        return None
    return text if scalars.compiled(pattern).fullmatch(text) else None


class _Unknown(Exception):
    """A regular-expression construct the random builder does not cover."""


def _build(seq: Any, rng: random.Random) -> str:
    out: list[str] = []
    for op, av in seq:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "IN":
            out.append(_class_pick(av, rng))
        elif name == "ANY":
            out.append(rng.choice(_WORD))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, sub = av
            top = lo + 3 if hi == sre_constants.MAXREPEAT else min(hi, lo + 3)
            out.extend(_build(sub, rng) for _ in range(rng.randint(lo, max(lo, top))))
        elif name == "SUBPATTERN":
            out.append(_build(av[-1], rng))
        elif name == "BRANCH":
            out.append(_build(rng.choice(av[1]), rng))
        elif name == "AT":
            continue
        else:
            raise _Unknown(name)
    return "".join(out)


def _class_pick(items: Any, rng: random.Random) -> str:
    choices: list[str] = []
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            raise _Unknown(name)
        if name == "LITERAL":
            choices.append(chr(av))
        elif name == "RANGE":
            choices.extend(chr(c) for c in range(av[0], min(av[1], av[0] + 95) + 1))
        elif name == "CATEGORY":
            category = str(av)
            choices.extend("0123456789" if "DIGIT" in category and "NOT" not in category else _WORD)
        else:
            raise _Unknown(name)
    if not choices:
        raise _Unknown("empty class")
    return rng.choice(choices)


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

    def __init__(self, scenario: ir.Scenario, intents: Mapping[str, Intent], fixed: Iterable[str] = ()):
        self.scenario = scenario
        self.engine = engine_for(scenario)
        self.intents = intents
        self.patterns = matched_patterns(scenario)
        keep = set(fixed)  # the profile lists their values: cases use those, as listed
        inputs = [v for v in scenario.variables.values()
                  if v.role != "derived" and not v.observed and v.name not in keep]
        self.types = {v.name: v.type for v in inputs}
        self.money = {v.name for v in inputs if v.money or (isinstance(v.type, ir.NumType) and
                                                            AMOUNT_NAME.search(v.name) is not None)}

    @property
    def useful(self) -> bool:
        """Whether any value of this scenario can vary (else cases are left as they are, at no cost)."""
        return any(self._varies(t) for t in self.types.values()) or bool(self.money)

    def _varies(self, vtype: Any) -> bool:
        if isinstance(vtype, ir.StringType):
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

        def keeps(trial: dict[str, Any]) -> tuple | None:
            try:
                got = self.engine.decide_trace_raw(trial)
            except DecideError:
                return None
            if got[0] != path or got[1].get("Action") != action:
                return None
            if intent is not None and not _holds(self.scenario, intent, trial):
                return None
            return got

        if keeps(values) is None:
            return  # the case is not one this form of the SOP decides as written: leave it be
        rng = random.Random(row.get("seed", 0))
        for name in sorted(self.types):
            if name not in values or values[name] is None:
                continue
            for attempt in range(TRIES):
                proposal = self._propose(name, self.types[name], values[name], rng, attempt)
                if proposal == values[name]:
                    break
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
        """A new value for `name` (attempt 0 the boldest; later attempts stay closer to the witness)."""
        if isinstance(vtype, ir.StringType) and isinstance(value, str):
            if name in self.patterns and attempt == 0:  # a case may need a value that does not match
                fresh = random_match(rng.choice(self.patterns[name]), rng)
                return value if fresh is None else fresh
            return _fresh_digits(value, rng)
        if isinstance(vtype, ir.NumType) and name in self.money:
            return _amount(vtype, value, rng, attempt)
        if isinstance(vtype, ir.ListType) and isinstance(value, list):
            return _distinct([self._propose(name, vtype.item, item, rng, attempt) for item in value], value)
        if isinstance(vtype, ir.RecordType) and isinstance(value, dict):
            out = dict(value)
            for f in vtype.fields:
                if f.name not in out or out[f.name] is None:
                    continue
                if isinstance(f.type, ir.StringType) and isinstance(out[f.name], str):
                    out[f.name] = _fresh_digits(out[f.name], rng)
                elif isinstance(f.type, ir.NumType) and AMOUNT_NAME.search(f.name):
                    out[f.name] = _amount(f.type, out[f.name], rng, attempt)
            return out
        return value


def _holds(scenario: ir.Scenario, intent: Intent, values: Mapping[str, Any]) -> bool:
    it = Interpreter(scenario, values)
    try:
        return all(bool(it.eval(c.expr)) == c.truth for c in intent.conditions)
    except (DecideError, KeyError, TypeError, ValueError):
        return False


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


def varier_for(scenario: ir.Scenario, intents: Mapping[str, Intent],
               fixed: Iterable[str] = ()) -> Callable[[dict[str, Any]], None] | None:
    """The varying step for a scenario's cases (`fixed`: variables left as drawn), or None when nothing
    in it can vary."""
    varier = Varier(scenario, intents, fixed)
    return varier.vary if varier.useful else None
