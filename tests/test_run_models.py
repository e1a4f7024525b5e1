"""Model options and run start as a new user meets them: one-line errors, preflight, stored parameters,
backoff, structured-output fallback (issue 12 items 4-6, 17, 21, 22), against the local fake server."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakeserver import Behavior, FakeServer

from sopgraph.cli import main
from sopgraph.simulation.gateway import ModelOptionError, parse_model_option, public_params
from sopgraph.simulation.store import REDACTED

ROOT = Path(__file__).resolve().parents[1]
TELECOM = ROOT / "scenarios" / "telecom_package.sop"


@pytest.fixture(scope="module")
def cases_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cases") / "cases.jsonl"
    res = CliRunner().invoke(main, ["synth", str(TELECOM), "-n", "2", "-o", str(path), "-q", "--seed", "1"])
    assert res.exit_code == 0, res.output
    return path


def sop_run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["run", str(TELECOM), *args])
    return res.exit_code, res.output


# ----------------------------------------------------------------------------- items 4 and 5
def test_run_without_model_is_one_line(cases_file: Path, tmp_path: Path) -> None:
    code, out = sop_run("--cases", str(cases_file), "-o", str(tmp_path / "r"))
    assert code == 1
    assert out.strip().splitlines() == [
        "error: no agent model: pass --model agent=PROVIDER/MODEL (offline floor: --model agent=baseline/oracle)"
    ]
    assert not (tmp_path / "r").exists()


def test_library_run_without_agent_is_a_run_error(cases_file: Path, tmp_path: Path) -> None:
    from sopgraph.simulation.runner import RunError, run_sync

    with pytest.raises(RunError, match="no agent model"):
        run_sync(str(TELECOM), str(cases_file), ["user=scripted/user"], str(tmp_path / "r"), progress=False)


def test_misspelled_builtin_names_the_closest(cases_file: Path, tmp_path: Path) -> None:
    code, out = sop_run("--cases", str(cases_file), "-o", str(tmp_path / "r"), "--model", "agent=baseline/orcale")
    assert code == 1
    assert len(out.strip().splitlines()) == 1
    assert "did you mean 'baseline/oracle'?" in out
    assert "pydantic" not in out and "validation error" not in out and "type=value_error" not in out
    with pytest.raises(ModelOptionError, match="did you mean 'scripted/truth'"):
        parse_model_option("judge=scripted/truht")


def test_bad_option_value_has_no_pydantic_internals() -> None:
    with pytest.raises(ModelOptionError) as info:
        parse_model_option("agent=openai/x,timeout=-1")
    assert "errors.pydantic.dev" not in str(info.value) and "timeout" in str(info.value)


# ----------------------------------------------------------------------------- item 17
def test_only_allow_listed_params_are_stored() -> None:
    spec = parse_model_option(
        "agent=openai/x,api_base=http://u:pw@127.0.0.1:9/v1?t=1,temperature=0,top_p=0.9,seed=3,"
        "passwd=hunter2hunter2,auth=Basic-abcdef,x_custom=zzzz,api_key_env=MY_VAR"
    )
    dump = public_params(spec.model_dump(mode="json"))
    extra = dump["params"]["extra"]
    assert extra["passwd"] == REDACTED and extra["auth"] == REDACTED and extra["x_custom"] == REDACTED
    assert extra["top_p"] == 0.9 and extra["seed"] == 3 and extra["api_key_env"] == "MY_VAR"
    assert dump["params"]["api_base"] == "http://127.0.0.1:9/v1"
    assert dump["model"] == "openai/x" and dump["params"]["temperature"] == 0


def test_unlisted_params_never_reach_run_sqlite(cases_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    with FakeServer() as server:
        server.set_default(Behavior.ok("{}"))
        code, text = sop_run(
            "--cases", str(cases_file), "-o", str(out), "-q", "--retries", "0", "--no-cache",
            "--model", "agent=baseline/oracle",
            "--model", f"judge=openai/j,api_base={server.base_url},passwd=hunter2hunter2,auth=Zauth-token-1",
        )
    assert code in (0, 3), text
    raw = sqlite3.connect(out / "run.sqlite").execute("SELECT group_concat(value) FROM meta").fetchone()[0]
    assert "hunter2hunter2" not in raw and "Zauth-token-1" not in raw
    assert raw.count(REDACTED) >= 2
    assert "hunter2hunter2" not in json.dumps(text)
