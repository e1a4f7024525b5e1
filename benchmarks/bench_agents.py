"""Harness overhead for your own agent over HTTP (docs/agents.md) against a fixed-latency local stub.

Why: with a slow agent the harness (runner, dialogue loop, scripted user and judges, store) must keep
`concurrency` agent requests in flight. The stub agent (its own process, so it does not share our GIL)
answers every request after a fixed latency, without a tool call; the scripted user and judges are the
offline built-ins. With C = concurrency, L = latency and N agent requests made in the run,

    ideal time = N × L / C        ratio = ideal time / measured time

Targets (issue "Evaluate real agents"): ratio ≥ 0.9 at L = 200 ms and C = 64; the 50 ms figure is printed
with its arithmetic (harness CPU per agent turn vs. the time budget per turn, C / L turns per second).

    python benchmarks/bench_agents.py [--dialogues 640] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STUB = r"""
import asyncio, json, sys
LAT = float(sys.argv[1])
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":")[1])
            await reader.readexactly(n)
            await asyncio.sleep(LAT)
            body = json.dumps({"reply": "Could you tell me more?", "tool_calls": []}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(latency: float, dialogues: int, concurrency: int, max_turns: int) -> dict:
    import sopgraph
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import synthesize
    from sopgraph.simulation.runner import run
    from sopgraph.simulation.store import RunStore

    sop = ROOT / "scenarios" / "telecom_package.sop"
    scenario = sopgraph.load(sop)
    base = list(synthesize(scenario, profile_for(sop, scenario), 60, seed=7, min_per_path=1).cases)
    cases = [c.model_copy(update={"id": f"{c.id}-{i}"}) for i in range(dialogues // len(base) + 1)
             for c in base][:dialogues]
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(latency)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(stub.stdout.readline())
        with tempfile.TemporaryDirectory() as tmp:
            cpu, t0 = _cpu(), time.perf_counter()
            asyncio.run(run(scenario, cases, [f"agent=http://127.0.0.1:{port}/agent"], Path(tmp) / "r",
                            concurrency=concurrency, max_turns=max_turns, progress=False, judge_turns="final"))
            elapsed, cpu = time.perf_counter() - t0, _cpu() - cpu
            with RunStore.open(Path(tmp) / "r") as store:
                n = store.summary()["turns"]
    finally:
        stub.kill()
    ideal = n * latency / concurrency
    return {"latency": latency, "turns": n, "elapsed": elapsed, "ideal": ideal, "ratio": ideal / elapsed,
            "cpu_per_turn_ms": 1000 * cpu / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dialogues", type=int, default=640)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-turns", type=int, default=4)
    ns = ap.parse_args()
    rows = [measure(lat, ns.dialogues, ns.concurrency, ns.max_turns) for lat in (0.2, 0.05)]
    for r in rows:
        print(f"HTTP agent, latency {r['latency'] * 1000:.0f} ms, concurrency {ns.concurrency}: "
              f"{r['turns']} agent turns in {r['elapsed']:.1f} s (ideal {r['ideal']:.1f} s) → "
              f"ratio {r['ratio']:.2f}; harness CPU {r['cpu_per_turn_ms']:.2f} ms per agent turn")
    r200, r50 = rows
    budget = 1000 * 0.05 / ns.concurrency
    print(f"target ratio ≥ 0.9 at 200 ms: {'met' if r200['ratio'] >= 0.9 else 'NOT met'} ({r200['ratio']:.2f})")
    print(f"at 50 ms: {ns.concurrency} requests in flight need a turn every {budget:.2f} ms of wall time; the harness "
          f"spends {r50['cpu_per_turn_ms']:.2f} ms CPU per turn → at most "
          f"{min(1.0, budget / max(r50['cpu_per_turn_ms'], 1e-9)):.2f} of ideal on one core "
          f"(measured {r50['ratio']:.2f})")
    print(json.dumps({"ratio_200ms": round(r200["ratio"], 3), "ratio_50ms": round(r50["ratio"], 3)}))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
