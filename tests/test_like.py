"""`sop synth --like ROWS`: value distributions fitted from real labelled rows (columns mapped like `sop
validate`) dress the synthesized cases where their decisions leave room (authoring/like.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import sopgraph
from sopgraph.authoring.like import fit, id_pattern, quantiles, with_fit
from sopgraph.authoring.validate import ValidateError, read_rows
from sopgraph.cases.patterns import random_match
from sopgraph.cases.profiles import default_profile
from sopgraph.cases.synth import synthesize
from sopgraph.cli import main
from sopgraph.language import scalars
from sopgraph.logic.engine import engine_for

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "examples" / "authoring" / "card_dispute.sop"
CARD_ROWS = ROOT / "examples" / "authoring" / "card_dispute_decisions.csv"
MAPS = {"Reason": "Reason given", "Mood": "Customer mood", "Amount": "Disputed amount", "TxDate": "Transaction date",
        "CardLost": "Card lost or stolen", "ContactedMerchant": "Spoke to merchant"}
FEES = ROOT / "tests" / "data" / "fee_refund.sop"


@pytest.fixture(scope="module")
def card() -> sopgraph.Scenario:
    return sopgraph.load(CARD)


def test_fit_reads_the_columns_as_validate_maps_them(card: sopgraph.Scenario) -> None:
    rows = read_rows(CARD_ROWS)
    fitted = fit(card, rows, mapping=MAPS, now="2026-06-01", source="log.csv")
    assert fitted.rows == 60 and fitted.columns["AccountFrozen"] == "Account frozen"  # by name, as validate
    reasons = Counter(r["Reason given"] for r in rows)
    gen = fitted.generators["Reason"]
    assert dict(zip(gen.examples, gen.weights, strict=True)) == {k: float(v) for k, v in reasons.items()}
    amounts = fitted.generators["Amount"].quantiles  # `€1,200.00`, `23.5 EUR`: converted as validate does
    assert len(amounts) == 21 and amounts[0] == 9.9 and amounts == sorted(amounts)
    dates = fitted.generators["TxDate"].quantiles
    assert scalars.format_temporal("date", dates[0]) >= "2025-01-01" and dates == sorted(dates)
    assert fitted.generators["Reason"].source == "--like log.csv"


def test_cases_draw_like_the_data_where_the_decision_leaves_room(tmp_path: Path) -> None:
    """Balances in the log lie between 2,000 and 3,000 EUR: cases whose decision leaves the balance free get
    balances like those (without the data, the analysis's and varied amounts); a case that needs a balance
    under 50 keeps one. Every case still decides to what it says, and every path is still covered."""
    scenario = sopgraph.load(FEES)
    rows = tmp_path / "log.csv"
    rows.write_text("balance,request,decision\n" + "".join(
        f"{2000 + (k * 37) % 1000}.{k % 100:02d},{'Question' if k % 10 == 0 else 'Refund'},Refund\n"
        for k in range(80)), encoding="utf-8")
    fitted = fit(scenario, read_rows(rows), expect={"Action": "decision"})
    assert fitted.columns == {"Balance": "balance", "Request": "request"}  # folded names, as validate maps them
    plain = synthesize(scenario, default_profile(scenario), 40, seed=2).cases
    liked = synthesize(scenario, with_fit(default_profile(scenario), fitted), 40, seed=2).cases

    def like_the_log(cases: list) -> float:
        free = [c for c in cases if c.expected_finals["Action"] in ("Refund", "Explain")]
        return sum(2000 <= c.system["Balance"] <= 3000 for c in free) / len(free)
    assert like_the_log(liked) >= 0.8 > 0.2 >= like_the_log(plain)
    assert any(c.system["Balance"] < 50 for c in liked)  # the decision wins over the data
    engine = engine_for(scenario)
    for c in liked:
        path, finals, _ = engine.decide_trace_raw({**c.truth, **c.system})
        assert (path, finals) == (c.expected_path, c.expected_finals)
    assert {c.path_id for c in liked} == {c.path_id for c in plain}


def test_the_profiles_own_values_win_over_the_data(card: sopgraph.Scenario) -> None:
    from sopgraph.cases.profiles import profile_for
    fitted = fit(card, read_rows(CARD_ROWS), mapping=MAPS, now="2026-06-01")
    merged = with_fit(profile_for(CARD, card), fitted)
    assert "Amount" not in merged.generators and "TxDate" not in merged.generators  # the profile lists them
    assert "Reason" in merged.generators


def test_ids_are_fitted_as_their_form_never_copied(tmp_path: Path) -> None:
    scenario = sopgraph.load(FEES)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"AccountId": f"AC-{100000 + 7919 * k % 900000}", "Balance": 80 + 13 * k,
                                        "Request": "Refund" if k % 3 else "Question", "Action": "Refund"}) + "\n"
                            for k in range(50)), encoding="utf-8")
    fitted = fit(scenario, read_rows(rows))
    assert fitted.generators["AccountId"].pattern == "AC\\-[0-9]{6}"
    assert fitted.generators["Balance"].quantiles[0] == 80
    seen = {r["AccountId"] for r in read_rows(rows)}
    cases = synthesize(scenario, with_fit(default_profile(scenario), fitted), 30, seed=1).cases
    free = [c.system["AccountId"] for c in cases if c.expected_finals["Action"] == "Explain"]
    assert free and not set(free) & seen and all(scalars.compiled("AC-[0-9]{6}").fullmatch(i) for i in free)


@pytest.mark.parametrize("texts,pattern", [
    (["AC-123456", "AC-654321", "AC-000111"], "AC\\-[0-9]{6}"),
    (["AB1234", "XY9876", "QQ0001"], "[A-Z]{2}[0-9]{4}"),
    (["inv-12", "crd-1234", "abc-123"], "[a-z]{3}\\-[0-9]{2,4}"),
    (["D-4100", "D-4101", "hello", "world", "D-4102"], "D\\-[0-9]{4}"),
    (["x1", "hello world 2", "A-B-C 9"], None),
])
def test_id_pattern(texts: list[str], pattern: str | None) -> None:
    assert id_pattern(texts) == pattern


@settings(max_examples=40, deadline=None)
@given(st.lists(st.from_regex(r"[A-Z]{1,3}-?[0-9]{2,8}", fullmatch=True), min_size=1, max_size=30),
       st.integers(0, 1000))
def test_a_fitted_id_form_matches_the_ids_it_came_from(texts: list[str], seed: int) -> None:
    pattern = id_pattern(texts)
    assert pattern is not None
    compiled = scalars.compiled(pattern)
    assert sum(compiled.fullmatch(t) is not None for t in texts) * 2 >= len(texts)
    drawn = random_match(pattern, random.Random(seed))
    assert drawn is not None and compiled.fullmatch(drawn)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50))
def test_quantiles_span_the_data_in_order(xs: list[float]) -> None:
    q = quantiles(xs)
    assert q[0] == min(xs) and q[-1] == max(xs) and q == sorted(q)


def test_a_money_variable_is_not_drawn_as_zero(tmp_path: Path) -> None:
    """Real logs hold zero balances; a case gets a 0 only where its decision needs one."""
    scenario = sopgraph.load(FEES)
    rows = tmp_path / "rows.csv"
    rows.write_text("Balance,Action\n" + "".join(f"{0 if k % 2 else 300 + k},Refund\n" for k in range(40)),
                    encoding="utf-8")
    fitted = fit(scenario, read_rows(rows))
    assert fitted.generators["Balance"].quantiles[0] == 0
    cases = synthesize(scenario, with_fit(default_profile(scenario), fitted), 30, seed=3).cases
    assert all(c.system["Balance"] != 0 for c in cases)


def test_cli_like_is_deterministic_and_says_what_it_fitted(tmp_path: Path) -> None:
    """Same rows and seed, same bytes (each run in a process of its own, as `sop synth` runs)."""
    args = ["synth", str(CARD), "-n", "20", "--seed", "3", "--like", str(CARD_ROWS), "--now", "2026-06-01",
            *[x for var, col in MAPS.items() for x in ("--map", f"{var}={col}")]]
    code = "import sys; from sopgraph.cli import main; main(sys.argv[1:])"
    outs = []
    for k in range(2):
        out = tmp_path / f"c{k}.jsonl"
        proc = subprocess.run([sys.executable, "-c", code, *args, "-o", str(out)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "values drawn like the data for AccountFrozen ← Account frozen" in proc.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 20


@pytest.mark.parametrize("args,words", [
    (["--map", "Reason=Reason given"], "give --like"),
    (["--like", "{rows}", "--map", "Reasn=Reason given"], "`Reasn` is not a field or system variable"),
    (["--like", "{rows}", "--map", "Reason=Reasons"], "column `Reasons` (for Reason) is not in the data"),
    (["--like", "{empty}"], "no column feeds"),
])
def test_cli_like_mistakes_are_one_line_errors(args: list[str], words: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("Colour,Action\nred,Decline\n", encoding="utf-8")
    args = [a.format(rows=CARD_ROWS, empty=empty) for a in args]
    r = CliRunner().invoke(main, ["synth", str(CARD), "-n", "5", "-q", *args])
    assert r.exit_code == 1 and words in r.output and "Traceback" not in r.output, r.output


def test_fit_refuses_no_rows(card: sopgraph.Scenario) -> None:
    with pytest.raises(ValidateError, match="no rows"):
        fit(card, [])


def test_datetimes_are_drawn_as_finely_as_the_data_writes_them(card: sopgraph.Scenario) -> None:
    """`now` read from a column of dates: cases got `2026-03-17T19:01:20Z`; a day column gives whole days."""
    fitted = fit(card, read_rows(CARD_ROWS), mapping={**MAPS, "now": "Date opened"}, expect={"Action": "Outcome"})
    assert fitted.generators["now"].step == 86400
    liked = synthesize(card, with_fit(default_profile(card), fitted), 30, seed=1).cases
    drawn = [c.system["now"] for c in liked if not c.system["now"].startswith("2026-01-15T12")]
    assert drawn and all(n.endswith("T00:00:00Z") for n in drawn), drawn
