"""The runner end to end: offline runs, fault injection over real sockets, SIGKILL + resume, re-judging,
and secret hygiene of everything stored."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakeserver import Behavior, FakeServer
from helpers import done_dialogues

from sopgraph.cli import main
from sopgraph.logic.checker import load
from sopgraph.logic.engine import decide
from sopgraph.records import Case, Persona
from sopgraph.simulation.gateway import Gateway, parse_model_option
from sopgraph.simulation.runner import RunError, rejudge, run
from sopgraph.simulation.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
TOY = (Path(__file__).parent / "data" / "toy_refunds.sop").read_text()
KEY_ENV = "SOPTEST_FAKE_API_KEY"
KEY = "sk-test-Zq8vK2mN4pR6tW9yB1cD3fH5"
CASE_RE = re.compile(r"case-(\d+)")


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sop") / "toy.sop"
    path.write_text(TOY, encoding="utf-8")
    return path


def toy_cases(n: int) -> list[Case]:
    sc = load(text=TOY)
    out = []
    for k in range(n):
        truth = {"Want": "Money", "Angry": k % 3 == 0, "Items": k % 11}
        system = {"Paid": k % 2 == 0}
        d = decide(sc, {**truth, **system})
        out.append(Case(sop_hash=sc.source_hash, id=f"k{k:03d}", scenario="toy", path_id="p",
                        intent="refund", intent_description=f"case-{k} I want my money back.",
                        persona=Persona(name="p"), truth=truth, system=system, expected_path=d.path,
                        expected_finals=d.finals, user_facts=system, seed=k))
    return out


def write_cases(path: Path, cases: list[Case]) -> Path:
    path.write_text("".join(c.model_dump_json() + "\n" for c in cases), encoding="utf-8")
    return path


def agent_json(action: str, chat: str = "ok") -> str:
    return json.dumps({"classification_output": {"Want": "Money", "Angry": False, "Items": 2}, "cot": "c",
                       "now_path": ["s1", "s2", "s3"], "finals": {"Action": action}, "chat": chat})


def who(req) -> tuple[int, int]:
    """(case number, agent turn) of an agent request: the case is named in the user's opening."""
    msgs = req.messages
    opening = next(m["content"] for m in msgs if m["role"] == "user")
    return int(CASE_RE.search(opening).group(1)), sum(1 for m in msgs if m["role"] == "user")


def planned_reply(k: int, turn: int) -> str:
    """k%4: 0 prose then Refund; 1 truncated JSON then Explain (user stops); 2 fenced Refund; 3 Explain
    (echoing the key, which must never be stored) then Human."""
    kind = k % 4
    if kind == 0:
        return "Sure, let me check that for you." if turn == 1 else agent_json("Refund")
    if kind == 1:
        return agent_json("Refund")[:40] if turn == 1 else agent_json("Explain", "That is our policy.")
    if kind == 2:
        return "Here you go:\n```json\n" + agent_json("Refund") + "\n```"
    return agent_json("Explain", f"your key {KEY} is noted") if turn == 1 else agent_json("Human")


FAULTS = [Behavior.rate_limit(retry_after=0), Behavior.server_error(500), Behavior.timeout(2.5), Behavior.drop(),
          Behavior.empty(), Behavior.malformed()]


def agent_spec(server: FakeServer, timeout: float = 5.0) -> str:
    return f"agent=openai/fake-agent,api_base={server.base_url},api_key_env={KEY_ENV},timeout={timeout}"


def _scan_for_key(run_dir: Path) -> list[str]:
    hits = []
    for p in run_dir.rglob("*"):
        if p.is_file() and KEY.encode() in p.read_bytes():
            hits.append(p.name)
    return hits


# ----------------------------------------------------------------------------- offline default

