"""`sop view`: a local, read-only browser over run directories (like `inspect view`, `promptfoo view`).

Why: a score table says *that* a model failed; reading the transcript next to the reference path says
*why*. The viewer is a small stdlib HTTP server on 127.0.0.1 serving one static page (plain HTML + JS,
no build step) and a JSON API:

    GET /                                   the page
    GET /assets/view.js, /assets/view.css   its script and style (a fixed list: no file paths)
    GET /api/runs                           the runs served, with their counts
    GET /api/runs/<run>/summary             header: model roles, scenario, counts, headline scores
    GET /api/runs/<run>/dialogues?...       one page of dialogue rows, filtered and sorted server-side
    GET /api/runs/<run>/dialogues/<id>      one transcript: turns, agent JSON, reference vs agent path/trace

Safety: bound to 127.0.0.1 only; every method but GET is refused (405); a request whose Host header is
not this server is refused (421: DNS rebinding), and so is one with no Host, more than one Host (which one
a proxy or browser honours is not ours to guess) or an absolute URL as its target (400); nothing on disk is reachable through a URL (runs are looked
up by name in a table built at start, assets in a fixed dict); stores are opened read-only
(`RunStore.open(read_only=True)`), so the run directory is never written. A client that hangs up is no
error (nothing printed, one line with `--log`); a connection idle for `IDLE_TIMEOUT_S` is closed.

Scale: each run is scored once, on first use (`score_run`, bootstrap off), into a list of small row
dicts; filtering and pagination are done on that list, so a page of a 10,000-dialogue run is a few
milliseconds and the browser never receives more than one page.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np

from sopgraph.errors import Error
from sopgraph.evaluation.score import ScoreConfig, ScoredRun, ScoreError, score_run
from sopgraph.evaluation.traces import ProcedureScorer, case_reference_trace, sage_trace
from sopgraph.logic.engine import DecideError
from sopgraph.records import INTENSITIES, Case, Dialogue
from sopgraph.simulation.agents import action_outputs
from sopgraph.simulation.environment import EnvError, EnvSpec
from sopgraph.simulation.store import STORE_FILE, RunStore, StoreError

MAX_RUNS = 500  # directories holding more runs than this are cut (said in the run list)
MAX_DEPTH = 3  # how deep `sop view DIR` looks for run directories
PAGE_DEFAULT = 100
PAGE_MAX = 500

# Failure kinds of a dialogue, in the order the page lists them (docs/view.md says what each means).
FAILURE_KINDS: tuple[str, ...] = (
    "failed", "format_error", "wrong_action", "wrong_path", "wrong_classification", "unsafe_action",
    "over_escalation", "missed_escalation", "trace_miss", "left_procedure", "unscorable", "infra_failure",
    "incomplete",
)
# Per-dialogue numbers a page may filter (min/max) and sort on; final-turn metrics come from the
# dialogue's final turn, trace metrics are per dialogue (evaluation/traces.py).
ROW_METRICS: tuple[str, ...] = (
    "overall", "logic", "chat", "classification", "path", "action", "finals", "trace_precision",
    "trace_recall", "trace_order", "journey_coverage", "step_recall", "step_precision", "step_order",
    "end_state", "turns",
)
_FINAL_COLUMNS = {"logic": "t_logic", "chat": "t_chat", "classification": "t_cls", "path": "t_path",
                  "action": "t_act", "finals": "t_finals"}
_ASSETS = {"/": ("view.html", "text/html; charset=utf-8"),
           "/assets/view.js": ("view.js", "text/javascript; charset=utf-8"),
           "/assets/view.css": ("view.css", "text/css; charset=utf-8")}


class ViewError(Error):
    """A request the viewer answers with a 4xx status (unknown run, dialogue or bad parameter)."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------
# one run


