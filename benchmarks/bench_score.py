"""Benchmark: scoring one million stored turns must take under 30 s.

Generates synthetic turns and consensus for the telecom SOP (agents with label noise, wrong actions,
truncated paths, format errors; judges with no-consensus fields), then times what `sop score` does:
`score_run` (store → per-turn metrics) plus `summary()` (every aggregate with bootstrap CIs).

    python benchmarks/bench_score.py                 # 1e6 turns, in memory and through a SQLite store
    python benchmarks/bench_score.py --turns 200000 --mode memory

Prints wall and CPU time and the ratio to the budget (< 1 passes). The machine may be shared: the
load average is printed beside the times, and CPU time is the fairer number on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sopgraph  # noqa: E402
from sopgraph.evaluation.score import ScoreConfig, score_records, score_run  # noqa: E402
from sopgraph.logic.engine import decide  # noqa: E402
from sopgraph.records import CHAT_DIMENSIONS, Case, Dialogue, Persona  # noqa: E402

TELECOM = ROOT / "scenarios" / "telecom_package.sop"
BUDGET_S = 30.0


def synthetic(n_turns: int, *, turns_per_dialogue: int = 10, n_cases: int = 10_000, models: int = 2, seed: int = 0,
              judged: str = "sage"):
    """(scenario, cases, dialogues, turn dicts, consensus dicts) — deterministic for a seed.

    judged: "sage" = consensus on turns 1, 5, 10, 15 and the final turn (the runner's default
    `--judge-turns`), "all" = on every turn (the worst case)."""
    scenario = sopgraph.load(TELECOM)
    rng = random.Random(seed)
    fields = {v.name: list(v.type.values) for v in scenario.fields}
    actions = list(scenario.actions)
    cases = []
    for i in range(n_cases):
        truth = {f: rng.choice(v) for f, v in fields.items()}
        system = {"PackageStatus": rng.choice(["Contracted", "NoContract"]), "Penalty": rng.choice([0, 50, 120, 300])}
        d = decide(scenario, {**truth, **system})
        prohibited = [a for a, x in scenario.actions.items() if x.risky and a != d.finals["Action"]]
        cases.append(Case(id=f"c{i:06d}", scenario=scenario.name, path_id="P", intent="i", persona=Persona(name="p"),
                          truth=truth, system=system, expected_path=d.path, expected_finals=d.finals,
                          intensity=("zero", "weak", "strong")[i % 3],
                          bucket=("resolvable", "must-escalate", "adversarial")[i % 3],
                          prohibited_actions=prohibited, sop_hash=scenario.source_hash))
    n_dialogues = max(1, n_turns // turns_per_dialogue)
    dialogues, turns, consensus = [], [], []
    for k in range(n_dialogues):
        case = cases[k % n_cases]
        did = f"{case.id}#{k // n_cases}"
        dialogues.append(Dialogue(id=did, case_id=case.id, trial=k // n_cases, status="done",
                                  models={"agent": f"model-{k % models}"}, turns=turns_per_dialogue))
        skill = 0.9 if k % models == 0 else 0.6
        for t in range(1, turns_per_dialogue + 1):
            if rng.random() < 0.02:
                turns.append({"dialogue_id": did, "index": t, "format_error": True, "output": None,
                              "usage": {"prompt_tokens": 1200, "completion_tokens": 90, "cost": 0.0004}})
            else:
                labels = {f: (v if rng.random() < skill else rng.choice(fields[f])) for f, v in case.truth.items()}
                action = case.expected_finals["Action"] if rng.random() < skill else rng.choice(actions)
                path = case.expected_path if rng.random() < skill else case.expected_path[: rng.randint(1, 3)]
                turns.append({"dialogue_id": did, "index": t, "format_error": False,
                              "output": {"classification_output": labels, "cot": "", "now_path": path,
                                         "finals": {"Action": action}, "chat": "x" * rng.randint(40, 400)},
                              "usage": {"prompt_tokens": 1200, "completion_tokens": 90, "cost": 0.0004}})
            if judged == "sage" and t not in (1, 5, 10, 15) and t != turns_per_dialogue:
                continue
            nc = [rng.choice(list(fields))] if rng.random() < 0.05 else []
            consensus.append({"judgment_set": "default", "dialogue_id": did, "turn_index": t,
                              "labels": {f: v for f, v in case.truth.items() if f not in nc}, "no_consensus": nc,
                              "chat_scores": {d: float(rng.choice([3, 6, 9])) for d in CHAT_DIMENSIONS},
                              "judges_scored": 3})
    return scenario, cases, dialogues, turns, consensus


def write_store(run_dir: Path, scenario, cases, dialogues, turns, consensus) -> None:
    """A run store holding the synthetic records (bulk rows in the store's documented layout)."""
    from sopgraph.simulation.store import TOOL_VERSION, RunStore

    store = RunStore.create(run_dir, {"scenario": scenario.model_dump(mode="json"), "sop_hash": scenario.source_hash})
    store.add_cases(cases)
    store.add_dialogues(dialogues)
    stamp = (1, scenario.source_hash, TOOL_VERSION)
    dumps = json.dumps
    with store.transaction() as c:
        c.executemany(
            "INSERT INTO turns(dialogue_id, idx, format_error, data, schema_version, sop_hash, tool_version)"
            " VALUES (?,?,?,?,?,?,?)",
            ((t["dialogue_id"], t["index"], int(t["format_error"]),
              dumps({**t, "user_text": "hello", "agent_raw": "{}"}), *stamp) for t in turns))
        c.executemany(
            "INSERT INTO consensus(judgment_set, dialogue_id, turn_index, data, schema_version, sop_hash,"
            " tool_version) VALUES (?,?,?,?,?,?,?)",
            ((k["judgment_set"], k["dialogue_id"], k["turn_index"], dumps(k), *stamp) for k in consensus))
    store.close()


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=float, default=1e6)
    ap.add_argument("--mode", choices=["memory", "store", "both"], default="both")
    ap.add_argument("--budget", type=float, default=BUDGET_S)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--judged", choices=["sage", "all"], default="sage",
                    help="consensus on turns 1, 5, 10, 15, final (runner default) or on every turn")
    args = ap.parse_args()
    n = int(args.turns)
    cfg = ScoreConfig(bootstrap=args.bootstrap)
    (scenario, cases, dialogues, turns, consensus), gen_s, _ = timed(lambda: synthetic(n, judged=args.judged))
    print(f"generated {len(turns):,} turns, {len(consensus):,} consensus rows, {len(dialogues):,} dialogues, "
          f"{len(cases):,} cases in {gen_s:.1f} s")
    results = []
    if args.mode in ("memory", "both"):
        run, w1, c1 = timed(lambda: score_records(scenario, cases, dialogues, turns, consensus, cfg, run="bench"))
        summary, w2, c2 = timed(run.summary)
        results.append(("in memory", w1 + w2, c1 + c2, w1, w2, run, summary))
    if args.mode in ("store", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            _, ws, _ = timed(lambda: write_store(Path(tmp) / "run", scenario, cases, dialogues, turns, consensus))
            print(f"wrote the SQLite store in {ws:.1f} s")
            del turns[:], consensus[:]
            run, w1, c1 = timed(lambda: score_run(Path(tmp) / "run", cfg))
            summary, w2, c2 = timed(run.summary)
            results.append(("SQLite store", w1 + w2, c1 + c2, w1, w2, run, summary))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for name, wall, cpu, w_score, w_sum, run, summary in results:
        print(f"{name:>12}: score {run.counts['turns']:,} turns + {len(summary.groups)} aggregates "
              f"(B={cfg.bootstrap}): wall {wall:.1f} s (per-turn {w_score:.1f} s, aggregates {w_sum:.1f} s), "
              f"cpu {cpu:.1f} s; {run.counts['turns'] / wall:,.0f} turns/s; "
              f"ratio to {args.budget:g} s budget: wall {wall / args.budget:.2f}, cpu {cpu / args.budget:.2f}; "
              f"distinct outcomes {run.counts['distinct_turn_outcomes']:,}")
    print(f"load average (1 min): {load:.2f} on {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()
