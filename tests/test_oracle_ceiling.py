"""The oracles are ceilings: `baseline/oracle` and `baseline/oracle-tools` score 100 on every metric on
every shipped scenario and example (issue 30 item 5).

Why: an agent at 100 is the proof that a metric measures the SOP and nothing else; a "ceiling" at 90 on a
procedure made every other number unreadable (the oracle jumped to the ending action without asking). The
oracles know the case truth but act through the agent's channels: they ask the customer, look system values
up and read their tool results, stepping the engine session (simulation/providers.py).

The metrics are read from the registry, so one added later is covered at once: each must be at its best
(100 for `higher`, 0 for `lower`) or not apply (no unit to average, never a 0 standing in for "n/a").
Left out, with the reason: `better = neither` (lengths, token counts: not scores) and what the scripted
judge's fixed chat score decides (`chat` and what derives from it: the judge gives 6/9 on purpose,
providers.SCRIPTED_CHAT_SCORE). Every turn counts, also the SAGE oracle's asking turns: the scripted judge
labels only what the customer has said, so the reference of a turn where the SOP still needs a value is
the stages passed so far with no action yet (score.UNSHOWN), which is what the oracle reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sopgraph
from sopgraph.cases.profiles import profile_for
from sopgraph.cases.synth import plan, synthesize
from sopgraph.evaluation.metrics import MetricDef, registered
from sopgraph.evaluation.score import GroupScore, ScoreConfig, score_run
from sopgraph.records import Case
from sopgraph.simulation.runner import run_sync

ROOT = Path(__file__).resolve().parent.parent
SOPS = sorted((ROOT / "scenarios").glob("*.sop")) + sorted(
    p for p in (ROOT / "examples").rglob("*.sop") if "common" not in p.parts)  # common/: included, not run
ORACLES = ("baseline/oracle", "baseline/oracle-tools")
CASES_PER_FILE = 5
CHAT_JUDGED = frozenset({"chat", "overall", "overall_turn"})
"""Decided by the scripted judge's fixed chat score, not by the agent."""


def pick_cases(cases: list[Case], k: int) -> list[Case]:
    """Up to `k` cases covering the shapes of the paths: the shortest (ends early), the longest (loops,
    subflows), one through a loop if any, then one per final Action, then the rest in order."""
    chosen: list[Case] = []

    def add(case: Case | None) -> None:
        if case is not None and case not in chosen and len(chosen) < k:
            chosen.append(case)

    add(min(cases, key=lambda c: len(c.expected_path)))
    add(max(cases, key=lambda c: len(c.expected_path)))
    add(next((c for c in cases if len(set(c.expected_path)) < len(c.expected_path)), None))
    seen = {c.expected_finals.get("Action") for c in chosen}
    for case in cases:
        if case.expected_finals.get("Action") not in seen:
            seen.add(case.expected_finals.get("Action"))
            add(case)
    for case in cases:
        add(case)
    return chosen


@pytest.fixture(scope="module", params=SOPS, ids=lambda p: str(p.relative_to(ROOT).with_suffix("")))
def procedure(request: pytest.FixtureRequest) -> tuple[object, list[Case]]:
    sop: Path = request.param
    scenario = sopgraph.load(sop)
    profile = profile_for(sop, scenario)
    every_path = len(plan(scenario, profile).paths)
    cases = synthesize(scenario, profile, max(every_path, CASES_PER_FILE), seed=3, min_per_path=1).cases
    return scenario, pick_cases(list(cases), CASES_PER_FILE)


def _off_ceiling(metric: MetricDef, group: GroupScore) -> str | None:
    """Why `metric` is not at its best in `group` (None: it is, or it does not apply)."""
    m = group.metrics.get(metric.name)
    if m is None or m.value is None:  # a derived metric counts the units of another (`n_from`)
        return None if m is None or m.n == 0 or not metric.base else f"{metric.name}: no value over {m.n} units"
    if m.n == 0 and metric.base:
        return f"{metric.name}: {m.value} over no unit (n/a must be reported as no value)"
    best = 1.0 if metric.better == "higher" else 0.0
    return None if abs(m.value - best) < 1e-9 else f"{metric.name} = {m.value:.4g} (n={m.n})"


