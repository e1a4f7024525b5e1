"""`sop paths`: list, count or sample the feasible paths of an SOP."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from sopgraph.logic.budget import LOAD_SHARE, PATHS_CPU_BUDGET, CpuBudget, OutOfCpu, active
from sopgraph.logic.paths import COUNT_BUDGET, count_paths, iter_paths, sample_paths

from .params import cpu_budget_option, fail, load_or_exit, sop_file

MAX_LISTED = 100_000  # a table or JSON array beyond this needs --limit / --sample / jsonl


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _table(infos: list[Any], title: str) -> None:
    from rich.console import Console  # lazy: rich costs ~0.1 s at start-up, only tables need it
    from rich.table import Table

    table = Table(title=title, show_lines=True)
    table.add_column("id", no_wrap=True)
    table.add_column("stages")
    traced = any(len(p.actions) > 1 or "(" in "".join(p.actions) for p in infos)
    if traced:
        table.add_column("actions")
    table.add_column("finals")
    table.add_column("constraints", overflow="fold")  # long names wrap instead of ending in "…"
    for p in infos:
        stages = " → ".join(p.stages)
        finals = []
        for k, v in p.finals.items():
            if v is None and k in p.finals_varying:
                finals.append(f"{k}: {p.finals_varying[k]}")
            else:
                finals.append(f"{k}: {_value(v)}")
        cons = "\n".join(f"{k} {v}" if k == "where" else f"{k} {_relation(v)}"
                         for k, v in p.constraints.items()) or "(none)"
        pid = p.id if p.status == "feasible" else f"{p.id} (?)"
        trace = ["\n".join(f"{i}. {a}" for i, a in enumerate(p.actions, 1))] if traced else []
        table.add_row(pid, stages, *trace, "\n".join(finals), cons)
    Console(soft_wrap=False, width=max(100, Console().width)).print(table)


def _within(stream: Iterator[Any], clock: CpuBudget) -> Iterator[Any]:
    """The paths of `stream` until `clock` runs out; then a note on stderr says after which path the
    listing stopped (the paths listed are complete and verified; the later ones were not looked at).
    Each path is found with `clock` active, so one costly path does not run past it either."""
    last = None
    while True:
        try:
            with active(clock):
                info = next(stream)
        except StopIteration:
            return
        except OutOfCpu:
            info = None
        if info is not None:
            yield info
            last = info
        if info is None or clock.out():
            after = f"after path {last.id} ({' -> '.join(last.stages)})" if last is not None else "before the first path"
            click.echo(f"note: the listing reached its CPU budget ({clock.describe()}) {after}; the later paths "
                       "were not listed (raise --cpu-budget, or use --limit N / --sample N)", err=True)
            return


def _sampled(scenario: Any, n: int, seed: int, clock: CpuBudget) -> list[Any]:
    """`sample_paths` within `clock`: past it, nothing is drawn and a note on stderr says so."""
    try:
        with active(clock):
            return sample_paths(scenario, n, seed=seed)
    except OutOfCpu:
        click.echo(f"note: sampling reached its CPU budget ({clock.describe()}) before {n} paths were drawn and "
                   "verified; none is shown (raise --cpu-budget, or use --limit N)", err=True)
        return []


def _relation(text: str) -> str:
    if text[:1] in "<>=!" or text.startswith("in ") or text.startswith("("):
        return text
    return f"= {text}" if " | " not in text else f"∈ {{{text.replace(' | ', ', ')}}}"


@click.command("paths")
@sop_file
@click.option("--format", "fmt", type=click.Choice(["table", "json", "jsonl"]), default="table",
              show_default=True, help="Rich table, a JSON array, or one JSON object per line.")
@click.option("--limit", type=click.IntRange(min=0), default=None, metavar="N",
              help="Stop after the first N paths (depth-first order; ids do not change).")
@click.option("--count", "count_only", is_flag=True,
              help="Only print the numbers of feasible paths and of distinct stage sequences (no enumeration).")
@click.option("--sample", type=click.IntRange(min=1), default=None, metavar="N",
              help="N paths drawn uniformly at random (with replacement) instead of the full list.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed for --sample.")
@cpu_budget_option(PATHS_CPU_BUDGET, "past it the listing stops and says after which path, and a count is "
                   "a lower bound that says at which stage it stopped (exit 0 either way)")
def paths_cmd(file: Path, fmt: str, limit: int | None, count_only: bool, sample: int | None, seed: int,
              cpu_budget: float = PATHS_CPU_BUDGET) -> None:
    """List the feasible paths of FILE: decisions from the entry stage to an action.

    Each path has a stable id (P + depth-first rank), its stages, final outputs, the constraints its
    values must meet, and witnesses (values the rule engine routes along it). Paths marked `(?)`
    could be neither proven feasible nor refuted.
    """
    clock = CpuBudget(cpu_budget)  # the command's one budget: loading checks, count, listing
    scenario = load_or_exit(file, cpu_budget=clock.share(LOAD_SHARE))
    if count_only:
        c = count_paths(scenario, cpu_budget=clock)
        if fmt == "table" and c.stopped:
            known = f"at least {c.feasible:,} feasible paths (a lower bound)" if c.feasible \
                else "the number of feasible paths is unknown"
            click.echo(f"{known}: {c.stopped}; raise --cpu-budget, or list some with --limit N or --sample N")
        elif fmt == "table" and not c.complete:
            click.echo(f"more than {c.feasible:,} feasible paths: too many to count (the count stopped at its "
                       f"budget of {COUNT_BUDGET:,} states); list some with --limit N or --sample N")
        elif fmt == "table":
            approx = "" if c.exact else " (upper bounds: some conditions are undecided)"
            click.echo(f"{c.feasible} feasible paths, {c.stage_sequences} distinct stage sequences{approx}")
        else:
            click.echo(json.dumps(c.model_dump(), ensure_ascii=False))
        return
    if sample is not None and limit is not None:
        fail("use either --sample or --limit, not both", 2)
    if sample is None and limit is None and fmt != "jsonl":
        counted = count_paths(scenario, cpu_budget=clock)
        if counted.feasible > MAX_LISTED or (not counted.complete and not counted.stopped):
            many = f"{counted.feasible}" if counted.complete else f"more than {counted.feasible:,}"
            fail(f"{scenario.name} has {many} feasible paths: list them with --format jsonl, or use "
                 f"--limit N, --sample N or --count", 2)
    if sample is not None:
        infos = _sampled(scenario, sample, seed, clock)
        title = f"{scenario.name}: {len(infos)} sampled paths (seed {seed})"
        stream: Iterator[Any] = iter(infos)
    else:
        stream = _within(iter_paths(scenario, limit=limit), clock)
        title = f"{scenario.name}: feasible paths"
    out = sys.stdout
    if fmt == "jsonl":
        for p in stream:
            out.write(json.dumps(p.model_dump(mode="json"), ensure_ascii=False) + "\n")
        out.flush()
        return
    infos = list(stream)
    if fmt == "json":
        click.echo(json.dumps([p.model_dump(mode="json") for p in infos], indent=2, ensure_ascii=False))
        return
    if sample is None:
        counted = count_paths(scenario, cpu_budget=clock)
        total = counted.feasible
        shown = (f"{len(infos)} of {total}" if len(infos) < total else f"{total}") if counted.complete \
            else f"{len(infos)} of more than {total:,}" if not counted.stopped \
            else f"{len(infos)} of at least {total:,}" if total else f"{len(infos)} of an uncounted number of"
        title = f"{scenario.name}: {shown} feasible paths"
    _table(infos, title)
