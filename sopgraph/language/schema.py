"""JSON Schemas: the IR, the records, and the per-scenario agent reply (and judge reply).

The agent's reply schema is generated from the `.sop`, so it is exact per scenario: the allowed values of
every classification field, the stage ids of `now_path`, the action names and every declared output.
`validate_agent_output` checks a reply against it without third-party packages (the format-error rate
counts replies it rejects). A registry maps schema names to factories so that other modules can add
their own record schemas (`BUILTIN_SCHEMAS.with_entries(...)`, as the CLI does for profiles).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

import sopgraph.records as records
from sopgraph.errors import ArgumentError, Error
from sopgraph.language import ir, scalars
from sopgraph.records import CHAT_DIMENSIONS

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCORE_VALUES = (3, 6, 9)


# ---------------------------------------------------------------------------------------------
# Types → schemas


def type_schema(vtype: Any, *, nullable: bool = False) -> dict[str, Any]:
    """The JSON Schema of one declared type (enum / bool / int / float with its range)."""
    out: dict[str, Any]
    if isinstance(vtype, ir.EnumType):
        out = {"type": "string", "enum": list(vtype.values)}
    elif isinstance(vtype, ir.BoolType):
        out = {"type": "boolean"}
    elif isinstance(vtype, ir.NumType):
        out = {"type": "integer" if vtype.kind == "int" else "number"}
        if vtype.lo is not None:
            out["exclusiveMinimum" if vtype.lo_open else "minimum"] = _num(vtype.lo)
        if vtype.hi is not None:
            out["exclusiveMaximum" if vtype.hi_open else "maximum"] = _num(vtype.hi)
    elif isinstance(vtype, (ir.ListType, ir.RecordType)):
        out = data_schema(vtype)
    else:
        out = _scalar_schema(vtype)
    if nullable and out:
        out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def data_schema(vtype: ir.ListType | ir.RecordType) -> dict[str, Any]:
    """A list as a JSON array (its length bounds, each item's schema); a record as a JSON object
    with exactly its fields, all required but the optional ones (`note: string?`: absent or null)."""
    if isinstance(vtype, ir.ListType):
        out: dict[str, Any] = {"type": "array", "items": type_schema(vtype.item), "maxItems": vtype.max_len}
        if vtype.min_len:
            out["minItems"] = vtype.min_len
        return out
    return {"type": "object",
            "properties": {f.name: type_schema(f.type, nullable=f.optional) for f in vtype.fields},
            "required": [f.name for f in vtype.fields if not f.optional],
            "additionalProperties": vtype.open}  # `record open`: other fields allowed (and ignored)
def _scalar_schema(vtype: Any) -> dict[str, Any]:
    """Dates and datetimes as ISO strings (`format`), durations by `pattern`, strings bounded."""
    if isinstance(vtype, ir.TimeType):
        if vtype.kind == "duration":
            return {"type": "string", "pattern": scalars.DURATION_PATTERN}
        return {"type": "string", "format": "date" if vtype.kind == "date" else "date-time"}
    if isinstance(vtype, ir.StringType):
        return {"type": "string", "maxLength": scalars.MAX_STRING}
    return {}


def decide_input_schema(scenario: ir.Scenario) -> dict[str, Any]:
    """The JSON object `sop decide` reads: every field and system variable (observed ones as a list,
    one value per look; optional ones may be null; all may be left out, since only the values a path
    reads are needed)."""
    props: dict[str, Any] = {}
    for var in scenario.variables.values():
        if var.role == "derived":
            continue
        one = type_schema(var.type, nullable=var.optional or var.default is not None)
        props[var.name] = _described({"type": "array", "items": one} if var.observed else one, var.description)
    return {"$schema": JSON_SCHEMA_DIALECT, "title": f"{scenario.name} decide input", "type": "object",
            "properties": props, "additionalProperties": True}


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _described(schema: dict[str, Any], description: str) -> dict[str, Any]:
    text = " ".join(description.split())
    return {"description": text, **schema} if text else schema


def agent_output_schema(scenario: ir.Scenario, *, descriptions: bool = True) -> dict[str, Any]:
    """The exact JSON Schema of the agent's per-turn reply for this scenario.

    Every classification field is required with its own type; `now_path` items are stage ids; `finals`
    requires `Action` (an action name) and allows each declared output (optional: its default applies
    when omitted; `null` allowed only when the output has no default). No extra keys anywhere.
    `descriptions=False` leaves out the description texts (the prompt states them elsewhere).
    """
    def described(schema: dict[str, Any], text: str) -> dict[str, Any]:
        return _described(schema, text) if descriptions else schema

    fields = {v.name: described(type_schema(v.type, nullable=v.optional), v.description) for v in scenario.fields}
    finals: dict[str, Any] = {"Action": described({"type": "string", "enum": scenario.final_actions},
                                                  "The final action the SOP leads to.")}
    for name, out in scenario.outputs.items():
        finals[name] = described(type_schema(out.type, nullable=out.default is None), out.description)
    schema: dict[str, Any] = {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": f"{scenario.name} agent reply",
        "type": "object",
        "properties": {
            "classification_output": {
                "type": "object",
                "properties": fields,
                "required": list(fields),
                "additionalProperties": False,
            },
            "cot": {"type": "string", "description": "Brief reasoning: classification and SOP jumps."},
            "now_path": {
                "type": "array",
                "items": {"type": "string", "enum": list(scenario.stages)},
                "description": f"Stage ids passed, in order, starting with {scenario.start}.",
            },
            "finals": {
                "type": "object",
                "properties": finals,
                "required": ["Action"],
                "additionalProperties": False,
            },
            "chat": {"type": "string", "description": "The reply to the customer."},
        },
        "required": ["classification_output", "cot", "now_path", "finals", "chat"],
        "additionalProperties": False,
    }
    if scenario.traced:
        schema["properties"]["actions"] = described(actions_schema(scenario),
                                                    "The actions you carried out so far, in order.")
    if not descriptions:
        for prop in schema["properties"].values():
            prop.pop("description", None)
    return schema


def actions_schema(scenario: ir.Scenario) -> dict[str, Any]:
    """An optional list of `{"name": action, "args": {param: value}}`: the actions an agent reports
    having carried out (compared with the engine's reference trace)."""
    options = []
    for action in scenario.actions.values():
        params = {p.name: type_schema(p.type) for p in action.params}
        options.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [action.name]},
                           "args": {"type": "object", "properties": params, "required": list(params),
                                    "additionalProperties": False}},
            "required": ["name"],
            "additionalProperties": False,
        })
    return {"type": "array", "items": {"anyOf": options}}


