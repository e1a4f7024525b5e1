"""The editor grammar (editors/sop.tmLanguage.json) is generated from the Lark grammar and
highlights every keyword the parser knows; comments and strings win over keywords inside them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from sopgraph.language.textmate import grammar_keywords, render

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "editors" / "sop.tmLanguage.json"
GRAMMAR: dict[str, Any] = json.loads(SHIPPED.read_text(encoding="utf-8"))


def _flat_patterns(grammar: dict[str, Any]) -> list[dict[str, Any]]:
    """Top-level patterns in order, with repository includes expanded (one level is all we use)."""
    out: list[dict[str, Any]] = []
    for pattern in grammar["patterns"]:
        out += grammar["repository"][pattern["include"].lstrip("#")]["patterns"]
    return out


def _region_end(pattern: dict[str, Any], line: str, pos: int) -> int:
    inner = [re.compile(p["match"]) for p in pattern.get("patterns", [])]
    close = re.compile(pattern["end"])
    while pos < len(line):
        m = next((m for r in inner if (m := r.match(line, pos)) and m.end() > pos), None)
        if m:
            pos = m.end()
            continue
        c = close.match(line, pos)
        if c:
            return c.end()
        pos += 1
    return len(line)


def scope_at(line: str, word: str) -> str | None:
    """The scope a TextMate engine gives to the first occurrence of `word` in `line`: patterns are
    tried left to right at each position, the first match wins (enough for this flat grammar)."""
    target = line.index(word)
    pos = 0
    patterns = _flat_patterns(GRAMMAR)
    while pos < len(line):
        for pattern in patterns:
            regex = pattern.get("match") or pattern.get("begin")
            m = re.compile(regex).match(line, pos)
            if not m or m.end() == pos:
                continue
            end = m.end()
            if "begin" in pattern:  # a string: runs to its end pattern; inner patterns (escapes) first
                end = _region_end(pattern, line, end)
            if pos <= target < end:
                if "captures" in pattern:
                    for group, cap in pattern["captures"].items():
                        if m.start(int(group)) <= target < m.end(int(group)):
                            return cap["name"]
                return pattern.get("name")
            pos = end
            break
        else:
            pos += 1
    return None


def test_shipped_grammar_is_the_generated_one() -> None:
    assert SHIPPED.read_text(encoding="utf-8") == render(), (
        "regenerate: python -m sopgraph.language.textmate > editors/sop.tmLanguage.json")


def test_grammar_has_keywords_to_check() -> None:
    assert {"stage", "match", "when", "otherwise", "and", "true", "case", "bool", "money"} <= set(
        grammar_keywords())


@pytest.mark.parametrize("word", grammar_keywords())
def test_every_grammar_keyword_is_highlighted(word: str) -> None:
    line = f"x {word} y"
    scope = scope_at(line, word)
    assert scope is not None and scope.split(".")[0] in ("keyword", "constant", "support", "storage"), scope


@pytest.mark.parametrize("line,word,scope", [
    ('field Mood: Calm | Angry "when angry"', "when", "string.quoted.double.sop"),
    ("# match in a comment", "match", "comment.line.number-sign.sop"),
    ("stage step1 {", "step1", "entity.name.function.sop"),
    ("when Days <= 30 -> do Refund", "30", "constant.numeric.sop"),
    ("when Days <= 30 -> do Refund", "Refund", "entity.name.type.sop"),
    ("when Days <= 30 -> do Refund", "<=", "keyword.operator.comparison.sop"),
    ('"say \\"when\\" now"', "when", "string.quoted.double.sop"),
])
def test_scopes_of_sample_lines(line: str, word: str, scope: str) -> None:
    assert scope_at(line, word) == scope
