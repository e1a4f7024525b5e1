"""`sop draft`: a language model drafts a `.sop` from a prose policy, then check -> repair rounds.

The model is called through the gateway like every model of sopgraph. Its prompt (templates
`draft_system.md`, `draft_user.md`, `draft_repair.md` in sopgraph/templates/) carries the grammar and a
complete example; the policy is shown with line numbers so that the model can cite them. After each
reply the checker runs; its rendered diagnostics go back to the model until the program is clean or
the round limit is reached. Every stage must cite the policy line(s) it comes from (`# POLICY.md:LINE`
above it) and every ambiguity the model resolved is left as a `# QUESTION:` comment: stages without a
citation are fed back like diagnostics, and the questions are listed for the author.

The model's answer is untrusted text: it is capped (`max_answer_chars`; an answer over the cap is not
checked, written or sent back, the model is told to answer shorter), stripped of terminal escapes and
control characters before anything reads it, and a repair request carries only the latest draft and its
diagnostics (at most `MAX_FEEDBACK_ITEMS`), so every request stays bounded whatever the model sends.
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

from sopgraph.errors import Error
from sopgraph.language import ir
from sopgraph.language.diagnostics import SopError, render_all
from sopgraph.language.fmt import format_text
from sopgraph.language.larkparse import grammar_path
from sopgraph.language.parse import parse_text
from sopgraph.logic.checker import check_file
from sopgraph.simulation.gateway import Gateway, ModelSpec

DEFAULT_ROUNDS = 4
DEFAULT_MAX_ANSWER_CHARS = 200_000  # ~50k tokens: far above any policy's program, far below a runaway answer
MAX_FEEDBACK_ITEMS = 40  # diagnostics sent back per repair round (the rest are counted)
_FENCE = re.compile(r"```(?:sop)?[ \t]*\n(?P<body>.*?)```", re.DOTALL)


class DraftError(Error):
    """No usable answer: every reply of the model was over the answer cap."""


class DraftRound(BaseModel):
    round: int
    errors: int
    warnings: int
    uncited: list[str] = Field(default_factory=list)  # stages citing no policy line
    feedback: str = ""  # what was sent back to the model (empty on the last round)
    oversize: int = 0  # the answer's length when it was over the cap (the round then has no draft)
    removed: int = 0  # control characters and terminal escapes removed from the answer


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


_ANSI = re.compile(r"""
    \x1b\[[0-?]*[ -/]*[@-~]            # CSI: colours, cursor moves, erase
  | \x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?  # OSC: window titles, hyperlinks (BEL or ST ends it)
  | \x1b[P^_][^\x1b]*(?:\x1b\\)?        # DCS, PM, APC strings
  | \x1b[ -/]*[0-~]?                   # any other escape (two-character forms, a lone ESC)
  | \x9b[0-?]*[ -/]*[@-~]              # 8-bit CSI
""", re.VERBOSE)
# C0 controls but tab and newline, DEL, C1 controls, bidirectional overrides and isolates (text that
# reads differently from what it is), and the byte-order mark
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def sanitize(text: str) -> tuple[str, int]:
    """The model's answer without terminal escapes and control characters (newlines and tabs kept;
    `\\r\\n` and a lone `\\r` become `\\n`), and how many characters were removed. Why: the answer is
    written into a `.sop` and printed on the author's terminal, where an escape can recolour, retitle
    or hide text."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n")
    cleaned = _CONTROL.sub("", _ANSI.sub("", lines))
    return cleaned, len(lines) - len(cleaned)


def extract_program(reply: str) -> str:
    """The program in a reply: the last ```sop block (or any fenced block), else the whole text."""
    blocks = [m.group("body") for m in _FENCE.finditer(reply)]
    sop_blocks = [m.group("body") for m in re.finditer(r"```sop[ \t]*\n(?P<body>.*?)```", reply, re.DOTALL)]
    chosen = (sop_blocks or blocks or [reply])[-1]
    return chosen.strip("\n") + "\n"


_TOKENS = re.compile(r'"""[\s\S]*?(?:"""|\Z)|"(?:[^"\\\n]|\\.)*"?|#[^\n]*|//[^\n]*|\n')


def comment_lines(text: str) -> dict[int, str]:
    """Line number (1-based) -> comment text of every line that is a comment and nothing else, read the
    way the grammar reads them: a `#` inside a string or a triple-quoted text is no comment, and a line
    with code before its `#` is no comment line."""
    out: dict[int, str] = {}
    line, line_start = 1, 0
    for m in _TOKENS.finditer(text):
        token = m.group()
        if token == "\n":
            line, line_start = line + 1, m.end()
            continue
        if token.startswith("#") and not text[line_start:m.start()].strip():
            out[line] = token
        newlines = token.count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + token.rfind("\n") + 1
    return out


def citations(text: str, policy_file: str) -> dict[str, list[int]]:
    """Stage id -> the policy lines cited in the comment lines directly above its `stage` line."""
    cite = re.compile(r"#\s*" + re.escape(policy_file) + r":(?P<lines>\d+(?:\s*[,-]\s*\d+)*)")
    comments = comment_lines(text)
    found: dict[str, list[int]] = {}
    pending: list[int] = []
    for number, line in enumerate(text.split("\n"), 1):  # numbered as comment_lines (and Lark) count lines
        stripped = line.strip()
        if number in comments:
            m = cite.search(stripped)
            if m:
                pending += [int(n) for n in re.findall(r"\d+", m.group("lines"))]
            continue
        stage = re.match(r"stage\s+([A-Za-z_][\w.]*)", stripped)
        if stage:
            found[stage.group(1)] = pending
        if stripped:
            pending = []
    return found


