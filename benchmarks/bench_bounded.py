"""Issue 13 targets: bounded analysis on scoring SOPs, synthesis at scale, 100k-stage checks.

Prints one line per measurement with the time (and peak memory where asked) and its ratio to the
target (ratio < 1 means the target holds). Each measurement runs the `sop` CLI in a fresh process,
so times include start-up, as a user sees them.

- scoring family K=8 scores over N=30 shared inputs: `sop check`, `sop paths --count`,
  `sop synth -n 50` (target: each under 5 s);
- `sop synth -n 50` on a generated workflow with >= 50,000 feasible paths (target under 5 s);
- `sop paths --count` and `sop synth -n 50` on a 1,000-stage generated workflow whose paths are too many to
  count (time and peak memory: bounded, where they used to run for minutes past 7 GB);
- `sop check` on 100,000 stages in two shapes, a chain (`gen_sop.py --kind chain`) and branching
  stages (`--kind diamond`: every stage branches two to four ways): time and peak memory of that one
  process (targets under 10 s and 1 GB);
- parsing a 10,000-stage chain and a 10,000-stage branching file with Lark alone (the old path) and
  with the fast path (`sopgraph/language/fastparse.py`), interleaved in one process: CPU seconds and
  the before/after ratio;
- a telecom_package profile of 20,000 generated intents (`tests/helpers.many_intents_profile`):
  `sop check` and `sop synth -n 50` (target under 5 s each: the same budget as the scoring family,
  since a profile is read by every check and every synthesis; it took 60-90 s before issue 13).

Usage: `python benchmarks/bench_bounded.py [--k 8] [--n 30] [--stages 100000] [--intents 20000]`;
`--only-100k` prints only the two large-check rows, `--only-profiles` only the two profile rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(args: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB of this one process, exit code) of one `sop` invocation."""
    return run_cpu(args)[:3]


