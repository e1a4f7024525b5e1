"""CPU budgets (`sopgraph.logic.budget`): one budget per command, shared by its analyses, and every command
that analyses a `.sop` stops at it with a located note and its documented exit status (issue 31).

The commands run an expensive program (`COSTLY`: six guards over a list of records, a pattern and an optional
value; ~40 s of CPU unbounded) with `--cpu-budget 0`. Nothing is timed: the budgets read the CPU clock, and
the assertions are about what each command says and how it ends."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import ORDER

from sopgraph.cli import main
from sopgraph.records import Case, Persona

COSTLY = ORDER.replace('action Reject "r"', 'output Fee: float[0..20000] "what is paid back"\naction Reject "r"').replace(
    "otherwise -> do Pay\n", "otherwise -> do Pay { Fee = Refund }\n")
"""`tests/test_solver.py`'s ORDER with a bounded output, so that the load-time output-range check has work."""

VALUES = {"Reason": "Damaged", "Mood": "Calm", "Lines": [{"price": 10, "returned": True, "food": False}],
          "OrderId": "ORD-123456", "Coupon": None}
LOAD_NOTE = "info[I304]: output-range check incomplete: it reached its CPU budget (0 s of CPU) at stage `s`"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("costly")
    sop = d / "o.sop"
    sop.write_text(COSTLY)
    (d / "rows.jsonl").write_text(json.dumps({**VALUES, "Action": "Reject"}) + "\n")  # the SOP says Pay
    profile = d / "o.yaml"
    profile.write_text("scenario: o\ndescription: Orders.\nintents:\n  damaged:\n    description: A damaged item.\n"
                       "    requires: {Reason: Damaged}\n")
    case = Case(id="c1", scenario="o", path_id="P06", intent="damaged", persona=Persona(name="p"),
                truth={"Reason": "Damaged", "Mood": "Calm"},
                system={k: v for k, v in VALUES.items() if k not in ("Reason", "Mood")},
                expected_path=["s"], expected_finals={"Action": "Pay", "Fee": 10})
    (d / "cases.jsonl").write_text(case.model_dump_json() + "\n")
    return {"sop": sop, "dir": d, "profile": profile}


