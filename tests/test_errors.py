"""`except sopgraph.Error` catches what the library reports, with the diagnostic code where one exists; the
CLI turns an uncaught one into one line, not a traceback (issue 34)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main


def test_a_bad_program_is_a_sopgraph_error_with_its_code() -> None:
    with pytest.raises(sopgraph.Error) as info:
        sopgraph.load(text='scenario x "X"\nfield A: Yes | No "a"\nstage s { when B -> do Go }\n')
    assert isinstance(info.value, sopgraph.SopError)
    assert info.value.code is not None and info.value.code.startswith("E")


def test_a_bad_decision_input_is_a_sopgraph_error() -> None:
    scenario = sopgraph.load("scenarios/telecom_package.sop")
    with pytest.raises(sopgraph.Error):
        sopgraph.decide(scenario, {"ConsumptionType": "Bogus"})


def test_bad_library_arguments_are_sopgraph_errors_and_value_errors() -> None:
    from sopgraph.evaluation.stats import pass_hat_k

    with pytest.raises(sopgraph.ArgumentError) as info:
        pass_hat_k(3, 4, 1)
    assert isinstance(info.value, ValueError) and isinstance(info.value, sopgraph.Error)


def test_the_cli_maps_an_uncaught_sopgraph_error_to_one_line() -> None:
    @main.command("boom-test-only")
    def boom() -> None:
        raise sopgraph.ArgumentError("the thing is wrong")

    try:
        result = CliRunner().invoke(main, ["boom-test-only"])
    finally:
        main.commands.pop("boom-test-only", None)
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: the thing is wrong"
    assert "Traceback" not in result.output
    assert isinstance(boom, click.Command)


ROOT = Path(__file__).resolve().parents[1]
OLD = ('scenario pricing "Pricing"\nfield Tier: Basic | Gold "the tier"\naction Ok "ok"\naction Refer "refer"\n'
       'stage s "s" {\n    when Tier == Gold -> do Refer\n    otherwise -> do Ok\n}\n')
NEW = OLD.replace('field Tier: Basic | Gold "the tier"', 'field Tier: int[0..5] "the tier"').replace(
    "Tier == Gold", "Tier > 2")


def _entry_points(tmp: Path) -> dict[str, Callable[[], object]]:
    """Each public entry point of a stage, given input of the right type that it cannot use."""
    from sopgraph.authoring import diff, validate
    from sopgraph.cases.profiles import load_profile
    from sopgraph.evaluation.score import ScoreConfig, score_run
    from sopgraph.logic.domain import full_box, witness
    from sopgraph.simulation.gateway import Gateway, parse_model_option
    from sopgraph.simulation.judge import parse_judge_turns
    from sopgraph.simulation.runner import read_cases
    from sopgraph.simulation.store import RunStore

    scenario = sopgraph.load(ROOT / "scenarios" / "telecom_package.sop")
    (tmp / "bad.profile.yaml").write_text("intents: 3\n", encoding="utf-8")
    (tmp / "garbage").mkdir()
    (tmp / "garbage" / "run.sqlite").write_bytes(b"not a database at all")
    RunStore.create(tmp / "run", {}).close()
    read_only = RunStore.open(tmp / "run", read_only=True)
    failed = sopgraph.start(scenario, {"ConsumptionType": 3})
    rows = [{"Action": "Recommend", "ConsumptionType": "Bogus"}]
    return {
        "load: no such file": lambda: sopgraph.load(tmp / "missing.sop"),
        "decide: a value off its domain": lambda: sopgraph.decide(scenario, {"ConsumptionType": "Bogus"}),
        "session: a variable the program lacks": lambda: sopgraph.start(scenario).provide("Nope", 1),
        "session: a value off its domain": lambda: sopgraph.start(scenario).provide("ConsumptionType", "Bogus"),
        "session: a run that failed, asked again": lambda: [failed.run() for _ in range(2)],
        "synthesize: a negative count": lambda: sopgraph.synthesize(scenario, -1),
        "validate: no such data file": lambda: validate.read_rows(tmp / "missing.csv"),
        "validate: an expected column not in the data": lambda: validate.validate(
            scenario, rows, expect={"Action": "Outcome"}),
        "validate: a reference time that is no date": lambda: validate.validate(
            scenario, rows, expect={"Action": "Action"}, now="yesterday"),
        "diff: two versions no input is valid for": lambda: diff.joint_scenario(sopgraph.load(text=OLD),
                                                                                sopgraph.load(text=NEW)),
        "profiles: a profile of the wrong shape": lambda: load_profile(tmp / "bad.profile.yaml", scenario),
        "run store: not a run directory": lambda: RunStore.open(tmp / "missing"),
        "run store: a file that is no store": lambda: RunStore.open(tmp / "garbage"),
        "run store: a directory that holds a run": lambda: RunStore.create(tmp / "run", {}),
        "run store: a write to a read-only store": lambda: read_only.set_meta("k", 1),
        "run store: a run without its program": lambda: read_only.scenario(),
        "score: not a run directory": lambda: score_run(tmp / "missing"),
        "run: no such cases file": lambda: read_cases(tmp / "missing.jsonl"),
        "models: an option without a model": lambda: parse_model_option("agent="),
        "gateway: a concurrency below one": lambda: Gateway(concurrency=0, cache=False),
        "witness: an unknown style": lambda: witness(scenario, full_box(scenario), style="x"),
        "judge turns: not a turn": lambda: parse_judge_turns("first,abc"),
        "score: a confidence outside (0, 1)": lambda: ScoreConfig(confidence=2),
        "score: a weight of the wrong type": lambda: ScoreConfig(w_path="heavy"),
    }


def test_every_public_entry_point_reports_bad_input_as_a_sopgraph_error(tmp_path: Path) -> None:
    """The session (which `sop step` drives; its line protocol answers bad lines in tests/test_cli_lang.py),
    validate, diff, profiles, the run store, scoring, runs, model options and the gateway: what a user gets
    wrong is a `sopgraph.Error`, never a bare ValueError. (A wrong *type* of argument stays the caller's
    TypeError/AttributeError; a pydantic *record* built with bad fields raises pydantic's ValidationError,
    but a configuration such as ScoreConfig is bad input: a sopgraph.Error.)"""
    escaped = {}
    for name, call in _entry_points(tmp_path).items():
        try:
            call()
        except sopgraph.Error:
            continue
        except Exception as exc:  # noqa: BLE001 - what escapes is the finding
            escaped[name] = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
        else:
            escaped[name] = "no error"
    assert escaped == {}

