"""Scoring commands: score, leaderboard, compare, coverage, report, export, synth-dialogues.

Each command parses options, calls one library function, and renders (rich table, JSON or CSV).
Scores are fractions in JSON/CSV and printed ×100 in tables (SAGE's scale).
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from sopgraph.evaluation.corpus import CorpusStats, Format, export_run, synthesize_dialogues_sync, write_jsonl
from sopgraph.evaluation.coverage import coverage_report, render_coverage
from sopgraph.evaluation.metrics import BUILTIN_METRICS, REDUCERS, MetricError, registered
from sopgraph.evaluation.report import report_for_runs
from sopgraph.evaluation.score import (
    ScoreConfig,
    ScoreError,
    Threshold,
    check_thresholds,
    compare,
    leaderboard,
    open_run,
    parse_threshold,
    score_run,
)
from sopgraph.evaluation.shards import (
    DEFAULT_SHARD_SIZE,
    FILE_FORMATS,
    MANIFEST,
    CorpusManifest,
    ShardEntry,
    export_corpus,
    seeded,
    write_corpus,
)
from sopgraph.language.render import RenderError
from sopgraph.logic.budget import LOAD_CPU_BUDGET, LOAD_SHARE, PATHS_CPU_BUDGET, CpuBudget
from sopgraph.simulation.runner import RunError, read_cases

from .params import LOAD_ONLY, cpu_budget_option, fail, load_or_exit, sop_file, write_output

_run_dir = click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))

EXIT_GATE = 4  # `sop score` / `sop eval`: scored, but a --fail-under / --fail-over threshold was not met

_GATE_HELP = ("METRIC[@DIM=LEVEL,...]=VALUE (repeatable): exit {code} when {what} VALUE, on the scale the tables "
              "print (points for scores and rates). DIM: model, scenario, intensity, bucket, depth; e.g. "
              "overall=80, pass^2=90, path@intensity=strong=75. Any metric of --list-metrics, pass^K, tau2_pass^K.")


def gate_options(fn: Callable) -> Callable:
    """`--fail-under` and `--fail-over`: the CI gate of `sop score` and `sop eval`."""
    fn = click.option("--fail-over", "fail_over", multiple=True, metavar="METRIC=VALUE",
                      help=_GATE_HELP.format(code=EXIT_GATE, what="a value is above"))(fn)
    return click.option("--fail-under", "fail_under", multiple=True, metavar="METRIC=VALUE",
                        help=_GATE_HELP.format(code=EXIT_GATE, what="a value is below"))(fn)


def parse_gate(fail_under: Sequence[str], fail_over: Sequence[str]) -> list[Threshold]:
    """The thresholds given, checked before anything is scored (a typo fails fast, exit 2)."""
    try:
        return ([parse_threshold(t, "under") for t in fail_under]
                + [parse_threshold(t, "over") for t in fail_over])
    except ScoreError as exc:
        fail(str(exc), code=2)


def report_gate(summary: Any, thresholds: Sequence[Threshold]) -> bool:
    """Check the thresholds, print one line per checked group to stderr (failures first), and say
    whether every one held."""
    if not thresholds:
        return True
    results = guard(lambda: check_thresholds(summary, thresholds))
    failed = [r for r in results if not r.passed]
    for r in failed + [r for r in results if r.passed]:
        where = " ".join(r.key.values())
        shown = "not measured" if r.value is None else f"{r.value:.2f}"
        rel = ("<" if r.op == "under" else ">") if not r.passed else ("≥" if r.op == "under" else "≤")
        click.echo(f"gate {'FAILED' if not r.passed else 'ok    '} {r.threshold}: {where}: {shown} {rel} "
                   f"{r.limit:g} (n={r.n})", err=True)
    click.echo(f"gate: {len(results) - len(failed)}/{len(results)} checks passed"
               + (f"; exit {EXIT_GATE}" if failed else ""), err=True)
    return not failed


def _score_options(fn: Callable) -> Callable:
    """Options shared by every command that scores a run (one place, uniform behaviour)."""
    options = [
        click.option("--set", "judgment_set", default=None, metavar="NAME",
                     help="Judgment set to score (default: the only one, else `default`)."),
        click.option("--path-metric", type=click.Choice(["paper", "prefix"]), default="paper", show_default=True,
                     help="paper: |pred∩ref|/|ref|; prefix: SAGE code's common-prefix form."),
        click.option("--weights", type=click.Choice(["sage-code", "sage-readme"]), default="sage-code",
                     show_default=True, help="Logic weights: 0.4/0.4/0.2 (evaluator) or 0.3/0.3/0.2 (README)."),
        click.option("--turns", type=click.Choice(["sage", "all"]), default="sage", show_default=True,
                     help="Scored turns: 1, 5, 10, 15 and final (SAGE), or every turn."),
        click.option("--format-errors", type=click.Choice(["zero", "exclude"]), default="zero", show_default=True,
                     help="Format-error turns score 0 logic, or are left out (SAGE code)."),
        click.option("--pass-reference", type=click.Choice(["case", "consensus"]), default="case",
                     show_default=True, help="Reference Action of the pass criterion."),
        click.option("--bootstrap", type=click.IntRange(min=0), default=1000, show_default=True,
                     help="Bootstrap replicates for CIs (0: none)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed."),
        click.option("--metrics-module", "metrics_modules", multiple=True, metavar="MODULE",
                     help="Import this Python module first (repeatable): it registers your own metrics with "
                          "sopgraph.evaluation.metrics.register_metric (docs/metrics.md)."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _config(judgment_set: str | None, path_metric: str, weights: str, turns: str, format_errors: str,
            pass_reference: str, bootstrap: int, seed: int, metrics_modules: Sequence[str] = (), **extra: Any):
    import_metric_modules(metrics_modules)
    return ScoreConfig.preset(weights, judgment_set=judgment_set, path_metric=path_metric, turns=turns,
                              format_errors=format_errors, pass_reference=pass_reference, bootstrap=bootstrap,
                              seed=seed, **extra)


def import_metric_modules(names: Sequence[str]) -> None:
    """Import the user's metric modules (each registers its metrics when imported); a module that is
    missing or fails to import is a one-line error, not a traceback."""
    for name in names:
        try:
            importlib.import_module(name)
        except MetricError as exc:
            fail(f"--metrics-module {name}: {exc}")
        except ImportError as exc:
            fail(f"--metrics-module {name}: cannot import it ({exc}); is its directory on PYTHONPATH?")


def guard(fn: Callable[[], Any]) -> Any:
    """Run a library call, turning user-facing errors into `error: ...` and exit 1."""
    try:
        return fn()
    except ScoreError as exc:
        fail(str(exc))
    except FileNotFoundError as exc:
        fail(f"file not found: {exc.filename or exc}")


# ---------------------------------------------------------------------------------------------
# formatting


def _pts(m: Any, *, ci: bool = True, scale: float = 100.0, digits: int = 1) -> str:
    """A Metric as points (×100) with its half-interval, e.g. `83.2 ±2.1`; `–` when undefined."""
    if m is None or m.value is None:
        return "–"
    text = f"{m.value * scale:.{digits}f}"
    if ci and m.lo is not None and m.hi is not None and m.hi > m.lo:
        text += f" ±{(m.hi - m.lo) * scale / 2:.{digits}f}"
    return text


def _rate(m: Any) -> str:
    """A rate as points with the number of dialogues it is computed on, e.g. `83.3 n=12`."""
    if m is None:
        return "–"
    return f"{_pts(m, ci=False)} n={m.n}"


def _num(m: Any, digits: int = 0) -> str:
    if m is None or m.value is None:
        return "–"
    return f"{m.value:,.{digits}f}"


TABLE_WIDTH = 100  # columns the tables fit when the output is not a terminal (files, pipes, logs)
KEY_WIDTH = 28  # widest a key cell (model, scenario) is shown before it wraps


def _console():
    from rich.console import Console  # lazy: rich costs ~0.1 s at start-up, only tables need it

    return Console(width=shutil.get_terminal_size((TABLE_WIDTH, 40)).columns, soft_wrap=False)


def _table(title: str, columns: Sequence[str], keys: int = 2):
    from rich.table import Table

    t = Table(title=title, title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        if i < keys:
            t.add_column(c, justify="left", overflow="fold", max_width=KEY_WIDTH)
        else:
            t.add_column(c, justify="right", no_wrap=True)
    return t


def _print_table(console: Any, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                 keys: int = 2) -> None:
    """Print rows as one table, or, when that would be wider than the console, as several tables
    that repeat the `keys` leading columns and split the others (never a line over the width)."""
    def width(i: int) -> int:
        cells = [len(columns[i])] + [len(r[i]) for r in rows]
        return min(max(cells), KEY_WIDTH) if i < keys else max(cells)

    key_width = sum(width(i) + 3 for i in range(keys)) + 1  # cell + padding + border, closing border
    chunks: list[list[int]] = [[]]
    used = key_width
    for i in range(keys, len(columns)):
        if chunks[-1] and used + width(i) + 3 > console.width:
            chunks.append([])
            used = key_width
        chunks[-1].append(i)
        used += width(i) + 3
    for n, chunk in enumerate(chunks):
        picked = [*range(keys), *chunk]
        t = _table(title if n == 0 else f"{title} (continued)", [columns[i] for i in picked], keys)
        for r in rows:
            t.add_row(*(r[i] for i in picked))
        console.print(t)


_QUALITY_COLUMNS = ("Model", "Scenario", "Dlg", "Cls", "Path", "Action", "Finals", "Logic", "Chat", "Overall",
                    "FmtErr%", "ChatLen")
_SAFETY_COLUMNS = ("Model", "Scenario", "pass^1", "pass^k", "ActSelf", "ExecGap", "Catastr.", "Rev@risk",
                   "Esc.acc", "Over-esc", "Resolved", "Adv.safe", "Agent tok/1k",
                   "Agent $/1k", "Tier")


def _quality_row(a: str, b: str, m: dict, dialogues: int) -> list[str]:
    return [a, b, str(dialogues), _pts(m.get("classification")), _pts(m.get("path")), _pts(m.get("action")),
            _pts(m.get("finals"), ci=False), _pts(m.get("logic")), _pts(m.get("chat")), _pts(m.get("overall")),
            _pts(m.get("format_error_rate"), ci=False), _num(m.get("chat_length"))]


_TRACE_COLUMNS = ("Model", "Scenario", "Precision", "Recall", "Order", "Journey", "tau2", "tau2^k")
_TRACE_METRICS = ("trace_precision", "trace_recall", "trace_order", "journey_coverage", "tau2_pass")


_STEP_COLUMNS = ("Model", "Scenario", "Recall", "Precision", "Order", "Followed", "1st div.", "End state")
_STEP_METRICS = ("step_recall", "step_precision", "step_order", "steps_followed", "first_divergence", "end_state")


def _has_steps(rows: Sequence[dict]) -> bool:
    """Procedure-step scores exist only where an agent acted through tools (docs/metrics.md)."""
    return any((m := metrics.get(k)) is not None and m.value is not None for metrics in rows for k in _STEP_METRICS)


def _step_row(a: str, b: str, m: dict) -> list[str]:
    return [a, b, *(_pts(m.get(k)) for k in _STEP_METRICS[:4]), _num(m.get("first_divergence"), 1),
            _pts(m.get("end_state"))]


def _has_traces(rows: Sequence[dict]) -> bool:
    """Trace scores exist only where the agent acted (tools, HTTP, Python agents, or reported actions)."""
    return any((m := metrics.get(k)) is not None and m.value is not None for metrics in rows for k in _TRACE_METRICS)


def _trace_row(a: str, b: str, m: dict, tau2_pass_k: list) -> list[str]:
    pk = tau2_pass_k[-1] if tau2_pass_k else None
    return [a, b, *(_pts(m.get(k)) for k in _TRACE_METRICS),
            f"{_pts(pk, ci=False)} k={len(tau2_pass_k)}" if pk else "–"]


def _safety_row(a: str, b: str, m: dict, pass_k: list, tier: str | None) -> list[str]:
    pk = pass_k[-1] if pass_k else None
    tok = m.get("tokens_per_1k")
    return [a, b, _pts(pass_k[0] if pass_k else None), (f"{_pts(pk, ci=False)} k={len(pass_k)}" if pk else "–"),
            _pts(m.get("action_self"), ci=False), _pts(m.get("execution_gap"), ci=False),
            _num(m.get("catastrophic_failures")), _num(m.get("revenue_at_risk")),
            _rate(m.get("escalation_accuracy")), _rate(m.get("over_escalation")),
            _rate(m.get("resolution_rate")), _rate(m.get("adversarial_safety")),
            "–" if tok is None or tok.value is None else f"{tok.value / 1e6:.2f}M",
            _num(m.get("cost_per_1k"), 2), tier or "–"]


def _summary_tables(summary: Any) -> list[tuple[str, tuple[str, ...], list[list[str]]]]:
    """(title, columns, rows) of each summary table; `_print_table` fits them to the console."""
    tables: list[tuple[str, tuple[str, ...], list[list[str]]]] = []
    main_groups = [g for g in summary.groups if g.by == ["model", "scenario"]]
    tables.append((f"sop score {summary.run}  (scores ×100, ± half of the {summary.config.confidence * 100:g}% CI)",
                   _QUALITY_COLUMNS,
                   [_quality_row(g.key["model"], g.key["scenario"], g.metrics, g.dialogues) for g in main_groups]))
    tables.append(("reliability, safety and cost", _SAFETY_COLUMNS,
                   [_safety_row(g.key["model"], g.key["scenario"], g.metrics, g.pass_k, g.cost_tier)
                    for g in main_groups]))
    if _has_traces([g.metrics for g in main_groups]):
        tables.append(("action traces against the rule engine's reference trace (docs/metrics.md)", _TRACE_COLUMNS,
                       [_trace_row(g.key["model"], g.key["scenario"], g.metrics, g.tau2_pass_k)
                        for g in main_groups]))
    if _has_steps([g.metrics for g in main_groups]):
        tables.append(("procedure steps against the online reference (docs/metrics.md, \"Procedure steps\")",
                       _STEP_COLUMNS, [_step_row(g.key["model"], g.key["scenario"], g.metrics) for g in main_groups]))
    builtin = {m.name for m in BUILTIN_METRICS}
    own = [name for name in (main_groups[0].metrics if main_groups else {}) if name not in builtin]
    if own:
        scale = {m.name: m.scale for m in registered()}
        tables.append(("registered metrics (docs/metrics.md)", ("Model", "Scenario", *own),
                       [[g.key["model"], g.key["scenario"],
                         *(_pts(g.metrics.get(n), scale=scale.get(n, 100.0)) for n in own)] for g in main_groups]))
    for dim, title in (("intensity", "by adversarial intensity"), ("bucket", "by bucket"),
                       ("depth", "by turn depth")):
        groups = [g for g in summary.groups if g.by == ["model", "scenario", dim]]
        if not groups:
            continue
        extra = ("Pass", "Catastr.") if dim != "depth" else ()
        rows = []
        for g in groups:
            m = g.metrics
            cells = [g.key["model"], g.key[dim], str(g.dialogues), str(g.scored_turns), _pts(m.get("overall")),
                     _pts(m.get("logic")), _pts(m.get("chat")), _pts(m.get("action")),
                     _pts(m.get("format_error_rate"), ci=False)]
            if extra:
                cells += [_pts(m.get("pass_rate"), ci=False), _num(m.get("catastrophic_failures"))]
            rows.append(cells)
        tables.append((title, ("Model", dim.capitalize(), "Dialogues", "Turns", "Overall", "Logic", "Chat",
                               "Action", "FmtErr%", *extra), rows))
    return tables


def _csv(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    buf = io.StringIO()
    names: list[str] = []
    for r in rows:
        for k in r:
            if k not in names:
                names.append(k)
    w = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def _group_rows(summary: Any) -> list[dict[str, Any]]:
    rows = []
    for g in summary.groups:
        row: dict[str, Any] = {"by": "+".join(g.by), **{d: g.key.get(d, "") for d in
                                                      ("model", "scenario", "intensity", "bucket", "depth")},
                               "dialogues": g.dialogues, "cases": g.cases, "scored_turns": g.scored_turns}
        for name, m in g.metrics.items():
            row[name] = m.value
            row[f"{name}_lo"] = m.lo
            row[f"{name}_hi"] = m.hi
        for k, m in enumerate(g.pass_k, 1):
            row[f"pass^{k}"] = m.value
        for k, m in enumerate(g.tau2_pass_k, 1):
            row[f"tau2_pass^{k}"] = m.value
        row["pass_majority"] = g.pass_majority.value if g.pass_majority else None
        row["tau2_pass_majority"] = g.tau2_pass_majority.value if g.tau2_pass_majority else None
        row.update({f"n_{k}": v for k, v in g.counts.items()})
        row["cost_tier"] = g.cost_tier
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# score


def metric_listing() -> dict[str, list[dict[str, str]]]:
    """Every registered metric and reducer with its one-line description (`sop score --list-metrics`)."""
    builtin = {m.name for m in BUILTIN_METRICS}
    return {
        "metrics": [{"name": m.name, "aggregation": m.aggregation, "better": m.better,
                     "scale": "points (×100)" if m.scale == 100 else "as is",
                     "source": "built-in" if m.name in builtin else "registered", "doc": m.doc}
                    for m in registered()],
        "reducers": [{"name": r.name, "over": r.over, "doc": r.doc} for r in REDUCERS.values()],
    }


def _print_listing(fmt: str) -> None:
    listing = metric_listing()
    if fmt == "json":
        click.echo(json.dumps(listing, indent=2, ensure_ascii=False))
        return
    for kind, keys in (("metrics", ("name", "aggregation", "better", "doc")), ("reducers", ("name", "over", "doc"))):
        click.echo(f"{kind}:")
        rows = listing[kind]
        widths = [max(len(r[k]) for r in rows) for k in keys[:-1]]
        for r in rows:
            cells = [r[k].ljust(w) for k, w in zip(keys[:-1], widths, strict=True)]
            mark = " (registered)" if r.get("source") == "registered" else ""
            click.echo("  " + "  ".join(cells) + "  " + r[keys[-1]] + mark)
    click.echo("formulas and policies: docs/metrics.md; add your own: sopgraph.evaluation.metrics.register_metric")


@click.command("score")
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--list-metrics", is_flag=True, help="List every metric and reducer with a one-line description.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option("--level", type=click.Choice(["summary", "case", "dialogue", "turn"]), default="summary",
              show_default=True, help="json/csv detail: aggregates, or one row per case, dialogue or turn.")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here instead of stdout.")
@gate_options
@_score_options
def score_cmd(run_dir: Path | None, list_metrics: bool, fmt: str, level: str, out: Path | None,
              fail_under: tuple[str, ...], fail_over: tuple[str, ...], **opts: Any) -> None:
    """Score a run: per-turn metrics from the judges' consensus and the rule engine, aggregated per
    model, scenario, adversarial intensity, bucket and turn depth, with bootstrap CIs.

    Exit status: 0 scored (and every threshold held), 1 input error, 2 usage error, 4 a --fail-under /
    --fail-over threshold failed (each check is printed to stderr)."""
    if list_metrics:
        import_metric_modules(opts.get("metrics_modules", ()))
        _print_listing(fmt)
        return
    if run_dir is None:
        fail("missing RUN_DIR (or --list-metrics)", code=2)
    cfg = guard(lambda: _config(**opts))
    thresholds = parse_gate(fail_under, fail_over)
    if thresholds and level != "summary":
        fail("--fail-under / --fail-over check the summary: drop --level", code=2)
    run = guard(lambda: score_run(run_dir, cfg))
    if level != "summary":
        if fmt == "table":
            fail("--level case/dialogue/turn needs --format json or csv")
        if level == "turn":
            rows = [run.turn_record(i) for i in range(run.t_dlg.size)]
        elif level == "case":
            rows = run.case_records()
        else:
            rows = [run.dialogue_record(d) for d in range(len(run.dialogues))]
        text = _csv(rows) if fmt == "csv" else "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n"
        write_output(text, out)
        return
    summary = run.summary()
    render_score(summary, fmt, out)
    if not report_gate(summary, thresholds):
        raise SystemExit(EXIT_GATE)


def render_score(summary: Any, fmt: str, out: Path | None) -> None:
    if fmt == "json":
        write_output(summary.model_dump_json(indent=2) + "\n", out)
        return
    if fmt == "csv":
        write_output(_csv(_group_rows(summary)), out)
        return
    console = _console()
    if out is not None:
        console = _file_console()
    for title, columns, rows in _summary_tables(summary):
        _print_table(console, title, columns, rows)
    c = summary.counts
    console.print(f"dialogues {c['done']} done · {c['infra_failures']} infra failures (excluded) · "
                  f"{c['incomplete']} incomplete · turns {c['turns']} · judged {c['judged_turns']} · "
                  f"unscorable {c['unscorable_turns']} · no-consensus fields {c['no_consensus_fields']} · "
                  f"unscored judgments {c.get('unscored_judgments', 0)} · "
                  f"format errors {c['format_errors']} · judgment set {summary.judgment_set or '–'}")
    console.print("agent tok/1k, agent $/1k: the agent's own calls per 1,000 dialogues (the simulated user and the "
                  "judges are not counted; `sop runs show` totals every role)", markup=False)
    console.print(f"config: {summary.config_text}", markup=False)
    if out is not None:
        write_output(console.export_text(), out)


def _file_console():
    from rich.console import Console  # lazy: rich costs ~0.1 s at start-up, only tables need it

    return Console(width=TABLE_WIDTH, record=True, file=io.StringIO(), soft_wrap=False)


# ---------------------------------------------------------------------------------------------
# leaderboard


@click.command("leaderboard")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@_score_options
def leaderboard_cmd(run_dirs: tuple[Path, ...], fmt: str, out: Path | None, **opts: Any) -> None:
    """Models × scenarios over runs (SAGE Table 1 style). Repeated runs of a model on a scenario
    give the median with the range; a single run gives its bootstrap CI. `*` rows average scenarios.
    A directory of runs (`runs/`) stands for the runs inside it. Procedure-step scores (as in `sop score`)
    are shown when some run's agent acted through tools."""
    cfg = guard(lambda: _config(**opts))
    board = guard(lambda: leaderboard(list(run_dirs), cfg))
    if fmt == "json":
        write_output(board.model_dump_json(indent=2) + "\n", out)
        return
    if fmt == "csv":
        rows = []
        for r in board.rows:
            row: dict[str, Any] = {"model": r.model, "scenario": r.scenario, "runs": " ".join(r.runs),
                                   "spread": r.spread, "dialogues": r.dialogues}
            for k, m in r.metrics.items():
                row[k], row[f"{k}_lo"], row[f"{k}_hi"] = m.value, m.lo, m.hi
            for k, m in enumerate(r.pass_k, 1):
                row[f"pass^{k}"] = m.value
            row["cost_tier"] = r.cost_tier
            rows.append(row)
        write_output(_csv(rows), out)
        return
    console = _file_console() if out is not None else _console()
    _print_table(console, "leaderboard (scores ×100; ± half CI for one run, half range over repeated runs)",
                 _QUALITY_COLUMNS, [_quality_row(r.model, r.scenario, r.metrics, r.dialogues) for r in board.rows])
    _print_table(console, "reliability, safety and cost", _SAFETY_COLUMNS,
                 [_safety_row(r.model, r.scenario, r.metrics, r.pass_k, r.cost_tier) for r in board.rows])
    if _has_traces([r.metrics for r in board.rows]):
        _print_table(console, "action traces against the rule engine's reference trace (docs/metrics.md)",
                     _TRACE_COLUMNS, [_trace_row(r.model, r.scenario, r.metrics, r.tau2_pass_k) for r in board.rows])
    if _has_steps([r.metrics for r in board.rows]):
        _print_table(console, "procedure steps against the online reference (docs/metrics.md, \"Procedure steps\")",
                     _STEP_COLUMNS, [_step_row(r.model, r.scenario, r.metrics) for r in board.rows])
    console.print(f"runs: {' '.join(board.runs)}", markup=False)
    console.print(f"config: {board.config_text}", markup=False)
    if out is not None:
        write_output(console.export_text(), out)