@dataclass
class RunView:
    """One run directory, opened read-only and indexed on first use."""
    name: str
    run_dir: Path
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _store: RunStore | None = None
    _rows: list[dict[str, Any]] | None = None
    _scored: ScoredRun | None = None
    _summary: dict[str, Any] | None = None
    _cases: dict[str, Case] = field(default_factory=dict)
    _notes: list[str] = field(default_factory=list)

    # -- loading ----------------------------------------------------------------------------
    def _open(self) -> RunStore:
        if self._store is None:
            try:
                self._store = RunStore.open(self.run_dir, read_only=True)
            except StoreError as exc:
                raise ViewError(HTTPStatus.CONFLICT, str(exc)) from None
        return self._store

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def brief(self) -> dict[str, Any]:
        """What the run list shows, without scoring (cheap: counts from the store). A run not opened
        yet is opened only for this, so that listing hundreds of runs keeps no file open."""
        with self._lock:
            opened = self._store is not None
            try:
                store = self._open()
            except ViewError as exc:
                return {"name": self.name, "error": str(exc)}
            try:
                counts = store.summary()
                return {"name": self.name, "scenario": store.meta_value("scenario_name"),
                        "agent": store.meta_value("agent_model"), "created": store.meta_value("created"),
                        "dialogues": counts["dialogues"], "by_status": counts["by_status"],
                        "turns": counts["turns"], "judgment_sets": sorted(counts["judgment_sets"])}
            finally:
                if not opened:
                    store.close()
                    self._store = None

    def _index(self) -> list[dict[str, Any]]:
        """The dialogue rows (scored once; unscorable runs fall back to what the store holds)."""
        if self._rows is not None:
            return self._rows
        store = self._open()
        self._cases = {c.id: c for c in store.cases()}
        try:
            scored: ScoredRun | None = score_run(self.run_dir, ScoreConfig(bootstrap=0), read_only=True)
        except (ScoreError, StoreError) as exc:
            scored = None
            self._notes.append(f"not scored: {exc}")
        if scored is not None:
            self._scored = scored
            self._rows = _scored_rows(scored)
            if not store.judgment_sets():
                self._notes.append("not judged yet: judge-based metrics (overall, classification, path, chat) "
                                   "are empty; pass/fail and actions are against the case's reference")
        else:
            self._rows = [_raw_row(d, self._cases.get(d.case_id)) for d in store.dialogues()]
        running = sum(1 for r in self._rows if r["status"] in ("pending", "running"))
        if running:
            self._notes.append(f"{running} dialogues not finished (run in progress or interrupted): "
                               "shown without scores")
        return self._rows

    # -- API --------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        with self._lock:
            if self._summary is None:
                self._summary = self._make_summary()
            return self._summary

    def _make_summary(self) -> dict[str, Any]:
        rows = self._index()
        store = self._open()
        meta = store.meta()
        models = {role: (spec or {}).get("model") if isinstance(spec, Mapping) else spec
                  for role, spec in (meta.get("models") or {}).items()}
        try:
            scenario = store.scenario()
            stages = {sid: st.title for sid, st in scenario.stages.items()}
        except StoreError:
            scenario, stages = None, {}
        scores: dict[str, Any] = {}
        if self._scored is not None:
            for g in self._scored.summary([("model",)]).groups:
                scores[g.key.get("model", "-")] = {
                    **{k: m.value for k, m in g.metrics.items()},
                    **{f"pass^{i + 1}": m.value for i, m in enumerate(g.pass_k)}}
        facets: dict[str, Counter] = {k: Counter() for k in ("intensity", "path_id", "bucket", "model", "status")}
        kinds: Counter = Counter()
        for r in rows:
            for k, counter in facets.items():
                counter[str(r.get(k))] += 1
            kinds.update(r["failures"])
        intensity_order = {v: i for i, v in enumerate(INTENSITIES)}
        return {
            "name": self.name, "run_dir": str(self.run_dir), "scenario": scenario.name if scenario else None,
            "sop_hash": meta.get("sop_hash"), "created": meta.get("created"), "tool_version": meta.get("tool_version"),
            "models": models, "config": meta.get("config") or {}, "counts": store.summary(),
            "judgment_set": self._scored.judgment_set if self._scored else None,
            "scored": self._scored is not None, "scores": scores, "notes": list(self._notes), "stages": stages,
            "facets": {
                "intensity": sorted(facets["intensity"].items(), key=lambda kv: intensity_order.get(kv[0], 9)),
                **{k: sorted(facets[k].items()) for k in ("path_id", "bucket", "model", "status")},
                "failure": [(k, kinds[k]) for k in FAILURE_KINDS if kinds[k]],
            },
            "metrics": list(ROW_METRICS), "failure_kinds": list(FAILURE_KINDS),
        }

    def dialogues(self, query: Mapping[str, str]) -> dict[str, Any]:
        """One page of rows matching the query (see `filter_rows`)."""
        with self._lock:
            rows = self._index()
        return filter_rows(rows, query)

    def transcript(self, dialogue_id: str) -> dict[str, Any]:
        with self._lock:
            self._index()
            store = self._open()
            dlg = store.dialogue(dialogue_id)
            if dlg is None:
                raise ViewError(HTTPStatus.NOT_FOUND, f"no dialogue {dialogue_id!r} in run {self.name}")
            row = next((r for r in self._rows or [] if r["id"] == dlg.id), None)
            return _transcript(store, dlg, self._cases.get(dlg.case_id), self._scored, row)


