"""Environments (`--env python:MODULE:FACTORY`, simulation/environment.py): the shipped no-service phone,
tool agents acting on it, the online procedure-step scores and the end-state check, and bad environments."""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import sopgraph
from sopgraph.evaluation.score import ScoreConfig, ScoreError, dialogue_metric_values, score_run
from sopgraph.evaluation.traces import ProcedureScorer, step_session
from sopgraph.logic.session import Act, End, Need
from sopgraph.records import Case
from sopgraph.simulation.backend import Backend, BackendSpec
from sopgraph.simulation.environment import MAX_ANSWER_BYTES, EnvBackend, EnvError, EnvSpec
from sopgraph.simulation.gateway import InfraFailure
from sopgraph.simulation.runner import RunError, run_sync
from sopgraph.simulation.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
NO_SERVICE = ROOT / "examples" / "no_service.sop"
ENV = "python:examples.no_service_env:make"
sys.path.insert(0, str(ROOT))  # the example environment is imported as a module (examples/)

CASES: dict[str, Case] = {}  # case id → case, for the test agents below (they know the customer's facts)


@pytest.fixture(scope="module")
def scenario() -> sopgraph.Scenario:
    return sopgraph.load(NO_SERVICE)


@pytest.fixture(scope="module")
def cases(scenario) -> list[Case]:
    from sopgraph.cases.profiles import profile_for
    from sopgraph.cases.synth import plan, synthesize

    profile = profile_for(NO_SERVICE, scenario)
    every_path = len(plan(scenario, profile).paths)
    found = list(synthesize(scenario, profile, every_path, seed=3, min_per_path=1).cases)
    CASES.update({c.id: c for c in found})
    return found


# -- a Python agent that follows the procedure with the engine session (optionally skipping a step) ---------

