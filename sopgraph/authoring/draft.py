"""`sop draft`: a language model drafts a `.sop` from a prose policy, then check -> repair rounds.

The model is called through the gateway like every model of sopgraph. Its prompt (templates
`draft_system.md`, `draft_user.md`, `draft_repair.md` in sopgraph/templates/) carries the grammar and a
complete example; the policy is shown with line numbers so that the model can cite them. After each
reply the checker runs; its rendered diagnostics go back to the model until the program is clean or
the round limit is reached. Every stage must cite the policy line(s) it comes from (`# POLICY.md:LINE`
above it) and every ambiguity the model resolved is left as a `# QUESTION:` comment: stages without a
citation are fed back like diagnostics, and the questions are listed for the author.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from pydantic import BaseModel, Field

from sopgraph.language import ir
from sopgraph.language.diagnostics import SopError, render_all
from sopgraph.language.fmt import format_text
from sopgraph.language.parse import grammar_path, parse_text
from sopgraph.logic.checker import check_file
from sopgraph.simulation.gateway import Gateway, ModelSpec

DEFAULT_ROUNDS = 4
_FENCE = re.compile(r"```(?:sop)?[ \t]*\n(?P<body>.*?)```", re.DOTALL)


class DraftRound(BaseModel):
    round: int
    errors: int
    warnings: int
    uncited: list[str] = Field(default_factory=list)  # stages citing no policy line
    feedback: str = ""  # what was sent back to the model (empty on the last round)


class DraftResult(BaseModel):
    text: str
    clean: bool  # no checker errors
    rounds: list[DraftRound]
    best_round: int  # the draft returned: fewest errors, then fewest uncited stages, then the latest
    questions: list[str]
    citations: dict[str, list[int]]  # stage id -> policy lines
    model: str
    cost: float = 0.0


def _template(name: str) -> str:
    return resources.files("sopgraph").joinpath("templates", name).read_text(encoding="utf-8")


def numbered(policy: str) -> str:
    """The policy with right-aligned line numbers (`  7| text`), as the model sees it."""
    lines = policy.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{i:>{width}}| {line}" for i, line in enumerate(lines, 1))


def extract_program(reply: str) -> str:
    """The program in a reply: the last ```sop block (or any fenced block), else the whole text."""
    blocks = [m.group("body") for m in _FENCE.finditer(reply)]
    sop_blocks = [m.group("body") for m in re.finditer(r"```sop[ \t]*\n(?P<body>.*?)```", reply, re.DOTALL)]
    chosen = (sop_blocks or blocks or [reply])[-1]
    return chosen.strip("\n") + "\n"


def citations(text: str, policy_file: str) -> dict[str, list[int]]:
    """Stage id -> the policy lines cited in the comments directly above its `stage` line."""
    cite = re.compile(r"#\s*" + re.escape(policy_file) + r":(?P<lines>\d+(?:\s*[,-]\s*\d+)*)")
    found: dict[str, list[int]] = {}
    pending: list[int] = []
    for line in text.splitlines():
        stripped = line.strip()
        m = cite.search(stripped)
        if m and stripped.startswith("#"):
            pending += [int(n) for n in re.findall(r"\d+", m.group("lines"))]
            continue
        stage = re.match(r"stage\s+([A-Za-z_][\w.]*)", stripped)
        if stage:
            found[stage.group(1)] = pending
        if stripped and not stripped.startswith("#"):
            pending = []
    return found


def questions(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"#\s*QUESTION:\s*(.*)", text)]


def _feedback(text: str, name: str, policy_file: str, round_no: int, max_rounds: int) -> tuple[DraftRound, str]:
    """Check one draft: its round record and the repair message ('' when nothing needs fixing)."""
    result = check_file(name, text=text, name=name)
    cited = citations(text, policy_file)
    stages = _stage_ids(text)
    uncited = [s for s in stages if not cited.get(s)]
    parts = list(render_all([d for d in result.diagnostics if d.severity in ("error", "warning")], result.sources))
    parts += [f"stage `{s}` cites no policy line: put `# {policy_file}:LINE` above it" for s in uncited]
    record = DraftRound(round=round_no, errors=result.errors, warnings=result.warnings, uncited=uncited)
    if not result.errors and not uncited and not result.warnings:
        return record, ""
    if not result.errors and not uncited and round_no > 1:
        return record, ""  # warnings alone are not worth another round once errors are gone
    message = Template(_template("draft_repair.md")).substitute(
        round=round_no, max_rounds=max_rounds, diagnostics="\n\n".join(parts), policy_file=policy_file)
    return record, message


def _stage_ids(text: str) -> list[str]:
    try:
        program = parse_text(text, "draft.sop")
    except SopError:
        return []
    return [item.id for item in program.items if isinstance(item, ir.Stage)]


async def draft(policy: str, spec: ModelSpec, *, gateway: Gateway, policy_file: str = "POLICY.md",
                name: str = "draft", max_rounds: int = DEFAULT_ROUNDS) -> DraftResult:
    """Draft, check and repair until clean or `max_rounds` replies; the best draft is returned."""
    example = Template(_template("draft_example.sop")).substitute(policy_file=policy_file)
    system = Template(_template("draft_system.md")).substitute(
        policy_file=policy_file, grammar=grammar_path().read_text(encoding="utf-8").strip(), example=example.strip())
    user = Template(_template("draft_user.md")).substitute(policy_file=policy_file, name=name,
                                                           policy=numbered(policy))
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    context: Mapping[str, Any] = {"role": "author", "policy": policy, "policy_file": policy_file, "name": name}
    rounds: list[DraftRound] = []
    drafts: list[str] = []
    cost = 0.0
    for round_no in range(1, max_rounds + 1):
        completion = await gateway.complete(spec, messages, context=context)
        cost += completion.cost
        text = extract_program(completion.text)
        drafts.append(text)
        record, message = _feedback(text, f"{name}.sop", policy_file, round_no, max_rounds)
        rounds.append(record)
        if not message or round_no == max_rounds:
            break
        record.feedback = message
        messages += [{"role": "assistant", "content": completion.text}, {"role": "user", "content": message}]
    best = min(range(len(rounds)), key=lambda i: (rounds[i].errors, len(rounds[i].uncited), -i))
    text = drafts[best]
    with contextlib.suppress(SopError):  # a draft that does not parse is written as the model wrote it
        text = format_text(text, f"{name}.sop")  # canonical layout; comments (citations, questions) kept
    return DraftResult(text=text, clean=rounds[best].errors == 0, best_round=best + 1, rounds=rounds,
                       questions=questions(text), citations=citations(text, policy_file), model=spec.model,
                       cost=cost)


def render_summary(result: DraftResult, out: Path | None) -> str:
    lines = []
    for r in result.rounds:
        state = f"{r.errors} errors, {r.warnings} warnings" + (f", {len(r.uncited)} stages uncited" if r.uncited
                                                               else "")
        lines.append(f"round {r.round}: {state}" + (" -> repair requested" if r.feedback else ""))
    where = str(out) if out else "stdout"
    verdict = "clean" if result.clean else "still has errors (fix by hand or raise --rounds)"
    lines.append(f"draft by {result.model} (round {result.best_round}) written to {where}: {verdict}; "
                 f"{sum(1 for v in result.citations.values() if v)}/{len(result.citations)} stages cite the policy")
    if result.questions:
        lines.append(f"{len(result.questions)} question(s) for the author (marked `# QUESTION:` in the file):")
        lines += [f"  - {q}" for q in result.questions]
    return "\n".join(lines) + "\n"