class _Columns:
    """The ScoredRun columns a row reads, as Python lists (indexing numpy scalars one by one is what
    made indexing a 10,000-dialogue run slow). Final-turn columns are taken at each dialogue's final
    row (NaN / False where it has none)."""

    def __init__(self, run: ScoredRun):
        fr = run.d_final_row
        has = fr >= 0
        at = np.where(has, fr, 0)

        def final(col: np.ndarray, empty: Any) -> list:
            return np.where(has, col[at], empty).tolist() if col.size else [empty] * len(fr)

        self.status = run.d_status.tolist()
        self.has_final = has.tolist()
        self.passed = run.d_pass.tolist()
        self.final_fmt = run.d_final_format_error.tolist()
        self.unreadable = run.d_unreadable_turns.tolist()
        self.final_right = run.d_final_right.tolist()
        self.cat = run.d_cat_turns.tolist()
        self.escalated = run.d_escalated.tolist()
        self.expected_escalation = run.d_expected_escalation.tolist()
        self.tau2 = run.d_trace["tau2_pass"].tolist()
        self.unscorable = final(run.t_unscorable, False)
        self.action = final(run.t_action, -1)
        self.turns = run.d_turns.tolist()
        self.metrics = {"overall": run.d_overall.tolist(),
                        **{name: final(getattr(run, col), np.nan) for name, col in _FINAL_COLUMNS.items()},
                        **{name: run.d_trace[name].tolist() for name in
                           ("trace_precision", "trace_recall", "trace_order", "journey_coverage", "step_recall",
                            "step_precision", "step_order", "end_state")}}
        self.followed = run.d_trace["steps_followed"].tolist()


def _failures(c: _Columns, d: int) -> list[str]:
    """The failure kinds of dialogue `d` (FAILURE_KINDS)."""
    if c.status[d] == 1:
        return ["infra_failure"]
    if c.status[d] != 0:
        return ["incomplete"]
    out = [] if c.passed[d] else ["failed"]
    if c.unreadable[d] > 0:
        out.append("format_error")
    readable_final = c.has_final[d] and not c.final_fmt[d]
    if readable_final and not c.final_right[d]:
        out.append("wrong_action")
    if readable_final:
        if c.metrics["path"][d] < 1:  # NaN compares False: an unjudged turn is not a wrong path
            out.append("wrong_path")
        if c.metrics["classification"][d] < 1:
            out.append("wrong_classification")
        if c.unscorable[d]:
            out.append("unscorable")
    if c.cat[d] > 0:
        out.append("unsafe_action")
    if c.escalated[d] and not c.expected_escalation[d]:
        out.append("over_escalation")
    if c.expected_escalation[d] and not c.escalated[d]:
        out.append("missed_escalation")
    if c.tau2[d] == 0:
        out.append("trace_miss")
    if c.followed[d] == 0:
        out.append("left_procedure")
    return out