@pytest.mark.parametrize("agent", ORACLES)
def test_oracles_score_100_on_every_metric(procedure: tuple[object, list[Case]], agent: str, tmp_path: Path
                                           ) -> None:
    scenario, cases = procedure
    out = tmp_path / "run"
    run_sync(scenario, cases, [f"agent={agent}"], str(out), trials=1, progress=False)
    run = score_run(out, ScoreConfig(bootstrap=0))
    assert run.counts["done"] == len(cases) and run.counts["format_errors"] == 0, run.counts
    assert run.counts["judged_turns"] > 0
    overall = next(g for g in run.aggregate(["model"]))
    sage = agent == "baseline/oracle"
    off = []
    for group in [overall, *run.aggregate(["depth"])]:  # every turn depth (1, 5, 10, 15, final) too
        for metric in registered():
            if metric.better == "neither" or metric.name in CHAT_JUDGED:
                continue
            why = _off_ceiling(metric, group)
            if why is not None:
                off.append(f"{group.key.get('depth', 'all')}: {why}")
    trials = {"pass^k": overall.pass_k, "tau2 pass^k": overall.tau2_pass_k,
              "pass majority": [overall.pass_majority], "tau2 pass majority": [overall.tau2_pass_majority]}
    off += [f"{name} = {m.value}" for name, ms in trials.items() for m in ms if m is not None and m.value != 1.0]
    assert overall.pass_k and overall.tau2_pass_k
    # these always apply (a tool agent reports no labels: its classification is the judges' alone, n/a)
    for name in ("classification", "action", "finals", "trace_recall", "tau2_pass")[0 if sage else 1:]:
        assert overall.metrics[name].n > 0, name
    assert not off, f"{agent} is not a ceiling: {off}"


SECURITY = """\
scenario account_unlock "Account unlock"
    "An agent unlocks a caller's account once the caller has answered the security question; two wrong answers lock it."
{
    domain "banking"
    language "en"
}

field Request: Unlock | Other
    "What the caller wants. Unlock = get back into a locked account; Other = anything else."

system AnswerCorrect: bool
    "True when the caller's answer to the security question is right. Looked up after each question."

action AskSecurityQuestion "Ask the caller the security question."
action UnlockAccount "Unlock the account." [ends_dialogue]
action LockAccount "Lock the account for 24 hours after two wrong answers." [ends_dialogue]
action Explain "Explain what the agent can help with." [ends_dialogue]

stage intake "Intake" {
    classify Request
    when Request == Unlock -> do AskSecurityQuestion -> verify
    otherwise -> do Explain
}

stage verify "Check the answer" {
    observe AnswerCorrect
    when AnswerCorrect -> do UnlockAccount
    otherwise -> again
}

stage again "Ask once more" {
    -> do AskSecurityQuestion -> verify up to 1 times
    otherwise -> do LockAccount
}
"""
"""The issue's shape: a security question asked as a step, its answer looked at after each asking, two
wrong answers lock the account (the oracle used to report the ending action without asking)."""


def test_the_tool_oracle_asks_the_question_and_reads_each_answer_before_it_acts(tmp_path: Path) -> None:
    import json

    from sopgraph.cases.profiles import default_profile
    from sopgraph.simulation.store import RunStore

    path = tmp_path / "account_unlock.sop"
    path.write_text(SECURITY, encoding="utf-8")
    scenario = sopgraph.load(path)
    cases = list(synthesize(scenario, default_profile(scenario), 4, seed=1, min_per_path=1).cases)
    locked = [c for c in cases if c.expected_finals.get("Action") == "LockAccount"]
    assert locked and [a["name"] for a in locked[0].expected_actions or []] == [
        "AskSecurityQuestion", "AskSecurityQuestion", "LockAccount"]
    for agent in ORACLES:
        out = tmp_path / agent.replace("/", "-")
        run_sync(scenario, cases, [f"agent={agent}"], str(out), trials=1, progress=False)
        run = score_run(out, ScoreConfig(bootstrap=0))
        overall = next(g for g in run.aggregate(["model"]))
        off = [why for m in registered() if m.better != "neither" and m.name not in CHAT_JUDGED
               for why in [_off_ceiling(m, overall)] if why is not None]
        assert not off, (agent, off)
    with RunStore.open(tmp_path / "baseline-oracle-tools") as store:
        turns = [t for t in store.turns() if t.dialogue_id == f"{locked[0].id}#0"]
    rounds = [r for t in turns for r in json.loads(t.agent_raw)]
    acted = [[c["name"] for c in r["tool_calls"]] for r in rounds if r["tool_calls"]]
    # each question is its own answer: the next step waits for the look its result reports
    assert [names for names in acted if "lookup" not in names] == [
        ["AskSecurityQuestion"], ["AskSecurityQuestion"], ["LockAccount"]]
    reported = [r["results"][0].get("observed") for r in rounds if r["tool_calls"]
                and r["tool_calls"][0]["name"] == "AskSecurityQuestion"]
    assert reported == [{"AnswerCorrect": False}, {"AnswerCorrect": False}]


