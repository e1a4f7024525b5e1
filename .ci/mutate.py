"""A small mutation check: flip operators and constants in the code whose mistakes are silent (the engine's
comparisons and its code generator, the metric formulas, the statistics, synthesis quotas and coverage
counts), run that module's own tests against each mutant, and print the kill ratio.

    python .ci/mutate.py              # every mutant (a few minutes per target on two cores)
    python .ci/mutate.py --limit 10   # the first 10 mutants of each target
    python .ci/mutate.py --only engine

A surviving mutant is printed with its file, line and change: either a test is missing, or the mutant is
equivalent (say so in the target's `equivalent` list). Exit 1 when the kill ratio is under --min-ratio.
The source files are changed in place one mutant at a time and always restored.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import subprocess
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "+": "-", "-": "+",
         "*": "/", "and": "or", "or": "and", "0": "1", "1": "0", "2.0": "4.0"}


@dataclass
class Target:
    name: str
    path: str
    functions: list[str]  # qualified names (Class.method) whose bodies are mutated
    tests: list[str]
    equivalent: set[tuple[int, str, str]] = field(default_factory=set)  # (line, from, to) known equivalent


TARGETS = [
    Target("engine", "sopgraph/logic/engine.py", ["apply_compare", "apply_arith", "_count", "_wcount"],
           ["tests/test_engine.py"]),
    Target("metrics", "sopgraph/evaluation/metrics.py", ["logic_formula", "overall_formula"],
           ["tests/test_score.py", "tests/test_scoring.py"]),
    Target("stats", "sopgraph/evaluation/stats.py", ["percentile_interval", "pass_hat_k", "ratio_ci"],
           ["tests/test_stats.py"]),
    Target("synth", "sopgraph/cases/synth.py", ["_spread"], ["tests/test_synth.py"]),
    Target("coverage", "sopgraph/evaluation/coverage.py", ["coverage_of"], ["tests/test_coverage.py"]),
]


def _ranges(source: str, names: list[str]) -> list[tuple[int, int]]:
    """Line ranges (first, last) of the named functions; a name missing from the module is skipped."""
    found: list[tuple[int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qual = f"{prefix}{child.name}"
                if qual in names and not isinstance(child, ast.ClassDef):
                    body = child.body
                    if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                            and isinstance(body[0].value.value, str)):
                        body = body[1:]  # the docstring
                    found.append((body[0].lineno, child.end_lineno or child.lineno))  # the body, not the signature
                visit(child, f"{qual}.")

    visit(ast.parse(source), "")
    return found


def mutants(source: str, names: list[str]) -> list[tuple[int, int, str, str]]:
    """(line, col, from, to) for every swappable token inside the named functions (docstrings excluded)."""
    ranges = _ranges(source, names)
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.OP, tokenize.NAME, tokenize.NUMBER) or tok.string not in SWAPS:
            continue
        line, col = tok.start
        if any(a <= line <= b for a, b in ranges):
            out.append((line, col, tok.string, SWAPS[tok.string]))
    return out


def apply(source: str, line: int, col: int, old: str, new: str) -> str:
    lines = source.splitlines(keepends=True)
    text = lines[line - 1]
    assert text[col:col + len(old)] == old
    lines[line - 1] = text[:col] + new + text[col + len(old):]
    return "".join(lines)


def killed(tests: list[str], timeout: float) -> bool:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:warnings", *tests]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True  # a mutant that hangs the tests is caught (by pytest-timeout in CI)
    return proc.returncode != 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a target name (repeatable)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many mutants per target")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per test run")
    parser.add_argument("--min-ratio", type=float, default=0.0, help="exit 1 under this kill ratio")
    args = parser.parse_args()
    total = dead = 0
    for target in TARGETS:
        if args.only and target.name not in args.only:
            continue
        path = ROOT / target.path
        original = path.read_text(encoding="utf-8")
        todo = [m for m in mutants(original, target.functions) if (m[0], m[2], m[3]) not in target.equivalent]
        if args.limit:
            todo = todo[: args.limit]
        survivors = []
        try:
            for line, col, old, new in todo:
                path.write_text(apply(original, line, col, old, new), encoding="utf-8")
                if killed(target.tests, args.timeout):
                    dead += 1
                else:
                    survivors.append(f"    {target.path}:{line}:{col + 1}: `{old}` -> `{new}` survived")
                total += 1
        finally:
            path.write_text(original, encoding="utf-8")
        kills = len(todo) - len(survivors)
        print(f"{target.name:10} {kills}/{len(todo)} killed", flush=True)
        for s in survivors:
            print(s, flush=True)
    ratio = dead / total if total else 1.0
    print(f"kill ratio {dead}/{total} = {ratio:.2f}")
    return 0 if ratio >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