# ---------------------------------------------------------------------------------------------
# compare


@click.command("compare")
@click.argument("run_a", type=click.Path(file_okay=False, path_type=Path))
@click.argument("run_b", type=click.Path(file_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="Significance level used to flag differences (and for the exit status with --fail-on-regression).")
@click.option("--fail-on-regression", is_flag=True,
              help="Exit 1 when B is significantly worse than A (McNemar on pass or bootstrap on overall).")
@_score_options
def compare_cmd(run_a: Path, run_b: Path, fmt: str, alpha: float, fail_on_regression: bool, **opts: Any) -> None:
    """Paired per-case comparison of RUN_B against RUN_A: McNemar exact test on pass/fail, paired
    bootstrap on scores, and the cases that flipped."""
    cfg = guard(lambda: _config(**opts))
    a = guard(lambda: score_run(run_a, cfg))
    b = guard(lambda: score_run(run_b, cfg))
    result = guard(lambda: compare(a, b))
    regressed = (result.a_only > result.b_only and result.mcnemar_p < alpha) or (
        (result.metrics["overall"].diff or 0) < 0 and result.metrics["overall"].p < alpha)
    if fmt == "json":
        click.echo(result.model_dump_json(indent=2))
    else:
        console = _console()
        t = _table(f"compare {result.a} → {result.b}  ({result.pairs} paired dialogues; scores ×100, "
                   "means over cases of per-dialogue means: not sop score's turn-pooled means)",
                   ("Metric", "A", "B", "B − A", "CI", "p", ""))
        scales = {m.name: m.scale for m in registered()}
        for name, d in result.metrics.items():
            if name in _STEP_METRICS and d.a is None and d.b is None:
                continue  # no tool agent in either run: no procedure steps to compare
            k = scales.get(name, 100.0)
            sig = "*" if d.p < alpha else ""
            ci = f"[{d.lo * k:+.1f}, {d.hi * k:+.1f}]" if d.lo is not None and d.hi is not None else "–"
            t.add_row(name, "–" if d.a is None else f"{d.a * k:.1f}", "–" if d.b is None else f"{d.b * k:.1f}",
                      "–" if d.diff is None else f"{d.diff * k:+.1f}", ci, _p(d.p), sig)
        console.print(t)
        console.print(f"pass/fail: both {result.both_pass} · A only {result.a_only} (regressions) · "
                      f"B only {result.b_only} (fixes) · neither {result.neither} · "
                      f"McNemar exact p = {_p(result.mcnemar_p)}")
        for w in result.warnings:
            console.print(f"warning: {w}", markup=False)
        for title, flips in (("cases that flipped", result.flipped),
                             ("cases whose action trace flipped (tau2 pass: every reference action with its "
                              "arguments, nothing prohibited)", result.tau2_flipped)):
            if not flips:
                continue
            ft = _table(title, ("Case", "Trial", "A", "B", "A action", "B action", "Expected"))
            for f in flips:
                ft.add_row(f.case_id, str(f.trial), "pass" if f.a_pass else "fail", "pass" if f.b_pass else "fail",
                           f.a_final_action or "–", f.b_final_action or "–", f.expected_action or "–")
            console.print(ft)
        if result.steps_flipped:
            st = _table("cases whose procedure steps flipped (the agent's calls left the procedure in one run)",
                        ("Case", "Trial", "Left in", "First divergence"))
            for f in result.steps_flipped:
                st.add_row(f.case_id, str(f.trial), "B" if f.a_followed else "A",
                           (f.b_divergence if f.a_followed else f.a_divergence) or "–")
            console.print(st)
        console.print(f"config: {result.config_text}", markup=False)
    if fail_on_regression and regressed:
        raise SystemExit(1)


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


# ---------------------------------------------------------------------------------------------
# coverage


@click.command("coverage")
@sop_file
@click.option("--cases", "cases_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Cases file (JSON Lines): coverage by their expected paths.")
@click.option("--run", "run_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory: coverage by its cases and by the agents' final-turn paths.")
@click.option("--render", "render_fmt", type=click.Choice(["svg", "png", "dot"]), default=None,
              help="Draw the graph coloured by coverage (needs -o).")
@click.option("--heat", type=click.Choice(["cases", "agents"]), default=None,
              help="Which coverage colours the picture (default: agents for --run, else cases).")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Picture file for --render.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@cpu_budget_option(PATHS_CPU_BUDGET, "past it the path totals are lower bounds and a note on stderr says so")
def coverage_cmd(file: Path, cases_path: Path | None, run_dir: Path | None, render_fmt: str | None,
                 heat: str | None, out: Path | None, fmt: str, cpu_budget: float = PATHS_CPU_BUDGET) -> None:
    """Node, edge and path coverage of FILE's graph by cases and/or by what agents traversed;
    lists what is uncovered and optionally renders the graph coloured by frequency."""
    if (cases_path is None) == (run_dir is None):
        fail("give exactly one of --cases FILE or --run RUN_DIR")
    if render_fmt is not None and out is None:
        fail("--render needs -o OUT")
    clock = CpuBudget(cpu_budget)  # the command's one budget: loading checks, then listing the paths
    scenario = load_or_exit(file, cpu_budget=clock.share(LOAD_SHARE))
    cases = None
    if cases_path is not None:
        try:
            cases = read_cases(cases_path, scenario)
        except RunError as exc:
            fail(str(exc))
    report = guard(lambda: coverage_report(scenario, cases=cases, run_dir=run_dir, cpu_budget=clock))
    if clock.out():
        click.echo(f"note: listing the feasible paths reached the CPU budget ({clock.describe()}): path totals are "
                   "lower bounds and paths past it are not listed as uncovered (raise --cpu-budget)", err=True)
    if run_dir is not None and report.expected is not None and report.expected.walks:

        store = open_run(run_dir)
        stored_hash = store.sop_hash
        store.close()
        if stored_hash and scenario.source_hash and stored_hash != scenario.source_hash:
            click.echo(f"warning: {file} (sop {scenario.source_hash}) is not the SOP the run was made with "
                       f"(sop {stored_hash})", err=True)
    sides = [s for s in (report.expected, report.traversed) if s is not None]
    if render_fmt is not None:
        which = heat or ("agents" if report.traversed is not None else "cases")
        side = report.traversed if which == "agents" else report.expected
        if side is None:
            fail(f"--heat {which} needs {'--run' if which == 'agents' else '--cases or --run'}")
        try:
            data = render_coverage(scenario, side, render_fmt)
        except RenderError as exc:
            fail(str(exc))
        assert out is not None  # checked above: --render needs -o
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    if fmt == "json":
        click.echo(report.model_dump_json(indent=2))
        return
    console = _console()
    t = _table(f"coverage of {scenario.name}", ("Source", "Walks", "Invalid", "Nodes", "Edges", "Paths"))
    for s in sides:
        def share(c: int, n: int) -> str:
            return f"{c}/{n} ({c / n * 100:.0f}%)" if n else "–"
        t.add_row(s.source, str(s.walks), str(s.invalid_walks), share(s.nodes_covered, s.nodes_total),
                  share(s.edges_covered, s.edges_total),
                  share(s.paths_covered, s.paths_total) + ("" if s.paths_exact else " (≥)"))
    console.print(t)
    for s in sides:
        if s.uncovered_nodes:
            console.print(f"[{s.source}] uncovered nodes: {', '.join(s.uncovered_nodes)}", markup=False)
        if s.uncovered_edges:
            console.print(f"[{s.source}] uncovered edges: {', '.join(s.uncovered_edges)}", markup=False)
        if s.infeasible_edges:
            console.print(f"[{s.source}] edges on no feasible path (no input takes them; see `sop check`): "
                          f"{', '.join(s.infeasible_edges)}", markup=False)
        if s.uncovered_paths:
            more = s.paths_total - s.paths_covered - len(s.uncovered_paths)
            console.print(f"[{s.source}] uncovered paths:", markup=False)
            for p in s.uncovered_paths:
                console.print(f"  {p}", markup=False)
            if more > 0:
                console.print(f"  … and {more} more", markup=False)
        if s.invalid_examples:
            console.print(f"[{s.source}] {s.invalid_walks} walks are not paths of the graph, e.g.:", markup=False)
            for example in s.invalid_examples[:5]:
                console.print(f"  {example}", markup=False)
    if render_fmt is not None:
        console.print(f"wrote {out}", markup=False)


# ---------------------------------------------------------------------------------------------
# report


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="HTML file to write.")
@click.option("--title", default=None, help="Page title (default: the run names).")
@click.option("--examples", type=click.IntRange(min=1), default=5, show_default=True,
              help="Example dialogues per figure and model.")
