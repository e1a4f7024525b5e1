"""Adversarial inputs (issue 13): each one gets one clear line, never a traceback, a hang or
unbounded memory. Includes, `sop decide` lines, profiles, cases and run stores."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sopgraph.cli import main
from sopgraph.language.parse import load_source
from sopgraph.simulation.runner import RunError, _check_cases, read_cases
from sopgraph.simulation.store import RunStore, StoreError

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"

SMALL = ('action Done "done"\naction Other "other"\nfield Mood: Calm | Upset "m"\n'
         'stage s { match Mood { Calm -> do Done\n Upset -> do Other } }\n')


def _invoke(*args: str, input: str | bytes | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


# --------------------------------------------------------------------------------------------- includes


def _codes(path: Path, **kw) -> list[str]:
    return [d.code for d in load_source(path, **kw).diagnostics]


@pytest.mark.parametrize("target", ["/proc/self/environ", "/dev/zero", "/etc/hostname", "notes.txt"])
def test_include_refuses_non_sop_and_system_files(tmp_path, target):
    (tmp_path / "notes.txt").write_text("SECRET_TOKEN=abc\n")
    main_file = tmp_path / "m.sop"
    main_file.write_text(f'include "{target}"\n' + SMALL)
    result = _invoke("check", str(main_file))
    assert result.exit_code == 1
    assert "E003" in result.output
    assert "SECRET_TOKEN" not in result.output and "PATH=" not in result.output


def test_include_outside_the_tree_is_refused_unless_named(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "common.sop").write_text('action Extra "extra"\n')
    proj = tmp_path / "proj"
    proj.mkdir()
    main_file = proj / "m.sop"
    main_file.write_text('include "../shared/common.sop"\n' + SMALL)
    assert "outside" in load_source(main_file).diagnostics[0].message
    assert _codes(main_file, include_path=[shared]) == []
    ok = _invoke("--include-path", str(shared), "check", str(main_file))
    assert ok.exit_code == 0, ok.output
    absolute = proj / "a.sop"
    absolute.write_text(f'include "{shared / "common.sop"}"\n' + SMALL)
    assert _codes(absolute) == ["E003"]


def test_include_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "pipe.sop"
    os.mkfifo(fifo)
    main_file = tmp_path / "m.sop"
    main_file.write_text('include "pipe.sop"\n' + SMALL)
    diags = load_source(main_file).diagnostics
    assert [d.code for d in diags] == ["E003"] and "regular file" in diags[0].message


def test_include_nul_bytes_and_size_limit(tmp_path, monkeypatch):
    main_file = tmp_path / "m.sop"
    main_file.write_bytes(b'include "a\x00b.sop"\n' + SMALL.encode())
    assert "NUL" in load_source(main_file).diagnostics[0].message
    from sopgraph.language import parse

    big = tmp_path / "big.sop"
    big.write_text("# padding\n" * 200)
    monkeypatch.setattr(parse, "MAX_SOURCE_BYTES", 1000)
    with pytest.raises(parse.ReadRefused, match="too large"):
        parse.read_sop_file(big, limit=1000)
    main_file.write_text('include "big.sop"\n' + SMALL)
    assert _codes(main_file) == ["E003"]


def test_main_file_device_is_refused():
    result = _invoke("check", "/dev/zero")
    assert result.exit_code == 1 and "pseudo-file" in result.output


# --------------------------------------------------------------------------------------------- decide


FEE_SOP = ('system A: float[0..) "amount"\noutput Fee: float[0..) = 0 "fee"\nlet F = A * 10\n'
           'action Pay "pay"\nstage s { -> do Pay { Fee = F } }\n')


def test_decide_line_contract(tmp_path):
    sop = tmp_path / "fee.sop"
    sop.write_text(FEE_SOP)
    deep = "[" * 100_000 + "]" * 100_000
    lines = ['{"A": 1}', '{"A": "\\ud800"}', "", deep, '{"A": 1e308}', '{"A": NaN}', '{"A": 1e999}',
             "[1]", '{"A": 2}']
    result = CliRunner().invoke(main, ["decide", str(sop)], input="\n".join(lines) + "\n")
    out = result.stdout.split("\n")[:-1]  # not splitlines(): U+2028 inside a JSON string is no break
    assert len(out) == len(lines)
    records = [json.loads(line) for line in out]  # every line is valid JSON (no Infinity/NaN)
    assert records[0] == {"path": ["s"], "finals": {"Action": "Pay", "Fee": 10.0}}
    assert records[-1]["finals"]["Fee"] == 20.0
    assert "surrogate" in records[1]["error"]
    assert "empty line" in records[2]["error"]
    assert "nested too deeply" in records[3]["error"]
    assert "finite" in records[4]["error"]
    assert all("error" in r for r in records[5:8])
    assert result.exit_code == 1


def test_decide_non_utf8_line_keeps_going(tmp_path):
    sop = tmp_path / "fee.sop"
    sop.write_text(FEE_SOP)
    result = CliRunner().invoke(main, ["decide", str(sop)], input=b'\xff\xfe\n{"A": 3}\n')
    out = [json.loads(x) for x in result.stdout.splitlines()]
    assert "UTF-8" in out[0]["error"] and out[1]["finals"]["Fee"] == 30.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(max_size=30).filter(lambda s: "\n" not in s and "\r" not in s), min_size=1, max_size=6))
def test_decide_one_output_line_per_input_line(tmp_path_factory, lines):
    sop = tmp_path_factory.mktemp("d") / "s.sop"
    sop.write_text(SMALL)
    data = "\n".join(lines) + "\n"
    result = CliRunner().invoke(main, ["decide", str(sop)], input=data.encode("utf-8", "surrogatepass"))
    assert result.exception is None or isinstance(result.exception, SystemExit)
    out = result.stdout.split("\n")[:-1]  # not splitlines(): U+2028 inside a JSON string is no break
    assert len(out) == len(lines)
    for line in out:
        json.loads(line)


# --------------------------------------------------------------------------------------------- profiles


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefghi", "bcdefghij", strict=True))


@pytest.mark.parametrize(("text", "needle"), [
    (BOMB, "aliases"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested"),
    ("intents:\n  x:\n    weight: .inf\n", "finite"),
    ("intents:\n  x:\n    weight: 1e308\n", "less than or equal"),
    ("intents:\n  x:\n    weight: " + "9" * 5000 + "\n", "digits"),
])
def test_bad_profiles_are_one_diagnostic(tmp_path, text, needle):
    sop = tmp_path / "t.sop"
    sop.write_text(TELECOM.read_text())
    (tmp_path / "t.profile.yaml").write_text(text)
    result = _invoke("check", str(sop))
    assert result.exit_code == 1
    assert needle in result.output and "Traceback" not in result.output


def test_latin1_profile_is_named(tmp_path):
    sop = tmp_path / "t.sop"
    sop.write_text(TELECOM.read_text())
    (tmp_path / "t.profile.yaml").write_bytes("description: caf\xe9\n".encode("latin-1"))
    result = _invoke("check", str(sop))
    assert result.exit_code == 1 and "not UTF-8" in result.output and ":1:" in result.output


# --------------------------------------------------------------------------------------------- cases


@pytest.fixture(scope="module")
def telecom_cases(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("cases") / "cases.jsonl"
    res = CliRunner().invoke(main, ["synth", str(TELECOM), "-n", "6", "-o", str(out), "-q", "--seed", "2"])
    assert res.exit_code == 0, res.output
    return [json.loads(line) for line in out.read_text().splitlines()]


def _scenario():
    from sopgraph.logic.checker import load

    return load(TELECOM)


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda c: c["truth"].update(EmotionTag="Furious"), "not in the domain"),
    (lambda c: c.update(expected_path=["step1", "bogus"]), "expected_path"),
    (lambda c: c["system"].update(Penalty=-5), "outside"),
    (lambda c: c["system"].update(Penalty="lots"), "not a number"),
    (lambda c: c["system"].update(Penalty=float("inf")), "not finite"),
    (lambda c: c.update(schema_version=99), "newer"),
    (lambda c: c["truth"].update(Nonsense=1), "not a field"),
])
def test_bad_cases_are_refused_before_running(tmp_path, telecom_cases, edit, needle):
    case = json.loads(json.dumps(telecom_cases[0]))
    edit(case)
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps(case) + "\n")
    with pytest.raises(RunError, match=needle):
        _check_cases(_scenario(), read_cases(path), str(path))


def test_good_cases_pass_and_stale_hash_warns(tmp_path, telecom_cases):
    path = tmp_path / "cases.jsonl"
    edited = [dict(c, sop_hash="0" * 16) for c in telecom_cases]
    path.write_text("".join(json.dumps(c) + "\n" for c in edited))
    warnings = _check_cases(_scenario(), read_cases(path), str(path))
    assert warnings and "sop_hash" in warnings[0]


def test_cases_from_a_device_are_refused():
    with pytest.raises(RunError, match="regular file"):
        read_cases("/dev/zero")


# --------------------------------------------------------------------------------------------- run stores


@pytest.fixture()
def run_dir(tmp_path_factory) -> Path:
    from helpers import floor_run

    src = floor_run(tmp_path_factory, "baseline/oracle")
    dst = tmp_path_factory.mktemp("store") / "run"
    dst.mkdir()
    with sqlite3.connect(src / "run.sqlite") as a, sqlite3.connect(dst / "run.sqlite") as b:
        a.backup(b)
    return dst


def test_zero_byte_store_is_never_rewritten(tmp_path):
    (tmp_path / "run.sqlite").write_bytes(b"")
    result = _invoke("runs", "show", str(tmp_path))
    assert result.exit_code == 1 and "empty" in result.output
    assert (tmp_path / "run.sqlite").stat().st_size == 0


@pytest.mark.parametrize(("sql", "needle"), [
    ("UPDATE cases SET data='{bad' WHERE rowid=1", "not a valid Case"),
    ("UPDATE meta SET value='999' WHERE key='store_version'", "newer"),
    ("UPDATE dialogues SET data='{\"x\": 1}'", "not a valid Dialogue"),
])
def test_bad_store_rows_are_named(run_dir, sql, needle):
    with sqlite3.connect(run_dir / "run.sqlite") as c:
        c.execute(sql)
    with pytest.raises(StoreError, match=needle):
        store = RunStore.open(run_dir)
        store.cases()
        store.dialogues()
    result = _invoke("score", str(run_dir))
    assert result.exit_code == 1 and "run.sqlite" in result.output


def test_corrupted_store_is_named(run_dir):
    path = run_dir / "run.sqlite"
    size = path.stat().st_size
    with path.open("r+b") as fh:
        fh.seek(size // 2)
        fh.write(b"\xde\xad" * 2000)
    for args in (["runs", "show"], ["score"]):
        result = _invoke(*args, str(run_dir))
        assert result.exit_code == 1
        assert "run.sqlite" in result.output and "backup" in result.output


def test_a_byte_order_mark_is_not_part_of_the_program(tmp_path: Path) -> None:
    """Windows editors save UTF-8 with a byte-order mark: the `.sop`, a cases file and `sop decide` input
    read past it (it was E005 "invalid character U+FEFF" at 1:1, and an invalid first decide line)."""
    src = (Path(__file__).resolve().parents[1] / "scenarios" / "telecom_package.sop").read_text(encoding="utf-8")
    sop = tmp_path / "bom.sop"
    sop.write_bytes(b"\xef\xbb\xbf" + src.replace("\n", "\r\n").encode("utf-8"))
    checked = CliRunner().invoke(main, ["check", str(sop)])
    assert checked.exit_code == 0, checked.output
    line = '{"ConsumptionType": "Change", "PackageStatus": "NoContract"}\n'
    decided = CliRunner().invoke(main, ["decide", str(sop)], input="\ufeff" + line)
    assert decided.exit_code == 0 and json.loads(decided.output)["finals"] == {"Action": "ChangeOrder"}