def test_offline_oracle_run_with_cli(tmp_path, monkeypatch):
    import sopgraph.simulation.runner as runner_module

    def loaded_twice(path):  # `sop run` checks the file, then hands the runner what it loaded
        raise AssertionError(f"{path} loaded again")

    monkeypatch.setattr(runner_module, "_load", loaded_twice)
    sc = load(ROOT / "scenarios" / "telecom_package.sop")
    cases = []
    for i, (ct, status, pen) in enumerate([("Change", "NoContract", 0), ("Cancel", "Contracted", 300),
                                            ("Enquiry", "Contracted", 0)]):
        truth = {"ConsumptionType": ct, "ApplicationTendency": "Agree", "ConsumptionProfile": "Data",
                 "EmotionTag": "Calm"}
        system = {"PackageStatus": status, "Penalty": pen}
        d = decide(sc, {**truth, **system})
        cases.append(Case(sop_hash=sc.source_hash, id=f"t{i}", scenario=sc.name, path_id="p", intent=ct,
                          persona=Persona(name="p"), truth=truth, system=system, expected_path=d.path,
                          expected_finals=d.finals))
    cases_file = write_cases(tmp_path / "cases.jsonl", cases)
    out = tmp_path / "runs" / "oracle"
    runner = CliRunner()
    res = runner.invoke(main, ["run", str(ROOT / "scenarios" / "telecom_package.sop"), "--cases", str(cases_file),
                               "--model", "agent=baseline/oracle", "--trials", "2", "-o", str(out), "-q",
                               "--format", "json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["by_status"] == {"done": 6} and summary["format_errors"] == 0
    assert summary["end_reasons"] == {"ending_action": 6}
    with RunStore.open(out) as store:
        meta = store.meta()
        assert meta["models"]["user"]["model"] == "scripted/user"
        assert {meta["models"][f"judge{i}"]["model"] for i in (1, 2, 3)} == {"scripted/truth"}
        assert meta["sop_hash"] == sc.source_hash and meta["config"]["trials"] == 2
        last = {d.id: d.turns for d in store.dialogues()}
        for t in store.turns():
            case = next(c for c in cases if t.dialogue_id.startswith(c.id + "#"))
            assert t.output.finals == case.expected_finals and t.output.classification_output == case.truth
            if t.index == last[t.dialogue_id]:  # the oracle acts on the reference path...
                assert t.output.now_path == case.expected_path
            else:  # ...after asking for what the run reads (the path so far stops short: no action yet)
                path = t.output.now_path
                assert len(path) < len(case.expected_path) and path == case.expected_path[:len(path)]
                assert t.output.chat.endswith("?") or "still need" in t.output.chat
        # the oracle asks for what the run reads, one value a turn, the forthcoming (zero-intensity,
        # cooperative) customer answering it and volunteering another: two or three turns
        assert set(last.values()) == {2, 3}
        for c in store.consensus():  # the judges label what the customer has named: all of it by the end
            case = next(x for x in cases if c.dialogue_id.startswith(x.id + "#"))
            assert c.labels == {k: v for k, v in case.truth.items() if k not in c.unshown}
            assert c.no_consensus == [] and c.judges_scored == 3
            if c.turn_index == last[c.dialogue_id]:  # by the end, every field the decision reads
                assert decide(sc, {**case.system, **c.labels}).finals == case.expected_finals
    # a finished run cannot be overwritten, and resume has nothing to do
    res = runner.invoke(main, ["run", str(ROOT / "scenarios" / "telecom_package.sop"), "--cases", str(cases_file),
                               "--model", "agent=baseline/oracle", "-o", str(out), "-q"])
    assert res.exit_code == 1 and "already holds a run" in res.output
    res = runner.invoke(main, ["run", "--resume", str(out), "-q", "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output)["skipped"] == 6
    res = runner.invoke(main, ["runs", "show", str(out), "--agreement"])
    assert res.exit_code == 0 and "judgment set default" in res.output and "Fleiss" in res.output
    res = runner.invoke(main, ["runs", "show", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "not a run directory" in res.output


def test_input_errors_are_clear(tmp_path, toy_file):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n', encoding="utf-8")
    with pytest.raises(RunError, match=r"bad.jsonl:1: invalid case"):
        asyncio.run(run(toy_file, bad, ["agent=baseline/oracle"], tmp_path / "r1"))
    other = toy_cases(1)[0].model_copy(update={"scenario": "telecom_package"})
    with pytest.raises(RunError, match="is for scenario"):
        asyncio.run(run(toy_file, [other], ["agent=baseline/oracle"], tmp_path / "r2"))
    with pytest.raises(RunError, match="not a run directory"):
        asyncio.run(run(None, None, None, tmp_path / "r3", resume=True))
    res = CliRunner().invoke(main, ["run", str(toy_file), "--cases", str(bad), "--model", "agent=baseline/oracle",
                                    "--judge-turns", "0", "-o", str(tmp_path / "r4")])
    assert res.exit_code == 1 and "judge turn 0" in res.output


# ----------------------------------------------------------------------------- faults over real sockets

def test_fault_injection_no_dialogue_lost_exact_format_errors(tmp_path, toy_file, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    cases = toy_cases(12)
    attempts: Counter = Counter()
    lock = threading.Lock()
    healed = threading.Event()

    def responder(req):
        k, turn = who(req)
        with lock:
            attempts[(k, turn)] += 1
            n = attempts[(k, turn)]
        if k in (10, 11) and not healed.is_set():
            return Behavior.server_error(500)  # never recovers: an infrastructure failure
        if n == 1:
            return FAULTS[(k + turn) % len(FAULTS)]
        return Behavior.ok(planned_reply(k, turn), prompt_tokens=11, completion_tokens=7)

    with FakeServer(lifetime=120) as server:
        server.responder(responder)
        quick = {"max_retries": 2, "base_delay": 0.01, "max_delay": 0.05, "cache": False}
        out = tmp_path / "run"
        summary = asyncio.run(run(toy_file, cases, [agent_spec(server, timeout=1.0)], out, concurrency=6,
                                  gateway_options=quick, progress=False))
        # every injected fault kind happened and was retried
        kinds = Counter(r.behavior.kind for r in server.requests)
        assert {"error", "timeout", "drop", "empty", "malformed", "ok"} <= set(kinds)
        assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in server.requests)

        assert summary.dialogues == 12 and summary.by_status == {"done": 10, "infra_failure": 2}
        assert summary.format_errors == 6  # exactly: cases 0,1,4,5,8,9 broke turn 1
        assert summary.turns == 18
        assert summary.end_reasons == {"ending_action": 7, "user_stop": 3}
        assert sorted(e["dialogue"] for e in summary.infra_errors) == ["k010#0", "k011#0"]
        assert all("server_error" in e["error"] for e in summary.infra_errors)
        with RunStore.open(out) as store:
            assert [d.id for d in store.dialogues()] == [f"k{k:03d}#0" for k in range(12)]
            assert store.turns("k010#0") == [] and store.consensus(dialogue_id="k010#0") == []
            notes = Counter(t.format_note for t in store.turns() if not t.format_error)
            assert notes["extracted from a fenced code block"] == 2
            errs = [t for t in store.turns() if t.format_error]
            assert all(t.output is None and t.agent_raw for t in errs)
            assert {t.dialogue_id for t in errs} == {f"k{k:03d}#0" for k in (0, 1, 4, 5, 8, 9)}
            # the user saw the agent's raw text on a broken turn: turn 2 of case 0 follows "Sure, ..."
            for d in store.dialogues(status="done"):
                turns = store.turns(d.id)
                assert [t.index for t in turns] == list(range(1, d.turns + 1))
                assert [c.turn_index for c in store.consensus("default", d.id)] == sorted({1, d.turns})
            usage = store.usage_totals(include_discarded=False)["agent"]
            assert usage.calls == 18 and usage.prompt_tokens == 18 * 11
        assert _scan_for_key(out) == []

        # still broken: the CLI resume retries the two, reports them and exits 3
        runner = CliRunner()
        res = runner.invoke(main, ["run", "--resume", str(out), "-q", "--format", "json"])
        assert res.exit_code == 3, res.output
        assert json.loads(res.output)["ran"] == 2
        res = runner.invoke(main, ["runs", "show", str(out)])
        assert res.exit_code == 0 and "infrastructure failures" in res.output and "k010#0" in res.output
        # the infrastructure recovers: resume retries exactly the two failures
        healed.set()
        before = {(k, t): n for (k, t), n in attempts.items() if k < 10}
        summary = asyncio.run(run(None, None, None, out, resume=True, progress=False))
        assert summary.ran == 2 and summary.skipped == 10
        assert summary.by_status == {"done": 12} and summary.format_errors == 6 and summary.turns == 21
        assert {(k, t): n for (k, t), n in attempts.items() if k < 10} == before  # finished ones untouched
    assert _scan_for_key(out) == []


def test_structured_sends_the_schema(tmp_path, toy_file, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with FakeServer(lifetime=60, default=Behavior.ok(agent_json("Refund"))) as server:
        gateway = Gateway(concurrency=2, max_retries=0, cache=False)
        summary = asyncio.run(run(toy_file, toy_cases(1), [agent_spec(server)], tmp_path / "r", structured=True,
                                  gateway=gateway, progress=False))
        assert summary.by_status == {"done": 1}
        fmt = server.requests[0].body["response_format"]
        assert fmt["type"] == "json_schema"
        assert fmt["json_schema"]["schema"]["properties"]["finals"]["properties"]["Action"]["enum"] == \
            ["Refund", "Explain", "Human"]


# ----------------------------------------------------------------------------- re-judging

def test_rejudge_adds_a_set_without_calling_agents(tmp_path, toy_file):
    out = tmp_path / "run"
    asyncio.run(run(toy_file, toy_cases(4), ["agent=baseline/oracle"], out, progress=False))
    with RunStore.open(out) as store:
        default = store.consensus("default")
        turns = store.turns()
        judged = len(default)  # judged turns: 1 and the final one of each dialogue

    def judge_reply(req):
        text = req.messages[0]["content"]
        angry = "judge-b" in req.body["model"]
        return Behavior.json_reply({"labels": {"Want": "Info", "Angry": angry, "Items": 3},
                                    "scores": {"linguistic": 9 if angry else 6, "anthropomorphism": 6,
                                               "content_utility": 6, "satisfaction": 6, "instruction": 3},
                                    "reasons": {"labels": "turn" in text and "ok"}})

    with FakeServer(lifetime=60) as server:
        server.responder(judge_reply)
        specs = [parse_model_option(f"judge=openai/judge-{x},api_base={server.base_url}") for x in "aab"]
        gateway = Gateway(concurrency=4, max_retries=0, cache=False)
        summary = asyncio.run(rejudge(out, specs, judgment_set="second", gateway=gateway, progress=False))
        assert summary.ran == 4 and len(server.requests) == 3 * judged > 12  # three judges per judged turn
        assert all(r.body["model"] in ("judge-a", "judge-b") for r in server.requests)
        # resuming a finished re-judge does nothing
        again = asyncio.run(rejudge(out, specs, judgment_set="second", gateway=gateway, progress=False))
        assert again.ran == 0 and len(server.requests) == 3 * judged
    with RunStore.open(out) as store:
        assert store.judgment_sets() == ["default", "second"]
        assert store.consensus("default") == default and store.turns() == turns
        second = store.consensus("second")
        assert len(second) == judged
        assert all(c.labels == {"Want": "Info", "Angry": False, "Items": 3} for c in second)
        assert all(c.chat_scores["linguistic"] == 7.0 and c.judges_scored == 3 for c in second)
        assert store.meta()["judgment_sets"]["second"]["models"]["judge3"] == "openai/judge-b"
    with pytest.raises(RunError, match="'default' is the run's own"):
        asyncio.run(rejudge(out, ["judge=scripted/truth"], judgment_set="default", progress=False))


# ----------------------------------------------------------------------------- SIGKILL and resume

def _cli(args: list[str], env: dict) -> subprocess.Popen:
    code = "import sys; from sopgraph.cli import main; sys.exit(main())"
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)


def _snapshot(run_dir: Path) -> dict:
    """Everything stored that must not depend on interruptions (latencies and timestamps excluded)."""
    with RunStore.open(run_dir) as s:
        return {
            "cases": [c.model_dump() for c in s.cases()],
            "dialogues": [d.model_dump() for d in s.dialogues()],
            "turns": [t.model_dump(exclude={"latency_s"}) for t in s.turns()],
            "judgments": [j.model_dump() for j in s.judgments()],
            "consensus": [c.model_dump() for c in s.consensus()],
            "usage": sorted(tuple(r) for r in s.conn.execute(
                "SELECT dialogue_id, turn_index, role, model, prompt_tokens, completion_tokens, calls FROM usage"
                " WHERE discarded = 0")),
        }


def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path, toy_file, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    cases_file = write_cases(tmp_path / "cases.jsonl", toy_cases(30))
    env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(ROOT)}

    def responder(req):
        k, turn = who(req)
        return Behavior.ok(planned_reply(k, turn), latency=0.08, prompt_tokens=11, completion_tokens=7)

    with FakeServer(lifetime=120) as server:
        server.responder(responder)
        common = ["--cases", str(cases_file), "--model", agent_spec(server), "--trials", "2", "--concurrency", "3",
                  "--max-turns", "4", "--judge-turns", "all", "-q", "--no-cache", "--format", "json"]
        killed, whole = tmp_path / "killed", tmp_path / "whole"
        # Only the run to kill is a separate process; resume and reference run in-process (same CLI code).
        proc = _cli(["run", str(toy_file), *common, "-o", str(killed)], env)
        deadline = time.monotonic() + 90
        while done_dialogues(killed) < 8 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
        with RunStore.open(killed) as s:
            statuses = Counter(d.status for d in s.dialogues())
            partial = s.conn.execute("SELECT COUNT(*) FROM turns t JOIN dialogues d ON d.id = t.dialogue_id"
                                     " WHERE d.status != 'done'").fetchone()[0]
        assert statuses["done"] >= 8 and statuses["done"] < 60, statuses  # killed mid-way
        runner = CliRunner()
        res = runner.invoke(main, ["run", "--resume", str(killed), "-q", "--format", "json"])
        assert res.exit_code == 0, res.output
        info = json.loads(res.output)
        assert info["skipped"] == statuses["done"] and info["ran"] == 60 - statuses["done"]
        res = runner.invoke(main, ["run", str(toy_file), *common, "-o", str(whole)])
        assert res.exit_code == 0, res.output

    a, b = _snapshot(killed), _snapshot(whole)
    assert len(a["dialogues"]) == 60 and len({d["id"] for d in a["dialogues"]}) == 60
    assert all(d["status"] == "done" for d in a["dialogues"])
    for d in a["dialogues"]:
        assert [t["index"] for t in a["turns"] if t["dialogue_id"] == d["id"]] == list(range(1, d["turns"] + 1))
    assert a == b
    assert _scan_for_key(killed) == [] and _scan_for_key(whole) == []
    print(f"killed after {statuses['done']} done, {statuses['running']} running, {partial} partial turns")


# ----------------------------------------------------------------------------- worker processes

@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_store_the_same_results_as_one_process(tmp_path, toy_file, monkeypatch, method):
    from sopgraph.simulation import runner as runner_mod

    monkeypatch.setattr(runner_mod, "_START_METHOD", method)
    cases = toy_cases(16)
    models = ["agent=baseline/random-path", "judge=scripted/truth"]
    kw = {"trials": 2, "concurrency": 4, "max_turns": 4, "judge_turns": "all", "progress": False}
    one = asyncio.run(run(toy_file, cases, models, tmp_path / "one", **kw))
    two = asyncio.run(run(toy_file, cases, models, tmp_path / "two", workers=2, **kw))
    assert one.by_status == two.by_status == {"done": 32}
    assert (two.ran, two.skipped, two.turns) == (32, 0, one.turns)
    a, b = _snapshot(tmp_path / "one"), _snapshot(tmp_path / "two")
    assert a["turns"] and a["judgments"] and a["usage"]
    assert a == b


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_litellm_is_warmed_up_once_before_forking_workers_and_never_for_spawned_ones(
        tmp_path, toy_file, monkeypatch, method):
    """litellm's first-call work (~0.4 s of CPU) is done by the process that forks, before it forks the
    workers, so that each of them inherits it; spawned workers inherit nothing, so nothing is warmed."""
    from sopgraph.simulation import runner as runner_mod

    monkeypatch.setattr(runner_mod, "_START_METHOD", method)
    forks: list[str] = []

    def warm() -> None:
        forks.append("warm")

    monkeypatch.setattr(runner_mod, "warm_up_litellm", warm)
    real_execute = runner_mod._execute_sharded

    async def execute(*args, **kwargs):
        forks.append("workers")
        return await real_execute(*args, **kwargs)

    monkeypatch.setattr(runner_mod, "_execute_sharded", execute)
    summary = asyncio.run(run(toy_file, toy_cases(4), ["agent=baseline/oracle"], tmp_path / "r", workers=2,
                              concurrency=2, max_turns=2, progress=False))
    assert summary.by_status == {"done": 4}
    assert forks == (["workers", "warm"] if method == "fork" else ["workers"])


def test_dead_worker_leaves_a_resumable_run(tmp_path, toy_file, monkeypatch):
    from sopgraph.simulation import runner as runner_mod

    monkeypatch.setattr(runner_mod, "_START_METHOD", "fork")  # the patch below reaches forked workers
    real_one = runner_mod._Dialogues.one

    async def dying_one(self, d, sink):
        if d.id == "k005#0":
            sink.start_dialogue(d.model_copy(update={"status": "running"}))
            sink.flush()  # a worker sends its writes in batches: this one reaches the parent before the kill
            os._exit(7)  # like an OOM kill, mid-dialogue
        return await real_one(self, d, sink)

    monkeypatch.setattr(runner_mod._Dialogues, "one", dying_one)
    cases = toy_cases(12)
    kw = {"concurrency": 2, "max_turns": 3, "progress": False}
    with pytest.raises(RunError, match=r"worker \d died \(exit code 7\).*--resume"):
        asyncio.run(run(toy_file, cases, ["agent=baseline/oracle"], tmp_path / "crashed", workers=2, **kw))
    with RunStore.open(tmp_path / "crashed") as s:
        assert s.dialogue("k005#0").status == "running"
    monkeypatch.setattr(runner_mod._Dialogues, "one", real_one)
    resumed = asyncio.run(run(None, None, None, tmp_path / "crashed", resume=True, workers=2, progress=False))
    assert resumed.by_status == {"done": 12} and resumed.skipped + resumed.ran == 12 and resumed.ran >= 1
    asyncio.run(run(toy_file, cases, ["agent=baseline/oracle"], tmp_path / "whole", **kw))
    assert _snapshot(tmp_path / "crashed") == _snapshot(tmp_path / "whole")


def test_worker_exception_is_reported_with_its_traceback(tmp_path, toy_file, monkeypatch):
    from sopgraph.simulation import runner as runner_mod

    monkeypatch.setattr(runner_mod, "_START_METHOD", "fork")
    real_one = runner_mod._Dialogues.one

    async def buggy_one(self, d, sink):
        if d.id == "k002#0":
            raise ValueError("a bug in the dialogue loop")
        return await real_one(self, d, sink)

    monkeypatch.setattr(runner_mod._Dialogues, "one", buggy_one)
    with pytest.raises(RunError, match=r"(?s)worker \d failed:.*ValueError: a bug in the dialogue loop"):
        asyncio.run(run(toy_file, toy_cases(6), ["agent=baseline/oracle"], tmp_path / "r", workers=2,
                        concurrency=2, max_turns=3, progress=False))
    with RunStore.open(tmp_path / "r") as s:
        statuses = Counter(d.status for d in s.dialogues())
    assert statuses["done"] >= 3 and sum(statuses.values()) == 6  # the other worker finished its share


def test_workers_reject_a_shared_gateway(tmp_path, toy_file):
    with pytest.raises(RunError, match="gateway instance"):
        asyncio.run(run(toy_file, toy_cases(2), ["agent=baseline/oracle"], tmp_path / "r", workers=2,
                        gateway=Gateway(cache=False)))
    with pytest.raises(RunError, match="workers must be"):
        asyncio.run(run(toy_file, toy_cases(2), ["agent=baseline/oracle"], tmp_path / "r", workers=0))


def test_in_own_loop_sets_up_the_loop_as_sops_own_processes_do() -> None:
    """`sop run`, `sop judge` and every worker process await their work through `in_own_loop`: the
    loop's default executor then prepares CPU-only model calls on the loop's thread."""
    from sopgraph.simulation.gateway import _INLINE_PREPARATION, InlinePreparationExecutor
    from sopgraph.simulation.runner import in_own_loop

    async def probe() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        token = _INLINE_PREPARATION.set(asyncio.current_task())
        try:
            marked = await loop.run_in_executor(None, threading.get_ident) == threading.get_ident()
        finally:
            _INLINE_PREPARATION.reset(token)
        unmarked = await loop.run_in_executor(None, threading.get_ident) == threading.get_ident()
        return marked, unmarked

    assert asyncio.run(in_own_loop(probe())) == (True, False)
    assert asyncio.run(probe()) == (False, False)  # a loop nobody set up: litellm's threads as usual
    assert issubclass(InlinePreparationExecutor, concurrent.futures.ThreadPoolExecutor)


# ----------------------------------------------------------------------------- judges lost to infrastructure

JUDGE_REPLY = {"labels": {"Want": "Money", "Angry": False, "Items": 2},
               "scores": {"linguistic": 6, "anthropomorphism": 6, "content_utility": 6, "satisfaction": 6,
                          "instruction": 6}}


def test_a_judge_outage_is_an_infra_failure_and_resume_judges_again(tmp_path, toy_file, monkeypatch):
    """Issue 29: with the judges' server down past the retries, every judgment was unscored, yet the run said
    "4/4 done, 0 failed", "infra failures 0", exit 0, and `--resume` ran nothing. Now the dialogues are
    infrastructure failures that keep their transcript, and `--resume` judges them without running them."""
    monkeypatch.setenv(KEY_ENV, KEY)
    judges_up = threading.Event()
    agent_calls: Counter = Counter()

    def responder(req):
        if "judge" in req.body["model"]:
            return Behavior.json_reply(JUDGE_REPLY) if judges_up.is_set() else Behavior.server_error(503)
        k, turn = who(req)
        agent_calls[k] += 1
        return Behavior.ok(planned_reply(k, turn))

    with FakeServer(lifetime=120) as server:
        server.responder(responder)
        judge = f"judge=openai/fake-judge,api_base={server.base_url},api_key_env={KEY_ENV}"
        out = tmp_path / "run"
        cases = write_cases(tmp_path / "cases.jsonl", toy_cases(4))
        runner = CliRunner()
        res = runner.invoke(main, ["run", str(toy_file), "--cases", str(cases), "--model", agent_spec(server),
                                   "--model", judge, "--retries", "1", "--retry-delay", "0.01", "--no-cache",
                                   "--progress", "always", "-o", str(out)])
        assert res.exit_code == 3, res.output
        assert "4/4 (100%) done, 4 failed" in res.stderr
        info = json.loads(runner.invoke(main, ["runs", "show", str(out), "--format", "json"]).output)
        assert info["by_status"] == {"infra_failure": 4} and len(info["infra_failures"]) == 4
        assert all(e["error"].startswith("judging: ") and "server_error after 2 attempts" in e["error"]
                   and "the transcript is kept" in e["error"] for e in info["infra_failures"])
        with RunStore.open(out) as store:
            turns = store.turns()
            assert turns and {t.dialogue_id for t in turns} == {f"k{k:03d}#0" for k in range(4)}
        calls = dict(agent_calls)
        # still down: resume judges again, fails again, says so
        res = runner.invoke(main, ["run", "--resume", str(out), "-q", "--format", "json"])
        assert res.exit_code == 3 and json.loads(res.output)["infra_failures"] == 4
        judges_up.set()
        res = runner.invoke(main, ["run", "--resume", str(out), "-q", "--format", "json"])
        assert res.exit_code == 0, res.output
        summary = json.loads(res.output)
        assert summary["ran"] == 4 and summary["by_status"] == {"done": 4} and summary["infra_failures"] == 0
        assert dict(agent_calls) == calls  # the dialogues were not run again
    with RunStore.open(out) as store:
        assert store.turns() == turns
        assert all(c.labels == JUDGE_REPLY["labels"] for c in store.consensus("default"))
        assert store.judging_counts("default")["unscored_judgments"] == 0
        judge_rows = store.conn.execute("SELECT discarded, COUNT(*) FROM usage WHERE role LIKE 'judge%'"
                                        " GROUP BY discarded").fetchall()
        assert dict(judge_rows)[0] == 3 * len(store.consensus("default"))  # one row per call that answered


def _stored_tokens(run_dir: Path) -> int:
    """Every token of the usage table, discarded attempts included (read without opening the store)."""
    import sqlite3

    db = run_dir / "run.sqlite"
    if not db.exists():
        return -1
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            return conn.execute("SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return -1


def test_calls_of_dialogues_open_at_sigkill_are_recorded(tmp_path, toy_file, monkeypatch):
    """Issue 29: after a kill -9 and a resume, the stored token total undercounted the server's by exactly
    the calls (mostly judge calls) of the dialogues that were not finished: their usage was written only
    with the turn or the dialogue's end. Here the server stops answering once some judge calls are served
    (the rest hang), the run is killed once nothing is moving, resumed, and the stored total (discarded
    attempts included) must equal the tokens the server served."""
    monkeypatch.setenv(KEY_ENV, KEY)
    cases_file = write_cases(tmp_path / "cases.jsonl", toy_cases(12))
    env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(ROOT)}
    lock = threading.Lock()
    served = Counter()
    gate_open = threading.Event()
    gate_open.set()

    def responder(req):
        judge = "judge" in req.body["model"]
        with lock:
            if not gate_open.is_set():
                return Behavior.timeout(600)  # never answered before the kill
            if judge:
                served["judge_calls"] += 1
                if served["judge_calls"] == 10:
                    gate_open.clear()  # the 10th judge call is the last one answered before the kill
            served["tokens"] += 13 + 5 if judge else 11 + 7
        if judge:
            return Behavior.json_reply(JUDGE_REPLY, prompt_tokens=13, completion_tokens=5)
        k, turn = who(req)
        return Behavior.ok(planned_reply(k, turn), prompt_tokens=11, completion_tokens=7)

    with FakeServer(lifetime=120) as server:
        server.responder(responder)
        judge = f"judge=openai/fake-judge,api_base={server.base_url},api_key_env={KEY_ENV}"
        out = tmp_path / "killed"
        proc = _cli(["run", str(toy_file), "--cases", str(cases_file), "--model", agent_spec(server), "--model", judge,
                     "--concurrency", "4", "--judge-turns", "all", "--no-cache", "-q", "-o", str(out)], env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            with lock:
                stalled, total = not gate_open.is_set(), served["tokens"]
            if stalled and _stored_tokens(out) == total:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with RunStore.open(out) as s:
            statuses = Counter(d.status for d in s.dialogues())
        assert statuses["running"] > 0, statuses  # killed with dialogues open
        with lock:
            at_kill = served["tokens"]
        assert _stored_tokens(out) == at_kill  # nothing served is missing from the store
        gate_open.set()
        summary = asyncio.run(run(None, None, None, out, resume=True, progress=False))
        assert summary.by_status == {"done": 12}, summary.infra_errors[:2]
        with lock:
            total = served["tokens"]
    with RunStore.open(out) as s:
        stored = _stored_tokens(out)
        discarded = s.summary()["discarded_tokens"]
    assert stored == total and discarded > 0, (stored, total, discarded)


def test_sop_judge_leaves_dialogues_whose_judges_were_unreachable_for_the_next_call(tmp_path, toy_file, monkeypatch):
    """`sop judge` stored the unscored judgments of an outage as the set's verdict, and a second `sop judge`
    skipped those dialogues. Now they are left out of the set (exit 3) and the next call judges them."""
    from sopgraph.simulation import runner as runner_mod

    out = tmp_path / "run"
    asyncio.run(run(toy_file, toy_cases(3), ["agent=baseline/oracle"], out, progress=False))
    up = threading.Event()
    monkeypatch.setattr(runner_mod, "_make_gateway", lambda concurrency, options: Gateway(
        concurrency=concurrency, max_retries=0, cache=False))
    with FakeServer(lifetime=60) as server:
        server.responder(lambda req: Behavior.json_reply(JUDGE_REPLY) if up.is_set() else Behavior.server_error(503))
        args = ["judge", str(out), "--model", f"judge=openai/judge-x,api_base={server.base_url}", "--set", "second",
                "-q", "--format", "json"]
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 3, res.output
        assert "3 dialogue(s) could not be judged (judges unreachable)" in res.stderr
        assert len(json.loads(res.stdout)["unjudged"]) == 3
        with RunStore.open(out) as store:
            assert store.consensus("second") == [] and store.judgments("second") == []
        up.set()
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["ran"] == 3
    with RunStore.open(out) as store:
        assert len(store.consensus("second")) == len(store.consensus("default"))
        assert store.judging_counts("second")["unscored_judgments"] == 0