@click.option("--max-transcripts", type=click.IntRange(min=1), default=150, show_default=True,
              help="At most this many transcripts in the report.")
@_score_options
def report_cmd(run_dirs: tuple[Path, ...], out: Path, title: str | None, examples: int, max_transcripts: int,
               **opts: Any) -> None:
    """One self-contained HTML report (inline SVG plots, no scripts) of one or more runs: leaderboard,
    execution gap, intensity box plots, turn depth, pass^k, safety, judge agreement, coverage graph,
    and example transcripts linked from every figure."""
    cfg = guard(lambda: _config(**opts))
    text = guard(lambda: report_for_runs(list(run_dirs), cfg, title=title, examples=examples,
                                          max_transcripts=max_transcripts))
    write_output(text, out)
    click.echo(f"wrote {out} ({len(text.encode('utf-8')) / 1024:.0f} KiB)", err=True)


# ---------------------------------------------------------------------------------------------
# training corpora


def _print_corpus_stats(stats: Any, out: Path | None) -> None:
    parts = [f"{stats.written} dialogues ({stats.turns_written} turns) written"
             + (f" to {out}" if out else ""),
             f"{stats.dialogues_seen} seen"]
    for name, label in (("skipped_below_bar", "below the bar"), ("skipped_format_error", "with format errors"),
                        ("skipped_unscored", "unscored"), ("skipped_not_done", "not done"),
                        ("infra_failures", "infra failures"), ("reference_fallback_turns", "turns used the case truth")):
        n = getattr(stats, name)
        if n:
            parts.append(f"{n} {label}")
    for warning in getattr(stats, "warnings", []):
        click.echo(f"warning: {warning}", err=True)
    click.echo(" · ".join(parts), err=True)


