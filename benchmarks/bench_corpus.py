"""`sop synth-dialogues` as a sharded corpus: the driver's peak memory at 1e3, 1e4 and 1e5 dialogues.

Why: a corpus of any size must be writable from one driver; what the driver holds may not grow with the
corpus (the issue's "flat driver memory"). Each size is made in a fresh process (the driver) that writes
the corpus with `evaluation.shards.write_corpus` and reports its own peak RSS (`ru_maxrss`, imports
included) and wall time. Locally the driver also makes the shards (one at a time); with `--ray` the
shards are made by Ray Data workers (a local Ray instance) and the driver only plans and records them.

Built-in models (agent `baseline/oracle`, user `scripted/user`): no network, deterministic, a few
milliseconds of CPU per dialogue, called directly rather than through litellm unless `--via-litellm`
(litellm adds ~3 ms of CPU per call and ~10 s of import per process, which made 1e5 dialogues too slow
for a shared two-core machine; it changes no byte of the corpus). Cases: `sop synth` of the telecom
scenario, seed 0; at most 4 turns.

    python benchmarks/bench_corpus.py                         # 1e3 1e4 1e5, local and --ray
    python benchmarks/bench_corpus.py --sizes 1000 10000 --modes local
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCENARIO = ROOT / "scenarios" / "telecom_package.sop"

DRIVER = """
import json, resource, sys, time
from sopgraph.evaluation.shards import write_corpus
from sopgraph.logic.checker import load

sop, cases, out, ray, cpus, shard, direct = sys.argv[1:8]
scenario = load(sop, flow=False)
started = time.perf_counter()
manifest = write_corpus(scenario, cases, ["agent=baseline/oracle"], out, max_turns=4, shard_size=int(shard),
                        ray=None if ray == "-" else ray, num_cpus=int(cpus),
                        gateway_options={"builtins_via_litellm": direct == "0", "cache": False})
print(json.dumps({"seconds": time.perf_counter() - started, "written": manifest.totals["written"],
                  "shards": len(manifest.shards), "bytes": manifest.bytes,
                  "sha256": [s.sha256 for s in manifest.shards],
                  "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def make_cases(n: int, path: Path) -> None:
    """`n` cases of the telecom scenario (seed 0), streamed to `path`."""
    from sopgraph.cases.profiles import load_profile, profile_path_for
    from sopgraph.cases.synth import synthesize_stream
    from sopgraph.logic.checker import load

    scenario = load(SCENARIO, flow=False)
    profile = load_profile(profile_path_for(SCENARIO), scenario)
    synthesize_stream(scenario, profile, n, 0).write(path)


def one(cases: Path, n: int, mode: str, cpus: int, shard: int, tmp: Path, via_litellm: bool) -> dict:
    out = tmp / f"corpus-{mode}-{n}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(SCENARIO), str(cases), str(out),
                           "-" if mode == "local" else "local", str(cpus), str(shard), "0" if via_litellm else "1"],
                          capture_output=True, text=True, env=env, timeout=6 * 3600)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} {n}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["written"] == n, result
    shutil.rmtree(out)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    ap.add_argument("--modes", nargs="+", choices=["local", "ray"], default=["local", "ray"])
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--via-litellm", action="store_true",
                    help="Send the built-in models' calls through litellm, as runs do by default (about 3 ms "
                         "of CPU per call more; default: call them directly, Gateway(builtins_via_litellm=False))")
    args = ap.parse_args()
    rows: list[tuple[str, int, dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as tmp_name:
        tmp = Path(tmp_name)
        for n in args.sizes:
            cases = tmp / f"cases-{n}.jsonl"
            started = time.perf_counter()
            make_cases(n, cases)
            print(f"{n:,} cases synthesized in {time.perf_counter() - started:.1f} s", flush=True)
            for mode in args.modes:
                r = one(cases, n, mode, args.cpus, args.shard_size, tmp, args.via_litellm)
                rows.append((mode, n, r))
                print(f"  {mode:5} {n:>7,} dialogues: {r['seconds']:8.1f} s, peak RSS "
                      f"{r['peak_rss_kib'] / 1024:7.1f} MiB, {r['shards']} shards, {r['bytes'] / 2**20:.0f} MiB",
                      flush=True)
            cases.unlink()
    print()
    print(f"{'mode':6} {'dialogues':>10} {'seconds':>9} {'dialogues/s':>12} {'driver peak RSS MiB':>20}")
    for mode, n, r in rows:
        print(f"{mode:6} {n:>10,} {r['seconds']:>9.1f} {n / r['seconds']:>12.1f} {r['peak_rss_kib'] / 1024:>20.1f}")
    for n in args.sizes:  # the shards are the same bytes locally and on Ray
        hashes = {m: r["sha256"] for m, k, r in rows if k == n}
        assert len({tuple(h) for h in hashes.values()}) == 1, f"{n}: local and --ray shards differ"
        if len(hashes) > 1:
            print(f"{n:,} dialogues: the {' and '.join(hashes)} shards are the same bytes (SHA-256)")
    for mode in args.modes:
        mine = {n: r for m, n, r in rows if m == mode}
        lo, hi = min(mine), max(mine)
        if lo != hi:
            print(f"{mode}: peak RSS {hi:,} / {lo:,} dialogues = {mine[hi]['peak_rss_kib'] / mine[lo]['peak_rss_kib']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
