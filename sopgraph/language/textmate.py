"""A TextMate grammar for `.sop` files (VS Code, Sublime, GitHub linguist), generated from the Lark
grammar so that every keyword the parser knows is highlighted.

`editors/sop.tmLanguage.json` is this module's output; tests/test_textmate.py fails when the two
drift apart. Regenerate with `python -m sopgraph.language.textmate > editors/sop.tmLanguage.json`.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from sopgraph.language.larkparse import parser

# Keyword → scope. A keyword the grammar gains later and this table does not name still gets
# `keyword.other.sop`, so highlighting never silently misses one.
SCOPES: dict[str, tuple[str, ...]] = {
    "keyword.declaration.sop": ("scenario", "include", "start", "field", "system", "let", "action", "output",
                                "stage", "subflow", "use", "as"),
    "keyword.control.sop": ("classify", "match", "when", "otherwise", "do"),
    "keyword.operator.word.sop": ("and", "or", "not", "in"),
    "constant.language.sop": ("true", "false"),
    "support.function.sop": ("case", "count", "min", "max", "any", "all", "len"),
    "storage.type.sop": ("bool", "int", "float", "list", "record"),
    "storage.modifier.sop": ("unit", "money", "hidden"),
}


def grammar_keywords() -> list[str]:
    """Every word-like literal terminal of the Lark grammar (the reserved words)."""
    words = {t.pattern.value for t in parser().terminals
             if t.pattern.type == "str" and re.fullmatch(r"[A-Za-z_]+", t.pattern.value)}
    return sorted(words)


def _words(words: list[str]) -> str:
    return r"\b(?:" + "|".join(sorted(words, key=lambda w: (-len(w), w))) + r")\b"


def textmate_grammar() -> dict[str, Any]:
    keywords = grammar_keywords()
    placed = {w for ws in SCOPES.values() for w in ws}
    groups = {scope: [w for w in ws if w in keywords] for scope, ws in SCOPES.items()}
    groups["keyword.other.sop"] = [w for w in keywords if w not in placed]
    keyword_patterns = [{"name": scope, "match": _words(ws)} for scope, ws in groups.items() if ws]
    return {
        "$schema": "https://raw.githubusercontent.com/martinring/tmlanguage/master/tmlanguage.json",
        "name": "SOP",
        "scopeName": "source.sop",
        "fileTypes": ["sop"],
        "comment": "Generated from grammars/sop.lark by sopgraph.language.textmate; do not edit by hand.",
        "patterns": [
            {"include": "#comment"}, {"include": "#string"}, {"include": "#declaration"},
            {"include": "#keyword"}, {"include": "#number"}, {"include": "#operator"},
        ],
        "repository": {
            "comment": {"patterns": [{"name": "comment.line.number-sign.sop", "match": "#.*$"},
                                     {"name": "comment.line.double-slash.sop", "match": "//.*$"}]},
            "string": {"patterns": [
                {"name": "string.quoted.triple.sop", "begin": '"""', "end": '"""'},
                {"name": "string.quoted.double.sop", "begin": '"', "end": '"|$',
                 "patterns": [{"name": "constant.character.escape.sop", "match": r"\\."}]},
            ]},
            "declaration": {"patterns": [
                {"match": r"\b(stage|subflow)\s+([^\W\d][\w.]*)",
                 "captures": {"1": {"name": "keyword.declaration.sop"}, "2": {"name": "entity.name.function.sop"}}},
                {"match": r"\b(field|system|let|output)\s+([^\W\d][\w.]*)",
                 "captures": {"1": {"name": "keyword.declaration.sop"}, "2": {"name": "variable.other.sop"}}},
                {"match": r"\b(action)\s+([^\W\d][\w.]*)",
                 "captures": {"1": {"name": "keyword.declaration.sop"}, "2": {"name": "entity.name.type.sop"}}},
                {"match": r"\b(do)\s+([^\W\d][\w.]*)",
                 "captures": {"1": {"name": "keyword.control.sop"}, "2": {"name": "entity.name.type.sop"}}},
            ]},
            "keyword": {"patterns": keyword_patterns},
            "number": {"patterns": [{"name": "constant.numeric.sop", "match": r"\b[0-9]+(?:\.[0-9]+)?\b"}]},
            "operator": {"patterns": [
                {"name": "keyword.operator.arrow.sop", "match": "->"},
                {"name": "keyword.operator.comparison.sop", "match": "==|!=|<=|>=|<|>"},
                {"name": "keyword.operator.sop", "match": r"[-+*/=|]|\.\."},
            ]},
        },
    }


def render() -> str:
    return json.dumps(textmate_grammar(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # pragma: no cover - the regeneration command named in the docstring
    sys.stdout.write(render())
