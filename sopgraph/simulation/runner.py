"""Orchestration: run dialogues (case × trial) concurrently, judge them, store everything; resume; re-judge.

Why this shape: the runner is a pure function of (scenario, cases, config) → records in a run store,
so that a killed run can be resumed from the store alone and a shard of cases could be run anywhere.

- One dialogue = one case × one trial, id `"<case id>#<trial>"`.
- Concurrency: the gateway's semaphore caps model calls in flight (`concurrency`); the runner keeps
  about twice as many dialogues open so the cap stays saturated.
- Each finished agent turn is committed in its own transaction; a dialogue's judgments, consensus
  and final status are committed together, so `done` always means "transcript and default judgment
  set complete".
- An `InfraFailure` (the gateway gave up on the agent or the user simulator) marks the dialogue
  `infra_failure`: its partial turns are dropped, the error is kept, it is excluded from scores and
  re-tried on resume. It is never counted as a model failure. A judge whose model cannot be had
  (`judge.lost_to_infra`) makes the dialogue an infra failure that keeps its transcript
  (`judging_failed`): a resume judges it again without running it. A judge's malformed answers are
  a verdict, not an outage: that judgment is unscored (see `judge.py`).
- Resume (`resume=True`): the stored config, scenario, cases and models are used; `done` dialogues
  are skipped; those whose judging alone failed are judged again; every other dialogue (pending,
  running — e.g. after SIGKILL — or infra_failure) is restarted from scratch, its partial rows deleted
  in one transaction first (the usage of its earlier attempt, written call by call, is kept and marked
  discarded). So after any crash and
  resume, every dialogue is present exactly once.
- Re-judging (`rejudge`) reads stored transcripts and writes a new judgment set beside the others;
  agents and users are never called.
- Worker processes (`workers=N`, opt-in): the dialogues to run are dealt round-robin to N processes,
  each with its own event loop and gateway (concurrency/N). Workers never open the store: they send
  every write (start, turn, finish, fail) through a pipe to the parent, the single SQLite writer, in
  the order they happened (in batches, see `_PipeSink`). Per dialogue the writes are the same as in
  one process, so resume and "every dialogue exactly once" hold unchanged. Why: litellm costs ~2 ms CPU per call, so one
  process saturates one core long before a fast model does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_connections
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from sopgraph.cases.validate import CaseFileError, check_cases, complete_case, read_case_lines
from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.language.diagnostics import SopError
from sopgraph.language.schema import agent_output_schema
from sopgraph.logic.budget import LOAD_CPU_BUDGET
from sopgraph.logic.checker import load
from sopgraph.records import Case, Dialogue, Turn
from sopgraph.simulation import distributed
from sopgraph.simulation.agents import TOOLS_PREFIX, AgentError, ToolAgent, agent_kind
from sopgraph.simulation.dialogue import (
    DialogueSetup,
    SimState,
    scenario_context,
    simulate_dialogue,
    without_paths,
)
from sopgraph.simulation.environment import EnvError, EnvSpec
from sopgraph.simulation.gateway import (
    Gateway,
    InfraFailure,
    InlinePreparationExecutor,
    ModelOptionError,
    ModelSpec,
    RoleSet,
    load_litellm,
    network_used,
    preflight_message,
    redact,
    roles_from_options,
    warm_up_litellm,
)
from sopgraph.simulation.gateway import preflight as check_models
from sopgraph.simulation.judge import (
    DEFAULT_JUDGE_TURNS,
    INFRA_FAILURE,
    Ensemble,
    JudgeTurns,
    LLMJudge,
    judge_turns_text,
    judgment_usage_rows,
    lost_to_infra,
    parse_judge_turns,
)
from sopgraph.simulation.prompts import (
    agent_system_prompt,
    agent_tools_prompt,
    guided_final_prompt,
    guided_stage_prompt,
    user_system_prompt,
)
from sopgraph.simulation.providers import ORACLE_MODELS, SOP_CONTEXT_KEY, guided_inner
from sopgraph.simulation.store import REDACTED, TOOL_VERSION, RunStore, StoreError, redact_params

DEFAULT_SET = "default"


class RunError(Error):
    """A user-facing problem with a run's inputs (bad cases file, unresumable run, ...)."""


class RunSummary(BaseModel):
    """What a `run`/`rejudge` call did and what the run directory now holds."""
    run_dir: str
    dialogues: int = 0
    by_status: dict[str, int] = Field(default_factory=dict)
    end_reasons: dict[str, int] = Field(default_factory=dict)
    turns: int = 0
    format_errors: int = 0
    infra_failures: int = 0
    infra_errors: list[dict[str, Any]] = Field(default_factory=list)
    judgment_sets: dict[str, Any] = Field(default_factory=dict)
    tokens: int = 0
    cost: float = 0.0
    cost_known: bool = True
    ran: int = 0  # dialogues run (or judged) by this call
    skipped: int = 0  # dialogues already finished before this call
    elapsed_s: float = 0.0
    self_preference: list[str] = Field(default_factory=list)  # judge roles using the agent's model
    unjudged: list[dict[str, Any]] = Field(default_factory=list)
    """`sop judge`: dialogues whose judging was lost to infrastructure (judges unreachable) in this call;
    they are not in the set, and running the same `sop judge` again judges them."""
    warnings: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Inputs


def read_cases(path: str | Path, scenario: ir.Scenario | None = None) -> list[Case]:
    """Cases from a JSON Lines file (one `records.Case` per line); errors name the line. Read with
    bounds (`cases.validate.read_case_lines`): a device, pipe or huge line is refused. With the
    `scenario`, a hand-written case (`id`, `truth`, `system`, …) gets what the SOP decides filled in
    (`cases.validate.complete_case`)."""
    path = Path(path)
    cases: list[Case] = []
    try:
        for lineno, line in read_case_lines(path):
            try:
                if scenario is None:
                    cases.append(Case.model_validate_json(line))
                else:
                    cases.append(Case.model_validate(complete_case(scenario, json.loads(line))))
            except RecursionError:
                raise RunError(f"{path}:{lineno}: invalid case: nested too deeply") from None
            except ValueError as exc:
                first = exc.errors()[0] if hasattr(exc, "errors") else {"msg": str(exc), "loc": ()}
                where = ".".join(str(x) for x in first.get("loc", ()))
                raise RunError(f"{path}:{lineno}: invalid case{' at ' + where if where else ''}: "
                               f"{first['msg']}") from None
    except CaseFileError as exc:
        raise RunError(str(exc)) from None
    if not cases:
        raise RunError(f"{path}: no cases")
    return cases


def _check_cases(scenario: ir.Scenario, cases: Sequence[Case], source: str = "cases") -> list[str]:
    """Refused at the start of a run: duplicate ids, and any case that does not fit the scenario
    (`cases.validate.check_cases`: domains, ranges, expected path re-decided, schema version)."""
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise RunError(f"duplicate case id {case.id!r}")
        seen.add(case.id)
    try:
        return check_cases(scenario, cases, source=source)
    except CaseFileError as exc:
        raise RunError(str(exc)) from None


def normalize_models(models: Any) -> Any:
    """A RoleSet from a RoleSet, a role → ModelSpec mapping, or `--model` option strings/specs."""
    if isinstance(models, RoleSet):
        return models
    if isinstance(models, Mapping):
        specs = []
        for role, spec in models.items():
            if isinstance(spec, str):
                specs.append(f"{role}={spec}")
            else:
                specs.append(spec if spec.role == role else spec.with_role(role))
        return roles_from_options(specs)
    return roles_from_options(list(models or []))


def _models_meta(roles: Any) -> dict[str, Any]:
    out = {"agent": roles.agent, "user": roles.user}
    out.update({spec.role: spec for spec in roles.judges})
    return {role: redact_params(spec.model_dump(mode="json")) for role, spec in out.items() if spec is not None}


