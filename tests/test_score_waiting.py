"""A waiting turn's reference for a SAGE reply (`score._TurnEvaluator._against_waiting`) and the path the
SAGE oracle states while it asks (`providers.short_of_acting`): the stages passed, short of a trailing one
that could do the Action the reply carries (the protocol reads such a path as the action done)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import sopgraph
from sopgraph.evaluation.score import Ref, ScoreConfig, _TurnEvaluator
from sopgraph.simulation.providers import short_of_acting
from tests.test_oracle_ceiling import REFUND_OR_ASK


@pytest.fixture(scope="module")
def sop(tmp_path_factory: pytest.TempPathFactory) -> object:
    path = tmp_path_factory.mktemp("sop") / "refund_check.sop"
    path.write_text(REFUND_OR_ASK, encoding="utf-8")
    return sopgraph.load(path)


def test_short_of_acting_drops_only_trailing_stages_that_can_do_the_action(sop: object) -> None:
    assert short_of_acting(sop, ["intake"], "Refund") == []
    assert short_of_acting(sop, ["intake"], "Decline") == ["intake"]  # intake cannot decline
    assert short_of_acting(sop, ["intake", "reason"], "Refund") == []
    assert short_of_acting(sop, ["intake", "reason"], "Decline") == ["intake"]
    assert short_of_acting(sop, [], "Refund") == []
    assert short_of_acting(sop, ["nowhere", "intake"], "Refund") == ["nowhere"]  # an unknown stage stops it
    assert short_of_acting(sop, ["intake"], None) == ["intake"]


WAITING = Ref(("intake",), {}, None, (), [], pending=True)  # passed intake, waiting at reason for Reason


@pytest.mark.parametrize(("path", "action", "tools", "expected"), [
    ((), "Refund", False, (1.0, 1.0, 1.0)),  # the oracle: heading for Refund, short of intake (was path 0)
    (("intake",), "Decline", False, (1.0, 1.0, 1.0)),  # every passed stage, not acting: full marks still
    (("intake",), "Refund", False, (1.0, 0.0, 0.0)),  # refunded at intake: acted, against the whole prefix
    ((), None, False, (0.0, 1.0, 1.0)),  # no Action: nothing to stop short of, intake missing
    (("intake",), None, True, (1.0, 1.0, 1.0)),  # a tool agent acts by calls: the whole prefix
    ((), None, True, (0.0, 1.0, 1.0)),
])
def test_a_waiting_turn_holds_a_sage_reply_to_the_stages_it_can_state_without_acting(
        sop: object, path: tuple[str, ...], action: str | None, tools: bool, expected: tuple[float, ...]) -> None:
    evaluator = SimpleNamespace(cfg=ScoreConfig(bootstrap=0))
    assert _TurnEvaluator._against_waiting(evaluator, WAITING, sop, path, action, tools) == expected  # type: ignore[arg-type]
