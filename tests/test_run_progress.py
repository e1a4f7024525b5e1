"""Run progress for logs and orphan-free workers (issue 12 item 20, issue 13 item 6), against the fake server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakeserver import Behavior, FakeServer

from sopgraph.logic.checker import load
from sopgraph.logic.engine import decide
from sopgraph.records import Case, Persona
from sopgraph.simulation.runner import RunError, run_sync

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "tests" / "data" / "toy_refunds.sop"
AGENT_REPLY = json.dumps({"classification_output": {"Want": "Money", "Angry": False, "Items": 2}, "cot": "c",
                          "now_path": ["s1", "s2"], "finals": {"Action": "Explain"}, "chat": "ok"})


def toy_cases(n: int) -> list[Case]:
    sc = load(TOY)
    out = []
    for k in range(n):
        truth, system = {"Want": "Money", "Angry": k % 3 == 0, "Items": k % 11}, {"Paid": k % 2 == 0}
        d = decide(sc, {**truth, **system})
        out.append(Case(sop_hash=sc.source_hash, id=f"k{k:03d}", scenario="toy", path_id="p", intent="refund",
                        intent_description=f"case-{k} I want my money back.", persona=Persona(name="p"),
                        truth=truth, system=system, expected_path=d.path, expected_finals=d.finals,
                        user_facts=system, seed=k))
    return out


def write_cases(path: Path, cases: list[Case]) -> Path:
    path.write_text("".join(c.model_dump_json() + "\n" for c in cases), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- item 20
def test_progress_always_prints_plain_lines_with_tokens_per_call(tmp_path: Path) -> None:
    cases = write_cases(tmp_path / "cases.jsonl", toy_cases(2))
    with FakeServer() as server:
        server.set_default(Behavior.ok(AGENT_REPLY, prompt_tokens=100, completion_tokens=1))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SOPGRAPH_CACHE_DIR": str(tmp_path / "cache")}
        proc = subprocess.run(
            [sys.executable, "-c", "from sopgraph.cli import main; main()", "run", str(TOY), "--cases", str(cases),
             "-o", str(tmp_path / "r"), "--max-turns", "3", "--progress", "always", "--format", "json",
             "--model", f"agent=openai/fake,api_base={server.base_url}"],
            capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[sop] dialogues")]
    assert lines, proc.stderr  # stderr is a pipe here: plain lines, no terminal bar
    assert "\x1b[" not in proc.stderr
    assert lines[-1].startswith("[sop] dialogues: 2/2 (100%) done, 0 failed,")
    final_tokens = json.loads(proc.stdout)["tokens"]
    assert f"{final_tokens:,} tokens" in lines[-1]


def test_progress_listener_moves_tokens_before_a_dialogue_ends(tmp_path: Path) -> None:
    from sopgraph.simulation.runner import _Progress

    seen: list[tuple[int, int]] = []

    class Spy(_Progress):
        def tick_totals(self, tokens: int, cost: float, force: bool = False) -> None:
            seen.append((self.done, tokens))
            super().tick_totals(tokens, cost, force)

    import sopgraph.simulation.runner as runner_mod

    original = runner_mod._Progress
    runner_mod._Progress = Spy  # type: ignore[misc]
    try:
        with FakeServer() as server:
            server.set_default(Behavior.ok(AGENT_REPLY, prompt_tokens=100, completion_tokens=1))
            run_sync(TOY, toy_cases(1), [f"agent=openai/fake,api_base={server.base_url}"], tmp_path / "r",
                     max_turns=3, progress="never", gateway_options={"cache": False})
    finally:
        runner_mod._Progress = original
    assert seen == []  # never: no display at all
    runner_mod._Progress = Spy  # type: ignore[misc]
    try:
        with FakeServer() as server:
            server.set_default(Behavior.ok(AGENT_REPLY, prompt_tokens=100, completion_tokens=1))
            run_sync(TOY, toy_cases(1), [f"agent=openai/fake,api_base={server.base_url}"], tmp_path / "r2",
                     max_turns=3, progress="always", gateway_options={"cache": False})
    finally:
        runner_mod._Progress = original
    mid = [tokens for done, tokens in seen if done == 0]
    assert mid and mid[-1] > 0  # tokens counted while the only dialogue was still running


def test_bad_progress_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="auto, always or never"):
        run_sync(TOY, toy_cases(1), ["agent=baseline/oracle"], tmp_path / "r", progress="sometimes")
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- issue 13 item 6
def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with_children = (task / "children").read_text().split() if (task / "children").exists() else []
        out += [int(c) for c in with_children]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_their_parent(tmp_path: Path) -> None:
    """kill -9 of `sop run --workers 2`: no model call reaches the server afterwards, the workers exit."""
    cases = write_cases(tmp_path / "cases.jsonl", toy_cases(40))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOPGRAPH_CACHE_DIR": str(tmp_path / "cache")}
    with FakeServer(lifetime=120) as server:
        server.set_default(Behavior.ok(AGENT_REPLY, latency=0.05))
        proc = subprocess.Popen(
            [sys.executable, "-c", "from sopgraph.cli import main; main()", "run", str(TOY), "--cases", str(cases),
             "-o", str(tmp_path / "r"), "--workers", "2", "--concurrency", "4", "--max-turns", "15", "-q",
             "--no-cache", "--model", f"agent=openai/fake,api_base={server.base_url}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        try:
            deadline = time.monotonic() + 120
            while len(server.requests) < 20 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.02)
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            workers = _children(proc.pid)
            assert len(workers) >= 2, workers
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            time.sleep(0.5)  # calls already on the wire at the kill may still land
            at_kill = len(server.requests)
            time.sleep(3.0)
            after = len(server.requests)
            gone = time.monotonic() + 10
            while any(_alive(w) for w in workers) and time.monotonic() < gone:
                time.sleep(0.1)
            assert not any(_alive(w) for w in workers), [w for w in workers if _alive(w)]
        finally:
            for pid in [proc.pid, *_children(proc.pid)] if proc.poll() is None else []:
                os.kill(pid, signal.SIGKILL)
    assert after == at_kill, f"{after - at_kill} model calls after the parent was killed"


# ----------------------------------------------------------------------------- issue 12 item 12
def test_library_run_inside_a_running_event_loop(tmp_path: Path) -> None:
    """A notebook cell runs in a live loop: `sopgraph.run` still works, and `arun` is the async form."""
    import asyncio

    import sopgraph

    cases = toy_cases(2)

    async def cell() -> tuple[object, object]:
        blocking = sopgraph.run(TOY, cases, ["agent=baseline/oracle"], tmp_path / "a", progress=False)
        awaited = await sopgraph.arun(TOY, cases, ["agent=baseline/oracle"], tmp_path / "b", progress=False)
        return blocking, awaited

    blocking, awaited = asyncio.run(cell())
    assert blocking.by_status == awaited.by_status == {"done": 2}


def test_score_summary_prints_headline_not_repr(tmp_path: Path) -> None:
    import sopgraph

    sopgraph.run(TOY, toy_cases(3), ["agent=baseline/oracle"], tmp_path / "r", progress=False)
    summary = sopgraph.score_run(tmp_path / "r").summary()
    text = str(summary)
    assert "baseline/oracle: 3 dialogues" in text and "overall " in text and "logic " in text
    assert len(text) < 1500 and len(repr(summary)) < 1600
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "GroupScore(" not in text and "Metric(" not in repr(summary)
    assert summary.model_dump()["groups"]  # the full record is still there


# ----------------------------------------------------------------------------- issue 32 item 11
@pytest.mark.parametrize("workers", [1, 2])
def test_calls_being_retried_are_reported_as_they_happen(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         workers: int) -> None:
    """A 60 s outage left the progress line at "0/4 done" until the run ended: each retry now says so
    (from worker processes too)."""
    quick = {"max_retries": 3, "base_delay": 0.01, "max_delay": 0.02, "cache": False}
    with FakeServer() as server:
        server.script([Behavior.server_error(503), Behavior.server_error(503)])
        server.set_default(Behavior.ok(AGENT_REPLY))
        summary = run_sync(TOY, toy_cases(workers), [f"agent=openai/fake,api_base={server.base_url}"],
                           tmp_path / "r", max_turns=2, progress="always", gateway_options=quick, workers=workers,
                           concurrency=2)
    assert summary.by_status == {"done": workers}
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "retrying" in ln]
    assert len(lines) == 2 or (workers == 2 and lines), err  # two workers' "attempt 2" lines are one
    assert re.fullmatch(rf"\[sop\] retrying agent at {re.escape(server.base_url)} \(attempt 2/4, next in "
                        r"0\.0 s\): server_error", lines[0]), lines
    assert workers == 2 or "(attempt 3/4," in lines[1]
    assert err.index(lines[0]) < err.index(f"{workers}/{workers} (100%) done")  # while the dialogues were open


def test_the_bar_shows_a_retry_until_a_call_answers() -> None:
    from sopgraph.simulation.runner import _Progress

    bar = _Progress(2, "bar", "dialogues")
    try:
        bar.retrying("retrying agent at http://127.0.0.1:8080/v1 (attempt 2/7, next in 1.0 s): connection")
        assert bar._bar.tasks[0].fields["note"].startswith("retrying agent at http://127.0.0.1:8080/v1")
        bar.tick_totals(5, 0.0)
        assert bar._bar.tasks[0].fields["note"] == ""
    finally:
        bar.close()


def test_the_model_check_reports_its_retries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The model check against a dead port was silent for its whole retry window (64 s)."""
    quick = {"max_retries": 2, "base_delay": 0.01, "max_delay": 0.02}
    with pytest.raises(RunError, match="model check failed"):
        run_sync(TOY, toy_cases(1), ["agent=openai/fake,api_base=http://127.0.0.1:9/v1"], tmp_path / "r",
                 progress="always", gateway_options=quick)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "retrying" in ln]
    assert [ln.split(", next in")[0] for ln in lines] == [
        "[sop] model check: retrying agent at http://127.0.0.1:9/v1 (attempt 2/3",
        "[sop] model check: retrying agent at http://127.0.0.1:9/v1 (attempt 3/3"]
    with pytest.raises(RunError, match="model check failed"):
        run_sync(TOY, toy_cases(1), ["agent=openai/fake,api_base=http://127.0.0.1:9/v1"], tmp_path / "r",
                 progress="never", gateway_options=quick)
    assert "retrying" not in capsys.readouterr().err  # silent when asked to be


# ----------------------------------------------------------------------------- issue 32 item 12 (run side)
def test_run_and_runs_show_say_which_token_total_they_print(tmp_path: Path) -> None:
    """`sop run`/`runs show` print every role's tokens, discarded attempts included, and `sop score` the
    agent's only: the two totals were unlabelled. The run side says what it counts."""
    from click.testing import CliRunner

    from sopgraph.cli import main

    cases = write_cases(tmp_path / "cases.jsonl", toy_cases(2))
    runner = CliRunner()
    env = {"COLUMNS": "200"}
    res = runner.invoke(main, ["run", str(TOY), "--cases", str(cases), "--model", "agent=baseline/oracle", "-q",
                               "-o", str(tmp_path / "r")], env=env)
    assert res.exit_code == 0, res.output
    shown = runner.invoke(main, ["runs", "show", str(tmp_path / "r")], env=env)
    for out in (res.output, shown.output):
        assert "tokens / cost (all roles, incl. discarded attempts)" in out, out
