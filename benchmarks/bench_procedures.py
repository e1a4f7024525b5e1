"""Procedure benchmarks (issue 9: steps that act, observe and retry). Prints ratios measured in one run.

1. `decide` on a procedure with observations and a bounded retry (examples/no_service.sop): at least
   100,000 decisions/s in a batch (path, finals and the action trace), and within 2x of a hand-written
   function computing the same three results.
2. Path counting on a procedure with bounded loops: exact (checked against the closed form) and under
   1 s for at least 1e6 feasible paths.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sopgraph.logic.checker import load  # noqa: E402
from sopgraph.logic.engine import engine_for  # noqa: E402
from sopgraph.logic.paths import count_paths  # noqa: E402


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


_CLOSE = {"name": "CloseFixed", "args": {}}
_AIR = {"name": "AskAirplaneOff", "args": {}}
_RESTART = {"name": "AskRestart", "args": {}}


def handwritten_no_service(v: dict) -> tuple[list[str], dict, list[dict]]:
    """examples/no_service.sop as a person would hand-code it (no validation), for comparison."""
    if v["AccountSuspended"]:
        return ["account"], {"Action": "ExplainPayment"}, [{"name": "ExplainPayment", "args": {}}]
    if v["AreaOutage"]:
        return ["account"], {"Action": "ReportOutage"}, [{"name": "ReportOutage", "args": {"hours": v["OutageHours"]}}]
    looks = v["ServiceRestored"]
    path = ["account", "status"]
    acts: list[dict] = []
    if looks[0]:
        return path, {"Action": "CloseFixed"}, [_CLOSE]
    k = 1
    if v["SimDetected"]:
        if v["AirplaneMode"]:
            acts.append(_AIR)
            path.append("recheck")
            k += 1
            if looks[1]:
                return path, {"Action": "CloseFixed"}, acts + [_CLOSE]
        push = {"name": "PushSettings", "args": {"profile": v["Registered"]}}
        for _ in range(2):
            path += ["fix", "retest"]
            acts += [push, _RESTART]
            k += 1
            if looks[k - 1]:
                return path, {"Action": "CloseFixed"}, acts + [_CLOSE]
        path.append("fix")
    path.append("sim")
    if v["Mood"] == "Calm":
        fee = 0 if v["SimAgeYears"] > 3 else 10
        return path, {"Action": "ReplaceSim"}, acts + [{"name": "ReplaceSim", "args": {"fee": fee}}]
    return path, {"Action": "TransHuman"}, acts + [{"name": "TransHuman", "args": {}}]


def rows(n: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append({
            "Mood": rng.choice(["Calm", "Upset"]), "AccountSuspended": rng.random() < 0.1,
            "AreaOutage": rng.random() < 0.1, "OutageHours": rng.randint(0, 72),
            "AirplaneMode": rng.random() < 0.3, "SimDetected": rng.random() < 0.9,
            "SimAgeYears": rng.randint(0, 30), "Registered": rng.choice(["Home", "Roaming"]),
            "ServiceRestored": [rng.random() < 0.3 for _ in range(4)],
        })
    return out


def bench_decide(n: int = 200_000) -> bool:
    scenario = load(ROOT / "examples" / "no_service.sop")
    engine = engine_for(scenario)
    distinct = rows(2000)
    for r in distinct:  # same answers, or the comparison is meaningless
        p, f, a = engine.decide_trace_raw(r)
        assert (list(p), f, list(a)) == handwritten_no_service(r), r
    batch = (distinct * (n // len(distinct) + 1))[:n]
    decide = engine.decide_trace_raw

    def ours() -> None:
        for r in batch:
            decide(r)

    def hand() -> None:
        for r in batch:
            handwritten_no_service(r)

    t_ours, t_hand = best_of(ours), best_of(hand)
    rate, ratio = n / t_ours, t_ours / t_hand
    ok = rate >= 100_000 and ratio <= 2.0
    print(f"[decide] no_service (observations + bounded retry), {n:,} decisions with action traces: "
          f"{rate:,.0f}/s (target >= 100,000/s); hand-written {n / t_hand:,.0f}/s; "
          f"ratio {ratio:.2f}x (target <= 2.00x) {'PASS' if ok else 'FAIL'} (engine mode: {engine.mode})")
    return ok


def retry_chain(k: int, retries: int) -> str:
    """k checks in sequence; each looks at its own value, retries a fix up to `retries` times, and gives
    up (ending the procedure) once the retries are spent."""
    lines = ['action Fix(step: int[0..1000]) "fix"', 'action Done "done"', 'action GiveUp "give up"']
    for i in range(k):
        nxt = f"-> c{i + 1}" if i + 1 < k else "-> do Done"
        lines.append(f'system S{i}: bool "check {i}"')
        lines.append(f"stage c{i} {{ observe S{i} when S{i} {nxt} otherwise -> r{i} }}")
        lines.append(f"stage r{i} {{ -> do Fix(step = {i}) -> c{i} up to {retries} times otherwise -> do GiveUp }}")
    return "\n".join(lines) + "\n"


def bench_count(k: int = 13, retries: int = 2) -> bool:
    text = retry_chain(k, retries)
    t0 = time.perf_counter()
    scenario = load(text=text, check=False)  # checking would count the paths already: time them alone
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = count_paths(scenario)
    t_count = time.perf_counter() - t0
    per = retries + 1  # outcomes of one check that go on: ok after 0..retries fixes
    expected = per ** k + sum(per ** i for i in range(k))  # ... plus giving up at any check
    ok = got.exact and got.feasible == expected and expected >= 1_000_000 and t_count < 1.0
    print(f"[count] {k} checks x (up to {retries} retries): {got.feasible:,} feasible paths "
          f"(closed form {expected:,}, exact={got.exact}); counted in {t_count:.3f} s (target < 1 s for >= 1e6) "
          f"{'PASS' if ok else 'FAIL'}; load {t_load:.2f} s")
    return ok


def main() -> None:
    quick = "--quick" in sys.argv
    results = [bench_decide(20_000 if quick else 200_000), bench_count()]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
