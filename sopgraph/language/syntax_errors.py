"""Syntax errors named in the user's terms (docs/language.md §12, E001/E002/E005), never raw token names.

Two kinds of knowledge, kept apart:
- `CATALOGUE`: bad snippets and the message each stands for, matched by example with Lark's
  `UnexpectedInput.match_examples` (the parser state and what it accepts there identify the slip). An entry
  also names the words the parser expects in the states its examples reach (`expects`), so a slip written
  somewhere its examples do not reach (another nesting, another operand) is named the same.
- `SLIPS`: small functions for messages that depend on the text around the error (`N between 5 and 10`
  quotes `N`; `14 hrs` quotes the number), tried first, in order.
Adding a message is adding an entry (or a function); tests/test_parse.py checks that every example of every
entry yields its entry's message, and the syntax goldens (tests/golden/syntax_*) pin the wording.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lark import Lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from sopgraph.language import ir
from sopgraph.language.diagnostics import Diagnostic, did_you_mean, error
from sopgraph.language.program import KEYWORDS

DECL_KEYWORDS = ("scenario", "include", "start", "field", "system", "let", "action", "output",
                 "stage", "subflow", "use")
GLUE_HINT = "a keyword is a word of its own"


@dataclass(frozen=True)
class At:
    """Where a token error happened, as the slips read it."""

    found: str  # the token's text, shortened for messages
    ttype: str  # its terminal (`NAME`, `STRING`, `RBRACE`, ...)
    words: list[str]  # what the parser could take instead, in the user's terms
    before: str  # the text before the token
    after: str  # the text from the token on
    line: int


@dataclass(frozen=True)
class Entry:
    """One message of the catalogue: the bad snippets it names, and when it applies.

    `message`/`hint` are templates: `{found}` the token, `{Found}` capitalised, `{keywords}` the reserved
    words, `{top_level}` a did-you-mean among the declaration keywords (or the list of them)."""

    label: str
    message: str
    hint: str
    examples: tuple[str, ...] = ()
    tokens: frozenset[str] = frozenset()  # terminals it names (empty: any)
    found: frozenset[str] = frozenset()  # token texts it names (empty: any)
    keyword_token: bool = False  # it names a keyword token (`match`, `when`, ...)
    expects: frozenset[str] = frozenset()  # any of these expected: the entry applies without an example
    excludes: frozenset[str] = frozenset()  # none of these may be expected

    def applies(self, at: At) -> bool:
        """Whether the token is one this entry names (the parser state is matched by example or `expects`)."""
        if self.tokens and at.ttype not in self.tokens:
            return False
        if self.found and at.found not in self.found:
            return False
        if self.keyword_token and at.ttype.lower() not in KEYWORDS:
            return False
        return not self.excludes & set(at.words)

    def render(self, at: At) -> tuple[str, str]:
        top_level = did_you_mean(at.found, DECL_KEYWORDS) or (
            "top-level items start with " + ", ".join(f"`{k}`" for k in DECL_KEYWORDS))
        fields = {"found": at.found, "Found": at.found.capitalize(), "keywords": ", ".join(KEYWORDS),
                  "top_level": top_level}
        return self.message.format(**fields), self.hint.format(**fields)


_COMPARISON = "a comparison (==, <, ...)"
CATALOGUE: tuple[Entry, ...] = (
    Entry("missing_arrow", "missing `->` before `{found}`",
          "branches are written `value -> target` or `when condition -> target`",
          examples=("stage s { match A { B do X } }", "stage s { match A { B C } }", 'stage s { match A { B "c" } }',
                    "stage s { match A { 1 2 } }", "stage s { match A { B, C D } }", "stage s { when A do X }",
                    "stage s { when A B }", "stage s { when A > 1 B }", "stage s { when A and B C }"),
          tokens=frozenset({"NAME", "STRING", "NUMBER", "DO"}), expects=frozenset({"`->`"})),
    Entry("top_level", "unexpected `{found}` at top level", "{top_level}",
          examples=("feild A: bool", "field A: bool\nfeild B: bool", "stage s { -> t }\nstep t { -> s }"),
          tokens=frozenset({"NAME"}), expects=frozenset({"`stage`"})),
    Entry("unmatched_brace", "unmatched `}}`: no block is open here", "remove it, or check the `{{` of the block above",
          examples=("}", "stage s { -> t } }", "field A: bool }"), found=frozenset({"}"}),
          expects=frozenset({"`stage`"})),
    Entry("no_decision", "stage has no decision",
          "end the stage with `-> next`, a `match X {{ ... }}` block, or `when ... -> ...` guards",
          examples=("stage s { }", 'stage s "S" { "text" }', "stage s { classify A }", "stage s { observe A }"),
          found=frozenset({"}"}), expects=frozenset({"`->`", "`match`", "`when`"}), excludes=frozenset({"a name"})),
    Entry("enum_one_value", "an enum type needs at least two values", "write `field X: A | B`, or use `bool`",
          examples=("type T = A {",), found=frozenset({"{"}), expects=frozenset({"`|`"})),
    Entry("assign_as_comparison", "`=` is not a comparison",
          "write `==` to compare; `=` only assigns outputs and derived variables",
          examples=("stage s { when A = B -> t }", "stage s { when A + 1 = 2 -> t }", "let X = A = B"),
          found=frozenset({"="}), expects=frozenset({_COMPARISON})),
    Entry("reserved_here", "`{found}` is a reserved word and cannot be used here", "rename it; reserved words: {keywords}",
          tokens=frozenset({"NAME"}), found=frozenset(KEYWORDS)),
    Entry("reserved_as_name", "`{found}` is a reserved word and cannot be used as a name",
          "rename it, e.g. `{found}_` or `{Found}`",
          examples=("field match: bool", "stage when { -> t }", "let count = 1", "action do"),
          keyword_token=True, expects=frozenset({"a name"})),
)

def _unclosed_brace(text: str) -> tuple[int, int] | None:
    """Position (line, col) of the last `{` never closed, skipping strings and comments."""
    stack: list[tuple[int, int]] = []
    line, col, i, n = 1, 1, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "#" or text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith('"""', i):
            end = text.find('"""', i + 3)
            end = n if end < 0 else end + 3
            chunk = text[i:end]
            line += chunk.count("\n")
            col = (len(chunk) - chunk.rfind("\n")) if "\n" in chunk else col + len(chunk)
            i = end
            continue
        if ch == '"':
            j = i + 1
            while j < n and text[j] not in '"\n':
                j += 2 if text[j] == "\\" else 1
            col += j + 1 - i
            i = j + 1
            continue
        if ch == "{":
            stack.append((line, col))
        elif ch == "}" and stack:
            stack.pop()
        if ch == "\n":
            line, col = line + 1, 1
        else:
            col += 1
        i += 1
    return stack[-1] if stack else None


