"""Runner throughput benchmark: `sopgraph.runner.run` against a fake OpenAI-compatible server.

Why: a run drives thousands of dialogues; with a slow model the harness (runner + store + gateway +
litellm) must keep `concurrency` calls in flight. Every role (agent, user simulator, three judges) is
pointed at a fake server in its own process (so it does not share our GIL) that answers after a fixed
latency (50 ms): agent replies are valid JSON with a non-ending action, the user stops after
`--turns` turns, judges answer valid labels. So every dialogue makes the same number of calls K and

    ideal throughput = concurrency / (K × latency) dialogues per second.

Printed: the achieved/ideal ratio over the whole run and over the steady state (between the 10 %
and 90 % call-completion marks, so ramp-up and tail are excluded), the harness's CPU time per model call, the part of it spent outside the gateway
(runner + SQLite store), and the same load driven through bare `Gateway.complete` calls for
comparison (the gateway/litellm ceiling on this machine).

    python benchmarks/bench_run.py                     # 256 dialogues, concurrency 64, 50 ms
    python benchmarks/bench_run.py --dialogues 128 --profile 25
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TOY = """
scenario bench "Bench refunds"
field Want: Money | Info "what the user wants"
field Angry: bool "whether the user is angry"
system Paid: bool "whether the order is paid"
action Refund "give money back" [moves_money, ends_dialogue]
action Explain "explain the policy"
action Human "hand over" [escalation]
stage s1 "classify" { classify Want, Angry -> s2 }
stage s2 "route" { match Want { Money -> s3 Info -> do Explain } }
stage s3 "paid" { when Paid and not Angry -> do Refund otherwise -> do Explain }
"""
AGENT_REPLY = json.dumps({"classification_output": {"Want": "Info", "Angry": False}, "cot": "enquiry",
                          "now_path": ["s1", "s2"], "finals": {"Action": "Explain"},
                          "chat": "Our policy is simple: refunds within 30 days."})
JUDGE_REPLY = json.dumps({"labels": {"Want": "Info", "Angry": False},
                          "scores": {"linguistic": 9, "anthropomorphism": 6, "content_utility": 6,
                                     "satisfaction": 6, "instruction": 9},
                          "reasons": {"labels": "asks about the policy"}})


# --------------------------------------------------------------------------------------------- server

def serve(latency: float, turns: int, lifetime: float) -> int:
    """The fake server (child process): answers by the model name each role uses."""
    import threading

    from fakeserver import Behavior, FakeServer

    def responder(req: Any) -> Any:
        model = str((req.body or {}).get("model", ""))
        if model.endswith("agent"):
            return Behavior.ok(AGENT_REPLY, latency=latency, prompt_tokens=900, completion_tokens=60)
        if model.endswith("user"):
            said = sum(1 for m in req.messages if m.get("role") == "assistant")
            text = "Thanks, that is all.\n###STOP###" if said >= turns else f"Question number {said + 1}?"
            return Behavior.ok(text, latency=latency, prompt_tokens=300, completion_tokens=12)
        return Behavior.ok(JUDGE_REPLY, latency=latency, prompt_tokens=1500, completion_tokens=80)

    server = FakeServer(max_connections=2048, lifetime=lifetime, record=False)
    server.responder(responder)
    server.start()
    print(f"PORT {server.port}", flush=True)
    reader = threading.Thread(target=sys.stdin.read, daemon=True)
    reader.start()
    deadline = time.monotonic() + lifetime
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(0.2)
    server.stop()
    return 0


def start_server(latency: float, turns: int, lifetime: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--latency", str(latency), "--turns", str(turns),
                             "--lifetime", str(lifetime)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line}")
    return proc, f"http://127.0.0.1:{line[1]}/v1"


# --------------------------------------------------------------------------------------------- client

def make_cases(n: int) -> tuple[Any, list[Any]]:
    from sopgraph import load
    from sopgraph.engine import decide
    from sopgraph.records import Case, Persona

    sc = load(text=TOY)
    truth, system = {"Want": "Info", "Angry": False}, {"Paid": True}
    d = decide(sc, {**truth, **system})
    return sc, [Case(sop_hash=sc.source_hash, id=f"b{i:05d}", scenario="bench", path_id="p", intent="enquiry",
                     persona=Persona(name="p"), truth=truth, system=system, expected_path=d.path,
                     expected_finals=d.finals, user_facts=system) for i in range(n)]


class CallClock:
    """Wraps a gateway's `complete` to timestamp call starts and ends (for the steady-state window)."""

    def __init__(self, gateway: Any):
        self.starts: list[float] = []
        self.ends: list[float] = []
        inner = gateway.complete

        async def complete(spec: Any, messages: Any, *, context: Any = None) -> Any:
            self.starts.append(time.perf_counter())
            try:
                return await inner(spec, messages, context=context)
            finally:
                self.ends.append(time.perf_counter())

        gateway.complete = complete

    def steady_rate(self) -> tuple[float, float, int]:
        """(calls/s, window seconds, calls) between the 10 % and the 90 % completion marks: the steady
        state, without the ramp-up and the tail of the last dialogues."""
        ends = sorted(self.ends)
        if len(ends) < 10:
            return 0.0, 0.0, 0
        lo, hi = len(ends) // 10, (len(ends) * 9) // 10
        window = ends[hi] - ends[lo]
        return ((hi - lo) / window if window > 0 else 0.0), window, hi - lo


