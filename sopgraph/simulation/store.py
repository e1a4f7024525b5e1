"""The run store: one SQLite file (`run.sqlite`) per run directory, the source of truth of a run.

Why SQLite: a run must survive being killed at any moment (SIGKILL, power loss) and be resumed, be
re-judged years later, and be scored over millions of turns. One file with WAL journaling gives
atomic per-turn commits, cheap appends (`synchronous=NORMAL`) and fast indexed reads; JSONL/CSV are
exports made from it.

Layout (every record row also has `schema_version`, `sop_hash` and `tool_version` columns; `data`
holds the full pydantic record as JSON, the other columns are for indexing and queries):

    meta        key TEXT PRIMARY KEY, value JSON    -- run config, models (no secrets), sop hash,
                                                      tool version, created, scenario IR, judgment sets
    cases       id, ord, data                       -- records.Case, in input order
    dialogues   id, ord, case_id, trial, status, end_reason, turns, error, data   -- records.Dialogue
    turns       dialogue_id, idx, format_error, data                              -- records.Turn
    judgments   judgment_set, dialogue_id, turn_index, judge, model, data         -- records.Judgment
    consensus   judgment_set, dialogue_id, turn_index, data                       -- records.Consensus
    usage       dialogue_id, turn_index, role, model, judgment_set, tokens, cost, calls, discarded
                -- one row per answered model call, written as it returns; rows of a restarted
                   attempt (or of a crashed one) are kept (money was spent) but marked `discarded`

Reading API (for scoring and reports; all results are in a deterministic order)::

    store = RunStore.open(run_dir)            # read-only use is fine while a run is writing (WAL)
    store.meta() -> dict                      # config, models, sop_hash, tool_version, created, ...
    store.scenario() -> ir.Scenario           # the SOP the run was made with (stored IR)
    store.cases() -> list[Case]               # input order
    store.dialogues(status=None) -> list[Dialogue]        # ordered by (case order, trial)
    store.turns(dialogue_id=None, status=None) -> list[Turn]  # ordered by (dialogue id, index)
    store.iter_turns(status=None, batch=2000) -> Iterator[Turn]   # streaming, constant memory
    store.iter_turn_dicts(status=None) -> Iterator[dict]  # same, plain dicts (no pydantic): fastest
    store.judgments(judgment_set=None, dialogue_id=None) -> list[Judgment]
    store.consensus(judgment_set=None, dialogue_id=None) -> list[Consensus]
    store.judgment_sets() -> list[str]
    store.usage_totals(include_discarded=True) -> dict[role, Usage]
    store.summary() -> dict                   # counts used by `sop runs show`

Scorers should read `dialogues(status="done")` / `iter_turns(status="done")`: dialogues that are
`running` (a run in progress or killed) or `infra_failure` are not results.

Writing is done by one writer (the runner's event loop) through the `add_*`/`start_*`/`finish_*`
methods; each finished turn is exactly one transaction. Nothing secret is ever written: model
parameters are passed through `redact_params`, and free text (errors) through `gateway.redact`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from sopgraph._version import __version__
from sopgraph.errors import Error
from sopgraph.language.ir import Scenario
from sopgraph.records import RECORD_VERSION, Case, Consensus, Dialogue, Judgment, Turn, Usage
from sopgraph.simulation.gateway import REDACTED_PARAM, is_safe_param, public_params, redact

STORE_FILE = "run.sqlite"
STORE_VERSION = 1
TOOL_VERSION = __version__
REDACTED = REDACTED_PARAM

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cases (
    id TEXT PRIMARY KEY, ord INTEGER NOT NULL, data TEXT NOT NULL,
    schema_version INTEGER NOT NULL, sop_hash TEXT NOT NULL, tool_version TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dialogues (
    id TEXT PRIMARY KEY, ord INTEGER NOT NULL, case_id TEXT NOT NULL, trial INTEGER NOT NULL,
    status TEXT NOT NULL, end_reason TEXT, turns INTEGER NOT NULL DEFAULT 0, error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, data TEXT NOT NULL,
    schema_version INTEGER NOT NULL, sop_hash TEXT NOT NULL, tool_version TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS dialogues_status ON dialogues(status, ord);
CREATE TABLE IF NOT EXISTS turns (
    dialogue_id TEXT NOT NULL, idx INTEGER NOT NULL, format_error INTEGER NOT NULL, data TEXT NOT NULL,
    schema_version INTEGER NOT NULL, sop_hash TEXT NOT NULL, tool_version TEXT NOT NULL,
    PRIMARY KEY (dialogue_id, idx));
CREATE TABLE IF NOT EXISTS judgments (
    judgment_set TEXT NOT NULL, dialogue_id TEXT NOT NULL, turn_index INTEGER NOT NULL,
    judge TEXT NOT NULL, model TEXT NOT NULL, scored INTEGER NOT NULL, data TEXT NOT NULL,
    schema_version INTEGER NOT NULL, sop_hash TEXT NOT NULL, tool_version TEXT NOT NULL,
    PRIMARY KEY (judgment_set, dialogue_id, turn_index, judge));
CREATE TABLE IF NOT EXISTS consensus (
    judgment_set TEXT NOT NULL, dialogue_id TEXT NOT NULL, turn_index INTEGER NOT NULL,
    data TEXT NOT NULL,
    schema_version INTEGER NOT NULL, sop_hash TEXT NOT NULL, tool_version TEXT NOT NULL,
    PRIMARY KEY (judgment_set, dialogue_id, turn_index));
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY, dialogue_id TEXT NOT NULL, turn_index INTEGER NOT NULL,
    role TEXT NOT NULL, model TEXT NOT NULL, judgment_set TEXT,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
    reasoning_tokens INTEGER NOT NULL, cost REAL NOT NULL, cost_known INTEGER NOT NULL,
    calls INTEGER NOT NULL, discarded INTEGER NOT NULL DEFAULT 0,
    schema_version INTEGER NOT NULL, sop_hash TEXT NOT NULL, tool_version TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS usage_dialogue ON usage(dialogue_id);
"""


