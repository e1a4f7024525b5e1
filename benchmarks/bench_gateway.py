"""Gateway throughput benchmark against a local fake OpenAI-compatible server.

Why: a run simulates many dialogues at once; the harness (gateway + litellm)
must not be the bottleneck when the model is slow.  The fake server answers
every call after a fixed latency (50 ms) from a separate process (so it does
not share our GIL); N dialogues, each a fixed number of sequential calls, run
with 64 dialogues in flight.  Ideal throughput is concurrency / latency calls
per second (= concurrency / (calls per dialogue x latency) dialogues per
second); we print achieved / ideal and the client's CPU time per call.

The same load is also driven through bare ``litellm.acompletion`` so the
gateway's own overhead (CPU per call above litellm's) is visible.

    python benchmarks/bench_gateway.py                 # default: 128 dialogues x 8 calls
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

from sopgraph.gateway import Gateway, ModelSpec, load_litellm  # noqa: E402

Call = Callable[[list[dict[str, str]]], Awaitable[str]]


@dataclass
class Result:
    name: str
    calls: int
    dialogues: int
    wall: float
    cpu: float

    def report(self, concurrency: int, latency: float, per_dialogue: int) -> str:
        ideal_calls = concurrency / latency
        achieved_calls = self.calls / self.wall
        ideal_dialogues = concurrency / (per_dialogue * latency)
        achieved_dialogues = self.dialogues / self.wall
        cpu_ms = self.cpu / self.calls * 1000
        ceiling = 1000 / cpu_ms if cpu_ms else float("inf")
        return (
            f"{self.name:>8}: {self.calls} calls in {self.wall:.2f} s | "
            f"{achieved_dialogues:7.1f} dialogues/s (ideal {ideal_dialogues:.1f}) | "
            f"{achieved_calls:7.1f} calls/s (ideal {ideal_calls:.0f}) | "
            f"ratio {achieved_calls / ideal_calls:.3f} | "
            f"CPU {cpu_ms:.3f} ms/call (single-core ceiling ~{ceiling:.0f} calls/s)"
        )


def start_server(latency: float, lifetime: float) -> tuple[subprocess.Popen[str], str]:
    """The fake server in its own process, so its CPU is not charged to (and does not slow) the client."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "fakeserver.py"),
            "--latency",
            str(latency),
            "--lifetime",
            str(lifetime),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line}")
    return proc, f"http://127.0.0.1:{line[1]}/v1"


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


def run_mode(
    name: str, call: Call, dialogues: int, per_dialogue: int, concurrency: int, profile: int
) -> Result:
    """Warm up, then drive the load once (optionally under cProfile)."""
    asyncio.run(drive(call, concurrency, 2, concurrency))  # connection pool, lazy imports, client caches
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    calls, wall, cpu = asyncio.run(drive(call, dialogues, per_dialogue, concurrency))
    if profiler:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(profile)
        print(f"--- profile of {name} ---\n{out.getvalue()}")
    return Result(name, calls, dialogues, wall, cpu)


