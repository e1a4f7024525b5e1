"""Gateway throughput benchmark against a local fake OpenAI-compatible server.

Why: a run simulates many dialogues at once; the harness (gateway + litellm) must not be the
bottleneck when the model is slow. The fake server answers every call after a fixed latency from a
separate process (so it does not share our GIL); N dialogues, each a fixed number of sequential
calls, run with 64 dialogues in flight. Ideal throughput is concurrency / latency calls per second
(= concurrency / (calls per dialogue x latency) dialogues per second); we print achieved / ideal and
the client's CPU time per call, for:

  stubbed                  the gateway with litellm.acompletion replaced by a sleep (our code alone)
  litellm <route>          bare litellm.acompletion (no gateway), for the gateway's own overhead
  gateway <route>          the gateway over each litellm transport: openai/ (OpenAI SDK),
                           hosted_vllm/ (litellm's httpx path), aiohttp_openai/ (litellm's aiohttp path)
  @ 200 ms ... @ 1 s       the fastest route at slower models: where the ratio reaches 0.9

then a verdict on the target (ratio >= 0.9 at 50 ms, concurrency 64) with the CPU arithmetic.
Multi-process runs (`sop run --workers N`) are measured by benchmarks/bench_run.py.

    python benchmarks/bench_gateway.py                 # default: 128 dialogues x 8 calls, ~50 s in all
    python benchmarks/bench_gateway.py --profile 25    # plus the top-25 cProfile entries
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from sopgraph.simulation.gateway import Gateway, ModelSpec, load_litellm  # noqa: E402

Call = Callable[[list[dict[str, str]]], Awaitable[str]]
ROUTES = ("openai", "hosted_vllm", "aiohttp_openai")


@dataclass
class Result:
    name: str
    latency: float
    calls: int
    dialogues: int
    wall: float
    cpu: float

    def ratio(self, concurrency: int) -> float:
        return (self.calls / self.wall) / (concurrency / self.latency)

    @property
    def cpu_ms(self) -> float:
        return self.cpu / self.calls * 1000

    def report(self, concurrency: int, per_dialogue: int) -> str:
        ideal_dialogues = concurrency / (per_dialogue * self.latency)
        return (
            f"{self.name:<30} {self.latency * 1000:>5.0f}ms {self.calls:>6} {self.wall:>6.2f}s "
            f"{self.dialogues / self.wall:>7.1f} {ideal_dialogues:>6.1f} {self.calls / self.wall:>8.0f} "
            f"{concurrency / self.latency:>6.0f} {self.ratio(concurrency):>6.3f} {self.cpu_ms:>8.3f}"
        )


def serve(latency: float, lifetime: float) -> int:
    """The fake server (child process): every call answered after ``latency`` seconds."""
    import threading

    from fakeserver import Behavior, FakeServer

    server = FakeServer(default=Behavior.ok("ok", latency=latency), max_connections=100_000,
                        max_requests=10_000_000, lifetime=lifetime, record=False)
    server.start()
    print(f"PORT {server.port}", flush=True)
    reader = threading.Thread(target=sys.stdin.read, daemon=True)
    reader.start()
    deadline = time.monotonic() + lifetime
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(0.2)
    server.stop()
    print(f"CPU {time.process_time():.4f} REQUESTS {server.request_count}", flush=True)
    return 0


class Server:
    """The fake server in its own process, so its CPU is not charged to (and does not slow) the client."""

    def __init__(self, latency: float, lifetime: float):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--latency", str(latency), "--lifetime", str(lifetime)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            self.proc.kill()
            raise RuntimeError(f"fake server did not start: {line}")
        self.base = f"http://127.0.0.1:{line[1]}/v1"
        self.cpu_ms = 0.0

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        for line in self.proc.stdout:
            if line.startswith("CPU "):
                parts = line.split()
                self.cpu_ms = float(parts[1]) / max(int(parts[3]), 1) * 1000
        self.proc.wait(10)


async def drive(call: Call, dialogues: int, per_dialogue: int, concurrency: int) -> tuple[int, float, float]:
    """Run ``dialogues`` dialogues of ``per_dialogue`` sequential calls, ``concurrency`` at a time."""
    slots = asyncio.Semaphore(concurrency)
    done = 0

    async def dialogue(i: int) -> None:
        nonlocal done
        async with slots:
            history = [
                {"role": "system", "content": "You are a customer-service agent. Follow the SOP."},
                {"role": "user", "content": f"Hello, this is customer {i}. I need help with my order."},
            ]
            for turn in range(per_dialogue):
                text = await call(history)
                history += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"turn {turn}: here is one more detail."},
                ]
                done += 1

    wall0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(dialogue(i) for i in range(dialogues)))
    return done, time.perf_counter() - wall0, time.process_time() - cpu0


def run_mode(name: str, make_call: Callable[[], Awaitable[tuple[Call, Any]]], latency: float, dialogues: int,
             per_dialogue: int, concurrency: int, profile: int = 0) -> Result:
    """Warm up, then drive the load once (optionally under cProfile), all in one event loop.

    ``make_call`` returns (call, closer) inside the loop: HTTP sessions are per loop."""

    async def both() -> tuple[int, float, float]:
        call, closer = await make_call()
        await drive(call, concurrency, 2, concurrency)  # connection pool, lazy imports, client caches
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        try:
            return await drive(call, dialogues, per_dialogue, concurrency)
        finally:
            if profiler:
                profiler.disable()
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(profile)
                print(f"--- profile of {name} ---\n{out.getvalue()}")
            if closer is not None:
                await closer()

    calls, wall, cpu = asyncio.run(both())
    return Result(name, latency, calls, dialogues, wall, cpu)


def gateway_call(model: str, base: str, concurrency: int) -> Callable[[], Awaitable[tuple[Call, Any]]]:
    async def make() -> tuple[Call, Any]:
        gateway = Gateway(concurrency=concurrency, cache=False, max_retries=2, base_delay=0.01)
        spec = ModelSpec(role="agent", model=model, params={"api_base": base, "temperature": 0.7})

        async def call(messages: list[dict[str, str]]) -> str:
            return (await gateway.complete(spec, messages)).text

        return call, gateway.aclose

    return make


def bare_call(litellm: Any, model: str, base: str) -> Callable[[], Awaitable[tuple[Call, Any]]]:
    async def make() -> tuple[Call, Any]:
        extra: dict[str, Any] = {}
        closer = None
        if model.startswith("aiohttp_openai/"):
            import aiohttp

            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            extra["client"], closer = session, session.close

        async def call(messages: list[dict[str, str]]) -> str:
            response = await litellm.acompletion(model=model, messages=messages, api_base=base, temperature=0.7,
                                                 max_retries=0, timeout=30, **extra)
            return response.choices[0].message.content

        return call, closer

    return make


def stub_call(litellm: Any, model: str, latency: float, concurrency: int) -> Callable[[], Awaitable[tuple[Call, Any]]]:
    """The gateway alone: ``litellm.acompletion`` replaced by a sleep returning a canned response."""
    canned = litellm.ModelResponse(
        model=model,
        choices=[{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    )
    canned._hidden_params["response_cost"] = 0.0

    async def fake_acompletion(**kwargs: Any) -> Any:
        await asyncio.sleep(latency)
        return canned

    async def make() -> tuple[Call, Any]:
        gateway = Gateway(concurrency=concurrency, cache=False)
        spec = ModelSpec(role="agent", model=model, params={"temperature": 0.7})

        async def call(messages: list[dict[str, str]]) -> str:
            return (await gateway.complete(spec, messages)).text

        return call, None

    real = litellm.acompletion

    async def wrapped() -> tuple[Call, Any]:
        litellm.acompletion = fake_acompletion
        call, _ = await make()

        async def restore() -> None:
            litellm.acompletion = real

        return call, restore

    return wrapped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dialogues", type=int, default=128)
    ap.add_argument("--calls-per-dialogue", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--slow", default="0.2,0.5,1.0", help="slower latencies (s) for the fastest route ('' to skip)")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare-litellm comparison runs")
    ap.add_argument("--profile", type=int, default=0, help="print the top N cProfile entries of each gateway run")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lifetime", type=float, default=300.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.latency, args.lifetime)

    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-real-key")
    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    litellm = load_litellm()
    print(f"litellm loaded in {time.perf_counter() - started:.2f} s; load average {load0:.2f}", flush=True)
    C, L, K, N = args.concurrency, args.latency, args.calls_per_dialogue, args.dialogues
    slow = [float(x) for x in args.slow.split(",") if x.strip()]
    results: list[Result] = []
    server = Server(L, args.lifetime)
    servers = [server]
    try:
        results.append(run_mode("stubbed", stub_call(litellm, "openai/bench-model", L, C), L, N, K, C))
        for route in ROUTES:
            model = f"{route}/bench-model"
            if not args.no_bare and route != "hosted_vllm":
                results.append(run_mode(f"litellm {route}/", bare_call(litellm, model, server.base), L, N, K, C))
            results.append(run_mode(f"gateway {route}/", gateway_call(model, server.base, C), L, N, K, C,
                                    args.profile))
            print(f"  {results[-1].name}: {results[-1].wall:.1f} s", flush=True)
        best = max((r for r in results if r.name.startswith("gateway")), key=lambda r: r.ratio(C))
        best_model = best.name.split()[1] + "bench-model"
        for latency in slow:
            other = Server(latency, args.lifetime)
            servers.append(other)
            # 4 calls per dialogue, 2 x C dialogues: about (8 x latency) seconds.
            results.append(run_mode(f"{best.name} @ {latency * 1000:.0f} ms",
                                    gateway_call(best_model, other.base, C), latency, 2 * C, 4, C))
            print(f"  {results[-1].name}: {results[-1].wall:.1f} s", flush=True)
    finally:
        for s in servers:
            s.close()

    print(f"\nload: {N} dialogues x {K} sequential calls (slow runs: {2 * C} x 4), concurrency {C}, "
          f"{os.cpu_count()} CPUs, load average {load0:.2f} before / {os.getloadavg()[0]:.2f} after")
    print(f"{'run':<30} {'latency':>7} {'calls':>6} {'wall':>7} {'dlg/s':>7} {'ideal':>6} {'calls/s':>8} "
          f"{'ideal':>6} {'ratio':>6} {'CPU ms':>8}")
    for result in results:
        print(result.report(C, K))
    by = {r.name: r for r in results}
    stub = by["stubbed"]
    print(f"(stubbed = the gateway with litellm.acompletion replaced by a {L * 1000:.0f} ms sleep: our own code; "
          f"the fake server used {server.cpu_ms:.3f} ms CPU per call in its own process)")
    for route in ROUTES:
        bare, ours = by.get(f"litellm {route}/"), by[f"gateway {route}/"]
        line = f"gateway {route}/: litellm {ours.cpu_ms - stub.cpu_ms:.3f} ms CPU per call above our own code"
        if bare:
            line += f"; gateway above bare litellm {ours.cpu_ms - bare.cpu_ms:+.3f} ms (two noisy runs)"
        print(line)
    print(f"fastest route: {best.name} at {L * 1000:.0f} ms: ratio {best.ratio(C):.3f}, {best.cpu_ms:.3f} ms CPU/call")
    for r in results:
        if r.latency != L:
            verdict = "reaches" if r.ratio(C) >= 0.9 else "does not reach"
            print(f"  at {r.latency * 1000:.0f} ms it {verdict} 0.9 (ratio {r.ratio(C):.3f})")
    # Here the C dialogues move in lockstep (all start together, every call has the same latency), so
    # each wave of C answers costs C x CPU of one core before the next wave of calls goes out:
    # ratio ~ L / (L + C x cpu), and 0.9 needs L >= 9 x C x cpu. (Real runs are less synchronised.)
    print(f"lockstep model: ratio ~ L / (L + {C} x {best.cpu_ms:.2f} ms), 0.9 from L >= "
          f"{9 * C * best.cpu_ms / 1000:.2f} s; the harness alone ({stub.cpu_ms:.3f} ms) from "
          f"L >= {9 * C * stub.cpu_ms / 1000:.3f} s")
    need = 0.9 * C / L
    demand = need * (best.cpu_ms + server.cpu_ms) / 1000
    print(f"0.9 at {L * 1000:.0f} ms needs {need:.0f} calls/s x ({best.cpu_ms:.2f} ms client + {server.cpu_ms:.2f} ms "
          f"server) = {demand:.2f} CPU-seconds per second; one event loop has 1 core "
          f"(this machine {os.cpu_count()}, load average {load0:.2f})")
    if best.ratio(C) >= 0.9:
        print(f"TARGET REACHED by {best.name}")
    else:
        print(f"TARGET NOT REACHED at {L * 1000:.0f} ms in one process: litellm's CPU per call caps it at "
              f"~{1000 / best.cpu_ms:.0f} calls/s per core (see bench_run.py for --workers)")
    print(f"\nRESULT model={best_model} ratio={best.ratio(C):.3f} (target >= 0.9) cpu_ms_per_call={best.cpu_ms:.3f} "
          f"harness_only_cpu_ms={stub.cpu_ms:.3f} litellm_cpu_ms={best.cpu_ms - stub.cpu_ms:.3f} "
          f"total_s={time.perf_counter() - started:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