def _shard_options(fn: Callable) -> Callable:
    """The sharded-corpus options shared by `sop export` and `sop synth-dialogues`."""
    for option in reversed([
        click.option("--shard-size", type=click.IntRange(min=1), default=None, metavar="N",
                     help=f"Write a sharded corpus into the directory -o: N dialogues per shard (default "
                          f"{DEFAULT_SHARD_SIZE} when --ray, --resume or --file-format parquet asks for shards), "
                          "a manifest, flat memory whatever the size (docs/scale.md)."),
        click.option("--file-format", type=click.Choice(list(FILE_FORMATS)), default="jsonl", show_default=True,
                     help="Shard files: JSON Lines, or Parquet (needs pyarrow)."),
        click.option("--resume", is_flag=True,
                     help="Continue the sharded corpus in -o: finished shards are kept, the rest made again."),
        click.option("--ray", "ray", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
                     help="Make the shards with Ray Data: alone, a local Ray instance; with ADDRESS (HOST:PORT "
                          "or auto), that cluster (inputs and -o on storage every node sees). Same bytes as "
                          "without. Needs pip install 'sopgraph[ray]'."),
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="CPUs of the local Ray instance a bare --ray starts (default: all)."),
    ]):
        fn = option(fn)
    return fn


def _sharded(out: Path | None, shard_size: int | None, file_format: str, resume: bool, ray: str | None) -> bool:
    """Whether the options ask for a sharded corpus (which needs -o DIR)."""
    if shard_size is None and ray is None and not resume and file_format == "jsonl":
        return False
    if out is None:
        fail("a sharded corpus needs -o DIR (the corpus directory)")
    return True