def _contains_redacted(obj: Any) -> bool:
    if isinstance(obj, Mapping):
        return any(_contains_redacted(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_contains_redacted(v) for v in obj)
    return obj == REDACTED


def _roles_from_meta(models: Mapping[str, Any]) -> Any:

    specs = {}
    for role, dump in models.items():
        if _contains_redacted(dump):
            raise RunError(f"the {role} model's parameters held a secret that was not stored; "
                           "start a new run (pass keys through the environment, e.g. api_key_env=VAR)")
        specs[role] = ModelSpec.model_validate(dump)
    return RoleSet(agent=specs.get("agent"), user=specs["user"],
                   judges=(specs["judge1"], specs["judge2"], specs["judge3"]))


def _self_preference(roles: Any) -> list[str]:
    if roles.agent is None:
        return []
    return [j.role for j in roles.judges if j.model == roles.agent.model]


# ---------------------------------------------------------------------------------------------
# Progress


ProgressMode = bool | str | None
"""`auto` (None): a bar when stderr is a terminal, else nothing; `always` (True): a bar on a terminal,
else one plain line per update (for logs: nohup, redirects, CI); `never` (False): nothing."""


def progress_mode(progress: ProgressMode) -> str:
    """`bar`, `plain` or `off` for a `progress` argument (bool, None or auto/always/never)."""
    if isinstance(progress, str):
        if progress not in ("auto", "always", "never"):
            raise RunError(f"progress must be auto, always or never, not {progress!r}")
        progress = {"auto": None, "always": True, "never": False}[progress]
    tty = sys.stderr.isatty()
    if progress is None:
        return "bar" if tty else "off"
    if not progress:
        return "off"
    return "bar" if tty else "plain"


class _Progress:
    """Progress on stderr: dialogues done of total, failures, tokens and cost.

    A rich bar on a terminal; for logs, plain lines (one per finished dialogue, and one at most every
    `PLAIN_EVERY` seconds while tokens move). Tokens and cost update after every model call (`tick`),
    not only when a dialogue finishes. A call being retried says so (`retrying`): on the bar until a call
    answers, in logs as a line (at most one per `RETRY_EVERY` seconds for the same model, server and attempt: 64 calls
    waiting out one outage say it once per round)."""
    PLAIN_EVERY = 5.0
    RETRY_EVERY = 1.0

    def __init__(self, total: int, mode: str, label: str):
        self.mode, self.total, self.label = mode, total, label
        self.enabled = mode != "off"
        self.done = self.failures = self.tokens = 0
        self.cost = 0.0
        self._started = self._last_line = time.monotonic()
        self._printed: tuple[int, int] | None = None
        self._bar: Any = None
        self._retry_key, self._retry_at, self._noted = "", 0.0, False
        if mode != "bar":
            return
        from rich.console import Console  # heavy import, only for a terminal bar
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("fail {task.fields[failures]}"), TextColumn("{task.fields[tokens]} tok"),
            TextColumn("${task.fields[cost]}"), TimeElapsedColumn(), TextColumn("{task.fields[note]}", markup=False),
            console=Console(stderr=True), transient=False,
        )
        self._task = self._bar.add_task(label, total=total, failures=0, tokens=0, cost="0.00", note="")
        self._bar.start()

    def advance(self, gateway: Any, failed: bool = False) -> None:
        """One more dialogue finished; totals from `gateway.stats`."""
        if not self.enabled:
            return
        stats = gateway.stats
        self.advance_totals(stats.prompt_tokens + stats.completion_tokens, stats.cost, failed)

    def advance_totals(self, tokens: int, cost: float, failed: bool = False) -> None:
        """One more dialogue finished, with running token and cost totals."""
        if not self.enabled:
            return
        self.done += 1
        self.failures += failed
        self.tick_totals(tokens, cost, force=True)

    def tick(self, gateway: Any) -> None:
        """A model call finished: refresh tokens and cost (a gateway listener)."""
        if self.enabled:
            stats = gateway.stats
            self.tick_totals(stats.prompt_tokens + stats.completion_tokens, stats.cost)

    def retrying(self, line: str) -> None:
        """A call is being retried (a gateway retry listener): `retrying ROLE at API_BASE (attempt k/n, …)`."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._noted = True
            self._bar.update(self._task, note=line)
            return
        now, key = time.monotonic(), line.split(", next in", 1)[0]  # the model, the server and the attempt
        if key != self._retry_key or now - self._retry_at >= self.RETRY_EVERY:
            self._retry_key, self._retry_at = key, now
            sys.stderr.write(f"[sop] {line}\n")
            sys.stderr.flush()

    def tick_totals(self, tokens: int, cost: float, force: bool = False) -> None:
        if not self.enabled:
            return
        self.tokens, self.cost = tokens, cost
        if self._bar is not None:
            note: dict[str, str] = {"note": ""} if self._noted else {}  # a call answered: the retry note is over
            self._noted = False
            self._bar.update(self._task, completed=self.done, failures=self.failures, tokens=tokens,
                             cost=f"{cost:.4f}", **note)
            return
        now = time.monotonic()
        if force or (now - self._last_line >= self.PLAIN_EVERY and self._printed != (self.done, tokens)):
            self._line(now)

    def relabel(self, label: str) -> None:
        """Change the label (e.g. to show per-node throughput)."""
        self.label = label
        if self._bar is not None:
            self._bar.update(self._task, description=label)

    def _line(self, now: float) -> None:
        self._last_line, self._printed = now, (self.done, self.tokens)
        elapsed = int(now - self._started)
        pct = f" ({100 * self.done // self.total}%)" if self.total else ""
        sys.stderr.write(f"[sop] {self.label}: {self.done}/{self.total}{pct} done, {self.failures} failed, "
                         f"{self.tokens:,} tokens (all roles), ${self.cost:.4f}, "
                         f"{elapsed // 60}:{elapsed % 60:02d} elapsed\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.mode == "plain" and self._printed != (self.done, self.tokens):
            self._line(time.monotonic())


# ---------------------------------------------------------------------------------------------
# Running


def _make_gateway(concurrency: int, options: Mapping[str, Any]) -> Any:

    return Gateway(concurrency=concurrency, **dict(options))


def _summary(store: RunStore, **extra: Any) -> RunSummary:
    s = store.summary()
    return RunSummary(
        run_dir=s["run_dir"], dialogues=s["dialogues"], by_status=s["by_status"], end_reasons=s["end_reasons"],
        turns=s["turns"], format_errors=s["format_errors"], infra_failures=len(s["infra_failures"]),
        infra_errors=s["infra_failures"], judgment_sets=s["judgment_sets"], tokens=s["tokens"],
        cost=s["cost"], cost_known=s["cost_known"], **extra,
    )


async def run(
    scenario_path: str | Path | ir.Scenario | None,
    cases_path: str | Path | Sequence[Case] | None,
    models: Any,
    out_dir: str | Path,
    *,
    trials: int = 1,
    concurrency: int = 8,
    max_turns: int = 15,
    judge_turns: JudgeTurns | str | None = DEFAULT_JUDGE_TURNS,
    structured: bool = False,
    resume: bool = False,
    progress: ProgressMode = None,
    gateway: Any = None,
    gateway_options: Mapping[str, Any] | None = None,
    workers: int = 1,
    preflight: bool = True,
    ray: str | None = None,
    env: str | None = None,
    loaded: ir.Scenario | None = None,
) -> RunSummary:
    """Run (or resume) an evaluation into `out_dir` and return its summary.

    `models`: a RoleSet, a role → ModelSpec mapping or `--model` strings (defaults: user
    `scripted/user`, judges 3 × `scripted/truth`). With `resume=True` only `out_dir` matters: the
    stored config is used (`concurrency`, `progress`, `gateway`, `workers` may still be given).
    `workers > 1` runs the dialogues in that many processes (concurrency split between them; see the
    module docstring); it cannot be combined with a `gateway` instance. `preflight` makes one call per
    distinct non-built-in model before anything is created (see `gateway.preflight`): a missing key,
    an unknown provider or an unreachable server is a `RunError` at once, and a server that rejects
    `json_schema` structured output is switched to `json_object` (noted in the run). `ray`: run the
    dialogues on Ray (`local` starts an instance on this machine, with `workers` CPUs if > 1; else the
    address of a cluster to join; see `_execute_ray`). `env`: `python:MODULE:FACTORY`, the environment a
    tool-acting agent acts on instead of the case-scripted backend (docs/environments.md; kept for resume).
    `loaded`: the caller's checked load of `scenario_path` (not loaded twice; the path kept for resume)."""
    started = time.perf_counter()
    progress_mode(progress)  # a bad value is refused before anything starts
    if workers < 1:
        raise RunError("workers must be >= 1")
    if workers > 1 and gateway is not None:
        raise RunError("a gateway instance cannot be shared with worker processes; pass gateway_options")
    if ray is not None and gateway is not None:
        raise RunError("a gateway instance cannot be shared with Ray tasks; pass gateway_options")
    if ray is not None:
        try:
            distributed.check(ray)  # not installed, or no cluster there: one line, before anything is created
        except distributed.DistributedError as exc:
            raise RunError(str(exc)) from None
    out_dir = Path(out_dir)
    warnings: list[str] = []
    notes: list[str]
    if resume:
        try:
            store = RunStore.open(out_dir)
        except StoreError as exc:
            raise RunError(str(exc)) from None
        meta = store.meta()
        config = meta.get("config") or {}
        try:
            scenario = store.scenario()
        except StoreError as exc:
            raise RunError(str(exc)) from None
        roles = _roles_from_meta(meta.get("models") or {})
        env = config.get("env")
        try:
            _check_agent(roles, scenario)
            _check_env(env, roles, scenario, store.cases()[:1])
        except RunError:
            store.close()
            raise
        if preflight:
            try:
                roles, notes = await _preflight(roles, gateway, config.get("gateway") or {}, workers,
                                                progress_mode(progress))
            except RunError:
                store.close()
                raise
            warnings += notes
        trials = int(config.get("trials", 1))
        max_turns = int(config.get("max_turns", 15))
        spec = parse_judge_turns(config.get("judge_turns"))
        structured = bool(config.get("structured", False))
        gateway_options = config.get("gateway") or {}
    else:
        if trials < 1 or max_turns < 1 or concurrency < 1:
            raise RunError("trials, max-turns and concurrency must be >= 1")
        scenario = scenario_path if isinstance(scenario_path, ir.Scenario) else loaded or _load(scenario_path)
        cases = (list(cases_path) if isinstance(cases_path, Sequence) and not isinstance(cases_path, str)
                 else read_cases(cases_path, scenario))  # type: ignore[arg-type]
        warnings += _check_cases(scenario, cases, str(cases_path) if isinstance(cases_path, str | Path)
                                 else "cases")
        try:
            roles = normalize_models(models)
        except ModelOptionError as exc:
            raise RunError(str(exc)) from None
        try:
            spec = parse_judge_turns(judge_turns)
        except ValueError as exc:
            raise RunError(str(exc)) from None
        gateway_options = dict(gateway_options or {})
        _check_agent(roles, scenario)  # a python: agent that does not load: refused before anything is created
        _check_env(env, roles, scenario, cases[:1])  # nor does an environment that does not load or lacks a method
        if structured and roles.agent is not None and not roles.agent.structured:
            roles = roles.model_copy(update={"agent": roles.agent.model_copy(update={"structured": True})})
        notes = []
        if preflight:
            roles, notes = await _preflight(roles, gateway, gateway_options, workers, progress_mode(progress))
        warnings += notes
        config = {
            "scenario_path": None if isinstance(scenario_path, ir.Scenario) else str(scenario_path),
            "cases_path": str(cases_path) if isinstance(cases_path, str | Path) else None,
            "trials": trials, "concurrency": concurrency, "max_turns": max_turns,
            "judge_turns": judge_turns_text(spec), "structured": structured, "gateway": gateway_options,
            **({"env": env} if env is not None else {}),  # (absent otherwise: stored as before)
        }
        models_meta = _models_meta(roles)
        meta = {
            "config": config, "models": models_meta, "sop_hash": scenario.source_hash,
            "scenario_name": scenario.name, "scenario": scenario.model_dump(mode="json"),
            "agent_model": roles.agent.model if roles.agent else None,
            "judgment_sets": {DEFAULT_SET: {"models": {r: models_meta[r]["model"] for r in
                                                       ("judge1", "judge2", "judge3")},
                                            "judge_turns": judge_turns_text(spec)}},
            "notes": notes,
        }
        try:
            store = RunStore.create(out_dir, meta)
        except StoreError as exc:
            raise RunError(str(exc)) from None
        store.add_cases(cases)
        names = {"agent": roles.agent.model, "user": roles.user.model,
                 **{j.role: j.model for j in roles.judges}}
        store.add_dialogues(
            Dialogue(sop_hash=scenario.source_hash, id=f"{c.id}#{t}", case_id=c.id, trial=t, models=names,
                     tool_version=TOOL_VERSION)
            for c in cases for t in range(trials)
        )
    assert roles.agent is not None  # _check_agent
    if structured and not roles.agent.structured:
        roles = roles.model_copy(update={"agent": roles.agent.model_copy(update={"structured": True})})
    selfpref = _self_preference(roles)
    if selfpref:
        warnings.append(f"self-preference risk: {', '.join(selfpref)} use the agent's model {roles.agent.model}")
    try:
        return await _execute(store, scenario, roles, spec, max_turns=max_turns, concurrency=concurrency,
                              progress=progress, gateway=gateway, gateway_options=gateway_options,
                              started=started, warnings=warnings, selfpref=selfpref, workers=workers,
                              ray=ray, env=env)
    finally:
        store.close()


