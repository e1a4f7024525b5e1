"""`sop eval`: synth → run → score → report (→ gate) in one resumable command.

Thin: each step is the library function its own command calls (`synthesize_stream`, the runner's
`run`, `score_run`, `report_for_runs`, `check_thresholds`); this module only decides which steps a
directory still needs. The directory's `eval.json` records the settings, so re-running the same
command continues (the cases are kept, the run is resumed, scores and report are rewritten), and a
different command on the same directory is refused instead of mixing two evaluations.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from sopgraph.cases.synth import SynthError, parse_mix, plan, synthesize_stream
from sopgraph.evaluation.report import report_for_runs
from sopgraph.evaluation.score import ScoreConfig, score_run
from sopgraph.logic.budget import LOAD_SHARE, SYNTH_CPU_BUDGET, CpuBudget
from sopgraph.simulation.gateway import ModelOptionError, parse_model_option
from sopgraph.simulation.runner import RunError, in_own_loop, run
from sopgraph.simulation.store import STORE_FILE

from .params import cpu_budget_option, fail, load_or_exit, sop_file
from .runcmd import EXIT_INFRA
from .scorecmd import EXIT_GATE, gate_options, guard, parse_gate, render_score, report_gate
from .synthcmd import EXIT_COVERAGE, load_profile_or_exit, report_coverage_gaps

MANIFEST = "eval.json"
CASES = "cases.jsonl"
RUN = "run"
SCORE_JSON = "score.json"
SCORE_TEXT = "score.txt"
REPORT = "report.html"


def _manifest(file: Path, scenario: Any, n: int, seed: int, profile: Path | None, models: tuple[str, ...],
              trials: int, max_turns: int) -> dict[str, Any]:
    """What makes two `sop eval` commands the same evaluation (the SOP by content, not by path)."""
    return {"sop": file.name, "sop_hash": scenario.source_hash, "n": n, "seed": seed,
            "profile": str(profile) if profile else None, "models": sorted(models), "trials": trials,
            "max_turns": max_turns}


def _check_manifest(out: Path, wanted: dict[str, Any]) -> bool:
    """True when `out` holds this evaluation already (continue it); False when it is new. Another
    evaluation in `out` is refused, naming what differs."""
    path = out / MANIFEST
    if not path.is_file():
        if (out / RUN / STORE_FILE).exists():
            fail(f"{out / RUN} holds a run that `sop eval` did not start ({MANIFEST} is missing); use another -o DIR")
        return False
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"cannot read {path}: {exc}")
    diff = [f"{k} {stored.get(k)!r} → {v!r}" for k, v in wanted.items() if stored.get(k) != v]
    if diff:
        fail(f"{out} holds an evaluation made with other settings ({'; '.join(diff)}); use another -o DIR, "
             "or delete it to start over")
    return True


def _synth_cases(file: Path, scenario: Any, profile_path: Path | None, n: int, seed: int, target: Path,
                 allow_gaps: bool, clock: CpuBudget | None = None) -> str:
    """Write the cases (atomically: an interrupted synthesis leaves no half file) and check coverage."""
    profile = load_profile_or_exit(file, scenario, profile_path)
    try:
        stream = synthesize_stream(scenario, profile, n, seed, intensity_mix=parse_mix("zero=1,weak=1,strong=1"),
                                   the_plan=plan(scenario, profile, sample=n, seed=seed,
                                                 cpu_budget=clock or SYNTH_CPU_BUDGET))
        tmp = target.with_name(target.name + ".part")
        stream.write(tmp)
    except SynthError as exc:
        fail(str(exc))
    tmp.replace(target)
    cov = stream.coverage
    if report_coverage_gaps(cov, stream.skipped, n, allow_gaps):
        sys.exit(EXIT_COVERAGE)
    covered = sum(1 for c in cov.per_path.values() if c)
    return f"{cov.cases} cases over {covered}/{cov.feasible_paths} feasible paths"


@click.command("eval")
@sop_file
@click.option("--model", "models", multiple=True, metavar="ROLE=MODEL[,k=v...]", required=True,
              help="agent=… (required; baseline/oracle works offline), optionally user=… and judge=… as in `sop run`.")
@click.option("-n", "--count", "n", type=click.IntRange(min=1), default=20, show_default=True,
              help="Cases to synthesize.")
@click.option("--seed", type=int, default=0, show_default=True, help="Synthesis seed (same seed, same cases).")
@click.option("-o", "--output", "out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Evaluation directory (created; re-running the same command continues it).")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="User profile (default: the one beside FILE, else built-in defaults).")
@click.option("--trials", type=click.IntRange(min=1), default=1, show_default=True,
              help="Dialogues per case (for pass^k).")
@click.option("--max-turns", type=click.IntRange(min=1), default=15, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--allow-gaps", is_flag=True, help="Go on when the cases cover fewer paths than -n allows.")
@click.option("--env", "env", default=None, metavar="python:MODULE:FACTORY",
              help="An environment the tool-acting agent acts on instead of the case-scripted backend "
                   "(docs/environments.md).")
@click.option("-q", "--quiet", is_flag=True, help="No progress display and no score tables.")
@gate_options
@cpu_budget_option(SYNTH_CPU_BUDGET, "the checks at loading and planning the cases: past it, as for `sop synth` "
                   "(the skip says where planning stopped)")
def eval_cmd(file: Path, models: tuple[str, ...], n: int, seed: int, out: Path, profile_path: Path | None,
             trials: int, max_turns: int, concurrency: int, allow_gaps: bool, env: str | None, quiet: bool,
             fail_under: tuple[str, ...], fail_over: tuple[str, ...], cpu_budget: float = SYNTH_CPU_BUDGET) -> None:
    """Evaluate an agent on FILE in one command: synthesize cases, run and judge the dialogues, score
    them, write the HTML report, and check the --fail-under / --fail-over thresholds.

    Exit status: 0 done (and every threshold held), 1 input error, 2 usage error, 3 some dialogues
    failed for infrastructure reasons (run the same command again to retry them), 4 a threshold
    failed, 5 the cases cover fewer paths than -n allows (--allow-gaps goes on)."""
    thresholds = parse_gate(fail_under, fail_over)
    try:
        specs = [parse_model_option(m) for m in models]
    except ModelOptionError as exc:
        fail(str(exc), code=2)
    if not any(s.role == "agent" for s in specs):
        fail("no agent model: pass --model agent=PROVIDER/MODEL (offline floor: --model agent=baseline/oracle)", code=2)
    clock = CpuBudget(cpu_budget)  # the command's one budget for its analyses: loading checks, then planning
    scenario = load_or_exit(file, cpu_budget=clock.share(LOAD_SHARE))
    wanted = _manifest(file, scenario, n, seed, profile_path, models, trials, max_turns)
    if env is not None:  # (absent otherwise: an evaluation without an environment keeps its manifest)
        wanted["env"] = env
    resuming = _check_manifest(out, wanted)
    out.mkdir(parents=True, exist_ok=True)
    cases, run_dir = out / CASES, out / RUN
    if resuming and cases.is_file():
        click.echo(f"cases   {cases} (kept)", err=True)
    else:
        said = _synth_cases(file, scenario, profile_path, n, seed, cases, allow_gaps, clock)
        (out / MANIFEST).write_text(json.dumps(wanted, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        click.echo(f"cases   {cases} ({said})", err=True)
    resume = (run_dir / STORE_FILE).exists()
    try:
        summary = asyncio.run(in_own_loop(run(
            None if resume else file, None if resume else cases, [] if resume else specs, run_dir,
            resume=resume, trials=trials, max_turns=max_turns, concurrency=concurrency,
            progress="never" if quiet else "auto", env=None if resume else env)))
    except (RunError, ModelOptionError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail("interrupted; run the same command again to continue", code=130)
    click.echo(f"run     {run_dir} ({summary.ran} dialogues run, {summary.skipped} kept"
               + (f", {summary.infra_failures} infra failures" if summary.infra_failures else "") + ")", err=True)
    cfg = ScoreConfig()
    scored = guard(lambda: score_run(run_dir, cfg)).summary()
    (out / SCORE_JSON).write_text(scored.model_dump_json(indent=2) + "\n", encoding="utf-8")
    render_score(scored, "table", out / SCORE_TEXT)
    if not quiet:
        click.echo((out / SCORE_TEXT).read_text(encoding="utf-8"), nl=False)
    click.echo(f"scores  {out / SCORE_JSON}, {out / SCORE_TEXT}", err=True)
    html = guard(lambda: report_for_runs([run_dir], cfg, title=f"sop eval {file.name}"))
    (out / REPORT).write_text(html, encoding="utf-8")
    click.echo(f"report  {out / REPORT}", err=True)
    if not report_gate(scored, thresholds):
        raise SystemExit(EXIT_GATE)
    if summary.infra_failures:
        click.echo("some dialogues failed for infrastructure reasons; run the same command again to retry them",
                   err=True)
        raise SystemExit(EXIT_INFRA)
