"""Options and helpers shared by every command (one place, so behaviour is uniform)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from sopgraph.cli import KEEP_UNTIL_EXIT, OWNS_PROCESS
from sopgraph.language import scalars
from sopgraph.language.diagnostics import SopError, render_all
from sopgraph.language.ir import Scenario
from sopgraph.logic.budget import CpuBudget
from sopgraph.logic.checker import load_noted

F = TypeVar("F", bound=Callable[..., Any])

sop_file = click.argument("file", type=click.Path(dir_okay=False, path_type=Path))


class NowType(click.ParamType):
    """`--now`: the reference time `now` of the program, read by one parser in every command
    (`scalars.parse_datetime`: a date, or a date and time with `T` or a space, with or without seconds,
    `Z` or an offset). The value is handed on as written (checked), for the engine reads it alike."""

    name = "datetime"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        try:
            scalars.parse_datetime(text)
        except scalars.ValueProblem as exc:
            self.fail(f"{value!r} {exc}", param, ctx)
        return text


NOW = NowType()
NOW_FORMATS = "2026-11-23, 2026-11-23T10:00 or 2026-11-23 10:00:30; UTC unless it ends in Z or +HH:MM"


def now_option(what: str) -> Callable[[F], F]:
    """The `--now DATETIME` option of a command; `what` says what the command does with it."""
    return click.option("--now", "now", type=NOW, default=None, metavar="DATETIME",
                        help=f"The program's `now`, its reference time (never the clock), {what}; written "
                             f"{NOW_FORMATS}.")


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def include_dirs() -> tuple[Path, ...]:
    """The `sop --include-path` directories of the running command (none outside a command)."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    if root is None or not isinstance(root.obj, dict):
        return ()
    return tuple(root.obj.get("include_path", ()))


def owns_process() -> bool:
    """Whether the running command is the whole process (`sop ...`, `main()`), so that it may change
    process-wide settings such as the collector's; not under `main.main(...)` or click's test runner."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return root is not None and isinstance(root.obj, dict) and bool(root.obj.get(OWNS_PROCESS))


def keep_until_exit(value: object) -> None:
    """Hand the running command's large results (a 100k-stage check: ten million objects) to the process.

    Under the console script (`sopgraph.cli.entry`) they live until the process ends without being freed
    (about a second for a 100k-stage check), and the mark tells `entry` that the command left nothing that
    needs finalization beyond flushing the streams and the atexit handlers. Called in-process
    (`main.main(...)`, click's test runner) they are freed with the root context's object as usual."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    if root is not None and isinstance(root.obj, dict):
        root.obj[KEEP_UNTIL_EXIT] = value


def cpu_budget_option(default: float, what: str) -> Callable[[F], F]:
    """`--cpu-budget SECONDS`: the one CPU budget of a command, shared by all its analyses; `what` says
    what the command does past it (every command stops its analyses and says where; none fails for it)."""
    return click.option("--cpu-budget", "cpu_budget", default=default, show_default=True, metavar="SECONDS",
                        type=click.FloatRange(min=0),
                        help=f"CPU seconds for the analyses of this command (loading checks included); {what}.")


LOAD_ONLY = "past it, a note on stderr says which load-time check stopped, where and on what; the command goes on"
"""`cpu_budget_option`'s text for a command whose only analyses are the load-time checks."""


def load_or_exit(path: Path, *, check: bool = True, flow: bool = False,
                 cpu_budget: float | CpuBudget | None = None) -> Scenario:
    """Load (and check) a `.sop` file; on problems print compiler diagnostics and exit 1.
    Commands that only run an SOP skip the flow proofs (`flow=False`): names, types and structure
    are checked, exhaustiveness is enforced by the engine at run time; `sop check` proves the rest.
    The checks' analyses draw on `cpu_budget` (the command's `--cpu-budget`, or its part of it); a check
    cut short prints its located note (I302-I304) on stderr and the command goes on."""
    try:
        loaded = load_noted(path, check=check, flow=flow, include_path=include_dirs(), cpu_budget=cpu_budget)
    except SopError as exc:
        click.echo(exc.render(), err=True)
        n = sum(1 for d in exc.diagnostics if d.is_error)
        click.echo(f"\n{n} error{'s' if n != 1 else ''} in {path}", err=True)
        sys.exit(1)
    for text in render_all(loaded.diagnostics, loaded.sources):
        click.echo(text, err=True)
    assert loaded.scenario is not None
    return loaded.scenario


def write_output(text: str, out: Path | None) -> None:
    """Write to a file (creating parents) or to stdout."""
    if out is None:
        click.echo(text, nl=not text.endswith("\n"))
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