def judge_output_schema(scenario: ir.Scenario) -> dict[str, Any]:
    """The JSON Schema of a judge's reply: labels for every field, five scores in {3, 6, 9}, reasons."""
    labels = {v.name: type_schema(v.type) for v in scenario.fields}
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": f"{scenario.name} judge reply",
        "type": "object",
        "properties": {
            "labels": {"type": "object", "properties": labels, "required": list(labels),
                       "additionalProperties": False},
            "scores": {"type": "object",
                       "properties": {d: {"type": "integer", "enum": list(SCORE_VALUES)}
                                      for d in CHAT_DIMENSIONS},
                       "required": list(CHAT_DIMENSIONS), "additionalProperties": False},
            "reasons": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["labels", "scores", "reasons"],
        "additionalProperties": False,
    }


# ---------------------------------------------------------------------------------------------
# A small validator for the subset of JSON Schema generated here


def validate(schema: Mapping[str, Any], value: Any, where: str = "") -> list[str]:
    """Errors of `value` against `schema` (empty = valid). Supports type, enum, const, properties,
    required, additionalProperties, items, minimum/maximum (exclusive too), minItems, maxItems, anyOf."""
    errors: list[str] = []
    _check(schema, value, where, errors)
    return errors


_TYPE_WORDS = {"object": "an object", "array": "an array", "string": "a string", "boolean": "true or false",
               "integer": "an integer", "number": "a number", "null": "null"}