def _check_env(env: str | None, roles: RoleSet, scenario: ir.Scenario, sample: Sequence[Case]) -> None:
    """RunError when `--env` is given for an agent that does not act through tools, or the environment
    does not load or lacks a method (checked on the first case, before anything is created)."""
    if env is None:
        return
    assert roles.agent is not None
    if agent_kind(roles.agent.model) in ("sage", "guided"):
        raise RunError(f"--env: the agent {roles.agent.model} does not act through tools; an environment "
                       "serves an agent acting through tools (tools:MODEL, http://…, python:…)")
    try:
        loaded = EnvSpec.load(env, scenario)
        for case in sample:
            loaded.for_case(case)
    except EnvError as exc:
        raise RunError(str(exc)) from None


def _check_agent(roles: RoleSet, scenario: ir.Scenario) -> None:
    """RunError when there is no agent, or a `python:`/`tools:` agent cannot be set up (a module or
    function that does not load)."""
    if roles.agent is None:
        raise RunError("no agent model: pass --model agent=PROVIDER/MODEL")
    if agent_kind(roles.agent.model) in ("python", "tools"):
        try:
            ToolAgent(roles.agent.model, scenario, model_spec=roles.agent)
        except AgentError as exc:
            raise RunError(str(exc)) from None


def _http_agent_problem(roles: RoleSet, timeout: float = 5.0) -> str | None:
    """For an HTTP agent: None when a TCP connection to its host and port opens, else one line saying
    why not. Why: an agent server that is not running made every dialogue an infrastructure failure (a
    run directory full of them, exit 3); the preflight checks the litellm models, and this the agent.
    A blocking connect (before the run starts), so that no resolver thread is left in a process that
    forks workers."""
    url = roles.agent.model if roles.agent is not None else ""
    if agent_kind(url) != "http":
        return None
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"agent {url}: {exc}"
    try:
        socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
    except OSError as exc:
        why = str(exc) or type(exc).__name__
        return f"agent {url}: cannot connect to {parts.hostname}:{port} ({why}); is the agent server running?"
    return None


def _litellm_specs(roles: RoleSet) -> list[ModelSpec]:
    """The roles' models that are called through litellm: not built-ins, not http/python agents (a
    `tools:` agent's model is checked without its prefix, and so is the model the guided baseline wraps)."""
    out = []
    for s in roles.all():
        inner = guided_inner(s.model)
        if inner is not None:
            s = s.model_copy(update={"model": inner, "structured": False})
        kind = agent_kind(s.model)
        if kind == "tools":
            s = s.model_copy(update={"model": s.model.removeprefix(TOOLS_PREFIX), "structured": False})
        if not s.is_builtin and kind in ("sage", "tools"):
            out.append(s)
    return out


def _retry_printer(mode: str) -> Callable[[str], None] | None:
    """For the model check (before any progress display): each retry as a line on stderr, unless silent."""
    if mode == "off":
        return None

    def say(line: str) -> None:
        sys.stderr.write(f"[sop] model check: {line}\n")
        sys.stderr.flush()

    return say


async def _preflight(roles: RoleSet, gateway: Any, options: Mapping[str, Any],
                     workers: int = 1, mode: str = "off") -> tuple[RoleSet, list[str]]:
    """Check every distinct non-built-in model with one call; (roles, notes) or `RunError` (one line).

    With worker processes to fork, the check runs in a forked child of its own: this process then
    holds no HTTP client or thread, so the workers can still be forked (see `_mp_context`). An HTTP
    agent is checked first, by connecting to it (`_http_agent_problem`)."""
    problem = _http_agent_problem(roles)
    if problem is not None:
        raise RunError(f"model check failed, nothing was run: {problem}")
    if not _litellm_specs(roles):
        return roles, []
    if workers > 1 and gateway is None and _mp_context().get_start_method() == "fork":
        warm_up_litellm()  # litellm's first-call work, once, inherited by the checking child and the workers
        return await _preflight_in_child(roles, options, mode)
    return await _preflight_here(roles, gateway, options, mode)


