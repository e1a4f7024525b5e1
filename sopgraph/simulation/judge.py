"""Judges: an ensemble of three reads each evaluated turn; majority vote gives the ground truth.

Why an ensemble (SAGE §3.2.2, App. A.1): a single LLM judge has its own bias; three judges with a
majority vote on classification labels and a mean chat score smooth it out.

Policies (all documented in docs/running.md):
- **Evaluated turns**: by default turns 1, 5, 10, 15 (those that exist) and the final turn;
  `all` or an explicit list can be asked for (`parse_judge_turns`).
- **Pluggable judges**: anything with `role`, `model` and `async judge(request) -> Judgment` (the
  `Judge` Protocol). `LLMJudge` is the gateway-backed one.
- **Malformed answers**: a judge whose answer is not JSON, lacks the labels object, or has invalid
  labels/scores is asked again (at most `max_attempts` calls, the correction quoting the problems).
  After that: no usable labels object → the judgment is *unscored* (`labels=None`,
  `unscored_reason`); a usable object with some bad field values → those fields are abstentions
  (None); invalid chat scores → `scores=None` (the judge does not count for chat quality). A judge
  whose model cannot be reached (`InfraFailure`) or that raises is unscored. Nothing here crashes.
- **Consensus (tie policy)**: per field, among the judges that gave a non-null label, a value wins
  iff it has a strict majority of those votes (> half). Otherwise — a 1-1-1 split, a 1-1 split
  between two answering judges, or no judge answering at all — the field has **no consensus**: it is
  left out of the turn's labels, listed in `Consensus.no_consensus`, and excluded from that turn's
  classification metric (counted in reports). A single answering judge is a strict majority of one.
  (SAGE's code breaks ties by the lexicographically smallest value; we refuse to invent a truth.)
  A field that every judge with a labels object left null is **not shown yet** (`Consensus.unshown`):
  not a disagreement, and the per-turn reference stops where the SOP needs it (evaluation/score.py).
  SAGE's judge prompt asks for a label always; the built-in scripted judge abstains on what the
  customer has not said, so an agent that asks before it acts is not scored against values it could
  not have had.
- **Chat quality**: each dimension averaged over the judges that returned valid scores.
- **Agreement** (`agreement`): per-field Fleiss' kappa over judged turns, per-dimension score
  spread (mean absolute deviation, range), and a self-preference flag when a judge's model is the
  agent's model.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, PrivateAttr

from sopgraph.errors import ArgumentError
from sopgraph.language import ir, scalars
from sopgraph.records import CHAT_DIMENSIONS, Case, Consensus, Judgment, Turn, Usage
from sopgraph.simulation.dialogue import extract_json_object, record_usage, usage_row
from sopgraph.simulation.gateway import InfraFailure
from sopgraph.simulation.prompts import judge_prompt

DEFAULT_JUDGE_TURNS: tuple[int | str, ...] = (1, 5, 10, 15, "final")
INFRA_FAILURE = "infra failure: "
"""How the unscored reason of a judgment lost to infrastructure starts (the judge's model could not be had)."""
SCORE_VALUES = (3, 6, 9)

# Accepted spellings of the five chat dimensions (ours, SAGE's judge template, loose variants).
_DIM_ALIASES: dict[str, str] = {}
for _dim, _aliases in {
    "linguistic": ("linguistic", "linguistic_quality", "language_quality", "language"),
    "anthropomorphism": ("anthropomorphism", "anthropomorphism_emotion", "human_likeness", "empathy"),
    "content_utility": ("content_utility", "content", "usefulness", "utility"),
    "satisfaction": ("satisfaction", "user_satisfaction"),
    "instruction": ("instruction", "instruction_compliance", "instruction_following", "compliance"),
}.items():
    for _a in _aliases:
        _DIM_ALIASES[_a] = _dim


# ---------------------------------------------------------------------------------------------
# Which turns are judged

JudgeTurns = Literal["all"] | tuple[int | str, ...]


def parse_judge_turns(text: str | Sequence[int | str] | None) -> JudgeTurns:
    """`"1,5,10,15,final"` / `"all"` / a list → a normalized spec (raises ArgumentError, a ValueError)."""
    if text is None:
        return DEFAULT_JUDGE_TURNS
    if isinstance(text, str):
        if text.strip().lower() == "all":
            return "all"
        items: list[int | str] = [p.strip() for p in text.split(",") if p.strip()]
    else:
        items = list(text)
    out: list[int | str] = []
    for item in items:
        if isinstance(item, str) and item.lower() in ("final", "last"):
            value: int | str = "final"
        else:
            try:
                value = int(item)
            except (TypeError, ValueError):
                raise ArgumentError(f"judge turn {item!r} is not a positive integer, 'final' or 'all'") from None
            if value < 1:
                raise ArgumentError(f"judge turn {value} must be >= 1")
        if value not in out:
            out.append(value)
    if not out:
        raise ArgumentError("no judge turns given")
    ints = sorted(v for v in out if isinstance(v, int))
    return (*ints, "final") if "final" in out else tuple(ints)


def judge_turns_text(spec: JudgeTurns) -> str:
    return "all" if spec == "all" else ",".join(str(v) for v in spec)


def select_turns(n_turns: int, spec: JudgeTurns) -> list[int]:
    """The 1-based turn indices to judge in a dialogue of `n_turns` agent turns."""
    if n_turns <= 0:
        return []
    if spec == "all":
        return list(range(1, n_turns + 1))
    chosen = {v for v in spec if isinstance(v, int) and v <= n_turns}
    if "final" in spec:
        chosen.add(n_turns)
    return sorted(chosen)


# ---------------------------------------------------------------------------------------------
# Parsing a judge's answer


@dataclass
class ParsedJudgment:
    labels: dict[str, Any] | None
    scores: dict[str, int] | None
    reasons: dict[str, str]
    problems: list[str] = field(default_factory=list)
    fatal: bool = False  # no usable labels object at all


def _norm_label(var: ir.Variable, value: Any) -> tuple[Any, str | None]:
    """(canonical value, problem) for one label; None is an abstention ('cannot tell')."""
    if value is None:
        return None, None
    vtype = var.type
    if isinstance(vtype, ir.EnumType):
        if isinstance(value, str):
            if value in vtype.values:
                return value, None
            folded = {v.lower(): v for v in vtype.values}
            if value.strip().lower() in folded:
                return folded[value.strip().lower()], None
            if value.strip().lower() in ("", "null", "none", "unknown", "n/a"):
                return None, None
        return None, f"{var.name}: {value!r} is not one of {' | '.join(vtype.values)}"
    if isinstance(vtype, ir.BoolType):
        if isinstance(value, bool):
            return value, None
        if isinstance(value, str) and value.strip().lower() in ("true", "yes", "false", "no"):
            return value.strip().lower() in ("true", "yes"), None
        return None, f"{var.name}: {value!r} is not a bool"
    if isinstance(vtype, ir.NumType):
        num: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            num = float(value)
        elif isinstance(value, str):
            try:
                num = float(value.strip())
            except ValueError:
                num = None
        if num is None or not math.isfinite(num):
            return None, f"{var.name}: {value!r} is not a number"
        if vtype.kind == "int":
            if not num.is_integer():
                return None, f"{var.name}: {value!r} is not an integer"
            result: Any = int(num)
        else:
            result = num
        if not vtype.contains(result):
            return None, f"{var.name}: {value!r} is outside {vtype.describe()}"
        return result, None
    if isinstance(vtype, ir.StringType):
        return (value, None) if isinstance(value, str) else (None, f"{var.name}: {value!r} is not text")
    if isinstance(vtype, ir.TimeType):
        try:
            scalars.parse_temporal(vtype.kind, value)
        except scalars.ValueProblem as exc:
            return None, f"{var.name}: {value!r} {exc}"
        return value, None
    return value, None


def parse_judge_reply(scenario: ir.Scenario, text: str) -> ParsedJudgment:
    """Read a judge's JSON answer: labels for every classification field, five 3/6/9 scores, reasons.

    Accepts `{"labels"|"classification"|"classification_output": {...}, "scores"|
    "chat_quality_dimensions"|"chat_scores": {...}, "reasons": {...} | *_reasoning: "..."}`."""
    obj, _how, error = extract_json_object(text)
    if obj is None:
        return ParsedJudgment(None, None, {}, [f"answer is not a JSON object: {error}"], fatal=True)
    problems: list[str] = []
    raw_labels = next((obj[k] for k in ("labels", "classification", "classification_output")
                       if isinstance(obj.get(k), Mapping)), None)
    labels: dict[str, Any] | None = None
    fatal = False
    if raw_labels is None:
        if scenario.fields:
            problems.append("no labels object (expected key 'labels')")
            fatal = True
        else:
            labels = {}
    else:
        labels = {}
        for var in scenario.fields:
            if var.name not in raw_labels:
                problems.append(f"{var.name}: missing label")
                labels[var.name] = None
                continue
            value, problem = _norm_label(var, raw_labels[var.name])
            if problem:
                problems.append(problem)
            labels[var.name] = value
    raw_scores = next((obj[k] for k in ("scores", "chat_quality_dimensions", "chat_scores", "chat_quality")
                       if isinstance(obj.get(k), Mapping)), None)
    scores: dict[str, int] | None = None
    if raw_scores is None:
        problems.append("no scores object (expected key 'scores')")
    else:
        found: dict[str, int] = {}
        bad = False
        for key, value in raw_scores.items():
            dim = _DIM_ALIASES.get(str(key).strip().lower())
            if dim is None:
                continue
            try:
                num = float(value) if not isinstance(value, bool) else math.nan
            except (TypeError, ValueError):
                num = math.nan
            if num not in SCORE_VALUES:
                problems.append(f"score {key}: {value!r} is not 3, 6 or 9")
                bad = True
                continue
            found[dim] = int(num)
        missing = [d for d in CHAT_DIMENSIONS if d not in found]
        if missing:
            problems.append(f"missing scores: {', '.join(missing)}")
        if not bad and not missing:
            scores = {d: found[d] for d in CHAT_DIMENSIONS}
    reasons: dict[str, str] = {}
    raw_reasons = obj.get("reasons")
    if isinstance(raw_reasons, Mapping):
        reasons = {str(k): v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                   for k, v in raw_reasons.items()}
    for key, name in (("classification_reasoning", "labels"), ("chat_quality_reasoning", "chat")):
        value = obj.get(key)
        if value is not None and name not in reasons:
            reasons[name] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return ParsedJudgment(labels, scores, reasons, problems, fatal)


# ---------------------------------------------------------------------------------------------
# The Judge protocol


class JudgeRequest(BaseModel):
    """What a judge sees: the SOP, the case's backend facts, and the dialogue up to `turn_index`."""
    model_config = {"arbitrary_types_allowed": True}

    scenario: ir.Scenario
    case: Case
    dialogue_id: str
    turns: list[Turn]  # turns 1..turn_index
    turn_index: int
    judgment_set: str = "default"
    scenario_info: dict[str, Any] = {}
    _prompt: str | None = PrivateAttr(default=None)

    def prompt(self) -> str:
        """The judge prompt (`prompts.judge_prompt`), built once and shared by the ensemble's judges."""
        if self._prompt is None:

            self._prompt = judge_prompt(self.scenario, self.turns, self.turn_index, self.case.system)
        return self._prompt


@runtime_checkable
class Judge(Protocol):
    """A pluggable judge. `judge` returns a Judgment (unscored ones included); it may raise, in
    which case the ensemble records it as unscored."""
    role: str
    model: str

    async def judge(self, request: JudgeRequest) -> Judgment: ...


def unscored(request: JudgeRequest, role: str, model: str, reason: str, raw: str = "",
             usage: Usage | None = None) -> Judgment:
    return Judgment(
        sop_hash=request.scenario.source_hash, judgment_set=request.judgment_set,
        dialogue_id=request.dialogue_id, turn_index=request.turn_index, judge=role, model=model,
        labels=None, scores=None, raw=raw, unscored_reason=reason, usage=usage or Usage(),
    )


class LLMJudge:
    """A judge backed by a model through the gateway (prompt from `prompts.judge_prompt`)."""
    def __init__(self, spec: Any, gateway: Any, *, max_attempts: int = 3,
                 on_usage: Callable[[dict[str, Any]], None] | None = None):
        self.spec = spec
        self.gateway = gateway
        self.role = spec.role
        self.model = spec.model
        self.max_attempts = max(1, max_attempts)
        self.on_usage = on_usage
        """Called with each answered call's usage row as it returns (the runner writes it to the store at
        once: a crash loses none); the Judgment's `usage` still sums them."""

    async def judge(self, request: JudgeRequest) -> Judgment:

        messages: list[dict[str, Any]] = [{"role": "user", "content": request.prompt()}]
        context = {"role": "judge", "case": request.case.model_dump(mode="json"), "turn": request.turn_index,
                   "scenario": request.scenario_info, "dialogue_id": request.dialogue_id,
                   "judge": self.role}
        usage = Usage()
        raw = ""
        parsed: ParsedJudgment | None = None
        for attempt in range(1, self.max_attempts + 1):
            try:
                answer = await self.gateway.complete(self.spec, messages, context=context)
            except InfraFailure as exc:
                return unscored(request, self.role, self.model, f"{INFRA_FAILURE}{exc.message}", raw, usage)
            if self.on_usage is not None:
                self.on_usage(usage_row(request.dialogue_id, request.turn_index, self.role, answer,
                                        request.judgment_set))
            got = record_usage(answer)
            usage = Usage(prompt_tokens=usage.prompt_tokens + got.prompt_tokens,
                          completion_tokens=usage.completion_tokens + got.completion_tokens,
                          reasoning_tokens=usage.reasoning_tokens + got.reasoning_tokens,
                          cost=usage.cost + got.cost, cost_known=usage.cost_known and got.cost_known,
                          calls=usage.calls + 1)
            raw = answer.text
            parsed = parse_judge_reply(request.scenario, raw)
            if not parsed.problems or attempt == self.max_attempts:
                break
            messages = [
                *messages,
                {"role": "assistant", "content": raw},
                {"role": "user", "content": "Your answer could not be used: " + "; ".join(parsed.problems[:10])
                 + ". Answer again with only the JSON object in the required format."},
            ]
        assert parsed is not None
        return finalize(request, self.role, self.model, parsed, raw, usage, attempts=attempt)


def finalize(request: JudgeRequest, role: str, model: str, parsed: ParsedJudgment, raw: str,
             usage: Usage, attempts: int = 1) -> Judgment:
    """A Judgment from the last parsed answer (see the module docstring for the policy)."""
    if parsed.fatal or parsed.labels is None:
        reason = "; ".join(parsed.problems) or "no labels"
        return unscored(request, role, model, f"malformed after {attempts} attempt(s): {reason}", raw, usage)
    reasons = dict(parsed.reasons)
    if parsed.problems:
        reasons["_problems"] = "; ".join(parsed.problems)
    return Judgment(
        sop_hash=request.scenario.source_hash, judgment_set=request.judgment_set,
        dialogue_id=request.dialogue_id, turn_index=request.turn_index, judge=role, model=model,
        labels=parsed.labels, scores=parsed.scores, reasons=reasons, raw=raw, usage=usage,
    )


# ---------------------------------------------------------------------------------------------
# Ensemble and consensus


def _vote_key(value: Any) -> tuple[str, Any]:
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", float(value))
    return ("s", json.dumps(value, sort_keys=True, ensure_ascii=False) if not isinstance(value, str) else value)


def consensus(fields: Sequence[str], judgments: Sequence[Judgment], *, judgment_set: str, dialogue_id: str,
              turn_index: int, sop_hash: str = "") -> Consensus:
    """Majority vote per field and mean chat scores (tie policy in the module docstring)."""
    labels: dict[str, Any] = {}
    no_consensus: list[str] = []
    unshown: list[str] = []
    answered = any(j.labels is not None for j in judgments)
    for name in fields:
        votes: list[Any] = [j.labels[name] for j in judgments
                            if j.labels is not None and j.labels.get(name) is not None]
        counts = Counter(_vote_key(v) for v in votes)
        winner = None
        if counts:
            key, n = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
            if n * 2 > len(votes):
                winner = next(v for v in votes if _vote_key(v) == key)
        if winner is not None:
            labels[name] = winner
        elif answered and not votes:
            unshown.append(name)
        else:
            no_consensus.append(name)
    scored = [j.scores for j in judgments if j.scores is not None]
    chat = {d: round(sum(s[d] for s in scored) / len(scored), 6) for d in CHAT_DIMENSIONS} if scored else {}
    return Consensus(sop_hash=sop_hash, judgment_set=judgment_set, dialogue_id=dialogue_id,
                     turn_index=turn_index, labels=labels, no_consensus=no_consensus, unshown=unshown,
                     chat_scores=chat,
                     judges_scored=len(scored))


class Ensemble:
    """Runs its judges concurrently on a turn and reduces them to a Consensus."""
    def __init__(self, judges: Sequence[Judge]):
        if not judges:
            raise ValueError("an ensemble needs at least one judge")
        self.judges = list(judges)

    async def _one(self, judge: Judge, request: JudgeRequest) -> Judgment:
        try:
            result = await judge.judge(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing judge is unscored, never a crash
            msg = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            return unscored(request, judge.role, judge.model, f"judge failed: {msg}")
        if not isinstance(result, Judgment):
            return unscored(request, judge.role, judge.model, f"judge returned {type(result).__name__}")
        # The ensemble, not the plug-in, decides where a judgment belongs.
        return result.model_copy(update={
            "judgment_set": request.judgment_set, "dialogue_id": request.dialogue_id,
            "turn_index": request.turn_index, "judge": judge.role, "sop_hash": request.scenario.source_hash})

    async def judge_turn(self, request: JudgeRequest) -> tuple[list[Judgment], Consensus]:
        judgments = list(await asyncio.gather(*(self._one(j, request) for j in self.judges)))
        fields = [v.name for v in request.scenario.fields]
        return judgments, consensus(fields, judgments, judgment_set=request.judgment_set,
                                    dialogue_id=request.dialogue_id, turn_index=request.turn_index,
                                    sop_hash=request.scenario.source_hash)

    async def judge_dialogue(
        self, scenario: ir.Scenario, case: Case, dialogue_id: str, turns: Sequence[Turn], spec: JudgeTurns,
        *, judgment_set: str = "default", scenario_info: Mapping[str, Any] | None = None,
    ) -> tuple[list[Judgment], list[Consensus]]:
        """Judge the selected turns of one dialogue (all turns × judges concurrently)."""
        indices = select_turns(len(turns), spec)
        requests = [
            JudgeRequest(scenario=scenario, case=case, dialogue_id=dialogue_id, turns=list(turns[:i]),
                         turn_index=i, judgment_set=judgment_set, scenario_info=dict(scenario_info or {}))
            for i in indices
        ]
        results = await asyncio.gather(*(self.judge_turn(r) for r in requests))
        judgments = [j for js, _ in results for j in js]
        return judgments, [c for _, c in results]



def lost_to_infra(judgments: Iterable[Judgment]) -> list[Judgment]:
    """The judgments whose judge's model could not be had (retries exhausted, unreachable): not a verdict
    on the turn, so a run must not count the dialogue as judged (it re-judges it on `--resume`)."""
    return [j for j in judgments if j.labels is None and (j.unscored_reason or "").startswith(INFRA_FAILURE)]


def judgment_usage_rows(judgments: Iterable[Judgment]) -> list[dict[str, Any]]:
    """Usage-table rows for judgments (one per judgment that made calls)."""
    return [
        {"dialogue_id": j.dialogue_id, "turn_index": j.turn_index, "role": j.judge, "model": j.model,
         "judgment_set": j.judgment_set, "prompt_tokens": j.usage.prompt_tokens,
         "completion_tokens": j.usage.completion_tokens, "reasoning_tokens": j.usage.reasoning_tokens,
         "cost": j.usage.cost, "cost_known": j.usage.cost_known, "calls": j.usage.calls}
        for j in judgments if j.usage.calls
    ]


# ---------------------------------------------------------------------------------------------
# Agreement statistics


def fleiss_kappa(table: Sequence[Sequence[int]]) -> float | None:
    """Fleiss' kappa of an items × categories count table (every row sums to the same n ≥ 2).

    None when undefined: no items, n < 2, or chance agreement P̄e = 1 (every rating in one category)."""
    rows = [list(r) for r in table if sum(r) > 0]
    if not rows:
        return None
    n = sum(rows[0])
    if any(sum(r) != n for r in rows):
        raise ValueError("every item must have the same number of ratings")
    if n < 2:
        return None
    items = len(rows)
    k = len(rows[0])
    p = [sum(r[j] for r in rows) / (items * n) for j in range(k)]
    p_bar = sum((sum(c * c for c in r) - n) / (n * (n - 1)) for r in rows) / items
    pe = sum(x * x for x in p)
    if pe >= 1.0 - 1e-12:
        return None
    return (p_bar - pe) / (1 - pe)


class FieldAgreement(BaseModel):
    items: int  # judged turns where every judge labelled the field
    kappa: float | None  # Fleiss' kappa; None = undefined (e.g. all labels identical)
    observed: float | None  # mean pairwise agreement P̄
    no_consensus: int = 0


class DimensionSpread(BaseModel):
    items: int  # judged turns with >= 2 scoring judges
    mean_abs_dev: float | None  # mean over turns of the mean absolute deviation from the turn mean
    mean_range: float | None  # mean over turns of max - min
    max_range: int | None


class Agreement(BaseModel):
    judgment_set: str | None
    judges: dict[str, str]  # role -> model
    turns: int
    unscored: int
    fields: dict[str, FieldAgreement]
    dimensions: dict[str, DimensionSpread]
    self_preference: list[str]  # judge roles whose model is the agent's model


def agreement(judgments: Iterable[Judgment], fields: Sequence[str], *, agent_model: str | None = None,
              judgment_set: str | None = None, consensus_rows: Iterable[Consensus] = ()) -> Agreement:
    """Inter-judge agreement over the judged turns of one judgment set."""
    by_turn: dict[tuple[str, int], list[Judgment]] = defaultdict(list)
    judges: dict[str, str] = {}
    unscored_n = 0
    for j in judgments:
        if judgment_set is not None and j.judgment_set != judgment_set:
            continue
        by_turn[(j.dialogue_id, j.turn_index)].append(j)
        judges.setdefault(j.judge, j.model)
        unscored_n += j.labels is None
    n_judges = len(judges)
    no_cons: Counter[str] = Counter()
    for c in consensus_rows:
        if judgment_set is None or c.judgment_set == judgment_set:
            no_cons.update(c.no_consensus)
    field_stats: dict[str, FieldAgreement] = {}
    for name in fields:
        ratings: list[list[Any]] = []
        for key in sorted(by_turn):
            votes = [j.labels.get(name) for j in by_turn[key] if j.labels is not None]
            if n_judges >= 2 and len(votes) == n_judges and all(v is not None for v in votes):
                ratings.append([_vote_key(v) for v in votes])
        cats = sorted({v for r in ratings for v in r})
        table = [[r.count(c) for c in cats] for r in ratings]
        kappa = fleiss_kappa(table) if table else None
        observed = None
        if table:
            n = n_judges
            observed = sum((sum(x * x for x in r) - n) / (n * (n - 1)) for r in table) / len(table)
        field_stats[name] = FieldAgreement(items=len(table), kappa=_r(kappa), observed=_r(observed),
                                           no_consensus=no_cons.get(name, 0))
    dims: dict[str, DimensionSpread] = {}
    for dim in CHAT_DIMENSIONS:
        mads: list[float] = []
        ranges: list[int] = []
        for key in sorted(by_turn):
            values = [j.scores[dim] for j in by_turn[key] if j.scores is not None and dim in j.scores]
            if len(values) >= 2:
                mean = sum(values) / len(values)
                mads.append(sum(abs(v - mean) for v in values) / len(values))
                ranges.append(max(values) - min(values))
        dims[dim] = DimensionSpread(
            items=len(mads), mean_abs_dev=_r(sum(mads) / len(mads)) if mads else None,
            mean_range=_r(sum(ranges) / len(ranges)) if ranges else None,
            max_range=max(ranges) if ranges else None,
        )
    selfpref = sorted(role for role, model in judges.items() if agent_model and model == agent_model)
    return Agreement(judgment_set=judgment_set, judges=dict(sorted(judges.items())), turns=len(by_turn),
                     unscored=unscored_n, fields=field_stats, dimensions=dims, self_preference=selfpref)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
