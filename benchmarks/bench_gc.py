"""What the CLI's garbage-collector setting buys (issue 8: GC pauses only in the CLI entry point).

Why: the library leaves the garbage collector alone (no process-global side effects); the `sop`
entry point applies `perf.tune_gc_for_cli()` once. This script measures load + check + compile of a
generated SOP in fresh processes under three settings and prints the gain of the CLI's setting:

  default      Python's collector as a library user has it (thresholds 700/10/10)
  cli          `perf.tune_gc_for_cli()` (what `sop` does at start)
  disabled     the collector off for the whole work (the old per-function pauses, as an upper bound)

    python benchmarks/bench_gc.py               # 10,000 stages, best of 3
    python benchmarks/bench_gc.py --stages 4000 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
from gen_sop import generate
from sopgraph import perf
from sopgraph.language.compile import compile_graph
from sopgraph.logic.checker import check, load
text = generate({stages}, kind="realistic", seed=1)
mode = {mode!r}
if mode == "cli":
    perf.tune_gc_for_cli()
t0 = time.perf_counter()
if mode == "disabled":
    with perf.no_cyclic_gc():
        sc = load(text=text); check(sc); compile_graph(sc)
else:
    sc = load(text=text); check(sc); compile_graph(sc)
print(json.dumps({{"seconds": time.perf_counter() - t0, "collections": sum(s["collections"] for s in gc.get_stats())}}))
"""


def measure(mode: str, stages: int) -> dict[str, float]:
    code = CHILD.format(root=str(ROOT), bench=str(ROOT / "benchmarks"), stages=stages, mode=mode)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--stages", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):
        for mode in ("default", "cli", "disabled"):
            got = measure(mode, args.stages)
            if mode not in best or got["seconds"] < best[mode]["seconds"]:
                best[mode] = got
    base = best["default"]["seconds"]
    print(f"load + check + compile, generated SOP with {args.stages} stages, best of {args.repeat}:")
    for mode, got in best.items():
        print(f"  {mode:9s} {got['seconds']:7.2f} s  {int(got['collections']):6d} collections  "
              f"gain vs default {base / got['seconds']:.2f}x")
    print(f"RESULT cli_gain={base / best['cli']['seconds']:.2f}x disabled_gain={base / best['disabled']['seconds']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
