"""Tool commands: render (pictures), prompt (what the models read), schema (JSON Schemas)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from sopgraph.cases.profiles import profile_json_schema
from sopgraph.language.render import RenderError, format_for, render
from sopgraph.language.schema import BUILTIN_SCHEMAS, SchemaEntry, SchemaError
from sopgraph.logic.budget import LOAD_CPU_BUDGET
from sopgraph.records import Case
from sopgraph.simulation import prompts

from .params import LOAD_ONLY, cpu_budget_option, fail, load_or_exit, sop_file, write_output

# `sop schema` serves the language's schemas plus the profile file's, which the cases layer owns.
SCHEMAS = BUILTIN_SCHEMAS.with_entries(
    SchemaEntry("profile", "a user profile file (<scenario>.profile.yaml)", lambda _s: profile_json_schema()))

ROLES = ("agent", "user", "judge")


@click.command("render")
@sop_file
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here; the suffix (.svg .png .dot .mmd) picks the format.")
@click.option("--format", "fmt", type=click.Choice(["svg", "png", "dot", "mmd"]), default=None,
              help="Output format (default: from the -o suffix, else dot).")
@click.option("--heat", "heat_file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, metavar="JSON",
              help='Colour by counts: {"nodes": {"step3": 12, ...}, "edges": [["step2", "step3", 12], ...]}; '
                   "items without a count are drawn as uncovered.")
@cpu_budget_option(LOAD_CPU_BUDGET, LOAD_ONLY)
def render_cmd(file: Path, out: Path | None, fmt: str | None, heat_file: Path | None, cpu_budget: float = LOAD_CPU_BUDGET) -> None:
    """Draw FILE's SOP graph (Graphviz SVG/PNG/DOT or Mermaid)."""
    scenario = load_or_exit(file, cpu_budget=cpu_budget)
    try:
        kind = format_for(out, fmt)
        heat = read_heat(heat_file) if heat_file is not None else None
        data = render(scenario, kind, heat=heat)
    except RenderError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(f"cannot read --heat {heat_file}: {exc}")
    if out is None:
        if kind == "png":
            fail("PNG is binary: give an output file with -o OUT.png")
        write_output(data.decode("utf-8"), None)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    click.echo(f"wrote {out} ({kind}, {len(data)} bytes)", err=True)


def read_heat(path: Path) -> dict[Any, float]:
    """Heat counts from JSON: {"nodes": {id: n}, "edges": [[u, v, n], ...]} (both optional)."""
    obj = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object with `nodes` and/or `edges`")
    heat: dict[Any, float] = {}
    for node, count in (obj.get("nodes") or {}).items():
        heat[str(node)] = _count(count)
    for item in obj.get("edges") or []:
        if not isinstance(item, list) or len(item) != 3:
            raise ValueError(f"edge entries are [from, to, count], got {item!r}")
        heat[(str(item[0]), str(item[1]))] = _count(item[2])
    return heat


def _count(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"counts are numbers, got {value!r}")
    return float(value)


# ---------------------------------------------------------------------------------------------


@click.command("prompt")
@sop_file
@click.option("--role", type=click.Choice(ROLES), default="agent", show_default=True,
              help="Whose prompt: the agent under test, the user simulator or a judge.")
@click.option("--case", "case_arg", default=None, metavar="CASE_JSON",
              help="A case: a JSON object, or a .json / .jsonl file of cases (see --case-id).")
@click.option("--case-id", default=None, help="Which case of a multi-case file (default: the first).")
@click.option("--dialogue", "dialogue_file", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help='Judge only: turns as JSON list / JSON Lines of {"user": ..., "agent": ...}.')
@click.option("--turn", "turn_index", type=int, default=None,
              help="Judge only: the 1-based turn to judge (default: the last).")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here instead of stdout.")