def _char_name(ch: str) -> str:
    """A character as a user can identify it (control and invisible characters by code point)."""
    if ch.isprintable() and not ch.isspace():
        return f"`{ch}`"
    return f"U+{ord(ch):04X}"


def _shown(found: str) -> str:
    first = found.splitlines()[0] if found.strip() else found
    return first if len(first) <= 40 else first[:37] + "..."


# Words from other languages that people write for branches: what the language wants instead.
FOREIGN_BRANCH_WORDS: dict[str, tuple[str, str]] = {
    "else": ("`else` is not part of the language: the last branch is `otherwise -> target`",
             "write `otherwise -> ...` for the values no earlier branch takes"),
    "default": ("`default` is not part of the language: the last branch is `otherwise -> target`",
                "write `otherwise -> ...` for the values no earlier branch takes"),
    "if": ("conditions are written with `when`, not `if`",
           "write `when CONDITION -> target`, e.g. `when N > 0 -> do Go`"),
    "elif": ("conditions are written with `when`, not `elif`",
             "write one `when CONDITION -> target` per branch; the first true one fires"),
}
_ACTION_ATTRS_BEFORE = re.compile(r'\baction\s+([^\W\d][\w.]*|"[^"\n]*")\s*\[([^\]\n]*)\]\s*$')


_ENUM_DECL = re.compile(r"^\s*(?:field|system|output|type)\b[^\n\"]*?(\w+)$")
_MATCH_OPEN = re.compile(r"\bmatch\b[^{}]*\{[^{}]*\Z")
_DANGLING = re.compile(r"(\w[\w.]*)\s*(?:==|!=|<=|>=|<|>)\s*\S+\s+(?:and|or)\s*\Z")