async def _preflight_in_child(roles: RoleSet, options: Mapping[str, Any], mode: str) -> tuple[RoleSet, list[str]]:
    ctx = _mp_context()
    load_litellm()  # imported once here, inherited by the checking child and later by the workers
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_preflight_child_main, args=(writer, roles, dict(options), mode),
                       name="sop-run-preflight", daemon=True)
    proc.start()
    writer.close()
    try:
        while not reader.poll(0):  # no thread (it would rule out forking the workers): poll and sleep
            if not proc.is_alive() and not reader.poll(0):
                raise RunError(f"the model check died (exit code {proc.exitcode})")
            await asyncio.sleep(0.02)
        kind, payload = reader.recv()
    except EOFError:
        raise RunError("the model check ended without an answer") from None
    finally:
        reader.close()
        proc.join(10)
    if kind == "error":
        raise RunError(payload)
    return payload


def _preflight_child_main(conn: Connection, roles: RoleSet, options: dict[str, Any], mode: str = "off") -> None:
    """Entry point of the forked model-check process: `("ok", (roles, notes))` or `("error", line)`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        conn.send(("ok", asyncio.run(_preflight_here(roles, None, options, mode))))
    except RunError as exc:
        conn.send(("error", str(exc)))
    except BaseException:  # noqa: BLE001 - reported to the parent as a RunError
        conn.send(("error", redact(traceback.format_exc(limit=5))))
    finally:
        conn.close()


async def _preflight_here(roles: RoleSet, gateway: Any, options: Mapping[str, Any],
                          mode: str = "off") -> tuple[RoleSet, list[str]]:
    own = gateway is None
    gw = _make_gateway(8, {**options, "cache": False}) if own else gateway
    say = _retry_printer(mode)
    if say is not None and hasattr(gw, "add_retry_listener"):
        gw.add_retry_listener(say)
    try:
        failures = await check_models(gw, _litellm_specs(roles))
    finally:
        if say is not None and hasattr(gw, "remove_retry_listener"):
            gw.remove_retry_listener(say)
        if own:
            await gw.aclose()
    if failures:
        raise RunError("model check failed, nothing was run: "
                       + "; ".join(dict.fromkeys(preflight_message(f) for f in failures)))
    notes = list(dict.fromkeys(gw.notes))
    agent = roles.agent
    if agent is not None and agent.structured and agent.structured_mode == "auto" and gw.uses_json_object(agent):
        roles = roles.model_copy(update={"agent": agent.model_copy(update={"structured_mode": "json_object"})})
    return roles, notes


def _load(path: str | Path | None) -> ir.Scenario:

    if path is None:
        raise RunError("no scenario file given")
    try:
        # running needs no flow proofs (`sop check` does them); the load-time checks get the budget of a
        # command that only loads (`sop run` has checked the file once already, within its own)
        return load(path, flow=False, cpu_budget=LOAD_CPU_BUDGET)
    except SopError as exc:
        raise RunError(f"{path}: the SOP has errors:\n{exc.render()}") from None
    except OSError as exc:
        raise RunError(f"cannot read {path}: {exc.strerror or exc}") from None


class _Dialogues:
    """Runs single dialogues (simulate, then judge) and reports every write to a sink.

    The sink has the `RunStore` write methods (`start_dialogue`, `add_turn`, `add_usage`, `finish_dialogue`,
    `fail_dialogue`, `restart_judging`) and `add_call` (one call's usage row): batched into the store in one
    process (`GroupCommit`), into a pipe to the parent in a worker (`_PipeSink`)."""
    def __init__(self, scenario: ir.Scenario, cases: Mapping[str, Case], roles: Any, spec: JudgeTurns,
                 max_turns: int, gateway: Any, kept: Mapping[str, list[Turn]] | None = None,
                 env: str | None = None):

        self._agent_prompt: Callable[[ir.Scenario, Mapping[str, Any]], str] = agent_system_prompt
        self._user_prompt = user_system_prompt
        self.scenario, self.cases, self.roles, self.spec = scenario, cases, roles, spec
        self.max_turns, self.gateway = max_turns, gateway
        self.kept = dict(kept or {})  # dialogue id → its stored transcript, to be judged again (`_judge_again`)
        self.info = scenario_context(scenario)
        self.judge_info = without_paths(self.info)
        self.schema = agent_output_schema(scenario) if roles.agent.structured else None
        self.ensemble = Ensemble([LLMJudge(j, gateway) for j in roles.judges])
        self.prompts: dict[str, tuple[str, str]] = {}
        kind = agent_kind(roles.agent.model)
        # the oracles step the SOP's engine session: they are handed the scenario (SOP_CONTEXT_KEY)
        self.agent_context = ({SOP_CONTEXT_KEY: scenario.model_dump_json()}
                              if roles.agent.model.removeprefix(TOOLS_PREFIX) in ORACLE_MODELS else {})
        self.env = EnvSpec.load(env, scenario) if env is not None else None
        self.tool_agent = (ToolAgent(roles.agent.model, scenario, model_spec=roles.agent)
                           if kind not in ("sage", "guided") else None)
        if kind == "tools":  # one prompt for every case: the values come from the backend's lookup tool
            tools_prompt = agent_tools_prompt(scenario)
            self._agent_prompt = lambda _scenario, _system: tools_prompt
        elif kind in ("http", "python"):  # their requests carry no system prompt (docs/agents.md)
            self._agent_prompt = lambda _scenario, _system: ""

    def setup_for(self, d: Dialogue) -> DialogueSetup:
        case = self.cases[d.case_id]
        if case.id not in self.prompts:
            self.prompts[case.id] = (self._agent_prompt(self.scenario, case.system),
                                     self._user_prompt(case, self.scenario))
        agent_sys, user_sys = self.prompts[case.id]
        return DialogueSetup(scenario=self.scenario, case=case, dialogue_id=d.id, trial=d.trial,
                             agent_system=agent_sys, user_system=user_sys, scenario_info=self.info,
                             response_schema=self.schema, sop_hash=self.scenario.source_hash,
                             tool_version=TOOL_VERSION, tool_agent=self.tool_agent,
                             agent_context=self.agent_context,
                             guided_prompts=(guided_stage_prompt, guided_final_prompt), env=self.env)

    async def one(self, d: Dialogue, sink: Any) -> bool:
        """Run dialogue `d` from scratch (or, when its transcript was kept, judge it again); True if it
        ended as an infrastructure failure."""
        kept = self.kept.get(d.id)
        if kept is not None:
            return await self._judge_again(d, kept, sink)
        setup = self.setup_for(d)
        d = d.model_copy(update={"status": "running", "end_reason": None, "turns": 0, "error": None,
                                 "closing_user_text": None, "sop_hash": self.scenario.source_hash,
                                 "tool_version": TOOL_VERSION})
        sink.start_dialogue(d)
        self._record_calls_in(sink)
        state = SimState(on_usage=sink.add_call)
        try:
            result = await simulate_dialogue(self.gateway, self.roles.agent, self.roles.user, setup,
                                             max_turns=self.max_turns, on_turn=sink.add_turn, state=state)
            judgments, cons = await self.ensemble.judge_dialogue(
                self.scenario, setup.case, d.id, result.turns, self.spec, judgment_set=DEFAULT_SET,
                scenario_info=self.judge_info)
        except InfraFailure as exc:
            failed = d.model_copy(update={"status": "infra_failure", "end_reason": "infra_failure",
                                          "turns": 0, "error": exc.message})
            sink.fail_dialogue(failed)
            return True
        done = d.model_copy(update={"status": "done", "end_reason": result.end_reason,
                                    "turns": len(result.turns), "closing_user_text": result.closing_user_text})
        return self._finish(done, judgments, cons, sink)

    async def _judge_again(self, d: Dialogue, turns: Sequence[Turn], sink: Any) -> bool:
        """Judge a dialogue whose judging was lost to infrastructure from its stored transcript (the agent
        and the user are not called again)."""
        sink.restart_judging(d.id, DEFAULT_SET)
        self._record_calls_in(sink)
        judgments, cons = await self.ensemble.judge_dialogue(
            self.scenario, self.cases[d.case_id], d.id, turns, self.spec, judgment_set=DEFAULT_SET,
            scenario_info=self.judge_info)
        done = d.model_copy(update={"status": "done", "error": None})
        return self._finish(done, judgments, cons, sink)

    def _record_calls_in(self, sink: Any) -> None:
        """Each judge call's usage goes to `sink` as it returns, like the agent's and the user's (so the
        usage of a dialogue still open at a crash is in the store, marked discarded once it is redone)."""
        for judge in self.ensemble.judges:
            if isinstance(judge, LLMJudge):
                judge.on_usage = sink.add_call

    @staticmethod
    def _finish(done: Dialogue, judgments: list[Any], cons: list[Any], sink: Any) -> bool:
        """Store a finished dialogue: `done`, or — when judgments were lost to infrastructure (the judges'
        server down past the retries) — an infrastructure failure that keeps its transcript, so that
        `--resume` judges it again without running it again. True if it failed."""
        lost = lost_to_infra(judgments)
        if lost:
            why = (lost[0].unscored_reason or "").removeprefix(INFRA_FAILURE)
            done = done.model_copy(update={"status": "infra_failure", "error": (
                f"judging: {len(lost)} of {len(judgments)} judgments lost ({why}); the transcript is kept and "
                "`sop run --resume` judges it again")})
        sink.finish_dialogue(done, judgments, cons)
        return bool(lost)

    async def run_all(self, todo: Sequence[Dialogue], sink: Any, concurrency: int,
                      on_done: Any = None) -> None:
        """Run `todo` in order, keeping about 2 × concurrency dialogues open."""
        queue = list(reversed(todo))
        if self.tool_agent is not None:
            self.tool_agent.limit(concurrency)

        async def worker() -> None:
            while queue:
                failed = await self.one(queue.pop(), sink)
                if on_done is not None:
                    on_done(failed)

        try:
            await asyncio.gather(*(worker() for _ in range(min(len(todo), max(2 * concurrency, 4)))))
        finally:
            if self.tool_agent is not None:
                await self.tool_agent.aclose()


class _BatchedWrites:
    """Dialogue writes queued in the order they are made and handed on in groups (`_apply`): one group
    per `MAX_WRITES` writes or `MAX_DELAY` seconds, whichever comes first. A group that fails when the
    timer hands it on is re-raised by the next write or the final `flush`, never lost in a callback."""

    MAX_WRITES: int
    MAX_DELAY: float

    def __init__(self) -> None:
        self._writes: list[tuple[str, tuple[Any, ...]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._error: BaseException | None = None

    def _apply(self, writes: list[tuple[str, tuple[Any, ...]]]) -> None:
        raise NotImplementedError

    def _add(self, name: str, *args: Any) -> None:
        if self._error is not None:  # a timed flush failed: stop the run instead of losing writes
            raise self._error
        self._writes.append((name, args))
        if len(self._writes) >= self.MAX_WRITES:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.MAX_DELAY, self._timed_flush)

    def _timed_flush(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - re-raised by the next write or the final flush
            self._error = exc

    def flush(self) -> None:
        """Hand on the pending writes (one group)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        writes, self._writes = self._writes, []
        if writes:
            self._apply(writes)
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def start_dialogue(self, dialogue: Dialogue) -> None:
        self._add("start_dialogue", dialogue)

    def add_turn(self, turn: Any, usage: Iterable[Mapping[str, Any]] = ()) -> None:
        self._add("add_turn", turn, list(usage))

    def finish_dialogue(self, dialogue: Dialogue, judgments: Iterable[Any] = (), consensus: Iterable[Any] = (),
                        usage: Iterable[Mapping[str, Any]] = ()) -> None:
        self._add("finish_dialogue", dialogue, list(judgments), list(consensus), list(usage))

    def fail_dialogue(self, dialogue: Dialogue, usage: Iterable[Mapping[str, Any]] = ()) -> None:
        self._add("fail_dialogue", dialogue, list(usage))

    def restart_judging(self, dialogue_id: str, judgment_set: str) -> None:
        self._add("restart_judging", dialogue_id, judgment_set)

    def add_usage(self, usage: Iterable[Mapping[str, Any]]) -> None:
        self._add("add_usage", list(usage))

    def add_call(self, row: Mapping[str, Any]) -> None:
        """One model call's usage row, as the call returns (see `SimState.on_usage`)."""
        self._add("add_usage", [row])