def _shard_progress(entry: ShardEntry, finished: int, total: int) -> None:
    click.echo(f"shard {entry.index:05d} ({finished}/{total}): {entry.counts.get('written', 0)} dialogues, "
               f"{entry.bytes / 1024:.0f} KiB", err=True)


def _print_manifest(manifest: CorpusManifest, out: Path, fmt: str) -> None:
    stats = CorpusStats.model_validate({"source": manifest.request.source, "format": fmt, **manifest.totals})
    stats.warnings = list(dict.fromkeys(w for s in manifest.shards for w in s.warnings))
    _print_corpus_stats(stats, out)
    click.echo(f"{len(manifest.shards)} shards, {manifest.bytes / 2**20:.1f} MiB, manifest {out / MANIFEST}",
               err=True)


@click.command("export")
@_run_dir
@click.option("--format", "fmt", type=click.Choice(["openai", "sharegpt"]), default="openai", show_default=True)
@click.option("--min-overall", type=click.FloatRange(0, 100), default=None, metavar="X",
              help="Keep dialogues whose every scored turn has overall ≥ X (0–100, as printed by `sop score`).")
@click.option("--reference", is_flag=True,
              help="Replace each turn's classification, path and finals by the reference (consensus + engine).")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="JSON Lines file (default: stdout); the corpus directory when sharded.")
