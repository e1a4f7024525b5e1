"""Model options and run start as a new user meets them: one-line errors, preflight, stored parameters,
backoff, structured-output fallback (issue 12 items 4-6, 17, 21, 22), against the local fake server."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakeserver import Behavior, FakeServer, RecordedRequest

from sopgraph.cli import main
from sopgraph.simulation.gateway import (
    Gateway,
    InfraFailure,
    ModelOptionError,
    ModelSpec,
    parse_model_option,
    public_params,
)
from sopgraph.simulation.store import REDACTED, RunStore

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
        "agent=openai/x,api_base=http://127.0.0.1:9/v1?t=1,temperature=0,top_p=0.9,seed=3,"
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


# ----------------------------------------------------------------------------- item 6: preflight
def _no_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(name, raising=False)


def test_missing_key_fails_fast_in_one_line_and_creates_nothing(
    cases_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_key_env(monkeypatch)
    started = time.monotonic()
    code, out = sop_run("--cases", str(cases_file), "-o", str(tmp_path / "r"), "--model", "agent=openai/gpt-4o-mini")
    assert code == 1 and time.monotonic() - started < 20  # no retries (there used to be 5, with backoff)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: model check failed, nothing was run: agent openai/gpt-4o")
    assert "authentication failed" in out and "OPENAI_API_KEY" in out
    assert not (tmp_path / "r").exists()


def test_rejected_key_is_not_retried(cases_file: Path, tmp_path: Path) -> None:
    with FakeServer() as server:
        server.answer_preflight = False
        server.set_default(Behavior.unauthorized())
        code, out = sop_run("--cases", str(cases_file), "-o", str(tmp_path / "r"),
                            "--model", f"agent=openai/x,api_base={server.base_url}")
        assert len(server.requests) == 1  # one preflight call, never retried
    assert code == 1 and len(out.strip().splitlines()) == 1 and "authentication failed" in out
    assert not (tmp_path / "r").exists()


def test_unknown_provider_fails_fast_and_creates_nothing(cases_file: Path, tmp_path: Path) -> None:
    code, out = sop_run("--cases", str(cases_file), "-o", str(tmp_path / "r"), "--model", "agent=nosuchprovider/x")
    assert code == 1
    assert out.strip().splitlines() == [
        "error: model check failed, nothing was run: agent nosuchprovider/x: unknown provider 'nosuchprovider'; "
        "write PROVIDER/MODEL with a litellm provider (openai/, anthropic/, ollama/, hosted_vllm/, aiohttp_openai/, "
        "...) or a built-in (baseline/..., scripted/...)"
    ]
    assert not (tmp_path / "r").exists()


def test_preflight_is_one_call_per_distinct_model_and_skips_builtins(cases_file: Path, tmp_path: Path) -> None:
    with FakeServer() as server:
        server.set_default(Behavior.json_reply({"labels": {}, "scores": {}}))
        judge = f"judge=openai/j,api_base={server.base_url}"
        code, out = sop_run("--cases", str(cases_file), "-o", str(tmp_path / "r"), "-q", "--retries", "0",
                            "--model", "agent=baseline/oracle", "--model", judge)
        assert len(server.preflights) == 1  # three judge slots, one model: one call; built-ins none
    assert code in (0, 3), out


def test_unreachable_server_is_named(cases_file: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, out = sop_run("--cases", str(cases_file), "-o", str(tmp_path / "r"), "--retries", "0",
                        "--model", f"agent=openai/x,api_base=http://127.0.0.1:{port}/v1")
    assert code == 1 and len(out.strip().splitlines()) == 1
    assert f"at http://127.0.0.1:{port}/v1" in out and "is the server running" in out
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- item 21: backoff
def test_default_retry_window_rides_out_tens_of_seconds() -> None:
    shortest, longest = Gateway().retry_window()
    assert shortest >= 20.0 and longest <= 60.0


def test_retries_ride_out_a_server_restart() -> None:
    """The server goes away for ~1.5 s and comes back on the same port: the call still succeeds."""
    first = FakeServer().start()
    port = first.port
    spec = ModelSpec(role="agent", model="openai/x", params={"api_base": first.base_url})
    first.stop()
    gateway = Gateway(cache=False, max_retries=6, base_delay=0.1, max_delay=2.0, seed=1)
    assert gateway.retry_window()[0] >= 2.0

    def restart() -> None:
        time.sleep(1.5)
        second.start()

    second = FakeServer(port=port, default=Behavior.ok("back"))
    threading.Thread(target=restart, daemon=True).start()
    try:
        completion = asyncio.run(gateway.complete(spec, [{"role": "user", "content": "hi"}]))
    finally:
        second.stop()
    assert completion.text == "back" and completion.attempts >= 2


def test_connection_failure_names_the_api_base() -> None:
    spec = ModelSpec(role="agent", model="openai/x", params={"api_base": "http://127.0.0.1:9/v1?key=pw"})
    with pytest.raises(InfraFailure) as info:
        asyncio.run(Gateway(cache=False, max_retries=0).complete(spec, [{"role": "user", "content": "hi"}]))
    assert info.value.kind == "connection"
    assert "at http://127.0.0.1:9/v1" in info.value.message and "pw" not in info.value.message


def test_credentials_in_the_api_base_are_refused_before_any_call() -> None:
    # litellm's aiohttp transport cannot send them beside the key header; say so, never echo the password
    spec = ModelSpec(role="agent", model="openai/x", params={"api_base": "http://u:pw@127.0.0.1:9/v1"})
    with pytest.raises(InfraFailure) as info:
        asyncio.run(Gateway(cache=False, max_retries=2).complete(spec, [{"role": "user", "content": "hi"}]))
    assert info.value.kind == "bad_request" and not info.value.retryable and info.value.attempts == 0
    assert "environment variable" in info.value.message and "pw" not in info.value.message
    with pytest.raises(ModelOptionError, match="credentials") as bad:
        parse_model_option("agent=openai/x,api_base=http://u:pw@127.0.0.1:9/v1")
    assert "pw" not in str(bad.value)


# ----------------------------------------------------------------------------- item 22: json_object fallback
def _json_schema_refused(req: RecordedRequest) -> Behavior | None:
    fmt = (req.body or {}).get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return Behavior.server_error(500)  # llama.cpp's server without schema support
    return None


def test_json_schema_refused_falls_back_to_json_object_once() -> None:
    with FakeServer() as server:
        server.responder(_json_schema_refused)
        server.set_default(Behavior.json_reply({"ok": True}))
        gateway = Gateway(cache=False, max_retries=2, base_delay=0.01)
        spec = parse_model_option(f"agent=openai/x,api_base={server.base_url},structured=true")
        context = {"response_schema": {"type": "object"}}
        for _ in range(3):
            asyncio.run(gateway.complete(spec, [{"role": "user", "content": "hi"}], context=context))
        kinds = [r.body["response_format"]["type"] for r in server.requests]
    assert kinds == ["json_schema", "json_object", "json_object", "json_object"]  # detected once
    assert gateway.uses_json_object(spec) and len(gateway.notes) == 1 and "json_object" in gateway.notes[0]


def test_strict_json_schema_never_falls_back() -> None:
    with FakeServer() as server:
        server.responder(_json_schema_refused)
        gateway = Gateway(cache=False, max_retries=1, base_delay=0.01)
        spec = parse_model_option(f"agent=openai/x,api_base={server.base_url},structured=json_schema")
        with pytest.raises(InfraFailure):
            asyncio.run(gateway.complete(spec, [{"role": "user", "content": "hi"}],
                                         context={"response_schema": {"type": "object"}}))
        assert {r.body["response_format"]["type"] for r in server.requests} == {"json_schema"}


def test_run_notes_the_fallback_and_stores_json_object(cases_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    with FakeServer() as server:
        server.answer_preflight = False
        server.responder(_json_schema_refused)
        server.set_default(Behavior.json_reply({"ok": True}))
        code, text = sop_run("--cases", str(cases_file), "-o", str(out), "--retries", "0", "--format", "json",
                             "--structured", "--max-turns", "1",
                             "--model", f"agent=openai/x,api_base={server.base_url}")
        schema_calls = [r for r in server.requests if r.body["response_format"]["type"] == "json_schema"]
    assert code in (0, 3), text
    assert len(schema_calls) == 1  # the preflight found it; the run itself never asked again
    info = json.loads(text)
    assert any("rejected response_format json_schema" in w for w in info["warnings"])
    with RunStore.open(out) as store:
        meta = store.meta()
    assert meta["models"]["agent"]["structured_mode"] == "json_object"
    assert any("json_object" in n for n in meta["notes"])