@cpu_budget_option(LOAD_CPU_BUDGET, LOAD_ONLY)
def prompt_cmd(file: Path, role: str, case_arg: str | None, case_id: str | None, dialogue_file: Path | None,
               turn_index: int | None, out: Path | None, cpu_budget: float = LOAD_CPU_BUDGET) -> None:
    """Print the prompt a model reads for FILE (deterministic text).

    Without --case the agent role prints the SOP text and output format; with a case it prints the full
    system prompt including that case's system values. The user and judge roles need a case.
    """
    scenario = load_or_exit(file, cpu_budget=cpu_budget)
    case = _read_case(case_arg, case_id) if case_arg is not None else None
    if case is not None and case.scenario and case.scenario != scenario.name:
        click.echo(f"warning: case {case.id} is for scenario `{case.scenario}`, not `{scenario.name}`",
                   err=True)
    if role == "agent":
        text = prompts.agent_sop_text(scenario) if case is None else \
            prompts.agent_system_prompt(scenario, case.system)
    elif case is None:
        fail(f"--role {role} needs --case CASE_JSON")
    elif role == "user":
        text = prompts.user_system_prompt(case, scenario)
    else:
        turns = _read_dialogue(dialogue_file) if dialogue_file is not None else []
        index = turn_index if turn_index is not None else max(1, len(turns))
        if index < 1 or (turns and index > len(turns)):
            fail(f"--turn {index} is outside the dialogue (1..{len(turns)})")
        text = prompts.judge_prompt(scenario, turns, index, case.system)
    write_output(text, out)


def _read_case(arg: str, case_id: str | None):

    source = "--case"
    try:
        if arg.lstrip().startswith("{"):
            objs = [json.loads(arg)]
        else:
            path = Path(arg)
            source = str(path)
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".jsonl":
                objs = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                data = json.loads(text)
                objs = data if isinstance(data, list) else [data]
    except OSError as exc:
        fail(f"cannot read case file {arg}: {exc.strerror or exc}")
    except ValueError as exc:
        fail(f"{source}: invalid JSON: {exc}")
    if case_id is not None:
        objs = [o for o in objs if isinstance(o, dict) and o.get("id") == case_id]
        if not objs:
            fail(f"{source}: no case with id `{case_id}`")
    if not objs:
        fail(f"{source}: no case found")
    try:
        return Case.model_validate(objs[0])
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        fail(f"{source}: not a valid case ({problems})")


def _read_dialogue(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            turns = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            turns = json.loads(text)
    except (OSError, ValueError) as exc:
        fail(f"cannot read --dialogue {path}: {exc}")
    if not isinstance(turns, list) or not all(isinstance(t, (dict, list)) for t in turns):
        fail(f"--dialogue {path}: expected a list of turns")
    return turns


# ---------------------------------------------------------------------------------------------


@click.command("schema")
@click.argument("name", required=False)
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here instead of stdout.")
@cpu_budget_option(LOAD_CPU_BUDGET, LOAD_ONLY)
def schema_cmd(name: str | None, file: Path | None, out: Path | None, cpu_budget: float = LOAD_CPU_BUDGET) -> None:
    """Print a JSON Schema: NAME is ir, a record (case, turn, ...) or a per-scenario schema
    (agent-output, judge-output) generated from FILE. Without NAME, list the names."""
    if name is None:
        width = max(len(n) for n in SCHEMAS.names())
        for n in SCHEMAS.names():
            entry = SCHEMAS.entries[n]
            needs = "  [needs FILE]" if entry.needs_scenario else ""
            click.echo(f"{n:<{width}}  {entry.description}{needs}")
        return
    scenario = load_or_exit(file, cpu_budget=cpu_budget) if file is not None else None
    try:
        schema = SCHEMAS.get(name, scenario)
    except SchemaError as exc:
        fail(str(exc))
    write_output(json.dumps(schema, indent=2, ensure_ascii=False) + "\n", out)
    if out is not None:
        click.echo(f"wrote {out}", err=True)
    sys.stdout.flush()
