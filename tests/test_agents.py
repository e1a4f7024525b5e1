"""Your own agent: HTTP and Python-callable agents acting through tool calls (simulation/agents.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import sopgraph
from sopgraph.evaluation.score import ScoreConfig, score_run
from sopgraph.simulation.agents import agent_kind, infer_path, to_output, tool_schemas
from sopgraph.simulation.dialogue import scenario_context
from sopgraph.simulation.runner import RunError, run_sync
from sopgraph.simulation.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
BIKE = ROOT / "examples" / "bike_rental.sop"
sys.path.insert(0, str(ROOT))  # tests import the example agent as a module (examples/agents)
from examples.agents import rule_agent  # noqa: E402


@pytest.fixture(scope="module")
def bike() -> sopgraph.Scenario:
    return sopgraph.load(BIKE)


@pytest.fixture(scope="module")
def cases(bike, tmp_path_factory) -> list:
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import plan, synthesize

    profile = profile_for(BIKE, bike)
    every_path = max(6, len(plan(bike, profile).paths))  # -n is exact: enough for one case per path
    return list(synthesize(bike, profile, every_path, seed=2, min_per_path=1).cases)


def test_actions_become_tool_schemas_with_their_parameters(bike) -> None:
    tools = {t["function"]["name"]: t["function"] for t in tool_schemas(bike)}
    assert set(tools) == set(bike.actions) | {"lookup"}
    assert tools["SettleReturn"]["parameters"]["properties"]["Fee"]["type"] == "number"
    assert tools["WaiveFee"]["parameters"]["properties"] == {}


def test_protocol_response_to_output_and_path_inference(bike) -> None:
    paths = scenario_context(bike)["paths"]
    out, problem = to_output(bike, paths, {"reply": "Done.", "tool_calls": [
        {"name": "SettleReturn", "arguments": '{"Fee": 12.5}'}]})
    assert problem is None and out is not None
    assert out.finals == {"Action": "SettleReturn", "Fee": 12.5} and out.source == "tools"
    assert out.now_path == infer_path(paths, "SettleReturn") and out.now_path
    assert out.tool_calls == [{"name": "SettleReturn", "args": {"Fee": 12.5}}]
    for bad in ({"reply": "x", "tool_calls": [{"name": "Nope"}]},
                {"reply": "x", "tool_calls": [{"name": "WaiveFee", "arguments": {"Fee": 1}}]}, "text", None):
        out, problem = to_output(bike, paths, bad)
        assert out is None and problem
    assert agent_kind("http://127.0.0.1:1/a") == "http" and agent_kind("python:m:f") == "python"
    assert agent_kind("openai/gpt-4o") == "sage"


def _check_run(run_dir: Path, n: int) -> None:
    with RunStore.open(run_dir) as store:
        dialogues = store.dialogues()
        turns = store.turns()
    assert len(dialogues) == n and all(d.status == "done" for d in dialogues)
    assert all(t.output is not None and t.output.source == "tools" for t in turns)
    assert any(len([t for t in turns if t.dialogue_id == d.id]) >= 2 for d in dialogues)  # it asked first
    run = score_run(run_dir, ScoreConfig(bootstrap=0))
    g = run.aggregate(["model"])[0]
    assert g.metrics["classification"].value is None  # the judges' labels stand: not the agent's score
    assert g.metrics["logic"].value is not None and g.metrics["path"].value is not None


def test_python_callable_agent_sync_and_async(tmp_path, bike, cases) -> None:
    run_sync(bike, cases, ["agent=python:examples.agents.rule_agent:respond"], str(tmp_path / "sync"),
             progress=False)
    _check_run(tmp_path / "sync", len(cases))
    run_sync(bike, cases, [f"agent=python:{__name__}:async_agent"], str(tmp_path / "async"), progress=False)
    _check_run(tmp_path / "async", len(cases))
    with pytest.raises(RunError, match="cannot load"):
        run_sync(bike, cases, ["agent=python:no_such_module_x:f"], str(tmp_path / "bad"), progress=False)
    assert not (tmp_path / "bad").exists()  # refused before anything is created: fix the name, run again


async def async_agent(request: dict) -> dict:
    return rule_agent.respond(request)


def test_http_agent_on_localhost(tmp_path, bike, cases) -> None:
    server = rule_agent.serve(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/agent"
        run_sync(bike, cases, [f"agent={url}"], str(tmp_path / "http"), progress=False, concurrency=4)
    finally:
        server.shutdown()
        server.server_close()
    _check_run(tmp_path / "http", len(cases))
    a = [t.output.model_dump() for t in RunStore.open(tmp_path / "http").turns()]
    run_sync(bike, cases, ["agent=python:examples.agents.rule_agent:respond"], str(tmp_path / "py"),
             progress=False)
    b = [t.output.model_dump() for t in RunStore.open(tmp_path / "py").turns()]
    assert a == b  # the same agent over HTTP and in-process gives the same dialogues


def test_unreachable_http_agent_is_an_infra_failure(tmp_path, bike, cases) -> None:
    # an agent that goes away during a run (here: never there, with the preflight off)
    summary = run_sync(bike, cases[:2], ["agent=http://127.0.0.1:9/agent"], str(tmp_path / "down"),
                       progress=False, preflight=False)
    with RunStore.open(tmp_path / "down") as store:
        assert all(d.status == "infra_failure" for d in store.dialogues())
    assert summary is not None


def test_an_http_agent_that_is_not_running_stops_the_run_before_anything_is_created(tmp_path, bike, cases) -> None:
    """Before, every dialogue became an infrastructure failure (a run directory of them, exit 3) and the
    user had to find out why from the failure table; now the preflight says it in one line."""
    with pytest.raises(RunError, match=r"cannot connect to 127\.0\.0\.1:9 .*is the agent server running"):
        run_sync(bike, cases[:2], ["agent=http://127.0.0.1:9/agent"], str(tmp_path / "down"), progress=False)
    assert not (tmp_path / "down").exists()
    import json

    from click.testing import CliRunner

    from sopgraph.cli import main
    cases_file = tmp_path / "cases.jsonl"
    cases_file.write_text("".join(json.dumps(c.model_dump(mode="json")) + "\n" for c in cases[:2]))
    res = CliRunner().invoke(main, ["run", str(BIKE), "--cases", str(cases_file), "-q",
                                    "--model", "agent=http://127.0.0.1:9/agent", "-o", str(tmp_path / "cli")])
    assert res.exit_code == 1 and "is the agent server running?" in res.output
    assert not (tmp_path / "cli").exists()


@pytest.mark.parametrize("kind", ["python", "http"])
def test_sigkill_then_resume_is_exactly_once(tmp_path, bike, cases, kind) -> None:
    import json

    cases_file = tmp_path / "cases.jsonl"
    many = [c.model_copy(update={"id": f"{c.id}-{i}"}) for i in range(5) for c in cases]
    cases_file.write_text("".join(json.dumps(c.model_dump(mode="json")) + "\n" for c in many))
    server = None
    if kind == "http":
        server = rule_agent.serve(0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        model = f"agent=http://127.0.0.1:{server.server_address[1]}/agent"
    else:
        model = "agent=python:tests.test_agents:slow_agent"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOPGRAPH_TEST_SLOW": "0.05"}
    out = tmp_path / "run"
    code = "import sys; from sopgraph.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", code, "run", str(BIKE), "--cases", str(cases_file),
                             "--model", model, "--concurrency", "2", "-q", "-o", str(out)],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if _done_count(out) >= 4:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with RunStore.open(out) as s:
            before = Counter(d.status for d in s.dialogues())
        assert 0 < before["done"] < len(many), before
        run_sync(None, None, None, str(out), resume=True, progress=False)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    with RunStore.open(out) as s:
        dialogues, turns = s.dialogues(), s.turns()
    assert len(dialogues) == len(many) and all(d.status == "done" for d in dialogues)
    for d in dialogues:
        assert [t.index for t in turns if t.dialogue_id == d.id] == list(range(1, d.turns + 1))


def _done_count(run_dir: Path) -> int:
    """Done dialogues, read without opening the store (it may still be being created). A copy of
    `helpers.done_dialogues`: this module is also imported as `tests.test_agents` by the agent subprocess
    (the `python:` agent kind), where the test helpers are not importable."""
    import sqlite3

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


def slow_agent(request: dict) -> dict:
    time.sleep(float(os.environ.get("SOPGRAPH_TEST_SLOW", "0")))
    return rule_agent.respond(request)


def broken_agent(request: dict) -> dict:
    return {"reply": request["no_such_key"], "tool_calls": []}


def test_a_python_agent_that_raises_says_where(tmp_path, bike, cases) -> None:
    """The infrastructure failure of a Python agent that raises names the line that raised (before: only
    `raised KeyError: 'no_such_key'`, with the traceback gone)."""
    run_sync(bike, cases[:1], [f"agent=python:{__name__}:broken_agent"], str(tmp_path / "broken"), progress=False)
    with RunStore.open(tmp_path / "broken") as store:
        (dialogue,) = store.dialogues()
    line = broken_agent.__code__.co_firstlineno + 1
    assert dialogue.status == "infra_failure"
    assert f"raised KeyError: 'no_such_key' (at test_agents.py:{line} in broken_agent)" in str(dialogue.error)


def test_an_action_reached_from_several_stages_reads_as_the_case_path(tmp_path) -> None:
    """telecom_package hands over to a human (TransHuman) from several stages: the path inferred from a
    tool agent's calls was always the first path ending there, so the oracle acting through tools lost
    path score on every other hand-over case."""
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import synthesize
    path = ROOT / "scenarios" / "telecom_package.sop"
    sop = sopgraph.load(path)
    paths = scenario_context(sop)["paths"]
    ends = [p["stages"] for p in paths if p["finals"]["Action"] == "TransHuman"]
    assert len(ends) >= 2
    assert infer_path(paths, "TransHuman") == ends[0]
    assert infer_path(paths, "TransHuman", preferred=ends[1]) == ends[1]
    assert infer_path(paths, "TransHuman", preferred=["step1", "nowhere"]) == ends[0]  # not a fitting path
    cases = [c for c in synthesize(sop, profile_for(path, sop), 40, seed=4).cases
             if c.expected_finals["Action"] == "TransHuman"]
    assert {tuple(c.expected_path) for c in cases} - {tuple(ends[0])}  # some hand-over on another path
    run_sync(sop, cases, ["agent=baseline/oracle-tools"], str(tmp_path / "r"), trials=1, progress=False,
             judge_turns="final")
    with RunStore.open(tmp_path / "r") as store:
        by_case = {c.id: c for c in store.cases()}
        last = {}
        for turn in store.iter_turns(status="done"):
            last[turn.dialogue_id] = turn
        for d in store.dialogues(status="done"):
            out = last[d.id].output
            assert out is not None and out.finals["Action"] == "TransHuman"
            assert out.now_path == by_case[d.case_id].expected_path, d.id


# ----------------------------------------------------------------------------- hostile agents (issue 29)

_RELEASE = threading.Event()  # set at the end of a test: lets a stuck agent's thread end
_SEEN: set[str] = set()
_SEEN_LOCK = threading.Lock()
_BARRIER = threading.Barrier(2, timeout=15)


def stuck_agent(request: dict) -> dict:
    _RELEASE.wait(20)  # old code: held the event loop this long, then answered
    return rule_agent.respond(request)


async def stuck_async_agent(request: dict) -> dict:
    await asyncio.sleep(20)
    return rule_agent.respond(request)


def meeting_agent(request: dict) -> dict:
    """Answers a dialogue's first request only once another dialogue's first request is in as well: two
    synchronous calls must be in flight at the same time (before, the first held the event loop)."""
    with _SEEN_LOCK:
        first = request["dialogue_id"] not in _SEEN
        _SEEN.add(request["dialogue_id"])
    if first:
        _BARRIER.wait()
    return rule_agent.respond(request)


def exiting_agent(request: dict) -> dict:
    raise SystemExit(3)


def interrupting_agent(request: dict) -> dict:
    raise KeyboardInterrupt


async def interrupting_async_agent(request: dict) -> dict:
    raise KeyboardInterrupt


def huge_agent(request: dict) -> dict:
    return {"reply": "x" * (2 << 20), "tool_calls": []}


@pytest.mark.parametrize("agent", ["stuck_agent", "stuck_async_agent"])
def test_a_python_agent_that_never_answers_times_out(tmp_path, bike, cases, agent) -> None:
    """Before, a synchronous agent that never returned held the event loop (every dialogue stopped), and
    an async one left its dialogue running forever: now both are an agent error after the timeout."""
    try:
        summary = run_sync(bike, cases[:2], [f"agent=python:{__name__}:{agent},timeout=0.5"], str(tmp_path / "r"),
                           progress=False, concurrency=2)
    finally:
        _RELEASE.set()
    assert summary.by_status == {"infra_failure": 2}
    assert all("did not answer within 0.5 s" in e["error"] for e in summary.infra_errors), summary.infra_errors


def test_a_synchronous_python_agent_does_not_hold_the_event_loop(tmp_path, bike, cases) -> None:
    _SEEN.clear()
    _BARRIER.reset()
    summary = run_sync(bike, cases[:1], [f"agent=python:{__name__}:meeting_agent"], str(tmp_path / "r"),
                       progress=False, concurrency=2, trials=2)
    assert summary.by_status == {"done": 2}, summary.infra_errors


@pytest.mark.parametrize(("agent", "raised"), [("exiting_agent", "SystemExit: 3"),
                                               ("interrupting_agent", "KeyboardInterrupt"),
                                               ("interrupting_async_agent", "KeyboardInterrupt")])
def test_an_agent_raising_systemexit_or_keyboardinterrupt_fails_only_its_dialogue(tmp_path, bike, cases, agent,
                                                                                  raised) -> None:
    """Before, `sop run` died with a traceback and no summary."""
    summary = run_sync(bike, cases[:2], [f"agent=python:{__name__}:{agent}"], str(tmp_path / "r"), progress=False)
    assert summary.by_status == {"infra_failure": 2}
    assert all(f"raised {raised}" in e["error"] and f"in {agent})" in e["error"] for e in summary.infra_errors)


def test_a_real_ctrl_c_still_stops_a_run_whose_agent_is_stuck(tmp_path, bike, cases) -> None:
    import json

    cases_file = tmp_path / "cases.jsonl"
    cases_file.write_text("".join(json.dumps(c.model_dump(mode="json")) + "\n" for c in cases))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Ctrl-C reaches a command run in the foreground, where Python turns SIGINT into KeyboardInterrupt; a test run
    # started in the background (`make` from a script's `&`) hands its children SIGINT ignored, so the child
    # restores the foreground's handler first
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from sopgraph.cli import main; sys.exit(main())")
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", code, "run", str(BIKE), "--cases", str(cases_file),
                             "--model", "agent=python:tests.test_agents:stuck_agent", "-q", "-o", str(out)],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _running_count(out):
            time.sleep(0.05)
        time.sleep(0.3)  # the agent's calls are under way
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"interrupted; resume with: sop run --resume" in err and b"Traceback" not in err


def _running_count(run_dir: Path) -> int:
    # imported here: the agent subprocess imports this module where the test helpers are not importable
    from helpers import dialogues_with_status

    return dialogues_with_status(run_dir, "running")


class _Hostile(BaseHTTPRequestHandler):
    """An agent server that redirects (`/redirect?to=URL`), or answers 2 MiB with or without a length."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/redirect"):
            self.send_response(307)
            self.send_header("Location", self.path.split("to=", 1)[1])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps({"reply": "x" * (2 << 20), "tool_calls": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path == "/sized":
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Connection", "close")  # the body ends when the connection does
            self.close_connection = True
        self.end_headers()
        with contextlib.suppress(ConnectionError):  # the client stops reading past its limit
            self.wfile.write(body)


@pytest.fixture
def hostile() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.protocol_version = "HTTP/1.1"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_agent_redirect_is_not_followed(tmp_path, bike, cases, hostile) -> None:
    """Before, a 307 re-sent the whole request (the conversation and the case's values) to the Location
    host, and its answer was taken as the agent's."""
    target = rule_agent.serve(0)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    hits: list[str] = []
    handle = target.RequestHandlerClass.do_POST

    def counting(self: Any) -> None:
        hits.append(self.path)
        handle(self)

    try:
        elsewhere = f"http://127.0.0.1:{target.server_address[1]}/agent"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(target.RequestHandlerClass, "do_POST", counting)
            summary = run_sync(bike, cases[:1], [f"agent={hostile}/redirect?to={elsewhere}"], str(tmp_path / "r"),
                               progress=False)
    finally:
        target.shutdown()
        target.server_close()
    assert hits == []
    assert summary.by_status == {"infra_failure": 1}
    (error,) = [e["error"] for e in summary.infra_errors]
    assert f"answered HTTP 307, a redirect to {elsewhere}; redirects are not followed" in error


@pytest.mark.parametrize("path", ["sized", "unsized"])
def test_an_http_agent_answer_over_the_limit_is_an_agent_error(tmp_path, bike, cases, hostile, path) -> None:
    """Before, a 100 MB answer was read whole and stored twice; now reading stops past the limit."""
    summary = run_sync(bike, cases[:1], [f"agent={hostile}/{path}"], str(tmp_path / "r"), progress=False)
    assert summary.by_status == {"infra_failure": 1}
    (error,) = [e["error"] for e in summary.infra_errors]
    assert "over the limit of 1,048,576 (max_answer_bytes=)" in error
    if path == "sized":
        assert "the answer is 2,097,183 bytes" in error
    # the limit is the agent's option: raised, the same answer is taken
    summary = run_sync(bike, cases[:1], [f"agent={hostile}/{path},max_answer_bytes=4000000"], str(tmp_path / "big"),
                       progress=False, max_turns=1)
    assert summary.by_status == {"done": 1}, summary.infra_errors


def test_a_python_agent_answer_over_the_limit_is_an_agent_error(tmp_path, bike, cases) -> None:
    summary = run_sync(bike, cases[:1], [f"agent=python:{__name__}:huge_agent"], str(tmp_path / "r"), progress=False)
    assert summary.by_status == {"infra_failure": 1}
    (error,) = [e["error"] for e in summary.infra_errors]
    assert "the answer is 2,097,183 bytes serialized, over the limit of 1,048,576" in error
    with RunStore.open(tmp_path / "r") as store:
        assert store.conn.execute("SELECT MAX(LENGTH(data)) FROM turns").fetchone()[0] is None
