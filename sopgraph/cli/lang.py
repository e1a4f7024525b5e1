"""Language commands: compile, decide."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from sopgraph.language.compile import compile_graph, graph_to_graphml, graph_to_json
from sopgraph.language.render import to_dot
from sopgraph.logic.engine import DecideError, engine_for, has_action_trace, undeclared_inputs

from .params import load_or_exit, sop_file, write_output


@click.command("compile")
@sop_file
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here instead of stdout.")
@click.option("--format", "fmt", type=click.Choice(["json", "graphml", "dot"]), default="json",
              show_default=True, help="node-link JSON, GraphML, or Graphviz DOT.")
def compile_cmd(file: Path, out: Path | None, fmt: str) -> None:
    """Compile FILE into its SOP graph (deterministic output)."""
    scenario = load_or_exit(file)
    graph = compile_graph(scenario)
    if fmt == "json":
        text = graph_to_json(graph)
    elif fmt == "graphml":
        text = graph_to_graphml(graph)
    else:

        text = to_dot(scenario, graph)
    write_output(text, out)


@click.command("decide")
@sop_file
@click.option("--values", "values_json", default=None, metavar="JSON",
              help="One JSON object of field/system values. Without it, JSON Lines are read from stdin.")
def decide_cmd(file: Path, values_json: str | None) -> None:
    """Reference path and finals for values (one JSON line out per input, in order).

    Output per line: {"path": [...], "finals": {...}} or {"error": "..."}; the batch continues
    past failures and the exit status is 1 if any line failed. A value the path needs that is
    missing or off its domain fails the line, and so does an output that leaves its declared range.
    Keys that are not fields or system variables are ignored with a warning on stderr (once per
    key, with a did-you-mean); they never fail a line.
    A procedure (actions on the way, or actions with arguments) also gets "actions":
    [{"name", "args"}, ...] in order.
    """
    scenario = load_or_exit(file)
    engine = engine_for(scenario)
    with_actions = has_action_trace(scenario)
    lines = [values_json] if values_json is not None else sys.stdin
    failed = total = 0
    out = sys.stdout
    known = {v.name for v in scenario.variables.values() if v.role != "derived"}
    warned: set[str] = set()
    for lineno, line in enumerate(lines, 1):
        if values_json is None and not line.strip():
            continue
        total += 1
        try:
            values = json.loads(line)
            if not isinstance(values, dict):
                raise ValueError("expected a JSON object")
        except ValueError as exc:
            failed += 1
            out.write(json.dumps({"error": f"line {lineno}: invalid JSON object: {exc}"}) + "\n")
            continue
        unknown = [k for k in values if k not in known and k not in warned]
        if unknown:
            warned.update(unknown)
            where = f"line {lineno}: " if values_json is None else ""
            for message in undeclared_inputs(scenario, unknown):
                click.echo(f"warning: {where}{message}", err=True)
        try:
            path, finals, actions = engine.decide_trace_raw(values)
            record: dict[str, object] = {"path": path, "finals": finals}
            if with_actions:
                record["actions"] = actions
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
        except DecideError as exc:
            failed += 1
            out.write(json.dumps({"error": exc.message}, ensure_ascii=False) + "\n")
    out.flush()
    if failed:
        if values_json is None:
            click.echo(f"{failed} of {total} inputs failed", err=True)
        sys.exit(1)
