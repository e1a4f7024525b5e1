"""Large generated programs: `sop check` does bounded work and keeps memory linear in the stages.

Counts, not wall time (the machine may be loaded): the flow analysis reports the states and region
operations it spent (`FlowWork`), tracemalloc counts the bytes the loaded IR holds.
"""

from __future__ import annotations

import gc
import tracemalloc

from helpers import gen_sop

from sopgraph.language.parse import load_source
from sopgraph.logic.checker import check
from sopgraph.logic.flow import DEFAULT_BUDGET, MAX_REGION, STEP_BUDGET, FlowWork, flow_diagnostics

gen = gen_sop()


def test_flow_on_20k_stages_spends_a_bounded_amount_and_says_where_it_stopped() -> None:
    loaded = load_source(None, text=gen.generate(20_000, kind="realistic", seed=1), name="big.sop")
    assert loaded.scenario is not None and not loaded.diagnostics
    work = FlowWork()
    diags = flow_diagnostics(loaded.scenario, work=work)
    assert not work.skipped  # ~50 shared variables: the analysis runs, within its budgets
    assert 0 < work.states <= DEFAULT_BUDGET + 1  # the state that found the budget spent is counted
    assert work.steps <= STEP_BUDGET + MAX_REGION
    assert work.contexts <= work.states  # at most one stored context per explored state
    notes = [d for d in diags if d.code == "I302"]
    assert len(notes) == 1 and notes[0].severity == "info"
    assert notes[0].span is not None and notes[0].span.line > 0  # located, not file-wide


def test_flow_is_skipped_with_an_info_diagnostic_past_its_size_bound() -> None:
    # about one variable per stage: stages x variables is over MAX_WORK, so nothing is explored
    loaded = load_source(None, text=gen.generate(5_000, kind="chain", seed=0), name="chain.sop")
    assert loaded.scenario is not None
    work = FlowWork()
    diags = flow_diagnostics(loaded.scenario, work=work)
    assert work.skipped and work.states == 0
    assert [d.code for d in diags] == ["I301"]
    found = check(loaded.scenario)
    assert not [d for d in found if d.is_error]
    assert [d.code for d in found if d.severity == "info"] == ["I301"]


def _ir_bytes(stages: int, kind: str = "chain") -> int:
    """Bytes held by a loaded program of `stages` generated stages (its source text excluded)."""
    text = gen.generate(stages, kind=kind, seed=0)
    load_source(None, text=text, name="chain.sop")  # warm-up, untraced: the interpreter's table of
    gc.collect()  # interned names grows on the first load of this many names and stays grown
    tracemalloc.start()
    try:
        loaded = load_source(None, text=text, name="chain.sop")
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert loaded.scenario is not None and len(loaded.scenario.stages) == stages
    return held - len(text.encode())  # the normalised text is kept once, in `sources`


def test_loaded_ir_memory_is_linear_and_small_per_stage() -> None:
    small, large = _ir_bytes(1_000), _ir_bytes(5_000)
    per_stage = large / 5_000
    # ~3.3 KB a stage: a 100k-stage chain stays well under 1 GB (it was ~16 KB, with a validated
    # span and a fields set of its own in every node, ~6.2 KB with spans as pydantic models, ~5 KB
    # with a dict per node: the fast path now keeps field values inline, see `fastparse._maker`)
    assert per_stage < 4_000, per_stage
    assert large / 5_000 < 1.25 * small / 1_000  # linear: five times the stages, about five times the bytes


def test_branching_stages_hold_no_dict_per_node() -> None:
    """Stages branching two to four ways (the 100k-stage benchmark's second shape): 4.3-5.1 KB a stage
    with field values kept inline in each node, 6.8-7.6 KB when every node had a dict of its own (the
    figures vary with what the process made before)."""
    per_stage = _ir_bytes(5_000, "diamond") / 5_000
    assert per_stage < 6_000, per_stage