class GroupCommit(_BatchedWrites):
    """The store's dialogue writes, applied in the order they are made but committed in groups: one
    transaction per `MAX_WRITES` writes or `MAX_DELAY` seconds, whichever comes first.

    Why: with 64 dialogues in flight a transaction per turn (BEGIN … COMMIT, a WAL append each) was
    about a tenth of the harness's own CPU per turn. Exactly-once is kept: a group is one transaction
    of writes in their original order, so after a kill -9 the store holds a prefix of the writes; a
    dialogue whose `finish_dialogue` was not committed is not done, and a resume runs it again from
    scratch (`start_dialogue` drops its partial turns). Readers (`sop view`, `--resume`) see writes at
    most `MAX_DELAY` late."""

    MAX_WRITES = 64
    MAX_DELAY = 0.05

    def __init__(self, store: RunStore):
        super().__init__()
        self.store = store

    def _apply(self, writes: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Commit the writes (one transaction)."""
        with self.store.transaction():
            for name, args in writes:
                getattr(self.store, name)(*args)


def judging_failed(d: Dialogue) -> bool:
    """Whether `d` is an infrastructure failure of its judging only: its transcript was kept (it ended for a
    reason of its own, with turns), and a resume judges it again instead of running it again."""
    return d.status == "infra_failure" and d.end_reason not in (None, "infra_failure") and d.turns > 0


async def _execute(store: RunStore, scenario: ir.Scenario, roles: Any, spec: JudgeTurns, *, max_turns: int,
                   concurrency: int, progress: ProgressMode, gateway: Any, gateway_options: Mapping[str, Any],
                   started: float, warnings: list[str], selfpref: list[str], workers: int = 1,
                   ray: str | None = None, env: str | None = None) -> RunSummary:
    all_dialogues = store.dialogues()
    todo = [d for d in all_dialogues if d.status != "done"]
    skipped = len(all_dialogues) - len(todo)
    cases = {c.id: c for c in store.cases()}
    kept = {d.id: store.turns(dialogue_id=d.id) for d in todo if judging_failed(d)}
    if ray is not None and todo:  # (nothing left to run: no Ray instance started for nothing)
        await _execute_ray(store, scenario, cases, roles, spec, todo, max_turns=max_turns, concurrency=concurrency,
                           progress=progress, gateway_options=gateway_options, address=ray,
                           num_cpus=workers if workers > 1 else None, kept=kept, env=env)
    elif (workers := min(workers, concurrency, len(todo))) > 1:
        await _execute_sharded(store, scenario, cases, roles, spec, todo, max_turns=max_turns,
                               concurrency=concurrency, workers=workers, progress=progress,
                               gateway_options=gateway_options, kept=kept, env=env)
    else:
        own = gateway is None
        gateway = _make_gateway(concurrency, gateway_options) if own else gateway
        runner = _Dialogues(scenario, cases, roles, spec, max_turns, gateway, kept, env=env)
        bar = _Progress(len(todo), progress_mode(progress), "dialogues")
        listen = getattr(gateway, "add_listener", None)
        if listen is not None:
            listen(bar.tick)
        retries = getattr(gateway, "add_retry_listener", None)
        if retries is not None:
            retries(bar.retrying)
        sink = GroupCommit(store)
        try:
            await runner.run_all(todo, sink, concurrency, lambda failed: bar.advance(gateway, failed))
        finally:
            sink.flush()
            bar.close()
            if listen is not None:
                gateway.remove_listener(bar.tick)
            if retries is not None:
                gateway.remove_retry_listener(bar.retrying)
            if own:
                await gateway.aclose()
        learnt = [n for n in getattr(gateway, "notes", []) if n not in warnings]
        if learnt:
            warnings += learnt
            store.set_meta("notes", [*(store.meta().get("notes") or []), *learnt])
    return _summary(store, ran=len(todo), skipped=skipped, elapsed_s=round(time.perf_counter() - started, 3),
                    self_preference=selfpref, warnings=warnings)


# ---------------------------------------------------------------------------------------------
# Worker processes

_START_METHOD: str | None = None
"""multiprocessing start method for workers; None: `fork` on Linux when it is safe, else `spawn`.

Fork starts a worker in milliseconds with litellm already imported; spawn makes each worker import
sopgraph and litellm again (~2-3 s, ~2.5 s CPU). Fork is safe when this process has no other thread
(whose locks a child would inherit held) and has made no provider call (litellm would hold HTTP
clients whose sockets a child would share). Workers never touch the parent's SQLite connection."""


def _mp_context() -> Any:

    method = _START_METHOD
    if method is None:
        forkable = sys.platform.startswith("linux") and threading.active_count() == 1 and not network_used()
        method = "fork" if forkable else "spawn"
    return multiprocessing.get_context(method)


_WRITES = frozenset({"start_dialogue", "add_turn", "finish_dialogue", "fail_dialogue", "restart_judging",
                     "add_usage"})
_TICK = "tick"
_RETRY = "retry"
_BATCH = "writes"  # a worker's message carrying several writes, in order: [(name, args), ...]


class _PipeSink(_BatchedWrites):
    """A worker's store stand-in: every write goes to the parent, in order, with running totals.

    Writes are sent in batches (one pipe message per `MAX_WRITES` writes or `MAX_DELAY` seconds,
    whichever comes first; what is left when the worker ends is sent before its exit message). Why:
    one message per write woke the parent, a pickle and a pipe round trip per turn; the parent
    commits in groups anyway (`GroupCommit`). Exactly-once is unchanged: the parent applies the
    writes in order and a write lost with a killed worker is one the store never committed."""
    TICK_EVERY = 0.25  # seconds between token updates sent to the parent's progress display
    MAX_WRITES = 32
    MAX_DELAY = 0.02

    def __init__(self, conn: Connection, gateway: Any):
        super().__init__()
        self.conn, self.gateway = conn, gateway
        self._last_tick = 0.0

    def _apply(self, writes: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Send the writes (one message)."""
        self._send(_BATCH, writes)

    def tick(self, _gateway: Any = None) -> None:
        """A model call finished: send the running totals (throttled) so progress moves per call."""
        now = time.monotonic()
        if now - self._last_tick >= self.TICK_EVERY:
            self._last_tick = now
            self._send("tick")

    def retrying(self, line: str) -> None:
        """A call is being retried: tell the parent's progress display at once."""
        self._send(_RETRY, line)

    def _send(self, name: str, *args: Any) -> None:
        stats = self.gateway.stats
        try:
            self.conn.send((name, args, (stats.prompt_tokens + stats.completion_tokens, stats.cost)))
        except OSError:
            # The parent is gone (it held the only read end): stop now, before another model call.
            os._exit(_ORPHANED)


_ORPHANED = 70
"""Exit status of a worker that found its parent gone."""
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int, inherited: Sequence[Connection]) -> None:
    """Make sure a worker never outlives the run's process.

    Why: a worker whose parent was killed (SIGKILL) kept calling the model, unrecorded, and then hung
    on a full pipe. Three guards: (1) close the pipe read ends a forked child inherited (its own and
    earlier workers'), so that once the parent is gone nobody can read and a write fails (EPIPE)
    instead of blocking; (2) on Linux, ask the kernel for SIGKILL when the parent dies
    (PR_SET_PDEATHSIG); (3) elsewhere, and against the race before (2), a thread that watches the
    parent pid."""
    for conn in inherited:
        with contextlib.suppress(OSError):
            conn.close()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(_ORPHANED)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(_ORPHANED)

    threading.Thread(target=watch, name="sop-parent-watch", daemon=True).start()


def _worker_main(conn: Connection, job: dict[str, Any], parent_pid: int = 0,
                 inherited: Sequence[Connection] = ()) -> None:
    """Entry point of a worker process: run its shard, report writes, then `("exit", error)`."""
    # Ctrl-C is the parent's to handle (it stops the workers); a forked worker would otherwise run
    # the parent's asyncio SIGINT handler on a copy of the parent's loop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid:
        _die_with_parent(parent_pid, inherited)
    error = None
    try:
        asyncio.run(in_own_loop(_worker_run(conn, job)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises RunError

        error = redact(traceback.format_exc(limit=20))
    try:
        conn.send(("exit", (error,), None))
    except OSError:
        os._exit(_ORPHANED)
    finally:
        conn.close()


_T = TypeVar("_T")


async def in_own_loop(work: Awaitable[_T]) -> _T:
    """Await `work` in an event loop the caller owns (its `asyncio.run`), set up as sopgraph's own
    processes set theirs: model calls prepare inline where that is CPU only (`InlinePreparationExecutor`).
    For applications (`sop run`, `sop judge`) and worker processes; library calls leave a loop as it is."""
    asyncio.get_running_loop().set_default_executor(InlinePreparationExecutor())
    return await work


async def _worker_run(conn: Connection, job: dict[str, Any]) -> None:
    gateway = _make_gateway(job["concurrency"], job["gateway_options"])
    scenario = ir.Scenario.model_validate(job["scenario"])
    runner = _Dialogues(scenario, job["cases"], job["roles"], job["spec"], job["max_turns"], gateway,
                        job.get("kept"), env=job.get("env"))
    sink = _PipeSink(conn, gateway)
    gateway.add_listener(sink.tick)
    gateway.add_retry_listener(sink.retrying)
    try:
        await runner.run_all(job["todo"], sink, job["concurrency"])
    finally:
        sink.flush()
        await gateway.aclose()


class _Readable:
    """Which worker pipes have something to read. The event loop watches their file descriptors
    (`add_reader`: no thread); where it cannot (Windows' proactor loop), a thread waits on them.

    Why: waiting in a thread (`asyncio.to_thread(multiprocessing.connection.wait, ...)`) cost a
    thread hand-off and a GIL switch per wake-up of the parent, which shares the cores with the workers."""

    def __init__(self, conns: Iterable[Connection]):
        self.loop = asyncio.get_running_loop()
        self.ready: set[Connection] = set()
        self.wake = asyncio.Event()
        self.watched: list[Connection] | None = []
        try:
            for conn in conns:
                self.loop.add_reader(conn.fileno(), self._on_ready, conn)
                self.watched.append(conn)
        except NotImplementedError:
            self.close()
            self.watched = None

    def _on_ready(self, conn: Connection) -> None:
        self.ready.add(conn)
        self.wake.set()

    async def wait(self, conns: Mapping[Connection, int], timeout: float = 1.0) -> list[Connection]:
        """The pipes among `conns` that have data or reached EOF (possibly none, after `timeout` s)."""
        if self.watched is None:  # wait() returns a subset of the objects it is given: here, Connections
            return cast(list[Connection], await asyncio.to_thread(wait_connections, list(conns), timeout))
        if not self.ready:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.wake.wait()
        self.wake.clear()
        ready, self.ready = [c for c in self.ready if c in conns], set()
        return ready

    def forget(self, conn: Connection) -> None:
        """Stop watching `conn` (before it is closed)."""
        if self.watched is not None and conn in self.watched:
            self.watched.remove(conn)
            self.loop.remove_reader(conn.fileno())

    def close(self) -> None:
        for conn in list(self.watched or ()):
            self.forget(conn)


async def _execute_sharded(store: RunStore, scenario: ir.Scenario, cases: Mapping[str, Case], roles: Any,
                           spec: JudgeTurns, todo: Sequence[Dialogue], *, max_turns: int, concurrency: int,
                           workers: int, progress: ProgressMode, gateway_options: Mapping[str, Any],
                           kept: Mapping[str, list[Turn]] | None = None, env: str | None = None) -> None:
    """Run `todo` in `workers` processes; this process applies their writes to the store, in order."""
    ctx = _mp_context()
    if ctx.get_start_method() == "fork":
        warm_up_litellm()  # litellm imported and its first-call work done once here, inherited by every worker
    shards = [list(todo[i::workers]) for i in range(workers)]
    share = [concurrency // workers + (1 if i < concurrency % workers else 0) for i in range(workers)]
    # The scenario travels as its JSON dump (as in the store, for resume): the object may carry a
    # compiled engine, which does not pickle (spawn).
    scenario_dump = scenario.model_dump(mode="json")
    procs: list[Any] = []
    sink = GroupCommit(store)
    conns: dict[Connection, int] = {}
    totals: list[tuple[int, float]] = [(0, 0.0)] * workers
    errors: list[str] = []
    try:
        for i, shard in enumerate(shards):
            reader, writer = ctx.Pipe(duplex=False)
            needed = {d.case_id for d in shard}
            job = {"scenario": scenario_dump, "cases": {k: v for k, v in cases.items() if k in needed},
                   "roles": roles, "spec": spec, "max_turns": max_turns, "concurrency": max(1, share[i]),
                   "todo": shard, "gateway_options": dict(gateway_options), "env": env,
                   "kept": {d.id: (kept or {})[d.id] for d in shard if d.id in (kept or {})}}
            # A forked child inherits every read end this process holds (its own and earlier workers'):
            # it closes them at once. A spawned child inherits only what it is given.
            inherited = [*conns, reader] if ctx.get_start_method() == "fork" else []
            proc = ctx.Process(target=_worker_main, args=(writer, job, os.getpid(), inherited),
                               name=f"sop-run-worker-{i}", daemon=True)
            proc.start()
            writer.close()  # the worker holds the only writing end: EOF when it is gone
            procs.append(proc)
            conns[reader] = i
        bar = _Progress(len(todo), progress_mode(progress), f"dialogues ({workers} workers)")
        exited: set[int] = set()
        pipes = _Readable(conns)
        try:
            while conns:
                for reader in await pipes.wait(conns):
                    i = conns[reader]
                    while True:
                        total: tuple[int, float] | None
                        try:
                            if not reader.poll():
                                break
                            name, args, total = reader.recv()
                        except (EOFError, OSError):
                            name, args, total = "eof", (), None
                        if total is not None:
                            totals[i] = total
                        if name == _TICK:
                            bar.tick_totals(sum(t[0] for t in totals), sum(t[1] for t in totals))
                            continue
                        if name == _RETRY:
                            bar.retrying(args[0])
                            continue
                        if name == "exit":
                            exited.add(i)
                            if args[0]:
                                errors.append(f"worker {i} failed:\n{args[0]}")
                            continue
                        if name == "eof":
                            del conns[reader]
                            pipes.forget(reader)
                            reader.close()
                            if i not in exited:
                                procs[i].join(5)
                                errors.append(f"worker {i} died (exit code {procs[i].exitcode})")
                            break
                        for write, write_args in (args[0] if name == _BATCH else [(name, args)]):
                            if write not in _WRITES:
                                raise RunError(f"worker {i} sent an unknown message {write!r}")
                            getattr(sink, write)(*write_args)
                            if write in ("finish_dialogue", "fail_dialogue"):
                                bar.advance_totals(sum(t[0] for t in totals), sum(t[1] for t in totals),
                                                   failed=write_args[0].status == "infra_failure")
        finally:
            pipes.close()
            sink.flush()
            bar.close()
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(10)
        for reader in conns:
            reader.close()
    if errors:
        raise RunError("; ".join(errors) + " (the run is resumable: sop run --resume RUN_DIR)")


# ---------------------------------------------------------------------------------------------
# Ray (see `distributed.py`: the driver keeps the store, tasks run batches of dialogues)


class _ListSink(_BatchedWrites):
    """A Ray task's store stand-in: the writes, in the order they were made, returned with the batch
    (the same `(write name, args)` pairs `_PipeSink` sends)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = self._writes

    def _add(self, name: str, *args: Any) -> None:
        self._writes.append((name, args))


def _ray_batch(job: Mapping[str, Any],
               payload: tuple[dict[str, Case], list[Dialogue], dict[str, list[Turn]]]) -> dict[str, Any]:
    """A Ray task's body: run a batch of dialogues with a gateway of its own (`job["concurrency"]`
    calls in flight), the same dialogue code worker processes use; the store writes in order."""
    return asyncio.run(in_own_loop(_ray_batch_run(job, *payload)))


async def _ray_batch_run(job: Mapping[str, Any], cases: dict[str, Case], todo: list[Dialogue],
                         kept: dict[str, list[Turn]]) -> dict[str, Any]:
    gateway = _make_gateway(job["concurrency"], job["gateway_options"])
    scenario = ir.Scenario.model_validate(job["scenario"])
    runner = _Dialogues(scenario, cases, job["roles"], job["spec"], job["max_turns"], gateway, kept,
                        env=job.get("env"))
    sink = _ListSink()
    try:
        await runner.run_all(todo, sink, job["concurrency"])
    finally:
        await gateway.aclose()
    stats = gateway.stats
    return {"writes": sink.writes, "tokens": stats.prompt_tokens + stats.completion_tokens, "cost": stats.cost,
            "notes": list(getattr(gateway, "notes", []))}


RAY_BATCH = (8, 32)
"""Dialogues per Ray task: 2 × concurrency, within these bounds (big enough to keep a task's
concurrency cap busy, small enough that a lost node costs little rework)."""


async def _execute_ray(store: RunStore, scenario: ir.Scenario, cases: Mapping[str, Case], roles: Any,
                       spec: JudgeTurns, todo: Sequence[Dialogue], *, max_turns: int, concurrency: int,
                       progress: ProgressMode, gateway_options: Mapping[str, Any], address: str,
                       num_cpus: int | None, kept: Mapping[str, list[Turn]], env: str | None = None) -> None:
    """Run `todo` on Ray: batches go out to tasks (each with `concurrency` model calls in flight), two
    per cluster CPU at most; each finished batch's writes are committed here, in their order, as it
    arrives. A batch lost with a node is rerun by Ray and committed once, when it returns."""
    try:
        with distributed.connect(address, num_cpus) as ray:
            size = max(RAY_BATCH[0], min(RAY_BATCH[1], 2 * concurrency))
            job = {"scenario": scenario.model_dump(mode="json"), "roles": roles, "spec": spec,
                   "max_turns": max_turns, "concurrency": concurrency, "gateway_options": dict(gateway_options),
                   "env": env}
            # a dialogue whose judging was lost to infrastructure travels with its kept transcript
            batches = (((distributed.subset(cases, (d.case_id for d in chunk)), chunk,
                         {d.id: kept[d.id] for d in chunk if d.id in kept}), len(chunk))
                       for chunk in distributed.batched(todo, size))
            sink = GroupCommit(store)
            label = f"dialogues (ray, {distributed.cluster_cpus(ray)} CPUs)"
            bar = _Progress(len(todo), progress_mode(progress), label)
            rates = distributed.NodeRates()
            tokens, cost = 0, 0.0
            notes: list[str] = []

            def apply(result: distributed.BatchResult) -> None:
                nonlocal tokens, cost
                value = result.value
                tokens, cost = tokens + value["tokens"], cost + value["cost"]
                notes.extend(n for n in value["notes"] if n not in notes)
                rates.add(result.node_id, result.size)
                bar.relabel(f"{label} {rates.text()}")
                for write, args in value["writes"]:
                    if write not in _WRITES:
                        raise RunError(f"a Ray task sent an unknown write {write!r}")
                    getattr(sink, write)(*args)
                    if write in ("finish_dialogue", "fail_dialogue"):
                        bar.advance_totals(tokens, cost, failed=args[0].status == "infra_failure")

            try:
                await distributed.run_batches(ray, _ray_batch, job, batches, apply,
                                              in_flight=2 * distributed.cluster_cpus(ray))
            finally:
                sink.flush()
                bar.close()
    except distributed.DistributedError as exc:
        raise RunError(f"{exc} (the run is resumable: sop run --resume RUN_DIR)") from None
    known = store.meta().get("notes") or []
    if [n for n in notes if n not in known]:
        store.set_meta("notes", [*known, *(n for n in notes if n not in known)])


def _ray_judge_batch(job: Mapping[str, Any],
                     payload: tuple[dict[str, Case], list[tuple[str, str, list[Any]]]]) -> dict[str, Any]:
    """A Ray task's body for `rejudge`: judge a batch of stored transcripts with a gateway of its own."""
    return asyncio.run(in_own_loop(_ray_judge_run(job, *payload)))


async def _ray_judge_run(job: Mapping[str, Any], cases: dict[str, Case],
                         items: list[tuple[str, str, list[Any]]]) -> dict[str, Any]:
    gateway = _make_gateway(job["concurrency"], job["gateway_options"])
    scenario = ir.Scenario.model_validate(job["scenario"])
    info = without_paths(scenario_context(scenario, max_paths=0))
    ensemble = Ensemble([LLMJudge(j, gateway) for j in job["judges"]])
    limit = asyncio.Semaphore(max(2 * job["concurrency"], 4))

    async def one(dialogue_id: str, case_id: str, turns: list[Any]) -> tuple[Any, ...]:
        async with limit:
            judgments, cons = await ensemble.judge_dialogue(scenario, cases[case_id], dialogue_id, turns, job["spec"],
                                                            judgment_set=job["set"], scenario_info=info)
        return dialogue_id, judgments, cons, judgment_usage_rows(judgments)

    try:
        results = await asyncio.gather(*(one(*item) for item in items))
    finally:
        await gateway.aclose()
    stats = gateway.stats
    return {"results": results, "tokens": stats.prompt_tokens + stats.completion_tokens, "cost": stats.cost}


async def _rejudge_ray(store: RunStore, scenario: ir.Scenario, cases: Mapping[str, Case], roles: Any,
                       spec: JudgeTurns, name: str, todo: Sequence[Dialogue], *, concurrency: int,
                       progress: ProgressMode, address: str,
                       gateway_options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`rejudge` on Ray: stored transcripts go out in batches (read from the store as batches are sent),
    judgments come back and are stored here, each dialogue's set in one transaction. Returns the
    dialogues whose judging was lost to infrastructure (`RunSummary.unjudged`)."""
    unjudged: list[dict[str, Any]] = []
    try:
        with distributed.connect(address) as ray:
            size = max(RAY_BATCH[0], min(RAY_BATCH[1], 2 * concurrency))
            job = {"scenario": scenario.model_dump(mode="json"), "judges": list(roles.judges), "spec": spec,
                   "set": name, "concurrency": concurrency, "gateway_options": dict(gateway_options)}
            batches = (((distributed.subset(cases, (d.case_id for d in chunk)),
                         [(d.id, d.case_id, store.turns(dialogue_id=d.id)) for d in chunk]), len(chunk))
                       for chunk in distributed.batched(todo, size))
            bar = _Progress(len(todo), progress_mode(progress), f"judging ({name}, ray)")
            tokens, cost = 0, 0.0

            def apply(result: distributed.BatchResult) -> None:
                nonlocal tokens, cost
                tokens, cost = tokens + result.value["tokens"], cost + result.value["cost"]
                for dialogue_id, judgments, cons, usage in result.value["results"]:
                    lost = _store_rejudged(store, dialogue_id, judgments, cons, usage, unjudged)
                    bar.advance_totals(tokens, cost, failed=lost)

            try:
                await distributed.run_batches(ray, _ray_judge_batch, job, batches, apply,
                                              in_flight=2 * distributed.cluster_cpus(ray))
            finally:
                bar.close()
    except distributed.DistributedError as exc:
        raise RunError(f"{exc} (judge again to finish: judged dialogues are kept)") from None
    return unjudged


# ---------------------------------------------------------------------------------------------
# Re-judging


def _store_rejudged(store: RunStore, dialogue_id: str, judgments: list[Any], cons: list[Any],
                    usage: list[Any], unjudged: list[dict[str, Any]]) -> bool:
    """Store a re-judged dialogue's judgments; True (and noted in `unjudged`) when some were lost to
    infrastructure: then nothing is stored but the usage, and the next `sop judge` judges it."""
    lost = lost_to_infra(judgments)
    if lost:  # not stored: the set stays open for this dialogue, the next `sop judge` judges it
        why = (lost[0].unscored_reason or "").removeprefix(INFRA_FAILURE)
        unjudged.append({"dialogue": dialogue_id, "error": f"judging: {len(lost)} of {len(judgments)} "
                         f"judgments lost ({why}); run the same sop judge again to judge it"})
        store.add_usage([{**row, "discarded": True} for row in usage])
        return True
    store.add_judgments(judgments, cons, usage)
    return False


def default_set_name(judge_models: Iterable[str]) -> str:
    """A deterministic judgment-set name from the judges' models (so an interrupted re-judge resumes)."""
    models = list(judge_models)
    unique = list(dict.fromkeys(models))
    return unique[0] if len(unique) == 1 else "+".join(models)


async def rejudge(
    run_dir: str | Path,
    judge_specs: Any,
    *,
    judgment_set: str | None = None,
    judge_turns: JudgeTurns | str | None = None,
    concurrency: int = 8,
    replace: bool = False,
    progress: ProgressMode = None,
    gateway: Any = None,
    gateway_options: Mapping[str, Any] | None = None,
    ray: str | None = None,
) -> RunSummary:
    """Judge the stored transcripts of finished dialogues again, into a new judgment set.

    `judge_specs`: `--model judge=...` strings or ModelSpecs (one is used three times). Dialogues
    already judged in the set are skipped (an interrupted re-judge resumes); `replace=True` starts the
    set over. The run's agents and users are never called. `ray`: judge on Ray, as `run` does."""
    started = time.perf_counter()
    if ray is not None:
        try:
            distributed.check(ray)
        except distributed.DistributedError as exc:
            raise RunError(str(exc)) from None
    try:
        store = RunStore.open(run_dir)
    except StoreError as exc:
        raise RunError(str(exc)) from None
    try:
        roles = roles_from_options(list(judge_specs), require_agent=False)
        meta = store.meta()
        name = judgment_set or default_set_name(j.model for j in roles.judges)
        sets = dict(meta.get("judgment_sets") or {})
        if name == DEFAULT_SET and not replace:
            raise RunError("the judgment set 'default' is the run's own; choose another --set name")
        try:
            spec = parse_judge_turns(judge_turns if judge_turns is not None
                                     else (meta.get("config") or {}).get("judge_turns"))
        except ValueError as exc:
            raise RunError(str(exc)) from None
        if replace:
            store.clear_judgment_set(name)
        judge_meta = {j.role: redact_params(j.model_dump(mode="json")) for j in roles.judges}
        sets[name] = {"models": {r: m["model"] for r, m in judge_meta.items()}, "judge_turns": judge_turns_text(spec),
                      "specs": judge_meta}
        store.set_meta("judgment_sets", sets)
        scenario = store.scenario()
        cases = {c.id: c for c in store.cases()}
        done_ids = store.judged_dialogues(name)
        dialogues = store.dialogues(status="done")
        todo = [d for d in dialogues if d.id not in done_ids]
        if ray is not None and todo:
            on_ray = await _rejudge_ray(store, scenario, cases, roles, spec, name, todo, concurrency=concurrency,
                                        progress=progress, address=ray, gateway_options=gateway_options or
                                        (meta.get("config") or {}).get("gateway") or {})
            return _summary(store, ran=len(todo), skipped=len(dialogues) - len(todo), unjudged=on_ray,
                            elapsed_s=round(time.perf_counter() - started, 3),
                            self_preference=[j.role for j in roles.judges
                                             if meta.get("agent_model") and j.model == meta.get("agent_model")])
        gateway = gateway if gateway is not None else _make_gateway(
            concurrency, gateway_options or (meta.get("config") or {}).get("gateway") or {})
        info = without_paths(scenario_context(scenario, max_paths=0))
        ensemble = Ensemble([LLMJudge(j, gateway) for j in roles.judges])
        bar = _Progress(len(todo), progress_mode(progress), f"judging ({name})")
        if hasattr(gateway, "add_listener"):
            gateway.add_listener(bar.tick)
        if hasattr(gateway, "add_retry_listener"):
            gateway.add_retry_listener(bar.retrying)
        queue = list(reversed(todo))
        unjudged: list[dict[str, Any]] = []

        async def worker() -> None:
            while queue:
                d = queue.pop()
                turns = store.turns(dialogue_id=d.id)
                judgments, cons = await ensemble.judge_dialogue(
                    scenario, cases[d.case_id], d.id, turns, spec, judgment_set=name, scenario_info=info)
                lost = _store_rejudged(store, d.id, judgments, cons, judgment_usage_rows(judgments), unjudged)
                bar.advance(gateway, failed=lost)

        try:
            await asyncio.gather(*(worker() for _ in range(min(len(todo), max(2 * concurrency, 4)))))
        finally:
            bar.close()
        agent_model = meta.get("agent_model")
        selfpref = [j.role for j in roles.judges if agent_model and j.model == agent_model]
        return _summary(store, ran=len(todo), skipped=len(dialogues) - len(todo), unjudged=unjudged,
                        elapsed_s=round(time.perf_counter() - started, 3), self_preference=selfpref)
    finally:
        store.close()


def run_sync(*args: Any, **kwargs: Any) -> RunSummary:
    """`run` for synchronous callers."""
    return asyncio.run(run(*args, **kwargs))


def rejudge_sync(*args: Any, **kwargs: Any) -> RunSummary:
    """`rejudge` for synchronous callers."""
    return asyncio.run(rejudge(*args, **kwargs))
