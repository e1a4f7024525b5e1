"""Sharded training corpora: any number of dialogues with flat driver memory, resumable, and the same
bytes whether the shards are made here or on Ray (Ray Data).

Why: a corpus of 1e5-1e7 dialogues does not fit in one list, one file or one uninterrupted run. The
corpus is cut into shards of consecutive inputs (cases of a cases file for gold-path synthesis, stored
dialogues in id order for an export); a shard's content depends only on its inputs and the settings
(built-in models are deterministic), so it can be made anywhere, in any order, any number of times, and
comes out byte-identical. The driver never holds more than the shard descriptors (an offset into the
cases file or a first dialogue id, and a count) and one line of bookkeeping per finished shard.

With Ray (`--ray`), the shards to make are a Ray Data dataset mapped by tasks that make and write their
shard and return its entry; the driver records entries as they stream back. Ray Data's file writers are
not used: their file names and block boundaries are not stable across reruns, which resume and
byte-identity need.

A corpus directory holds:

- `manifest.json`: what was asked (kind, scenario and its hash, the source and its SHA-256, the seed,
  models, formats, shard size), then, when the corpus is complete, every shard (file, counts, bytes,
  SHA-256) and the totals. Written first with `complete: false`, rewritten at the end.
- `progress.jsonl`: one line per finished shard, appended (and synced) by the driver after the shard's
  file is in place; `--resume` trusts a line only if the file still has that size and hash.
- `shard-00000.jsonl` (or `.parquet`): the records of shard 0 in dialogue-id order. A shard is written
  to a temporary name and renamed when complete, so a killed job leaves whole shards or none.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, Field

from sopgraph.cases.validate import MAX_CASE_LINE, complete_case
from sopgraph.evaluation.corpus import FORMATS, CorpusStats, Format, dialogue_records, synthesize_dialogues
from sopgraph.evaluation.score import ScoreConfig, ScoreError, open_run, pick_judgment_set, score_records
from sopgraph.language import ir
from sopgraph.records import Case
from sopgraph.simulation import distributed
from sopgraph.simulation.gateway import Gateway

FileFormat = Literal["jsonl", "parquet"]
FILE_FORMATS = ("jsonl", "parquet")
MANIFEST = "manifest.json"
PROGRESS = "progress.jsonl"
MANIFEST_VERSION = 1
DEFAULT_SHARD_SIZE = 1000
"""Dialogues per shard: one shard's records are what a worker (or the local writer) holds at once."""
_DATA_LOG = logging.getLogger("ray.data")
PARQUET_HINT = "--file-format parquet needs pyarrow, which is not installed: pip install 'sopgraph[ray]' (or pyarrow)"
_COUNTS = ("dialogues_seen", "written", "turns_written", "skipped_format_error", "skipped_below_bar",
           "skipped_unscored", "skipped_not_done", "reference_fallback_turns", "infra_failures")


class CorpusError(ScoreError):
    """A corpus cannot be written or resumed (bad input, settings that differ from the stored ones)."""


class ShardEntry(BaseModel):
    """One finished shard: what it was made from (`inputs`: cases from `first_line` of the cases file, or
    stored dialogues from `first_id` of the run), what it holds, and its file's size and hash."""
    index: int
    file: str
    inputs: int
    first_line: int | None = None
    first_id: str | None = None
    bytes: int
    sha256: str
    counts: dict[str, int] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)


class CorpusRequest(BaseModel):
    """What a corpus is made of; `--resume` continues only a corpus with the same request."""
    kind: Literal["synth-dialogues", "export"] = "synth-dialogues"
    scenario: str
    sop_hash: str
    source: str
    source_sha256: str
    """The cases file's SHA-256, or (export) one over the run's dialogue ids, statuses and turn counts."""
    source_items: int
    seed: int | None = None
    models: list[str] = Field(default_factory=list)
    trials: int | None = None
    max_turns: int | None = None
    min_logic: float | None = None
    min_overall: float | None = None
    reference: bool = False
    judgment_set: str | None = None
    format: str
    file_format: str
    shard_size: int
    inputs_per_shard: int
    shards: int


class CorpusManifest(BaseModel):
    """`manifest.json`: the request, and once complete every shard and the totals."""
    manifest_version: int = MANIFEST_VERSION
    request: CorpusRequest
    complete: bool = False
    shards: list[ShardEntry] = Field(default_factory=list)
    totals: dict[str, int] = Field(default_factory=dict)
    bytes: int = 0


