"""`sop view`: the read-only run browser, over real offline runs made here, on 127.0.0.1.

Every expectation is computed independently of the viewer: from the store's records (`RunStore`) and
from `score_run`, never from the viewer's own rows."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from html import unescape
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest
from click.testing import CliRunner
from helpers import TELECOM

from sopgraph.cli import main
from sopgraph.evaluation.score import ScoreConfig, score_run
from sopgraph.evaluation.view import FAILURE_KINDS, PAGE_MAX, ViewServer, serve
from sopgraph.simulation.runner import run_sync
from sopgraph.simulation.store import RunStore, StoreError

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def sloppy_agent(request: dict) -> dict:
    """A tool-calling agent (python: kind) that asks first, then on some cases calls an action the SOP
    does not have (a format error) and on the others the first tool it is offered."""
    said = " ".join(m["content"] for m in request["messages"] if m["role"] == "user")
    tools = [t["function"] for t in request.get("tools") or []]
    if request.get("turn", 1) == 1:
        return {"reply": "Could you tell me more?", "tool_calls": []}
    if len(said) % 3 == 0:
        return {"reply": "Done.", "tool_calls": [{"name": "NoSuchAction", "arguments": {}}]}
    return {"reply": f"Doing {tools[0]['name']}.", "tool_calls": [{"name": tools[0]["name"], "arguments": {}}]}


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    """Two offline runs of telecom cases: a SAGE floor agent and a tool-calling Python agent."""
    base = tmp_path_factory.mktemp("view")
    cases = base / "cases.jsonl"
    res = CliRunner().invoke(main, ["synth", str(TELECOM), "-n", "14", "-o", str(cases), "-q", "--seed", "5"])
    assert res.exit_code == 0, res.output
    runs = base / "runs"
    run_sync(str(TELECOM), str(cases), ["agent=baseline/random-path"], str(runs / "random-path"), trials=2,
             progress=False)
    run_sync(str(TELECOM), str(cases), [f"agent=python:{__name__}:sloppy_agent"], str(runs / "nested" / "sloppy"),
             trials=1, progress=False)
    return runs


@pytest.fixture(scope="module")
def server(runs_dir):
    srv = serve([runs_dir]).start()
    yield srv
    srv.close()


def get(srv: ViewServer, path: str, query: dict | None = None) -> tuple[int, dict]:
    url = srv.url.rstrip("/") + path + (("?" + urlencode(query)) if query else "")
    try:
        with urllib.request.urlopen(url, timeout=60) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def all_ids(srv: ViewServer, run: str, query: dict) -> list[str]:
    """Every matching dialogue id, read page by page (small pages: pagination is exercised)."""
    ids, offset = [], 0
    while True:
        status, page = get(srv, f"/api/runs/{quote(run, safe='')}/dialogues", {**query, "offset": offset, "limit": 7})
        assert status == 200, page
        ids += [r["id"] for r in page["rows"]]
        offset += 7
        if offset >= page["matched"]:
            assert len(ids) == page["matched"]
            return ids


def raw_request(srv: ViewServer, request: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.partition(b"\r\n\r\n")[2]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under `root` (names and contents): the run directories must not change at all."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------
# the JSON API


def test_runs_are_listed_with_their_summary(server, runs_dir) -> None:
    status, data = get(server, "/api/runs")
    assert status == 200
    assert [r["name"] for r in data["runs"]] == ["nested/sloppy", "random-path"]
    status, summary = get(server, "/api/runs/random-path/summary")
    assert status == 200
    with RunStore.open(runs_dir / "random-path", read_only=True) as store:
        counts = store.summary()
    assert summary["counts"]["dialogues"] == counts["dialogues"] == 28
    assert summary["counts"]["by_status"] == counts["by_status"]
    assert summary["models"]["agent"] == "baseline/random-path" and summary["models"]["user"] == "scripted/user"
    assert summary["scenario"] == "telecom_package" and summary["scored"] and summary["judgment_set"] == "default"
    scored = score_run(runs_dir / "random-path", ScoreConfig(bootstrap=0))
    g = scored.aggregate(["model"])[0]
    assert summary["scores"]["baseline/random-path"]["pass_rate"] == pytest.approx(g.metrics["pass_rate"].value)
    assert summary["scores"]["baseline/random-path"]["overall"] == pytest.approx(g.metrics["overall"].value)


def test_filters_return_the_right_dialogues(server, runs_dir) -> None:
    run_dir = runs_dir / "random-path"
    scored = score_run(run_dir, ScoreConfig(bootstrap=0))
    with RunStore.open(run_dir, read_only=True) as store:
        cases = {c.id: c for c in store.cases()}
        dialogues = store.dialogues()
        turns = {d.id: store.turns(d.id) for d in dialogues}
    ids = [d.id for d in dialogues]
    case_of = {d.id: cases[d.case_id] for d in dialogues}

    def final_action(did: str):
        out = turns[did][-1].output
        return out.finals.get("Action") if out else None

    expected = {
        (("pass", "fail"),): [i for k, i in enumerate(ids) if not scored.d_pass[k]],
        (("pass", "pass"),): [i for k, i in enumerate(ids) if scored.d_pass[k]],
        (("intensity", "strong"),): [i for i in ids if case_of[i].intensity == "strong"],
        (("path_id", "P05"),): [i for i in ids if case_of[i].path_id == "P05"],
        (("failure", "wrong_action"),): [i for i in ids if final_action(i) != case_of[i].expected_finals["Action"]],
        (("failure", "unsafe_action"),): [i for i in ids if any(
            t.output and t.output.finals.get("Action") in case_of[i].prohibited_actions for t in turns[i])],
        (("metric", "overall"), ("min", "0.5"), ("max", "0.65")): [
            i for k, i in enumerate(ids) if 0.5 <= scored.d_overall[k] <= 0.65],
        (("pass", "fail"), ("intensity", "strong")): [
            i for k, i in enumerate(ids) if not scored.d_pass[k] and case_of[i].intensity == "strong"],
    }
    # the run is varied enough for every filter to split it
    for key, want in expected.items():
        query = dict(key)
        got = all_ids(server, "random-path", query)
        assert got == want, query
        assert 0 < len(want) < len(ids) or query == {"path_id": "P05"}, (query, len(want))
    assert all_ids(server, "random-path", {}) == ids
    # the facets the page offers are the counts of the rows
    _, summary = get(server, "/api/runs/random-path/summary")
    assert dict(summary["facets"]["intensity"]) == {
        lvl: sum(1 for i in ids if case_of[i].intensity == lvl) for lvl in ("zero", "weak", "strong")
        if any(case_of[i].intensity == lvl for i in ids)}
    # sorting by a metric, descending: non-increasing, undefined values last
    _, page = get(server, "/api/runs/random-path/dialogues", {"sort": "overall", "order": "desc", "limit": PAGE_MAX})
    values = [r["metrics"]["overall"] for r in page["rows"]]
    assert values == sorted(values, reverse=True) and len(values) == len(ids)


def test_failure_kinds_of_a_tool_calling_run(server, runs_dir) -> None:
    with RunStore.open(runs_dir / "nested" / "sloppy", read_only=True) as store:
        dialogues = store.dialogues()
        with_errors = [d.id for d in dialogues if any(t.format_error for t in store.turns(d.id))]
    assert 0 < len(with_errors) < len(dialogues)
    run = quote("nested/sloppy", safe="")
    assert all_ids(server, "nested/sloppy", {"failure": "format_error"}) == with_errors
    status, page = get(server, f"/api/runs/{run}/dialogues", {"failure": "none", "limit": 1})
    assert status == 200 and all(not r["failures"] for r in page["rows"])
    status, transcript = get(server, f"/api/runs/{run}/dialogues/{quote(with_errors[0], safe='')}")
    assert status == 200
    assert any(t["format_error"] and t["output"] is None for t in transcript["turns"])


def test_bad_parameters_are_4xx(server) -> None:
    for query in ({"pass": "maybe"}, {"metric": "nonsense"}, {"min": "abc"}, {"failure": "bogus"},
                  {"sort": "nonsense"}, {"limit": "x"}, {"verdict": "fail"}):  # a misspelt key: not unfiltered
        status, body = get(server, "/api/runs/random-path/dialogues", query)
        assert status == 400 and body["error"], query
    status, body = get(server, "/api/runs/no-such-run/summary")
    assert status == 404 and "no-such-run" in body["error"]
    status, body = get(server, "/api/runs/random-path/dialogues/no%23such")
    assert status == 404
    assert set(FAILURE_KINDS) >= {"format_error", "wrong_action", "wrong_path", "unsafe_action"}


def test_transcript_matches_the_store(server, runs_dir) -> None:
    run_dir = runs_dir / "random-path"
    scored = score_run(run_dir, ScoreConfig(bootstrap=0))
    with RunStore.open(run_dir, read_only=True) as store:
        cases = {c.id: c for c in store.cases()}
        for dlg in store.dialogues()[:6]:
            status, data = get(server, f"/api/runs/random-path/dialogues/{quote(dlg.id, safe='')}")
            assert status == 200
            assert data["dialogue"] == dlg.model_dump(mode="json")
            case = cases[dlg.case_id]
            assert data["case"] == case.model_dump(mode="json")
            turns = store.turns(dlg.id)
            assert [{k: v for k, v in t.items() if k not in ("consensus", "judgments", "scores")}
                    for t in data["turns"]] == [t.model_dump(mode="json") for t in turns]
            consensus = {c.turn_index: c.model_dump(mode="json") for c in store.consensus("default", dlg.id)}
            assert [t["consensus"] for t in data["turns"]] == [consensus.get(t.index) for t in turns]
            assert data["reference"]["path"] == case.expected_path
            assert data["reference"]["trace"][0]["name"] == case.expected_finals["Action"]
            last = turns[-1].output
            assert data["agent"]["path"] == last.now_path
            assert data["agent"]["trace"][0]["name"] == last.finals["Action"]
            d = scored.dialogue_index(dlg.id)
            assert data["row"]["pass"] == bool(scored.d_pass[d])
            final = data["turns"][-1]["scores"]
            assert final["overall"] == pytest.approx(float(scored.t_overall[scored.d_final_row[d]]))
    # a tool-calling agent: its trace is its tool calls, in order
    with RunStore.open(runs_dir / "nested" / "sloppy", read_only=True) as store:
        dlg = store.dialogues()[0]
        calls = [c["name"] for t in store.turns(dlg.id) if t.output for c in t.output.tool_calls]
    _, data = get(server, f"/api/runs/{quote('nested/sloppy', safe='')}/dialogues/{quote(dlg.id, safe='')}")
    assert [c["name"] for c in data["agent"]["trace"]] == calls


# ---------------------------------------------------------------------------------------------
# read-only, local, no way out of the API


def test_only_get_is_answered_and_the_store_is_untouched(runs_dir) -> None:
    before = tree_digest(runs_dir)
    srv = serve([runs_dir]).start()
    try:
        host = f"Host: 127.0.0.1:{srv.port}\r\n".encode()
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "PROPFIND"):
            for path in ("/", "/api/runs", "/api/runs/random-path/summary"):
                status, _ = raw_request(srv, f"{method} {path} HTTP/1.1\r\n".encode() + host
                                        + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
                assert status == 405, (method, path)
        # every read the page makes, on both runs
        for run in ("random-path", "nested/sloppy"):
            name = quote(run, safe="")
            assert get(srv, f"/api/runs/{name}/summary")[0] == 200
            _, page = get(srv, f"/api/runs/{name}/dialogues", {"pass": "fail"})
            for row in page["rows"][:3]:
                assert get(srv, f"/api/runs/{name}/dialogues/{quote(row['id'], safe='')}")[0] == 200
        assert get(srv, "/api/runs")[0] == 200
        assert tree_digest(runs_dir) == before  # while the stores are open: not even -wal/-shm side files
    finally:
        srv.close()
    assert tree_digest(runs_dir) == before


def test_a_read_only_store_cannot_write(tmp_path, runs_dir) -> None:
    run = tmp_path / "copy"
    shutil.copytree(runs_dir / "random-path", run)
    before = tree_digest(run)
    with RunStore.open(run, read_only=True) as store:
        dialogues = store.dialogues()
        assert len(dialogues) == 28
        assert len(list(store.iter_turn_dicts(status="done"))) == sum(d.turns for d in dialogues)
        with pytest.raises(StoreError, match="read-only"):
            store.set_meta("notes", ["x"])
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.conn.execute("DELETE FROM dialogues")
        assert sorted(p.name for p in run.iterdir()) == ["run.sqlite"]
    assert tree_digest(run) == before


def test_paths_outside_the_api_are_refused(server) -> None:
    host = f"Host: 127.0.0.1:{server.port}\r\n".encode()
    secret = (ROOT / "sopgraph" / "evaluation" / "view.py").read_bytes()[:60]
    for path in ("/../../../../etc/passwd", "/assets/../../evaluation/view.py", "/assets/..%2f..%2fevaluation%2fview.py",
                 "/assets/%2e%2e/%2e%2e/evaluation/view.py", "//etc/passwd", "/api/runs/..%2F..%2F..%2Fetc/summary",
                 "/api/runs/random-path/../../../etc/passwd", "/templates/view/view.js", "/view.py",
                 "/api/runs/%2e%2e/summary", "/assets/view.js/../../../../etc/passwd"):
        status, body = raw_request(server, f"GET {path} HTTP/1.1\r\n".encode() + host + b"Connection: close\r\n\r\n")
        assert status == 404, path
        assert b"root:" not in body and secret not in body, path
    # another Host (DNS rebinding: a page elsewhere resolving its name to 127.0.0.1) is refused
    status, _ = raw_request(server, b"GET /api/runs HTTP/1.1\r\nHost: evil.example:80\r\nConnection: close\r\n\r\n")
    assert status == 421
    assert server.server_address[0] == "127.0.0.1"


def test_more_than_one_host_or_an_absolute_target_is_400(server) -> None:
    """The Host check stops DNS rebinding only if the Host read is the one the request is for: with two Host
    headers the first used to count (a second, attacker-chosen one was ignored here but may be honoured by a
    proxy in front); an absolute URL as the target names its own host."""
    ours = f"Host: 127.0.0.1:{server.port}\r\n".encode()
    for headers in (ours + b"Host: evil.example\r\n", b"Host: evil.example\r\n" + ours, ours + ours, b""):
        status, body = raw_request(server, b"GET /api/runs HTTP/1.1\r\n" + headers + b"Connection: close\r\n\r\n")
        assert status == 400 and b"Host header" in body, headers
    status, body = raw_request(server, b"GET http://evil.example/api/runs HTTP/1.1\r\n" + ours
                               + b"Connection: close\r\n\r\n")
    assert status == 400 and b"absolute URL" in body
    status, _ = raw_request(server, b"GET /api/runs HTTP/1.1\r\n" + ours.upper().replace(b"HOST", b"host")
                            + b"Connection: close\r\n\r\n")
    assert status == 200  # one Host, any case


def _hang_up(srv: ViewServer, partial: bytes) -> None:
    """Connect, send part of a request and reset the connection (SO_LINGER 0: an RST, as a killed client)."""
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    sock.sendall(partial)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _handlers_done() -> None:
    for _ in range(600):  # the handler threads end once they have seen the reset
        if not any("process_request" in t.name for t in threading.enumerate()):
            return
        time.sleep(0.05)


def test_a_client_that_hangs_up_prints_nothing(runs_dir, capfd) -> None:
    """A client that hangs up mid-request was a stdlib traceback on stderr per client; now nothing (and one
    quiet line each with --log), and the server goes on serving."""
    logged: list[str] = []
    for log in (None, logged.append):
        srv = serve([runs_dir], log=log).start()
        try:
            for partial in (b"GET /api/runs HTTP/1.1\r\nHo", b"GE", b""):
                _hang_up(srv, partial)
            _handlers_done()
            assert get(srv, "/api/runs")[0] == 200
        finally:
            srv.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err and "Error" not in err, err
    hung = [line for line in logged if "hung up" in line]
    assert 2 <= len(hung) <= 3 and all(line.startswith("127.0.0.1 hung up (Connection") for line in hung), logged


# ---------------------------------------------------------------------------------------------
# runs that are not scored, and large runs


def test_an_unjudged_run_shows_what_exists(tmp_path, runs_dir) -> None:
    run = tmp_path / "unjudged"
    shutil.copytree(runs_dir / "random-path", run)
    conn = sqlite3.connect(run / "run.sqlite")
    conn.execute("DELETE FROM consensus")
    conn.execute("DELETE FROM judgments")
    conn.execute("DELETE FROM meta WHERE key='judgment_sets'")
    conn.commit()
    conn.close()
    srv = serve([run]).start()
    try:
        _, summary = get(srv, "/api/runs/unjudged/summary")
        assert summary["judgment_set"] is None
        assert any("not judged" in n for n in summary["notes"])
        _, page = get(srv, "/api/runs/unjudged/dialogues", {"limit": PAGE_MAX})
        assert len(page["rows"]) == 28
        assert all(r["metrics"]["overall"] is None and r["pass"] is not None for r in page["rows"])
        ids = [r["id"] for r in page["rows"] if r["metrics"]["overall"] is None]
        _, empty = get(srv, "/api/runs/unjudged/dialogues", {"metric": "overall", "min": "0"})
        assert empty["matched"] == 0 and ids
    finally:
        srv.close()


def _grow(run: Path, copies: int) -> int:
    """Make a big run from a small one: every dialogue, its turns and consensus, `copies` times over
    (ids suffixed `~k`, trial numbers renumbered: same cases, more trials)."""
    conn = sqlite3.connect(run / "run.sqlite")
    n = conn.execute("SELECT COUNT(*) FROM dialogues").fetchone()[0]
    ks = "WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k WHERE n < ?) "
    with conn:
        conn.execute(
            ks + "INSERT INTO dialogues SELECT id || '~' || k.n, ord + k.n * ?, case_id, trial + 2 * k.n, status,"
            " end_reason, turns, error, attempts, json_set(data, '$.id', json_extract(data, '$.id') || '~' || k.n,"
            " '$.trial', json_extract(data, '$.trial') + 2 * k.n), schema_version, sop_hash, tool_version"
            " FROM dialogues, k", (copies - 1, n))
        for table, key in (("turns", "dialogue_id, idx, format_error"),
                           ("consensus", "judgment_set, dialogue_id, turn_index")):
            cols = key.replace("dialogue_id", "dialogue_id || '~' || k.n")
            conn.execute(
                ks + f"INSERT INTO {table} SELECT {cols}, json_set(data, '$.dialogue_id', "
                "json_extract(data, '$.dialogue_id') || '~' || k.n), schema_version, sop_hash, tool_version "
                f"FROM {table}, k", (copies - 1,))
    total = conn.execute("SELECT COUNT(*) FROM dialogues").fetchone()[0]
    conn.close()
    return total


def test_a_large_run_is_paginated_on_the_server(tmp_path, runs_dir) -> None:
    run = tmp_path / "big"
    shutil.copytree(runs_dir / "random-path", run)
    total = _grow(run, 360)
    assert total == 28 * 360  # 10,080 dialogues
    srv = serve([run]).start()
    try:
        url = srv.url + "api/runs/big/dialogues?" + urlencode({"pass": "fail", "offset": 200, "limit": 50})
        with urllib.request.urlopen(url, timeout=120) as res:
            raw = res.read()
        page = json.loads(raw)
        assert page["total"] == total and len(page["rows"]) == 50 and page["offset"] == 200
        assert page["matched"] == 360 * len(all_ids_small(runs_dir))
        assert len(raw) < 60_000  # one page travels, never the run
        _, capped = get(srv, "/api/runs/big/dialogues", {"limit": 100_000})
        assert len(capped["rows"]) == PAGE_MAX
        last = capped["rows"][-1]["id"]
        status, data = get(srv, f"/api/runs/big/dialogues/{quote(last, safe='')}")
        assert status == 200 and data["dialogue"]["id"] == last
    finally:
        srv.close()


def all_ids_small(runs_dir: Path) -> list[int]:
    scored = score_run(runs_dir / "random-path", ScoreConfig(bootstrap=0))
    return [d for d in range(len(scored.dialogues)) if not scored.d_pass[d]]


# ---------------------------------------------------------------------------------------------
# the command


def test_sop_view_command_serves_and_stops(runs_dir) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", "from sopgraph.cli import main; main()", "view", str(runs_dir),
                             "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert found, line + proc.stderr.read()
        assert "2 runs" in line and "read-only" in line
        with urllib.request.urlopen(found.group(1) + "api/runs", timeout=60) as res:
            assert [r["name"] for r in json.loads(res.read())["runs"]] == ["nested/sloppy", "random-path"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    res = CliRunner().invoke(main, ["view", str(runs_dir / "no-such-dir")])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_a_directory_without_runs_is_said(tmp_path) -> None:
    srv = serve([tmp_path]).start()
    try:
        _, data = get(srv, "/api/runs")
        assert data["runs"] == [] and "no run directory" in data["notes"][0]
    finally:
        srv.close()


# ---------------------------------------------------------------------------------------------
# headless Chromium: the page renders rows and a transcript


def _png_size_and_variety(png: bytes) -> tuple[int, int, int]:
    """Width, height and the number of distinct sampled rows of a PNG (1 = blank)."""
    import struct
    import zlib

    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(png):
        length = struct.unpack(">I", png[pos:pos + 4])[0]
        kind = png[pos + 4:pos + 8]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", png[pos + 8:pos + 16])
        elif kind == b"IDAT":
            idat += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = len(raw) // height
    return width, height, len({raw[i * stride + 1:(i + 1) * stride] for i in range(0, height, 5)})


def _chromium(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1280,900",
           "--virtual-time-budget=15000", "--enable-logging=stderr", "--v=0", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(CHROMIUM is None, reason="LOUD SKIP: chromium is not installed, the viewer was not rendered")
def test_the_page_renders_in_headless_chromium(server, runs_dir, tmp_path) -> None:
    with RunStore.open(runs_dir / "random-path", read_only=True) as store:
        dialogues = store.dialogues()
    scored = score_run(runs_dir / "random-path", ScoreConfig(bootstrap=0))
    failing = next(d for k, d in enumerate(dialogues) if not scored.d_pass[k])
    url = server.url + "#" + urlencode({"run": "random-path", "d": failing.id})
    proc = _chromium(tmp_path, url, "--dump-dom")
    errors = [ln for ln in proc.stderr.splitlines() if "Uncaught" in ln or ("CONSOLE" in ln and "rror" in ln)]
    assert not errors, errors
    dom = proc.stdout
    assert 'data-ready="1"' in dom, dom[-3000:]
    rendered = [unescape(i) for i in re.findall(r'<tr data-id="([^"]+)"', dom)]
    assert rendered == [d.id for d in dialogues]  # every row of the first page, in run order
    assert f'<h2 id="detail-title">{failing.id}</h2>' in dom
    assert "Reference (SOP)" in dom and "agent JSON" in dom and "now_path" in dom and "raw reply" in dom
    # a filtered view: only the failing dialogues are rows
    proc = _chromium(tmp_path, server.url + "#" + urlencode({"run": "random-path", "pass": "fail"}), "--dump-dom")
    shown = [unescape(i) for i in re.findall(r'<tr data-id="([^"]+)"', proc.stdout)]
    assert shown and failing.id in shown and len(shown) < len(dialogues)
    # the screenshot: the page with the transcript open, not blank
    shot = Path(os.environ.get("SOP_VIEW_SHOT") or tmp_path / "view.png")
    _chromium(tmp_path, url, f"--screenshot={shot}")
    width, height, variety = _png_size_and_variety(shot.read_bytes())
    assert (width, height) == (1280, 900)
    assert variety > 40, "the screenshot is (nearly) blank"


def test_a_broken_run_is_named_and_the_others_still_served(tmp_path, runs_dir) -> None:
    shutil.copytree(runs_dir / "random-path", tmp_path / "good")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.sqlite").write_bytes(b"not a database at all")
    srv = serve([tmp_path]).start()
    try:
        _, data = get(srv, "/api/runs")
        by_name = {r["name"]: r for r in data["runs"]}
        assert "not a SQLite database" in by_name["broken"]["error"] and by_name["good"]["dialogues"] == 28
        status, body = get(srv, "/api/runs/broken/summary")
        assert status == 409 and "not a SQLite database" in body["error"]
        assert get(srv, "/api/runs/good/dialogues")[0] == 200
    finally:
        srv.close()