def run_cpu(args: list[str]) -> tuple[float, float, int, float]:
    """`run`, and the CPU seconds (user + system) of that one process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "from sopgraph.cli import entry; entry()", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    _pid, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    return (elapsed, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status),
            usage.ru_utime + usage.ru_stime)


def report(label: str, seconds: float, target: float, code: int, extra: str = "", *, also_met: bool = True) -> None:
    """One row: the time, its ratio to the target and the verdict (`also_met`: the row's other target, memory)."""
    verdict = "met" if seconds < target and also_met and code == 0 else "NOT met"
    status = verdict if code == 0 else f"{verdict} (exit {code})"
    print(f"{label:<46} {seconds:7.2f} s  ratio {seconds / target:5.2f} (target {target:g} s) {extra}{status}")


PARSE_CHILD = r"""
import sys, time
sys.path.insert(0, {bench!r})
from gen_sop import generate
from sopgraph.perf import tune_gc_for_cli
from sopgraph.language.parse import parse_text
tune_gc_for_cli()
text = generate({stages}, kind={kind!r}, seed=0)
best = {{True: [], False: []}}
for _ in range({repeat}):
    for fast in (False, True):  # interleaved: the same load for both
        t0 = time.process_time()
        parse_text(text, "bench.sop", fast=fast)
        best[fast].append(time.process_time() - t0)
print(min(best[False]), min(best[True]))
"""


def parse_ratio(stages: int, kind: str, repeat: int = 3) -> tuple[float, float]:
    """CPU seconds (best of `repeat`) of parsing one generated file with Lark alone and with the fast path."""
    code = PARSE_CHILD.format(bench=str(ROOT / "benchmarks"), stages=stages, kind=kind, repeat=repeat)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    return float(out[0]), float(out[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--stages", type=int, default=100_000)
    ap.add_argument("--intents", type=int, default=20_000)
    ap.add_argument("--only-100k", action="store_true",
                    help="only the two large `sop check` rows (--stages stages; 100,000 by default)")
    ap.add_argument("--only-profiles", action="store_true",
                    help="only the two profile rows (`sop check`, `sop synth -n 50`; --intents intents)")
    args = ap.parse_args(argv)
    if args.only_profiles:
        with tempfile.TemporaryDirectory() as tmp:
            profile_rows(Path(tmp), args.intents)
        return 0
    if args.only_100k:
        with tempfile.TemporaryDirectory() as tmp:
            large_checks(Path(tmp), args.stages)
        return 0
    for shape, kind in (("stage chain", "chain"), ("branching stages", "diamond")):
        before, after = parse_ratio(10_000, kind)
        print(f"{f'parse 10,000 {shape}: Lark -> fast path':<46} {before:7.2f} s -> {after:.2f} s CPU  "
              f"ratio after/before {after / before:4.2f}")
    helpers = _module("helpers", ROOT / "tests" / "helpers.py")
    gen = _module("gen_sop", ROOT / "benchmarks" / "gen_sop.py")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        scoring = d / "scoring.sop"
        scoring.write_text(helpers.scoring_sop(args.k, args.n))
        tag = f"scoring K={args.k} N={args.n}"
        for label, cmd in ((f"{tag}: sop check", ["check", str(scoring)]),
                           (f"{tag}: sop paths --count", ["paths", str(scoring), "--count"]),
                           (f"{tag}: sop synth -n 50", ["synth", str(scoring), "-n", "50", "-q",
                                                        "-o", str(d / "s.jsonl")])):
            t, _, code = run(cmd)
            report(label, t, 5.0, code)
        wide = d / "wide.sop"
        wide.write_text(gen.generate(12, kind="diamond", seed=3))  # 139,968 feasible paths
        t, _, code = run(["synth", str(wide), "-n", "50", "-q", "-o", str(d / "w.jsonl")])
        lines = len((d / "w.jsonl").read_text().splitlines()) if (d / "w.jsonl").exists() else 0
        report("synth -n 50, 139,968 feasible paths", t, 5.0, code, f"({lines} cases) ")
        huge = d / "huge.sop"  # a 1,000-stage `realistic` workflow: too many paths to count (>> 1e9)
        huge.write_text(gen.generate(1000, kind="realistic", seed=0))
        for label, cmd in (("paths --count, 1,000-stage workflow", ["paths", str(huge), "--count"]),
                           ("synth -n 50, 1,000-stage workflow", ["synth", str(huge), "-n", "50", "-q",
                                                                  "-o", str(d / "h.jsonl")])):
            t, mem, code = run(cmd)  # before the count budget: no answer in minutes, over 7 GB
            print(f"{label:<46} {t:7.2f} s  peak {mem:.0f} MB  exit {code} (bounded: the count stops at "
                  "its budget and says so)")
        profile_rows(d, args.intents)
        large_checks(d, args.stages)
    return 0


def profile_rows(d: Path, intents: int) -> None:
    """`sop check` and `sop synth -n 50` on telecom_package with a profile of `intents` generated intents."""
    helpers = _module("helpers", ROOT / "tests" / "helpers.py")
    profiled = d / "many"
    profiled.mkdir()
    sop = profiled / "telecom_package.sop"
    sop.write_text((ROOT / "scenarios" / "telecom_package.sop").read_text(encoding="utf-8"))
    (profiled / "telecom_package.profile.yaml").write_text(helpers.many_intents_profile(intents))
    tag = f"profile of {intents:,} intents"
    for label, cmd in ((f"{tag}: sop check", ["check", str(sop)]),
                       (f"{tag}: sop synth -n 50", ["synth", str(sop), "-n", "50", "-q",
                                                    "-o", str(d / "p.jsonl")])):
        t, _, code, cpu = run_cpu(cmd)
        report(label, t, 5.0, code, f"({cpu:.2f} s CPU) ")


def large_checks(d: Path, stages: int) -> None:
    """`sop check` on `stages` stages as a chain and as branching stages: wall time, CPU time (user +
    system of that process: what the machine's load does not inflate much) and peak memory."""
    gen = _module("gen_sop", ROOT / "benchmarks" / "gen_sop.py")
    for shape, kind in (("stage chain", "chain"), ("branching stages", "diamond")):
        big = d / f"{kind}.sop"
        big.write_text(gen.generate(stages, kind=kind, seed=0))
        t, peak, code, cpu = run_cpu(["check", "--no-profile", str(big)])
        report(f"check, {stages:,} {shape}", t, 10.0, code,
               f"({cpu:.2f} s CPU) peak {peak:,.0f} MB ratio {peak / 1024:4.2f} (target 1 GB) ", also_met=peak < 1024)
        big.unlink()


if __name__ == "__main__":
    raise SystemExit(main())