def run_stubbed(
    litellm: Any, model: str, dialogues: int, per_dialogue: int, concurrency: int, latency: float
) -> Result:
    """The gateway alone: ``litellm.acompletion`` replaced by a sleep returning a canned response.

    Shows what our own code (semaphore, retries loop, redaction, records) costs per call and
    which throughput it could reach if the transport were free.
    """
    canned = litellm.ModelResponse(
        model=model,
        choices=[{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    )
    canned._hidden_params["response_cost"] = 0.0

    async def fake_acompletion(**kwargs: Any) -> Any:
        await asyncio.sleep(latency)
        return canned

    real = litellm.acompletion
    litellm.acompletion = fake_acompletion
    try:
        gateway = Gateway(concurrency=concurrency, cache=False)
        spec = ModelSpec(role="agent", model=model, params={"temperature": 0.7})

        async def call(messages: list[dict[str, str]]) -> str:
            return (await gateway.complete(spec, messages)).text

        return run_mode("stubbed", call, dialogues, per_dialogue, concurrency, 0)
    finally:
        litellm.acompletion = real


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dialogues", type=int, default=128)
    ap.add_argument("--calls-per-dialogue", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument(
        "--models",
        default="openai/gpt-4o-mini,hosted_vllm/bench-model",
        help="comma-separated; openai/ goes through the OpenAI SDK, hosted_vllm/ through litellm's httpx path",
    )
    ap.add_argument("--no-bare", action="store_true", help="skip the bare-litellm comparison run")
    ap.add_argument(
        "--slow-latency", type=float, default=0.5, help="also run a short load at this latency (0: skip)"
    )
    ap.add_argument(
        "--profile", type=int, default=0, help="print the top N cProfile entries of each gateway run"
    )
    args = ap.parse_args()

    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-real-key")
    t0 = time.perf_counter()
    litellm = load_litellm()
    print(f"litellm loaded in {time.perf_counter() - t0:.2f} s; load average {os.getloadavg()[0]:.2f}")
    C, L, K = args.concurrency, args.latency, args.calls_per_dialogue
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    results: list[Result] = []
    slow: list[Result] = []
    servers = []
    try:
        results.append(run_stubbed(litellm, models[0], args.dialogues, K, C, L))
        server, base = start_server(L, lifetime=150)
        servers.append(server)
        for index, model in enumerate(models):
            gateway = Gateway(concurrency=C, cache=False, max_retries=2, base_delay=0.01)
            spec = ModelSpec(role="agent", model=model, params={"api_base": base, "temperature": 0.7})

            async def via_gateway(
                messages: list[dict[str, str]], spec: ModelSpec = spec, g: Gateway = gateway
            ) -> str:
                return (await g.complete(spec, messages)).text

            async def via_litellm(messages: list[dict[str, str]], model: str = model) -> str:
                response = await litellm.acompletion(
                    model=model, messages=messages, api_base=base, temperature=0.7, max_retries=0, timeout=30
                )
                return response.choices[0].message.content

            if not args.no_bare and index == 0:
                results.append(run_mode(f"litellm {model}", via_litellm, args.dialogues, K, C, 0))
            results.append(run_mode(f"gateway {model}", via_gateway, args.dialogues, K, C, args.profile))
            stats = gateway.stats
            assert stats.failures == 0 and stats.retries == 0, stats
        if args.slow_latency > 0:
            slow_server, slow_base = start_server(args.slow_latency, lifetime=60)
            servers.append(slow_server)
            gateway = Gateway(concurrency=C, cache=False)
            spec = ModelSpec(
                role="agent", model=models[0], params={"api_base": slow_base, "temperature": 0.7}
            )

            async def slow_call(messages: list[dict[str, str]]) -> str:
                return (await gateway.complete(spec, messages)).text

            slow.append(run_mode(f"gateway {models[0]}", slow_call, 2 * C, 4, C, 0))
    finally:
        for proc in servers:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)

    print(
        f"\nload: {args.dialogues} dialogues x {K} sequential calls, concurrency {C}, "
        f"server latency {L * 1000:.0f} ms, {os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.2f}"
    )
    print(f"ideal: {C / (K * L):.1f} dialogues/s = {C / L:.0f} calls/s")
    for result in results:
        print(result.report(C, L, K))
    by_name = {r.name: r for r in results}
    stub = by_name.get("stubbed")
    if stub:
        print(
            f"(stubbed = gateway with litellm.acompletion replaced by a {L * 1000:.0f} ms sleep: "
            "the gateway's own ceiling)"
        )
    for model in models:
        bare, ours = by_name.get(f"litellm {model}"), by_name.get(f"gateway {model}")
        if bare and ours:
            own = (ours.cpu / ours.calls - bare.cpu / bare.calls) * 1000
            print(
                f"gateway's own CPU above bare litellm ({model}): {own:+.3f} ms/call "
                "(difference of two noisy runs; the stubbed run measures it directly)"
            )
        if ours:
            cpu = ours.cpu / ours.calls
            print(
                f"harness is CPU-bound below ~{0.9 * C * cpu * 1000:.0f} ms model latency at concurrency {C} "
                f"({model}: ratio >= 0.9 needs latency >= 0.9 x concurrency x CPU/call)"
            )
    for result in slow:
        print(f"\nsame harness at {args.slow_latency * 1000:.0f} ms latency (2x{C} dialogues x 4 calls):")
        print(result.report(C, args.slow_latency, 4))
    main_result = by_name[f"gateway {models[0]}"]
    ratio = (main_result.calls / main_result.wall) / (C / L)
    print(
        f"\nRESULT model={models[0]} ratio={ratio:.3f} (target >= 0.9) "
        f"cpu_ms_per_call={main_result.cpu / main_result.calls * 1000:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
