"""Value distributions fitted from real labelled rows (`sop synth --like ROWS`).

Synthesized cases prove every path with values the analysis picks and then vary them (`cases.values`);
what they cannot know is what production looks like: which plans are common, how large balances are,
what an account id looks like. Rows of real, labelled decisions (the file `sop validate` reads, columns
mapped by the same rules and `--map`/`--expect`/`--now` options) say it. Each mapped field or system
variable gets a `Generator` fitted from its column:

- enums, bools and texts without digits: the observed values with their frequencies (the 200 commonest);
- texts with digits (ids, references): the shape of the commonest ids as a pattern (`AC-[0-9]{6}`), so
  cases get fresh ids of that form, never the real ones;
- numbers, money, dates, datetimes and durations: 21 quantiles of the observed values (a draw picks a
  random point between two neighbours), rounded like the data (cents or whole units; whole days or minutes).

Synthesis draws from them only where a case's decision leaves room: every draw is decided by the engine
and kept only when the case keeps its path, final action and intent. Lists, records and observed
variables are not fitted. Same rows, same generators; the draws follow the case seeds.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from sopgraph.authoring.validate import ValidateError, plan_columns, prepare_rows, reference_time, row_columns
from sopgraph.cases.patterns import random_match
from sopgraph.cases.profiles import Generator, Profile
from sopgraph.language import ir, scalars

MAX_EXAMPLES = 200  # distinct values kept per categorical variable (the commonest)
QUANTILES = 21  # points of a fitted numeric distribution (every 5 %)
_TOKEN = re.compile(r"\d+|[A-Za-z]+|[^\dA-Za-z]+")


class LikeFit(BaseModel):
    """What `--like` fitted: a generator per variable, the column it came from, how many values it saw,
    and the variables it left alone (with why)."""
    source: str
    rows: int
    generators: dict[str, Generator] = Field(default_factory=dict)
    columns: dict[str, str] = Field(default_factory=dict)
    counts: dict[str, int] = Field(default_factory=dict)
    skipped: dict[str, str] = Field(default_factory=dict)


def fit(scenario: ir.Scenario, rows: Sequence[Mapping[str, Any]], *, expect: Mapping[str, str] | None = None,
        mapping: Mapping[str, str] | None = None, now: str | None = None, source: str = "") -> LikeFit:
    """Fit a generator for every field and system variable that has a column (see the module docstring).
    Raises `ValidateError` for a mapping `sop validate` would refuse, or when no column feeds a variable."""
    if not rows:
        raise ValidateError(f"{source or 'the data'}: no rows to fit values from")
    now_text, today = reference_time(now)
    columns, nested = row_columns(rows)  # as `sop validate` maps them: keys inside nested objects too
    try:
        plan = plan_columns(scenario, columns, expect or {}, mapping or {}, nested)
    except ValidateError:
        if expect:
            raise
        # the values are fitted, not the labels: data without a decision column still says what values look like
        plan = plan_columns(scenario, columns, {"Action": columns[0]}, mapping or {}, nested)
    typed = prepare_rows(scenario, rows, plan, today, now_text)
    out = LikeFit(source=source, rows=len(rows))
    for name, column in sorted(plan.inputs.items()):
        var = scenario.variables[name]
        if var.observed or isinstance(var.type, ir.ListType | ir.RecordType):
            out.skipped[name] = "observed: the backend's news" if var.observed else "a list or record"
            continue
        values = [r.values[name] for r in typed if r.values.get(name) is not None]
        if not values:
            out.skipped[name] = f"column `{column}` holds no usable value"
            continue
        gen = fit_one(var, values)
        if gen is None:
            out.skipped[name] = f"column `{column}`: nothing to fit"
            continue
        gen.source = f"--like {source}" if source else "--like"
        out.generators[name], out.columns[name], out.counts[name] = gen, column, len(values)
    if not out.generators:
        raise ValidateError(f"{source or 'the data'}: no column feeds a field or system variable of the SOP "
                            f"(columns: {', '.join(columns[:30])}); name columns like the variables or use --map")
    return out


def fit_one(var: ir.Variable, values: Sequence[Any]) -> Generator | None:
    """The generator of one variable from its observed (typed) values."""
    vtype = var.type
    if isinstance(vtype, ir.NumType):
        nums = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        decimals = None if vtype.kind == "int" else min(2, max((_decimals(v) for v in nums), default=2))
        return Generator(quantiles=quantiles(nums), decimals=decimals) if nums else None
    if isinstance(vtype, ir.TimeType):
        secs: list[float] = []
        for v in values:
            try:
                secs.append(float(scalars.parse_temporal(vtype.kind, v)))
            except (TypeError, ValueError):
                continue
        # drawn as finely as the data is written: whole days, else whole minutes
        step = scalars.DAY if all(x % scalars.DAY == 0 for x in secs) else 60
        return Generator(quantiles=quantiles(secs), step=step) if secs else None
    if isinstance(vtype, ir.StringType):
        texts = [str(v) for v in values]
        if sum(any(c.isdigit() for c in t) for t in texts) * 2 > len(texts):
            pattern = id_pattern(texts)
            if pattern is not None:
                return Generator(pattern=pattern)
    return _categorical(values)


def _categorical(values: Sequence[Any]) -> Generator:
    counts = Counter(values)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))[:MAX_EXAMPLES]
    return Generator(examples=[v for v, _ in top], weights=[float(c) for _, c in top])


def quantiles(xs: Sequence[float]) -> list[float]:
    """`QUANTILES` points at equal steps of probability (linear between the sorted observations)."""
    s = sorted(xs)
    if len(s) == 1:
        return [s[0]]
    out: list[float] = []
    for k in range(QUANTILES):
        at = k * (len(s) - 1) / (QUANTILES - 1)
        lo = int(at)
        hi = min(lo + 1, len(s) - 1)
        out.append(s[lo] + (s[hi] - s[lo]) * (at - lo))
    return out


def _decimals(x: float) -> int:
    text = repr(float(x))
    return 0 if text.endswith(".0") else len(text.split(".")[1]) if "." in text and "e" not in text else 2


def id_pattern(texts: Sequence[str]) -> str | None:
    """The form of the commonest ids as a regular expression: letters kept as written where the ids
    share them (`AC-[0-9]{6}`), else letter classes (`[A-Z]{2}[0-9]{4}`), else run lengths as ranges
    (`[A-Z]{2,3}-[0-9]{4,6}`); None when no form covers half of them (or none can be drawn)."""
    shapes = [[_token_shape(tok) for tok in _TOKEN.findall(t)] for t in texts]
    for level in range(3):
        keyed = Counter(tuple(_level_key(tok, level) for tok in shape) for shape in shapes)
        key, count = max(keyed.items(), key=lambda kv: (kv[1], str(kv[0])))
        if count * 2 < len(texts):
            continue
        members = [shape for shape in shapes if tuple(_level_key(tok, level) for tok in shape) == key]
        pattern = "".join(_token_regex([shape[i] for shape in members], level) for i in range(len(key)))
        if random_match(pattern, random.Random(0)) is not None:
            return pattern
    return None


def _token_shape(tok: str) -> tuple[str, str]:
    if tok.isdigit():
        return ("d", tok)
    if tok.isalpha() and tok.isascii():
        return ("a", tok)
    return ("o", tok)


def _level_key(tok: tuple[str, str], level: int) -> tuple:
    kind, text = tok
    if kind == "o":
        return (kind, text)
    if kind == "d":
        return (kind, len(text)) if level < 2 else (kind,)
    if level == 0:
        return (kind, text)
    case = "U" if text.isupper() else "l" if text.islower() else "M"
    return (kind, case, len(text)) if level == 1 else (kind, case)


def _token_regex(toks: Sequence[tuple[str, str]], level: int) -> str:
    kind, text = toks[0]
    if kind == "o" or (kind == "a" and level == 0):
        return re.escape(text)
    lengths = sorted({len(t) for _, t in toks})
    reps = f"{{{lengths[0]}}}" if len(lengths) == 1 else f"{{{lengths[0]},{lengths[-1]}}}"
    if kind == "d":
        return "[0-9]" + reps
    cls = "[A-Z]" if text.isupper() else "[a-z]" if text.islower() else "[A-Za-z]"
    return cls + reps


def with_fit(profile: Profile, fitted: LikeFit) -> Profile:
    """The profile with the fitted generators added: a variable the profile itself gives values or a
    generator keeps the author's (the author's word wins over the data's)."""
    own = set(profile.generators) | {n for n, vals in profile.sample_values.items() if vals}
    generators = {**{n: g for n, g in fitted.generators.items() if n not in own}, **profile.generators}
    return profile.model_copy(update={"generators": generators})
