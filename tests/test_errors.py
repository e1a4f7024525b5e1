"""`except sopgraph.Error` catches what the library reports, with the diagnostic code where one exists; the
CLI turns an uncaught one into one line, not a traceback (issue 34)."""

from __future__ import annotations

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
