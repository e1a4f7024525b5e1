"""`sop view`: the local, read-only run browser (library: sopgraph/evaluation/view.py)."""

from __future__ import annotations

import errno
from pathlib import Path

import click

from sopgraph.evaluation.view import ViewError, serve

from .params import fail


@click.command("view")
@click.argument("paths", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="Port on 127.0.0.1 (0: a free one, printed).")
@click.option("--log/--no-log", default=False, help="Print one line per request (and per client that hung up) to stderr.")
def view_cmd(paths: tuple[Path, ...], port: int, log: bool) -> None:
    """Browse runs in a web browser: PATHS are run directories or directories of runs (`sop view runs/`).

    Served on 127.0.0.1 only, read-only (stores are opened read-only; only GET is answered). Filter
    dialogues by verdict, failure kind, intensity, reference path and metric ranges; open a transcript
    with the reference path and action trace beside the agent's. Ctrl-C stops it."""
    try:
        server = serve(list(paths), port, log=(lambda line: click.echo(line, err=True)) if log else None)
    except ViewError as exc:
        fail(str(exc))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            fail(f"port {port} on 127.0.0.1 is in use; choose another --port (0 picks a free one)")
        raise
    runs = server.app.runs
    for note in server.app.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"sop view: {len(runs)} run{'s' if len(runs) != 1 else ''} at {server.url} "
               "(read-only; Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