_VARIABLE_ATTRS = frozenset({"unit", "money", "hidden"})  # attributes outputs do not take
_MEMBERSHIP_WORDS = frozenset({"contains", "includes", "has"})  # `Flags contains Vip` from other languages
_TYPE_WORDS = frozenset({"int", "float", "list", "string", "bool", "date", "datetime", "duration", "record"})
_INDEXED = re.compile(r"([^\W\d]\w*)\s*\Z")  # `Name[` where a list would be indexed
_AGGREGATE = re.compile(r"\b(sum|avg|average|mean|total)\s*\((?![^()]*\)\s*$)")


_NUMBER_BEFORE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s+\Z")  # a number, then a space, just before the error
_TIME_ABBREVIATIONS = {"h": "hours", "hr": "hours", "hrs": "hours", "min": "minutes", "mins": "minutes",
                       "sec": "seconds", "secs": "seconds", "s": "seconds", "d": "days", "wk": "weeks",
                       "wks": "weeks", "w": "weeks"}
_CALENDAR_UNITS = {"month": 30, "months": 30, "year": 365, "years": 365}  # days, roughly: no fixed length
_AMOUNT_WORDS = frozenset({"percent", "pct", "km", "kg", "miles", "mi"})


def _unit_slip(found: str, number: str, head: str) -> tuple[str, str] | None:
    """`14 hrs`, `2 months`, `3000 EUR`: a unit the language does not take after a number (`head`:
    the line up to the error, for the name the number is compared with)."""
    if found in _TIME_ABBREVIATIONS:
        unit = _TIME_ABBREVIATIONS[found]
        return (f"`{found}` is not a duration unit: units are written in full",
                f"write `{number} {unit}` (units: seconds, minutes, hours, days, weeks)")
    if found.lower() in _CALENDAR_UNITS:
        days = float(number) * _CALENDAR_UNITS[found.lower()]
        return (f"`{found}` is not a duration unit: months and years have no fixed length",
                f"write the policy's number of days or weeks, e.g. `{days:g} days`")
    if found.lower() in _AMOUNT_WORDS or re.fullmatch(r"[A-Z]{3}", found):
        compared = re.search(r"([^\W\d]\w*)\s*(?:[<>]=?|[=!]=)\s*\d+(?:\.\d+)?\s+\Z", head)
        name = compared.group(1) if compared else "Amount"
        return (f"a number is written without a unit: `{number} {found}`",
                f"write `{number}`; a variable's unit is part of its declaration "
                f"(`system {name}: float unit \"{found}\" …`)")
    return None


_STAGE_OPENED = re.compile(r'\bstage\s+([^\W\d][\w.]*)\s*(?:"(?:[^"\\\n]|\\.)*"\s*)?\Z')


def _late_stage_text(ttype: str, before: str) -> tuple[str, str] | None:
    """A text written in a stage after `classify`, `observe` or a branch (`observe A "Look again."`):
    the grammar wants a stage's texts first, which "missing `->`" did not say."""
    if ttype not in ("STRING", "LONG_STRING") or re.search(r"\bwhen\b(?:(?!->).)*\Z", before):
        return None
    brace = _unclosed_brace(before)
    if brace is None:
        return None
    lines = before.split("\n")
    opened = _STAGE_OPENED.search("\n".join(lines[: brace[0] - 1] + [lines[brace[0] - 1][: brace[1] - 1]]))
    if opened is None:
        return None
    return ("a stage's description text comes first, before `classify`, `observe` and the branches",
            f"move the text up, right after `stage {opened.group(1)} ... {{`")


# the last `otherwise -> …` arm before an error (group 1: it is bounded), on the error's own stage
_OTHERWISE_ARM = re.compile(r"\botherwise\s*->[^{}]*?(\bup\s+to\s+\d+\s+times)?\s*$")


# what follows the name of each declaration (to tell `systemB: int` from a stray word `systems`)
_DECL_GOES_ON = {"scenario": r'["{]', "include": '"', "start": r"(?:\n|\Z)", "field": ":", "system": ":",
                 "let": "=", "action": r'(?:["(\[\n]|\Z)', "output": ":", "stage": r'["{]', "subflow": r"\(",
                 "use": r"as\b"}


