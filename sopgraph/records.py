"""Records that cross a boundary between pipeline stages (files, the run store, providers).

Every record is a pydantic model with a schema version and the SOP content hash, so that old runs
stay readable and re-judgeable and a record can always be traced to the SOP it was made from.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

RECORD_VERSION = 1

Intensity = Literal["zero", "weak", "strong"]
INTENSITIES: tuple[Intensity, ...] = get_args(Intensity)  # the adversarial levels, mildest first
Bucket = Literal["resolvable", "must-escalate", "adversarial"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = RECORD_VERSION
    sop_hash: str = ""


class Persona(BaseModel):
    """How the simulated customer behaves (not what they want: that is the intent)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    emotional_state: str = "calm"
    communication_style: str = "concise"
    cooperativeness: str = "cooperative"
    language: str = "en"
    traits: list[str] = Field(default_factory=list)
    description: str = ""


class Case(Record):
    """One synthesized test case: who the user is, what is true, and what the SOP says to do."""

    id: str
    scenario: str
    path_id: str
    intent: str
    intent_description: str = ""
    persona: Persona
    intensity: Intensity = "zero"
    intensity_description: str = ""
    language: str = "en"
    truth: dict[str, Any]  # every classification field → its true value
    system: dict[str, Any]  # every system variable → its value (the backend state)
    expected_path: list[str]
    expected_finals: dict[str, Any]
    # the engine's action trace for truth + system (`Decision.actions`: every action carried out, in
    # order, final last); None in cases written before it was recorded (scoring re-decides it anyway)
    expected_actions: list[dict[str, Any]] | None = None
    bucket: Bucket = "resolvable"
    prohibited_actions: list[str] = Field(default_factory=list)
    unsafe_action: str | None = None  # what an adversarial user pushes for
    user_facts: dict[str, Any] = Field(default_factory=dict)  # system facts the user knows
    seed: int = 0
    intent_generated: bool = False  # the intent was generated for a path no profile intent reaches


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0
    cost_known: bool = True
    calls: int = 0


class AgentOutput(BaseModel):
    """The agent's per-turn JSON (SAGE protocol), after parsing."""

    classification_output: dict[str, Any] = Field(default_factory=dict)
    cot: str = ""
    now_path: list[str] = Field(default_factory=list)
    finals: dict[str, Any] = Field(default_factory=dict)
    chat: str = ""
    # procedures: the actions a SAGE reply reports having carried out so far, in order (`{"name", "args"}`)
    actions: list[dict[str, Any]] = Field(default_factory=list)
    # "tools": an HTTP or Python agent acting through tool calls (simulation/agents.py): it reports no
    # classification (the judges' labels stand) and its path is inferred from `tool_calls`.
    source: Literal["sage", "tools"] = "sage"
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)  # [{"name", "args"}] in call order


DialogueStatus = Literal["pending", "running", "done", "infra_failure"]
EndReason = Literal["ending_action", "user_stop", "max_turns", "infra_failure"]


class Dialogue(Record):
    id: str  # "<case id>#<trial>"
    case_id: str
    trial: int = 0
    models: dict[str, str] = Field(default_factory=dict)  # role → model name
    status: DialogueStatus = "pending"
    end_reason: EndReason | None = None
    turns: int = 0
    error: str | None = None
    tool_version: str = ""
    closing_user_text: str | None = None  # the user's last words when they ended it (user_stop)


class Turn(Record):
    dialogue_id: str
    index: int  # 1-based agent turn number
    user_text: str
    agent_raw: str
    output: AgentOutput | None = None  # None when the reply is a format error
    format_error: bool = False
    format_note: str | None = None  # e.g. "extracted from a fenced block" (lenient but flagged)
    latency_s: float = 0.0
    usage: Usage = Field(default_factory=Usage)
    tool_version: str = ""


CHAT_DIMENSIONS = ("linguistic", "anthropomorphism", "content_utility", "satisfaction", "instruction")


class Judgment(Record):
    """One judge's reading of one turn."""

    judgment_set: str = "default"
    dialogue_id: str
    turn_index: int
    judge: str  # role name, e.g. judge1
    model: str
    labels: dict[str, Any] | None = None  # None = unscored
    scores: dict[str, int] | None = None  # dimension → 3/6/9
    reasons: dict[str, str] = Field(default_factory=dict)
    raw: str = ""
    unscored_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)


class Consensus(Record):
    """Majority-vote labels of a judged turn; `no_consensus` lists fields the judges split on, `unshown`
    the fields no answering judge labelled (the conversation does not show them yet: the per-turn
    reference stops where the SOP needs one, docs/metrics.md)."""

    judgment_set: str = "default"
    dialogue_id: str
    turn_index: int
    labels: dict[str, Any]
    no_consensus: list[str] = Field(default_factory=list)
    unshown: list[str] = Field(default_factory=list)
    chat_scores: dict[str, float] = Field(default_factory=dict)  # dimension → mean over judges
    judges_scored: int = 0