def _is_type(value: Any, name: str) -> bool:
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    if name == "integer":
        return isinstance(value, int) or value.is_integer()
    return name == "number"


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check(schema: Mapping[str, Any], value: Any, where: str, errors: list[str]) -> None:
    label = where or "reply"
    if "anyOf" in schema:
        if not any(not validate(sub, value, where) for sub in schema["anyOf"]):
            errors.append(f"{label}: {_show(value)} matches none of the allowed forms")
        return
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is_type(value, n) for n in names):
            wanted = " or ".join(_TYPE_WORDS.get(n, n) for n in names)
            errors.append(f"{label}: expected {wanted}, got {_show(value)}")
            return
    if "const" in schema and not _same(value, schema["const"]):
        errors.append(f"{label}: must be {_show(schema['const'])}, got {_show(value)}")
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        allowed = ", ".join(_show(o) for o in schema["enum"])
        errors.append(f"{label}: {_show(value)} is not one of {allowed}")
    if isinstance(value, str):
        _check_string(schema, value, label, errors)
    if _is_type(value, "number"):
        for key, ok, word in (("minimum", lambda v, b: v >= b, "at least"),
                              ("exclusiveMinimum", lambda v, b: v > b, "greater than"),
                              ("maximum", lambda v, b: v <= b, "at most"),
                              ("exclusiveMaximum", lambda v, b: v < b, "less than")):
            if key in schema and not ok(value, schema[key]):
                errors.append(f"{label}: {_show(value)} must be {word} {_show(schema[key])}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{_join(where, key)}: missing")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                _check(props[key], item, _join(where, key), errors)
            elif extra is False:
                errors.append(f"{_join(where, str(key))}: unexpected key")
            elif isinstance(extra, Mapping):
                _check(extra, item, _join(where, str(key)), errors)
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{label}: needs at least {schema['minItems']} item(s)")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{label}: holds at most {schema['maxItems']} item(s)")
        if "items" in schema:
            for i, item in enumerate(value):
                _check(schema["items"], item, f"{label}[{i}]", errors)


_FORMATS = {"date": scalars.parse_date, "date-time": scalars.parse_datetime}


def _check_string(schema: Mapping[str, Any], value: str, label: str, errors: list[str]) -> None:
    """`format` (date, date-time), `pattern` (searched, as JSON Schema says) and `maxLength`."""
    check = _FORMATS.get(schema.get("format", ""))
    if check is not None:
        try:
            check(value)
        except scalars.ValueProblem as exc:
            errors.append(f"{label}: {_show(value)} {exc}")
    if "pattern" in schema and scalars.compiled(schema["pattern"]).search(value) is None:
        errors.append(f"{label}: {_show(value)} does not have the required form")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{label}: longer than {schema['maxLength']} characters")


def _same(value: Any, option: Any) -> bool:
    """JSON equality: true is not 1, 1 equals 1.0, "1" is not 1."""
    if isinstance(value, bool) or isinstance(option, bool):
        return isinstance(value, bool) and isinstance(option, bool) and value == option
    if _is_type(value, "number") and _is_type(option, "number"):
        return value == option
    return type(value) is type(option) and value == option


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _as_object(obj: Any) -> tuple[Any, list[str]]:
    if isinstance(obj, BaseModel):  # an AgentOutput's tool-agent bookkeeping is not part of the SAGE reply
        dumped = obj.model_dump(mode="json", exclude={"source", "tool_calls"})
        if not dumped.get("actions"):  # only procedures' replies carry the key
            dumped.pop("actions", None)
        return dumped, []
    if isinstance(obj, (str, bytes)):
        try:
            return json.loads(obj), []
        except ValueError as exc:
            return None, [f"reply: not valid JSON ({exc})"]
    return obj, []


def validate_agent_output(scenario: ir.Scenario, obj: Any) -> list[str]:
    """Why `obj` (a parsed reply, a JSON string or an AgentOutput) is not a valid agent reply for this
    scenario; an empty list means valid. Used to count format errors."""
    value, errors = _as_object(obj)
    if errors:
        return errors
    return validate(agent_output_schema(scenario), value)


def validate_judge_output(scenario: ir.Scenario, obj: Any) -> list[str]:
    """Why `obj` is not a valid judge reply for this scenario (empty = valid)."""
    value, errors = _as_object(obj)
    if errors:
        return errors
    return validate(judge_output_schema(scenario), value)