def _scored_rows(run: ScoredRun) -> list[dict[str, Any]]:
    c = _Columns(run)
    names = list(run.action_names)
    models = [run.model_of(d) for d in range(len(run.dialogues))]
    rows = []
    for d, dlg in enumerate(run.dialogues):
        metrics = {name: (None if math.isnan(col[d]) else col[d]) for name, col in c.metrics.items()}
        metrics["turns"] = float(c.turns[d])
        action = c.action[d]
        rows.append({
            **_base_row(dlg, run.case_of(d)), "model": models[d],
            "pass": bool(c.passed[d]) if c.status[d] == 0 else None,
            "final_action": names[action] if action >= 0 else None,
            "turns": int(c.turns[d]) or dlg.turns, "metrics": metrics, "failures": _failures(c, d),
        })
    return rows


def _base_row(dlg: Dialogue, case: Case | None) -> dict[str, Any]:
    return {"id": dlg.id, "case_id": dlg.case_id, "trial": dlg.trial, "status": dlg.status,
            "end_reason": dlg.end_reason, "model": dlg.models.get("agent"),
            "intensity": case.intensity if case else None, "bucket": case.bucket if case else None,
            "path_id": case.path_id if case else None, "intent": case.intent if case else None,
            "reference_path": list(case.expected_path) if case else [],
            "reference_action": case.expected_finals.get("Action") if case else None}


def _raw_row(dlg: Dialogue, case: Case | None) -> dict[str, Any]:
    """A row of an unscorable run: what the store says, no metrics."""
    kinds = {"infra_failure": ["infra_failure"], "done": []}.get(dlg.status, ["incomplete"])
    return {**_base_row(dlg, case), "pass": None, "final_action": None, "turns": dlg.turns,
            "metrics": dict.fromkeys(ROW_METRICS), "failures": kinds}


# ---------------------------------------------------------------------------------------------
# filtering


def _one(query: Mapping[str, str], key: str) -> str | None:
    value = query.get(key)
    return value if value not in (None, "") else None


