"""`sop run --ray` throughput: dialogues/s of a local run vs Ray on 1 and 2 simulated nodes.

Why: `--ray` exists to go past one machine. With a slow model (200 ms) a run is bound by calls in
flight, so a node with its own task (and its own `--concurrency` cap) should add about its share; this
measures what the batching, the object store and the driver's commits cost on top. Every role goes to
the fake OpenAI-compatible server of `bench_run.py` (another process, fixed latency).

The simulated nodes are `ray.cluster_utils.Cluster` nodes on this machine (1 CPU each, 127.0.0.1), so
they share its cores: the ratios show the overhead and the scaling of calls in flight, not more CPU.
With `--ray`, `--concurrency` is per task: 1 node runs C calls at once, 2 nodes 2C.

    python benchmarks/bench_ray.py                      # 96 dialogues, concurrency 8, 200 ms
    python benchmarks/bench_ray.py --dialogues 200 --latency 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def _bench_run() -> Any:
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "bench_run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_run"] = mod
    spec.loader.exec_module(mod)
    return mod


def one_run(br: Any, tag: str, n: int, concurrency: int, latency: float, base: str, tmp: Path,
            ray: str | None) -> float:
    """Seconds for `n` dialogues (asserted all done)."""
    from sopgraph.simulation.runner import run

    scenario, cases = br.make_cases(n)
    lat_ms = round(latency * 1000)
    models = [f"{role}=aiohttp_openai/{tag}-L{lat_ms}-{role},api_base={base},temperature=0.7"
              for role in ("agent", "user", "judge")]
    options = {"cache": False, "max_retries": 2, "base_delay": 0.01}
    started = time.perf_counter()
    summary = asyncio.run(run(scenario, cases, models, tmp / tag, concurrency=concurrency, progress=False,
                              gateway_options=options, ray=ray, preflight=False))
    wall = time.perf_counter() - started
    assert summary.by_status == {"done": n}, (tag, summary.by_status, summary.infra_errors[:1])
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dialogues", type=int, default=96)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--turns", type=int, default=2, help="agent turns per dialogue")
    args = ap.parse_args()
    try:
        import ray
        from ray._private import ray_constants
        from ray.cluster_utils import Cluster
    except ImportError:
        print("needs Ray: pip install 'sopgraph[ray]'")
        return 1
    br = _bench_run()
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-real-key")
    # Single-host cluster: the driver joins the nodes on 127.0.0.1 (see tests/test_distributed.py).
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    n, c, lat = args.dialogues, args.concurrency, args.latency
    print(f"{n} dialogues, {args.turns} agent turns, {lat * 1000:.0f} ms per call, concurrency {c}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    server = br.Server(args.turns, 900.0)
    cluster = None
    rates: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            one_run(br, "warmlocal", c, c, lat, server.base, tmp, None)
            rates["local"] = n / one_run(br, "local", n, c, lat, server.base, tmp, None)
            print(f"  local: {rates['local']:.2f} dialogues/s", flush=True)
            node = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
            t0 = time.perf_counter()
            cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
            ray.init(address=cluster.address, logging_level="WARNING")
            print(f"  (1-node cluster up in {time.perf_counter() - t0:.1f} s)", flush=True)
            one_run(br, "warm1", c, c, lat, server.base, tmp, cluster.address)
            rates["ray, 1 node"] = n / one_run(br, "ray1", n, c, lat, server.base, tmp, cluster.address)
            print(f"  ray, 1 node: {rates['ray, 1 node']:.2f} dialogues/s", flush=True)
            cluster.add_node(**node)
            cluster.wait_for_nodes()
            one_run(br, "warm2", 2 * c, c, lat, server.base, tmp, cluster.address)
            rates["ray, 2 nodes"] = n / one_run(br, "ray2", n, c, lat, server.base, tmp, cluster.address)
            print(f"  ray, 2 nodes: {rates['ray, 2 nodes']:.2f} dialogues/s", flush=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        server.close()
    ideal = c / ((2 * args.turns + 1 + 3 * len({1, args.turns})) * lat)
    print(f"\nideal at concurrency {c}: {ideal:.2f} dialogues/s (local and 1 node), {2 * ideal:.2f} (2 nodes)")
    for name, rate in rates.items():
        best = 2 * ideal if "2 nodes" in name else ideal
        print(f"  {name:<14} {rate:6.2f} dialogues/s  x{rate / rates['local']:.2f} of local, "
              f"{rate / best:.2f} of ideal")
    print(f"driver peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