def _glued_keyword(word: str, after: str) -> tuple[str, str] | None:
    """`systemB: int` where a declaration starts: the message `KeywordGlue` gives where no name can stand."""
    keyword = next((k for k in DECL_KEYWORDS if word.startswith(k) and len(word) > len(k)
                    and re.match(r"[ \t]*" + _DECL_GOES_ON[k], after)), None)
    if keyword is None:
        return None
    return (f"missing space after `{keyword}` in `{word}`",
            f"write `{keyword} {word[len(keyword):]}`: {GLUE_HINT}")




# ---------------------------------------------------------------------------------------------
# Slips named from the text around the error (tried in order, before the catalogue)

Slip = Callable[[At], "tuple[str, str] | None"]


def _head(at: At) -> str:
    return at.before.rpartition("\n")[2]  # the error's line, up to the error


def _foreign_word(at: At) -> tuple[str, str] | None:
    return FOREIGN_BRANCH_WORDS.get(at.found) if at.ttype == "NAME" else None


def _attributes_first(at: At) -> tuple[str, str] | None:
    attrs = _ACTION_ATTRS_BEFORE.search(at.before) if at.ttype == "STRING" else None
    if attrs is None:
        return None
    return ("an action's description comes before its attributes",
            f"write `action {attrs.group(1)} {at.found} [{attrs.group(2)}]`")


def _aggregate(at: At) -> tuple[str, str] | None:
    agg = _AGGREGATE.search(_head(at))
    if agg is None:
        return None
    if agg.group(1) == "sum":
        return ("`sum` adds up a value over a list's items, written with `for`",
                "write `sum(i.amount for i in Items)`, or `sum(i.amount for i in Items where not i.paid)`")
    return (f"`{agg.group(1)}(…)` is not part of the language: a list's items are added up with `sum`, "
            "counted and tested",
            "write `sum(i.amount for i in Items)` (divide by `len(Items)` for a mean), `count(i in Items where "
            "…)`, `any(…)`, `all(…)`")


def _unit(at: At) -> tuple[str, str] | None:
    number = _NUMBER_BEFORE.search(_head(at))
    return _unit_slip(at.found, number.group(1), _head(at)) if number else None


def _output_attribute(at: At) -> tuple[str, str] | None:
    output = re.match(r"\s*output\s+(\w+)", _head(at)) if at.found in _VARIABLE_ATTRS else None
    if output is None:
        return None
    return (f"`{at.found}` is an attribute of fields and system variables, not of outputs",
            f"say it in the output's description, e.g. `output {output.group(1)}: … \"… (in EUR)\"`")


def _enum_hyphen(at: At) -> tuple[str, str] | None:
    enum = _ENUM_DECL.search(_head(at)) if at.found == "-" else None
    if enum is None:
        return None
    rest = re.match(r"\w+", at.after[1:])
    joined = f"{enum.group(1)}_{rest.group(0)}" if rest else f"{enum.group(1)}_…"
    return "`-` cannot be part of a name: enum values are names (letters, digits and `_`)", f"write `{joined}`"


def _match_colon(at: At) -> tuple[str, str] | None:
    if at.found == ":" and _MATCH_OPEN.search(at.before):
        return "a match arm is written `VALUE -> target`, not `VALUE: target`", "replace `:` with `->`"
    return None


def _dangling_comparison(at: At) -> tuple[str, str] | None:
    prev = _DANGLING.search(at.before) if at.found in ("==", "!=", "<", "<=", ">", ">=") else None
    if prev is None:
        return None
    return (f"`{at.found}` has nothing on its left: each comparison names its value",
            f"write `{prev.group(1)} {at.found} ...` (e.g. `N > 5 and N < 8`)")


def _set_brackets(at: At) -> tuple[str, str] | None:
    if at.found == "[" and re.search(r"\bin\s*\Z", at.before):
        return "a set of values is written in braces", "write `X in {A, B}`"
    return None


