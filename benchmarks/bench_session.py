"""Engine session benchmarks (issue 30). Prints rates measured in one run.

1. Session stepping in the library: `sopgraph.start` on examples/no_service.sop with no values, every
   request answered with `provide`, every event taken with `next()`: at least 100,000 steps/s (a step is
   one event: a request, an action or the end).
2. `sop decide` over JSON Lines (a real process, stdin to stdout): at least 10,000 lines/s of CPU after
   start-up; the CPU seconds of a process deciding one line (start-up included) are printed beside it.
3. `sop decide` to its first line on a ~20-decision troubleshooting procedure (`bench_analysis.troubleshooting_sop`,
   re-checks and bounded retries): at most 1 s of CPU from process start (the median of 5 processes; each
   decides one line). No flow proof runs: `decide` loads with the cheap checks only (issue 31).
Byte-compiled modules are allowed (as an installed package has them): run without PYTHONDONTWRITEBYTECODE,
or start-up includes compiling every module (about 0.3 s more).
Rates are per CPU second (user + system), so a busy machine does not distort them.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sopgraph  # noqa: E402
from sopgraph.logic.session import Need, start  # noqa: E402

NO_SERVICE = ROOT / "examples" / "no_service.sop"


def rows(n: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [{"Mood": rng.choice(["Calm", "Upset"]), "AccountSuspended": rng.random() < 0.1,
             "AreaOutage": rng.random() < 0.1, "OutageHours": rng.randint(0, 72),
             "AirplaneMode": rng.random() < 0.3, "SimDetected": rng.random() < 0.9,
             "SimAgeYears": rng.randint(0, 30), "Registered": rng.choice(["Home", "Roaming"]),
             "ServiceRestored": [rng.random() < 0.3 for _ in range(4)]} for _ in range(n)]


def bench_stepping(n: int = 20_000) -> bool:
    scenario = sopgraph.load(NO_SERVICE)
    data = rows(n)
    start(scenario, data[0]).run()  # compile both forms before timing
    t0 = time.process_time()  # CPU time: the machine may be shared
    steps = 0
    for row in data:
        session = start(scenario)
        looks = row["ServiceRestored"]
        for event in session:
            steps += 1
            if event.__class__ is Need:
                session.provide(event.variable, looks[event.look - 1] if event.look else row[event.variable])  # type: ignore[union-attr]
    rate = steps / (time.process_time() - t0)
    print(f"[session] no_service, {n:,} runs, {steps:,} steps (requests, actions, ends): {rate:,.0f} steps/s "
          f"of CPU (target >= 100,000)")
    return rate >= 100_000


def _child_cpu(cmd: list[str], data: bytes, env: dict[str, str]) -> tuple[float, bytes]:
    """CPU seconds (user + system) of one child process run on `data`, and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, input=data, capture_output=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout


def bench_decide_lines(n: int = 30_000) -> bool:
    lines = "".join(json.dumps(r) + "\n" for r in rows(n, seed=2)).encode()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", "from sopgraph.cli import entry; entry()", "decide", str(NO_SERVICE)]
    first, _ = _child_cpu(cmd, lines.split(b"\n", 1)[0] + b"\n", env)  # start-up and the first line
    empty, _ = _child_cpu(cmd, b"", env)
    total, out = _child_cpu(cmd, lines, env)
    assert out.count(b"\n") == n
    rate = n / max(total - empty, 1e-9)
    print(f"[decide] `sop decide` JSON Lines, {n:,} lines: {rate:,.0f} lines/s of CPU after start-up "
          f"(target >= 10,000); start-up and first line: {first:.2f} s of CPU")
    return rate >= 10_000


def bench_first_line(decisions: int = 20, runs: int = 5) -> bool:
    import importlib.util
    import tempfile

    spec = importlib.util.spec_from_file_location("bench_analysis", ROOT / "benchmarks" / "bench_analysis.py")
    assert spec is not None and spec.loader is not None
    shapes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shapes)
    text = shapes.troubleshooting_sop(decisions)
    k = max(2, decisions // 3)
    line = json.dumps({"Device": "Laptop", "Urgent": False,
                       **{f"Ok{i}": [False, True] for i in range(k)}}).encode() + b"\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trouble.sop"
        path.write_text(text, encoding="utf-8")
        cmd = [sys.executable, "-c", "from sopgraph.cli import entry; entry()", "decide", str(path)]
        _child_cpu(cmd, line, env)  # byte-compiles the modules once, as an installed package has them
        times = []
        for _ in range(runs):
            cpu, out = _child_cpu(cmd, line, env)
            assert b'"path"' in out, out
            times.append(cpu)
    times.sort()
    median = times[len(times) // 2]
    print(f"[decide] first line on a ~{decisions}-decision troubleshooting procedure ({len(text.splitlines())} lines): "
          f"median {median:.2f} s of CPU from process start over {runs} processes (min {times[0]:.2f}, max "
          f"{times[-1]:.2f}; target <= 1.0)")
    return median <= 1.0


def main() -> int:
    results = [bench_stepping(), bench_decide_lines(), bench_first_line()]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
