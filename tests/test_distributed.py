"""`sop run --ray`: the same stored answers as a local run, on a real 2-node cluster shape, and a node
lost mid-run costs nothing (0 lost, 0 duplicated).

The cluster (`ray.cluster_utils.Cluster`: a head and one worker node, 1 CPU and an 80 MB object store
each, no dashboard, everything on 127.0.0.1) is started once for the module (~15-25 s on two cores)
and always shut down by the fixture's finalizer. The runs join it by address, as `--ray HOST:PORT`
joins a real cluster. The node-loss test removes the worker node, so it runs last.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakeserver import Behavior, FakeServer
from helpers import done_dialogues
from hypothesis import given
from hypothesis import strategies as st
from test_runner import _snapshot as snapshot
from test_runner import toy_cases, write_cases

from sopgraph.cli import main
from sopgraph.simulation.distributed import NodeRates, batched
from sopgraph.simulation.runner import run_sync
from sopgraph.simulation.store import RunStore

TOY = (Path(__file__).parent / "data" / "toy_refunds.sop").read_text()
KEY_ENV = "SOPTEST_RAY_FAKE_KEY"
WORKER_KEY = "sk-test-ray-worker-node"  # the worker node's key: the fake server tells its requests apart
NO_RAY = "Ray is not installed (pip install 'sopgraph[ray]'): the cluster tests need it"


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sop") / "toy.sop"
    path.write_text(TOY, encoding="utf-8")
    return path


def score_json(run_dir: Path) -> dict:
    res = CliRunner().invoke(main, ["score", str(run_dir), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    out.pop("run", None)  # the run directory's name
    return out


@given(st.lists(st.integers(), max_size=40), st.integers(min_value=1, max_value=12))
def test_batches_keep_every_item_once_in_order_and_only_the_last_is_short(items, size):
    chunks = list(batched(iter(items), size))  # lazily from an iterator: the driver never lists the run
    assert [x for chunk in chunks for x in chunk] == items
    assert all(len(c) == size for c in chunks[:-1]) and all(1 <= len(c) <= size for c in chunks)


def test_node_rates_name_each_node_with_its_count():
    rates = NodeRates(started=time.monotonic() - 2.0)
    rates.add("3f9a1c" + "0" * 50, 8)
    rates.add("77b0de" + "1" * 50, 4)
    rates.add("3f9a1c" + "0" * 50, 8)
    text = rates.text()
    assert text.startswith("2 nodes: 3f9a1c 16 (") and ", 77b0de 4 (" in text and text.endswith("/s)")


def test_without_ray_the_option_says_how_to_install_it_in_one_line(tmp_path, toy_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    cases = write_cases(tmp_path / "cases.jsonl", toy_cases(2))
    res = CliRunner().invoke(main, ["run", str(toy_file), "--cases", str(cases), "--model", "agent=baseline/oracle",
                                    "-o", str(tmp_path / "run"), "--ray", "-q"])
    assert res.exit_code == 1, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'sopgraph[ray]'" in lines[0], res.output
    assert not (tmp_path / "run").exists()  # refused before anything was created


def test_an_unreachable_cluster_address_is_one_line_and_creates_nothing(tmp_path, toy_file):
    pytest.importorskip("ray", reason=NO_RAY)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cases = write_cases(tmp_path / "cases.jsonl", toy_cases(2))
    for address, said in [(f"127.0.0.1:{port}", "cannot reach the Ray cluster"), ("nonsense", "HOST:PORT")]:
        res = CliRunner().invoke(main, ["run", str(toy_file), "--cases", str(cases), "--model",
                                        "agent=baseline/oracle", "-o", str(tmp_path / "run"), "--ray", address, "-q"])
        assert res.exit_code == 1 and said in res.output and len(res.output.strip().splitlines()) == 1, res.output
        assert not (tmp_path / "run").exists()


@pytest.mark.slow  # starts a Ray instance (~10-20 s on two cores)
@pytest.mark.timeout(300)
def test_ray_without_an_address_runs_on_a_local_instance_and_stops_it(tmp_path, toy_file):
    ray = pytest.importorskip("ray", reason=NO_RAY)
    assert not ray.is_initialized()
    cases = write_cases(tmp_path / "cases.jsonl", toy_cases(6))
    common = ["run", str(toy_file), "--cases", str(cases), "--model", "agent=baseline/oracle", "--max-turns", "4",
              "-q", "--format", "json"]
    runner = CliRunner()
    res = runner.invoke(main, [*common, "-o", str(tmp_path / "local")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, [*common, "-o", str(tmp_path / "ray"), "--ray", "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["by_status"] == {"done": 6}
    assert not ray.is_initialized()  # the instance it started is stopped with the run
    assert snapshot(tmp_path / "local") == snapshot(tmp_path / "ray")


@pytest.fixture(scope="module")
def cluster():
    """A 2-node Ray cluster on 127.0.0.1; yields (cluster, worker node)."""
    ray = pytest.importorskip("ray", reason=NO_RAY)
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Ray resolves a 127.0.0.1 bootstrap address to the machine's "reachable" IP unless clusters are
    # marked single-host: then the driver joins the GCS on 127.0.0.1, where the nodes listen.
    saved_env = {k: os.environ.get(k) for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", KEY_ENV)}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ[KEY_ENV] = "sk-test-ray-head"  # inherited by the head node's workers
    ray_constants.ENABLE_RAY_CLUSTER = False
    node_args = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
    c = None
    try:
        c = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
        worker = c.add_node(**node_args, env_vars={KEY_ENV: WORKER_KEY})
        c.wait_for_nodes()
        yield c, worker
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if c is not None:
            c.shutdown()  # kills every process the cluster started, also after a failed test
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.slow  # a cluster: ~10 s to start, then runs on it (make test leaves it out; make test-slow and CI run it)
@pytest.mark.timeout(480)
def test_a_ray_run_on_two_nodes_stores_the_same_dialogues_and_scores_as_a_local_run(tmp_path, toy_file, cluster):
    c, _worker = cluster
    cases = write_cases(tmp_path / "cases.jsonl", toy_cases(16))
    common = ["run", str(toy_file), "--cases", str(cases), "--model", "agent=baseline/random-path",
              "--model", "judge=scripted/truth", "--trials", "2", "--concurrency", "2", "--max-turns", "4",
              "--judge-turns", "all", "--format", "json"]
    runner = CliRunner()
    local = runner.invoke(main, [*common, "-q", "-o", str(tmp_path / "local")])
    assert local.exit_code == 0, local.output
    started = time.monotonic()
    on_ray = runner.invoke(main, [*common, "--progress", "always", "-o", str(tmp_path / "ray"),
                                  "--ray", c.address])
    assert on_ray.exit_code == 0, on_ray.output
    summary = json.loads(on_ray.stdout)
    assert summary["by_status"] == {"done": 32} and summary["ran"] == 32
    assert "node" in on_ray.stderr and "/s)" in on_ray.stderr  # per-node throughput in the progress lines
    a, b = snapshot(tmp_path / "local"), snapshot(tmp_path / "ray")
    assert a["turns"] and a["judgments"] and a["usage"]
    assert a == b
    assert score_json(tmp_path / "local") == score_json(tmp_path / "ray")
    print(f"ray run of 32 dialogues on 2 nodes: {time.monotonic() - started:.1f} s")
    # `sop judge --ray` writes the same new judgment set as a local re-judge
    again = ["--model", "judge=scripted/truth", "--set", "again", "--judge-turns", "final", "-q", "--format", "json"]
    res = runner.invoke(main, ["judge", str(tmp_path / "local"), *again])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["judge", str(tmp_path / "ray"), *again, "--ray", c.address])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ran"] == 32
    a, b = snapshot(tmp_path / "local"), snapshot(tmp_path / "ray")
    assert {j["judgment_set"] for j in b["judgments"]} == {"default", "again"}
    assert a == b


@pytest.mark.slow  # a cluster: ~10 s to start, then runs on it (make test leaves it out; make test-slow and CI run it)
@pytest.mark.timeout(420)
def test_a_node_removed_mid_run_loses_and_duplicates_no_dialogue(tmp_path, toy_file, cluster):
    """The worker node is removed while batches run on it: Ray reruns them elsewhere, and the driver
    applies each batch's writes once, when it returns. More agent requests than dialogues proves that
    work in flight on the lost node was redone."""
    c, worker = cluster
    n = 64
    reply = json.dumps({"classification_output": {"Want": "Money", "Angry": False, "Items": 2}, "cot": "c",
                        "now_path": ["s1", "s2", "s3"], "finals": {"Action": "Refund"}, "chat": "ok"})
    with FakeServer(lifetime=240) as server:
        server.set_default(Behavior.ok(reply, latency=0.4))
        agent = f"agent=openai/fake-agent,api_base={server.base_url},api_key_env={KEY_ENV},timeout=20"
        out = tmp_path / "run"
        result: dict = {}

        def go() -> None:
            try:
                result["summary"] = run_sync(toy_file, toy_cases(n), [agent], out, concurrency=2, max_turns=1,
                                             progress=False, preflight=False, ray=c.address)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
                result["error"] = exc

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        def on_worker_node() -> int:
            return sum(1 for r in list(server.requests) if r.headers.get("authorization") == f"Bearer {WORKER_KEY}")

        # Remove the worker node while it is half-way through a batch (8 dialogues, 1 request each, 2 at
        # a time): some of the batch's requests made, its results not yet returned.
        deadline = time.monotonic() + 200
        while thread.is_alive() and time.monotonic() < deadline:
            mid_batch = on_worker_node()
            if mid_batch % 8:
                break
            time.sleep(0.02)
        c.remove_node(worker)
        done_at_removal = done_dialogues(out)
        thread.join(240)
        assert not thread.is_alive(), "the run did not finish after the node was removed"
        assert "error" not in result, result.get("error")
        requests = len(server.requests)
    assert mid_batch % 8 and done_at_removal < n, (mid_batch, done_at_removal)  # removed mid-batch, mid-run
    summary = result["summary"]
    assert summary.by_status == {"done": n} and summary.ran == n
    with RunStore.open(out) as s:
        dialogues = s.dialogues()
        turns = s.turns()
    assert sorted(d.id for d in dialogues) == sorted(f"k{k:03d}#0" for k in range(n))  # none lost, none twice
    assert all(d.status == "done" for d in dialogues)
    per_dialogue = Counter(t.dialogue_id for t in turns)
    assert all(per_dialogue[d.id] == d.turns == 1 for d in dialogues), per_dialogue  # no turn stored twice
    assert requests > n, requests  # the lost node's batch was run again
    print(f"removed the worker node after {mid_batch} of its requests, {done_at_removal}/{n} done; {requests} agent requests for {n} dialogues")
