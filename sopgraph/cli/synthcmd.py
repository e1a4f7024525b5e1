"""Synthesis commands: `sop synth`, `sop init`, `sop profiles check`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from sopgraph.cases.profiles import (
    Profile,
    default_profile,
    load_profile,
    parse_profile,
    profile_path_for,
    sop_path_for,
)
from sopgraph.cases.scaffold import InitError, scaffold, starter_profile
from sopgraph.cases.synth import (
    Coverage,
    Skip,
    SynthError,
    SynthStream,
    parse_mix,
    plan,
    profile_diagnostics,
    synthesize_stream,
)
from sopgraph.language import ir
from sopgraph.language.diagnostics import SopError, render_all
from sopgraph.logic.budget import LOAD_SHARE, PATHS_CPU_BUDGET, SYNTH_CPU_BUDGET, CpuBudget
from sopgraph.perf import batch_gc

from .checkcmd import diagnostic_record
from .params import cpu_budget_option, fail, load_or_exit, now_option, sop_file


def load_profile_or_exit(sop_path: Path, scenario, profile_path: Path | None):
    """The profile given, else the one beside the .sop, else the default; diagnostics on errors."""
    path = profile_path or profile_path_for(sop_path)
    if profile_path is None and not path.is_file():
        return default_profile(scenario)
    try:
        return load_profile(path, scenario)
    except SopError as exc:
        click.echo(exc.render(), err=True)
        n = sum(1 for d in exc.diagnostics if d.is_error)
        click.echo(f"\n{n} error{'s' if n != 1 else ''} in {path}", err=True)
        sys.exit(1)


EXIT_COVERAGE = 5  # the cases were written, but they cover fewer paths than -n allows (see coverage_gaps)


def coverage_gaps(cov: Coverage, skipped: Sequence[Skip], n: int) -> tuple[int, int, list[tuple[str, str]]] | None:
    """(paths covered, paths -n allows, [(path, why it has no case)]) when the cases fall short, else None.

    -n allows min(n, feasible paths). Falling short is a failure when every path was meant to be covered
    (n reaches the path count and at least one case per path was asked for) or when the paths synthesis
    could produce are fewer than -n allows (paths of unknown feasibility, paths without an engine-verified
    witness). A sample of fewer cases than paths that repeats a path is the intent balance at work, not a
    gap. Uncountable path sets (drawn by a random walk) are not checked, unless the CPU budget ran out
    (then the count itself may have stopped, and -n is what was asked)."""
    stopped = [s.reason for s in skipped if s.kind == "paths" and s.name == "budget"]  # out of CPU budget
    if n <= 0 or not (cov.paths_counted or stopped):
        return None
    covered = sum(1 for c in cov.per_path.values() if c)
    want = min(n, cov.feasible_paths) if cov.paths_counted else n
    why = {s.name: s.reason for s in skipped if s.kind == "path" or (s.kind == "pair" and " @ " not in s.name)}
    unproducible = [pid for pid in why if not cov.per_path.get(pid)]
    every_path = cov.min_per_path >= 1 and n >= cov.feasible_paths
    if covered >= want or not (every_path or stopped or cov.feasible_paths - len(unproducible) < want):
        return None
    missing = [pid for pid, c in cov.per_path.items() if not c] + [pid for pid in why if pid not in cov.per_path]
    gaps = [(pid, why.get(pid, "no case was drawn on it (raise -n, or --min-per-path 1)")) for pid in missing]
    gaps += [("(the rest)", reason + " (raise --cpu-budget)") for reason in stopped[:1]]
    return covered, want, gaps


def report_coverage_gaps(cov: Coverage, skipped: Sequence[Skip], n: int, allow: bool) -> bool:
    """Print a loud summary of a coverage shortfall to stderr; True when the command must fail."""
    found = coverage_gaps(cov, skipped, n)
    if found is None:
        return False
    covered, want, gaps = found
    head = "warning" if allow else "error"
    click.echo(f"{head}: the cases cover {covered} of the {want} paths -n {n} allows "
               f"({cov.feasible_paths if cov.paths_counted else 'uncounted'} feasible paths); {len(gaps)} without "
               "a case:", err=True)
    for pid, reason in gaps[:TABLE_ROWS]:
        action = cov.path_actions.get(pid)
        click.echo(f"  {pid}{f' ({action})' if action else ''}: {reason}", err=True)
    if len(gaps) > TABLE_ROWS:
        click.echo(f"  … and {len(gaps) - TABLE_ROWS} more", err=True)
    if not allow:
        click.echo(f"(the cases were written; --allow-gaps accepts them with exit 0; exit {EXIT_COVERAGE})", err=True)
    return not allow


def _split_multi(values: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for v in values:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


@click.command("synth")
@sop_file
@click.option("-n", "--count", "n", type=int, default=100, show_default=True,
              help="Exactly this many cases (sampled over the paths when there are more paths than N).")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the JSONL cases here instead of stdout.")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="User profile (default: FILE's <name>.profile.yaml if present, else built-in defaults).")
@click.option("--min-per-path", type=int, default=None,
              help="At least this many cases on every feasible path (refused when -n is too small). "
                   "Default: 1 when -n covers every path, else 0.")
@click.option("--balance", type=click.Choice(["intent", "path", "action"]), default="intent",
              show_default=True, help="What stage-1 sampling spreads the cases evenly over.")
@click.option("--intensity", "intensity", default="zero=1,weak=1,strong=1", show_default=True,
              help="Adversarial-intensity mix as weights, or `intent` for each intent's own intensity.")
@click.option("--persona", "personas", multiple=True, metavar="NAME",
              help="Restrict personas (repeat or comma-separate); default: the profile's.")
@click.option("--language", "languages", multiple=True, metavar="CODE",
              help="Mix these languages (repeat or comma-separate); default: the profile's or each persona's.")
@click.option("--coverage", "coverage_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the coverage summary as JSON.")
@click.option("-q", "--quiet", is_flag=True, help="No summary table.")
@click.option("--allow-gaps", is_flag=True,
              help=f"Exit 0 even when the cases cover fewer paths than -n allows (default: exit {EXIT_COVERAGE}).")
@click.option("--like", "like", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="ROWS",
              help="Real labelled rows (CSV, JSON Lines or a JSON array, as `sop validate --data`): draw each "
                   "variable's values from their distribution where the decision leaves room.")
@click.option("--map", "maps", multiple=True, metavar="VAR=COLUMN",
              help="With --like: the column feeding a variable (default: the column named like it).")
@click.option("--expect", "expects", multiple=True, metavar="OUTPUT=COLUMN",
              help="With --like: the column holding the decided action, as for `sop validate` (optional here).")
@now_option("with --like, the day a date in a numeric column counts to")
@cpu_budget_option(SYNTH_CPU_BUDGET, "planning the cases (paths, witnesses, intents) included: past it the later "
                   "paths get no cases, the skip says where planning stopped, and the exit status is 5")
@click.option("--cases", "n_deprecated", type=int, default=None, hidden=True,
              help="Deprecated alias of --count (in `sop run`, --cases names a case file).")
def synth_cmd(file: Path, n: int, seed: int, out: Path | None, profile_path: Path | None,
              min_per_path: int | None,
              balance: str, intensity: str, personas: tuple[str, ...], languages: tuple[str, ...],
              coverage_out: Path | None, quiet: bool, allow_gaps: bool, like: Path | None, maps: tuple[str, ...],
              expects: tuple[str, ...], now: str | None, n_deprecated: int | None,
              cpu_budget: float = SYNTH_CPU_BUDGET) -> None:
    """Synthesize test cases for FILE: intent-balanced sampling over feasible paths, then supplementation
    so that every path is covered (SAGE's two-stage scheme). Output: JSON Lines of `Case` records.

    Exit status: 0 done, 1 input error, 5 the cases cover fewer paths than -n allows (paths of unknown
    feasibility, paths without a verified witness; each listed with the reason; --allow-gaps: exit 0)."""
    if n_deprecated is not None:
        click.echo("warning: `sop synth --cases N` is deprecated; use `-n N` or `--count N` "
                   "(`--cases` is the case file of `sop run`)", err=True)
        n = n_deprecated
    if like is None and (maps or expects or now):
        fail("--map, --expect and --now describe the rows of --like ROWS; give --like")
    with batch_gc():  # a batch command (see `perf.batch_gc`): the profile and the plan live until exit
        stream = _synth(file, n, seed, out, profile_path, min_per_path, balance, intensity, personas, languages,
                        coverage_out, quiet, (like, maps, expects, now), cpu_budget)
    if report_coverage_gaps(stream.coverage, stream.skipped, n, allow_gaps):
        sys.exit(EXIT_COVERAGE)


def _synth(file: Path, n: int, seed: int, out: Path | None, profile_path: Path | None, min_per_path: int | None,
           balance: str, intensity: str, personas: tuple[str, ...], languages: tuple[str, ...],
           coverage_out: Path | None, quiet: bool,
           like: tuple[Path | None, tuple[str, ...], tuple[str, ...], str | None] = (None, (), (), None),
           cpu_budget: float = SYNTH_CPU_BUDGET) -> SynthStream:
    clock = CpuBudget(cpu_budget)  # the command's one budget: loading checks, then planning
    scenario = load_or_exit(file, cpu_budget=clock.share(LOAD_SHARE))
    profile = load_profile_or_exit(file, scenario, profile_path)
    if like[0] is not None:
        profile = _fitted(scenario, profile, *like, quiet=quiet)
    try:
        mix = parse_mix(intensity)
        the_plan = plan(scenario, profile, sample=n, seed=seed, cpu_budget=clock)
        stream = synthesize_stream(scenario, profile, n, seed, min_per_path=min_per_path, balance=balance,
                                   intensity_mix=mix, use_intent_intensity=mix is None,
                                   personas=_split_multi(personas) or None,
                                   languages=_split_multi(languages) or None, the_plan=the_plan)
    except SynthError as exc:
        fail(str(exc))
    stream.write(sys.stdout if out is None else out)  # each case written (and flushed) as it is made
    if coverage_out is not None:
        coverage_out.parent.mkdir(parents=True, exist_ok=True)
        coverage_out.write_text(json.dumps(stream.coverage.model_dump(mode="json"), indent=2, sort_keys=True)
                                + "\n", encoding="utf-8")
    cov = stream.coverage
    if not cov.paths_counted and not any(s.name == "budget" for s in stream.skipped):
        click.echo(f"note: {n} cases over more than {cov.feasible_paths:,} feasible paths (too many to count): "
                   "the paths are drawn by a random walk", err=True)
    elif cov.min_per_path == 0 and min_per_path is None and cov.feasible_paths > n:
        click.echo(f"note: {n} cases over {cov.feasible_paths} feasible paths: the paths are sampled "
                   f"(balanced by {cov.balance}); raise -n to cover every path", err=True)
    if not quiet and profile_path is None and not profile_path_for(file).is_file():
        click.echo(f"note: no profile {profile_path_for(file).name} beside {file.name} (give one with --profile): "
                   "every path gets a generated intent and the shipped personas (docs/synthesis.md)", err=True)
    if not quiet:
        diags = profile_diagnostics(scenario, profile, the_plan=the_plan)
        for text in render_all(diags, profile.sources):
            click.echo(text, err=True)
        _print_summary(stream, out)
    return stream


def _fitted(scenario: ir.Scenario, profile: Profile, rows: Path | None, maps: tuple[str, ...],
            expects: tuple[str, ...], now: str | None, *, quiet: bool) -> Profile:
    """The profile with the value distributions of `--like ROWS` (`authoring.like`)."""
    assert rows is not None
    # Imported here: fitting reads rows as validation does (`sop fmt`'s printer, lark: ~0.05 s of start-up)
    from sopgraph.authoring.like import fit, with_fit
    from sopgraph.authoring.validate import ValidateError, parse_pairs, read_rows

    try:
        fitted = fit(scenario, read_rows(rows), expect=parse_pairs(expects, "--expect"),
                     mapping=parse_pairs(maps, "--map"), now=now, source=str(rows))
    except ValidateError as exc:
        fail(str(exc))
    if not quiet:
        used = ", ".join(f"{n} ← {fitted.columns[n]}" for n in sorted(fitted.generators))
        click.echo(f"--like {rows}: {fitted.rows} rows; values drawn like the data for {used}", err=True)
        for name, why in sorted(fitted.skipped.items()):
            click.echo(f"--like: `{name}` not fitted ({why})", err=True)
    return with_fit(profile, fitted)


TABLE_ROWS = 50  # a summary table longer than this shows its first rows, a count of the rest and totals


def _summarised(rows: Sequence[tuple[str, ...]], total: tuple[str, ...], limit: int = TABLE_ROWS
                ) -> list[tuple[str, ...]]:
    """The rows a summary table prints (the last column is a case count): all of them up to `limit`;
    past it the first `limit - 5` rows with cases (in table order, then those without), one
    `… N more rows` line and a totals line. The full counts are in `--coverage`, the cases in the output."""
    if len(rows) <= limit:
        return list(rows)
    keep = limit - 5
    ordered = [r for r in rows if r[-1] != "0"] + [r for r in rows if r[-1] == "0"]
    rest = ordered[keep:]
    empty = sum(1 for r in rest if r[-1] == "0")
    more = (f"… {len(rest):,} more rows ({empty:,} with 0 cases)",)
    return [*ordered[:keep], more + ("",) * (len(total) - 1), total]


def _print_summary(stream: SynthStream, out: Path | None) -> None:
    from rich.console import Console  # lazy: rich costs ~0.1 s at start-up, only tables need it
    from rich.table import Table

    cov = stream.coverage
    console = Console(stderr=True, highlight=False, markup=False)
    console.print(f"{cov.scenario}: cases per path", soft_wrap=True)
    paths = Table()
    paths.add_column("path")
    paths.add_column("action")
    paths.add_column("cases", justify="right")
    path_rows = [(pid + (" (no intent)" if pid in cov.uncovered_paths else ""), cov.path_actions.get(pid, ""),
                  str(count)) for pid, count in cov.per_path.items()]
    covered = sum(1 for c in cov.per_path.values() if c)
    for row in _summarised(path_rows, (f"total: {len(path_rows):,} paths ({covered:,} with cases)", "",
                                       str(sum(cov.per_path.values())))):
        paths.add_row(*row)
    console.print(paths)
    console.print("cases per intent", soft_wrap=True)
    intents = Table()
    intents.add_column("intent")
    intents.add_column("paths", justify="right")
    intents.add_column("cases", justify="right")
    intent_rows = [(name, str(cov.intent_paths.get(name, "-")), str(count)) for name, count in cov.per_intent.items()]
    for row in _summarised(intent_rows, (f"total: {len(intent_rows):,} intents", "",
                                         str(sum(cov.per_intent.values())))):
        intents.add_row(*row)
    console.print(intents)
    console.print("cases per intensity and per bucket", soft_wrap=True)
    mix = Table()
    mix.add_column("intensity")
    mix.add_column("cases", justify="right")
    mix.add_column("bucket")
    mix.add_column("cases", justify="right")
    rows_i = list(cov.per_intensity.items())
    rows_b = sorted(cov.per_bucket.items())
    for k in range(max(len(rows_i), len(rows_b))):
        a = rows_i[k] if k < len(rows_i) else ("", "")
        b = rows_b[k] if k < len(rows_b) else ("", "")
        mix.add_row(a[0], str(a[1]), b[0], str(b[1]))
    console.print(mix)
    where = str(out) if out is not None else "stdout"
    console.print(f"{cov.cases} cases ({cov.sampled} sampled, {cov.supplemented} by supplementation, "
                  f"{cov.appended} appended) over {covered}/"
                  f"{'more than ' if not cov.paths_counted else ''}{cov.feasible_paths} feasible paths -> {where}",
                  soft_wrap=True)
    for skip in stream.skipped:
        console.print(f"skipped {skip.kind} {skip.name}: {skip.reason}", soft_wrap=True)
    if max(len(path_rows), len(intent_rows)) > TABLE_ROWS:
        console.print(f"(tables cut at {TABLE_ROWS} rows; every count: --coverage FILE)", soft_wrap=True)


@click.command("init")
@click.argument("name")
@click.option("--domain", default=None, help="What the service is about, e.g. 'hotel booking'.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Where to write the files.")
def init_cmd(name: str, domain: str | None, directory: Path) -> None:
    """Scaffold NAME.sop and NAME.profile.yaml: a commented, working scenario to edit."""
    try:
        written = scaffold(name, domain=domain, directory=directory)
    except InitError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write the scaffold: {exc}")
    for path in written:
        click.echo(f"created {path}")
    sop = written[0]
    click.echo(f"next: sop check {sop} && sop paths {sop} && sop synth {sop} -n 20 -o cases.jsonl")


@click.group("profiles")
def profiles_group() -> None:
    """User profiles (<scenario>.profile.yaml): intents, personas, intensities."""


@profiles_group.command("init")
@sop_file
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write it (default: NAME.profile.yaml beside the .sop).")
@click.option("--force", is_flag=True, help="Overwrite an existing profile.")
@cpu_budget_option(PATHS_CPU_BUDGET, "past it the paths are no longer read: a note on stderr says after how many, "
                   "and the profile is written from those")
def profiles_init_cmd(file: Path, out: Path | None, force: bool, cpu_budget: float = PATHS_CPU_BUDGET) -> None:
    """Write a starter profile for FILE: one intent per combination of classification values its paths
    require, described from the fields' `Value = meaning` texts, ready to edit."""
    clock = CpuBudget(cpu_budget)  # the command's one budget: loading checks, then reading the paths
    scenario = load_or_exit(file, cpu_budget=clock.share(LOAD_SHARE))
    target = out or profile_path_for(file)
    if target.exists() and not force:
        fail(f"{target} exists; pass --force to overwrite it, or -o to write elsewhere")
    text, intents, read = starter_profile(scenario, clock=clock)
    if clock.out():
        click.echo(f"note: reading the paths reached the CPU budget ({clock.describe()}) after {read} path"
                   f"{'' if read == 1 else 's'}: the intents cover those (raise --cpu-budget)", err=True)
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {target}: {exc}")
    click.echo(f"wrote {target}: {intents} intent{'s' if intents != 1 else ''} from {read} path{'s' if read != 1 else ''}")
    click.echo(f"next: edit the descriptions, then sop profiles check {target}")


@profiles_group.command("check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--sop", "sop_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The scenario (default: the .sop beside the profile).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@cpu_budget_option(SYNTH_CPU_BUDGET, "past it the paths not yet planned are not checked, and an I605 note says "
                   "where planning stopped")
def profiles_check_cmd(file: Path, sop_path: Path | None, fmt: str, strict: bool,
                       cpu_budget: float = SYNTH_CPU_BUDGET) -> None:
    """Check a profile FILE (or the profile beside a .sop FILE) against its scenario: syntax, names,
    values, impossible intents, intents reaching no path and paths no intent reaches."""
    if file.suffix == ".sop":
        sop = file
        file = profile_path_for(file)
    else:
        sop = sop_path or sop_path_for(file)
    if not sop.is_file():
        fail(f"no scenario found for {file} (looked for {sop}); pass --sop FILE")
    if not file.is_file():
        fail(f"no profile {file}")
    clock = CpuBudget(cpu_budget)  # the command's one budget: loading checks, then planning
    scenario = load_or_exit(sop, cpu_budget=clock.share(LOAD_SHARE))
    text = file.read_text(encoding="utf-8")
    profile, diags = parse_profile(text, scenario, file=str(file))
    if profile is not None:
        diags += profile_diagnostics(scenario, profile, cpu_budget=clock)
    errors = sum(1 for d in diags if d.is_error)
    warnings = sum(1 for d in diags if d.severity == "warning")
    if fmt == "json":

        click.echo(json.dumps([diagnostic_record(d) for d in diags], indent=2, ensure_ascii=False))
    else:
        for rendered in render_all(diags, {str(file): text}):
            click.echo(rendered)
            click.echo("")
        if profile is not None:
            click.echo(f"{len(profile.intents)} intents, {len(profile.personas)} personas")
        status = "ok" if not errors and not (strict and warnings) else "failed"
        click.echo(f"{file}: {errors} error{'s' if errors != 1 else ''}, "
                   f"{warnings} warning{'s' if warnings != 1 else ''} ({status})")
    if errors or (strict and warnings):
        sys.exit(1)
