"""The `sop` command line: a click group whose commands are thin wrappers over library functions.

Each command module defines its commands; this module is the one place that assembles them.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sqlite3
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import click

from sopgraph._version import __version__
from sopgraph.errors import Error
from sopgraph.logic.budget import OutOfCpu
from sopgraph.perf import tune_gc_for_cli, tune_malloc_for_cli


class _Sop(click.Group):
    """The `sop` group. As the process entry point (console script) it also tunes the process once;
    a store that turns out unreadable while a command reads it (corruption past the integrity check,
    a row that is not a record), or any other `sopgraph.Error` a command lets through, ends the command
    with one line, no traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Process-wide settings belong to the application, not to the library (issue 8): a test or a
        # script invoking `main.main(...)` directly keeps its own collector settings.
        tune_gc_for_cli()
        tune_malloc_for_cli()
        obj = kwargs.setdefault("obj", {})
        if isinstance(obj, dict):
            obj[OWNS_PROCESS] = True  # commands may apply their own process-wide collector policy
        return super().__call__(*args, **kwargs)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command, importing only its module when the index knows it (else every module)."""
        if cmd_name not in self.commands:
            for name in [COMMAND_INDEX[cmd_name]] if cmd_name in COMMAND_INDEX else COMMAND_MODULES:
                self._add_module(name)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        for name in COMMAND_MODULES:
            self._add_module(name)
        return super().list_commands(ctx)

    def _add_module(self, name: str) -> None:
        for command in top_level_commands(command_module(name)):
            if command.name not in self.commands:
                self.add_command(command)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except sqlite3.DatabaseError as exc:
            click.echo(f"error: a run store could not be read ({exc}); restore it from a backup or start a "
                       "new run in another directory", err=True)
            ctx.exit(1)
        except OutOfCpu as stop:
            # An analysis that made its budget active catches this and says where it stopped; one that
            # did not is a bug, but the command still ends with a line, never a traceback.
            click.echo(f"error: {stop} (raise --cpu-budget)", err=True)
            ctx.exit(1)
        except Error as exc:
            # The one mapping of the library's root error: a problem sopgraph reports (bad input, a store
            # it cannot use, a model it cannot reach) ends the command with its message, never a traceback.
            # Commands that say more (diagnostics, a distinct exit code) catch their errors themselves.
            click.echo(f"error: {exc}", err=True)
            ctx.exit(1)


@click.group(cls=_Sop, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sop")
@click.option("--include-path", "include_path", multiple=True, metavar="DIR",
              type=click.Path(file_okay=False, path_type=Path),
              help="A directory `include` may read from besides the main file's own directory tree "
                   "(repeatable). Includes are sandboxed: only .sop regular files under these directories.")
@click.pass_context
def main(ctx: click.Context, include_path: tuple[Path, ...]) -> None:
    """sopgraph: compile customer-service SOPs into graphs and evaluate agents on them."""
    ctx.ensure_object(dict)
    ctx.obj["include_path"] = tuple(include_path)
    # The CLI owns its terminal: litellm's "Give Feedback" prints and log lines would garble tables
    # and JSON output. Library users keep litellm's own settings. The commands that never load the
    # gateway skip it (start-up time: ~0.05 s); every other command quiets it before it runs.
    if COMMAND_INDEX.get(ctx.invoked_subcommand or "") not in MODEL_FREE_MODULES:
        from sopgraph.simulation.gateway import quiet_litellm_output

        quiet_litellm_output()


COMMAND_MODULES = ("checkcmd", "lang", "pathscmd", "synthcmd", "runcmd", "scorecmd", "tools", "authorcmd",
                   "draftcmd", "viewcmd", "evalcmd")
"""The modules of `sopgraph.cli` that define commands (each imported when one of its commands runs)."""

COMMAND_INDEX = {"check": "checkcmd", "compile": "lang", "decide": "lang", "step": "lang", "paths": "pathscmd",
                 "synth": "synthcmd", "init": "synthcmd", "profiles": "synthcmd", "render": "tools",
                 "prompt": "tools", "schema": "tools", "fmt": "authorcmd", "validate": "authorcmd",
                 "diff": "authorcmd", "eval": "evalcmd"}
"""Where the authoring commands live, so that `sop check` imports its own module and not the simulation
and evaluation stages (httpx, numpy, the runner: ~0.4 s of start-up). A shortcut only: a command not
listed is found by importing every module (tests/test_layout.py checks the index against the modules)."""


MODEL_FREE_MODULES = frozenset({"checkcmd", "lang", "pathscmd", "synthcmd"})
"""The command modules whose commands never load the model gateway (their library calls stay in the
language, logic and cases stages, below the simulation: import-linter's layers), so quieting litellm
would only cost them its import (tests/test_cli_entry.py checks that none of them loads it)."""


def command_module(name: str) -> ModuleType:
    """A command module of `sopgraph.cli` by name."""
    return importlib.import_module(f"sopgraph.cli.{name}")


def top_level_commands(module: object) -> list[click.Command]:
    """The module's commands that are not subcommands of one of its groups, in definition order."""
    found = [c for c in vars(module).values() if isinstance(c, click.Command)]
    nested = {id(sub) for c in found if isinstance(c, click.Group) for sub in c.commands.values()}
    return [c for c in found if id(c) not in nested]


OWNS_PROCESS = "owns_process"
"""The root context's `obj` key set when `main` runs as the process (called: the console script, `main()`), not
through `main.main(...)` (click's test runner): then a command may change process-wide settings
(`params.owns_process`)."""

KEEP_UNTIL_EXIT = "keep_until_exit"
"""The root context's `obj` key where a command leaves what `params.keep_until_exit` hands over."""


def entry() -> None:
    """The `sop` console script (pyproject's [project.scripts]): `main` as the whole process.

    When the command handed its results over (`params.keep_until_exit`: `sop check`) and no other thread is
    running, the process ends with `os._exit` once the streams are flushed and the atexit handlers have run:
    interpreter finalization would only free the results, about a second for ten million objects (mypy ends
    the same way, `mypy.util.hard_exit`). Any other command, or an exception other than `SystemExit`, ends
    as usual. Library code never does this; `main(...)` and `main.main(...)` called from Python return or
    raise `SystemExit` as click does."""
    state: dict[str, Any] = {}
    try:
        main(obj=state)
    except SystemExit as exc:
        if KEEP_UNTIL_EXIT not in state or not _only_thread():
            raise
        status = exit_status(exc.code)
    else:  # pragma: no cover - click's standalone mode always ends with SystemExit
        return
    hard_exit(status)


def exit_status(code: object) -> int:
    """The process status Python gives `SystemExit(code)`: 0 for None, the number, else 1 after printing
    the value to stderr."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _only_thread() -> bool:
    """True when no thread but the main one would keep the process alive (daemon threads end anyway)."""
    main_thread = threading.main_thread()
    return all(t is main_thread or t.daemon for t in threading.enumerate())


def hard_exit(status: int) -> NoReturn:
    """Flush stdout and stderr, run the atexit handlers, and end the process without finalizing objects.
    A stream that cannot be flushed (a closed pipe) makes the status 120, as Python's own exit does."""
    if not _flush():
        status = status or 120
    atexit._run_exitfuncs()
    if not _flush():
        status = status or 120
    os._exit(status)


def _flush() -> bool:
    ok = True
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            ok = False
    return ok
