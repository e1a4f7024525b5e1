"""Authoring commands: `sop fmt` (canonical layout), `sop validate` (against labelled decisions),
`sop diff` (what a change to an SOP changes)."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

import click

from sopgraph.authoring.diff import CPU_BUDGET as DIFF_CPU_BUDGET
from sopgraph.authoring.diff import DEFAULT_BUDGET as DIFF_BUDGET
from sopgraph.authoring.diff import diff as semantic_diff
from sopgraph.authoring.diff import render_text as render_diff
from sopgraph.authoring.validate import (
    DEFAULT_BUDGET,
    ValidateError,
    parse_pairs,
    read_rows,
    render_text,
    validate,
)
from sopgraph.language.diagnostics import SopError, render_all
from sopgraph.language.fmt import format_text
from sopgraph.language.ir import Scenario
from sopgraph.logic.budget import LOAD_SHARE, VALIDATE_CPU_BUDGET, CpuBudget
from sopgraph.logic.checker import load_noted
from sopgraph.simulation.runner import RunError, read_cases

from .params import cpu_budget_option, fail, include_dirs, load_or_exit, now_option, sop_file


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


@click.command("validate")
@sop_file
@click.option("--data", "data", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Labelled decisions: CSV with a header line, JSON Lines, or a JSON array (SAGE test vectors).")
@click.option("--expect", "expects", multiple=True, metavar="OUTPUT=COLUMN",
              help="Column holding an expected final (repeat for outputs); default: the columns named like Action "
                   "and the outputs, also inside nested objects (`finals.Action`).")
@click.option("--map", "maps", multiple=True, metavar="VAR=COLUMN",
              help="Column feeding a variable (default: the column named like it); COLUMN.key reads JSON.")
@now_option("which is also the day a date in a numeric column counts to (`2024-06-20` becomes the days "
            "until then)")
@click.option("--budget", default=DEFAULT_BUDGET, show_default=True, type=click.IntRange(0),
              help="Candidate edits tried per mismatch group.")
@click.option("--min-accuracy", default=None, type=click.FloatRange(0, 1),
              help="Exit 1 when accuracy is below this (0..1).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@cpu_budget_option(VALIDATE_CPU_BUDGET, "past it the search for explaining edits stops and the group where it "
                   "stopped says so (every row is still decided; the exit status is unchanged)")
def validate_cmd(file: Path, data: Path, expects: tuple[str, ...], maps: tuple[str, ...], now: str | None,
                 budget: int, min_accuracy: float | None, fmt: str, cpu_budget: float = VALIDATE_CPU_BUDGET) -> None:
    """Decide every row of labelled data with FILE; report accuracy, a confusion matrix, and where
    and why the SOP disagrees (with the nearest edits that explain the rows)."""
    clock = CpuBudget(cpu_budget)  # the command's one budget: loading checks, then the edit search
    scenario = load_or_exit(file, cpu_budget=clock.share(LOAD_SHARE))
    try:
        report = validate(scenario, read_rows(data), expect=parse_pairs(expects, "--expect"),
                          mapping=parse_pairs(maps, "--map"), now=now, budget=budget, file=str(file),
                          data=str(data), cpu_budget=clock)
    except ValidateError as exc:
        fail(str(exc), 2)
    if fmt == "json":
        click.echo(json.dumps(report.model_dump(), indent=2, ensure_ascii=False))
    else:
        click.echo(render_text(report), nl=False)
    if min_accuracy is not None and report.accuracy < min_accuracy:
        click.echo(f"accuracy {report.accuracy:.1%} is below --min-accuracy {min_accuracy:.1%}", err=True)
        sys.exit(1)


@click.command("diff")
@click.argument("old", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("new", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cases", "cases_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Test cases (JSON Lines): report those whose reference path or finals change.")
@click.option("--budget", default=DIFF_BUDGET, show_default=True, type=click.IntRange(1),
              help="Regions the equivalence check may explore.")
@cpu_budget_option(DIFF_CPU_BUDGET, "past it the comparison answers: exit 3 says where it stopped")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def diff_cmd(old: Path, new: Path, cases_path: Path | None, budget: int, fmt: str,
             cpu_budget: float = DIFF_CPU_BUDGET) -> None:
    """Semantic diff of two versions of an SOP: paths added, removed and changed; inputs on which
    they decide differently (verified by the engine); cases whose expectations change.

    Exit status (for CI): 0 equivalent, 1 the versions decide differently (or a case changes, or
    an input changed type so that no input is valid for both), 2 error (a file does not load, bad cases file),
    3 no difference found but not proven (the budget ran out, or outputs written differently stayed undecided).
    """
    clock = CpuBudget(cpu_budget)  # the command's one budget: both files' loading checks, then the comparison
    a = _load_or_2(old, clock.share(LOAD_SHARE / 2))
    b = _load_or_2(new, clock.share(LOAD_SHARE / 2))
    cases = []
    if cases_path is not None:
        try:
            cases = read_cases(cases_path, a)  # the cases were made for OLD
        except RunError as exc:
            fail(str(exc), 2)
    report = semantic_diff(a, b, cases=cases, budget=budget, old_name=str(old), new_name=str(new),
                           cpu_budget=clock)
    if fmt == "json":
        data = report.model_dump()
        data.update(equivalent=report.equivalent, proven=report.proven)
        click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    else:
        click.echo(render_diff(report), nl=False)
    sys.exit(1 if not report.equivalent else 0 if report.proven else 3)


def _load_or_2(path: Path, clock: CpuBudget) -> Scenario:
    """Like load_or_exit (the load-time checks within `clock`, their notes on stderr), but exit 2: for
    `sop diff`, 1 means "different". The flow proofs are `sop check`'s: they would take the comparison's time."""
    try:
        loaded = load_noted(path, flow=False, include_path=include_dirs(), cpu_budget=clock)
    except SopError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(2)
    for text in render_all(loaded.diagnostics, loaded.sources):
        click.echo(text, err=True)
    assert loaded.scenario is not None
    return loaded.scenario
