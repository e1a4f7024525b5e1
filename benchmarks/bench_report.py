"""Benchmark: the HTML report of a 10,000-dialogue run must build in under 20 s.

Builds a synthetic run store (telecom SOP, two agent models, five turns per dialogue, three judges
on the judged turns) and times `report_for_runs` — scoring, aggregates with bootstrap CIs, judge
agreement, coverage graph (Graphviz), example selection and transcripts — end to end.

    python benchmarks/bench_report.py                  # 10,000 dialogues
    python benchmarks/bench_report.py --dialogues 2000

Prints wall and CPU time, the ratio to the budget (< 1 passes), the report size and the load average.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_score import synthetic, write_store  # noqa: E402

from sopgraph.evaluation.report import report_for_runs  # noqa: E402
from sopgraph.evaluation.score import ScoreConfig  # noqa: E402
from sopgraph.records import CHAT_DIMENSIONS  # noqa: E402

BUDGET_S = 20.0


def add_judgments(run_dir: Path, consensus: list[dict], seed: int = 0) -> None:
    """Three judges per judged turn, agreeing with the consensus most of the time."""
    from sopgraph.simulation.store import TOOL_VERSION, RunStore

    rng = random.Random(seed)
    store = RunStore.open(run_dir)
    rows = []
    for k in consensus:
        for j in range(3):
            labels = dict(k["labels"])
            if labels and rng.random() < 0.15:
                f = rng.choice(sorted(labels))
                labels[f] = labels[f] + "?"  # a dissenting label
            data = {"schema_version": 1, "sop_hash": store.sop_hash, "judgment_set": "default",
                    "dialogue_id": k["dialogue_id"], "turn_index": k["turn_index"], "judge": f"judge{j + 1}",
                    "model": "bench/judge", "labels": labels,
                    "scores": {d: rng.choice([3, 6, 9]) for d in CHAT_DIMENSIONS}, "reasons": {}, "raw": "",
                    "unscored_reason": None,
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0, "cost": 0.0,
                              "cost_known": True, "calls": 0}}
            rows.append(("default", k["dialogue_id"], k["turn_index"], f"judge{j + 1}", "bench/judge", 1,
                         json.dumps(data), 1, store.sop_hash, TOOL_VERSION))
    with store.transaction() as c:
        c.executemany("INSERT INTO judgments(judgment_set, dialogue_id, turn_index, judge, model, scored, data,"
                      " schema_version, sop_hash, tool_version) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dialogues", type=int, default=10_000)
    ap.add_argument("--turns-per-dialogue", type=int, default=5)
    ap.add_argument("--budget", type=float, default=BUDGET_S)
    args = ap.parse_args()
    per = args.turns_per_dialogue
    scenario, cases, dialogues, turns, consensus = synthetic(args.dialogues * per, turns_per_dialogue=per,
                                                              n_cases=max(1, args.dialogues // 4))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "bench-run"
        write_store(run_dir, scenario, cases, dialogues, turns, consensus)
        add_judgments(run_dir, consensus)
        w0, c0 = time.perf_counter(), time.process_time()
        html = report_for_runs([run_dir], ScoreConfig())
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        out = Path(tmp) / "report.html"
        out.write_text(html, encoding="utf-8")
        size = out.stat().st_size
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"report of {len(dialogues):,} dialogues ({len(turns):,} turns, {len(consensus):,} judged turns): "
          f"wall {wall:.1f} s, cpu {cpu:.1f} s (graphviz runs in a child process, not counted in cpu); "
          f"ratio to {args.budget:g} s budget: wall {wall / args.budget:.2f}, cpu {cpu / args.budget:.2f}; "
          f"{size / 1024:.0f} KiB")
    print(f"load average (1 min): {load:.2f} on {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()
