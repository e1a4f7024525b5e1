"""Language commands: compile, decide."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import click

from sopgraph.language.compile import compile_graph, graph_to_graphml, graph_to_json
from sopgraph.language.render import to_dot
from sopgraph.logic.engine import DecideError, engine_for, has_action_trace, undeclared_inputs

from .params import load_or_exit, now_option, sop_file, write_output


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
@now_option("for every input that does not give its own")
def decide_cmd(file: Path, values_json: str | None, now: str | None) -> None:
    """Reference path and finals for values (one JSON line out per input, in order).

    Output per line: {"path": [...], "finals": {...}} or {"error": "..."}; the batch continues
    past failures and the exit status is 1 if any line failed. A value the path needs that is
    missing or off its domain fails the line, and so does an output that leaves its declared range.
    Keys that are not fields or system variables are ignored with a warning on stderr (once per
    key, with a did-you-mean); they never fail a line.
    A procedure (actions on the way, or actions with arguments) also gets "actions":
    [{"name", "args"}, ...] in order. A program that reads `now` needs the reference time: a
    "now" key in the line, or --now for every line (never the clock).
    """
    scenario = load_or_exit(file)
    engine = engine_for(scenario)
    with_actions = has_action_trace(scenario)
    if values_json is not None:
        lines: Iterator[bytes | str] = iter([values_json])
    else:
        lines = _input_lines(sys.stdin.buffer)
    failed = total = 0
    out = sys.stdout
    known = {v.name for v in scenario.variables.values() if v.role != "derived"}
    warned: set[str] = set()
    for lineno, raw in enumerate(lines, 1):
        total += 1
        values, record = parse_line(raw, lineno)
        if values is not None and now is not None and "now" in scenario.variables:
            values.setdefault("now", now)  # a line's own `now` wins
        if values is not None:
            unknown = [k for k in values if k not in known and k not in warned]
            if unknown:
                warned.update(unknown)
                where = f"line {lineno}: " if values_json is None else ""
                for message in undeclared_inputs(scenario, unknown):
                    click.echo(f"warning: {where}{message}", err=True)
            record = decide_values(engine, values, lineno, with_actions)
        failed += "error" in record
        out.write(_json_line(record) + "\n")
    out.flush()
    if failed:
        if values_json is None:
            click.echo(f"{failed} of {total} inputs failed", err=True)
        sys.exit(1)


MAX_LINE_BYTES = 1 << 20  # one decide input line; longer lines are refused, not buffered


def _input_lines(stream: BinaryIO) -> Iterator[bytes | str]:
    """Input lines as bytes, each at most `MAX_LINE_BYTES` (a longer line yields an error marker
    and is skipped to its end without being kept in memory)."""
    while True:
        chunk = stream.readline(MAX_LINE_BYTES + 1)
        if not chunk:
            return
        if len(chunk) > MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            while chunk and not chunk.endswith(b"\n"):
                chunk = stream.readline(MAX_LINE_BYTES)
            yield _TOO_LONG
            continue
        yield chunk


_TOO_LONG = "\x00too long"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is too large for a number")
    return value


def parse_line(raw: bytes | str, lineno: int) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(values, {}) for a good input line, else (None, {"error": ...}). Never raises: the contract
    is one output line per input line, in order, and the batch goes on."""
    if raw is _TOO_LONG:
        return None, {"error": f"line {lineno}: longer than {MAX_LINE_BYTES:,} bytes"}
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        return None, {"error": f"line {lineno}: not UTF-8 text (byte {exc.start})"}
    if lineno == 1:
        text = text.removeprefix("\ufeff")  # a byte-order mark (Windows editors)
    if not text.strip():
        return None, {"error": f"line {lineno}: empty line (expected a JSON object of values)"}
    try:
        values = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        if not isinstance(values, dict):
            raise ValueError("expected a JSON object")
        _check_strings(values)
    except RecursionError:
        return None, {"error": f"line {lineno}: invalid JSON object: nested too deeply"}
    except ValueError as exc:
        return None, {"error": f"line {lineno}: invalid JSON object: {exc}"}
    return values, {}


def decide_values(engine: Any, values: dict[str, Any], lineno: int, with_actions: bool = False) -> dict[str, Any]:
    """The output record for parsed values: {"path", "finals"} or {"error"} (never raises; a
    non-finite output is an error, never printed as `Infinity`)."""
    try:
        path, finals, actions = engine.decide_trace_raw(values)
    except DecideError as exc:
        return {"error": exc.message}
    except (RecursionError, MemoryError):
        return {"error": f"line {lineno}: the decision is too deep to compute"}
    except (ArithmeticError, ValueError, TypeError) as exc:
        return {"error": f"line {lineno}: cannot decide: {exc}"}
    bad = [k for k, v in finals.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        return {"error": f"line {lineno}: output `{bad[0]}` is not a finite number ({finals[bad[0]]}); "
                         "the values are too large for the SOP's arithmetic"}
    record: dict[str, Any] = {"path": path, "finals": finals}
    if with_actions:
        record["actions"] = actions
    return record


def decide_line(engine: Any, raw: bytes | str, lineno: int) -> dict[str, Any]:
    """The output record for one raw input line (parse, then decide)."""
    values, record = parse_line(raw, lineno)
    return record if values is None else decide_values(engine, values, lineno)


def _check_strings(values: dict[str, Any]) -> None:
    """Refuse lone surrogates (text no encoder can write back) in keys and string values."""
    for k, v in values.items():
        for s in (k, v):
            if isinstance(s, str):
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"`{k.encode('utf-8', 'backslashreplace').decode()}` holds a lone "
                                     "surrogate (\\ud800-\\udfff), which is not text") from None


def _json_line(record: dict[str, Any]) -> str:
    """One JSON line, always valid: no NaN/Infinity, lone surrogates escaped."""
    try:
        line = json.dumps(record, ensure_ascii=False, allow_nan=False)
        line.encode("utf-8")
        return line
    except (ValueError, UnicodeEncodeError):
        return json.dumps(record, ensure_ascii=True, default=str).replace("NaN", "null")
