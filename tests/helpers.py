"""Helpers shared by several test modules (imported as a plain module: tests/ is on sys.path)."""

from __future__ import annotations

import importlib.util
import sqlite3
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def gen_sop() -> ModuleType:
    """The benchmark generator of large synthetic SOPs (benchmarks/gen_sop.py), loaded once."""
    if "gen_sop" in sys.modules:
        return sys.modules["gen_sop"]
    spec = importlib.util.spec_from_file_location("gen_sop", ROOT / "benchmarks" / "gen_sop.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_sop"] = mod
    spec.loader.exec_module(mod)
    return mod


TELECOM = ROOT / "scenarios" / "telecom_package.sop"


def floor_run(tmp_path_factory, agent: str) -> Path:
    """A small offline run of telecom cases with a baseline agent, shared by the test modules of one
    session (score, coverage and corpus tests all read the same floor runs)."""
    from click.testing import CliRunner

    from sopgraph.cli import main
    from sopgraph.simulation.runner import run_sync

    base = tmp_path_factory.getbasetemp() / "floor_runs"
    cases = base / "cases.jsonl"
    if not cases.exists():
        base.mkdir(parents=True, exist_ok=True)
        res = CliRunner().invoke(main, ["synth", str(TELECOM), "-n", "12", "-o", str(cases), "-q", "--seed", "3"])
        assert res.exit_code == 0, res.output
    out = base / agent.split("/")[-1]
    if not (out / "run.sqlite").exists():
        run_sync(str(TELECOM), str(cases), [f"agent={agent}"], str(out), trials=2, progress=False)
    return out


