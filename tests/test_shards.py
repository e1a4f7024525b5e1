"""Sharded corpora (`evaluation.shards`, `sop synth-dialogues --shard-size/--resume/--ray`): the manifest, the
same records as one unsharded synthesis, byte-identical reruns, resume after a kill, Parquet, bounded
memory per shard, and Ray Data on the 2-node test cluster of test_distributed (slow)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import floor_run
from test_distributed import NO_RAY, cluster  # noqa: F401 - the 2-node cluster fixture
from test_runner import TOY, toy_cases, write_cases

from sopgraph.cli import main
from sopgraph.evaluation import corpus, shards
from sopgraph.evaluation.corpus import export_run, synthesize_dialogues_sync
from sopgraph.evaluation.shards import (
    MANIFEST,
    PROGRESS,
    CorpusError,
    export_corpus,
    finished_shards,
    write_corpus,
)
from sopgraph.logic.checker import load
from sopgraph.simulation.gateway import Gateway

MODELS = ["agent=baseline/oracle"]
DIRECT = {"builtins_via_litellm": False, "cache": False}  # same answers, without litellm's per-call CPU


@pytest.fixture(scope="module")
def toy():
    return load(text=TOY)


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sop") / "toy.sop"
    path.write_text(TOY, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cases_file(tmp_path_factory) -> Path:
    return write_cases(tmp_path_factory.mktemp("cases") / "cases.jsonl", toy_cases(11))


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*"))}


def make(toy, cases_file: Path, out: Path, **kw):
    kw = {"trials": 2, "max_turns": 3, "shard_size": 6, "gateway_options": DIRECT, **kw}
    return write_corpus(toy, cases_file, MODELS, out, **kw)


def test_manifest_counts_hashes_and_the_records_of_one_unsharded_synthesis(toy, cases_file, tmp_path):
    m = make(toy, cases_file, tmp_path / "c", seed=7)
    out = tmp_path / "c"
    # 11 cases x 2 trials, 6 dialogues (3 cases) per shard: 4 shards of 3, 3, 3 and 2 cases
    assert [s.inputs for s in m.shards] == [3, 3, 3, 2] and [s.first_line for s in m.shards] == [1, 4, 7, 10]
    assert [s.file for s in m.shards] == [f"shard-{i:05d}.jsonl" for i in range(4)]
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, PROGRESS] + [s.file for s in m.shards]
    stored = json.loads((out / MANIFEST).read_text())
    assert stored["complete"] is True and stored["request"]["seed"] == 7
    assert stored["request"]["sop_hash"] == toy.source_hash and stored["request"]["source_items"] == 11
    assert stored["request"]["source_sha256"] == hashlib.sha256(cases_file.read_bytes()).hexdigest()
    for s in stored["shards"]:
        data = (out / s["file"]).read_bytes()
        assert s["bytes"] == len(data) and s["sha256"] == hashlib.sha256(data).hexdigest()
        assert s["counts"]["written"] == len(data.splitlines()) == 2 * s["inputs"]
    assert stored["totals"]["written"] == 22 and stored["totals"]["dialogues_seen"] == 22
    assert stored["bytes"] == sum(s["bytes"] for s in stored["shards"])
    # the shards, in order, hold exactly what one synthesis of every case writes (same seed)
    records = [r for s in m.shards for r in lines(out / s.file)]
    whole, _ = synthesize_dialogues_sync(toy, [shards.seeded(c, 7) for c in toy_cases(11)], MODELS, trials=2,
                                         max_turns=3, gateway=Gateway(concurrency=8, **DIRECT))
    assert records == whole
    assert [r["metadata"]["dialogue_id"] for r in records] == [f"k{k:03d}#{t}" for k in range(11) for t in (0, 1)]


def test_a_rerun_is_byte_identical_and_the_seed_changes_the_customers(toy, cases_file, tmp_path):
    a = make(toy, cases_file, tmp_path / "a")
    b = make(toy, cases_file, tmp_path / "b")
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    assert a == b and (tmp_path / "a" / MANIFEST).read_bytes() == (tmp_path / "b" / MANIFEST).read_bytes()
    assert [shards.seeded(c, 0) for c in toy_cases(3)] == toy_cases(3)  # seed 0: the cases' own seeds
    assert {shards.seeded(c, 5).seed for c in toy_cases(3)}.isdisjoint({c.seed for c in toy_cases(3)})


def test_resume_after_a_kill_keeps_finished_shards_redoes_the_rest_and_loses_nothing(toy, cases_file, tmp_path,
                                                                                      monkeypatch):
    whole = tmp_path / "whole"
    make(toy, cases_file, whole)
    out = tmp_path / "killed"

    class Killed(BaseException):
        pass

    def kill_after_two(entry, finished, total):
        if finished == 2:
            raise Killed  # as if the process died right after recording its second shard

    with pytest.raises(Killed):
        make(toy, cases_file, out, on_shard=kill_after_two)
    assert not json.loads((out / MANIFEST).read_text())["complete"]
    # what a kill leaves besides: a shard being written, a shard renamed but never recorded, a torn line
    (out / ".shard-00002.jsonl.0123.part").write_text('{"messages": [', encoding="utf-8")
    (out / "shard-00003.jsonl").write_text("half a shard\n", encoding="utf-8")
    with open(out / PROGRESS, "a", encoding="utf-8") as fh:
        fh.write('{"index": 2, "file": "shard-0')
    assert sorted(finished_shards(out)) == [0, 1]
    made: list[int] = []
    real = shards.make_shard

    def counting(job, spec):
        made.append(spec.index)
        return real(job, spec)

    monkeypatch.setattr(shards, "make_shard", counting)
    with pytest.raises(CorpusError, match="other settings.*trials 2 -> 1"):
        make(toy, cases_file, out, resume=True, trials=1)
    with pytest.raises(CorpusError, match="not empty: pass --resume"):
        make(toy, cases_file, out)
    m = make(toy, cases_file, out, resume=True)
    assert sorted(made) == [2, 3]  # finished shards are not made again
    assert m.complete and shard_bytes(out) == shard_bytes(whole)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in whole.iterdir())  # no leftovers
    assert (out / MANIFEST).read_bytes() == (whole / MANIFEST).read_bytes()
    made.clear()
    make(toy, cases_file, out, resume=True)  # resuming a complete corpus makes nothing
    assert made == []


def test_a_changed_or_missing_shard_file_is_made_again_on_resume(toy, cases_file, tmp_path):
    out = tmp_path / "c"
    make(toy, cases_file, out)
    before = shard_bytes(out)
    (out / "shard-00001.jsonl").write_bytes(b"x" + before["shard-00001.jsonl"][1:])  # same size, other bytes
    (out / "shard-00002.jsonl").unlink()
    assert sorted(finished_shards(out)) == [0, 3]
    make(toy, cases_file, out, resume=True)
    assert shard_bytes(out) == before


def test_each_shard_is_made_from_its_own_cases_only(toy, cases_file, tmp_path, monkeypatch):
    seen: list[int] = []
    real = corpus.synthesize_dialogues

    async def spy(scenario, cases, *args, **kwargs):
        seen.append(len(cases))
        return await real(scenario, cases, *args, **kwargs)

    monkeypatch.setattr(shards, "synthesize_dialogues", spy)
    make(toy, cases_file, tmp_path / "c", shard_size=4)
    assert seen == [2, 2, 2, 2, 2, 1]  # 2 cases (4 dialogues) at a time, never all 11


def test_bad_cases_and_settings_are_refused_before_anything_is_written(toy, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(toy_cases(1)[0].model_dump_json() + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"bad.jsonl:3: invalid case"):
        make(toy, bad, tmp_path / "out")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="no cases"):
        make(toy, empty, tmp_path / "out")
    with pytest.raises(CorpusError, match="no corpus to resume"):
        make(toy, write_cases(tmp_path / "ok.jsonl", toy_cases(2)), tmp_path / "none", resume=True)
    assert not (tmp_path / "out").exists() and not (tmp_path / "none").exists()


def test_parquet_shards_hold_the_jsonl_records(toy, cases_file, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet needs pyarrow")
    for fmt in ("openai", "sharegpt"):
        make(toy, cases_file, tmp_path / f"j-{fmt}", fmt=fmt)
        m = make(toy, cases_file, tmp_path / f"p-{fmt}", fmt=fmt, file_format="parquet")
        again = make(toy, cases_file, tmp_path / f"q-{fmt}", fmt=fmt, file_format="parquet")
        assert shard_bytes(tmp_path / f"p-{fmt}") == shard_bytes(tmp_path / f"q-{fmt}") and m == again
        column = "messages" if fmt == "openai" else "conversations"
        for s in m.shards:
            assert s.file.endswith(".parquet")
            rows = pq.read_table(tmp_path / f"p-{fmt}" / s.file).to_pylist()
            want = lines(tmp_path / f"j-{fmt}" / s.file.replace(".parquet", ".jsonl"))
            got = [{column: [{k: v for k, v in item.items() if v is not None} for item in row[column]],
                    "metadata": json.loads(row["metadata"])} for row in rows]
            assert got == want


@pytest.mark.parametrize("reference", [False, True])
def test_sharded_export_holds_what_one_export_of_the_run_writes(tmp_path_factory, tmp_path, reference):
    run = floor_run(tmp_path_factory, "baseline/always-comply")
    whole, stats = export_run(run, fmt="sharegpt", min_overall=0.5, reference=reference)
    m = export_corpus(run, tmp_path / "c", fmt="sharegpt", min_overall=0.5, reference=reference, shard_size=5)
    assert [s.inputs for s in m.shards] == [5, 5, 5, 5, 4]  # 12 cases x 2 trials, 5 stored dialogues a shard
    assert [r for s in m.shards for r in lines(tmp_path / "c" / s.file)] == whole
    assert m.totals["written"] == stats.written and m.totals["skipped_below_bar"] == stats.skipped_below_bar
    assert m.request.kind == "export" and m.request.judgment_set == "default" and m.request.seed is None
    again = export_corpus(run, tmp_path / "c", fmt="sharegpt", min_overall=0.5, reference=reference, shard_size=5,
                          resume=True)
    assert again == m


def test_sharded_cli_prints_one_line_per_shard_and_the_totals(toy_file, cases_file, tmp_path, tmp_path_factory):
    res = CliRunner().invoke(main, ["synth-dialogues", str(toy_file), "--cases", str(cases_file), "--model",
                                    "agent=baseline/oracle", "--max-turns", "3", "--shard-size", "5",
                                    "-o", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("shard 0000") == 3 and "11 dialogues (" in res.stderr
    assert "3 shards" in res.stderr and json.loads((tmp_path / "c" / MANIFEST).read_text())["complete"]
    res = CliRunner().invoke(main, ["synth-dialogues", str(toy_file), "--cases", str(cases_file), "--model",
                                    "agent=baseline/oracle", "--file-format", "parquet"])
    assert res.exit_code == 1 and "needs -o DIR" in res.output
    res = CliRunner().invoke(main, ["synth-dialogues", str(toy_file), "--cases", str(cases_file), "--model",
                                    "agent=baseline/oracle", "--shard-size", "5", "-o", str(tmp_path / "c")])
    assert res.exit_code == 1 and "--resume" in res.output and "Traceback" not in res.output
    run = floor_run(tmp_path_factory, "baseline/always-comply")
    res = CliRunner().invoke(main, ["export", str(run), "--shard-size", "10", "-o", str(tmp_path / "e")])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("shard 0000") == 3 and "24 seen" in res.stderr


def test_without_ray_the_option_says_how_to_install_it_and_creates_nothing(toy_file, cases_file, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    res = CliRunner().invoke(main, ["synth-dialogues", str(toy_file), "--cases", str(cases_file), "--model",
                                    "agent=baseline/oracle", "-o", str(tmp_path / "c"), "--ray"])
    assert res.exit_code == 1, res.output
    said = [line for line in res.output.splitlines() if line.strip()]
    assert len(said) == 1 and "pip install 'sopgraph[ray]'" in said[0]
    assert not (tmp_path / "c").exists()


def test_ray_without_ray_data_says_how_to_install_it(toy, cases_file, tmp_path, monkeypatch):
    pytest.importorskip("ray", reason=NO_RAY)
    monkeypatch.setitem(sys.modules, "ray.data", None)  # Ray installed without its Data extra
    with pytest.raises(CorpusError, match=r"--ray needs Ray Data.*pip install 'sopgraph\[ray\]'"):
        make(toy, cases_file, tmp_path / "c", ray="local")
    assert not (tmp_path / "c").exists()


@pytest.mark.slow  # a 2-node Ray cluster (~10-25 s to start on two cores)
@pytest.mark.timeout(480)
def test_ray_data_on_two_nodes_writes_the_same_bytes_and_resumes(toy, cases_file, tmp_path, tmp_path_factory,
                                                                 cluster):  # noqa: F811
    c, _worker = cluster
    run = floor_run(tmp_path_factory, "baseline/always-comply")  # export: the tasks read the run store
    local = export_corpus(run, tmp_path / "export-local", reference=True, shard_size=7, file_format="parquet")
    on_ray = export_corpus(run, tmp_path / "export-ray", reference=True, shard_size=7, file_format="parquet",
                           ray=c.address)
    assert on_ray == local and shard_bytes(tmp_path / "export-ray") == shard_bytes(tmp_path / "export-local")
    make(toy, cases_file, tmp_path / "local", file_format="jsonl")
    m = make(toy, cases_file, tmp_path / "ray", ray=c.address)
    assert m.complete and shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")
    assert (tmp_path / "ray" / MANIFEST).read_bytes() == (tmp_path / "local" / MANIFEST).read_bytes()
    # a corpus cut short resumes on Ray: only the missing shards go out, the result is the same
    (tmp_path / "ray" / "shard-00003.jsonl").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ray").glob("shard-*")}
    again = make(toy, cases_file, tmp_path / "ray", ray=c.address, resume=True)
    assert again == m and shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ray").glob("shard-*") if p.name in kept} == kept
    rows = (tmp_path / "ray" / PROGRESS).read_text().splitlines()
    assert sorted(json.loads(r)["index"] for r in rows) == [0, 1, 2, 3]  # each shard recorded once


@pytest.mark.slow  # two `sop` processes (litellm's import each)
@pytest.mark.timeout(600)
def test_sigkill_mid_corpus_then_resume_gives_the_uninterrupted_corpus(toy_file, tmp_path):
    cases = write_cases(tmp_path / "cases.jsonl", toy_cases(400))
    cmd = [sys.executable, "-c", "from sopgraph.cli import entry; entry()", "synth-dialogues", str(toy_file),
           "--cases", str(cases), "--model", "agent=baseline/oracle", "--max-turns", "3", "--shard-size", "10"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "-o", str(out)], env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        progress = out / PROGRESS
        if progress.is_file() and len(progress.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    recorded = len(finished_shards(out))
    assert 3 <= recorded < 40 and not json.loads((out / MANIFEST).read_text())["complete"], recorded
    res = subprocess.run([*cmd, "-o", str(out), "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("shard 000") == 40 - recorded  # only the shards not finished were made
    whole = subprocess.run([*cmd, "-o", str(tmp_path / "whole")], env=env, capture_output=True, timeout=300)
    assert whole.returncode == 0
    assert shard_bytes(out) == shard_bytes(tmp_path / "whole")
    assert (out / MANIFEST).read_bytes() == (tmp_path / "whole" / MANIFEST).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "whole").iterdir())
