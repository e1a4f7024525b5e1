"""The run store: round trips, one-transaction restarts, streaming reads, secret redaction."""

from __future__ import annotations

import re
import sqlite3

import pytest

from sopgraph.records import AgentOutput, Case, Consensus, Dialogue, Judgment, Persona, Turn, Usage
from sopgraph.simulation.store import (
    REDACTED,
    STORE_FILE,
    RunStore,
    StoreError,
    is_secret_param,
    redact_params,
)


def _case(i: int) -> Case:
    return Case(sop_hash="h1", id=f"c{i}", scenario="toy", path_id="p", intent="x", persona=Persona(name="p"),
                truth={"A": "a"}, system={"S": 1}, expected_path=["s1"], expected_finals={"Action": "Go"})


def _turn(did: str, i: int, error: bool = False) -> Turn:
    out = None if error else AgentOutput(classification_output={"A": "a"}, now_path=["s1"],
                                         finals={"Action": "Go"}, chat=f"chat {i}")
    return Turn(sop_hash="h1", dialogue_id=did, index=i, user_text=f"u{i}", agent_raw="raw", output=out,
                format_error=error, latency_s=0.1, usage=Usage(prompt_tokens=3, completion_tokens=2, calls=1))


def _usage(did: str, i: int, role: str = "agent") -> dict:
    return {"dialogue_id": did, "turn_index": i, "role": role, "model": "m", "prompt_tokens": 3,
            "completion_tokens": 2, "cost": 0.5}


@pytest.fixture()
def store(tmp_path):
    s = RunStore.create(tmp_path / "run", {"sop_hash": "h1", "config": {"trials": 1}})
    s.add_cases([_case(1), _case(2)])
    s.add_dialogues([Dialogue(sop_hash="h1", id=f"c{i}#0", case_id=f"c{i}") for i in (1, 2)])
    yield s
    s.close()