def _set_parentheses(at: At) -> tuple[str, str] | None:
    group = re.search(r"(\w+)\s+(not\s+)?in\s*\(([^()]*)\Z", _head(at)) if at.found == "," else None
    if group is None:
        return None
    rest = re.match(r"([^()\n]*)\)", at.after[1:])
    values = group.group(3).strip() + (", " + rest.group(1).strip() if rest else ", …")
    return ("a set of values is written in braces, not parentheses",
            f"write `{group.group(1)} {group.group(2) or ''}in {{{values}}}`")


def _is_operator(at: At) -> tuple[str, str] | None:
    subject = re.search(r"(\w+)\s*\Z", _head(at)) if at.found == "is" else None
    if subject is None:
        return None
    value = re.match(r"\s*(not\s+)?(\w+)", at.after[2:])
    op, shown = ("!=" if value and value.group(1) else "=="), (value.group(2) if value else "VALUE")
    return "`is` is not an operator: compare with `==`", f"write `{subject.group(1)} {op} {shown}`"


def _thousands(at: At) -> tuple[str, str] | None:
    num = re.search(r"(\d{1,3})\s*\Z", _head(at)) if at.found == "," else None
    more = re.match(r",(\d{3}(?:,\d{3})*)\b", at.after) if num else None
    if num is None or more is None:
        return None
    return "a number has no thousands separator", f"write `{num.group(1) + more.group(1).replace(',', '')}`"


def _between(at: At) -> tuple[str, str] | None:
    subject = re.search(r"([\w.]+)\s*\Z", _head(at)) if at.found == "between" else None
    if subject is None:
        return None
    bounds = re.match(r"between\s+([\w.]+)\s+and\s+([\w.]+)", at.after)
    lo, hi = (bounds.group(1), bounds.group(2)) if bounds else ("LOW", "HIGH")
    return ("`between` is not an operator: write both comparisons",
            f"write `{subject.group(1)} >= {lo} and {subject.group(1)} <= {hi}`")


def _membership(at: At) -> tuple[str, str] | None:
    container = re.search(r"([^\W\d][\w.]*)\s*\Z", _head(at)) if at.found in _MEMBERSHIP_WORDS else None
    if container is None:
        return None
    named = re.match(rf"{at.found}\s+(\w+)", at.after)
    return (f"`{at.found}` is not an operator: a list's membership is written `VALUE in LIST`",
            f"write `{named.group(1) if named else 'VALUE'} in {container.group(1)}`")


def _numeric_stage_id(at: At) -> tuple[str, str] | None:
    if re.fullmatch(r"\d\w*", at.found) and re.search(r"\bstage\s*\Z", _head(at)):
        return ("a stage id is a name: it cannot start with a digit",
                f"write `stage step{at.found} ...` (ids like `step1`, `s1`, `intake` appear verbatim in paths)")
    return None


def _list_index(at: At) -> tuple[str, str] | None:
    listed = _INDEXED.search(_head(at)) if at.found == "[" else None
    if listed is None or listed.group(1) in _TYPE_WORDS or not re.search(r"\bwhen\b|\blet\b|\bmatch\b|=|\(", _head(at)):
        return None
    name = listed.group(1)
    item = name[:1].lower()
    return (f"`{name}[…]`: a list position is a whole number written in the SOP",
            f"write `{name}[0]` for the first item, `first({name})` or `last({name})`; to find an item by what it "
            f"holds, test the items (`any({item} in {name} where {item}.…)`, `count(…)`)")


def _second_otherwise(at: At) -> tuple[str, str] | None:
    prior = _OTHERWISE_ARM.search(at.before) if at.found == "otherwise" else None
    if prior is None or "{" in at.before[prior.end():]:
        return None
    return ("a second `otherwise`: only the last branch of a stage can be `otherwise`",
            "to say what to do once the bounded branch is spent, write it as a `when` arm "
            "(`when CONDITION -> ... up to N times`) and keep `otherwise -> ...` last"
            if prior.group(1) else "remove one, or make the first a `when CONDITION -> ...` arm")


def _late_text(at: At) -> tuple[str, str] | None:
    return _late_stage_text(at.ttype, at.before)


def _glued_declaration(at: At) -> tuple[str, str] | None:
    if at.ttype == "NAME" and "`stage`" in at.words:
        return _glued_keyword(at.found, at.after[len(at.found):])
    return None


