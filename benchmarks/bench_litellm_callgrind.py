"""litellm's work per call on two revisions, counted in instructions (deterministic), not CPU seconds.

Why: issue 8 compared `bench_gateway.py` CPU times per call across revisions and found litellm's share about
1 ms higher after the restructure, with fewer Python function calls. CPU time on this shared 2-core machine
varies by ±20 % between identical processes, so this script counts instructions with valgrind's callgrind,
which gives the same count for the same binary and inputs whatever else the machine is doing.

For each revision (a temporary git worktree; `.` is the working tree) it runs, under callgrind, one process
that imports that revision's `benchmarks/bench_gateway.py`, loads litellm the way that revision does (and the
`sop` CLI's collector setting where the revision has one), starts the fake OpenAI-compatible server in its own
(untraced) process and makes `--warm` + N sequential `litellm.acompletion` calls on the `aiohttp_openai/` route
of an unpriced model. It does that for N = `--short` and N = `--long`; the difference of the two totals divided
by `long - short` is the instructions per call, free of start-up and import costs. Start-up itself varies by a
few hundred million instructions between runs (threads, the server's timing), so use a large `--long`.

    python benchmarks/bench_litellm_callgrind.py [BASE=db2b5a9] [HEAD=.] [--short 10] [--long 410]

Needs valgrind (Debian's package); each run takes a few minutes (Python under callgrind is ~50x slower).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, importlib.util, sys
root, n, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, root)
spec = importlib.util.spec_from_file_location("bench_gateway_rev", f"{root}/benchmarks/bench_gateway.py")
mod = importlib.util.module_from_spec(spec)
sys.modules["bench_gateway_rev"] = mod
spec.loader.exec_module(mod)
try:
    from sopgraph import perf
    perf.tune_gc_for_cli()  # what a `sop` user gets, where the revision has it
except (ImportError, AttributeError):
    pass
litellm = mod.load_litellm()
server = mod.Server(0.0, 3600)

async def go():
    call, closer = await mod.bare_call(litellm, "aiohttp_openai/unpriced-model", server.base)()
    history = [{"role": "user", "content": "hello"}]
    for _ in range(warm + n):
        await call(history)
    if closer is not None:
        await closer()

asyncio.run(go())
server.close()
"""


def instructions(tree: Path, calls: int, warm: int, log_dir: Path) -> int:
    """Total instructions of one traced process making `warm + calls` calls."""
    script = log_dir / "child.py"
    script.write_text(CHILD)
    out = log_dir / f"callgrind.{tree.name}.{calls}.out"
    proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                           str(script), str(tree), str(calls), str(warm)], capture_output=True, text=True)
    found = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"callgrind run failed in {tree} ({calls} calls): {proc.stderr[-800:]}")
    return int(found.group(1))


def checkout(rev: str, into: Path) -> Path:
    if rev == ".":
        return ROOT
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(into), rev],
                   check=True, capture_output=True)
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", nargs="?", default="db2b5a9")
    ap.add_argument("head", nargs="?", default=".")
    ap.add_argument("--short", type=int, default=10)
    ap.add_argument("--long", type=int, default=410)
    ap.add_argument("--warm", type=int, default=20)
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("skipped: valgrind is not installed (apt-get install -y valgrind); nothing measured")
        return 0  # `make bench` runs every script; a missing optional tool is not a failed benchmark
    per_call: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            for label, rev in (("base", args.base), ("head", args.head)):
                tree = checkout(rev, work / label)
                short = instructions(tree, args.short, args.warm, work)
                long = instructions(tree, args.long, args.warm, work)
                per_call[label] = (long - short) / (args.long - args.short)
                print(f"{label} {rev}: {short:,} instructions with {args.short} calls, {long:,} with {args.long}: "
                      f"{per_call[label] / 1e6:.2f} M per call", flush=True)
        finally:
            for label in ("base", "head"):
                if (work / label).exists():
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / label)],
                                   capture_output=True)
    print(f"ratio head/base, instructions per litellm call: {per_call['head'] / per_call['base']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