class ShardSpec(BaseModel):
    """Where a shard's inputs are: a byte offset into the cases file and the first line number, or the
    first dialogue id of the run (export); and how many."""
    index: int
    inputs: int = 0
    offset: int = 0
    first_line: int | None = None
    first_id: str | None = None


class ShardJob(BaseModel):
    """Everything a shard maker needs (shipped once to Ray workers)."""
    model_config = {"arbitrary_types_allowed": True}
    kind: str = "synth-dialogues"
    scenario: Any  # ir.Scenario (a pydantic model; kept as is so that workers skip re-validation)
    cases_path: str  # the cases file, or (export) the run directory
    out_dir: str
    fmt: str
    file_format: str
    source: str
    models: list[str] = Field(default_factory=list)
    trials: int = 1
    max_turns: int = 15
    concurrency: int = 8
    min_logic: float | None = None
    seed: int = 0
    gateway_options: dict[str, Any] = Field(default_factory=dict)
    config: Any = None  # export: the ScoreConfig, its judgment set picked
    min_overall: float | None = None
    reference: bool = False


# ---------------------------------------------------------------------------------------------
# Cases: scanned once for shard offsets, read back one shard at a time


def _case_lines(path: Path, offset: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """(byte offset, line number relative to `offset`'s line, raw line) of every line from `offset`, with
    the bounds of `cases.validate.read_case_lines` on each line (a regular file, lines ≤ MAX_CASE_LINE)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as exc:
        raise CorpusError(f"cannot read cases file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        if not os.path.isfile(path):
            raise CorpusError(f"cannot read cases file {path}: not a regular file (a device, pipe or directory)")
        fh.seek(offset)
        pos, n = offset, 0
        while True:
            raw = fh.readline(MAX_CASE_LINE + 1)
            if not raw:
                return
            n += 1
            if len(raw) > MAX_CASE_LINE:
                raise CorpusError(f"{path}: a line longer than {MAX_CASE_LINE:,} bytes")
            yield pos, n, raw
            pos += len(raw)


def _parse_case(scenario: ir.Scenario, raw: bytes, where: str) -> Case:
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
        return Case.model_validate(complete_case(scenario, json.loads(text)))
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise CorpusError(f"{where}: invalid case: nested too deeply") from None
    except ValueError as exc:
        first = exc.errors()[0] if hasattr(exc, "errors") else {"msg": str(exc), "loc": ()}
        loc = ".".join(str(x) for x in first.get("loc", ()))
        raise CorpusError(f"{where}: invalid case{' at ' + loc if loc else ''}: {first['msg']}") from None


def plan_shards(scenario: ir.Scenario, cases_path: str | Path, cases_per_shard: int
                ) -> tuple[list[ShardSpec], str, int]:
    """One streaming pass over the cases file: every case is parsed (bad input fails here, with its
    line, before anything runs), the shards' offsets are noted and the file hashed. Returns (shards,
    SHA-256, case count); memory: one spec per shard."""
    path = Path(cases_path)
    digest = hashlib.sha256()
    specs: list[ShardSpec] = []
    count = 0
    for pos, lineno, raw in _case_lines(path):
        digest.update(raw)
        if not raw.strip():
            continue
        _parse_case(scenario, raw, f"{path}:{lineno}")
        if count % cases_per_shard == 0:
            specs.append(ShardSpec(index=len(specs), offset=pos, first_line=lineno))
        specs[-1].inputs += 1
        count += 1
    if not count:
        raise CorpusError(f"{path}: no cases")
    return specs, digest.hexdigest(), count


def read_shard_cases(scenario: ir.Scenario, cases_path: str | Path, spec: ShardSpec) -> list[Case]:
    """The cases of one shard, read from its offset."""
    path = Path(cases_path)
    out: list[Case] = []
    for _pos, rel, raw in _case_lines(path, spec.offset):
        if len(out) >= spec.inputs:
            break
        if raw.strip():
            out.append(_parse_case(scenario, raw, f"{path}:{(spec.first_line or 1) + rel - 1}"))
    if len(out) != spec.inputs:
        raise CorpusError(f"{path} changed while the corpus was written (shard {spec.index} has "
                          f"{len(out)} of its {spec.inputs} cases)")
    return out


def seeded(case: Case, seed: int) -> Case:
    """The case with the corpus seed mixed into its own (what the simulated customer holds back and
    similar seeded choices); seed 0 leaves it as it is."""
    return case if seed == 0 else case.model_copy(update={"seed": case.seed + seed * 1_000_003})


# ---------------------------------------------------------------------------------------------
# One shard


def shard_name(index: int, file_format: str) -> str:
    return f"shard-{index:05d}.{file_format}"


def _openai_type() -> Any:
    import pyarrow as pa

    call = pa.struct([("id", pa.string()), ("type", pa.string()),
                      ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
    return pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string()),
                      ("tool_call_id", pa.string()), ("tool_calls", pa.list_(call))])


def parquet_bytes(records: Sequence[Mapping[str, Any]], fmt: str) -> bytes:
    """A shard as Parquet: the chat column (`messages` or `conversations`) typed, `tools` and `metadata`
    as JSON text (their shapes vary by scenario and would split the schema between shards). A key the
    schema does not know is refused (pyarrow would drop it silently)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise CorpusError(PARQUET_HINT) from None
    column = "messages" if fmt == "openai" else "conversations"
    item = _openai_type() if fmt == "openai" else pa.struct([("from", pa.string()), ("value", pa.string())])
    known = {item.field(i).name for i in range(item.num_fields)}
    for rec in records:
        for message in rec[column]:
            extra = set(message) - known
            if extra:
                raise CorpusError(f"cannot write {sorted(extra)} of a {column} item as Parquet")
    schema = pa.schema([(column, pa.list_(item)), ("tools", pa.string()), ("metadata", pa.string())])
    rows = [{column: rec[column],
             "tools": None if rec.get("tools") is None else (
                 rec["tools"] if isinstance(rec["tools"], str) else json.dumps(rec["tools"], ensure_ascii=False)),
             "metadata": json.dumps(rec["metadata"], ensure_ascii=False)} for rec in records]
    table = pa.Table.from_pylist(rows, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` under a name of its own, sync it, rename it into place: whole or absent."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


async def _synth_records(job: ShardJob, spec: ShardSpec) -> tuple[list[dict], CorpusStats]:
    """Gold-path synthesis of one shard's cases (a gateway of its own, closed after)."""
    scenario: ir.Scenario = job.scenario
    cases = [seeded(c, job.seed) for c in read_shard_cases(scenario, job.cases_path, spec)]
    gw = Gateway(concurrency=job.concurrency, **job.gateway_options)
    try:
        return await synthesize_dialogues(
            scenario, cases, job.models, trials=job.trials, max_turns=job.max_turns, concurrency=job.concurrency,
            gateway=gw, fmt=cast(Format, job.fmt), min_logic=job.min_logic, config=ScoreConfig(), source=job.source)
    finally:
        await gw.aclose()


def _export_records(job: ShardJob, spec: ShardSpec) -> tuple[list[dict], CorpusStats]:
    """Export of one shard's stored dialogues (`spec.inputs` from `spec.first_id`, in id order): scored
    on their own (a dialogue's scores depend only on its turns, case and consensus), so that the
    shards hold what `corpus.export_run` writes for the whole run, and nothing else is read."""
    store = open_run(job.cases_path, read_only=True)
    try:
        scenario = store.scenario()
        dialogues = list(islice(store.iter_dialogues_by_id(from_id=spec.first_id), spec.inputs))
        cases = [c for c in (store.case(cid) for cid in dict.fromkeys(d.case_id for d in dialogues)) if c]
        turns = [t for d in dialogues if d.status == "done" for t in store.iter_turn_dicts(dialogue_id=d.id)]
        cfg: ScoreConfig = job.config or ScoreConfig()
        consensus = ([c for d in dialogues for c in store.consensus(cfg.judgment_set, d.id)]
                     if cfg.judgment_set else [])
        run = score_records(scenario, cases, dialogues, turns, consensus, cfg, run=Path(job.cases_path).name,
                            keep_labels=job.reference)
        return dialogue_records(run, lambda did: store.turns(dialogue_id=did), fmt=cast(Format, job.fmt),
                                min_overall=job.min_overall, reference=job.reference, source=f"run:{run.run}")
    finally:
        store.close()


def make_shard(job: ShardJob, spec: ShardSpec) -> ShardEntry:
    """Make one shard (its records are in memory only while it is made) and write it whole."""
    if job.kind == "export":
        records, stats = _export_records(job, spec)
    else:
        records, stats = asyncio.run(_synth_records(job, spec))
    if job.file_format == "parquet":
        data = parquet_bytes(records, job.fmt)
    else:
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    name = shard_name(spec.index, job.file_format)
    _write_atomic(Path(job.out_dir) / name, data)
    return ShardEntry(index=spec.index, file=name, inputs=spec.inputs, first_line=spec.first_line,
                      first_id=spec.first_id, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                      counts=_counts(stats), warnings=stats.warnings)


def _counts(stats: CorpusStats) -> dict[str, int]:
    return {k: int(getattr(stats, k)) for k in _COUNTS}


def _shard_row(row: dict[str, Any], job: ShardJob) -> dict[str, Any]:
    """Ray Data's map function: one row (a shard spec) in, one row (its entry, as JSON) out."""
    return {"entry": make_shard(job, ShardSpec.model_validate(row)).model_dump_json()}


# ---------------------------------------------------------------------------------------------
# The corpus


def _file_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def finished_shards(out_dir: Path, *, check_hash: bool = True) -> dict[int, ShardEntry]:
    """The shards `progress.jsonl` lists whose file is still there with that size and hash (a torn last
    line, a missing or changed file: that shard is made again). `check_hash=False` checks the sizes only
    (the end of a job, whose shards were hashed as they were written)."""
    done: dict[int, ShardEntry] = {}
    try:
        lines = (out_dir / PROGRESS).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return done
    for line in lines:
        try:
            entry = ShardEntry.model_validate_json(line)
        except ValueError:
            continue
        path = out_dir / entry.file
        if path.is_file() and path.stat().st_size == entry.bytes and (
                not check_hash or _file_sha256(path) == entry.sha256):
            done[entry.index] = entry
    return done


def _write_manifest(out_dir: Path, manifest: CorpusManifest) -> None:
    text = json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    _write_atomic(out_dir / MANIFEST, text.encode("utf-8"))


def _start(out_dir: Path, request: CorpusRequest, resume: bool) -> dict[int, ShardEntry]:
    """Create the corpus directory, or check that the one to resume was asked for the same way;
    the shards already finished (see `finished_shards`)."""
    manifest_path = out_dir / MANIFEST
    if resume:
        if not manifest_path.is_file():
            raise CorpusError(f"{out_dir} holds no corpus to resume (no {MANIFEST}); run without --resume")
        try:
            stored = CorpusManifest.model_validate_json(manifest_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise CorpusError(f"{manifest_path} is not a corpus manifest: {str(exc).splitlines()[0]}") from None
        old, new = stored.request.model_dump(), request.model_dump()
        differ = [k for k in new if old.get(k) != new[k]]
        if differ:
            shown = ", ".join(f"{k} {old.get(k)!r} -> {new[k]!r}" for k in differ[:4])
            raise CorpusError(f"{out_dir} was started with other settings ({shown}); resume it with the same "
                              "command, or write a new corpus elsewhere")
        done = finished_shards(out_dir)
        # only the verified lines stay: a torn last line would swallow the next shard's line
        _write_atomic(out_dir / PROGRESS, "".join(e.model_dump_json() + "\n" for e in done.values()).encode("utf-8"))
    else:
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise CorpusError(f"{out_dir} exists and is not empty: pass --resume to continue the corpus in it, "
                              "or choose another -o")
        out_dir.mkdir(parents=True, exist_ok=True)
        done = {}
        (out_dir / PROGRESS).write_bytes(b"")
        _write_manifest(out_dir, CorpusManifest(request=request))
    keep = {e.file for e in done.values()} | {MANIFEST, PROGRESS}
    for path in out_dir.iterdir():  # partial shards and shards never recorded: made again
        if path.name not in keep and (path.name.startswith("shard-") or path.name.endswith(".part")):
            path.unlink()
    return done


def _record(out_dir: Path, entry: ShardEntry) -> None:
    with open(out_dir / PROGRESS, "a", encoding="utf-8") as fh:
        fh.write(entry.model_dump_json() + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _check_formats(fmt: str, file_format: str, shard_size: int, ray: str | None) -> None:
    if fmt not in FORMATS:
        raise CorpusError(f"unknown corpus format {fmt!r}; use {' or '.join(FORMATS)}")
    if file_format not in FILE_FORMATS:
        raise CorpusError(f"unknown file format {file_format!r}; use {' or '.join(FILE_FORMATS)}")
    if file_format == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise CorpusError(PARQUET_HINT) from None
    if shard_size < 1:
        raise CorpusError("the shard size must be at least 1 dialogue")
    if ray is not None:
        try:
            distributed.check(ray)
        except distributed.DistributedError as exc:
            raise CorpusError(str(exc)) from None
        try:
            importlib.import_module("ray.data")  # Ray without its Data extra (pandas, pyarrow) cannot shard
        except ImportError as exc:
            raise CorpusError(f"--ray needs Ray Data, which is not installed ({exc}): "
                              "pip install 'sopgraph[ray]'") from None


def write_corpus(scenario: ir.Scenario, cases_path: str | Path, models: Sequence[str], out_dir: str | Path, *,
                 trials: int = 1, max_turns: int = 15, concurrency: int = 8, fmt: Format = "openai",
                 file_format: FileFormat = "jsonl", min_logic: float | None = None, seed: int = 0,
                 shard_size: int = DEFAULT_SHARD_SIZE, resume: bool = False, ray: str | None = None,
                 num_cpus: int | None = None, gateway_options: Mapping[str, Any] | None = None,
                 on_shard: Callable[[ShardEntry, int, int], None] | None = None) -> CorpusManifest:
    """Gold-path synthesis (`corpus.synthesize_dialogues`) of every case of `cases_path` as a sharded
    corpus in `out_dir` (see the module docstring); `ray`: make the shards with Ray Data on a local
    instance (`local`) or the cluster at that address. `gateway_options`: keyword arguments of each
    shard's `Gateway` (retries, cache, ...). `on_shard(entry, finished, total)` is called as each shard
    is recorded. The shards are the same bytes with or without Ray."""
    _check_formats(fmt, file_format, shard_size, ray)
    per_shard = max(1, shard_size // max(1, trials))
    specs, sha, total_cases = plan_shards(scenario, cases_path, per_shard)
    request = CorpusRequest(scenario=scenario.name, sop_hash=scenario.source_hash, source=str(cases_path),
                            source_sha256=sha, source_items=total_cases, seed=seed, models=list(models),
                            trials=trials, max_turns=max_turns, min_logic=min_logic, format=fmt,
                            file_format=file_format, shard_size=shard_size, inputs_per_shard=per_shard,
                            shards=len(specs))
    job = ShardJob(scenario=scenario, cases_path=str(Path(cases_path).resolve()), out_dir=str(Path(out_dir).resolve()),
                   models=list(models), trials=trials, max_turns=max_turns, concurrency=concurrency, fmt=fmt,
                   file_format=file_format, min_logic=min_logic, seed=seed, source=str(cases_path),
                   gateway_options=dict(gateway_options or {}))
    return _make_corpus(Path(out_dir), request, job, specs, resume=resume, ray=ray, num_cpus=num_cpus,
                        on_shard=on_shard)


def export_corpus(run_dir: str | Path, out_dir: str | Path, *, fmt: Format = "openai",
                  file_format: FileFormat = "jsonl", min_overall: float | None = None, reference: bool = False,
                  config: ScoreConfig | None = None, shard_size: int = DEFAULT_SHARD_SIZE, resume: bool = False,
                  ray: str | None = None, num_cpus: int | None = None,
                  on_shard: Callable[[ShardEntry, int, int], None] | None = None) -> CorpusManifest:
    """`corpus.export_run` as a sharded corpus: the run's dialogues in id order, `shard_size` to a shard,
    each shard scored and written on its own (locally, or by Ray Data workers that read the run store:
    it must be on storage they see). The driver streams the dialogue ids once to plan the shards."""
    _check_formats(fmt, file_format, shard_size, ray)
    cfg = config or ScoreConfig()
    store = open_run(run_dir, read_only=True)
    try:
        scenario = store.scenario()
        jset = pick_judgment_set(store.judgment_sets(), cfg.judgment_set)
        if jset is not None and cfg.judgment_set != jset:
            cfg = cfg.model_copy(update={"judgment_set": jset})
        digest = hashlib.sha256()
        specs: list[ShardSpec] = []
        total = 0
        for d in store.iter_dialogues_by_id():
            digest.update(f"{d.id}\x00{d.status}\x00{d.turns}\n".encode())
            if total % shard_size == 0:
                specs.append(ShardSpec(index=len(specs), first_id=d.id))
            specs[-1].inputs += 1
            total += 1
    finally:
        store.close()
    if not total:
        raise CorpusError(f"{run_dir}: the run has no dialogues")
    request = CorpusRequest(kind="export", scenario=scenario.name, sop_hash=scenario.source_hash,
                            source=str(run_dir), source_sha256=digest.hexdigest(), source_items=total,
                            min_overall=min_overall, reference=reference, judgment_set=jset, format=fmt,
                            file_format=file_format, shard_size=shard_size, inputs_per_shard=shard_size,
                            shards=len(specs))
    job = ShardJob(kind="export", scenario=scenario, cases_path=str(Path(run_dir).resolve()),
                   out_dir=str(Path(out_dir).resolve()), fmt=fmt, file_format=file_format, source=str(run_dir),
                   config=cfg, min_overall=min_overall, reference=reference)
    return _make_corpus(Path(out_dir), request, job, specs, resume=resume, ray=ray, num_cpus=num_cpus,
                        on_shard=on_shard)


def _make_corpus(out: Path, request: CorpusRequest, job: ShardJob, specs: Sequence[ShardSpec], *, resume: bool,
                 ray: str | None, num_cpus: int | None,
                 on_shard: Callable[[ShardEntry, int, int], None] | None) -> CorpusManifest:
    """Make the shards not yet finished (here one at a time, or on Ray), record each as it arrives,
    then write the complete manifest."""
    done = _start(out, request, resume)
    todo = [s for s in specs if s.index not in done]
    finished = len(done)

    def record(entry: ShardEntry) -> None:
        nonlocal finished
        _record(out, entry)
        finished += 1
        if on_shard is not None:
            on_shard(entry, finished, len(specs))

    if ray is None:
        for spec in todo:
            record(make_shard(job, spec))
    else:
        _ray_shards(job, todo, record, ray, num_cpus)
    return _finish(out, request)


def _ray_shards(job: ShardJob, todo: Sequence[ShardSpec], record: Callable[[ShardEntry], None],
                address: str, num_cpus: int | None) -> None:
    """The shards as a Ray Data pipeline: a dataset of shard specs (one block each), mapped by workers
    that write their shard's file and return its entry, streamed back to the driver as they finish
    (Ray Data's streaming executor: bounded in-flight work, failed tasks retried)."""
    if not todo:
        return
    try:
        with distributed.connect(address, num_cpus) as ray:
            import ray.data as rd

            ctx = rd.DataContext.get_current()
            saved = (ctx.enable_progress_bars, ctx.execution_options.preserve_order, _DATA_LOG.level)
            ctx.enable_progress_bars = False  # the command prints a line per shard instead
            ctx.execution_options.preserve_order = False  # a shard is recorded as soon as it is written
            _DATA_LOG.setLevel(logging.ERROR)  # Ray Data's "Starting execution" and progress-bar notes
            try:
                # one block per shard; Ray Data retries a task lost with its worker or node (system
                # errors, without limit), never one whose function raised (it would fail again)
                ds: Any = rd.from_items([s.model_dump() for s in todo], override_num_blocks=len(todo))
                ds = ds.map(_shard_row, fn_kwargs={"job": job}, num_cpus=1,
                            compute=rd.TaskPoolStrategy(size=min(len(todo), distributed.cluster_cpus(ray))))
                for row in ds.iter_rows():
                    record(ShardEntry.model_validate_json(row["entry"]))
            finally:
                ctx.enable_progress_bars, ctx.execution_options.preserve_order, level = saved
                _DATA_LOG.setLevel(level)
    except distributed.DistributedError as exc:
        raise CorpusError(f"{exc} (the corpus is resumable: run the same command with --resume)") from None
    except CorpusError:
        raise
    except Exception as exc:  # noqa: BLE001 - a shard that failed for good on Ray ends the job cleanly
        raise CorpusError(f"a shard failed on Ray: {_first_lines(exc)} (the corpus is resumable: "
                          "run the same command with --resume)") from None


def _first_lines(exc: BaseException, lines: int = 12) -> str:
    text = str(exc).strip().splitlines()
    return "\n".join(text[:lines] + (["…"] if len(text) > lines else []))


def _finish(out: Path, request: CorpusRequest) -> CorpusManifest:
    """The complete manifest, from the recorded shards (verified), in shard order."""
    done = finished_shards(out, check_hash=False)
    missing = [i for i in range(request.shards) if i not in done]
    if missing:
        raise CorpusError(f"shards {missing[:5]} of {out} were not written (run the same command with --resume)")
    shards = [done[i] for i in range(request.shards)]
    totals = {k: sum(s.counts.get(k, 0) for s in shards) for k in _COUNTS}
    manifest = CorpusManifest(request=request, complete=True, shards=shards, totals=totals,
                              bytes=sum(s.bytes for s in shards))
    _write_manifest(out, manifest)
    return manifest
