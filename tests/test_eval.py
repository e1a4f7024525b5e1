"""`sop eval`: synth → run → score → report → gate in one command, resumable, offline with the floor agents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sopgraph.cli import main
from sopgraph.cli.evalcmd import MANIFEST
from sopgraph.cli.scorecmd import EXIT_GATE

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"


def _eval(out: Path, *extra: str, agent: str = "baseline/oracle", n: str = "4"):
    return CliRunner().invoke(main, ["eval", str(TELECOM), "--model", f"agent={agent}", "-n", n, "--seed", "2",
                                     "-o", str(out), "-q", *extra])


@pytest.fixture(scope="module")
def oracle_eval(tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("eval") / "oracle"
    return out, _eval(out, "--fail-under", "pass_rate=100", "--fail-under", "action@intensity=strong=100")


def test_eval_runs_every_step_and_says_where_each_artefact_is(oracle_eval) -> None:
    out, res = oracle_eval
    assert res.exit_code == 0, res.output
    for name in ("cases.jsonl", "run/run.sqlite", "score.json", "score.txt", "report.html", MANIFEST):
        assert (out / name).is_file(), name
    for label, path in (("cases", "cases.jsonl"), ("run", "run"), ("scores", "score.json"), ("report", "report.html")):
        assert any(line.startswith(label) and str(out / path) in line for line in res.stderr.splitlines()), label
    assert "4 cases over 4/12 feasible paths" in res.stderr and "gate: 2/2 checks passed" in res.stderr
    # the same numbers as the separate commands: sop synth gives the same cases, sop score the same summary
    synth = CliRunner().invoke(main, ["synth", str(TELECOM), "-n", "4", "--seed", "2", "-q"])
    assert synth.stdout == (out / "cases.jsonl").read_text(encoding="utf-8")
    score = CliRunner().invoke(main, ["score", str(out / "run"), "--format", "json"])
    assert json.loads(score.stdout)["groups"] == json.loads((out / "score.json").read_text())["groups"]
    assert "<html" in (out / "report.html").read_text(encoding="utf-8")[:200].lower()


def test_eval_resumes_the_same_command_and_refuses_another(oracle_eval) -> None:
    out, first = oracle_eval
    assert first.exit_code == 0, first.output
    scores = (out / "score.json").read_bytes()
    (out / "report.html").unlink()
    res = _eval(out)
    assert res.exit_code == 0, res.output
    assert "(kept)" in res.stderr and "0 dialogues run, 4 kept" in res.stderr
    assert (out / "report.html").is_file() and (out / "score.json").read_bytes() == scores
    res = _eval(out, n="5")
    assert res.exit_code == 1 and "other settings (n 4 → 5)" in res.output
    res = _eval(out, agent="baseline/always-escalate")
    assert res.exit_code == 1 and "models" in res.output


def test_eval_gate_failure_and_usage_errors(oracle_eval, tmp_path) -> None:
    out, first = oracle_eval
    assert first.exit_code == 0, first.output
    res = _eval(out, "--fail-under", "overall=99.5")
    assert res.exit_code == EXIT_GATE and "gate FAILED overall=99.5: baseline/oracle:" in res.stderr
    assert (out / "report.html").is_file()  # the artefacts are written before the gate decides
    fresh = tmp_path / "never"
    res = _eval(fresh, "--fail-under", "no_such_metric=1")
    assert res.exit_code == 2 and "unknown metric" in res.output and not fresh.exists()
    res = CliRunner().invoke(main, ["eval", str(TELECOM), "--model", "user=scripted/user", "-o", str(fresh)])
    assert res.exit_code == 2 and "no agent model" in res.output and not fresh.exists()
    (tmp_path / "other" / "run").mkdir(parents=True)
    (tmp_path / "other" / "run" / "run.sqlite").write_bytes(b"")
    res = _eval(tmp_path / "other")
    assert res.exit_code == 1 and "did not start" in res.output


def _commit_hashes(text: str) -> list[str]:
    """Words that read as an abbreviated or full git commit id: 7–40 lowercase hex digits with at least one
    digit and one letter, standing alone. Not a colour (`#a1b2c3d4`), not a piece of a UUID or of a longer
    digest (a sha256 is 64 digits), not a number in exponent notation (`1e10000`)."""
    import re

    text = re.sub(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b", " ", text)
    pattern = re.compile(r"(?<![#\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
    return [word for word in pattern.findall(text) if not re.fullmatch(r"[0-9]+e[0-9]+", word)]


def test_commit_hash_detector_finds_revisions_and_nothing_else() -> None:
    assert _commit_hashes("main at 654f1d5, the merge c2401d3; full id 6d68b84f9318b8033eac7bd161b6cf5dcd3be64f.") == [
        "654f1d5", "c2401d3", "6d68b84f9318b8033eac7bd161b6cf5dcd3be64f"]
    assert _commit_hashes("`compare_revisions.py db2b5a9 --head f80cacb` (db2b5a9)") == ["db2b5a9", "f80cacb", "db2b5a9"]
    not_hashes = ("colour #a1b2c3d4, digest " + "ab12" * 16 + ", id 123e4567-e89b-12d3-a456-426614174000, "
                  "1e10000, 4000000, 3602879701896397, deadbeef, abc123 (six), x1234567abc, ABCDEF1234")
    assert _commit_hashes(not_hashes) == []


def test_user_docs_carry_no_commit_hashes_and_link_the_performance_history() -> None:
    """User docs say how to use; even the performance history names revisions by date, not by commit id,
    which means nothing outside one clone's history (issue 34)."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert any(p.name == "performance.md" for p in docs)
    found = {p.name: _commit_hashes(p.read_text(encoding="utf-8")) for p in docs}
    assert not {k: v for k, v in found.items() if v}
    assert "performance.md" in (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
    assert "performance.md" in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    speed = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8").split("## Speed\n")[1].split("\n## ")[0]
    assert len([line for line in speed.splitlines() if line.strip()]) <= 6  # five lines and the link
