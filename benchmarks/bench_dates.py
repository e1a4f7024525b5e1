"""Date-vs-date comparisons in the constraint domain: difference literals (`diffbound`) vs. witness search.

Why: guards such as `BookedAt > now - 24 hours` compare two dates. They used to be residual predicates settled
by a witness search over candidate dates (and the SMT solver), which cannot prove a region empty when the reason
is whole-day rounding and is slow on long chains. Now they are difference literals decided by closure.

Method: random conjunctions of 2-6 comparisons between 5 date/datetime variables (seeded), each decided twice in
one run, interleaved: by the domain as shipped, and by the same domain with the difference solver switched off
(the previous behaviour). Printed: time ratio (old / new), and how many conjunctions each left undecided
(new must be 0) or decided differently where both decided (must be 0).

    python benchmarks/bench_dates.py [--n 300] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sopgraph.language.parse import load_source  # noqa: E402
from sopgraph.logic import domain  # noqa: E402

DECLS = """scenario bench "dates"
system D1: date "a"
system D2: date "b"
system T: datetime "c"
system U: datetime "d"
action Ok "ok"
"""
NAMES = ["D1", "D2", "T", "U", "now"]
SHIFTS = ["", " + 1 day", " - 12 hours", " + 36 hours", " - 1 second", " + 3 days"]


def guard(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(2, 6)):
        a, b = rng.sample(NAMES, 2)
        parts.append(f"{a} {rng.choice(['<', '<=', '>', '>='])} {b}{rng.choice(SHIFTS)}")
    return " and ".join(parts)


class _Old(domain.Space):
    """The domain without the difference solver: residuals go to witness search and the SMT solver."""

    def _solve_diffs(self, box, style, rng):  # type: ignore[no-untyped-def]
        return "unknown", None


def decide_all(space_cls: type, texts: list[str]) -> tuple[float, list[bool | None]]:
    out: list[bool | None] = []
    elapsed = 0.0
    for text in texts:
        loaded = load_source(None, text=DECLS + f'stage s "s" {{\n when {text} -> do Ok\n otherwise -> do Ok\n}}\n')
        sc = loaded.scenario
        assert sc is not None
        expr = sc.stages["s"].branches[0].guard
        t0 = time.perf_counter()
        sp = space_cls(sc)
        boxes = sp.constrain(sp.full, sp.formula(expr, True))
        verdicts = [sp.decide(b) for b in boxes]
        elapsed += time.perf_counter() - t0
        out.append(True if True in verdicts else (None if None in verdicts else False))
    return elapsed, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    texts = [guard(rng) for _ in range(args.n)]
    new_t = old_t = 0.0
    new_v: list[bool | None] = []
    old_v: list[bool | None] = []
    for i in range(0, len(texts), 25):  # interleaved batches: load changes hit both sides alike
        chunk = texts[i:i + 25]
        t, v = decide_all(domain.Space, chunk)
        new_t += t
        new_v += v
        t, v = decide_all(_Old, chunk)
        old_t += t
        old_v += v
    undecided_new = sum(v is None for v in new_v)
    undecided_old = sum(v is None for v in old_v)
    disagree = sum(1 for a, b in zip(new_v, old_v, strict=True) if a is not None and b is not None and a != b)
    print(f"{args.n} conjunctions of date comparisons")
    print(f"difference literals: {new_t:.2f}s, undecided {undecided_new}, "
          f"infeasible {sum(v is False for v in new_v)}")
    print(f"witness search + solver: {old_t:.2f}s, undecided {undecided_old}")
    print(f"speed ratio (old / new): {old_t / max(new_t, 1e-9):.1f}x; disagreements where both decided: {disagree}")


if __name__ == "__main__":
    main()