class StoreTimer:
    """Accumulates the time spent in RunStore write methods (the per-turn SQLite cost)."""

    def __init__(self) -> None:
        from sopgraph.store import RunStore

        self.seconds = 0.0
        self.writes = 0
        for name in ("add_turn", "start_dialogue", "finish_dialogue", "fail_dialogue"):
            original = getattr(RunStore, name)

            def wrapped(self_: Any, *a: Any, _orig: Any = original, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return _orig(self_, *a, **k)
                finally:
                    self.seconds += time.perf_counter() - t
                    self.writes += 1

            setattr(RunStore, name, wrapped)


async def drive_run(base: str, cases: list[Any], scenario: Any, concurrency: int, out: Path) -> dict[str, Any]:
    from sopgraph.gateway import Gateway
    from sopgraph.runner import run

    gateway = Gateway(concurrency=concurrency, cache=False, max_retries=2, base_delay=0.01)
    clock = CallClock(gateway)
    models = [f"agent=openai/bench-agent,api_base={base}", f"user=openai/bench-user,api_base={base}",
              f"judge=openai/bench-judge,api_base={base}"]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    summary = await run(scenario, cases, models, out, concurrency=concurrency, gateway=gateway, progress=False)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    steady, window, steady_calls = clock.steady_rate()
    return {"summary": summary, "wall": wall, "cpu": cpu, "calls": gateway.stats.calls,
            "failures": gateway.stats.failures, "steady": steady, "window": window, "steady_calls": steady_calls}


async def drive_bare(base: str, calls: int, per_dialogue: int, concurrency: int) -> tuple[float, float]:
    """The same number of calls through bare Gateway.complete: the gateway/litellm ceiling."""
    from sopgraph.gateway import Gateway, parse_model_option

    gateway = Gateway(concurrency=concurrency, cache=False)
    spec = parse_model_option(f"agent=openai/bench-agent,api_base={base}")
    slots = asyncio.Semaphore(concurrency)

    async def dialogue(i: int) -> None:
        async with slots:
            history = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": f"hi {i}"}]
            for turn in range(per_dialogue):
                text = (await gateway.complete(spec, history)).text
                history += [{"role": "assistant", "content": text}, {"role": "user", "content": f"t{turn}"}]

    wall0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(dialogue(i) for i in range(max(1, calls // per_dialogue))))
    return time.perf_counter() - wall0, time.process_time() - cpu0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dialogues", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--turns", type=int, default=4, help="agent turns per dialogue")
    ap.add_argument("--profile", type=int, default=0, help="print the top N cProfile entries of the run")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare-gateway comparison")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lifetime", type=float, default=170.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.latency, args.turns, args.lifetime)

    from sopgraph.gateway import load_litellm

    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-real-key")
    t0 = time.perf_counter()
    load_litellm()
    print(f"litellm loaded in {time.perf_counter() - t0:.2f} s; load average {os.getloadavg()[0]:.2f}")
    C, L, T = args.concurrency, args.latency, args.turns
    judged = len({1, T})
    K = T + (T + 1) + 3 * judged  # agent turns + user turns (the last one stops) + 3 judges per judged turn
    scenario, cases = make_cases(args.dialogues)
    warm_scenario, warm_cases = make_cases(C)
    proc, base = start_server(L, T, args.lifetime)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(drive_run(base, warm_cases, warm_scenario, C, Path(tmp) / "warm"))  # pools, imports
            timer = StoreTimer()
            profiler = cProfile.Profile() if args.profile else None
            if profiler:
                profiler.enable()
            res = asyncio.run(drive_run(base, cases, scenario, C, Path(tmp) / "run"))
            if profiler:
                profiler.disable()
            size = sum(p.stat().st_size for p in (Path(tmp) / "run").iterdir())
        bare = None if args.no_bare else asyncio.run(drive_bare(base, res["calls"], T, C))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)

    summary = res["summary"]
    assert summary.by_status == {"done": args.dialogues}, summary.by_status
    assert res["failures"] == 0
    per_dialogue = res["calls"] / args.dialogues
    assert per_dialogue == K, (per_dialogue, K)
    ideal_d = C / (K * L)
    achieved_d = args.dialogues / res["wall"]
    ratio = achieved_d / ideal_d
    steady_ratio = res["steady"] / (C / L)
    cpu_ms = res["cpu"] / res["calls"] * 1000
    store_ms = timer.seconds / timer.writes * 1000 if timer.writes else 0.0
    print(f"\nload: {args.dialogues} dialogues x {K} calls ({T} agent, {T + 1} user, {3 * judged} judge), "
          f"concurrency {C}, latency {L * 1000:.0f} ms, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"ideal: {ideal_d:.1f} dialogues/s = {C / L:.0f} calls/s")
    print(f"run:   {achieved_d:.1f} dialogues/s in {res['wall']:.2f} s | ratio {ratio:.3f} | "
          f"steady state {res['steady']:.0f} calls/s over {res['window']:.1f} s, ratio {steady_ratio:.3f}")
    print(f"harness CPU {cpu_ms:.3f} ms/call ({res['cpu']:.2f} s for {res['calls']} calls); store writes "
          f"{timer.writes} at {store_ms:.3f} ms each ({timer.seconds / res['calls'] * 1000:.3f} ms per call); "
          f"run dir {size / 1e6:.1f} MB")
    if bare is not None:
        wall, cpu = bare
        bare_ms = cpu / res["calls"] * 1000
        print(f"bare gateway, same calls: {res['calls'] / wall:.0f} calls/s, CPU {bare_ms:.3f} ms/call -> "
              f"runner + store overhead {cpu_ms - bare_ms:+.3f} ms/call; run reaches "
              f"{(res['calls'] / res['wall']) / (res['calls'] / wall):.3f} of the bare-gateway throughput")
    # A single-threaded client spends C x cpu on every "wave" of C answers, during which no new call
    # is issued: expected ratio ~ L / (L + C x cpu); >= 0.9 needs L >= 9 x C x cpu.
    expect = L / (L + C * cpu_ms / 1000)
    print(f"CPU model: expected ratio ~ L / (L + C x cpu) = {expect:.3f}; ratio >= 0.9 at this CPU cost needs "
          f"latency >= {9 * C * cpu_ms / 1000:.2f} s, or CPU <= {L / (9 * C) * 1000:.3f} ms/call at {L * 1000:.0f} ms")
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
        print(out.getvalue())
    print(f"\nRESULT ratio={ratio:.3f} steady_ratio={steady_ratio:.3f} (target >= 0.9) cpu_ms_per_call={cpu_ms:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