def _trailing_comma(at: At) -> tuple[str, str] | None:
    if at.found in ("}", ")", "]") and at.before.rstrip().endswith(","):
        return f"unexpected `{at.found}` after a comma", f"remove the trailing comma before `{at.found}`"
    return None


# Before the catalogue: what the text says more precisely than the parser state.
SLIPS: tuple[Slip, ...] = (
    _foreign_word, _attributes_first, _aggregate, _unit, _output_attribute, _enum_hyphen, _match_colon,
    _dangling_comparison, _set_brackets, _set_parentheses, _is_operator, _thousands, _between, _membership,
    _numeric_stage_id, _list_index, _second_otherwise, _late_text, _glued_declaration, _trailing_comma,
)


# ---------------------------------------------------------------------------------------------
# Matching

_MATCHED: dict[tuple[object, ...], str | None] = {}  # (parser, state, accepts, labels) -> label


def _by_example(exc: UnexpectedInput, lark: Lark, candidates: list[Entry]) -> Entry | None:
    """The first candidate one of whose examples fails in the parser state of `exc` (Lark's
    `match_examples`), memoised: each state's answer costs a parse of every example once."""
    examples = [(e.label, e.examples) for e in candidates if e.examples]
    if not examples or getattr(exc, "state", None) is None:
        return None
    _state_number(exc)
    key = (id(lark), exc.state, frozenset(getattr(exc, "accepts", None) or ()), tuple(label for label, _ in examples))
    if key not in _MATCHED:
        if len(_MATCHED) > 4096:
            _MATCHED.clear()
        _MATCHED[key] = exc.match_examples(_parse_or_none(lark), examples, use_accepts=True)
    label = _MATCHED[key]
    return next((e for e in candidates if e.label == label), None)


def _state_number(exc: UnexpectedInput) -> None:
    """An error the contextual lexer found (a character no terminal of the state takes, which the root
    lexer reads as some other token) carries the whole parser state: keep its state number, as
    the parser's own errors do, so the two kinds compare."""
    position = getattr(exc.state, "position", None)
    if position is not None:
        exc.state = position


def _parse_or_none(lark: Lark) -> Callable[[str], Any]:
    """`lark.parse` for examples: only Lark's syntax errors count (a snippet refused by a check of the
    builder is no example of this state)."""

    def parse(text: str) -> Any:
        try:
            return lark.parse(text)
        except UnexpectedInput as exc:
            _state_number(exc)
            raise
        except Exception:  # noqa: BLE001 - any other refusal: no match
            return None

    return parse


def catalogue_entry(exc: UnexpectedInput, lark: Lark, at: At) -> Entry | None:
    """The catalogue's entry for a token error: matched by example first, then by what is expected."""
    candidates = [e for e in CATALOGUE if e.applies(at)]
    found = _by_example(exc, lark, candidates)
    if found is not None:
        return found
    words = set(at.words)
    return next((e for e in candidates if (e.expects & words) or (not e.expects and not e.examples)), None)


# ---------------------------------------------------------------------------------------------
# The diagnostic

_TOKEN_WORDS = {
    "NAME": "a name", "STRING": "a quoted string", "LONG_STRING": "a quoted string",
    "NUMBER": "a number", "COMP_OP": "a comparison (==, <, ...)", "$END": "end of file",
}
# invalid characters and what to write instead
_CHAR_HINTS = {
    "'": 'strings use double quotes: "like this"',
    **dict.fromkeys("=!<>", "comparisons are ==, !=, <, <=, >, >=; branches use ->"),
    **dict.fromkeys("&|", "write `and` / `or` in conditions; `|` separates enum values in a declaration"),
    ";": "remove it: declarations need no separator",
    **dict.fromkeys("\u201c\u201d\u2018\u2019", 'text goes in straight double quotes: "like this"'),
    **dict.fromkeys("\u3001\u3002", "write `,` between items; a sentence belongs inside a quoted text"),
}


def expected_words(lark: Lark, expected: set[str]) -> list[str]:
    """The terminals a parser state accepts, in the user's terms."""
    strings = {t.name: f"`{t.pattern.value}`" for t in lark.terminals if t.pattern.type == "str"}

    def word(name: str) -> str:
        if name in _TOKEN_WORDS:
            return _TOKEN_WORDS[name]
        if name in strings:
            return strings[name]
        return "end of file" if name.startswith("$") else "a token" if name.startswith("__") else name.lower()

    return sorted({word(e) for e in expected})


