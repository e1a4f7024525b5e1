"""Harness overhead for agents acting through tools (docs/agents.md) against a fixed-latency local stub.

Modes (the issue's letters): b = a function-calling model through the gateway (`agent=tools:openai/…`),
c = your own agent over HTTP.

Why: with a slow agent the harness (runner, dialogue loop, scripted user and judges, store) must keep
`concurrency` agent requests in flight. The stub (its own process, so it does not share our GIL)
answers every request after a fixed latency: as an HTTP agent, a question without a tool call; as a
function-calling model, a `lookup` call and then, given its result, a question (two requests per
turn). The scripted user and judges are the offline built-ins; the three judges judge each dialogue's
final turn only (`sop run --judge-turns final`: `sop run`'s default also judges turns 1, 5, 10 and 15, three
more judge calls for each of those a dialogue reaches). With C = concurrency, L = latency and N agent requests made in the run,

    ideal time = N × L / C        ratio = ideal time / measured time

Targets (issue "Evaluate real agents"): ≥ 0.9 of ideal throughput at L = 200 ms and C = 64; the 50 ms figure
is printed with its arithmetic (harness CPU per agent request vs. the time budget per request, L / C of wall
time). Throughput is the steady-state ratio: the request rate at the stub between the 10 % and 90 % marks of
its requests, so without what happens once per run (litellm's first-call work before the workers fork, the
model check, the drain when the last dialogues run with fewer than C requests in flight and are judged); the
whole-run ratio is printed beside it, with the seconds before the first request and after the last. Also printed:
the stub's own CPU per request, and the time the process waited for a CPU (load from other work).
The run uses the collector setting the `sop` entry point applies (`--library-gc`: Python's default)
and `--workers N` processes as `sop run --workers N` would (CPU then counts every process).

    python benchmarks/bench_agents.py [--dialogues 640] [--concurrency 64] [--modes b,c] [--workers 2]
                                      [--repeat 3] [--builtins-direct] [--priced] [--library-gc] [--profile 30]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STUB = r"""
import asyncio, json, sys, time
LAT = float(sys.argv[1])
AGENT = json.dumps({"reply": "Could you tell me more?", "tool_calls": []}).encode()
def chat(body):
    # mode b: a function-calling model that looks a value up, then asks a question (2 calls per turn)
    req = json.loads(body)
    msgs = req.get("messages") or []
    if msgs and msgs[-1].get("role") == "user":
        look = next((t["function"] for t in req.get("tools") or () if t["function"]["name"] == "lookup"), None)
        if look is not None:
            name = look["parameters"]["properties"]["name"]["enum"][0]
            msg = {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function",
                   "function": {"name": "lookup", "arguments": json.dumps({"name": name})}}]}
            return _done(req, msg, "tool_calls")
    return _done(req, {"role": "assistant", "content": "Could you tell me more?"}, "stop")
def _done(req, msg, why):
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": req.get("model", "m"),
                       "choices": [{"index": 0, "message": msg, "finish_reason": why}],
                       "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}).encode()
ARRIVALS = []
async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            ARRIVALS.append(time.monotonic())
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":")[1])
            raw = await reader.readexactly(n)
            await asyncio.sleep(LAT)
            body = chat(raw) if b"chat/completions" in head.split(b"\r\n")[0] else AGENT
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    # stdin closed by the benchmark: report every request's arrival time (CLOCK_MONOTONIC is
    # system-wide on Linux) and this process's CPU, then stop
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print(json.dumps({"arrivals": ARRIVALS, "cpu": time.process_time()}), flush=True)
asyncio.run(main())
"""


def _runqueue_wait() -> float:
    """Seconds this process's main thread has spent runnable but waiting for a CPU (Linux schedstat):
    on a shared, loaded machine, the part of the elapsed time that is the machine's, not the harness's."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the `--workers` processes)."""
    r, k = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + k.ru_utime + k.ru_stime


def steady_ratio(arrivals: list[float], latency: float, concurrency: int) -> float | None:
    """Achieved/ideal request rate between the 10 % and 90 % marks of the stub's arrivals: the run
    without its ramp-up and tail (the last dialogues finish with fewer than `concurrency` in flight)."""
    if len(arrivals) < 20:
        return None
    times = sorted(arrivals)
    lo, hi = len(times) // 10, len(times) * 9 // 10
    span = times[hi] - times[lo]
    return (hi - lo) / span / (concurrency / latency) if span > 0 else None


MODES = {"b": "tool-calling model, tools:ROUTE/…", "c": "HTTP agent"}


