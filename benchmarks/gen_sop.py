"""Generator of large synthetic `.sop` programs for benchmarks and property tests.

`generate(stages, kind=..., seed=...)` returns the text of a valid program (it loads without
diagnostics and every branching is exhaustive):

- `diamond`: a chain of `stages` decision stages; every branch of stage i leads to stage i+1 and the
  last one to actions. Each stage branches on its own variable (enum match with 2-4 values, a bool,
  or 3 int thresholds), so the number of feasible paths is exactly the product of the branch counts
  (about 3**stages): 40 stages give ~1e19 paths.
- `chain`: a long chain where each stage may end the SOP (enum value, bool flag, or a decreasing
  threshold on a shared `Amount`) or go on; ~2-3 paths per stage, and deep (tests recursion).
- `realistic`: what a very large real SOP looks like: ~50 shared variables (enum fields, bool flags,
  money and day counts, a derived fee) read again and again by `stages` stages, each of which
  continues to the next stage (so every stage is reachable) or jumps a little ahead or ends in an
  action; every branching is exhaustive.
- `mixed`: a random DAG over shared variables (enums revisited by later stages, int/float
  thresholds, a derived affine variable, `count(...)`, `and`/`or`), so many graph paths are
  infeasible and feasibility depends on the whole prefix.
- `orders`: the shape of an order-refund SOP: a list of 1-M order lines (records with a float price, an int
  quantity and bool flags), a float sum of some lines' prices, `any`/`all`/`count` over the lines, string
  fields tested with `matches` (one optional, read behind `missing`), enum fields; `stages` stages of one
  or two such tests each, every stage going on to the next or ending in an action.

CLI: `python benchmarks/gen_sop.py STAGES [--kind diamond|chain|mixed|realistic|orders] [--seed N] [-o FILE]`.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

KINDS = ("diamond", "chain", "mixed", "realistic", "orders")


def _sid(i: int, n: int) -> str:
    return f"s{i:0{max(3, len(str(n)))}d}"


def generate(stages: int, *, kind: str = "diamond", seed: int = 0) -> str:
    """Text of a synthetic SOP with `stages` decision stages (deterministic for a seed)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    if stages < 1:
        raise ValueError("stages must be >= 1")
    rng = random.Random(seed)
    builders = {"diamond": _diamond, "chain": _chain, "mixed": _mixed, "realistic": _realistic, "orders": _orders}
    return builders[kind](stages, rng, seed)


def _header(name: str, lines: list[str]) -> None:
    lines.append(f'scenario {name} "Synthetic {name}"')
    lines.append("")


def _actions(lines: list[str], k: int) -> list[str]:
    names = [f"A{j}" for j in range(k)]
    for j, a in enumerate(names):
        attrs = " [escalation]" if j == k - 1 else ""
        lines.append(f'action {a} "synthetic action {j}"{attrs}')
    lines.append("")
    return names


def _diamond(n: int, rng: random.Random, seed: int) -> str:
    lines: list[str] = []
    _header(f"diamond_{n}_{seed}", lines)
    decls: list[str] = []
    bodies: list[str] = []
    actions = ["A0", "A1", "A2"]
    for i in range(1, n + 1):
        sid = _sid(i, n)
        nxt = _sid(i + 1, n) if i < n else None
        kind = rng.choice(("enum", "enum", "bool", "int"))
        if kind == "enum":
            k = rng.choice((2, 3, 3, 4))
            vals = [f"V{i}_{j}" for j in range(k)]
            decls.append(f"field E{i}: {' | '.join(vals)}")
            arms = []
            for j, v in enumerate(vals):
                tgt = nxt if nxt else f"do {actions[j % len(actions)]}"
                arms.append(f"        {v} -> {tgt}")
            bodies.append(f'stage {sid} "stage {i}" {{\n    match E{i} {{\n' + "\n".join(arms) + "\n    }\n}")
        elif kind == "bool":
            decls.append(f"field B{i}: bool")
            t1 = nxt if nxt else "do A0"
            t2 = nxt if nxt else "do A1"
            bodies.append(f'stage {sid} "stage {i}" {{\n    match B{i} {{\n        true -> {t1}\n'
                          f"        false -> {t2}\n    }}\n}}")
        else:
            decls.append(f"system N{i}: int[0..1000]")
            a, b = sorted(rng.sample(range(1, 1000), 2))
            t = [nxt if nxt else f"do {actions[j]}" for j in range(3)]
            bodies.append(f'stage {sid} "stage {i}" {{\n    when N{i} < {a} -> {t[0]}\n'
                          f"    when N{i} < {b} -> {t[1]}\n    otherwise -> {t[2]}\n}}")
    lines += decls + [""]
    _actions(lines, 3)
    lines += bodies
    return "\n".join(lines) + "\n"


