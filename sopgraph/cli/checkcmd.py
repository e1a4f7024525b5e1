"""`sop check`: the static checker as a command (rendered diagnostics or JSON, exit 1 on errors)."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click

from sopgraph.cli.params import include_dirs, keep_until_exit, owns_process
from sopgraph.language.diagnostics import SourceLines, sort_key
from sopgraph.logic.budget import CHECK_CPU_BUDGET, CpuBudget
from sopgraph.logic.checker import Checked, check_file
from sopgraph.perf import batch_gc, build_then_freeze


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


def render(diag: Any, sources: dict[str, str], split: dict[str, SourceLines] | None = None) -> str:
    """Rendered like a compiler; a diagnostic about a whole file still starts with the file name
    (`split`: the sources' lines, shared between the diagnostics of one file)."""
    text = diag.render(sources, split=split)
    span = diag.span
    if span is not None and span.file and not span.line and not text.startswith(span.file):
        text = f"{span.file}: {text}"
    return text


def _profile_result(result: Checked, path: Path, clock: CpuBudget) -> Checked | None:
    """The user profile beside the `.sop` (NAME.profile.yaml) is part of the scenario: check it too,
    once the program itself has no errors, as a result of its own (its file name, its own counts),
    within what the file's analyses left of `clock`."""
    if result.scenario is None or result.errors:
        return None
    from sopgraph.cases.profilefile import profile_path_for

    if not profile_path_for(path).is_file():
        return None
    # Imported here: profiles and synthesis (yaml, pydantic models, the solver: ~0.1 s) cost start-up that
    # `--no-profile`, a program with errors and a program without a profile never need.
    from sopgraph.cases.synth import check_profile_beside

    diags, sources = check_profile_beside(path, result.scenario, cpu_budget=clock)
    if not diags and not sources:
        return None
    return Checked(file=str(profile_path_for(path)), diagnostics=sorted(diags, key=sort_key), sources=sources)


ECHO_BATCH = 1000  # rendered diagnostics written at once (100k warnings were 200k writes and flushes)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@click.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Rendered diagnostics, or a JSON array of diagnostic records.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--no-profile", is_flag=True, help="Do not check the user profile beside each FILE.")
@click.option("--cpu-budget", default=CHECK_CPU_BUDGET, show_default=True, type=click.FloatRange(min=0),
              metavar="SECONDS",
              help="CPU seconds for the analyses of each FILE (flow up to 75 %, output ranges, optional reads, then "
                   "the profile beside it); past it, a note (I302, I304, I303, I605) says at which stage and on "
                   "which question each stopped (what was found so far is still reported; the exit status is "
                   "unchanged).")
def check_cmd(files: tuple[Path, ...], fmt: str, strict: bool, no_profile: bool, cpu_budget: float) -> None:
    """Statically check FILE... (names, types, flow, reachability, unused declarations).

    The user profile beside a FILE (NAME.profile.yaml next to NAME.sop) is checked too, once
    the FILE itself has no errors; its diagnostics carry the profile's own file name and are
    counted on a summary line of their own (--no-profile skips it).

    Exit status: 0 when there are no errors (warnings allowed unless --strict), 1 otherwise.
    """
    with batch_gc():  # a batch command: see `perf.batch_gc`
        _check_files(files, fmt, strict, no_profile, cpu_budget)


def _check_files(files: tuple[Path, ...], fmt: str, strict: bool, no_profile: bool,
                 cpu_budget: float = CHECK_CPU_BUDGET) -> None:
    results: list[Checked] = []
    profile_results: list[Checked] = []
    # As the process, the loading runs without the cyclic collector and its IR is frozen (`perf.build_then_freeze`)
    loading = build_then_freeze if owns_process() else nullcontext
    for f in files:
        clock = CpuBudget(cpu_budget)  # each FILE's one budget: its analyses, then its profile's
        result = check_file(f, include_path=include_dirs(), loading=loading, cpu_budget=clock)
        results.append(result)
        profile = None if no_profile else _profile_result(result, f, clock)
        if profile is not None:
            results.append(profile)
            profile_results.append(profile)
    keep_until_exit(results)  # ended without freeing them under the console script
    errors = sum(r.errors for r in results)
    warnings = sum(r.warnings for r in results)
    if fmt == "json":
        records = [diagnostic_record(d) for r in results for d in r.diagnostics]
        click.echo(json.dumps(records, indent=2, ensure_ascii=False, sort_keys=False))
    else:
        for result in results:
            split: dict[str, SourceLines] = {}
            diags = result.diagnostics
            for at in range(0, len(diags), ECHO_BATCH):  # one write per batch, not two per diagnostic
                click.echo("".join(f"{render(d, result.sources, split)}\n\n" for d in diags[at:at + ECHO_BATCH]),
                           nl=False)
        if len(files) == 1:
            for result in results:
                click.echo(_summary(result.file, result.errors, result.warnings, strict))
        else:
            profiles = profile_results
            sops = [r for r in results if all(r is not p for p in profiles)]
            click.echo(_summary(_plural(len(files), "file"), sum(r.errors for r in sops),
                                sum(r.warnings for r in sops), strict))
            if profiles:
                click.echo(_summary(_plural(len(profiles), "profile"), sum(r.errors for r in profiles),
                                    sum(r.warnings for r in profiles), strict))
    if errors or (strict and warnings):
        sys.exit(1)


def _summary(where: str, errors: int, warnings: int, strict: bool) -> str:
    status = "ok" if not errors and not (strict and warnings) else "failed"
    return f"{where}: {_plural(errors, 'error')}, {_plural(warnings, 'warning')} ({status})"
