"""What litellm's per-call CPU owes to the process-global settings sopgraph no longer makes (issue 8).

Why: db2b5a9's `load_litellm` changed the whole process, and the litellm CPU per call that
`bench_run.py` prints rose from 3.40 to 4.64 ms when issue 8 removed those changes. This script puts
each of them back, one at a time and all together, *in the benchmark process only*, and measures the
CPU per `Gateway.complete` call, so that the cost of keeping the library free of global side effects
is a measured figure rather than a guess:

  none       what the library does now: no global change
  cost-map   the model registered in `litellm.model_cost` at price 0 (db2b5a9 did this for every
             unpriced model after its first call): litellm otherwise searches its whole cost map and its
             generalisation rules for the unknown model, several times per call
  gc-freeze  `gc.collect(); gc.freeze()` after litellm's import (~300k long-lived objects leave the
             collector's generations)
  quiet      litellm's loggers at CRITICAL and `suppress_debug_info` (what `sop` itself still does, see
             `quiet_litellm_output`)
  all        the three together: db2b5a9's process setup

for two routes: `aiohttp_openai/` to an unpriced model on a local zero-latency stub (the route and model
kind of `bench_run.py`) and a built-in (`baseline/always-escalate`, answered in-process through litellm).
Each (route, setting) runs in a fresh process, `--repeat` times, interleaved; medians are printed, with
the difference to `none`. Built-ins state their own cost (0) and carry no usage, so the cost-map search
does not apply to them any more (their `cost-map` line should show no gain).
CPU figures on a shared machine are noisy (±20 % between fresh processes); the function-call counts are not.

    python benchmarks/bench_litellm_globals.py [--calls 800] [--repeat 3] [--cli-gc]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = ("none", "cost-map", "gc-freeze", "quiet", "all")
COUNTED = 100
ROUTES = {"aiohttp_openai": "aiohttp_openai/unpriced-local-model", "built-in": "baseline/always-escalate"}

STUB = r"""
import asyncio, json
BODY = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "Fine, thanks."},
                                "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}).encode()
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = next((int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(n)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
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


def child(route: str, setting: str, calls: int, base: str, cli_gc: bool) -> None:
    """One measurement (in its own process): CPU ms per call of `calls` calls, 16 at a time."""
    if cli_gc:
        from sopgraph.perf import tune_gc_for_cli

        tune_gc_for_cli()
    from sopgraph.simulation.gateway import Gateway, ModelParams, ModelSpec, load_litellm

    litellm = load_litellm()
    model = ROUTES[route]
    spec = ModelSpec(role="agent", model=model,
                     params=ModelParams(api_base=None if route == "built-in" else base, temperature=0.7))
    if setting in ("cost-map", "all"):
        provider = model.split("/", 1)[0]
        litellm.register_model({model: {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0,
                                        "litellm_provider": provider, "mode": "chat"}})
    if setting in ("quiet", "all"):
        litellm.suppress_debug_info = True
        for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    if setting in ("gc-freeze", "all"):
        gc.collect()
        gc.freeze()
    messages = [{"role": "system", "content": "You are a support agent. " * 40},
                {"role": "user", "content": "My parcel has not arrived; what can you do?"}]

    async def go() -> tuple[float, float]:
        gateway = Gateway(concurrency=64, cache=False)
        slots = asyncio.Semaphore(16)

        async def one() -> None:
            async with slots:
                await gateway.complete(spec, messages, context={"role": "agent"})

        await asyncio.gather(*(one() for _ in range(64)))  # warm-up: pools, caches
        cpu = _cpu()
        await asyncio.gather(*(one() for _ in range(calls)))
        cpu = _cpu() - cpu
        # The same work counted, not timed: Python function calls per call on the event loop's thread
        # (litellm's thread-pool hop is not counted). Deterministic, so free of the machine's noise.
        profiler = cProfile.Profile()
        profiler.enable()
        await asyncio.gather(*(one() for _ in range(COUNTED)))
        profiler.disable()
        await gateway.aclose()
        return 1000 * cpu / calls, pstats.Stats(profiler).total_calls / COUNTED  # type: ignore[attr-defined]

    ms, functions = asyncio.run(go())
    print(json.dumps({"ms": ms, "functions": functions}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=800)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cli-gc", action="store_true", help="every process with the `sop` CLI's collector setting")
    ap.add_argument("--child", nargs=3, metavar=("ROUTE", "SETTING", "BASE"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        child(ns.child[0], ns.child[1], ns.calls, ns.child[2], ns.cli_gc)
        return
    stub = subprocess.Popen([sys.executable, "-c", STUB], stdout=subprocess.PIPE, text=True)
    results: dict[tuple[str, str], list[float]] = {}
    functions: dict[tuple[str, str], float] = {}
    started, load0 = time.perf_counter(), os.getloadavg()[0]
    try:
        assert stub.stdout is not None
        base = f"http://127.0.0.1:{int(stub.stdout.readline())}/v1"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "sk-bench")}
        for _ in range(ns.repeat):
            for route in ROUTES:
                for setting in SETTINGS:
                    argv = [sys.executable, __file__, "--calls", str(ns.calls), "--child", route, setting, base]
                    done = subprocess.run(argv + (["--cli-gc"] if ns.cli_gc else []), capture_output=True,
                                          text=True, env=env, check=True)
                    got = json.loads(done.stdout.splitlines()[-1])
                    results.setdefault((route, setting), []).append(got["ms"])
                    functions[(route, setting)] = got["functions"]
    finally:
        stub.kill()
        stub.wait()
    print(f"per Gateway.complete call: Python function calls on the event loop's thread ({COUNTED} calls under "
          f"cProfile; deterministic) and CPU (all threads), median of {ns.repeat} fresh processes per line "
          f"({ns.calls} calls, 16 in flight, {'the sop CLI' if ns.cli_gc else 'Python default'} GC setting; "
          f"load average {load0:.1f} → {os.getloadavg()[0]:.1f}, {time.perf_counter() - started:.0f} s)")
    summary = {}
    for route in ROUTES:
        plain = statistics.median(results[(route, "none")])
        for setting in SETTINGS:
            ms = statistics.median(results[(route, setting)])
            runs = ", ".join(f"{x:.2f}" for x in results[(route, setting)])
            delta = "" if setting == "none" else f"  {ms - plain:+.2f} ms ({(ms - plain) / plain:+.0%})"
            calls = functions[(route, setting)]
            fewer = "" if setting == "none" else f" ({(calls - functions[(route, 'none')]) / functions[(route, 'none')]:+.0%})"
            print(f"  {route:<15} {setting:<10} {calls:6.0f} function calls{fewer:<8} {ms:6.2f} ms CPU  [{runs}]{delta}")
            summary[f"{route}/{setting}"] = {"ms": round(ms, 3), "functions": round(calls)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
