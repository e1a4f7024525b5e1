"""Issue 31 targets: the analyses on the shapes real SOPs have (generated, never one tuned file).

Each row runs one `sop` command in a fresh process and prints its CPU seconds (user + system of that
process, `os.wait4`), its exit code and, for synthesis, the paths covered out of the feasible ones:

- (a) weighted counts: the same K scores written `count(2: A, 1: B, 3: C)` and `count(B) + 2 * count(A) +
  3 * count(C)`: `sop check` of both (target: within 1.5x of each other, each < 5 s), `sop synth -n 50`
  coverage of both (target: equal, all feasible paths), `sop diff` between them (target: "equivalent", < 5 s);
- (b) the scoring family (`tests/helpers.scoring_sop`) K=3..10 scores over N inputs, and the same family with
  weighted scores (shape (a) at each K): `sop check`, `sop paths --count`, `sop synth -n 50` (target: each
  < 5 s, growth at most linear in K: the curve is printed);
- (c) string membership `X in {"a", ...}` over 10-50 literals, also inside `any(s in L where s.kind in {...})`:
  `sop check` (target: no I302/I303, < 2 s);
- (d) a ~20-decision troubleshooting procedure with nested re-checks (`observe`, `up to N times`) and a
  ~60-line policy with dates against `now`, a list of segments and string membership: `sop check`,
  `sop paths --count`, `sop synth -n 50` (target: each < 5 s);
- (e) programs of at most 100 lines from `benchmarks/gen_sop.py` (every kind, several seeds; `orders` is lists
  of records with a float sum, `any`/`all` and `matches`) and the tests' random procedures: `sop check`
  (target: each < 2 s; the median, p99 and max are printed, overall and per generator).

Every command runs under a CPU limit (`--cap`, default 60 s; a killed run prints `>cap`), so the whole
benchmark is bounded. `--quick` runs a subset (a few K, one size per shape) in under two minutes.

Usage: `python benchmarks/bench_analysis.py [--quick] [--cap 60] [--only a,b,c,d]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 5.0


def _helpers():
    spec = importlib.util.spec_from_file_location("helpers", ROOT / "tests" / "helpers.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- shapes -------------------------------------------------------------------------------------------


def weighted_sop(k: int, n: int, *, weighted: bool, seed: int = 0) -> str:
    """Shape (a): `tests/helpers.weighted_sop` (the tests use the same generator)."""
    return _helpers().weighted_sop(k, n, weighted=weighted, seed=seed)


def string_sop(literals: int, *, seed: int = 0) -> str:
    """String membership over `literals` quoted literals, also inside `any(s in L where s.kind in {…})`."""
    rng = random.Random(seed)
    words = [f"c{i:03d}" for i in range(literals)]
    a, b = sorted(rng.sample(words, literals // 2)), sorted(rng.sample(words, literals // 3))
    sa = ", ".join(f'"{w}"' for w in a)
    sb = ", ".join(f'"{w}"' for w in b)
    return "\n".join([
        f'scenario strings_{literals} "Strings {literals}" "String membership against literal lists."', "",
        "type Seg = record { kind: string, flown: bool }",
        'field Code: string "the reason code"',
        'field Region: string "the region"',
        'field Segments: list[0..4] of Seg "the segments"',
        f'let Known = Code in {{{sa}}} "a known code"',
        f'let Special = any(s in Segments where s.kind in {{{sb}}} and not s.flown) "a special segment"',
        'action Accept "accept" [ends_dialogue]', 'action Reject "reject"', 'action Ask "ask again"', "",
        'stage s1 "Classify" {',
        "    when Known and Special -> do Accept",
        f'    when Code == "{a[0]}" or Region in {{"north", "south"}} -> s2',
        "    when Known -> do Ask",
        "    otherwise -> do Reject",
        "}",
        'stage s2 "Region" {',
        f'    when any(s in Segments where s.kind == "{b[0]}") -> do Accept',
        '    when Region == "north" -> do Ask',
        "    otherwise -> do Reject",
        "}",
    ]) + "\n"


def troubleshooting_sop(decisions: int, *, retries: int = 2) -> str:
    """A troubleshooting procedure of about `decisions` decision stages: checks in sequence, each with a
    fix that is retried `up to N times` after a fresh look (`observe`), nested: at every third check a
    failed fix also re-checks the previous check once."""
    k = max(2, decisions // 3)
    lines = ['scenario trouble "Troubleshooting" "Diagnose and fix a connection step by step."', "",
             'field Device: Phone | Router | Laptop "the device"',
             'field Urgent: bool "the customer says it is urgent"',
             'action Fix(step: int[0..100]) "apply a fix"', 'action Done "solved" [ends_dialogue]',
             'action Escalate "hand to level 2" [escalation]', 'action Explain "explain the check"']
    for i in range(k):
        lines.append(f'system Ok{i}: bool "check {i} passes"')
    for i in range(k):
        nxt = f"c{i + 1}" if i + 1 < k else "end"
        lines.append(f'stage c{i} "Check {i}" {{ observe Ok{i} when Ok{i} -> {nxt} '
                     f"when Urgent and Device == Router -> do Escalate otherwise -> r{i} }}")
        back = (f"when not Urgent -> do Fix(step = {i + 50}) -> c{i - 1} up to 1 times " if i % 3 == 2 else "")
        lines.append(f'stage r{i} "Fix {i}" {{ when Device == Laptop -> do Fix(step = {i}) -> c{i} up to {retries} times '
                     f"{back}otherwise -> do Escalate }}")
    lines.append('stage end "Close" { match Device { Phone -> do Done  Router -> do Explain  Laptop -> do Done } }')
    return "\n".join(lines) + "\n"


def policy_sop(*, literals: int = 12, seed: int = 0) -> str:
    """A ~60-line change policy: dates against `now`, a list of segments (records), string membership."""
    rng = random.Random(seed)
    fares = [f"F{i:02d}" for i in range(literals)]
    flex = ", ".join(f'"{f}"' for f in sorted(rng.sample(fares, literals // 3)))
    promo = ", ".join(f'"{f}"' for f in sorted(rng.sample(fares, literals // 4)))
    return "\n".join([
        'scenario change "Flight change" "Change or cancel a booking under the fare rules." {', '    domain "airline"', "}", "",
        "type Cabin = Economy | Premium | Business",
        "type Segment = record { flown: bool, departs: datetime, cabin: Cabin, carrier: string }",
        'field Request: Change | Cancel | Upgrade "what the customer wants"',
        'field Reason: Personal | Medical | Schedule "why"',
        'field FareCode: string "the fare basis"',
        'field Segments: list[1..4] of Segment "the itinerary"',
        'system BookedAt: datetime "when the booking was made"',
        'system Paid: int[0..5000] "amount paid"',
        'system Tier: None | Silver | Gold "loyalty tier"',
        'system Channel: string "where it was booked"', "",
        "let Fresh = BookedAt > now - 24 hours \"booked within 24 hours\"",
        "let Started = any(s in Segments where s.flown)",
        "let Soon = any(s in Segments where not s.flown and s.departs <= now + 3 days)",
        f"let Flexible = FareCode in {{{flex}}}",
        f"let Promo = FareCode in {{{promo}}}",
        'let Partner = any(s in Segments where s.carrier in {"XA", "XB", "XC"} and not s.flown)',
        'let Direct = Channel in {"web", "app", "phone"}',
        "let Premiumish = any(s in Segments where s.cabin != Economy)",
        "let Fee = case { when Flexible -> 0 when Tier == Gold -> 25 when Promo -> 150 otherwise -> 75 }", "",
        'output Charge: int[0..5000] = 0 "fee charged"',
        'action ChangeFlight "change the flight" [moves_money, ends_dialogue]',
        'action CancelFull "cancel with a full refund" [moves_money, irreversible]',
        'action CancelCredit "cancel for a travel credit" [moves_money]',
        'action Upgrade "upgrade the cabin" [moves_money]',
        'action Decline "decline the request"',
        'action Refer "refer to the partner" [escalation]', "",
        'stage s1 "Request" {',
        "    when Started and Request == Cancel -> do Decline",
        "    when Partner -> do Refer",
        "    when Request == Change -> s2",
        "    when Request == Cancel -> s3",
        "    otherwise -> s4",
        "}",
        'stage s2 "Change" {',
        "    when Soon and not Flexible and Tier == None -> do Decline",
        "    when Fresh and Direct -> do ChangeFlight { Charge = 0 }",
        "    when Reason == Medical -> do ChangeFlight { Charge = 0 }",
        "    otherwise -> do ChangeFlight { Charge = Fee }",
        "}",
        'stage s3 "Cancel" {',
        "    when Fresh -> do CancelFull",
        "    when Flexible or Reason == Medical -> do CancelFull",
        "    when Promo and not Direct -> do Decline",
        "    when Paid > 1000 and Tier != None -> do CancelCredit",
        "    otherwise -> do CancelCredit",
        "}",
        'stage s4 "Upgrade" {',
        "    when Premiumish -> do Decline",
        '    when Tier == Gold or FareCode in {"F00", "F01"} -> do Upgrade',
        "    when Soon -> do Decline",
        "    otherwise -> do Upgrade",
        "}",
    ]) + "\n"


# -- running ------------------------------------------------------------------------------------------


def run_cpu(args: list[str], cap: float) -> tuple[float, int, str]:
    """(CPU seconds of that one `sop` process, exit code, its stdout) under a CPU limit of `cap` s."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (int(cap), int(cap) + 1))

    proc = subprocess.Popen([sys.executable, "-c", "from sopgraph.cli import entry; entry()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=limit,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _pid, status, usage = os.wait4(proc.pid, 0)
    return usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status), out


def _secs(t: float, code: int, cap: float) -> str:
    return f">{cap:.0f} s (killed)" if code < 0 or t >= cap else f"{t:6.2f} s"


def row(label: str, t: float, code: int, cap: float, target: float = TARGET, extra: str = "") -> bool:
    ok = t < target and code >= 0
    print(f"  {label:<44} {_secs(t, code, cap):>16}  exit {code:>3}  {'met' if ok else 'NOT met'} "
          f"(< {target:g} s) {extra}".rstrip(), flush=True)
    return ok


def synth_row(label: str, path: Path, d: Path, cap: float) -> tuple[bool, str]:
    out, cov = d / f"{path.stem}.jsonl", d / f"{path.stem}.cov.json"
    cov.unlink(missing_ok=True)
    t, code, _ = run_cpu(["synth", str(path), "-n", "50", "-q", "-o", str(out), "--coverage", str(cov)], cap)
    covered = "?"
    if cov.exists():
        data = json.loads(cov.read_text())
        covered = f"{len(data.get('per_path', {}))}/{data.get('feasible_paths', '?')}"
    ok = row(label, t, code, cap, extra=f"paths covered {covered}")
    return ok, covered


def notes(out: str) -> str:
    """The I302/I303 count of a check's output."""
    n302, n303 = out.count("I302"), out.count("I303")
    return f"I302 x{n302}, I303 x{n303}" if n302 or n303 else "no I302/I303"


def three(tag: str, path: Path, d: Path, cap: float) -> list[float]:
    """check, paths --count, synth -n 50 of one file: the three CPU times."""
    t1, c1, out = run_cpu(["check", str(path)], cap)
    row(f"{tag}: check", t1, c1, cap, extra=notes(out))
    t2, c2, out = run_cpu(["paths", str(path), "--count"], cap)
    row(f"{tag}: paths --count", t2, c2, cap, extra=out.strip().splitlines()[-1][:60] if out.strip() else "")
    synth_row(f"{tag}: synth -n 50", path, d, cap)
    return [t1, t2]


def shape_a(d: Path, cap: float, quick: bool) -> None:
    print("(a) weighted counts vs sums of counts")
    for k, n in ((3, 10),) if quick else ((3, 10), (4, 16)):
        w, s = d / f"w{k}.sop", d / f"s{k}.sop"
        w.write_text(weighted_sop(k, n, weighted=True))
        s.write_text(weighted_sop(k, n, weighted=False))
        tw, cw, ow = run_cpu(["check", str(w)], cap)
        ts, cs, os_ = run_cpu(["check", str(s)], cap)
        row(f"K={k} N={n} weighted: check", tw, cw, cap, extra=notes(ow))
        row(f"K={k} N={n} sum:      check", ts, cs, cap, extra=notes(os_))
        ratio = max(tw, ts) / max(min(tw, ts), 1e-3)
        print(f"  {'check ratio weighted/sum':<44} {tw / max(ts, 1e-3):6.2f}x  "
              f"{'met' if ratio <= 1.5 else 'NOT met'} (within 1.5x)")
        _, vw = synth_row(f"K={k} N={n} weighted: synth -n 50", w, d, cap)
        _, vs = synth_row(f"K={k} N={n} sum:      synth -n 50", s, d, cap)
        print(f"  {'synth coverage equal':<44} {vw} vs {vs}  {'met' if vw == vs else 'NOT met'}")
        t, code, out = run_cpu(["diff", str(w), str(s)], cap)
        verdict = "equivalent" if code == 0 else {1: "different", 3: "not proven", 2: "error"}.get(code, "killed")
        row(f"K={k} N={n} diff weighted sum", t, code, cap, extra=verdict)


def shape_b(d: Path, cap: float, quick: bool) -> None:
    helpers = _helpers()
    print("(b) scoring family: K scores over N shared inputs (curve: check / paths --count CPU s)")
    ks = (3, 6, 8) if quick else tuple(range(3, 11))
    ns = (30,) if quick else (10, 40)
    for n in ns:
        curve = []
        for k in ks:
            p = d / f"scoring_{k}_{n}.sop"
            p.write_text(helpers.scoring_sop(k, n))
            curve.append((k, three(f"K={k} N={n}", p, d, cap)))
        print(f"  curve N={n}: " + "  ".join(f"K={k}: {c[0]:.1f}/{c[1]:.1f}" for k, c in curve))
    print("(b') the same family with weighted scores (`count(2: A, 1: B, ...)`, the fraud/risk shape)")
    for n in ns:
        curve = []
        for k in ks:
            p = d / f"wscoring_{k}_{n}.sop"
            p.write_text(weighted_sop(k, n, weighted=True, seed=k))
            curve.append((k, three(f"weighted K={k} N={n}", p, d, cap)))
        print(f"  curve N={n}: " + "  ".join(f"K={k}: {c[0]:.1f}/{c[1]:.1f}" for k, c in curve))


def shape_c(d: Path, cap: float, quick: bool) -> None:
    print("(c) string membership over literal lists (also inside any(...))")
    for m in (10, 50) if quick else (10, 20, 30, 50):
        p = d / f"strings_{m}.sop"
        p.write_text(string_sop(m))
        t, code, out = run_cpu(["check", str(p)], cap)
        row(f"{m} literals: check", t, code, cap, target=2.0, extra=notes(out))
        if not quick:
            three(f"{m} literals", p, d, cap)


def shape_d(d: Path, cap: float, quick: bool) -> None:
    print("(d) troubleshooting procedure with re-checks; change policy with dates, segments, strings")
    for dec in (12,) if quick else (12, 20):
        p = d / f"trouble_{dec}.sop"
        p.write_text(troubleshooting_sop(dec))
        three(f"troubleshooting ~{dec} decisions", p, d, cap)
    p = d / "policy.sop"
    p.write_text(policy_sop())
    three("policy (~60 lines)", p, d, cap)


def _test_programs(n: int, seed: int) -> list[str]:
    """`n` programs from the tests' random generators (hypothesis strategies, seeded: the same list every
    run): test_unroll's procedures over observed lists and records, and test_engine's procedures with
    `affects`. One of these kept `sop check` busy for minutes before the region caps (issue 31)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from test_unroll import _held_procedure, _program

    out: list[str] = []

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.one_of(_program(), _held_procedure()))
    def collect(text: str) -> None:
        if text not in out:
            out.append(text)

    hseed(seed)(collect)()
    return out


def shape_e(d: Path, cap: float, quick: bool) -> None:
    """Programs of at most 100 lines from the project's generators (`benchmarks/gen_sop.py`, every kind, many
    seeds; and the tests' random procedures): the distribution of `sop check` CPU seconds (target: every
    one < 2 s). The full run checks a bigger sample than `--quick`."""
    spec = importlib.util.spec_from_file_location("gen_sop", ROOT / "benchmarks" / "gen_sop.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    print("(e) generated programs of at most 100 lines: sop check")
    files: list[Path] = []
    seeds = range(3) if quick else range(25)
    for kind in gen.KINDS:
        for seed in seeds:
            stages = 4 + (seed * 7) % 20
            text = gen.generate(stages, kind=kind, seed=seed)
            while len(text.splitlines()) > 100 and stages > 1:
                stages -= 1
                text = gen.generate(stages, kind=kind, seed=seed)
            p = d / f"gen_{kind}_{seed}.sop"
            p.write_text(text)
            files.append(p)
    for i, text in enumerate(_test_programs(10 if quick else 150, seed=31)):
        if len(text.splitlines()) <= 100:
            p = d / f"test_gen_{i}.sop"
            p.write_text(text)
            files.append(p)
    times: list[tuple[float, str]] = []
    for p in files:
        t, code, _ = run_cpu(["check", str(p)], cap)
        times.append((t if code >= 0 else cap, p.name))
    times.sort()
    values = [t for t, _ in times]
    p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
    edges = [0.5, 0.75, 1.0, 1.5, 2.0, 5.0, math.inf]
    counts = [sum(1 for t in values if lo <= t < hi) for lo, hi in zip([0.0, *edges[:-1]], edges, strict=True)]
    buckets = "  ".join(f"<{hi:g}s: {c}" if hi != math.inf else f">=5s: {c}" for hi, c in zip(edges, counts, strict=True))
    print(f"  {len(values)} programs: median {values[len(values) // 2]:.2f} s  p99 {p99:.2f} s  max {values[-1]:.2f} s "
          f"({times[-1][1]})  {'met' if values[-1] < 2.0 else 'NOT met'} (< 2 s)")
    print(f"  distribution: {buckets}")
    for kind in (*gen.KINDS, "test"):  # per generator: `orders` is the list-of-records shape (issue 31)
        mine = sorted(t for t, name in times if name.startswith(f"gen_{kind}_" if kind != "test" else "test_gen_"))
        if mine:
            print(f"  {kind:<10} {len(mine):>3} programs: median {mine[len(mine) // 2]:.2f} s  "
                  f"p99 {mine[min(len(mine) - 1, int(0.99 * len(mine)))]:.2f} s  max {mine[-1]:.2f} s  "
                  f"{sum(1 for t in mine if t >= 2.0)} at or over 2 s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a subset that runs in under two minutes")
    ap.add_argument("--cap", type=float, default=60.0, help="CPU seconds before a command is killed")
    ap.add_argument("--only", default="a,b,c,d,e", help="which shapes (comma-separated: a,b,c,d,e)")
    ap.add_argument("--write", default=None, help="also write the generated files to this directory")
    args = ap.parse_args(argv)
    shapes = {"a": shape_a, "b": shape_b, "c": shape_c, "d": shape_d, "e": shape_e}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(args.write) if args.write else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        for key in args.only.split(","):
            shapes[key.strip()](d, args.cap, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
