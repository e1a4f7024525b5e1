"""Before/after: run benchmark scripts on two git revisions, interleaved, and print the time ratios.

    python benchmarks/compare_revisions.py BASE [--head REV] [--repeat 3] [bench_lang.py bench_paths.py ...]

Each revision is checked out into a temporary git worktree; each benchmark script runs there with that
tree first on `sys.path` (the benchmarks insert their own checkout's root). Runs alternate A, B, A, B… so
that machine noise hits both sides alike; the medians and the ratio head/base are printed. A ratio within
about ±10 % on a shared machine is noise. Scripts that exist in only one revision are skipped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _checkout(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(into), rev],
                   check=True, capture_output=True)
    return into


def _run(tree: Path, script: str) -> float | None:
    path = tree / "benchmarks" / script
    if not path.is_file():
        return None
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(path)], cwd=tree, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        print(f"  {script} failed in {tree.name}: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("--head", default="HEAD")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("scripts", nargs="*", default=["bench_lang.py", "bench_paths.py", "bench_synth.py"])
    args = ap.parse_intermixed_args()
    with tempfile.TemporaryDirectory(prefix="sop-bench-") as tmp:
        trees = {"base": _checkout(args.base, Path(tmp) / "base"), "head": _checkout(args.head, Path(tmp) / "head")}
        try:
            print(f"{'script':<22} {'base s':>8} {'head s':>8} {'head/base':>10}")
            for script in args.scripts:
                times: dict[str, list[float]] = {"base": [], "head": []}
                for _ in range(args.repeat):
                    for side, tree in trees.items():
                        t = _run(tree, script)
                        if t is not None:
                            times[side].append(t)
                if not times["base"] or not times["head"]:
                    print(f"{script:<22} skipped (missing or failing on one side)")
                    continue
                base, head = statistics.median(times["base"]), statistics.median(times["head"])
                print(f"{script:<22} {base:8.2f} {head:8.2f} {head / base:10.2f}")
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