def test_create_refuses_existing_and_open_refuses_non_run(tmp_path, store):
    with pytest.raises(StoreError, match="already holds a run"):
        RunStore.create(store.run_dir, {})
    with pytest.raises(StoreError, match="not a run directory"):
        RunStore.open(tmp_path / "nothing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / STORE_FILE).write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(StoreError):
        RunStore.open(tmp_path / "bad")


def test_open_on_a_directory_of_runs_says_to_name_one(store):
    """`sop score runs/` (the directory of runs, not a run) only said `runs is not a run directory`."""
    parent = store.run_dir.parent
    with pytest.raises(StoreError, match=re.escape(f"it holds 1 run (e.g. {store.run_dir}): name one of them")):
        RunStore.open(parent)
    with pytest.raises(StoreError, match=r"not a run directory \(no run\.sqlite\)$"):
        RunStore.open(store.run_dir / "nothing")  # no runs within: no hint


def test_wal_and_meta(store):
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    meta = store.meta()
    assert meta["sop_hash"] == "h1" and meta["config"] == {"trials": 1}
    assert meta["tool_version"] and meta["created"] and meta["schema_version"] == 1


def test_round_trip_in_order(store):
    assert [c.id for c in store.cases()] == ["c1", "c2"]
    d = store.dialogues()[0].model_copy(update={"status": "running"})
    store.start_dialogue(d)
    for i in (1, 2):
        store.add_turn(_turn(d.id, i, error=i == 1), [_usage(d.id, i)])
    j = Judgment(sop_hash="h1", dialogue_id=d.id, turn_index=2, judge="judge1", model="m", labels={"A": "a"},
                 scores={"linguistic": 9})
    k = Consensus(sop_hash="h1", dialogue_id=d.id, turn_index=2, labels={"A": "a"})
    done = d.model_copy(update={"status": "done", "end_reason": "ending_action", "turns": 2})
    store.finish_dialogue(done, [j], [k])
    assert [t.index for t in store.turns(d.id)] == [1, 2]
    assert store.turns(d.id)[0].format_error and store.turns(d.id)[1].output.chat == "chat 2"
    assert store.dialogues(status="done")[0] == done
    assert store.dialogues(status=["pending"])[0].id == "c2#0"
    assert store.judgments("default") == [j] and store.consensus() == [k]
    assert store.judgment_sets() == ["default"]
    assert list(store.iter_turn_dicts(status="done"))[1]["output"]["chat"] == "chat 2"
    assert [t.index for t in store.iter_turns(status="done", batch=1)] == [1, 2]
    assert list(store.iter_turns(status="pending")) == []
    summary = store.summary()
    assert summary["by_status"] == {"done": 1, "pending": 1}
    assert summary["turns"] == 2 and summary["format_errors"] == 1
    assert summary["usage"]["agent"]["calls"] == 2 and summary["tokens"] == 10
    # every row carries the hash, schema version and tool version
    for table in ("cases", "dialogues", "turns", "judgments", "consensus", "usage"):
        rows = store.conn.execute(f"SELECT sop_hash, schema_version, tool_version FROM {table}").fetchall()
        assert rows and all(r[0] == "h1" and r[1] == 1 and r[2] for r in rows), table


def test_restart_drops_partial_rows_in_one_transaction(store):
    d = store.dialogues()[0].model_copy(update={"status": "running"})
    store.start_dialogue(d)
    store.add_turn(_turn(d.id, 1), [_usage(d.id, 1)])
    store.add_turn(_turn(d.id, 2), [_usage(d.id, 2)])
    store.start_dialogue(d)  # a resume restarts it from scratch
    assert store.turns(d.id) == []
    assert store.usage_totals(include_discarded=False) == {}
    assert store.usage_totals()["agent"].calls == 2  # spent money stays visible
    assert store.conn.execute("SELECT attempts FROM dialogues WHERE id=?", (d.id,)).fetchone()[0] == 2
    store.add_turn(_turn(d.id, 1))
    failed = d.model_copy(update={"status": "infra_failure", "end_reason": "infra_failure",
                                  "error": "agent: rate_limit after 5 attempts"})
    store.fail_dialogue(failed)
    assert store.turns(d.id) == [] and store.dialogue(d.id).status == "infra_failure"
    assert store.summary()["infra_failures"] == [{"dialogue": d.id, "error": failed.error}]


def test_duplicate_turn_is_rejected_atomically(store):
    d = store.dialogues()[0]
    store.add_turn(_turn(d.id, 1), [_usage(d.id, 1)])
    with pytest.raises(sqlite3.IntegrityError):
        store.add_turn(_turn(d.id, 1), [_usage(d.id, 1)])
    assert store.conn.execute("SELECT COUNT(*) FROM usage").fetchone()[0] == 1  # rolled back together


def test_secret_params_are_redacted():
    assert is_secret_param("api_key") and is_secret_param("Authorization") and is_secret_param("x_token")
    assert not is_secret_param("max_tokens") and not is_secret_param("temperature")
    assert not is_secret_param("api_key_env", "OPENAI_API_KEY")
    assert is_secret_param("api_key_env", "sk-live-123456")
    spec = {"model": "openai/x", "params": {"api_base": "http://user:pw@host:8/v1?key=s3cret", "max_tokens": 5,
                                            "extra": {"api_key": "sk-abc", "secret_thing": "zzz",
                                                      "api_key_env": "MY_KEY", "top_p": 1}}}
    red = redact_params(spec)
    assert red["params"]["api_base"] == "http://host:8/v1"
    assert red["params"]["extra"] == {"api_key": REDACTED, "secret_thing": REDACTED, "api_key_env": "MY_KEY",
                                      "top_p": 1}
    assert red["params"]["max_tokens"] == 5


def test_errors_are_scrubbed_of_keys(store, monkeypatch):
    monkeypatch.setenv("SOPTEST_STORE_API_KEY", "sk-test-verysecretvalue")
    d = store.dialogues()[0].model_copy(update={"status": "infra_failure",
                                                "error": "auth failed for key sk-test-verysecretvalue"})
    store.fail_dialogue(d)
    assert "verysecret" not in store.dialogue(d.id).error


def test_iter_turns_streams_many_rows(store):
    d = store.dialogues()[0]
    rows = [_turn(d.id, i) for i in range(1, 2001)]
    with store.transaction() as c:
        c.executemany("INSERT INTO turns(dialogue_id, idx, format_error, data, schema_version, sop_hash, "
                      "tool_version) VALUES (?,?,?,?,1,'h1','t')",
                      [(t.dialogue_id, t.index, 0, t.model_dump_json()) for t in rows])
    it = store.iter_turns(batch=100)
    first = next(it)
    assert first.index == 1
    assert sum(1 for _ in it) == 1999


def test_stored_scenario_keeps_declaration_order(tmp_path):
    from sopgraph.logic.checker import load

    sc = load(text="""
scenario z "Z"
field Zeta: b | a
field Alpha: y | x
action Go "go"
stage s2 "two" { match Zeta { b -> do Go a -> s1 } }
stage s1 "one" { match Alpha { y, x -> do Go } }
""")
    with RunStore.create(tmp_path / "r", {"scenario": sc.model_dump(mode="json")}) as store:
        back = store.scenario()
    assert back == sc
    assert list(back.variables) == ["Zeta", "Alpha"] and list(back.stages) == ["s2", "s1"]
    assert back.fields[0].type.values == ["b", "a"]


def test_nested_transactions_commit_or_roll_back_as_one(store):
    d = store.dialogues()[0].model_copy(update={"status": "running"})
    with pytest.raises(sqlite3.IntegrityError), store.transaction():
        store.start_dialogue(d)
        store.add_turn(_turn(d.id, 1), [_usage(d.id, 1)])
        store.add_turn(_turn(d.id, 1))  # duplicate: the whole group is rolled back
    assert store.turns(d.id) == [] and store.dialogue(d.id).status == "pending"
    assert store.conn.execute("SELECT COUNT(*) FROM usage").fetchone()[0] == 0
    with store.transaction():
        store.start_dialogue(d)
        store.add_turn(_turn(d.id, 1), [_usage(d.id, 1)])
    assert [t.index for t in store.turns(d.id)] == [1] and store.dialogue(d.id).status == "running"


def test_group_commit_writes_in_order_once_per_group(store):
    """The runner's sink: writes are applied in order, committed together after MAX_DELAY or
    MAX_WRITES; until then another connection (a reader, or the file after a kill -9) sees none."""
    import asyncio

    from sopgraph.simulation.runner import GroupCommit

    d = store.dialogues()[0].model_copy(update={"status": "running"})
    reader = sqlite3.connect(store.path)

    def seen() -> int:
        return reader.execute("SELECT COUNT(*) FROM turns").fetchone()[0]

    async def go() -> list[int]:
        sink = GroupCommit(store)
        sink.start_dialogue(d)
        for i in (1, 2):
            sink.add_turn(_turn(d.id, i), iter([_usage(d.id, i)]))  # an iterator is read at once
        before = seen()
        await asyncio.sleep(GroupCommit.MAX_DELAY * 4)
        after_delay = seen()
        sink.finish_dialogue(d.model_copy(update={"status": "done", "turns": 2}))
        for i in range(GroupCommit.MAX_WRITES - 1):  # the 64th write commits the group at once
            sink.add_turn(_turn("c2#0", i))
        full = seen()
        sink.flush()
        return [before, after_delay, full]

    assert asyncio.run(go()) == [0, 2, 2 + 63]
    assert store.dialogue(d.id).status == "done" and store.usage_totals()["agent"].calls == 2
    reader.close()
