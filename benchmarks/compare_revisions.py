"""Before/after: run benchmark scripts on two git revisions, interleaved, and print the time ratios.

    python benchmarks/compare_revisions.py BASE [--head REV] [--repeat 3] [--log DIR] [SCRIPT ...]

A SCRIPT is a file name in `benchmarks/`, optionally with its arguments in one quoted word
(`"bench_score.py --turns 200000 --mode memory"`); default: bench_lang.py bench_paths.py bench_synth.py.
Each revision is checked out into a temporary git worktree; each benchmark script runs there with that
tree first on `sys.path` (the benchmarks insert their own checkout's root). Runs alternate A, B, A, B… so
that machine noise hits both sides alike; the medians of wall time and of CPU time (the script and its
children) and the ratios head/base are printed. A ratio within about ±10 % on a shared machine is noise.
A script missing at one revision, or failing there (a traceback, or no output), is skipped with the reason
printed (a failure is not retried); a script that reports and exits non-zero because a target was missed (a
loaded machine) still counts as a timed run. `--cli-gc` runs each script after the garbage-collector setting
that revision's `sop` entry point applies (`perf.tune_gc_for_cli()` where it exists; older revisions paused
the collector inside library calls instead), i.e. the figures a `sop` user sees. `--log DIR` keeps every run's output, to compare the figures the benchmarks print themselves.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI_GC = """
import runpy, sys
sys.argv = sys.argv[1:]
sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])
try:
    from sopgraph.perf import tune_gc_for_cli
except ImportError:  # a revision whose `sop` did not tune the collector
    pass
else:
    tune_gc_for_cli()
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _checkout(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(into), rev],
                   check=True, capture_output=True)
    return into


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(tree: Path, argv: list[str], log: Path | None, cli_gc: bool = False) -> tuple[float, float] | str:
    """(wall s, CPU s) of one run, or why it could not run."""
    path = tree / "benchmarks" / argv[0]
    if not path.is_file():
        return "not in this revision"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cpu0, start = _children_cpu(), time.perf_counter()
    prefix = [sys.executable, "-c", CLI_GC] if cli_gc else [sys.executable]
    done = subprocess.run([*prefix, str(path), *argv[1:]], cwd=tree, env=env, capture_output=True,
                          text=True)
    elapsed, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    if log is not None:
        log.write_text(f"$ {shlex.join(argv)}\n{done.stdout}\n--- stderr\n{done.stderr}", encoding="utf-8")
    if done.returncode != 0 and (not done.stdout.strip() or "Traceback (most recent call last)" in done.stderr):
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"fails: {last[:160]}"
    return elapsed, cpu  # a non-zero status after a normal report is a missed target, still a timed run


def _compare(argv: list[str], trees: dict[str, Path], revs: dict[str, str], repeat: int,
             log_dir: Path | None, cli_gc: bool = False) -> str:
    """One result line: medians and ratios, or the reason the script was skipped."""
    name = shlex.join(argv)
    runs: dict[str, list[tuple[float, float]]] = {"base": [], "head": []}
    for k in range(repeat):
        for side, tree in trees.items():
            log = None if log_dir is None else log_dir / f"{argv[0].removesuffix('.py')}-{side}-{k + 1}.txt"
            got = _run(tree, argv, log, cli_gc)
            if isinstance(got, str):
                return f"{name:<44} skipped: {got} at {side} ({revs[side]})"
            runs[side].append(got)
    wall = {side: statistics.median(t for t, _ in r) for side, r in runs.items()}
    cpu = {side: statistics.median(c for _, c in r) for side, r in runs.items()}
    return (f"{name:<44} {wall['base']:8.2f} {wall['head']:8.2f} {wall['head'] / wall['base']:9.2f}"
            f" {cpu['base']:8.2f} {cpu['head']:8.2f} {cpu['head'] / cpu['base']:8.2f}  n={repeat}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("--head", default="HEAD")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cli-gc", action="store_true", help="apply each revision's `sop` collector setting first")
    ap.add_argument("--log", type=Path, default=None, help="keep each run's output in this directory")
    ap.add_argument("scripts", nargs="*", default=["bench_lang.py", "bench_paths.py", "bench_synth.py"])
    args = ap.parse_intermixed_args()
    if args.log is not None:
        args.log.mkdir(parents=True, exist_ok=True)
    revs = {"base": args.base, "head": args.head}
    with tempfile.TemporaryDirectory(prefix="sop-bench-") as tmp:
        trees = {side: _checkout(rev, Path(tmp) / side) for side, rev in revs.items()}
        try:
            print(f"{'script':<44} {'base s':>8} {'head s':>8} {'wall h/b':>9} {'base cpu':>8} {'head cpu':>8}"
                  f" {'cpu h/b':>8}", flush=True)
            for script in args.scripts:
                print(_compare(shlex.split(script), trees, revs, args.repeat, args.log, args.cli_gc), flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
