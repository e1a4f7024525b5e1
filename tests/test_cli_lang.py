"""`sop compile` and `sop decide` through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sopgraph.cli import main

TELECOM = str(Path(__file__).parent.parent / "scenarios" / "telecom_package.sop")


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input)


def test_compile_formats(tmp_path):
    for fmt in ("json", "graphml", "dot"):
        out = tmp_path / f"g.{fmt}"
        res = run("compile", TELECOM, "--format", fmt, "-o", str(out))
        assert res.exit_code == 0, res.output
        first = out.read_bytes()
        run("compile", TELECOM, "--format", fmt, "-o", str(out))
        assert out.read_bytes() == first  # deterministic
    assert json.loads((tmp_path / "g.json").read_text())["graph"]["name"] == "telecom_package"
    assert "digraph" in (tmp_path / "g.dot").read_text()


def test_decide_single_values():
    res = run("decide", TELECOM, "--values", '{"ConsumptionType": "Cancel", "Penalty": 0}')
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"path": ["step1", "step2", "step5"], "finals": {"Action": "ChangeOrder"}}


def test_decide_batch_continues_past_errors():
    lines = [
        {"ConsumptionType": "Cancel", "Penalty": 0},
        {"ConsumptionType": "Cancel"},  # Penalty needed at step5
        {"ConsumptionType": "Refund"},  # not in the enum
        {"ConsumptionType": "Change", "PackageStatus": "NoContract", "Unrelated": 1},
    ]
    stdin = "\n".join(json.dumps(x) for x in lines) + "\nnot json\n"
    res = run("decide", TELECOM, input=stdin)
    assert res.exit_code == 1
    out = [json.loads(line) for line in res.stdout.strip().splitlines()]
    assert len(out) == 5
    assert out[0]["finals"] == {"Action": "ChangeOrder"}
    assert "Penalty" in out[1]["error"] and "step5" in out[1]["error"]
    assert "Refund" in out[2]["error"]
    assert out[3] == {"path": ["step1", "step2", "step4"], "finals": {"Action": "ChangeOrder"}}
    assert "invalid JSON" in out[4]["error"]


def test_malformed_sop_gives_located_error_not_traceback(tmp_path):
    bad = tmp_path / "bad.sop"
    bad.write_text('scenario x "X"\nfield A: P | Q\nstage s1 "S" {\n  match A { P step2 Q -> do X }\n}\n')
    res = run("compile", str(bad))
    assert res.exit_code == 1
    assert f"{bad}:4:15: error[E001]: missing `->`" in res.output
    assert "^" in res.output and "hint:" in res.output
    assert "Traceback" not in res.output