def measure(mode: str, latency: float, dialogues: int, concurrency: int, max_turns: int,
            profile: int = 0, route: str = "aiohttp_openai", builtins_direct: bool = False,
            workers: int = 1, priced: bool = False) -> dict:
    """One run against the stub: mode `b` (a function-calling model through the gateway: a lookup,
    then a question, two calls per turn) or `c` (an HTTP agent, one request per turn)."""
    import sopgraph
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import synthesize
    from sopgraph.simulation.runner import in_own_loop, run
    from sopgraph.simulation.store import RunStore

    sop = ROOT / "scenarios" / "telecom_package.sop"
    scenario = sopgraph.load(sop)
    base = list(synthesize(scenario, profile_for(sop, scenario), 60, seed=7, min_per_path=1).cases)
    cases = [c.model_copy(update={"id": f"{c.id}-{i}"}) for i in range(dialogues // len(base) + 1)
             for c in base][:dialogues]
    stub = subprocess.Popen([sys.executable, "-c", STUB, str(latency)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    report: dict = {"arrivals": [], "cpu": 0.0}
    prof = cProfile.Profile() if profile else None
    try:
        port = int(stub.stdout.readline())
        agent = (f"agent=http://127.0.0.1:{port}/agent" if mode == "c" else
                 f"agent=tools:{route}/stub,api_base=http://127.0.0.1:{port}/v1"
                 + (",input_cost_per_token=0,output_cost_per_token=0" if priced else ""))
        # the one-time litellm import (~2-4 s of CPU) is not per-turn harness work; in both modes the
        # built-in user and judges go through litellm
        from sopgraph.simulation.gateway import load_litellm

        load_litellm()
        with tempfile.TemporaryDirectory() as tmp:
            cpu, t0, wait = _cpu(), time.perf_counter(), _runqueue_wait()
            if prof is not None:
                prof.enable()
            # as `sop run` does: its own loop set up by `in_own_loop` (and so every worker's)
            asyncio.run(in_own_loop(run(scenario, cases, [agent], Path(tmp) / "r", concurrency=concurrency,
                                        max_turns=max_turns, progress=False, judge_turns="final", workers=workers,
                                        gateway_options={"builtins_via_litellm": not builtins_direct})))
            if prof is not None:
                prof.disable()
            elapsed, cpu, wait = time.perf_counter() - t0, _cpu() - cpu, _runqueue_wait() - wait
            with RunStore.open(Path(tmp) / "r") as store:
                turns = store.turns()
        assert stub.stdin is not None and stub.stdout is not None
        stub.stdin.close()
        report = json.loads(stub.stdout.readline() or "{}") or report
    finally:
        stub.kill()
        stub.wait()
    n = len(turns)
    requests = sum(max(1, t.usage.calls) for t in turns)  # agent requests (mode b: calls per turn)
    ideal = requests * latency / concurrency
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(profile)
        print(out.getvalue())
    per_request = 1000 * cpu / requests
    arrivals = sorted(report["arrivals"])
    # time.perf_counter and the stub's time.monotonic are both CLOCK_MONOTONIC on Linux
    ramp, tail = (arrivals[0] - t0, t0 + elapsed - arrivals[-1]) if arrivals else (0.0, 0.0)
    return {"ramp": ramp, "tail": tail, "mode": mode, "latency": latency, "turns": n, "requests": requests, "elapsed": elapsed,
            "ideal": ideal, "ratio": ideal / elapsed, "wait": wait, "workers": workers,
            "steady": steady_ratio(report["arrivals"], latency, concurrency),
            "stub_ms": 1000 * report["cpu"] / max(1, len(report["arrivals"])),
            "ceiling": ceiling(latency, concurrency, per_request, workers),
            "cpu_per_turn_ms": 1000 * cpu / n, "cpu_per_request_ms": per_request}


def median_run(runs: list[dict]) -> dict:
    """The run with the median whole-run ratio, with every run's ratio and steady-state ratio (`runs`, `steadies`)."""
    chosen = dict(sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2])
    chosen["runs"] = sorted(r["ratio"] for r in runs)
    chosen["steadies"] = sorted(r["steady"] or 0.0 for r in runs)
    return chosen


def ceiling(latency: float, concurrency: int, cpu_ms_per_request: float, cores: int) -> float:
    """The ratio the harness CPU allows on `cores` free cores: C requests in flight for L seconds
    each need one answered every L / C seconds, and each costs `cpu_ms_per_request` of CPU."""
    return min(1.0, cores * 1000 * latency / concurrency / max(cpu_ms_per_request, 1e-9))


def _report(mode: str, rows: list[dict], ns: argparse.Namespace, gc_note: str) -> dict:
    """Print one mode's lines (per latency, the 200 ms verdict, the 50 ms arithmetic); its summary."""
    procs = f"{ns.workers} worker processes" if ns.workers > 1 else "one process"
    for r in rows:
        steady = "n/a" if r["steady"] is None else f"{r['steady']:.2f}"
        print(f"mode {mode} ({MODES[mode]}), latency {r['latency'] * 1000:.0f} ms, concurrency {ns.concurrency}, "
              f"{procs}, {gc_note}: {r['requests']} agent requests ({r['turns']} turns) in {r['elapsed']:.1f} s "
              f"(ideal {r['ideal']:.1f} s) → ratio {r['ratio']:.2f}, steady state {steady} (10–90 % of the "
              f"requests: no ramp-up, no tail; {r['ramp']:.2f} s to the first request, {r['tail']:.2f} s after the "
              f"last); {r['wait']:.1f} s waiting for a CPU (machine load); harness CPU "
              f"{r['cpu_per_turn_ms']:.2f} ms per turn, {r['cpu_per_request_ms']:.2f} ms per request (all its "
              f"processes) → at most {r['ceiling']:.2f} of ideal on {ns.workers} free core(s); the stub used "
              f"{r['stub_ms']:.2f} ms CPU per request in its own process"
              + (f"; the median of {len(r['runs'])} runs (ratios {', '.join(f'{x:.2f}' for x in r['runs'])}; "
                 f"steady {', '.join(f'{x:.2f}' for x in r['steadies'])})" if len(r["runs"]) > 1 else ""))
    r200, r50 = rows
    best = max(r200["ratio"], r200["steady"] or 0.0)
    print(f"mode {mode}: target ≥ 0.9 of ideal throughput at {r200['latency'] * 1000:.0f} ms: "
          f"{'met' if best >= 0.9 else 'NOT met'} (steady state {r200['steady'] or 0:.2f}; whole run "
          f"{r200['ratio']:.2f}, which also counts {r200['ramp']:.2f} s before the first request and "
          f"{r200['tail']:.2f} s after the last; the harness CPU per request allows {r200['ceiling']:.2f} on "
          f"{ns.workers} free core(s))")
    budget = 1000 * r50["latency"] / ns.concurrency
    print(f"mode {mode} at {r50['latency'] * 1000:.0f} ms: {ns.concurrency} requests in flight need one answered every {budget:.2f} ms "
          f"of wall time; the harness spends {r50['cpu_per_request_ms']:.2f} ms CPU per request ({procs}) → at "
          f"most {ns.workers} × {budget:.2f} / {r50['cpu_per_request_ms']:.2f} = {r50['ceiling']:.2f} of ideal on "
          f"{ns.workers} free core(s) (measured {r50['ratio']:.2f}, steady state {r50['steady'] or 0:.2f})")
    return {"ratio_200ms": round(r200["ratio"], 3), "ratio_50ms": round(r50["ratio"], 3),
            "steady_200ms": round(r200["steady"] or 0, 3), "steady_50ms": round(r50["steady"] or 0, 3),
            "ceiling_200ms": round(r200["ceiling"], 3), "ceiling_50ms": round(r50["ceiling"], 3),
            "cpu_ms_per_turn_200ms": round(r200["cpu_per_turn_ms"], 2),
            "cpu_ms_per_request_50ms": round(r50["cpu_per_request_ms"], 2), "workers": ns.workers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dialogues", type=int, default=640)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--modes", default="b,c", help="which agent kinds: b (tool calling), c (HTTP)")
    ap.add_argument("--latencies", default="0.2,0.05", help="the two latencies (s): the target's, then the other")
    ap.add_argument("--workers", type=int, default=1,
                    help="worker processes (`sop run --workers N`); concurrency is shared among them")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per mode and latency; the run with the median ratio is reported, with the range "
                         "of all (CPU time on a shared machine varies by ±20 %% between identical runs)")
    ap.add_argument("--profile", type=int, default=0, help="print the N top cProfile lines of each run")
    ap.add_argument("--route", default="aiohttp_openai",
                    help="litellm route of mode b (aiohttp_openai: the lightest; openai: through the OpenAI SDK)")
    ap.add_argument("--builtins-direct", action="store_true",
                    help="call the built-in user and judges without litellm (what sop runs never do): "
                         "shows how much of the harness cost is litellm's per-call work")
    ap.add_argument("--priced", action="store_true",
                    help="mode b: give the stub model its price per call (litellm's documented per-call "
                         "input_cost_per_token/output_cost_per_token, 0 here), as a user can for a local model; "
                         "litellm then skips searching its cost map for the unknown model on every call")
    ap.add_argument("--library-gc", action="store_true",
                    help="keep Python's default collector settings (a library caller's), not the `sop` CLI's")
    ns = ap.parse_args()
    if ns.library_gc:
        gc_note = "Python's default GC"
    else:  # what a `sop run` user gets: the entry point applies it before any command runs
        from sopgraph.perf import tune_gc_for_cli

        tune_gc_for_cli()
        gc_note = "the `sop` CLI's GC setting"
    if ns.priced:
        gc_note += ", the tool-calling model priced per call"
    latencies = [float(x) for x in ns.latencies.split(",")]
    summary = {}
    for mode in ns.modes.split(","):
        rows = [median_run([measure(mode, lat, ns.dialogues, ns.concurrency, ns.max_turns, ns.profile, ns.route,
                                    ns.builtins_direct, ns.workers, ns.priced) for _ in range(max(1, ns.repeat))])
                for lat in latencies]
        summary[mode] = _report(mode, rows, ns, gc_note)
    print(json.dumps(summary))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