class StoreError(Error):
    """A run directory that cannot be used (missing, not a run, already a run, newer format,
    corrupted); the message names the file and says what to do."""


_HINT = "restore it from a backup, or start a new run in another directory (-o)"
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_header(path: Path) -> None:
    """Refuse a file that is not a SQLite database without touching it (no connection is made)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from None
    if head != _SQLITE_MAGIC:
        what = "empty" if not head else "not a SQLite database"
        raise StoreError(f"{path} is {what}, not a sopgraph run store; {_HINT}")


def _decode(model: Any, data: Any, path: Path, table: str) -> Any:
    """One stored row as a record; a row that is not valid JSON or not a valid record is named."""
    try:
        return model.model_validate_json(data)
    except ValueError as exc:
        first = exc.errors()[0] if hasattr(exc, "errors") and exc.errors() else {"msg": str(exc)[:200]}
        raise StoreError(f"{path}: a row of `{table}` is not a valid {model.__name__} record "
                         f"({first.get('msg')}); {_HINT}") from None


def _json(data: Any, path: Path, table: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, TypeError) as exc:
        raise StoreError(f"{path}: a row of `{table}` is not valid JSON ({exc}); {_HINT}") from None


# ---------------------------------------------------------------------------------------------
# Secrets

def is_secret_param(name: str, value: Any = None) -> bool:
    """Whether a model parameter must never be stored: anything not on the gateway's allow-list
    (`gateway.SAFE_PARAMS`; `api_key_env` only when its value is a variable *name*)."""
    return not is_safe_param(name, value)


def redact_params(obj: Any) -> Any:
    """A copy of a model spec dump with every parameter not on the allow-list replaced by a marker and
    URLs stripped of credentials (userinfo, query)."""
    return public_params(obj)


def redact_text(text: str | None, extra: Iterable[str] = ()) -> str | None:
    """Free text (error messages) without API-key-like strings."""
    if not text:
        return text

    return redact(text, extra)


# ---------------------------------------------------------------------------------------------


def _dumps(obj: Any) -> str:
    # Key order is kept, never sorted: the stored scenario IR's dict order is meaningful.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _runs_within(directory: Path) -> str:
    """A hint when `directory` holds run directories (a directory of runs given where one run is wanted):
    `; it holds 3 runs (e.g. runs/oracle): name one of them`."""
    try:
        runs = sorted(p.parent for p in directory.glob(f"*/{STORE_FILE}") if p.is_file())
    except OSError:
        return ""
    if not runs:
        return ""
    return (f"; it holds {len(runs)} run{'s' if len(runs) != 1 else ''} (e.g. {runs[0]}): name one of them"
            " (`sop leaderboard` and `sop view` take several)")


def _read_only_uri(path: Path) -> str:
    """A read-only SQLite URI. While a writer has the run open (its `-wal` file exists) the reader
    shares the WAL and sees new turns; otherwise the file is opened `immutable`, so that not even
    the `-wal`/`-shm` side files are created in the run directory."""
    wal = path.with_name(path.name + "-wal")
    uri = path.resolve().as_uri() + "?mode=ro"
    return uri if wal.exists() else uri + "&immutable=1"


def _connect_read_only(path: Path, *, check_same_thread: bool = True) -> sqlite3.Connection:
    return sqlite3.connect(_read_only_uri(path), uri=True, isolation_level=None, timeout=30.0,
                           check_same_thread=check_same_thread)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute("PRAGMA cache_size=-32000")
    return conn


def _connect_checked(path: Path, *, read_only: bool) -> sqlite3.Connection:
    """A connection to `path` once it has shown itself a run store this version reads: an SQLite file
    (checked before connecting: sqlite would turn a 0-byte file into a database) with a `meta` table,
    intact (`quick_check`), of a store version no newer than ours. Anything else is a StoreError
    saying what to do, never sqlite's traceback."""
    _check_header(path)
    conn = None
    try:
        conn = _connect_read_only(path, check_same_thread=False) if read_only else _connect(path)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        conn.execute("SELECT 1 FROM meta LIMIT 1")
        check = conn.execute("PRAGMA quick_check(1)").fetchone()
        row = conn.execute("SELECT value FROM meta WHERE key='store_version'").fetchone()
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()
        raise StoreError(f"{path} is not a readable sopgraph run store ({exc}); {_HINT}") from None
    if check is None or check[0] != "ok":
        conn.close()
        detail = " ".join(str(check[0]).split()) if check else "integrity check failed"
        raise StoreError(f"{path} is corrupted ({detail}); {_HINT}")
    try:
        meta_version = int(json.loads(row[0])) if row else version
    except (ValueError, TypeError):
        conn.close()
        raise StoreError(f"{path}: meta `store_version` is not a number; {_HINT}") from None
    if max(version, meta_version) > STORE_VERSION:
        conn.close()
        raise StoreError(f"{path} was written by a newer sopgraph (store version "
                         f"{max(version, meta_version)}; this one reads {STORE_VERSION}); upgrade sopgraph")
    return conn


