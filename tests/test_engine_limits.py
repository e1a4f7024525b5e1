"""Any program that checks runs (issue 13): the generated engine has no Python nesting or
recursion limits, and domain operations on long `and`/`or` chains stay linear."""

from __future__ import annotations

import pytest

from sopgraph.language.parse import MAX_DERIVED_CHAIN
from sopgraph.logic import domain
from sopgraph.logic.checker import load
from sopgraph.logic.engine import engine_for, interpret

HEAD = 'action A "a"\naction B "b"\n'


def _case(n: int) -> str:
    arms = " ".join(f"when N == {i} -> V{i}" for i in range(n))
    return (HEAD + 'system N: int[0..100000] "n"\n' + f"let T = case {{ {arms} otherwise -> Other }}\n"
            "stage s { when T == Other -> do A\n otherwise -> do B }\n")


def _count(n: int) -> str:
    fields = "".join(f'field F{i}: bool "f"\n' for i in range(n))
    return (HEAD + fields + "let C = count(" + ", ".join(f"F{i}" for i in range(n)) + ")\n"
            "stage s { when C > 1 -> do A\n otherwise -> do B }\n")


def _match(n: int) -> str:
    arms = "\n".join(f"{i} -> do {'A' if i % 2 else 'B'}" for i in range(n))
    return HEAD + 'system N: int[0..100000] "n"\n' + f"stage s {{ match N {{ {arms}\n otherwise -> do B }} }}\n"


def _when(n: int) -> str:
    arms = "\n".join(f"when N == {i} -> do {'A' if i % 2 else 'B'}" for i in range(n))
    return HEAD + 'system N: int[0..100000] "n"\n' + f"stage s {{ {arms}\n otherwise -> do B }}\n"


def _lets(n: int) -> str:
    lets = "let L0 = N + 1\n" + "".join(f"let L{i} = L{i - 1} + 1\n" for i in range(1, n))
    return HEAD + 'system N: int[0..10] "n"\n' + lets + f"stage s {{ when L{n - 1} > {n + 5} -> do A\n otherwise -> do B }}\n"


@pytest.mark.parametrize(("text", "rows"), [
    (_case(250), [{"N": 3}, {"N": 249}, {"N": 5000}]),
    (_count(3000), [{f"F{i}": i < 2 for i in range(3000)}, {f"F{i}": False for i in range(3000)}]),
    (_match(3000), [{"N": 2999}, {"N": 2998}, {"N": 9999}]),
    (_when(3000), [{"N": 1}, {"N": 2}, {"N": 4000}]),
    (_lets(MAX_DERIVED_CHAIN), [{"N": 3}, {"N": 10}]),  # the longest chain that loads (docs/language.md, Limits)
], ids=["case-250", "count-3000", "match-3000", "when-3000", "let-chain-longest"])
def test_checked_programs_run(text, rows):
    scenario = load(text=text, flow=False)
    engine = engine_for(scenario)
    for row in rows:
        ref = interpret(scenario, row)
        assert engine.decide(row) == ref


def test_let_chain_values_are_exact():
    scenario = load(text=_lets(MAX_DERIVED_CHAIN), flow=False)
    assert engine_for(scenario).decide({"N": 10}).finals["Action"] == "A"  # L299 = 10 + 300 > 305
    assert engine_for(scenario).decide({"N": 3}).finals["Action"] == "B"


def test_lazy_semantics_survive_bottom_up_warming():
    # L1 reads M, which the path never needs when F is false: no "missing value" error
    text = (HEAD + 'field F: bool "f"\nsystem M: int "m"\nlet L0 = M + 1\n'
            + "".join(f"let L{i} = L{i - 1} + 1\n" for i in range(1, 200))
            + "stage s { when F and L199 > 3 -> do A\n otherwise -> do B }\n")
    scenario = load(text=text, flow=False)
    assert engine_for(scenario).decide({"F": False}).finals["Action"] == "B"
    assert interpret(scenario, {"F": True, "M": 5}).finals["Action"] == "A"


def _size(f) -> int:
    """Formula edges (parts of each distinct node): what building and constraining it costs."""
    seen: set[int] = set()
    edges = 0
    stack = [f]
    while stack:
        g = stack.pop()
        if id(g) in seen:
            continue
        seen.add(id(g))
        edges += len(g.parts)
        stack.extend(g.parts)
    return edges


@pytest.mark.parametrize("op", ["and", "or"])
def test_long_boolean_chains_compile_linearly(op):
    def build(n: int) -> int:
        names = [f"F{i}" for i in range(n)]
        text = HEAD + "".join(f'field {x}: bool "f"\n' for x in names) + \
            f"stage s {{ when {f' {op} '.join(names)} -> do A\n otherwise -> do B }}\n"
        scenario = load(text=text, flow=False)
        guard = scenario.stages["s"].branches[0].guard
        sp = domain.space_for(scenario)
        return sum(_size(sp.formula(guard, truth)) for truth in (True, False))

    small, large = build(200), build(3200)
    assert large <= small * 20  # 16x the terms: linear is ~16x, quadratic ~256x