# (command line, exit status, what it must say): each stops at its budget and says where, and goes on
COMMANDS = {
    "check": (["check", "{sop}"], 0, [
        "info[I302]: flow analysis incomplete: the analysis reached its CPU budget (0 s of CPU) at stage `s`",
        LOAD_NOTE, "info[I303]: optional-value analysis incomplete: the analysis reached its CPU budget "
        "(0 s of CPU) at stage `s`"]),
    "paths --count": (["paths", "--count", "{sop}"], 0, [
        "the number of feasible paths is unknown: the count reached its CPU budget (0 s of CPU) at stage `s` "
        "while deciding which of its branches", LOAD_NOTE]),
    "paths --count json": (["paths", "--count", "--format", "json", "{sop}"], 0, ['"complete": false',
                                                                                   '"stopped": "the count reached']),
    "paths": (["paths", "--format", "jsonl", "{sop}"], 0, [
        "the listing reached its CPU budget (0 s of CPU) before the first path", LOAD_NOTE]),
    "paths --sample": (["paths", "--sample", "3", "{sop}"], 0, ["sampling reached its CPU budget (0 s of CPU)"]),
    "synth": (["synth", "{sop}", "-n", "3", "-q", "-o", "{dir}/cases_out.jsonl"], 5, [
        "the count reached its CPU budget (0 s of CPU) at stage `s`", LOAD_NOTE]),
    "decide": (["decide", "{sop}", "--values", json.dumps(VALUES)], 0, [LOAD_NOTE, '"Action": "Pay"']),
    "step": (["step", "{sop}", "--values", json.dumps(VALUES)], 0, [LOAD_NOTE, '"end"']),
    "compile": (["compile", "{sop}"], 0, [LOAD_NOTE, '"directed": true']),
    "render": (["render", "{sop}", "-o", "{dir}/o.dot"], 0, [LOAD_NOTE]),
    "prompt": (["prompt", "{sop}"], 0, [LOAD_NOTE, "## System variables"]),
    "schema": (["schema", "decide-input", "{sop}"], 0, [LOAD_NOTE, '"properties"']),
    "validate": (["validate", "{sop}", "--data", "{dir}/rows.jsonl"], 0, [
        LOAD_NOTE, "search stopped at its CPU budget at stage s after 0 candidate edits"]),
    "diff": (["diff", "{sop}", "{sop}"], 3, [LOAD_NOTE, "CPU budget"]),
    "profiles init": (["profiles", "init", "{sop}", "-o", "{dir}/init.yaml", "--force"], 0, [
        LOAD_NOTE, "reading the paths reached the CPU budget (0 s of CPU) after 0 paths"]),
    "profiles check": (["profiles", "check", "{profile}", "--sop", "{sop}"], 0, [
        LOAD_NOTE, "info[I605]: profile check incomplete: synthesis reached its CPU budget (0 s of CPU)"]),
    # the run stops for want of a model, after the load-time checks said where they stopped
    "run": (["run", "{sop}", "--cases", "{dir}/cases.jsonl", "-o", "{dir}/run"], 1, [LOAD_NOTE, "no agent model"]),
    "coverage": (["coverage", "{sop}", "--cases", "{dir}/cases.jsonl"], 0, [
        LOAD_NOTE, "listing the feasible paths reached the CPU budget (0 s of CPU): path totals are lower bounds"]),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_analysing_command_stops_at_its_cpu_budget_and_says_where(name: str, files: dict[str, Path]) -> None:
    args, status, said = COMMANDS[name]
    argv = [a.replace("{sop}", str(files["sop"])).replace("{dir}", str(files["dir"]))
            .replace("{profile}", str(files["profile"])) for a in args]
    result = CliRunner().invoke(main, [*argv, "--cpu-budget", "0"])
    assert result.exit_code == status, result.output
    assert "Traceback" not in result.output
    for text in said:
        assert text in result.output, (text, result.output)


def test_every_command_that_loads_a_sop_takes_cpu_budget() -> None:
    """`--cpu-budget` on each command whose module loads a `.sop` (`load_or_exit` or its own load)."""
    from sopgraph.cli import COMMAND_MODULES, command_module, top_level_commands

    loading = []
    for module in COMMAND_MODULES:
        mod = command_module(module)
        for command in top_level_commands(mod):
            subs = command.commands.values() if hasattr(command, "commands") else [command]
            for sub in subs:
                source = (sub.callback.__code__.co_names if sub.callback else ())
                if {"load_or_exit", "_load_or_2", "_check_files", "_synth"} & set(source):
                    loading.append(sub)
    assert len(loading) >= 17  # check, compile, decide, step, paths, synth, profiles init/check, run, ...
    assert [c.name for c in loading if "cpu_budget" not in {p.name for p in c.params}] == []


def test_a_part_ends_where_the_later_parts_shares_begin() -> None:
    from sopgraph.logic.budget import CpuBudget

    whole = CpuBudget(20)
    flow = whole.leaving(0.25)
    assert flow.deadline == pytest.approx(whole.deadline - 5) and flow.describe() == "15 of 20 s of CPU"
    assert whole.leaving(0).deadline == whole.deadline and whole.describe() == "20 s of CPU"
    assert CpuBudget(math.inf).leaving(0.25).deadline == math.inf and not CpuBudget(-1).out()
    part = whole.share(2.0)
    assert part.deadline == whole.deadline  # never past the whole


def test_an_active_budget_stops_a_question_only_inside_its_block() -> None:
    from sopgraph.logic.budget import CpuBudget, OutOfCpu, active, check_active

    spent = CpuBudget(0)
    deadline = time.process_time()
    while time.process_time() <= deadline:  # let the CPU clock move past the deadline
        pass
    check_active()  # no budget active: nothing happens
    with pytest.raises(OutOfCpu) as stop, active(spent):
        check_active()
    assert "CPU budget (0 s of CPU) reached" in str(stop.value)
    check_active()  # reset when the block ends
    with active(CpuBudget(math.inf)):
        check_active()