class RunStore:
    """One run directory's SQLite store (see the module docstring for the layout and API)."""
    def __init__(self, run_dir: Path, conn: sqlite3.Connection, *, secrets: Iterable[str] = (),
                 read_only: bool = False):
        self.run_dir = run_dir
        self.path = run_dir / STORE_FILE
        self.conn = conn
        self.secrets = [s for s in secrets if s]
        self.read_only = read_only
        self._sop_hash: str | None = None
        self._in_transaction = False

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(cls, run_dir: str | Path, meta: Mapping[str, Any], *, secrets: Iterable[str] = ()) -> RunStore:
        """A new store in `run_dir` (created if needed); refuses a directory that already holds a run."""
        run_dir = Path(run_dir)
        path = run_dir / STORE_FILE
        if path.exists():
            raise StoreError(f"{run_dir} already holds a run; resume it with --resume or choose another -o")
        run_dir.mkdir(parents=True, exist_ok=True)
        conn = _connect(path)
        conn.executescript(_SCHEMA)
        conn.execute(f"PRAGMA user_version={STORE_VERSION}")
        store = cls(run_dir, conn, secrets=secrets)
        base = {
            "store_version": STORE_VERSION,
            "schema_version": RECORD_VERSION,
            "tool_version": TOOL_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with store.transaction():
            for key, value in {**base, **meta}.items():
                store._set_meta(key, value)
        return store

    @classmethod
    def open(cls, run_dir: str | Path, *, secrets: Iterable[str] = (), read_only: bool = False) -> RunStore:
        """Open an existing run directory (raises StoreError if it is not one).

        `read_only=True` (browsing, `sop view`): the connection cannot write, closing does not
        checkpoint, and the store may be used from several threads (the caller serialises access)."""
        run_dir = Path(run_dir)
        path = run_dir / STORE_FILE
        if not path.is_file():
            raise StoreError(f"{run_dir} is not a run directory (no {STORE_FILE}){_runs_within(run_dir)}")
        return cls(run_dir, _connect_checked(path, read_only=read_only), secrets=secrets, read_only=read_only)

    def close(self) -> None:
        """Close the connection (checkpointing the WAL, unless opened read-only)."""
        if not self.read_only:
            with suppress(sqlite3.Error):
                self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error). Inside another
        transaction it joins that one, so that several writes can be committed as one group."""
        if self.read_only:
            raise StoreError(f"{self.path} was opened read-only; it cannot be written")
        if self._in_transaction:
            yield self.conn
            return
        self.conn.execute("BEGIN IMMEDIATE")
        self._in_transaction = True
        try:
            yield self.conn
        except BaseException:
            self._in_transaction = False
            self.conn.execute("ROLLBACK")
            raise
        self._in_transaction = False
        self.conn.execute("COMMIT")

    # ------------------------------------------------------------------ meta
    def _set_meta(self, key: str, value: Any) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, _dumps(value)))

    def set_meta(self, key: str, value: Any) -> None:
        """Store one meta entry (JSON value) in its own transaction."""
        with self.transaction():
            self._set_meta(key, value)

    def meta(self) -> dict[str, Any]:
        """Every meta entry, decoded."""
        rows = self.conn.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
        return {k: _json(v, self.path, "meta") for k, v in rows}

    def meta_value(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return _json(row[0], self.path, "meta") if row else default

    @property
    def sop_hash(self) -> str:
        if self._sop_hash is None:
            self._sop_hash = str(self.meta_value("sop_hash", ""))
        return self._sop_hash

    def scenario(self):  # -> ir.Scenario
        """The scenario IR stored at run creation (re-judging needs no source file)."""
        raw = self.meta_value("scenario")
        if raw is None:
            raise StoreError(f"{self.path} holds no scenario")
        try:
            return Scenario.model_validate(raw)
        except ValueError:
            raise StoreError(f"{self.path}: the stored scenario is not a valid scenario record; {_HINT}") from None

    def _stamp(self) -> tuple[int, str, str]:
        return RECORD_VERSION, self.sop_hash, TOOL_VERSION

    # ------------------------------------------------------------------ cases and dialogues
    def add_cases(self, cases: Iterable[Case]) -> None:
        """Insert cases in order (one transaction)."""
        stamp = self._stamp()
        with self.transaction() as c:
            start = c.execute("SELECT COALESCE(MAX(ord) + 1, 0) FROM cases").fetchone()[0]
            c.executemany(
                "INSERT INTO cases(id, ord, data, schema_version, sop_hash, tool_version) VALUES (?,?,?,?,?,?)",
                [(case.id, start + i, case.model_dump_json(), *stamp) for i, case in enumerate(cases)],
            )

    def add_dialogues(self, dialogues: Iterable[Dialogue]) -> None:
        """Insert new dialogue rows (status as given, usually pending) in order."""
        stamp = self._stamp()
        with self.transaction() as c:
            start = c.execute("SELECT COALESCE(MAX(ord) + 1, 0) FROM dialogues").fetchone()[0]
            c.executemany(
                "INSERT INTO dialogues(id, ord, case_id, trial, status, end_reason, turns, error, data, "
                "schema_version, sop_hash, tool_version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (d.id, start + i, d.case_id, d.trial, d.status, d.end_reason, d.turns, d.error,
                     d.model_dump_json(), *stamp)
                    for i, d in enumerate(dialogues)
                ],
            )

    def _write_dialogue(self, c: sqlite3.Connection, d: Dialogue, *, attempt: bool = False) -> None:
        d = d.model_copy(update={"error": redact_text(d.error, self.secrets)})
        c.execute(
            "UPDATE dialogues SET status=?, end_reason=?, turns=?, error=?, data=?"
            + (", attempts = attempts + 1" if attempt else "")
            + " WHERE id=?",
            (d.status, d.end_reason, d.turns, d.error, d.model_dump_json(), d.id),
        )

    def _clear_dialogue(self, c: sqlite3.Connection, dialogue_id: str) -> None:
        c.execute("DELETE FROM turns WHERE dialogue_id=?", (dialogue_id,))
        c.execute("DELETE FROM judgments WHERE dialogue_id=?", (dialogue_id,))
        c.execute("DELETE FROM consensus WHERE dialogue_id=?", (dialogue_id,))
        c.execute("UPDATE usage SET discarded=1 WHERE dialogue_id=?", (dialogue_id,))

    def start_dialogue(self, dialogue: Dialogue) -> None:
        """(Re)start a dialogue from scratch in one transaction: drop any partial turns, judgments
        and consensus of an earlier attempt, mark that attempt's usage discarded, set it running."""
        with self.transaction() as c:
            self._clear_dialogue(c, dialogue.id)
            self._write_dialogue(c, dialogue, attempt=True)

    def add_turn(self, turn: Turn, usage: Iterable[Mapping[str, Any]] = ()) -> None:
        """Append one finished turn and its usage rows (one transaction)."""
        stamp = self._stamp()
        with self.transaction() as c:
            c.execute(
                "INSERT INTO turns(dialogue_id, idx, format_error, data, schema_version, sop_hash, tool_version)"
                " VALUES (?,?,?,?,?,?,?)",
                (turn.dialogue_id, turn.index, int(turn.format_error), turn.model_dump_json(), *stamp),
            )
            self._add_usage(c, usage)

    def finish_dialogue(
        self,
        dialogue: Dialogue,
        judgments: Iterable[Judgment] = (),
        consensus: Iterable[Consensus] = (),
        usage: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """Store the dialogue's final state with its judgments, consensus and usage (one transaction)."""
        with self.transaction() as c:
            self._add_judgments(c, judgments, consensus)
            self._add_usage(c, usage)
            self._write_dialogue(c, dialogue)

    def fail_dialogue(self, dialogue: Dialogue, usage: Iterable[Mapping[str, Any]] = ()) -> None:
        """Mark an infrastructure failure: partial turns and judgments are dropped (they are not
        results); the error is kept; the attempt's usage is kept but marked discarded."""
        with self.transaction() as c:
            self._add_usage(c, usage)
            self._clear_dialogue(c, dialogue.id)
            self._write_dialogue(c, dialogue)

    def add_usage(self, usage: Iterable[Mapping[str, Any]]) -> None:
        """Usage rows of model calls, written as the calls return (one transaction): a dialogue restarted
        later marks them discarded, so a crash loses no spent tokens and counts none as a result's."""
        with self.transaction() as c:
            self._add_usage(c, usage)

    def restart_judging(self, dialogue_id: str, judgment_set: str) -> None:
        """Judge a dialogue again from its kept transcript (one transaction): drop its judgments and consensus
        in `judgment_set` and mark the usage of the earlier judging discarded; its turns stay."""
        with self.transaction() as c:
            c.execute("DELETE FROM judgments WHERE dialogue_id=? AND judgment_set=?", (dialogue_id, judgment_set))
            c.execute("DELETE FROM consensus WHERE dialogue_id=? AND judgment_set=?", (dialogue_id, judgment_set))
            c.execute("UPDATE usage SET discarded=1 WHERE dialogue_id=? AND judgment_set=?", (dialogue_id, judgment_set))

    def add_judgments(
        self,
        judgments: Iterable[Judgment],
        consensus: Iterable[Consensus],
        usage: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        """Store judgments and consensus of one dialogue (re-judging; one transaction)."""
        with self.transaction() as c:
            self._add_judgments(c, judgments, consensus)
            self._add_usage(c, usage)

    def _add_judgments(
        self, c: sqlite3.Connection, judgments: Iterable[Judgment], consensus: Iterable[Consensus]
    ) -> None:
        stamp = self._stamp()
        rows = []
        for j in judgments:
            if j.unscored_reason:
                j = j.model_copy(update={"unscored_reason": redact_text(j.unscored_reason, self.secrets)})
            rows.append((j.judgment_set, j.dialogue_id, j.turn_index, j.judge, j.model,
                         int(j.labels is not None), j.model_dump_json(), *stamp))
        c.executemany(
            "INSERT OR REPLACE INTO judgments(judgment_set, dialogue_id, turn_index, judge, model, scored, data,"
            " schema_version, sop_hash, tool_version) VALUES (?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
        c.executemany(
            "INSERT OR REPLACE INTO consensus(judgment_set, dialogue_id, turn_index, data,"
            " schema_version, sop_hash, tool_version) VALUES (?,?,?,?,?,?,?)",
            [(k.judgment_set, k.dialogue_id, k.turn_index, k.model_dump_json(), *stamp) for k in consensus],
        )

    def _add_usage(self, c: sqlite3.Connection, usage: Iterable[Mapping[str, Any]]) -> None:
        stamp = self._stamp()
        rows = [
            (u["dialogue_id"], u.get("turn_index", 0), u["role"], u.get("model", ""), u.get("judgment_set"),
             u.get("prompt_tokens", 0), u.get("completion_tokens", 0), u.get("reasoning_tokens", 0),
             float(u.get("cost", 0.0)), int(u.get("cost_known", True)), u.get("calls", 1),
             int(u.get("discarded", False)), *stamp)
            for u in usage
        ]
        if rows:
            c.executemany(
                "INSERT INTO usage(dialogue_id, turn_index, role, model, judgment_set, prompt_tokens,"
                " completion_tokens, reasoning_tokens, cost, cost_known, calls, discarded, schema_version, sop_hash,"
                " tool_version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                rows,
            )

    def clear_judgment_set(self, judgment_set: str, dialogue_id: str | None = None) -> None:
        """Drop a judgment set (or one dialogue's part of it)."""
        where, args = "judgment_set=?", [judgment_set]
        if dialogue_id is not None:
            where += " AND dialogue_id=?"
            args.append(dialogue_id)
        with self.transaction() as c:
            c.execute(f"DELETE FROM judgments WHERE {where}", args)
            c.execute(f"DELETE FROM consensus WHERE {where}", args)

    # ------------------------------------------------------------------ reading
    def cases(self) -> list[Case]:
        rows = self.conn.execute("SELECT data FROM cases ORDER BY ord").fetchall()
        return [_decode(Case, r[0], self.path, "cases") for r in rows]

    def dialogues(self, status: str | Iterable[str] | None = None) -> list[Dialogue]:
        where, args = _status_filter("", status)
        rows = self.conn.execute(f"SELECT data FROM dialogues {where} ORDER BY ord", args).fetchall()
        return [_decode(Dialogue, r[0], self.path, "dialogues") for r in rows]

    def dialogue(self, dialogue_id: str) -> Dialogue | None:
        row = self.conn.execute("SELECT data FROM dialogues WHERE id=?", (dialogue_id,)).fetchone()
        return _decode(Dialogue, row[0], self.path, "dialogues") if row else None

    def _turn_query(self, dialogue_id: str | None, status: str | Iterable[str] | None) -> tuple[str, list]:
        if dialogue_id is not None:
            return "SELECT data FROM turns WHERE dialogue_id=? ORDER BY idx", [dialogue_id]
        if status is None:
            return "SELECT data FROM turns ORDER BY dialogue_id, idx", []
        where, args = _status_filter("d.", status)
        return (
            "SELECT t.data FROM turns t JOIN dialogues d ON d.id = t.dialogue_id "
            f"{where} ORDER BY t.dialogue_id, t.idx",
            args,
        )

    def turns(self, dialogue_id: str | None = None, status: str | Iterable[str] | None = None) -> list[Turn]:
        """Turns of one dialogue (by index) or of all (by dialogue id, index), optionally only of
        dialogues with the given status."""
        return list(self.iter_turns(dialogue_id=dialogue_id, status=status))

    def iter_turns(
        self, status: str | Iterable[str] | None = None, *, dialogue_id: str | None = None, batch: int = 2000
    ) -> Iterator[Turn]:
        """Stream turns as records with constant memory (fetches `batch` rows at a time)."""
        for data in self._iter_data(*self._turn_query(dialogue_id, status), batch=batch):
            yield _decode(Turn, data, self.path, "turns")

    def iter_turn_dicts(
        self, status: str | Iterable[str] | None = None, *, dialogue_id: str | None = None, batch: int = 2000
    ) -> Iterator[dict[str, Any]]:
        """Stream turns as plain dicts (the Turn JSON, unvalidated): the fast path for scoring
        millions of rows."""
        loads = json.loads
        for data in self._iter_data(*self._turn_query(dialogue_id, status), batch=batch):
            try:
                row = loads(data)
            except (ValueError, TypeError):
                row = _json(data, self.path, "turns")  # raises StoreError naming the file
            if not isinstance(row, dict):
                raise StoreError(f"{self.path}: a row of `turns` is not a JSON object; {_HINT}")
            yield row

    def _iter_data(self, sql: str, args: list, *, batch: int) -> Iterator[str]:
        # A separate connection, so that a long read never interleaves with the writer's cursor.
        conn = _connect_read_only(self.path) if self.read_only else sqlite3.connect(self.path, timeout=30.0)
        try:
            cur = conn.execute(sql, args)
            while True:
                rows = cur.fetchmany(batch)
                if not rows:
                    break
                for (data,) in rows:
                    yield data
        finally:
            conn.close()

    def judgments(self, judgment_set: str | None = None, dialogue_id: str | None = None) -> list[Judgment]:
        where, args = _key_filter(judgment_set, dialogue_id)
        rows = self.conn.execute(
            f"SELECT data FROM judgments {where} ORDER BY judgment_set, dialogue_id, turn_index, judge", args
        ).fetchall()
        return [_decode(Judgment, r[0], self.path, "judgments") for r in rows]

    def consensus(self, judgment_set: str | None = None, dialogue_id: str | None = None) -> list[Consensus]:
        where, args = _key_filter(judgment_set, dialogue_id)
        rows = self.conn.execute(
            f"SELECT data FROM consensus {where} ORDER BY judgment_set, dialogue_id, turn_index", args
        ).fetchall()
        return [_decode(Consensus, r[0], self.path, "consensus") for r in rows]

    def judgment_sets(self) -> list[str]:
        """Names of the judgment sets present (plus those declared in meta), sorted."""
        rows = self.conn.execute("SELECT DISTINCT judgment_set FROM consensus").fetchall()
        names = {r[0] for r in rows} | set((self.meta_value("judgment_sets") or {}).keys())
        return sorted(names)

    def judged_dialogues(self, judgment_set: str) -> set[str]:
        """Dialogue ids that already have consensus rows in a judgment set (re-judge resume)."""
        rows = self.conn.execute(
            "SELECT DISTINCT dialogue_id FROM consensus WHERE judgment_set=?", (judgment_set,)
        ).fetchall()
        return {r[0] for r in rows}

    def usage_totals(self, *, include_discarded: bool = True) -> dict[str, Usage]:
        """Usage summed per role (`agent`, `user`, `judge1`, ...)."""
        where = "" if include_discarded else "WHERE discarded = 0"
        rows = self.conn.execute(
            "SELECT role, SUM(prompt_tokens), SUM(completion_tokens), SUM(reasoning_tokens), SUM(cost),"
            f" MIN(cost_known), SUM(calls) FROM usage {where} GROUP BY role ORDER BY role"
        ).fetchall()
        return {
            r[0]: Usage(prompt_tokens=r[1], completion_tokens=r[2], reasoning_tokens=r[3], cost=r[4],
                        cost_known=bool(r[5]), calls=r[6])
            for r in rows
        }

    def judging_counts(self, judgment_set: str) -> dict[str, int]:
        """The judging counts of one set, as `sop score`, the report and `sop runs show` define them
        (docs/metrics.md): over the turns of done dialogues, `judged_turns` = turns with a consensus
        (the judges were asked), `unscored_judgments` = judges' replies that could not be read,
        `no_consensus_fields` = Σ fields left without a majority on those turns."""
        c = self.conn
        done = "dialogue_id IN (SELECT id FROM dialogues WHERE status='done')"
        judged = c.execute(f"SELECT COUNT(*) FROM consensus WHERE judgment_set=? AND {done}",
                           (judgment_set,)).fetchone()[0]
        unscored = c.execute(f"SELECT COUNT(*) FROM judgments WHERE judgment_set=? AND scored=0 AND {done}",
                             (judgment_set,)).fetchone()[0]
        no_cons = 0
        for (data,) in c.execute(f"SELECT data FROM consensus WHERE judgment_set=? AND {done}", (judgment_set,)):
            no_cons += len(json.loads(data).get("no_consensus") or [])
        return {"judged_turns": judged or 0, "unscored_judgments": unscored or 0, "no_consensus_fields": no_cons}

    def summary(self) -> dict[str, Any]:
        """Counts for a status report (`sop runs show`; see `run_summary`)."""
        return run_summary(self)


def run_summary(store: RunStore) -> dict[str, Any]:
    """A run's counts for a status report (`sop runs show`, `RunStore.summary`): dialogues by status and end
    reason, turns and format errors of done dialogues, infrastructure failures, each judgment set's judging
    counts, usage per role and in all, and what restarted attempts spent (discarded)."""
    c = store.conn
    by_status = dict(c.execute("SELECT status, COUNT(*) FROM dialogues GROUP BY status ORDER BY status"))
    end_reasons = dict(
        c.execute(
            "SELECT end_reason, COUNT(*) FROM dialogues WHERE status='done' GROUP BY end_reason"
            " ORDER BY end_reason"
        )
    )
    turns, format_errors = c.execute(
        "SELECT COUNT(*), COALESCE(SUM(t.format_error), 0) FROM turns t JOIN dialogues d"
        " ON d.id = t.dialogue_id WHERE d.status='done'"
    ).fetchone()
    errors = [
        {"dialogue": r[0], "error": r[1]}
        for r in c.execute("SELECT id, error FROM dialogues WHERE status='infra_failure' ORDER BY ord")
    ]
    sets = {}
    for name in store.judgment_sets():
        sets[name] = {**store.judging_counts(name), **((store.meta_value("judgment_sets") or {}).get(name) or {})}
    usage = store.usage_totals()
    total = Usage()
    for u in usage.values():
        total.prompt_tokens += u.prompt_tokens
        total.completion_tokens += u.completion_tokens
        total.reasoning_tokens += u.reasoning_tokens
        total.cost += u.cost
        total.calls += u.calls
        total.cost_known = total.cost_known and u.cost_known
    discarded = c.execute(
        "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0), COALESCE(SUM(cost), 0) FROM usage"
        " WHERE discarded=1"
    ).fetchone()
    return {
        "run_dir": str(store.run_dir),
        "dialogues": sum(by_status.values()),
        "by_status": by_status,
        "end_reasons": end_reasons,
        "turns": turns,
        "format_errors": format_errors,
        "infra_failures": errors,
        "judgment_sets": sets,
        "usage": {role: u.model_dump() for role, u in usage.items()},
        "tokens": total.prompt_tokens + total.completion_tokens,
        "cost": round(total.cost, 6),
        "cost_known": total.cost_known,
        "discarded_tokens": discarded[0],
        "discarded_cost": round(discarded[1], 6),
    }


def _status_filter(prefix: str, status: str | Iterable[str] | None) -> tuple[str, list]:
    if status is None:
        return "", []
    values = [status] if isinstance(status, str) else list(status)
    marks = ",".join("?" for _ in values)
    return f"WHERE {prefix}status IN ({marks})", values


def _key_filter(judgment_set: str | None, dialogue_id: str | None) -> tuple[str, list]:
    parts, args = [], []
    if judgment_set is not None:
        parts.append("judgment_set=?")
        args.append(judgment_set)
    if dialogue_id is not None:
        parts.append("dialogue_id=?")
        args.append(dialogue_id)
    return ("WHERE " + " AND ".join(parts)) if parts else "", args
