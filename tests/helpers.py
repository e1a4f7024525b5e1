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


def done_dialogues(run_dir: Path) -> int:
    """Done dialogues of a run, read without opening the store (a killed or running writer may still be
    creating it), for the kill -9 + resume tests."""
    db = run_dir / "run.sqlite"
    if not db.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute("SELECT COUNT(*) FROM dialogues WHERE status='done'").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0