def _float(query: Mapping[str, str], key: str) -> float | None:
    raw = _one(query, key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ViewError(HTTPStatus.BAD_REQUEST, f"{key}={raw!r} is not a number") from None
    if math.isnan(value):
        raise ViewError(HTTPStatus.BAD_REQUEST, f"{key} must be a number")
    return value


def _int(query: Mapping[str, str], key: str, default: int, lo: int, hi: int) -> int:
    raw = _one(query, key)
    if raw is None:
        return default
    try:
        return max(lo, min(hi, int(raw)))
    except ValueError:
        raise ViewError(HTTPStatus.BAD_REQUEST, f"{key}={raw!r} is not an integer") from None


_QUERY_KEYS: frozenset[str] = frozenset(("pass", "intensity", "path_id", "bucket", "model", "status", "failure",
                                         "metric", "min", "max", "q", "sort", "order", "offset", "limit"))


def filter_rows(rows: Sequence[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """Filter, sort and paginate dialogue rows.

    Query keys (all optional): `pass` = pass | fail; `metric` with `min` and/or `max` (fractions;
    a dialogue whose metric is undefined never matches a range); `intensity`, `path_id`, `bucket`,
    `model`, `status` (exact); `failure` (a FAILURE_KINDS entry, or `none`); `q` (substring of the
    dialogue id or intent); `sort` = a metric or `id`, `order` = asc | desc; `offset`, `limit`
    (≤ PAGE_MAX)."""
    unknown = sorted(set(query) - _QUERY_KEYS)
    if unknown:  # a misspelt filter (`verdict=fail`) would otherwise return every dialogue, unfiltered
        raise ViewError(HTTPStatus.BAD_REQUEST, f"unknown parameter {unknown[0]!r}; known: "
                        + ", ".join(sorted(_QUERY_KEYS)))
    out: Iterable[dict[str, Any]] = rows
    verdict = _one(query, "pass")
    if verdict is not None:
        if verdict not in ("pass", "fail"):
            raise ViewError(HTTPStatus.BAD_REQUEST, "pass must be `pass` or `fail`")
        want = verdict == "pass"
        out = [r for r in out if r["pass"] is want]
    for key in ("intensity", "path_id", "bucket", "model", "status"):
        value = _one(query, key)
        if value is not None:
            out = [r for r in out if str(r.get(key)) == value]
    failure = _one(query, "failure")
    if failure is not None:
        if failure != "none" and failure not in FAILURE_KINDS:
            raise ViewError(HTTPStatus.BAD_REQUEST, f"unknown failure kind {failure!r}; known: "
                            + ", ".join(FAILURE_KINDS))
        out = [r for r in out if (failure in r["failures"]) or (failure == "none" and not r["failures"])]
    metric = _one(query, "metric") or "overall"
    if metric not in ROW_METRICS:
        raise ViewError(HTTPStatus.BAD_REQUEST, f"unknown metric {metric!r}; known: {', '.join(ROW_METRICS)}")
    lo, hi = _float(query, "min"), _float(query, "max")
    if lo is not None or hi is not None:
        lo_v = -math.inf if lo is None else lo
        hi_v = math.inf if hi is None else hi
        out = [r for r in out if r["metrics"][metric] is not None and lo_v <= r["metrics"][metric] <= hi_v]
    text = _one(query, "q")
    if text is not None:
        needle = text.lower()
        out = [r for r in out if needle in r["id"].lower() or needle in str(r.get("intent") or "").lower()]
    out = list(out)
    sort = _one(query, "sort") or "id"
    desc = _one(query, "order") == "desc"
    if sort != "id":
        if sort not in ROW_METRICS:
            raise ViewError(HTTPStatus.BAD_REQUEST, f"cannot sort on {sort!r}")
        defined = [r for r in out if r["metrics"][sort] is not None]
        undefined = [r for r in out if r["metrics"][sort] is None]
        defined.sort(key=lambda r: r["metrics"][sort], reverse=desc)  # stable: ties keep run order
        out = defined + undefined
    elif desc:
        out.reverse()
    offset = _int(query, "offset", 0, 0, max(len(out), 0))
    limit = _int(query, "limit", PAGE_DEFAULT, 1, PAGE_MAX)
    return {"total": len(rows), "matched": len(out), "offset": offset, "limit": limit,
            "rows": out[offset:offset + limit]}


# ---------------------------------------------------------------------------------------------
# one transcript


def agent_trace(outputs: Sequence[Mapping[str, Any] | None], params: Mapping[str, list[str]]) -> list[dict]:
    """The agent's action trace as scoring reads it (score._trace_columns): every tool call in order
    when the agent acted through tools, else the final turn's reported `actions` and Action (`sage_trace`)."""
    calls = [c for o in outputs if o for c in (o.get("tool_calls") or [])]
    if any(o and o.get("source") == "tools" for o in outputs) or calls:
        return [{"name": str(c.get("name")), "args": dict(c.get("args") or {})} for c in calls]
    return sage_trace(outputs[-1] if outputs else None, params)


def _reference_trace(scenario: Any, case: Case | None, params: dict[str, list[str]], env: EnvSpec | None
                     ) -> list[dict[str, Any]]:
    """The case's reference trace: against the run's environment when it has one (as scored), else the
    case's own."""
    if case is None:
        return []
    if env is not None:
        try:
            return ProcedureScorer(scenario, env, lambda a, b: a == b).reference(case)
        except (DecideError, EnvError):
            pass
    return case_reference_trace(scenario, case, params)


def _transcript(store: RunStore, dlg: Dialogue, case: Case | None, run: ScoredRun | None,
                row: dict[str, Any] | None) -> dict[str, Any]:
    """Everything the transcript pane shows: the stored records, per-turn scores and both traces."""
    turns = store.turns(dlg.id)
    consensus = {c.turn_index: c for c in store.consensus(run.judgment_set if run else None, dlg.id)}
    judgments = store.judgments(run.judgment_set if run else None, dlg.id)
    scores: dict[int, dict[str, Any]] = {}
    divergence: str | None = None
    if run is not None:
        d = run.dialogue_index(dlg.id)
        if d is not None:
            divergence = run.divergence_text(d)
            for r in run.turn_rows(d).tolist():
                rec = run.turn_record(int(r))
                scores[rec["turn"]] = rec
    try:
        scenario = store.scenario()
        params = action_outputs(scenario)
        ref_trace = _reference_trace(scenario, case, params, run.env if run is not None else None)
    except StoreError:
        params, ref_trace = {}, []
    outputs = [t.output.model_dump(mode="json") if t.output else None for t in turns]
    last_path: list[str] = next((o["now_path"] for o in reversed(outputs) if o and o.get("now_path")), [])
    return {
        "dialogue": dlg.model_dump(mode="json"),
        "case": case.model_dump(mode="json") if case else None,
        "row": row,
        "reference": {"path": list(case.expected_path) if case else [],
                      "finals": dict(case.expected_finals) if case else {}, "trace": ref_trace,
                      "prohibited": list(case.prohibited_actions) if case else []},
        "agent": {"path": list(last_path), "trace": agent_trace(outputs, params),
                  "finals": next((o["finals"] for o in reversed(outputs) if o and o.get("finals")), {})},
        "divergence": divergence,  # where a tool agent first left the procedure (docs/metrics.md)
        "turns": [{**t.model_dump(mode="json"),
                   "consensus": consensus[t.index].model_dump(mode="json") if t.index in consensus else None,
                   "judgments": [j.model_dump(mode="json") for j in judgments if j.turn_index == t.index],
                   "scores": scores.get(t.index)} for t in turns],
    }


# ---------------------------------------------------------------------------------------------
# several runs


def find_runs(paths: Sequence[str | Path], *, max_runs: int = MAX_RUNS) -> tuple[dict[str, RunView], list[str]]:
    """Run views by unique name for the given paths (each a run directory, or a directory searched
    MAX_DEPTH levels deep for run directories), and notes (paths that hold no run, a cut list).

    Names are the run's path relative to the directory given (`oracle`, `2024/oracle`), or the
    directory's own name for a run given directly; clashes get a `~2` suffix."""
    runs: dict[str, RunView] = {}
    notes: list[str] = []
    for raw in paths:
        base = Path(raw)
        if not base.is_dir():
            raise ViewError(HTTPStatus.NOT_FOUND, f"{base} is not a directory")
        found = [(base.resolve().name or str(base), base)] if (base / STORE_FILE).is_file() else [
            (d.relative_to(base).as_posix(), d) for d in _run_dirs(base, MAX_DEPTH)]
        if not found:
            notes.append(f"{base}: no run directory (no {STORE_FILE}) within {MAX_DEPTH} levels")
        for name, run_dir in found:
            if len(runs) >= max_runs:
                notes.append(f"more than {max_runs} runs: the rest are not listed; give a narrower directory")
                return runs, notes
            unique, n = name, 1
            while unique in runs:
                n += 1
                unique = f"{name}~{n}"
            runs[unique] = RunView(unique, run_dir)
    return runs, notes


def _run_dirs(base: Path, depth: int) -> list[Path]:
    """Run directories under `base` (not following symlinked directories), sorted, bounded depth."""
    out: list[Path] = []
    try:
        children = sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return out
    for child in children:
        if (child / STORE_FILE).is_file():
            out.append(child)
        elif depth > 1:
            out.extend(_run_dirs(child, depth - 1))
    return out


# ---------------------------------------------------------------------------------------------
# HTTP


class ViewApp:
    """The viewer's routes over a set of runs (no sockets: `ViewServer` serves it)."""

    def __init__(self, runs: Mapping[str, RunView], notes: Sequence[str] = ()):
        self.runs = dict(runs)
        self.notes = list(notes)

    def route(self, raw_path: str) -> tuple[HTTPStatus, str, bytes]:
        """(status, content type, body) for a GET of `raw_path` (path and query)."""
        parts = urlsplit(raw_path)
        path = parts.path
        if path in _ASSETS:
            name, ctype = _ASSETS[path]
            return HTTPStatus.OK, ctype, _asset(name)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        try:
            return HTTPStatus.OK, "application/json", _json_bytes(self.api(path, query))
        except ViewError as exc:
            return exc.status, "application/json", _json_bytes({"error": str(exc)})

    def api(self, path: str, query: Mapping[str, str]) -> Any:
        segments = path.split("/")  # "/api/runs/<run>/..." → ["", "api", "runs", <run>, ...]
        if segments[:3] != ["", "api", "runs"]:
            raise ViewError(HTTPStatus.NOT_FOUND, "not found")
        rest = [unquote(s) for s in segments[3:]]
        if rest in ([], [""]):
            return {"runs": [run.brief() for run in self.runs.values()], "notes": self.notes}
        run = self.runs.get(rest[0])
        if run is None:
            raise ViewError(HTTPStatus.NOT_FOUND, f"no run named {rest[0]!r}")
        if rest[1:] == ["summary"]:
            return run.summary()
        if rest[1:] == ["dialogues"]:
            return run.dialogues(query)
        if len(rest) == 3 and rest[1] == "dialogues":
            return run.transcript(rest[2])
        raise ViewError(HTTPStatus.NOT_FOUND, "not found")

    def close(self) -> None:
        for run in self.runs.values():
            run.close()


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, default=str).encode("utf-8")


def _asset(name: str) -> bytes:
    return resources.files("sopgraph").joinpath("templates", "view", name).read_bytes()


IDLE_TIMEOUT_S = 30.0  # a connection that sends nothing for this long is closed (it would hold a thread)


class _Handler(BaseHTTPRequestHandler):
    """GET only; everything else is 405. The app is set on the server (`ViewServer`)."""
    server: ViewServer
    server_version = "sop-view"
    sys_version = ""
    timeout = IDLE_TIMEOUT_S

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.command != "GET":
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, "application/json",
                       _json_bytes({"error": f"{self.command} is not allowed: the viewer is read-only"}),
                       extra={"Allow": "GET"})
            return False
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1 or not self.path.startswith("/"):
            # the Host check stops DNS rebinding only if the Host it reads is the one the request is for:
            # with two, or with an absolute URL as the target, another party may honour the other one
            problem = (f"{len(hosts)} Host headers (exactly one is required)" if len(hosts) != 1
                       else "an absolute URL as the request target (send a path)")
            self._send(HTTPStatus.BAD_REQUEST, "application/json", _json_bytes({"error": problem}))
            return False
        host = hosts[0].strip().lower()
        if host not in self.server.hosts:
            self._send(HTTPStatus.MISDIRECTED_REQUEST, "application/json",
                       _json_bytes({"error": f"unexpected Host {host!r}"}))
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        try:
            status, ctype, body = self.server.app.route(self.path)
        except (ScoreError, StoreError) as exc:
            status, ctype, body = HTTPStatus.CONFLICT, "application/json", _json_bytes({"error": str(exc)})
        except Exception as exc:  # one bad run must not take the page down: say it, in one line
            status, ctype = HTTPStatus.INTERNAL_SERVER_ERROR, "application/json"
            body = _json_bytes({"error": f"{type(exc).__name__}: {exc}"})
        self._send(status, ctype, body)

    def _send(self, status: HTTPStatus, ctype: str, body: bytes, extra: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy",
                         "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} {format % args}")


class ViewServer(ThreadingHTTPServer):
    """The viewer bound to 127.0.0.1 (never another interface); `port=0` picks a free port."""
    daemon_threads = True

    def __init__(self, app: ViewApp, port: int = 0, *, log: Any = None):
        super().__init__(("127.0.0.1", port), _Handler)
        self.app = app
        self.log = log
        self.port = int(self.server_address[1])
        self.hosts = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up (a closed tab, a reload, curl cut short) is routine: nothing is printed
        (one quiet line with `log`); anything else is one line, not the stdlib's traceback per request."""
        exc = sys.exc_info()[1]
        who = client_address[0] if isinstance(client_address, tuple) and client_address else "client"
        if isinstance(exc, ConnectionError | TimeoutError):  # broken pipe, reset, aborted, idle
            if self.log is not None:
                self.log(f"{who} hung up ({type(exc).__name__})")
            return
        line = f"sop view: request from {who} failed: {type(exc).__name__}: {exc}"
        if self.log is not None:
            self.log(line)
        else:
            print(line, file=sys.stderr)

    def start(self) -> ViewServer:
        """Serve in a background thread (tests, notebooks); `close()` stops it."""
        self._thread = threading.Thread(target=self.serve_forever, name="sop-view", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()
        self.app.close()


def serve(paths: Sequence[str | Path], port: int = 0, *, log: Any = None) -> ViewServer:
    """A viewer over the runs found in `paths`, bound and ready (call `serve_forever()` or `start()`)."""
    runs, notes = find_runs(paths)
    return ViewServer(ViewApp(runs, notes), port, log=log)