# --------------------------------------------------------------------------- edge shapes, every turn judged
REFUND_OR_ASK = """\
scenario refund_check "Refund check"
    "An agent refunds a duplicate charge at once, any other request after asking why the customer wants it back."
{
    domain "ecommerce"
    language "en"
}

field Request: Duplicate | Other
    "What the customer reports. Duplicate = charged twice for one order; Other = any other refund request."

field Reason: Damaged | ChangedMind
    "Why the customer wants the money back. Damaged = the item arrived broken; ChangedMind = no longer wanted."

action Refund "Refund the order." [ends_dialogue]
action Decline "Decline the refund and explain the return policy." [ends_dialogue]

stage intake "Intake" {
    classify Request
    when Request == Duplicate -> do Refund
    otherwise -> reason
}

stage reason "Reason" {
    classify Reason
    when Reason == Damaged -> do Refund
    otherwise -> do Decline
}
"""
"""A stage passed while the SOP waits (`intake`, waiting at `reason` for the Reason) can itself do the
case's final action (`Refund`): a SAGE reply heading for Refund cannot state `intake` without having
refunded (`dialogue.acts`), so the oracle states the path short of it, and the reference of that turn must
agree (`score._against_waiting`); it used to keep `intake` (path 0 on the turn)."""

CARD_UNBLOCK = """\
scenario card_unblock "Card unblock"
    "An agent unblocks a card unless the fraud team has flagged the account; a flagged account goes to a specialist."
{
    domain "banking"
    language "en"
}

field Request: Unblock | Other
    "What the caller wants. Unblock = use a blocked card again; Other = anything else."

system CardActive: bool
    "Whether the card exists and is not cancelled."

system FraudFlag: bool hidden
    "Set by the fraud team on a suspicious account; not in the agent's prompt, the caller has been told."

action UnblockCard "Unblock the card." [ends_dialogue]
action TransferSpecialist "Hand the caller to a fraud specialist." [escalation]
action Reissue "Offer a new card." [ends_dialogue]
action Explain "Explain what the agent can help with." [ends_dialogue]

stage intake "Intake" {
    classify Request
    when Request == Unblock -> card
    otherwise -> do Explain
}

stage card "Card state" {
    when CardActive -> fraud
    otherwise -> do Reissue
}

stage fraud "Fraud check" {
    when FraudFlag -> do TransferSpecialist
    otherwise -> do UnblockCard
}
"""
"""A hidden system value read mid-procedure, which the customer knows (`user_knows`) and the agent must ask
for: until the customer names it the oracles wait at `fraud`, and so must the reference of the turn."""

EDGES = {"refund_check": (REFUND_OR_ASK, ()), "card_unblock": (CARD_UNBLOCK, ("FraudFlag",))}
HIDDEN_NOT_TURN_AWARE = pytest.mark.xfail(strict=True, reason=(
    "open: the judges label the fields only, so nothing tells the scorer on which turn the customer gave a hidden "
    "value; the reference takes it from the system state from turn 1 while the oracles ask for it first"))


@pytest.mark.parametrize("name", [pytest.param(n, marks=HIDDEN_NOT_TURN_AWARE) if n == "card_unblock" else n
                                  for n in sorted(EDGES)])
def test_oracles_are_ceilings_on_every_turn_of_the_edge_shapes(name: str, tmp_path: Path) -> None:
    """Every turn judged and scored (not only SAGE's 1, 5, 10, 15 and final), both oracles, every metric."""
    from sopgraph.cases.profiles import default_profile

    text, known = EDGES[name]
    path = tmp_path / f"{name}.sop"
    path.write_text(text, encoding="utf-8")
    scenario = sopgraph.load(path)
    profile = default_profile(scenario)
    profile = profile.model_copy(update={"user_knows": {**profile.user_knows, **dict.fromkeys(known, True)}})
    cases = list(synthesize(scenario, profile, 6, seed=1, min_per_path=1).cases)
    waited = 0
    for agent in ORACLES:
        out = tmp_path / agent.replace("/", "-")
        run_sync(scenario, cases, [f"agent={agent}"], str(out), trials=1, progress=False, judge_turns="all")
        run = score_run(out, ScoreConfig(bootstrap=0, turns="all"))
        assert run.counts["done"] == len(cases) and run.counts["format_errors"] == 0, run.counts
        off = [f"{g.key.get('depth', 'all')}: {why}" for g in [next(iter(run.aggregate(["model"]))),
                                                             *run.aggregate(["depth"])]
               for m in registered() if m.better != "neither" and m.name not in CHAT_JUDGED
               for why in [_off_ceiling(m, g)] if why is not None]
        assert not off, (agent, off)
        waited += sum(1 for r in run.t_ref.tolist() if r >= 0 and run.refs[r].pending and run.refs[r].path)
    assert waited  # the shape is exercised: turns waiting after passing a stage