# ---------------------------------------------------------------------------------------------
# Registry of named schemas (`sop schema NAME`)


@dataclass(frozen=True)
class SchemaEntry:
    name: str
    description: str
    factory: Callable[[ir.Scenario | None], dict[str, Any]]
    needs_scenario: bool = False


def model_entry(name: str, model: type[BaseModel], description: str = "") -> SchemaEntry:
    """A pydantic model's JSON Schema as a catalogue entry."""
    return SchemaEntry(name, description or (model.__doc__ or "").strip().split("\n")[0],
                       lambda _s: model_schema(model))


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {"$schema": JSON_SCHEMA_DIALECT, **model.model_json_schema()}


class SchemaError(Error):
    """Unknown schema name, or a per-scenario schema asked for without a scenario."""


@dataclass(frozen=True)
class SchemaCatalog:
    """Named schemas (`sop schema NAME`). Immutable: a layer that owns more schemas (profiles live in
    `sopgraph.cases`) builds an extended catalogue with `with_entries` instead of editing a global."""

    entries: Mapping[str, SchemaEntry]

    def names(self) -> list[str]:
        return sorted(self.entries)

    def get(self, name: str, scenario: ir.Scenario | None = None) -> dict[str, Any]:
        entry = self.entries.get(name)
        if entry is None:
            raise SchemaError(f"unknown schema `{name}` (known: {', '.join(self.names())})")
        if entry.needs_scenario and scenario is None:
            raise SchemaError(f"schema `{name}` is generated from a scenario: give a .sop FILE")
        return entry.factory(scenario)

    def with_entries(self, *entries: SchemaEntry) -> SchemaCatalog:
        clash = [e.name for e in entries if e.name in self.entries]
        if clash:
            raise ArgumentError(f"schema `{clash[0]}` is already in the catalogue")
        return SchemaCatalog({**self.entries, **{e.name: e for e in entries}})


def _builtin_catalog() -> SchemaCatalog:
    entries = [model_entry("ir", ir.Scenario, "the IR of a loaded .sop program (sopgraph.language.ir.Scenario)")]
    for name, model, text in (
        ("case", records.Case, "a synthesized test case (cases.jsonl line)"),
        ("persona", records.Persona, "how a simulated customer behaves"),
        ("usage", records.Usage, "token and cost usage of model calls"),
        ("agent-output-record", records.AgentOutput, "a parsed agent reply (any scenario; see agent-output)"),
        ("dialogue", records.Dialogue, "one dialogue of a run: case, trial, models, status"),
        ("turn", records.Turn, "one agent turn of a dialogue: user text, raw and parsed reply, usage"),
        ("judgment", records.Judgment, "one judge's labels, chat scores and reasons for a turn"),
        ("consensus", records.Consensus, "majority-vote labels of a judged turn"),
    ):
        entries.append(model_entry(name, model, text))
    entries.append(SchemaEntry("agent-output", "the agent's per-turn JSON reply, exact for one scenario",
                               _per_scenario(agent_output_schema), needs_scenario=True))
    entries.append(SchemaEntry("decide-input", "the JSON values `sop decide` reads for one scenario",
                               _per_scenario(decide_input_schema), needs_scenario=True))
    entries.append(SchemaEntry("judge-output", "a judge's JSON reply (labels, scores, reasons) for one scenario",
                               _per_scenario(judge_output_schema), needs_scenario=True))
    return SchemaCatalog({e.name: e for e in entries})


def _per_scenario(build: Callable[[ir.Scenario], dict[str, Any]]) -> Callable[[ir.Scenario | None], dict[str, Any]]:
    def factory(scenario: ir.Scenario | None) -> dict[str, Any]:
        if scenario is None:  # SchemaCatalog.get refuses this before calling
            raise SchemaError("this schema is generated from a scenario: give a .sop FILE")
        return build(scenario)
    return factory


BUILTIN_SCHEMAS = _builtin_catalog()


def get_schema(name: str, scenario: ir.Scenario | None = None) -> dict[str, Any]:
    """A schema of the built-in catalogue."""
    return BUILTIN_SCHEMAS.get(name, scenario)


def schema_names() -> list[str]:
    return BUILTIN_SCHEMAS.names()