def scoring_sop(k: int, n: int, *, seed: int = 0) -> str:
    """A fraud/risk/triage-style scoring SOP: `k` derived `count()` scores over `n` shared inputs
    (bools, enum tests and numeric thresholds), the highest qualifying score picks a type (`max` +
    `case`), then a risk tier. Every branching is exhaustive; deterministic for a seed.

    This is the shape that made the flow analysis exponential in the number of scores (issue 13)."""
    import random

    rng = random.Random(seed)
    lines = [f'scenario scoring_{k}_{n} "Scoring {k}x{n}" "Synthetic indicator-scoring SOP."', ""]
    inputs: list[str] = []  # conditions over the shared inputs
    for i in range(n):
        kind = i % 3
        if kind == 0:
            lines.append(f'field I{i}: bool "indicator {i}"')
            inputs.append(f"I{i}")
        elif kind == 1:
            lines.append(f'field I{i}: Low{i} | Mid{i} | High{i} "graded indicator {i}"')
            inputs.append(f"I{i} == High{i}" if rng.random() < 0.5 else f"I{i} in {{Mid{i}, High{i}}}")
        else:
            lines.append(f'system I{i}: int[0..1000] "measured indicator {i}"')
            inputs.append(f"I{i} > {rng.randrange(100, 900, 50)}")
    per = max(2, min(n, (2 * n) // max(k, 1) + 1))
    for j in range(k):
        args = rng.sample(inputs, per)
        lines.append(f'let S{j} = count({", ".join(args)}) "score {j}"')
    lines.append("let Top = max(" + ", ".join(f"S{j}" for j in range(k)) + ") \"highest score\"")
    qualify = max(1, per // 3)
    arms = " ".join(f"when S{j} == Top -> T{j}" for j in range(k))
    lines.append(f"let Type = case {{ when Top < {qualify} -> Clear {arms} otherwise -> Clear }} \"type\"")
    mid = qualify + 1
    hi = max(mid + 1, (2 * per) // 3)
    lines.append(f"let Tier = case {{ when Top >= {hi} -> High when Top >= {mid} -> Medium otherwise -> Low }}")
    lines += ["", 'action Dismiss "nothing to do" [ends_dialogue]',
              'action Review "queue for review"', 'action Block "block the account" [irreversible]',
              'action Escalate "hand to the fraud team" [escalation]', ""]
    lines.append('stage triage "Triage" {\n    "Score the indicators."\n    match Type {\n'
                 "        Clear -> do Dismiss\n        otherwise -> tier\n    }\n}")
    lines.append('stage tier "Tier" {\n    match Tier {\n        High -> do Block\n'
                 "        Medium -> do Escalate\n        Low -> do Review\n    }\n}")
    return "\n".join(lines) + "\n"


def weighted_sop(k: int, n: int, *, weighted: bool, seed: int = 0) -> str:
    """`k` weighted scores over `n` shared indicators (bools, enum tests, thresholds), a referral
    tier from the highest score, and a second look at the main score: the fraud-referral shape.
    `weighted` writes each score `count(2: A, 1: B, …)`, else the same score as a sum of counts grouped
    by weight (`count(B) + 2 * count(A)`); the two files decide identically."""
    import random

    rng = random.Random(seed)
    lines = [f'scenario referral_{k}_{n} "Referral {k}x{n}" "Synthetic weighted-indicator referral SOP."', ""]
    conds: list[str] = []
    for i in range(n):
        if i % 3 == 0:
            lines.append(f'field F{i}: bool "flag {i}"')
            conds.append(f"F{i}")
        elif i % 3 == 1:
            lines.append(f'field F{i}: Low{i} | Mid{i} | High{i} "graded {i}"')
            conds.append(f"F{i} == High{i}")
        else:
            lines.append(f'system F{i}: int[0..1000] "amount {i}"')
            conds.append(f"F{i} > {rng.randrange(100, 900, 50)}")
    per = max(3, min(n, (2 * n) // max(k, 1) + 1))
    total = 0
    for j in range(k):
        picked = rng.sample(conds, per)
        weights = [rng.choice((1, 2, 3)) for _ in picked]
        total = max(total, sum(weights))
        if weighted:
            body = "count(" + ", ".join(f"{w}: {c}" for w, c in zip(weights, picked, strict=True)) + ")"
        else:
            groups: dict[int, list[str]] = {}
            for w, c in zip(weights, picked, strict=True):
                groups.setdefault(w, []).append(c)
            body = " + ".join((f"count({', '.join(cs)})" if w == 1 else f"{w} * count({', '.join(cs)})")
                              for w, cs in sorted(groups.items()))
        lines.append(f'let S{j} = {body} "score {j}"')
    lines.append("let Top = max(" + ", ".join(f"S{j}" for j in range(k)) + ")" if k > 1 else "let Top = S0")
    hi, mid = max(3, (2 * total) // 3), max(2, total // 3)
    lines += ["", 'action Clear "no referral" [ends_dialogue]', 'action Review "manual review"',
              'action Refer "refer to the fraud team" [escalation]', 'action Hold "hold the payment"', "",
              'stage triage "Triage" {',
              f"    when Top >= {hi} -> refer",
              f"    when Top >= {mid} -> review",
              "    otherwise -> do Clear",
              "}",
              'stage refer "Refer" {',
              f"    when S0 >= {hi} and {conds[0]} -> do Hold",
              "    otherwise -> do Refer",
              "}",
              'stage review "Review" {',
              f"    when S0 >= {mid} -> do Review",
              f"    when {conds[1]} -> do Hold",
              "    otherwise -> do Clear",
              "}"]
    return "\n".join(lines) + "\n"


def done_dialogues(run_dir: Path) -> int:
    """Done dialogues of a run, read without opening the store (a killed or running writer may still be
    creating it), for the kill -9 + resume tests."""
    return dialogues_with_status(run_dir, "done")


def dialogues_with_status(run_dir: Path, status: str) -> int:
    """Dialogues of a run in `status`, read from the store's file read-only (0 while it does not exist)."""
    db = run_dir / "run.sqlite"
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute("SELECT COUNT(*) FROM dialogues WHERE status=?", (status,)).fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute("SELECT COUNT(*) FROM dialogues WHERE status='done'").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def many_intents_profile(n: int, *, seed: int = 0) -> str:
    """A telecom_package profile of `n` generated intents (1-3 `requires` each over the scenario's
    fields and system variables, enum values and fee thresholds), as a large real profile repeats a few
    hundred condition sets. Issue 13: 20,000 such intents took over 60 s to check."""
    import random

    rng = random.Random(seed)
    values = {"ConsumptionType": ["Enquiry", "Change", "Cancel"], "ApplicationTendency": ["Agree", "Reject", "Hesitate"],
              "ConsumptionProfile": ["Data", "Voice"], "EmotionTag": ["Calm", "Discontent"],
              "PackageStatus": ["Contracted", "NoContract"], "Penalty": ["0", "> 0", "> 100", "<= 300"]}
    out = ["scenario: telecom_package", "description: many generated intents", "intents:"]
    for i in range(n):
        names = rng.sample(sorted(values), rng.randint(1, 3))
        req = ", ".join(f'{k}: "{rng.choice(values[k])}"' for k in names)
        out.append(f"  intent_{i}:\n    description: Generated intent {i}.\n"
                   f"    intensity: {rng.choice(['zero', 'weak', 'strong'])}\n    requires: {{{req}}}")
        if i % 3 == 0:
            out.append("    pushes_for: []")
    return "\n".join(out) + "\n"


SPLITTING_ROUTES = """\
type Item = record { amount: int[0..50], ok: bool }
system Items: list[..2] of Item "items"
system Box: record { level: int[0..5], open: bool } "box"
system Tags: list[1..2] of Red | Blue "tags"
system Flag: bool "flag"
action Note "note"
action Pay(amount: int[0..200]) "pay"
action Go "go"
stage s0 { observe Box, Items, Tags when Blue not in Tags -> do Note -> do Note -> s1 when sum(i.amount for i in Items) > 40 -> do Note -> do Pay(amount = len(Tags)) when Box.level >= 3 -> s0 up to 2 times otherwise -> do Note -> do Pay(amount = Box.level) -> s2 }
stage s1 { observe Items, Tags, Box when Red in Tags -> s2 when count(i in Items where i.amount > 20) >= 1 -> do Pay(amount = 0) -> do Note -> s2 when Box.level >= 3 -> s0 up to 2 times otherwise -> do Pay(amount = len(Tags)) -> s2 }
stage s2 { observe Tags, Box when Red in Tags -> do Pay(amount = len(Tags)) -> do Go when all(t in Tags where t == Red) -> do Note -> do Note -> do Go otherwise -> do Go }
"""
"""A procedure from test_unroll's generator (observed lists and records, re-checks): every stage splits
each box of a route's region (list membership over the looks), so a whole route's region grows with the
product of the splits. `sop check` ran for minutes (3.6 GB) and `iter_paths` did not end (issue 31)."""


def box_counter(limit: int):
    """A `Space.constrain_region` wrapper that counts the boxes it returns and raises past `limit`
    (so a test of the bound fails fast on code without it); returns (wrapper, stats)."""
    from sopgraph.logic import domain

    original = domain.Space.constrain_region
    stats = {"boxes": 0}

    def counted(self, region, f, *args):  # noqa: ANN001, ANN202 - a test double
        out = original(self, region, f, *args)
        stats["boxes"] += len(out)
        if stats["boxes"] > limit:
            raise RuntimeError(f"more than {limit} boxes")
        return out

    return counted, stats


ORDER = """
scenario o "O"
type Line = record { price: float[0..2000], returned: bool, food: bool }
field Reason: Damaged | Unwanted | Late "r"
field Mood: Calm | Angry "m"
system Lines: list[1..6] of Line "lines"
system OrderId: string "the order number"
system Coupon: string? "a coupon code, if any"
let Refund = sum(l.price for l in Lines where l.returned)
let Perishable = any(l in Lines where l.returned and l.food)
action Reject "r"
action Ask "a"
action Voucher "v"
action Human "h"
action Pay "p"
stage s {
    when not (OrderId matches "ORD-[0-9]{6}") -> do Reject
    when count(l in Lines where l.returned) == 0 -> do Ask
    when Perishable and Reason != Damaged -> do Reject
    when Reason == Late and not missing(Coupon) and Coupon matches "(?i)late.*" -> do Voucher
    when Refund > 500 and Mood == Angry -> do Human
    otherwise -> do Pay
}
"""
"""A 23-line order SOP: a list of 1-6 order lines, a float sum of the returned prices, `any(…)` over them and
two `matches` tests (issue 31: it took 16 s of CPU to check; tests/test_solver.py, tests/test_budget.py)."""