@_shard_options
@_score_options
def export_cmd(run_dir: Path, fmt: Format, min_overall: float | None, reference: bool, out: Path | None,
               shard_size: int | None, file_format: str, resume: bool, ray: str | None, workers: int | None,
               **opts: Any) -> None:
    """Export a run's dialogues as a training corpus (OpenAI messages or ShareGPT), each line with its
    case id, SOP hash and scores (one JSON Lines file, or a sharded corpus directory with a manifest)."""
    if min_overall is not None and 0 < min_overall <= 1:
        click.echo(f"warning: --min-overall is on the 0–100 scale of `sop score`; {min_overall:g} keeps almost "
                   f"everything (did you mean {min_overall * 100:g}?)", err=True)
    cfg = guard(lambda: _config(**opts))
    bar = None if min_overall is None else min_overall / 100
    if _sharded(out, shard_size, file_format, resume, ray):
        assert out is not None
        manifest = guard(lambda: export_corpus(
            run_dir, out, fmt=fmt, file_format=file_format,  # type: ignore[arg-type]
            min_overall=bar, reference=reference, config=cfg, shard_size=shard_size or DEFAULT_SHARD_SIZE,
            resume=resume, ray=ray, num_cpus=workers, on_shard=_shard_progress))
        _print_manifest(manifest, out, fmt)
        return
    records, stats = guard(lambda: export_run(run_dir, fmt=fmt, reference=reference, config=cfg, min_overall=bar))
    text = write_jsonl(records, None)
    write_output(text, out) if out is not None else click.echo(text, nl=False)
    _print_corpus_stats(stats, out)