def _invalid_character(exc: UnexpectedCharacters, text: str, file: str) -> Diagnostic:
    line, col, pos = exc.line or 0, exc.column or 0, exc.pos_in_stream
    ch = text[pos] if pos is not None and 0 <= pos < len(text) else "?"
    span = ir.Span(file=file, line=line, col=col, end_line=line, end_col=col + 1)
    if ch == '"':
        return error("E005", "unterminated string: this `\"` is never closed", span,
                     'close it on the same line; use """...""" for text over several lines')
    hint = _CHAR_HINTS.get(ch, "names use letters, digits and `_`; text goes in double quotes")
    if ch == "%" and pos is not None and (number := re.search(r"(\d+(?:\.\d+)?)\s*\Z", text[:pos])):
        shown = number.group(1)
        hint = f"write a percentage as a plain number (`{shown}` on a 0–100 scale, or `{float(shown) / 100:g}`)"
    elif "\uff01" <= ch <= "\uff5e":  # full-width forms of ASCII punctuation (a CJK input method)
        hint = f"`{ch}` is a full-width character: write the ASCII `{chr(ord(ch) - 0xFEE0)}`"
    return error("E005", f"invalid character {_char_name(ch)}", span, hint)


def _unclosed_at(text: str, file: str, message: str, hint: str) -> Diagnostic | None:
    brace = _unclosed_brace(text)
    if brace is None:
        return None
    line, col = brace
    return error("E002", message, ir.Span(file=file, line=line, col=col, end_line=line, end_col=col + 1), hint)


def _at_end(text: str, file: str, words: list[str]) -> Diagnostic:
    unclosed = _unclosed_at(text, file, "unclosed block: this `{` is never closed",
                            "add the matching `}` at the end of the block")
    if unclosed is not None:
        return unclosed
    lines = text.splitlines() or [""]
    line, col = len(lines), len(lines[-1]) + 1
    return error("E001", "unexpected end of file: the last declaration is incomplete",
                 ir.Span(file=file, line=line, col=col, end_line=line, end_col=col),
                 "expected " + ", ".join(words) if words else None)


def syntax_diagnostic(exc: UnexpectedInput, text: str, file: str, lark: Lark) -> Diagnostic:
    """The diagnostic for a syntax error `lark` (the parser that raised `exc`) found in `text`."""
    if isinstance(exc, UnexpectedCharacters):
        return _invalid_character(exc, text, file)
    token = getattr(exc, "token", None)
    # `accepts` is what the parser could really take here; `expected` also lists tokens that are
    # only possible after default reductions, which makes hints noisy.
    words = expected_words(lark, set(getattr(exc, "accepts", None) or getattr(exc, "expected", None) or []))
    if isinstance(exc, UnexpectedEOF) or token is None or token.type == "$END":
        return _at_end(text, file, words)
    pos = token.start_pos if isinstance(token.start_pos, int) else len(text)
    at = At(found=_shown(str(token)), ttype=token.type, words=words, before=text[:pos], after=text[pos:],
            line=exc.line or 0)
    if at.ttype.lower() in DECL_KEYWORDS and "`}`" in words:
        unclosed = _unclosed_at(at.before, file, f"unclosed block: this `{{` is never closed before `{at.found}` "
                                f"at line {at.line}", "add the matching `}` before the next declaration")
        if unclosed is not None:
            return unclosed
    col = exc.column or 0
    span = ir.Span(file=file, line=at.line, col=col, end_line=at.line, end_col=col + max(1, len(at.found)))
    named = next((found for slip in SLIPS if (found := slip(at)) is not None), None)
    if named is None and (entry := catalogue_entry(exc, lark, at)) is not None:
        named = entry.render(at)
    if named is None:
        close = did_you_mean(at.found, KEYWORDS) if at.ttype == "NAME" else None
        named = (f"unexpected `{at.found}`",
                 close or "expected " + ", ".join(words[:8]) + (" ..." if len(words) > 8 else ""))
    return error("E001", named[0], span, named[1])
