"""Run commands: `sop run` (and `--resume`), `sop judge` (re-judge into a new set), `sop runs show`."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from sopgraph.logic.budget import LOAD_CPU_BUDGET
from sopgraph.simulation.gateway import (
    DEFAULT_BASE_DELAY,
    DEFAULT_MAX_DELAY,
    DEFAULT_RETRIES,
    ModelOptionError,
    parse_model_option,
)
from sopgraph.simulation.judge import agreement as agree
from sopgraph.simulation.judge import parse_judge_turns
from sopgraph.simulation.runner import RunError, in_own_loop, rejudge, run
from sopgraph.simulation.store import RunStore, StoreError

from .params import LOAD_ONLY, cpu_budget_option, fail, load_or_exit

EXIT_INFRA = 3  # the run finished but some dialogues are infra failures (resume to retry them)

_format = click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
                       help="Summary as a rich table or as JSON.")
_quiet = click.option("--quiet", "-q", is_flag=True, help="No progress display (same as --progress never).")
_progress = click.option(
    "--progress", "progress", type=click.Choice(["auto", "always", "never"]), default="auto", show_default=True,
    help="auto: a bar when stderr is a terminal; always: also in logs (nohup, redirects), as one plain "
         "line per update; never: none. Tokens and cost update after every model call.")


def _model_options(values: tuple[str, ...]) -> list[Any]:

    try:
        return [parse_model_option(v) for v in values]
    except ModelOptionError as exc:
        fail(str(exc))


@click.command("run")
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cases", "cases", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Cases to run (JSON Lines of records.Case, e.g. from `sop synth`).")
@click.option("--model", "models", multiple=True, metavar="ROLE=MODEL[,k=v...]",
              help="agent=…, user=… (default scripted/user), judge=… once (used ×3) or three times "
                   "(default scripted/truth). Keys come from the environment (api_key_env=VAR).")
@click.option("--trials", type=click.IntRange(min=1), default=1, show_default=True,
              help="Dialogues per case (for pass^k).")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True,
              help="Model calls in flight at once (all roles).")
@click.option("--max-turns", type=click.IntRange(min=1), default=15, show_default=True,
              help="Agent turns before a dialogue is cut off.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes sharing the dialogues and --concurrency (litellm costs CPU per call).")
@click.option("--judge-turns", default="1,5,10,15,final", show_default=True,
              help="Turns the judges read: a list of numbers and `final`, or `all`.")
@click.option("--ray", "ray", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run the dialogues on Ray: alone, a local Ray instance (--workers CPUs if > 1); with "
                   "ADDRESS (HOST:PORT or auto), that cluster. --concurrency is then per Ray task. "
                   "Needs pip install 'sopgraph[ray]'.")
@click.option("--structured", is_flag=True, help="Pass the output JSON schema to the agent's provider.")
@click.option("--env", "env", default=None, metavar="python:MODULE:FACTORY",
              help="An environment the tool-acting agent acts on instead of the case-scripted backend; it also "
                   "gives the reference trace and the end-state check (docs/environments.md).")
@click.option("-o", "--output", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory to create (e.g. runs/NAME).")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Resume the run in this directory (finished dialogues are kept, the rest re-run).")
@click.option("--retries", type=click.IntRange(min=0), default=DEFAULT_RETRIES, show_default=True,
              help="Retries of a failing model call before it is an infrastructure failure.")
@click.option("--retry-delay", type=click.FloatRange(min=0), default=DEFAULT_BASE_DELAY, show_default=True,
              help="Base of the exponential backoff between retries (seconds; waits double up to "
                   "--retry-max-delay; the defaults wait 25-51 s in all, enough for a server restart).")
@click.option("--retry-max-delay", type=click.FloatRange(min=0), default=DEFAULT_MAX_DELAY, show_default=True,
              help="Longest wait between two retries (seconds).")
@click.option("--no-preflight", is_flag=True,
              help="Skip the one-call check of each model before the run (keys, provider, server, "
                   "structured output).")
@click.option("--no-cache", is_flag=True, help="Do not use the response cache.")
@_quiet
@_progress
@_format
@cpu_budget_option(LOAD_CPU_BUDGET, LOAD_ONLY)
def run_cmd(file: Path | None, cases: Path | None, models: tuple[str, ...], trials: int, concurrency: int,
            max_turns: int, workers: int, judge_turns: str, ray: str | None, structured: bool, env: str | None,
            out: Path | None, resume_dir: Path | None,
            retries: int, retry_delay: float, retry_max_delay: float, no_preflight: bool, no_cache: bool,
            quiet: bool, progress: str, fmt: str, cpu_budget: float = LOAD_CPU_BUDGET) -> None:
    """Simulate dialogues of FILE's cases with the agent under test, judge them, store the run.

    Exit status: 0 all dialogues done, 1 usage or input error, 3 some dialogues failed for
    infrastructure reasons (run again with --resume to retry them).
    """
    if resume_dir is not None:
        if file is not None or cases is not None or models or out is not None or env is not None:
            fail("--resume takes only the run directory (the stored configuration is used)")
        kwargs: dict[str, Any] = {"resume": True}
        target = resume_dir
        scenario = None
        specs: list[Any] = []
    else:
        if file is None:
            fail("missing the .sop FILE (or --resume RUN_DIR)")
        if cases is None:
            fail("missing --cases FILE")
        if out is None:
            fail("missing -o RUN_DIR")

        # compiler-style diagnostics before anything starts; the runner takes the loaded scenario (not loaded twice)
        loaded = load_or_exit(file, cpu_budget=cpu_budget)
        scenario = file
        specs = _model_options(models)
        if not any(s.role == "agent" for s in specs):
            fail("no agent model: pass --model agent=PROVIDER/MODEL (offline floor: --model agent=baseline/oracle)")

        try:
            parse_judge_turns(judge_turns)
        except ValueError as exc:
            fail(str(exc))
        kwargs = {"trials": trials, "max_turns": max_turns, "judge_turns": judge_turns, "structured": structured,
                  "env": env, "loaded": loaded,
                  "gateway_options": {"max_retries": retries, "base_delay": retry_delay,
                                      "max_delay": retry_max_delay, "cache": not no_cache}}
        target = out
    try:
        summary = asyncio.run(in_own_loop(run(scenario, cases, specs, target, concurrency=concurrency,
                                              workers=workers, progress="never" if quiet else progress,
                                              preflight=not no_preflight, ray=ray, **kwargs)))
    except (RunError, ModelOptionError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail(f"interrupted; resume with: sop run --resume {target}", code=130)
    _render_summary(summary.model_dump(), fmt)
    if summary.infra_failures:
        sys.exit(EXIT_INFRA)


@click.command("judge")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", "models", multiple=True, metavar="judge=MODEL[,k=v...]", required=True,
              help="judge=… once (used ×3) or three times; judge1=… judge3=… also work.")
@click.option("--set", "set_name", default=None,
              help="Name of the new judgment set (default: from the judges' model names).")
@click.option("--judge-turns", default=None, help="Turns to judge (default: the run's setting).")
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--replace", is_flag=True, help="Start the judgment set over if it exists.")
@click.option("--ray", "ray", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Judge on Ray: alone, a local Ray instance; with ADDRESS, that cluster (see sop run --ray).")
@_quiet
@_progress
@_format
def judge_cmd(run_dir: Path, models: tuple[str, ...], set_name: str | None, judge_turns: str | None,
              concurrency: int, replace: bool, ray: str | None, quiet: bool, progress: str, fmt: str) -> None:
    """Re-judge the stored transcripts of RUN_DIR into a new judgment set (no agent calls).

    Exit status: 0 every dialogue judged, 1 usage error, 3 some judgments were lost to infrastructure (the
    judges could not be reached; run the same command again to judge those dialogues)."""
    specs = _model_options(models)
    bad = [s.role for s in specs if not s.role.startswith("judge")]
    if bad:
        fail(f"sop judge takes judge models only (got {', '.join(bad)})")
    try:
        summary = asyncio.run(in_own_loop(rejudge(run_dir, specs, judgment_set=set_name, judge_turns=judge_turns,
                                                  concurrency=concurrency, replace=replace, ray=ray,
                                                  progress="never" if quiet else progress)))
    except (RunError, ModelOptionError) as exc:
        fail(str(exc))
    _render_summary(summary.model_dump(), fmt)
    if summary.unjudged:
        click.echo(f"error: {len(summary.unjudged)} dialogue(s) could not be judged (judges unreachable), e.g. "
                   f"{summary.unjudged[0]['dialogue']}: {summary.unjudged[0]['error']}", err=True)
        sys.exit(EXIT_INFRA)


@click.group("runs")
def runs_group() -> None:
    """Inspect run directories."""


@runs_group.command("show")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--agreement", is_flag=True, help="Also compute inter-judge agreement per judgment set.")
@_format
def runs_show(run_dir: Path, agreement: bool, fmt: str) -> None:
    """Status of a run: dialogues by status, end reasons, format errors, infra failures, judgment
    sets, tokens and cost."""
    try:
        store = RunStore.open(run_dir)
    except StoreError as exc:
        fail(str(exc))
    with store:
        info = store.summary()
        meta = store.meta()
        info["scenario"] = meta.get("scenario_name")
        info["sop_hash"] = meta.get("sop_hash")
        info["tool_version"] = meta.get("tool_version")
        info["created"] = meta.get("created")
        info["models"] = {r: m.get("model") for r, m in (meta.get("models") or {}).items()}
        info["config"] = {k: v for k, v in (meta.get("config") or {}).items() if k != "gateway"}
        info["warnings"] = list(meta.get("notes") or [])
        agent_model = meta.get("agent_model")
        info["self_preference"] = {
            name: sorted(r for r, m in (s.get("models") or {}).items() if agent_model and m == agent_model)
            for name, s in info["judgment_sets"].items()
        }
        if agreement:

            fields = [v.name for v in store.scenario().fields]
            info["agreement"] = {
                name: agree(store.judgments(name), fields, agent_model=agent_model, judgment_set=name,
                            consensus_rows=store.consensus(name)).model_dump()
                for name in store.judgment_sets()
            }
    _render_summary(info, fmt)


def _render_summary(info: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(info, indent=2, ensure_ascii=False, sort_keys=True))
        return
    from rich.console import Console  # lazy: rich costs ~0.1 s at start-up, only tables need it
    from rich.table import Table

    console = Console()
    table = Table(title=f"run {info.get('run_dir', '')}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    for key in ("scenario", "sop_hash", "tool_version", "created"):
        if info.get(key):
            table.add_row(key, str(info[key]))
    if info.get("models"):
        table.add_row("models", ", ".join(f"{r}={m}" for r, m in info["models"].items()))
    table.add_row("dialogues", str(info.get("dialogues", 0)))
    table.add_row("by status", _kv(info.get("by_status")))
    table.add_row("end reasons", _kv(info.get("end_reasons")))
    table.add_row("turns (done)", str(info.get("turns", 0)))
    turns = info.get("turns") or 0
    fe = info.get("format_errors", 0)
    table.add_row("format errors", f"{fe}" + (f" ({fe / turns:.1%} of turns)" if turns else ""))
    infra = info.get("infra_failures")
    n_infra = len(infra) if isinstance(infra, list) else (infra or 0)
    table.add_row("infra failures", str(n_infra))
    if "ran" in info:
        table.add_row("this call", f"ran {info['ran']}, skipped {info['skipped']} already done, "
                                   f"{info.get('elapsed_s', 0):.1f} s")
    cost = f"${info.get('cost', 0):.4f}" + ("" if info.get("cost_known", True) else " (some models unpriced)")
    # Every role's calls, abandoned attempts included: what was spent. `sop score`'s Tok/1k counts the agent's
    # calls of finished dialogues only; the label says which total this is.
    table.add_row("tokens / cost (all roles, incl. discarded attempts)", f"{info.get('tokens', 0):,} / {cost}")
    if info.get("discarded_tokens"):
        table.add_row("of which discarded attempts",
                      f"{info['discarded_tokens']:,} tok / ${info['discarded_cost']:.4f}")
    for name, s in (info.get("judgment_sets") or {}).items():
        models = s.get("models") or {}
        text = (f"{s.get('judged_turns', 0)} turns judged, {s.get('unscored_judgments', 0)} unscored judgments, "
                f"{s.get('no_consensus_fields', 0)} no-consensus fields; judges "
                + ", ".join(str(m) for m in models.values()))
        table.add_row(f"judgment set {name}", text)
    sp = info.get("self_preference")
    if isinstance(sp, dict):
        for name, roles in sp.items():
            if roles:
                table.add_row("[yellow]self-preference", f"set {name}: {', '.join(roles)} use the agent's model")
    elif sp:
        table.add_row("[yellow]self-preference", f"{', '.join(sp)} use the agent's model")
    for warning in info.get("warnings") or []:
        table.add_row("[yellow]warning", warning)
    console.print(table)
    errors = info.get("infra_errors") or (infra if isinstance(infra, list) else [])
    if errors:
        err = Table(title="infrastructure failures (excluded from scores; retried by --resume)", title_justify="left")
        err.add_column("dialogue")
        err.add_column("error")
        for row in errors[:20]:
            err.add_row(row["dialogue"], str(row["error"]))
        if len(errors) > 20:
            err.add_row("...", f"{len(errors) - 20} more")
        console.print(err)
    for name, ag in (info.get("agreement") or {}).items():
        t = Table(title=f"agreement, judgment set {name} ({ag['turns']} turns, {ag['unscored']} unscored)",
                  title_justify="left")
        t.add_column("field / dimension")
        t.add_column("Fleiss' kappa / mean abs dev")
        t.add_column("observed / mean range")
        t.add_column("items")
        for field, fa in ag["fields"].items():
            t.add_row(field, _num(fa["kappa"]), _num(fa["observed"]), str(fa["items"]))
        for dim, ds in ag["dimensions"].items():
            t.add_row(dim, _num(ds["mean_abs_dev"]), _num(ds["mean_range"]), str(ds["items"]))
        console.print(t)


def _kv(d: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}: {v}" for k, v in (d or {}).items()) or "-"


def _num(x: float | None) -> str:
    return "undefined" if x is None else f"{x:.3f}"
