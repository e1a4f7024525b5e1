"""Synthesis benchmark (issue: case synthesis). Prints times and ratios measured in one run.

Claim: synthesizing 100,000 cases — path planning, both sampling stages, per-case engine check and
serialisation to JSON Lines — takes under 10 s. Measured end to end (load of the .sop and profile
excluded) on every shipped SAGE scenario; the ratio is time / 10 s budget (must be < 1).

Usage: python benchmarks/bench_synth.py [N] [scenario ...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sopgraph  # noqa: E402
from sopgraph.cases.profiles import load_profile  # noqa: E402
from sopgraph.cases.synth import plan, synthesize  # noqa: E402

BUDGET_S = 10.0
SCENARIOS = ["telecom_package", "ecommerce_refund", "property_service", "logistics_delivery", "airline_refund",
             "online_education"]


def bench(name: str, n: int) -> tuple[float, float, float, int]:
    scenario = sopgraph.load(ROOT / "scenarios" / f"{name}.sop")
    profile = load_profile(ROOT / "scenarios" / f"{name}.profile.yaml", scenario)
    t0 = time.perf_counter()
    the_plan = plan(scenario, profile)
    t1 = time.perf_counter()
    result = synthesize(scenario, profile, n, seed=1, the_plan=the_plan)
    t2 = time.perf_counter()
    text = result.to_jsonl()
    t3 = time.perf_counter()
    assert len(result.lines) == n
    return t1 - t0, t2 - t1, t3 - t2, len(text.encode("utf-8"))


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 100_000
    names = argv[1:] or SCENARIOS
    ok = True
    print(f"{'scenario':<20} {'plan s':>8} {'synth s':>8} {'jsonl s':>8} {'total s':>8} {'MB':>7} "
          f"{'cases/s':>9} {'ratio':>6}")
    for name in names:
        t_plan, t_synth, t_dump, size = bench(name, n)
        total = t_plan + t_synth + t_dump
        ratio = total / BUDGET_S * (100_000 / n)
        ok = ok and ratio < 1.0
        print(f"{name:<20} {t_plan:8.2f} {t_synth:8.2f} {t_dump:8.2f} {total:8.2f} {size / 1e6:7.1f} "
              f"{n / total:9.0f} {ratio:6.2f}")
    print(f"budget: 100,000 cases in {BUDGET_S:.0f} s per scenario (ratio = time / budget, scaled to 100k): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
