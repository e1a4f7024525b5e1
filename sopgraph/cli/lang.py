"""Language commands: compile, decide, step."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import click

from sopgraph.language.compile import compile_graph, graph_to_graphml, graph_to_json
from sopgraph.logic.budget import LOAD_CPU_BUDGET
from sopgraph.logic.engine import DecideError, engine_for, has_action_trace, undeclared_inputs
from sopgraph.logic.session import End, Need, Session, start

from .params import LOAD_ONLY, cpu_budget_option, load_or_exit, now_option, sop_file, write_output


@click.command("compile")
@sop_file
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here instead of stdout.")
@click.option("--format", "fmt", type=click.Choice(["json", "graphml", "dot"]), default="json",
              show_default=True, help="node-link JSON, GraphML, or Graphviz DOT.")
@cpu_budget_option(LOAD_CPU_BUDGET, LOAD_ONLY)
def compile_cmd(file: Path, out: Path | None, fmt: str, cpu_budget: float = LOAD_CPU_BUDGET) -> None:
    """Compile FILE into its SOP graph (deterministic output)."""
    scenario = load_or_exit(file, cpu_budget=cpu_budget)
    graph = compile_graph(scenario)
    if fmt == "json":
        text = graph_to_json(graph)
    elif fmt == "graphml":
        text = graph_to_graphml(graph)
    else:
        from sopgraph.language.render import to_dot  # here: networkx costs `sop decide` ~0.1 s of start-up

        text = to_dot(scenario, graph)
    write_output(text, out)


@click.command("decide")
@sop_file
@click.option("--values", "values_json", default=None, metavar="JSON",
              help="One JSON object of field/system values. Without it, JSON Lines are read from stdin.")
@now_option("for every input that does not give its own")
@cpu_budget_option(LOAD_CPU_BUDGET, LOAD_ONLY)
def decide_cmd(file: Path, values_json: str | None, now: str | None, cpu_budget: float = LOAD_CPU_BUDGET) -> None:
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
    scenario = load_or_exit(file, cpu_budget=cpu_budget)
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


@click.command("step")
@sop_file
@click.option("--values", "values_json", default=None, metavar="JSON",
              help="Values known before the run starts (one JSON object; observed variables: the list of "
                   "their looks so far). The rest are asked for on stdout.")
@now_option("if the program reads it and --values does not give it")
@cpu_budget_option(LOAD_CPU_BUDGET, LOAD_ONLY)
def step_cmd(file: Path, values_json: str | None, now: str | None, cpu_budget: float = LOAD_CPU_BUDGET) -> None:
    """Run FILE step by step over JSON Lines: a line protocol for programs in any language.

    The tool writes one JSON object per line to stdout (flushed at once) and reads one per line from
    stdin. It writes {"need": NAME, "look": K, "stage": ID} when the run reads a value it was not given
    (`look` only for an observed variable: the K-th look), {"act": NAME, "args": {...}, "final": BOOL}
    when an action is carried out, and {"end": {"path", "finals", "actions"}} when the run is over
    (exit 0). After a request it reads one line: a JSON object of values, {"NAME": value, ...} (for an
    observed variable, the value of its next look; null: missing). A bad line gets {"error": ...} and
    the request again. A run that fails (a value the engine refuses, no branch applies) ends with
    {"error": ...} and exit 1, and so does input that ends before the run does. See docs/step.md.
    """
    scenario = load_or_exit(file, cpu_budget=cpu_budget)
    given: dict[str, Any] = {}
    if values_json is not None:
        parsed, record = parse_line(values_json, 1)
        if parsed is None:
            raise click.BadParameter(record["error"].removeprefix("line 1: "), param_hint="--values")
        given = parsed
    unknown = undeclared_inputs(scenario, given)
    for message in unknown:
        click.echo(f"warning: {message}", err=True)
    session = start(scenario, {k: v for k, v in given.items() if k in scenario.variables}, now=now)
    ok = step_protocol(session, _input_lines(sys.stdin.buffer), sys.stdout)
    if not ok:
        sys.exit(1)


def step_protocol(session: Session, lines: Iterator[bytes | str], out: TextIO) -> bool:
    """Drive `session` over the line protocol of `sop step` (events out, values in); True when the
    run ended, False when it failed or the input ended first. Never raises on bad input."""

    def write(record: dict[str, Any]) -> None:
        out.write(_json_line(record) + "\n")
        out.flush()

    lineno = 0
    while True:
        try:
            event = session.next()
        except DecideError as exc:
            write({"error": exc.message})
            return False
        write(event.record())
        if event.__class__ is End:
            return True
        if event.__class__ is not Need:
            continue
        while True:  # read until the request is answered
            raw = next(lines, None)
            lineno += 1
            if raw is None:
                write({"error": f"input ended while the run waits for {_asked(session.need)}; nothing was decided"})
                return False
            problem = _provide_line(session, raw, lineno)
            if problem is None:
                break
            write({"error": problem})
            write(event.record())


def _provide_line(session: Session, raw: bytes | str, lineno: int) -> str | None:
    """Give the values of one input line to the session; the problem with the line, or None."""
    values, record = parse_line(raw, lineno)
    if values is None:
        return str(record["error"])
    if not values:
        return f"line {lineno}: no value given (expected {{\"NAME\": value}})"
    for name, value in values.items():  # the values before a refused one are taken
        try:
            session.provide(name, value)
        except DecideError as exc:
            return f"line {lineno}: {exc.message}"
    return None  # a line answering something else is taken too: the run asks again if it still needs it


def _asked(need: Need | None) -> str:
    if need is None:  # pragma: no cover - the protocol reads only while a request is open
        return "a value"
    return f"`{need.variable}`" + (f" (look {need.look})" if need.look else "") + f" at {need.stage}"


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


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)  # built once, not per line
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


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
        values = _DECODER.decode(text)
        if not isinstance(values, dict):
            raise ValueError("expected a JSON object")
        if isinstance(raw, str) or b"\\u" in raw:  # strict UTF-8 bytes hold no surrogate; only a \u escape can
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
        line = _ENCODER.encode(record)
        line.encode("utf-8")
        return line
    except (ValueError, UnicodeEncodeError):
        return json.dumps(record, ensure_ascii=True, default=str).replace("NaN", "null")
