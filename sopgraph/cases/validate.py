"""Cases checked against their scenario before anything runs on them.

A case file is input like any other: hand-edited, copied between SOP versions, or simply wrong. A run
over a bad case silently scores `None`, so `sop run` refuses the file at the start instead, naming
the case and the problem in one line. Checked per case: the record's schema version, the scenario
name, every truth/system value against its variable's domain (enum values, bools, finite numbers in
range), and the expected path, finals and action trace (`expected_actions`, when the case records
it) re-decided by the reference engine. A `sop_hash` from
another version of the SOP is only a warning when the decision still agrees.

`read_case_lines` reads a JSON Lines file with bounds (regular files only, a size and line limit),
so `--cases /dev/zero` or a multi-gigabyte line is refused instead of exhausting memory.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sopgraph.cases.profiles import known_by_default, library
from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.logic import paths as paths_mod
from sopgraph.logic.engine import DecideError, engine_for, validate_value
from sopgraph.records import RECORD_VERSION, Case

MAX_CASES_BYTES = 512 * 1024 * 1024  # a cases file larger than this is refused
MAX_CASE_LINE = 4 * 1024 * 1024  # one case (one JSON line)


class CaseFileError(Error, ValueError):
    """A cases file that cannot be read safely; the message is one line naming the file."""


def read_case_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-empty line of a JSON Lines file, read with bounds."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as exc:
        raise CaseFileError(f"cannot read cases file {p}: {getattr(exc, 'strerror', None) or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise CaseFileError(f"cannot read cases file {p}: not a regular file (a device, pipe or directory)")
        if info.st_size > MAX_CASES_BYTES:
            raise CaseFileError(f"cases file {p} is too large ({info.st_size:,} bytes; at most "
                                f"{MAX_CASES_BYTES:,})")
        lineno = 0
        while True:
            raw = fh.readline(MAX_CASE_LINE + 1)
            if not raw:
                return
            lineno += 1
            if len(raw) > MAX_CASE_LINE:
                raise CaseFileError(f"{p}:{lineno}: line longer than {MAX_CASE_LINE:,} bytes")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CaseFileError(f"{p}:{lineno}: not UTF-8 text (byte {exc.start})") from None
            if lineno == 1:
                text = text.removeprefix("\ufeff")  # a byte-order mark (Windows editors)
            if text.strip():
                yield lineno, text


def _finite(value: Any) -> bool:
    return not (isinstance(value, float) and not math.isfinite(value))


def _values_problems(scenario: ir.Scenario, case: Case, section: str, role: str) -> list[str]:
    values: dict[str, Any] = getattr(case, section)
    out: list[str] = []
    for name, value in values.items():
        var = scenario.variables.get(name)
        if var is None or var.role != role:
            kind = "field" if role == "field" else "system variable"
            out.append(f"`{section}` names `{name}`, which is not a {kind} of `{scenario.name}`")
            continue
        if value is None:
            continue  # a value the case leaves open (never read on its path)
        if var.observed:  # procedures: one value per look, given as a list (the engines check the count)
            if not isinstance(value, list):
                out.append(f"{section}: value {json.dumps(value, default=str)} of `{name}` is not a list "
                           "(give one value per look)")
                continue
            looks = value
        else:
            looks = [value]
        for k, one in enumerate(looks, 1):
            try:
                validate_value(var, one)
            except DecideError as exc:
                out.append(f"{section}: {exc.message}" + (f" (look {k})" if var.observed else ""))
    return out


def case_problems(scenario: ir.Scenario, case: Case) -> list[str]:
    """Every reason the case cannot be run against `scenario` (empty: the case is sound)."""
    if case.schema_version > RECORD_VERSION:
        return [f"schema_version {case.schema_version} is newer than this sopgraph reads ({RECORD_VERSION}); "
                "upgrade sopgraph or re-synthesize the cases"]
    if case.schema_version < 1:
        return [f"schema_version {case.schema_version} is not a valid version"]
    if case.scenario and case.scenario != scenario.name:
        return [f"the case is for scenario `{case.scenario}`, not `{scenario.name}`"]
    out = _values_problems(scenario, case, "truth", "field") + _values_problems(scenario, case, "system", "system")
    if out:
        return out
    values = {**case.truth, **case.system}
    try:
        path, finals, actions = engine_for(scenario).decide_trace_raw(
            {k: v for k, v in values.items() if v is not None})
    except DecideError as exc:
        return [f"the SOP cannot decide the case's values: {exc.message}"]
    if list(path) != list(case.expected_path):
        return [f"expected_path {' -> '.join(case.expected_path) or '(empty)'} is not what the SOP decides "
                f"for its values ({' -> '.join(path)}); re-synthesize the cases"]
    for key, want in case.expected_finals.items():
        got = finals.get(key, None)
        if key not in finals:
            return [f"expected_finals names `{key}`, which is not an output of `{scenario.name}`"]
        if not _finite(want) or got != want:
            return [f"expected_finals `{key}` = {json.dumps(want, default=str)} but the SOP decides "
                    f"{json.dumps(got, default=str)}; re-synthesize the cases"]
    if case.expected_actions is not None and case.expected_actions != actions:
        return [f"expected_actions {_trace_text(case.expected_actions)} is not what the SOP carries out for its "
                f"values ({_trace_text(actions)}); re-synthesize the cases"]
    return []


def _trace_text(actions: Sequence[Any]) -> str:
    """`A, B(x=1)`: an action trace in one line (messages)."""
    out = []
    for a in actions:
        if not isinstance(a, dict):
            out.append(json.dumps(a, default=str))
            continue
        args = a.get("args") or {}
        shown = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in args.items()) if isinstance(args, dict) \
            else json.dumps(args, default=str)
        out.append(f"{a.get('name')}({shown})" if shown else str(a.get("name")))
    return ", ".join(out) or "(none)"


def check_cases(scenario: ir.Scenario, cases: Sequence[Case], *, source: str = "cases") -> list[str]:
    """Refuse unsound cases (raises `CaseFileError` with the first problem, and how many more);
    returns warnings (cases synthesized from another version of the SOP that still agree)."""
    problems: list[str] = []
    stale = 0
    for case in cases:
        found = case_problems(scenario, case)
        problems += [f"case {case.id!r}: {p}" for p in found]
        if not found and case.sop_hash and case.sop_hash != scenario.source_hash:
            stale += 1
    if problems:
        more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" \
            if len(problems) > 1 else ""
        raise CaseFileError(f"{source}: {problems[0]}{more}")
    warnings = []
    if stale:
        warnings.append(f"{stale} case(s) were synthesized from another version of the SOP (sop_hash "
                        "differs); their expected paths still agree with this version")
    return warnings


# ---------------------------------------------------------------------------------------------
# Hand-written cases: what the SOP decides is filled in

HAND_WRITTEN_INTENT = "hand-written"


def complete_case(scenario: ir.Scenario, obj: Any) -> Any:
    """A case written by hand, or converted from another benchmark's test data, needs only `id`,
    `truth` and `system` (and may give `intent_description`, `persona` — a library name or an
    object —, `intensity`, `unsafe_action`, `user_facts`). The rest is what the SOP decides for those
    values and is filled in: `scenario`, `expected_path`, `expected_finals`, `expected_actions`, `path_id`,
    `prohibited_actions` (risky actions the trace does not carry out), `bucket`, `intent`, the persona
    (the library's first) and `user_facts` (the system values that are not `hidden`). Anything given
    is kept as it is (and still checked); values the SOP cannot decide are left for the check to name."""
    if not isinstance(obj, dict) or not isinstance(obj.get("truth"), dict) or not isinstance(obj.get("system"), dict):
        return obj
    out = dict(obj)
    out.setdefault("scenario", scenario.name)
    out.setdefault("intent", HAND_WRITTEN_INTENT)
    persona = out.get("persona")
    if persona is None or isinstance(persona, str):
        out["persona"] = _library_persona(persona)
    out.setdefault("user_facts", {k: v for k, v in obj["system"].items()
                                  if k in scenario.variables and known_by_default(scenario.variables[k])})
    if all(k in out for k in ("expected_path", "expected_finals", "path_id")):
        return out
    values = {k: v for k, v in {**obj["truth"], **obj["system"]}.items() if v is not None}
    try:
        path, finals, actions = engine_for(scenario).decide_trace_raw(values)
        stages, branches = paths_mod.trace(scenario, values)
        info = paths_mod.path_by_decisions(scenario, stages, branches, witnesses=False)
    except (DecideError, ValueError, TypeError, KeyError):
        return out
    out.setdefault("expected_path", list(path))
    out.setdefault("expected_finals", dict(finals))
    out.setdefault("expected_actions", [dict(a) for a in actions])
    out.setdefault("path_id", info.id if info is not None else paths_mod.walk_id(stages, branches))
    taken = {str(a.get("name")) for a in actions} | {str(finals.get("Action"))}
    out.setdefault("prohibited_actions", [a.name for a in scenario.actions.values() if a.risky and a.name not in taken])
    final = scenario.actions.get(str(finals.get("Action")))
    if "bucket" not in out:
        out["bucket"] = ("must-escalate" if final is not None and "escalation" in final.attributes else
                         "adversarial" if out.get("intensity") == "strong" else "resolvable")
    return out


def _library_persona(name: str | None) -> dict[str, Any]:
    personas = library().personas
    chosen = next((p for p in personas if p.name == name), None) if name else personas[0]
    if chosen is None:
        known = ", ".join(p.name for p in personas)
        raise CaseFileError(f"persona `{name}` is not in the library ({known}); give an object or one of these")
    return chosen.to_persona().model_dump()
