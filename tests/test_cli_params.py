"""The options every command shares (`sopgraph/cli/params.py`): one `--now` parser for all commands."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sopgraph.cli import main
from sopgraph.cli.params import NowType

DUE = """
system TxDate: date "the transaction date"
system Owed: int[0..1000] unit "days" "days since the reminder was sent"
action Open "open a dispute"
action Refuse "refuse"
action Remind "remind"
stage s {
    when days_between(TxDate, now) >= 31 -> do Refuse
    when Owed < 3 -> do Remind
    otherwise -> do Open
}
"""

# The same moment written every way `--now` accepts (2026-03-01 is 30 days after TxDate; `Owed` counts to it)
SAME_DAY = ["2026-03-01", "2026-03-01T10:00", "2026-03-01 10:00", "2026-03-01T10:00:30", "2026-03-01T10:00Z",
            "2026-03-01T10:00:30+01:00", " 2026-03-01T10:00 "]
GARBAGE = ["garbage", "2026-13-01", "2026-02-30", "01/03/2026", "2026-03-01T25:00", ""]


def _commands_with_now() -> dict[str, click.Command]:
    ctx = click.Context(main)
    found: dict[str, click.Command] = {}
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        if command is not None and any("--now" in p.opts for p in command.params):
            found[name] = command
    return found


def test_every_now_option_is_the_shared_one() -> None:
    commands = _commands_with_now()
    assert {"decide", "validate"} <= set(commands)
    for name, command in commands.items():
        (option,) = [p for p in command.params if "--now" in p.opts]
        assert isinstance(option.type, NowType), name
        assert "the program's `now`" in (getattr(option, "help", "") or "").lower(), name


def _invoke(command: str, tmp_path: Path, now: str) -> tuple[int, str]:
    sop = tmp_path / "due.sop"
    sop.write_text(DUE, encoding="utf-8")
    if command == "decide":
        values = json.dumps({"TxDate": "2026-01-30", "Owed": 2})
        result = CliRunner().invoke(main, ["decide", str(sop), "--values", values, "--now", now])
        return result.exit_code, result.output
    data = tmp_path / "rows.csv"
    data.write_text("TxDate,Owed,decision\n2026-01-30,2026-02-27,Remind\n2026-01-29,2026-02-27,Refuse\n",
                    encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(sop), "--data", str(data), "--expect", "Action=decision",
                                       "--format", "json", "--now", now])
    return result.exit_code, result.output


@pytest.mark.parametrize("now", SAME_DAY)
@pytest.mark.parametrize("command", ["decide", "validate"])
def test_every_command_takes_the_same_now_formats(command: str, now: str, tmp_path: Path) -> None:
    code, output = _invoke(command, tmp_path, now)
    assert code == 0, output
    if command == "decide":
        assert json.loads(output)["finals"]["Action"] == "Remind"
    else:
        report = json.loads(output)
        assert (report["correct"], report["total"], report["errors"]) == (2, 2, [])


@pytest.mark.parametrize("now", GARBAGE)
@pytest.mark.parametrize("command", ["decide", "validate"])
def test_every_command_refuses_a_bad_now_with_one_message(command: str, now: str, tmp_path: Path) -> None:
    code, output = _invoke(command, tmp_path, now)
    assert code == 2 and "Traceback" not in output
    (line,) = [x for x in output.splitlines() if x.startswith("Error:")]
    assert line.startswith(f"Error: Invalid value for '--now': {now!r} is not a datetime")