def _chain(n: int, rng: random.Random, seed: int) -> str:
    lines: list[str] = []
    _header(f"chain_{n}_{seed}", lines)
    lines.append("system Amount: int[0..1000000]")
    decls: list[str] = []
    bodies: list[str] = []
    actions = [f"A{j}" for j in range(4)]
    threshold = 1_000_000
    for i in range(1, n + 1):
        sid = _sid(i, n)
        nxt = _sid(i + 1, n) if i < n else None
        go = nxt if nxt else f"do {actions[-1]}"
        kind = rng.choice(("enum", "bool", "amount"))
        if kind == "enum":
            decls.append(f"field C{i}: Stop{i} | Go{i}")
            body = f"    match C{i} {{\n        Stop{i} -> do {rng.choice(actions)}\n        Go{i} -> {go}\n    }}"
        elif kind == "bool":
            decls.append(f"field F{i}: bool")
            body = f"    when F{i} -> do {rng.choice(actions)}\n    otherwise -> {go}"
        else:
            threshold = max(1, threshold - rng.randint(1, max(1, 1_000_000 // max(n, 1))))
            body = f"    when Amount > {threshold} -> do {rng.choice(actions)}\n    otherwise -> {go}"
        bodies.append(f'stage {sid} "stage {i}" {{\n{body}\n}}')
    lines += decls + [""]
    _actions(lines, 4)
    lines += bodies
    return "\n".join(lines) + "\n"


def _mixed(n: int, rng: random.Random, seed: int) -> str:
    lines: list[str] = []
    _header(f"mixed_{n}_{seed}", lines)
    enums = {f"E{j}": [f"E{j}v{k}" for k in range(rng.choice((2, 3, 4)))] for j in range(max(3, n // 4))}
    bools = [f"B{j}" for j in range(max(2, n // 5))]
    for name, vals in enums.items():
        lines.append(f"field {name}: {' | '.join(vals)}")
    for b in bools:
        lines.append(f"field {b}: bool")
    lines.append("system Amount: int[0..10000] money")
    lines.append("system Days: int[0..365]")
    lines.append("system Score: float[0..1]")
    lines.append("let Fee = Amount * 0.1 + 5")
    lines.append("")
    actions = _actions(lines, 5)
    ids = [_sid(i, n) for i in range(1, n + 1)]

    def target(i: int) -> str:
        # a later stage (mostly close by) or a leaf
        later = list(range(i + 1, min(n, i + 4) + 1))
        if later and rng.random() < 0.8:
            return ids[rng.choice(later) - 1]
        return f"do {rng.choice(actions)}"

    for i in range(1, n + 1):
        sid = ids[i - 1]
        kind = rng.choice(("match", "match", "amount", "fee", "score", "count", "boolop", "goto"))
        if i == n:
            kind = "match"
        if kind == "match":
            var = rng.choice(list(enums))
            vals = enums[var]
            arms = [f"        {v} -> {target(i) if i < n else 'do ' + rng.choice(actions)}" for v in vals]
            body = f"    match {var} {{\n" + "\n".join(arms) + "\n    }"
        elif kind == "amount":
            a, b = sorted(rng.sample(range(100, 10000, 100), 2))
            body = (f"    when Amount > {b} -> {target(i)}\n    when Amount >= {a} -> {target(i)}\n"
                    f"    otherwise -> {target(i)}")
        elif kind == "fee":
            body = f"    when Fee > {rng.randrange(50, 1000, 25)} -> {target(i)}\n    otherwise -> {target(i)}"
        elif kind == "score":
            body = (f"    when Score >= {rng.choice((0.25, 0.5, 0.75))} and Days < {rng.randrange(7, 365, 7)}"
                    f" -> {target(i)}\n    otherwise -> {target(i)}")
        elif kind == "count":
            b1, b2 = rng.sample(bools, 2)
            var = rng.choice(list(enums))
            body = (f"    when count({b1}, {b2}, {var} == {enums[var][0]}) >= 2 -> {target(i)}\n"
                    f"    otherwise -> {target(i)}")
        elif kind == "boolop":
            var = rng.choice(list(enums))
            b1 = rng.choice(bools)
            body = (f"    when {var} in {{{', '.join(enums[var][:2])}}} or not {b1} -> {target(i)}\n"
                    f"    otherwise -> {target(i)}")
        else:
            body = f"    -> {ids[i] if i < n else 'do ' + actions[0]}"
        lines.append(f'stage {sid} "stage {i}" {{\n{body}\n}}')
    return "\n".join(lines) + "\n"


def _realistic(n: int, rng: random.Random, seed: int) -> str:
    lines: list[str] = []
    _header(f"realistic_{n}_{seed}", lines)
    enums = {f"Field{j}": [f"F{j}v{k}" for k in range(rng.choice((2, 3, 4)))] for j in range(24)}
    bools = [f"Flag{j}" for j in range(16)]
    for name, vals in enums.items():
        lines.append(f'field {name}: {" | ".join(vals)} "classification field {name}"')
    for b in bools:
        lines.append(f'field {b}: bool "yes/no fact {b}"')
    lines.append('system Amount: int[0..10000] unit "USD" money "order amount"')
    lines.append('system Days: int[0..365] "days since purchase"')
    lines.append('system Tier: Basic | Silver | Gold "membership tier"')
    lines.append('let Fee = Amount * 0.1 + 5 "handling fee"')
    lines.append("")
    actions = _actions(lines, 6)
    ids = [_sid(i, n) for i in range(1, n + 1)]

    def ahead(i: int) -> str:
        if i >= n:
            return f"do {rng.choice(actions)}"
        r = rng.random()
        if r < 0.15:
            return f"do {rng.choice(actions)}"
        return ids[min(n, i + rng.choice((1, 2, 3))) - 1]

    for i in range(1, n + 1):
        sid = ids[i - 1]
        nxt = ids[i] if i < n else f"do {actions[0]}"
        kind = rng.choice(("match", "match", "flag", "amount", "fee", "tier", "days"))
        if kind == "match":
            var = rng.choice(list(enums))
            vals = enums[var]
            arms = [f"        {vals[0]} -> {nxt}"] + [f"        {v} -> {ahead(i)}" for v in vals[1:]]
            body = f"    match {var} {{\n" + "\n".join(arms) + "\n    }"
        elif kind == "flag":
            body = f"    when {rng.choice(bools)} -> {ahead(i)}\n    otherwise -> {nxt}"
        elif kind == "amount":
            a = rng.randrange(100, 10000, 100)
            body = f"    when Amount > {a} -> {ahead(i)}\n    otherwise -> {nxt}"
        elif kind == "fee":
            body = f"    when Fee > {rng.randrange(50, 1000, 25)} and Days < 30 -> {ahead(i)}\n    otherwise -> {nxt}"
        elif kind == "tier":
            body = f"    match Tier {{\n        Gold -> {ahead(i)}\n        Basic, Silver -> {nxt}\n    }}"
        else:
            body = f"    when Days > {rng.randrange(7, 365, 7)} -> {ahead(i)}\n    otherwise -> {nxt}"
        lines.append(f'stage {sid} "stage {i}" {{\n    "Step {i} of the procedure."\n{body}\n}}')
    return "\n".join(lines) + "\n"


def _orders(n: int, rng: random.Random, seed: int) -> str:
    lines: list[str] = []
    _header(f"orders_{n}_{seed}", lines)
    most = rng.choice((3, 4, 5, 6))
    digits = rng.choice((5, 6, 8))
    lines += [
        "type Line = record { price: float[0..2000], qty: int[1..10], returned: bool, food: bool }",
        'field Reason: Damaged | Unwanted | Late "why the customer writes"',
        'field Mood: Calm | Angry "how the customer sounds"',
        f'system Lines: list[1..{most}] of Line "the order lines"',
        'system OrderId: string "the order number"',
        'system Coupon: string? "a coupon code, if any"',
        'let Refund = sum(l.price for l in Lines where l.returned) "what the returned lines cost"',
        'let Perishable = any(l in Lines where l.returned and l.food) "a returned line is food"',
        'let AllBack = all(l in Lines where l.returned) "every line comes back"',
        "",
    ]
    actions = _actions(lines, 5)

    def test() -> str:
        t = rng.randrange(100, 1500, 50)
        return rng.choice((
            f'not (OrderId matches "ORD-[0-9]{{{digits}}}")',
            "count(l in Lines where l.returned) == 0",
            f"Perishable and Reason != {rng.choice(('Damaged', 'Late'))}",
            'Reason == Late and not missing(Coupon) and Coupon matches "(?i)late.*"',
            f"Refund > {t} and Mood == Angry",
            f"AllBack and Refund < {t}",
            f"any(l in Lines where l.qty > {rng.randint(1, 9)} and l.price > {rng.randrange(50, 1000, 50)}.5)",
            f"sum(l.qty for l in Lines where l.food) >= {rng.randint(2, 12)}",
            f'Mood == Calm and OrderId matches "ORD-0.*" and Refund <= {t}',
        ))

    ids = [_sid(i, n) for i in range(1, n + 1)]
    for i in range(1, n + 1):
        nxt = ids[i] if i < n else f"do {actions[0]}"
        arms = [f"    when {test()} -> do {rng.choice(actions)}" for _ in range(rng.choice((1, 2)))]
        lines.append(f'stage {ids[i - 1]} "stage {i}" {{\n' + "\n".join(arms) + f"\n    otherwise -> {nxt}\n}}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stages", type=int)
    ap.add_argument("--kind", choices=KINDS, default="diamond")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args(argv)
    text = generate(args.stages, kind=args.kind, seed=args.seed)
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
