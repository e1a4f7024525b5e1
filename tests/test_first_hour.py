"""What a new user meets in the first hour (issue 12): `sop` on PATH, the README's command table, the
demo's options on the right scale, consistent option names, a clean `dir(sopgraph)`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main

ROOT = Path(__file__).resolve().parent.parent
TELECOM = str(ROOT / "scenarios" / "telecom_package.sop")


def test_docs_say_how_to_put_sop_on_path() -> None:
    for doc in ("README.md", "docs/tutorial-first-sop.md", "docs/tutorial-new-scenario.md"):
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert "source .venv/bin/activate" in text and ".venv/bin/sop" in text, doc


def test_readme_command_table_lists_every_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = [line for line in readme.splitlines() if line.startswith("| `sop ")]
    listed = {name for line in table for name in re.findall(r"`sop ([a-z][a-z-]*)", line)}
    assert set(main.commands) <= listed, sorted(set(main.commands) - listed)


def test_readme_command_table_says_which_commands_run_on_ray() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = [line for line in readme.splitlines() if line.startswith("| `sop ")]
    ctx = click.Context(main)
    commands = {name: main.get_command(ctx, name) for name in main.list_commands(ctx)}
    on_ray = sorted(name for name, cmd in commands.items() if cmd and any(p.name == "ray" for p in cmd.params))
    assert {"run", "judge", "synth-dialogues", "export"} <= set(on_ray), on_ray
    for name in on_ray:
        rows = [line for line in table if re.search(rf"`sop {name}\b(?!-)", line)]
        assert any("--ray" in row for row in rows), (name, rows)


def test_dir_of_the_package_is_its_public_api() -> None:
    names = dir(sopgraph)
    assert "annotations" not in names and "nx" not in names and "Path" not in names
    assert {"load", "decide", "check", "run", "score_run", "synthesize"} <= set(names)
    assert all(hasattr(sopgraph, n) for n in names)


def test_demo_min_overall_is_on_the_score_scale() -> None:
    demo = (ROOT / "examples" / "demo.sh").read_text(encoding="utf-8")
    values = [float(v) for v in re.findall(r"--min-overall\s+([0-9.]+)", demo)]
    assert values and all(v > 1 for v in values), values


def test_export_warns_about_a_fraction_given_as_min_overall(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["export", str(tmp_path / "no-such-run"), "--min-overall", "0.5"])
    assert "0–100 scale" in res.stderr and "did you mean 50?" in res.stderr


def test_synth_count_option_and_deprecated_cases_alias(tmp_path: Path) -> None:
    runner = CliRunner()
    new = runner.invoke(main, ["synth", TELECOM, "--count", "30", "--seed", "3", "--quiet"])
    old = runner.invoke(main, ["synth", TELECOM, "--cases", "30", "--seed", "3", "--quiet"])
    assert new.exit_code == 0 and old.exit_code == 0, new.output + old.output
    assert new.stdout == old.stdout and all(json.loads(x) for x in new.stdout.splitlines())
    assert "deprecated" in old.stderr and "deprecated" not in new.stderr
    assert "--count" in runner.invoke(main, ["synth", "--help"]).output
    assert "--cases" not in runner.invoke(main, ["synth", "--help"]).output