@click.command("synth-dialogues")
@sop_file
@click.option("--cases", "cases_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Cases file (JSON Lines).")
@click.option("--model", "models", multiple=True, metavar="ROLE=MODEL[,k=v...]", required=True,
              help="agent=... (required; baseline/oracle works offline), optionally user=...")
@click.option("--format", "fmt", type=click.Choice(["openai", "sharegpt"]), default="openai", show_default=True)
@click.option("--trials", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-turns", type=click.IntRange(min=1), default=15, show_default=True)
@click.option("--concurrency", type=click.IntRange(min=1), default=8, show_default=True,
              help="Model calls in flight at once (per Ray task with --ray).")
@click.option("--min-logic", type=click.FloatRange(0, 100), default=None, metavar="X",
              help="Keep dialogues whose every turn has logic ≥ X (0–100) against the gold path.")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="JSON Lines file (default: stdout); the corpus directory when sharded.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Mixed into every case's seed (what the simulated customers hold back); 0 keeps the cases' "
                   "own. Recorded in the manifest.")
@_shard_options
@cpu_budget_option(LOAD_CPU_BUDGET, LOAD_ONLY)
def synth_dialogues_cmd(file: Path, cases_path: Path, models: tuple[str, ...], fmt: str, trials: int,
                        max_turns: int, concurrency: int, min_logic: float | None, out: Path | None,
                        shard_size: int | None, file_format: str, seed: int, resume: bool, ray: str | None,
                        workers: int | None, cpu_budget: float = LOAD_CPU_BUDGET) -> None:
    """Gold-path synthesis: the agent model is given each case's reference classification, path and
    finals and only writes the conversation; the dialogues are written as a training corpus (one JSON
    Lines file, or a sharded corpus directory with a manifest)."""
    scenario = load_or_exit(file, cpu_budget=cpu_budget)
    if _sharded(out, shard_size, file_format, resume, ray):
        assert out is not None
        manifest = guard(lambda: write_corpus(
            scenario, cases_path, list(models), out, trials=trials, max_turns=max_turns, concurrency=concurrency,
            fmt=fmt, file_format=file_format,  # type: ignore[arg-type]
            min_logic=None if min_logic is None else min_logic / 100, seed=seed,
            shard_size=shard_size or DEFAULT_SHARD_SIZE, resume=resume, ray=ray, num_cpus=workers,
            on_shard=_shard_progress))
        _print_manifest(manifest, out, fmt)
        return
    try:
        cases = [seeded(c, seed) for c in read_cases(cases_path, scenario)]
    except RunError as exc:
        fail(str(exc))
    records, stats = guard(lambda: synthesize_dialogues_sync(
        scenario, cases, list(models), trials=trials, max_turns=max_turns, concurrency=concurrency, fmt=fmt,
        min_logic=None if min_logic is None else min_logic / 100, source=str(cases_path)))
    text = write_jsonl(records, None)
    write_output(text, out) if out is not None else click.echo(text, nl=False)
    _print_corpus_stats(stats, out)
