"""Synthesized cases look like production data (issue 33): ids vary and never repeat inside a list, amounts
are not 0 unless the decision needs 0, and every varied case still decides to what it says."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sopgraph
from sopgraph.cases.values import random_match
from sopgraph.language import ir, scalars
from sopgraph.logic.engine import engine_for

ROOT = Path(__file__).resolve().parents[1]
FEES = ROOT / "tests" / "data" / "fee_refund.sop"
SHIPPED = sorted((ROOT / "scenarios").glob("*.sop")) + sorted((ROOT / "examples").glob("*.sop"))


@pytest.fixture(scope="module")
def fee_cases() -> list:
    return sopgraph.synthesize(sopgraph.load(FEES), 60, seed=4).cases


def test_pattern_tested_ids_are_varied(fee_cases: list) -> None:
    ids = [c.system["AccountId"] for c in fee_cases if "AccountId" in c.system]
    assert len(set(ids)) >= 0.9 * len(ids)


def test_no_two_records_of_a_list_share_an_id_and_ids_vary_across_cases(fee_cases: list) -> None:
    all_ids = []
    for c in fee_cases:
        ids = [f["id"] for f in c.system.get("Fees") or []]
        assert len(set(ids)) == len(ids), ids
        all_ids += ids
    assert len(set(all_ids)) >= 0.9 * len(all_ids)


def test_amounts_are_not_zero_and_vary(fee_cases: list) -> None:
    amounts = [f["amount"] for c in fee_cases for f in c.system.get("Fees") or []]
    assert amounts and 0 not in amounts
    assert len(set(amounts)) >= 0.8 * len(amounts)
    balances = [c.system["Balance"] for c in fee_cases if "Balance" in c.system]
    assert len(set(balances)) >= 0.8 * len(balances)


def test_every_varied_case_decides_to_what_it_says(fee_cases: list) -> None:
    engine = engine_for(sopgraph.load(FEES))
    for c in fee_cases:
        path, finals, actions = engine.decide_trace_raw({**c.truth, **c.system})
        assert (path, finals) == (c.expected_path, c.expected_finals)
        assert actions == [a if isinstance(a, dict) else a.model_dump() for a in c.expected_actions]


def test_varying_is_deterministic(tmp_path: Path) -> None:
    """Same file and seed, same bytes (each run in a process of its own, as `sop synth` runs)."""
    code = ("import sys; from sopgraph.cli import main; "
            "main(['synth', sys.argv[1], '-n', '20', '--seed', '9', '-q', '-o', sys.argv[2]])")
    outs = []
    for k in range(2):
        out = tmp_path / f"c{k}.jsonl"
        proc = subprocess.run([sys.executable, "-c", code, str(FEES), str(out)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_money_is_zero_only_where_the_decision_needs_it(path: Path) -> None:
    scenario = sopgraph.load(path)
    money = [v for v in scenario.variables.values() if v.money and isinstance(v.type, ir.NumType)
             and not v.observed and v.role != "derived"]
    if not money:
        pytest.skip("no money input")
    engine = engine_for(scenario)
    for case in sopgraph.synthesize(scenario, 40, seed=2).cases:
        values = {**case.truth, **case.system}
        for var in money:
            if values.get(var.name) != 0:
                continue
            for step in (1, 5, 50):  # a zero the decision does not need would survive some small amount
                trial = {**values, var.name: step}
                try:
                    path, finals, _ = engine.decide_trace_raw(trial)
                except Exception:  # noqa: BLE001 - out of the variable's range: the step is no witness
                    continue
                assert (path, finals.get("Action")) != (case.expected_path, case.expected_finals.get("Action")), (
                    f"{case.id}: {var.name}=0 although {var.name}={step} decides the same")


@settings(max_examples=60, deadline=None)
@given(pattern=st.sampled_from([r"^AC-[0-9]{6}$", r"[A-Z]{2}\d{4}", r"(REF|INV)-\d{3,5}", r"E[0-9]{5}",
                                r"[a-z]+@example\.com", r"\w{3}-\d\d"]), seed=st.integers(0, 10_000))
def test_random_match_matches_its_pattern(pattern: str, seed: int) -> None:
    text = random_match(pattern, random.Random(seed))
    assert text is not None and scalars.compiled(pattern).fullmatch(text)