def _history(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], Any]]:
    """The agent's earlier calls with their results, in order."""
    results = {m["tool_call_id"]: json.loads(m["content"]) for m in messages if m["role"] == "tool"}
    return [(c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"), results.get(c["id"]))
            for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]


def _follow(request: dict[str, Any], skip: str | None = None, pause: bool = False) -> dict[str, Any]:
    """Replay the session over the calls made so far, then make the next ones: a lookup per value the
    session needs (asked again within the turn), each action it takes; `skip`: never take that action;
    `pause`: end the first turn after the first step (the customer is asked to wait)."""
    from sopgraph.simulation.providers import names_value

    case = CASES[request["dialogue_id"].split("#")[0]]
    sc = sopgraph.load(NO_SERVICE)
    fields = {v.name for v in sc.fields}
    session = sopgraph.start(sc)
    history, known = _history(request["messages"]), request["context"]["system"]
    heard = [str(m.get("content") or "") for m in request["messages"] if m["role"] == "user"]
    asked = [str(m.get("content") or "") for m in request["messages"] if m["role"] == "assistant"]
    done, calls = 0, []
    while True:
        event = session.next()
        if isinstance(event, Need) and event.variable in fields:
            # the customer's facts come from the customer: asked for until named (twice at most)
            name = event.variable
            if any(names_value(t, name) for t in heard) or sum(names_value(t, name) for t in asked) >= 2:
                session.provide(name, case.truth.get(name))
                continue
            return {"reply": f"Could you tell me your {name}?", "tool_calls": calls}
        if isinstance(event, Need):
            if event.variable in known and event.look is None:
                session.provide(event.variable, known[event.variable])
            elif done < len(history):
                session.provide(event.variable, history[done][2]["value"])
                done += 1
            else:
                return {"reply": "", "tool_calls": [*calls, {"name": "lookup", "arguments": {"name": event.variable}}],
                        "continue": True}
        elif isinstance(event, Act):
            if event.action == skip:
                continue
            if done < len(history):
                done += 1
                continue
            calls.append({"name": event.action, "arguments": event.args})
            if event.final:
                return {"reply": "That is done.", "tool_calls": calls}
            if pause and all(name == "lookup" for name, _, _ in history):
                return {"reply": "One moment, please.", "tool_calls": calls}
        else:
            assert isinstance(event, End)
            return {"reply": "That is done.", "tool_calls": calls}


def follower(request: dict[str, Any]) -> dict[str, Any]:
    return _follow(request, pause=True)


def skips_restart(request: dict[str, Any]) -> dict[str, Any]:
    return _follow(request, skip="AskRestart")


def _run(scenario, cases, agent: str, out: Path, env: str | None = ENV) -> Any:
    if not out.exists():
        summary = run_sync(scenario, cases, [f"agent={agent}"], str(out), progress=False, env=env)
        assert summary.infra_failures == 0
    return score_run(out, ScoreConfig(bootstrap=0))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Where the module's runs against the phone are kept (each made once: `oracle`, `skip`)."""
    return tmp_path_factory.mktemp("env-runs")


def _metrics(run) -> dict[str, Any]:
    group = next(g for g in run.summary().groups if g.by == ["model", "scenario"])
    return {k: (m.value, m.n) for k, m in group.metrics.items() if m is not None}


ALL_100 = ("path", "action", "finals", "pass_rate", "trace_precision", "trace_recall", "trace_order",
           "journey_coverage", "tau2_pass", "step_recall", "step_precision", "step_order", "steps_followed",
           "end_state")


def test_oracle_tools_against_the_environment_scores_100_with_end_state_match(scenario, cases, runs) -> None:
    run = _run(scenario, cases, "baseline/oracle-tools", runs / "oracle")
    m = _metrics(run)
    D = len(cases)
    for name in ALL_100:
        assert m[name] == (1.0, m[name][1]) and m[name][1] > 0, name
    assert m["end_state"][1] == D and m["step_recall"][1] == D  # defined on every dialogue
    assert m["first_divergence"][1] == 0 and all(d is None for d in run.d_divergence)
    assert RunStore.open(runs / "oracle", read_only=True).meta()["config"]["env"] == ENV


def test_a_procedure_follower_is_not_scored_on_its_steps_as_answers(scenario, cases, tmp_path) -> None:
    """The follower stops its first turn after the first step: that turn is pending (not a wrong answer)."""
    run = _run(scenario, cases, f"python:{__name__}:follower", tmp_path / "follow")
    m = _metrics(run)
    for name in ALL_100:
        assert m[name][0] == 1.0, name
    assert run.counts["pending_turns"] > 0


def test_an_agent_that_skips_a_step_is_caught_exactly_on_the_cases_that_need_it(scenario, cases, runs) -> None:
    run = _run(scenario, cases, f"python:{__name__}:skips_restart", runs / "skip")
    values = dialogue_metric_values(run)
    scorer = ProcedureScorer(scenario, EnvSpec.load(ENV, scenario), lambda a, b: a == b)
    needing = caught = 0
    for d, dialogue in enumerate(run.dialogues):
        ref = scorer.reference(CASES[dialogue.case_id])
        names = [c["name"] for c in ref]
        divergence = run.d_divergence[d]
        if "AskRestart" in names:
            needing += 1
            step = names.index("AskRestart") + 1
            assert divergence is not None and divergence["step"] == step, dialogue.id
            assert divergence["expected"] == {"name": "AskRestart", "args": {}}
            assert divergence["done"] is None or divergence["done"]["name"] != "AskRestart"
            assert values["steps_followed"][d] == 0 and values["first_divergence"][d] == step
            assert values["step_recall"][d] < 1 and values["end_state"][d] == 0
            caught += 1
        else:
            assert divergence is None, dialogue.id
            for name in ("step_recall", "step_precision", "step_order", "steps_followed", "end_state", "tau2_pass"):
                assert values[name][d] == 1.0, (dialogue.id, name)
    assert 0 < needing == caught < len(run.dialogues)


def test_without_env_the_run_config_is_as_before_and_skips_are_caught_on_the_scripted_backend(
        scenario, cases, tmp_path) -> None:
    run = _run(scenario, cases, f"python:{__name__}:skips_restart", tmp_path / "scripted", env=None)
    assert "env" not in RunStore.open(tmp_path / "scripted", read_only=True).meta()["config"]
    values = dialogue_metric_values(run)
    for d, dialogue in enumerate(run.dialogues):
        needs = any(a["name"] == "AskRestart" for a in CASES[dialogue.case_id].expected_actions or ())
        assert (run.d_divergence[d] is not None) == needs, dialogue.id
        assert values["end_state"][d] != values["end_state"][d]  # NaN: no environment, no end state


class _Recorded:
    """A backend that logs every call and its result (what an agent would be told)."""

    def __init__(self, backend: Backend):
        self.backend, self.spec, self.log = backend, backend.spec, []

    def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        result = self.backend.call(name, args)
        self.log.append((name, args, result))
        return result


def test_env_backend_answers_like_the_scripted_backend_along_the_procedure(scenario, cases) -> None:
    """An agent following the procedure cannot tell the phone from the case's script: the session stepped
    against either is told the same values and takes the case's steps."""
    spec, env = BackendSpec.of(scenario), EnvSpec.load(ENV, scenario)
    for case in cases:
        scripted = _Recorded(Backend.for_case(spec, case))
        world = _Recorded(EnvBackend.with_env(spec, case, env.for_case(case)))
        a, _ = step_session(scenario, case.truth, scripted, None, lambda x, y: x == y)
        b, _ = step_session(scenario, case.truth, world, None, lambda x, y: x == y)
        assert a == b == case.expected_actions and scripted.log == world.log, case.id


def test_score_compare_report_and_view_show_the_procedure_steps(scenario, cases, runs) -> None:
    from click.testing import CliRunner

    from sopgraph.cli import main
    from sopgraph.evaluation.view import serve

    oracle = _run(scenario, cases, "baseline/oracle-tools", runs / "oracle")
    skip = _run(scenario, cases, f"python:{__name__}:skips_restart", runs / "skip")
    left = {skip.dialogues[d].id: skip.divergence_text(d) for d in range(len(skip.dialogues))
            if skip.d_divergence[d] is not None}
    assert left and all(text and text.startswith("step ") and "expected AskRestart()" in text for text in left.values())
    cli = CliRunner()
    res = cli.invoke(main, ["score", str(runs / "skip")])
    assert res.exit_code == 0 and "procedure steps against the online reference" in res.output
    res = cli.invoke(main, ["score", str(runs / "skip"), "--format", "json"])
    group = next(g for g in json.loads(res.output)["groups"] if g["by"] == ["model", "scenario"])
    assert group["metrics"]["steps_followed"]["value"] == pytest.approx(1 - len(left) / len(cases))
    for level in ("dialogue", "turn"):
        res = cli.invoke(main, ["score", str(runs / "skip"), "--level", level, "--format", "json"])
        rows = [json.loads(line) for line in res.output.splitlines()]
        shown = {r["dialogue_id"]: r["divergence"] for r in rows if r.get("divergence")}
        assert shown == left, level
    res = cli.invoke(main, ["score", str(runs / "skip"), "--level", "case", "--format", "csv"])
    assert res.exit_code == 0 and "steps_followed" in res.output.splitlines()[0]
    res = cli.invoke(main, ["compare", str(runs / "oracle"), str(runs / "skip"), "--format", "json"])
    result = json.loads(res.output)
    assert {f["case_id"] + "#0" for f in result["steps_flipped"]} == set(left)
    assert all(f["a_followed"] and f["b_divergence"] == left[f["case_id"] + "#0"] for f in result["steps_flipped"])
    assert result["metrics"]["end_state"]["a"] == 1.0 > result["metrics"]["end_state"]["b"]
    res = cli.invoke(main, ["compare", str(runs / "oracle"), str(runs / "skip")])
    assert "procedure steps flipped" in res.output
    res = cli.invoke(main, ["report", str(runs / "oracle"), str(runs / "skip"), "-o", str(runs / "report.html")])
    html = (runs / "report.html").read_text()
    assert res.exit_code == 0 and '<section id="steps">' in html and "1st divergence (step)" in html
    assert "left the procedure at step " in html  # on the dialogue pages of the examples that left it
    assert oracle.d_divergence == [None] * len(cases)
    srv = serve([runs]).start()
    try:
        import urllib.request
        from urllib.parse import quote

        def get(path: str) -> Any:
            with urllib.request.urlopen(srv.url.rstrip("/") + path, timeout=60) as r:
                return json.loads(r.read())

        page = get("/api/runs/skip/dialogues?failure=left_procedure&limit=100")
        assert {r["id"] for r in page["rows"]} == set(left)
        one = next(iter(left))
        assert get(f"/api/runs/skip/dialogues/{quote(one, safe='')}")["divergence"] == left[one]
        assert get("/api/runs/oracle/dialogues?failure=left_procedure")["matched"] == 0
    finally:
        srv.close()


# -- bad environments ---------------------------------------------------------------------------------------

class _Phone:
    def __init__(self, answer: Any = True, fail: str | None = None):
        self.answer, self.fail = answer, fail

    def observe(self, name: str) -> Any:
        if self.fail == "observe":
            raise KeyError(name)
        return self.answer if name == "ServiceRestored" else {"Registered": "Home", "OutageHours": 0,
                                                               "SimAgeYears": 1}.get(name, False)

    def state(self) -> dict[str, Any]:
        return {}

    def __getattr__(self, action: str) -> Any:
        if action.startswith("__") or action in ("answer", "fail"):
            raise AttributeError(action)
        if self.fail == "act":
            return lambda **_: 1 / 0
        return lambda **_: None


class _NoActions:
    def observe(self, name: str) -> Any:
        return None

    def state(self) -> dict[str, Any]:
        return {}


def no_actions(system: dict[str, Any], seed: int) -> _NoActions:
    return _NoActions()


def raising_factory(system: dict[str, Any], seed: int) -> Any:
    raise ValueError("no phone today")


def off_domain(system: dict[str, Any], seed: int) -> _Phone:
    return _Phone(answer="maybe")


def huge_answer(system: dict[str, Any], seed: int) -> _Phone:
    return _Phone(answer="x" * (MAX_ANSWER_BYTES + 1))


_STUCK = threading.Event()


class _Stuck(_Phone):
    def observe(self, name: str) -> Any:
        _STUCK.wait()  # until the test lets it go: a call that does not return
        return False


def stuck(system: dict[str, Any], seed: int) -> _Phone:
    return _Stuck()


def raising_action(system: dict[str, Any], seed: int) -> _Phone:
    return _Phone(fail="act")


def test_an_environment_that_does_not_load_or_lacks_a_method_is_refused_before_the_run(
        scenario, cases, tmp_path) -> None:
    for env, said in (("python:no_such_module_env_x:make", "cannot load no_such_module_env_x:make"),
                      ("examples.no_service_env:make", "expected python:MODULE:FACTORY"),
                      (f"python:{__name__}:no_actions", "_NoActions has no method ExplainPayment"),
                      (f"python:{__name__}:raising_factory", "raised ValueError: no phone today (at test_environment.py")):
        with pytest.raises(RunError, match=None) as info:
            run_sync(scenario, cases[:1], ["agent=baseline/oracle-tools"], str(tmp_path / "bad"), progress=False,
                     env=env)
        assert said in str(info.value)
        assert not (tmp_path / "bad").exists()
    with pytest.raises(RunError, match="does not act through tools"):
        run_sync(scenario, cases[:1], ["agent=baseline/oracle"], str(tmp_path / "sage"), progress=False, env=ENV)


def test_an_environment_that_fails_or_answers_badly_is_an_infrastructure_failure(scenario, cases) -> None:
    spec = BackendSpec.of(scenario)
    case = cases[0]
    for factory, said in (("off_domain", "answered outside the domain"), ("huge_answer", "over the 65536 allowed"),
                          ("raising_action", "ExplainPayment() raised ZeroDivisionError")):
        env = EnvSpec.load(f"python:{__name__}:{factory}", scenario)
        world = EnvBackend.with_env(spec, case, env.for_case(case))
        with pytest.raises(InfraFailure) as info:
            world.call("lookup", {"name": "ServiceRestored"})
            world.call("ExplainPayment", {})
        assert said in info.value.message and info.value.kind == "environment"
    env = dataclasses.replace(EnvSpec.load(f"python:{__name__}:stuck", scenario), timeout=0.05)
    world = EnvBackend.with_env(spec, case, env.for_case(case))
    try:
        with pytest.raises(InfraFailure, match=r"observe\('ServiceRestored'\) did not return within 0.05 s"):
            world.call("lookup", {"name": "ServiceRestored"})
    finally:
        _STUCK.set()
    env = EnvSpec.load(f"python:{__name__}:raising_action", scenario)
    with pytest.raises(EnvError, match="raised ZeroDivisionError"):
        ProcedureScorer(scenario, env, lambda a, b: a == b).reference(
            next(c for c in cases if c.expected_actions and c.expected_actions[0]["name"] == "ExplainPayment"))


def test_a_dialogue_on_a_failing_environment_is_an_infra_failure_and_scoring_says_why(
        scenario, cases, tmp_path) -> None:
    summary = run_sync(scenario, cases[:2], ["agent=baseline/oracle-tools"], str(tmp_path / "r"), progress=False,
                       env=f"python:{__name__}:raising_action")
    assert summary.infra_failures == 2
    dialogues = RunStore.open(tmp_path / "r", read_only=True).dialogues()
    assert all("raised ZeroDivisionError" in (d.error or "") for d in dialogues)
    store = RunStore.open(tmp_path / "r")
    store.set_meta("config", {**store.meta()["config"], "env": "python:no_such_module_env_x:make"})
    store.close()
    with pytest.raises(ScoreError, match="the run's environment does not load"):
        score_run(tmp_path / "r")


def test_cli_run_with_a_bad_env_prints_one_line_and_no_traceback(cases, tmp_path) -> None:
    from click.testing import CliRunner

    from sopgraph.cli import main

    cases_file = tmp_path / "cases.jsonl"
    cases_file.write_text(cases[0].model_dump_json() + "\n")
    res = CliRunner().invoke(main, ["run", str(NO_SERVICE), "--cases", str(cases_file), "--model",
                                    "agent=baseline/oracle-tools", "--env", "python:no_such_module_env_x:make",
                                    "-o", str(tmp_path / "r")])
    assert res.exit_code == 1, res.output
    assert "cannot load no_such_module_env_x:make" in res.output and res.exception is None or isinstance(
        res.exception, SystemExit)
    assert not (tmp_path / "r").exists()


def test_the_phone_of_the_tutorial_reacts_to_what_is_done() -> None:
    """docs/tutorial-environment.md, step 1: a restart without fresh settings for the phone's network
    changes nothing; fresh settings, then a restart, clear the stale fault."""
    from examples.no_service_env import make

    phone = make({"AirplaneMode": True, "SimDetected": True, "Registered": "Home",
                  "ServiceRestored": [False, False, True]}, 0)
    seen = [phone.observe("ServiceRestored")]
    phone.AskAirplaneOff()
    seen.append(phone.observe("ServiceRestored"))
    phone.AskRestart()
    seen.append(phone.observe("ServiceRestored"))
    phone.PushSettings(profile="Roaming")
    phone.AskRestart()
    seen.append(phone.observe("ServiceRestored"))
    phone.PushSettings(profile="Home")
    phone.AskRestart()
    seen.append(phone.observe("ServiceRestored"))
    assert seen == [False, False, False, False, True]
    assert phone.state()["done"] == ["airplane off", "restart", "settings Roaming", "restart", "settings Home",
                                     "restart"]


def test_sop_eval_takes_an_environment_and_gates_on_the_step_scores(tmp_path) -> None:
    from click.testing import CliRunner

    from sopgraph.cli import main

    args = ["eval", str(NO_SERVICE), "--model", "agent=baseline/oracle-tools", "-n", "4", "--seed", "2",
            "-o", str(tmp_path / "e"), "-q", "--env", ENV]
    res = CliRunner().invoke(main, [*args, "--fail-under", "steps_followed=100", "--fail-under", "end_state=100"])
    assert res.exit_code == 0, res.output
    assert "gate: 2/2 checks passed" in res.stderr
    assert json.loads((tmp_path / "e" / "eval.json").read_text())["env"] == ENV
    other = CliRunner().invoke(main, [*args[:-1], "python:examples.no_service_env:other"])
    assert other.exit_code != 0 and "env" in other.output + other.stderr


def test_worker_processes_act_on_the_environment_too(scenario, cases, tmp_path) -> None:
    """`--workers 2`: the environment travels to the worker processes by name (its module is imported there)."""
    good = run_sync(scenario, cases[:4], ["agent=baseline/oracle-tools"], str(tmp_path / "good"), progress=False,
                    env=ENV, workers=2, concurrency=2)
    assert good.infra_failures == 0
    scored = score_run(tmp_path / "good", ScoreConfig(bootstrap=0))
    assert list(scored.d_trace["end_state"]) == [1.0] * 4
    bad = run_sync(scenario, cases[:4], ["agent=baseline/oracle-tools"], str(tmp_path / "bad"), progress=False,
                   env=f"python:{__name__}:raising_action", workers=2, concurrency=2)
    assert bad.infra_failures == 4