_QUESTION = re.compile(r"#\s*QUESTION:\s*(.*)")


def questions(text: str) -> list[str]:
    """The `# QUESTION:` comments for the author: comment lines only (text the model echoed inside a
    string, or after code on a line, is not a question)."""
    return [m.group(1).strip() for c in comment_lines(text).values() if (m := _QUESTION.match(c))]


def _feedback(text: str, name: str, policy_file: str, round_no: int, max_rounds: int) -> tuple[DraftRound, str]:
    """Check one draft: its round record and the repair message ('' when nothing needs fixing)."""
    result = check_file(name, text=text, name=name)
    cited = citations(text, policy_file)
    stages = _stage_ids(text)
    uncited = [s for s in stages if not cited.get(s)]
    parts = list(render_all([d for d in result.diagnostics if d.severity in ("error", "warning")], result.sources))
    parts += [f"stage `{s}` cites no policy line: put `# {policy_file}:LINE` above it" for s in uncited]
    if len(parts) > MAX_FEEDBACK_ITEMS:  # a runaway draft's thousand errors would make a runaway request
        parts = [*parts[:MAX_FEEDBACK_ITEMS], f"... and {len(parts) - MAX_FEEDBACK_ITEMS} more problems like these"]
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
                name: str = "draft", max_rounds: int = DEFAULT_ROUNDS,
                max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS) -> DraftResult:
    """Draft, check and repair until clean or `max_rounds` replies; the best draft is returned.

    Raises DraftError when no reply was within `max_answer_chars` (nothing to return)."""
    example = Template(_template("draft_example.sop")).substitute(policy_file=policy_file)
    system = Template(_template("draft_system.md")).substitute(
        policy_file=policy_file, grammar=grammar_path().read_text(encoding="utf-8").strip(), example=example.strip())
    user = Template(_template("draft_user.md")).substitute(policy_file=policy_file, name=name,
                                                           policy=numbered(policy))
    base: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    messages = base
    context: Mapping[str, Any] = {"role": "author", "policy": policy, "policy_file": policy_file, "name": name}
    rounds: list[DraftRound] = []
    drafts: list[str | None] = []
    cost = 0.0
    for round_no in range(1, max_rounds + 1):
        completion = await gateway.complete(spec, messages, context=context)
        cost += completion.cost
        if len(completion.text) > max_answer_chars:
            record = DraftRound(round=round_no, errors=0, warnings=0, oversize=len(completion.text))
            rounds.append(record)
            drafts.append(None)
            if round_no == max_rounds:
                break
            record.feedback = (f"Your answer was {len(completion.text):,} characters, over the limit of "
                               f"{max_answer_chars:,}. Reply with only the program, in one ```sop block.")
            # the oversized answer itself is never sent back: only a note that there was one
            messages = [*base, {"role": "assistant", "content": f"(an answer of {len(completion.text):,} "
                                                              "characters, not repeated here)"},
                        {"role": "user", "content": record.feedback}]
            continue
        answer, removed = sanitize(completion.text)
        text = extract_program(answer)
        drafts.append(text)
        record, message = _feedback(text, f"{name}.sop", policy_file, round_no, max_rounds)
        record.removed = removed
        rounds.append(record)
        if not message or round_no == max_rounds:
            break
        record.feedback = message
        # the latest draft and its diagnostics only: each request stays bounded by the answer cap
        messages = [*base, {"role": "assistant", "content": f"```sop\n{text}```"}, {"role": "user", "content": message}]
    usable = [i for i, d in enumerate(drafts) if d is not None]
    if not usable:
        longest = max(r.oversize for r in rounds)
        raise DraftError(f"every answer of {spec.model} was over the answer cap ({longest:,} characters at most, "
                         f"the cap is {max_answer_chars:,}); nothing written. Raise --max-answer-chars if a program "
                         "really is that long, or ask the model for less")
    best = min(usable, key=lambda i: (rounds[i].errors, len(rounds[i].uncited), -i))
    text = drafts[best] or ""
    with contextlib.suppress(SopError):  # a draft that does not parse is written as the model wrote it
        text = format_text(text, f"{name}.sop")  # canonical layout; comments (citations, questions) kept
    return DraftResult(text=text, clean=rounds[best].errors == 0, best_round=best + 1, rounds=rounds,
                       questions=questions(text), citations=citations(text, policy_file), model=spec.model,
                       cost=cost)


def render_summary(result: DraftResult, out: Path | None) -> str:
    lines = []
    for r in result.rounds:
        if r.oversize:
            state = f"answer of {r.oversize:,} characters, over the cap: not used"
        else:
            state = f"{r.errors} errors, {r.warnings} warnings" + (f", {len(r.uncited)} stages uncited"
                                                                   if r.uncited else "")
            if r.removed:
                state += f"; {r.removed:,} control characters removed"
        lines.append(f"round {r.round}: {state}" + (" -> repair requested" if r.feedback else ""))
    where = str(out) if out else "stdout"
    verdict = "clean" if result.clean else "still has errors (fix by hand or raise --rounds)"
    lines.append(f"draft by {result.model} (round {result.best_round}) written to {where}: {verdict}; "
                 f"{sum(1 for v in result.citations.values() if v)}/{len(result.citations)} stages cite the policy")
    if result.questions:
        lines.append(f"{len(result.questions)} question(s) for the author (marked `# QUESTION:` in the file):")
        lines += [f"  - {q}" for q in result.questions]
    return "\n".join(lines) + "\n"
