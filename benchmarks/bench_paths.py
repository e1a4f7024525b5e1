"""Path counting and enumeration benchmark (prints numbers measured in one run).

1. Counting: a generated diamond SOP with >= 1e18 feasible paths is counted by dynamic programming
   (`count_paths`); target: well under 1 s.
2. Enumeration: on a mid-size generated SOP (~1e5 feasible paths), `iter_decisions` (depth-first,
   pruning infeasible prefixes, memoised regions) against the naive approach: networkx
   `all_simple_edge_paths` over the branch multigraph plus, for every graph path, a feasibility
   check that rebuilds the path's constraint from scratch (same domain primitives, no memo).
   Both must produce the same set of paths; target: >= 5x faster. Also printed: the rate of full
   `PathInfo` records (with verified witnesses), which the naive approach does not produce.

Run: `python benchmarks/bench_paths.py [--quick]` (about 30-60 s; --quick uses smaller SOPs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import networkx as nx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gen_sop import generate  # noqa: E402

from sopgraph.language import ir  # noqa: E402
from sopgraph.language.parse import load_source  # noqa: E402
from sopgraph.logic.domain import Box, Space, space_for  # noqa: E402
from sopgraph.logic.formula import Formula, negate  # noqa: E402
from sopgraph.logic.paths import count_paths, explorer_for, iter_decisions, iter_paths  # noqa: E402


def load(text: str) -> ir.Scenario:
    loaded = load_source(None, text=text)
    assert loaded.scenario is not None and not loaded.diagnostics, loaded.diagnostics[:3]
    return loaded.scenario


# ---------------------------------------------------------------------------------------------
# Naive baseline


def constrain_fresh(sp: Space, box: Box, f: Formula) -> list[Box]:
    """`Space.constrain` without its memo: the from-scratch cost of one decision."""
    kind = f.kind
    if kind == "T":
        return [box]
    if kind == "F":
        return []
    if kind == "atom":
        d = sp.meet_dom(f.var, box.doms[f.var], f.dom)
        return [] if d is None else [sp.with_dom(box, f.var, d)]
    if kind == "and":
        cur = [box]
        for p in f.parts:
            cur = [b2 for b in cur for b2 in constrain_fresh(sp, b, p)]
            if not cur:
                break
        return cur
    if kind == "or":
        out: list[Box] = []
        rest = [box]
        for p in f.parts:
            out += [b2 for b in rest for b2 in constrain_fresh(sp, b, p)]
            if f.exact:
                pn = negate(sp, p)
                rest = [b2 for b in rest for b2 in constrain_fresh(sp, b, pn)]
        return out
    return sp.add_residual(box, f.rid, f.truth)  # residual literal


def naive_paths(scenario: ir.Scenario) -> tuple[set[tuple], int]:
    """All graph paths from networkx, kept when a from-scratch constraint check finds them feasible."""
    sp = space_for(scenario)
    g = nx.MultiDiGraph()
    fire: dict[tuple[str, int], Formula] = {}
    for sid, stage in scenario.stages.items():
        g.add_node(sid)
        for bi, br in enumerate(stage.branches):
            fire[(sid, bi)] = sp.fire_formula(stage, bi)
            tgt = br.target.stage if br.target.kind == "stage" else f"action:{br.target.action}"
            g.add_edge(sid, tgt, key=bi)
    leaves = [n for n in g if isinstance(n, str) and n.startswith("action:")]
    feasible: set[tuple] = set()
    graph_paths = 0
    for edges in nx.all_simple_edge_paths(g, scenario.start, leaves):
        graph_paths += 1
        region = [sp.full]
        for u, _v, bi in edges:
            f = fire[(u, bi)]
            region = [b2 for b in region for b2 in constrain_fresh(sp, b, f)]
            if not region:
                break
        if region and any(sp.decide(b) is not False for b in region):
            feasible.add((tuple(e[0] for e in edges), tuple(e[2] for e in edges)))
    return feasible, graph_paths


# ---------------------------------------------------------------------------------------------


def bench_count(stages: int, quick: bool = False) -> None:
    for seed in range(20):
        sc = load(generate(stages, kind="diamond", seed=seed))
        t0 = time.perf_counter()
        c = count_paths(sc)
        dt = time.perf_counter() - t0
        if c.feasible >= 10**18:
            break
    print(f"[count] diamond SOP, {stages} stages (seed {seed}): {c.feasible:,} feasible paths "
          f"({c.feasible:.3e}), {c.stage_sequences} stage sequence(s), exact={c.exact}")
    print(f"[count] time {dt * 1000:.1f} ms  -> {'OK' if dt < 1 else 'SLOW'} (target < 1 s)")
    # a deep chain and a mixed DAG too, for scale
    extra = (("chain", 1000, 1), ("mixed", 60, 1)) + ((("mixed", 100, 0),) if not quick else ())
    for kind, n, seed in extra:
        sc = load(generate(n, kind=kind, seed=seed))
        t0 = time.perf_counter()
        c = count_paths(sc)
        states = len(explorer_for(sc).count_memo)
        print(f"[count] {kind} SOP, {n} stages (seed {seed}): {c.feasible:,} paths, {c.stage_sequences:,} "
              f"stage sequences, {states:,} DP states in {(time.perf_counter() - t0) * 1000:.1f} ms")


def fresh_caches(*scenarios: ir.Scenario) -> None:
    """Drop the memos of earlier sections (they live on their scenarios): their millions of live objects
    would make the garbage collector slow down whatever runs next."""
    import gc

    for sc in scenarios:
        sc._analyses = ir.AnalysisCache()
    gc.collect()


def bench_enumerate(kind: str, stages: int, seed: int) -> float:
    fresh_caches()
    text = generate(stages, kind=kind, seed=seed)
    sc = load(text)
    t0 = time.perf_counter()
    ours = set(iter_decisions(sc))
    t_ours = time.perf_counter() - t0
    fresh_caches(sc)
    sc2 = load(text)  # fresh scenario object: no shared memo with the run above
    t0 = time.perf_counter()
    naive, graph_paths = naive_paths(sc2)
    t_naive = time.perf_counter() - t0
    assert ours == naive, (len(ours), len(naive))
    fresh_caches(sc2)
    sc3 = load(text)
    t0 = time.perf_counter()
    n_records = sum(1 for _ in iter_paths(sc3, witnesses=False))
    t_records = time.perf_counter() - t0
    assert n_records == len(ours)
    ratio = t_naive / t_ours
    print(f"[enumerate] {kind} SOP, {stages} stages (seed {seed}): {len(ours):,} feasible paths of "
          f"{graph_paths:,} graph paths")
    print(f"[enumerate] iter_decisions {t_ours:.2f} s ({len(ours) / t_ours:,.0f} paths/s); "
          f"networkx all_simple_edge_paths + per-path check {t_naive:.2f} s "
          f"-> ratio {ratio:.1f}x {'OK' if ratio >= 5 else 'BELOW TARGET'} (target >= 5x)")
    print(f"[enumerate] iter_paths(witnesses=False) (PathInfo records with constraints and finals) "
          f"{t_records:.2f} s -> ratio {t_naive / t_records:.1f}x")
    return ratio


def bench_records(kind: str, stages: int, seed: int, n: int) -> None:
    sc = load(generate(stages, kind=kind, seed=seed))
    explorer_for(sc).count()
    t0 = time.perf_counter()
    k = sum(1 for p in iter_paths(sc, limit=n) if p.status == "feasible")
    dt = time.perf_counter() - t0
    print(f"[records] first {n:,} PathInfo records with verified witnesses: {dt:.2f} s "
          f"({n / dt:,.0f} records/s, {k} verified)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller SOPs (a smoke run)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    bench_count(45 if not args.quick else 40, quick=args.quick)
    if args.quick:
        bench_enumerate("diamond", 7, 3)
        bench_enumerate("mixed", 40, 0)
    else:
        bench_enumerate("diamond", 11, 3)
        bench_enumerate("mixed", 40, 0)
    bench_records("diamond", 11, 3, 2000)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
