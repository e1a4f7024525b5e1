"""`sop check`: the static checker as a command (rendered diagnostics or JSON, exit 1 on errors)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from sopgraph.cases.synth import check_profile_beside
from sopgraph.cli.params import include_dirs
from sopgraph.language.diagnostics import sort_key
from sopgraph.logic.checker import Checked, check_file


def diagnostic_record(diag: Any) -> dict[str, Any]:
    """The JSON shape of one diagnostic (stable keys, for tools)."""
    span = diag.span
    return {
        "code": diag.code,
        "severity": diag.severity,
        "message": diag.message,
        "file": span.file if span else None,
        "line": span.line if span else None,
        "col": span.col if span else None,
        "end_line": span.end_line if span else None,
        "end_col": span.end_col if span else None,
        "hint": diag.hint,
        "witness": diag.witness,
        "notes": list(diag.notes),
    }


def render(diag: Any, sources: dict[str, str]) -> str:
    """Rendered like a compiler; a diagnostic about a whole file still starts with the file name."""
    text = diag.render(sources)
    span = diag.span
    if span is not None and span.file and not span.line and not text.startswith(span.file):
        text = f"{span.file}: {text}"
    return text


def _with_profile(result: Checked, path: Path) -> Checked:
    """A user profile beside the `.sop` (NAME.profile.yaml) is part of the scenario: check it too,
    once the program itself has no errors."""
    if result.scenario is None or result.errors:
        return result
    diags, sources = check_profile_beside(path, result.scenario)
    if not diags:
        return result
    merged = sorted([*result.diagnostics, *diags], key=sort_key)
    return result.model_copy(update={"diagnostics": merged, "sources": {**result.sources, **sources}})


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@click.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Rendered diagnostics, or a JSON array of diagnostic records.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
def check_cmd(files: tuple[Path, ...], fmt: str, strict: bool) -> None:
    """Statically check FILE... (names, types, flow, reachability, unused declarations).

    Exit status: 0 when there are no errors (warnings allowed unless --strict), 1 otherwise.
    """
    results = [_with_profile(check_file(f, include_path=include_dirs()), f) for f in files]
    errors = sum(r.errors for r in results)
    warnings = sum(r.warnings for r in results)
    if fmt == "json":
        records = [diagnostic_record(d) for r in results for d in r.diagnostics]
        click.echo(json.dumps(records, indent=2, ensure_ascii=False, sort_keys=False))
    else:
        for result in results:
            for diag in result.diagnostics:
                click.echo(render(diag, result.sources))
                click.echo("")
        where = str(files[0]) if len(files) == 1 else _plural(len(files), "file")
        status = "ok" if not errors and not (strict and warnings) else "failed"
        click.echo(f"{where}: {_plural(errors, 'error')}, {_plural(warnings, 'warning')} ({status})")
    if errors or (strict and warnings):
        sys.exit(1)
