"""Authoring commands: `sop fmt` (canonical layout)."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import click

from sopgraph.language.diagnostics import SopError
from sopgraph.language.fmt import format_text


@click.command("fmt")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--check", is_flag=True, help="Change nothing; exit 1 if any file is not in canonical form (for CI).")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff of what would change; change nothing.")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the formatted text instead of rewriting files.")
def fmt_cmd(files: tuple[Path, ...], check: bool, show_diff: bool, to_stdout: bool) -> None:
    """Rewrite FILE... in the canonical layout (idempotent; comments are kept).

    Exit status: 0 done (or, with --check/--diff, nothing would change), 1 a file would change,
    2 a file cannot be read or parsed (its diagnostics are printed).
    """
    changed: list[Path] = []
    broken = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            click.echo(f"{path}: error: cannot read: {getattr(exc, 'strerror', None) or exc}", err=True)
            broken += 1
            continue
        try:
            pretty = format_text(text, str(path))
        except SopError as exc:
            click.echo(exc.render(), err=True)
            broken += 1
            continue
        if pretty == text.replace("\r\n", "\n"):
            if to_stdout:
                click.echo(pretty, nl=False)
            continue
        changed.append(path)
        if to_stdout:
            click.echo(pretty, nl=False)
        elif show_diff:
            click.echo("".join(difflib.unified_diff(text.splitlines(True), pretty.splitlines(True),
                                                    f"{path} (original)", f"{path} (formatted)")), nl=False)
        elif check:
            click.echo(f"would reformat {path}", err=True)
        else:
            path.write_text(pretty, encoding="utf-8")
            click.echo(f"reformatted {path}", err=True)
    if broken:
        sys.exit(2)
    if changed and (check or show_diff):
        sys.exit(1)
