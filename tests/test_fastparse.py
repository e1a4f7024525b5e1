"""The parser's fast path (sopgraph/language/fastparse.py) builds exactly the program Lark builds.

"Exactly": the same node classes, the same field values with the same Python types (an `int` is not
a `float`), the same spans, the same fields sets; for text Lark rejects, the same diagnostics. Checked
on every shipped program, on every kind of generated benchmark program, on programs generated from
the grammar and on the random well-typed programs of tests/test_engine.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from helpers import gen_sop, scoring_sop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from test_engine import _program
from test_fuzz import GRAMMAR_PROGRAMS

from sopgraph.language import fastparse
from sopgraph.language.diagnostics import SopError
from sopgraph.language.larkparse import lark_program
from sopgraph.language.parse import KEYWORDS, parse_text

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted([*ROOT.glob("scenarios/*.sop"), *ROOT.glob("examples/**/*.sop"), *ROOT.glob("tests/golden/*.sop"),
                  *ROOT.glob("tests/data/**/*.sop")])
EXAMPLES = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), max_examples=150)


def difference(a: Any, b: Any, path: str = "program") -> str | None:
    """Where two parse results differ (None when they are the same), types and spans included."""
    if isinstance(a, BaseModel) or isinstance(b, BaseModel):
        if type(a) is not type(b):
            return f"{path}: {type(a).__name__} != {type(b).__name__}"
        if a.__pydantic_fields_set__ != b.__pydantic_fields_set__:
            return f"{path}: fields set {a.__pydantic_fields_set__} != {b.__pydantic_fields_set__}"
        for name in type(a).model_fields:
            found = difference(getattr(a, name), getattr(b, name), f"{path}.{name}")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple, dict)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{path}: {a!r} != {b!r}"
        if isinstance(a, dict):
            if list(a) != list(b):
                return f"{path}: keys {list(a)} != {list(b)}"
            return next((d for k in a if (d := difference(a[k], b[k], f"{path}[{k!r}]"))), None)
        return next((d for i, (x, y) in enumerate(zip(a, b, strict=True))
                     if (d := difference(x, y, f"{path}[{i}]"))), None)
    if type(a) is not type(b) or a != b:
        return f"{path}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"
    return None


def outcome(text: str, file: str, *, fast: bool) -> Any:
    try:
        return parse_text(text, file, fast=fast)
    except SopError as exc:
        return [d.model_dump() for d in exc.diagnostics]


def assert_same(text: str, file: str = "t.sop") -> None:
    lark = outcome(text, file, fast=False)
    fast = outcome(text, file, fast=True)
    assert difference(lark, fast) is None, difference(lark, fast)


def fast_items(text: str, file: str = "t.sop") -> tuple[Any, list[str]]:
    """The fast path's program and the fragments it handed to Lark."""
    fragments: list[str] = []

    def lark_items(fragment: str) -> list[Any]:
        fragments.append(fragment.strip())
        return lark_program(fragment, file).items

    return fastparse.parse_fast(text, file, lark_items), fragments


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_programs_parse_the_same(path: Path) -> None:
    assert_same(path.read_text(encoding="utf-8").replace("\r\n", "\n"), str(path))


@pytest.mark.parametrize("kind", ["diamond", "chain", "mixed", "realistic"])
def test_generated_programs_parse_the_same_without_lark(kind: str) -> None:
    for seed in range(3):
        text = gen_sop().generate(60, kind=kind, seed=seed)
        assert_same(text)
        program, fragments = fast_items(text)
        assert program is not None and fragments == []  # the fast path read every item itself


def test_scoring_family_parses_the_same() -> None:
    assert_same(scoring_sop(4, 10))


def test_unrecognised_items_go_to_lark_at_their_position() -> None:
    """An item the fast path does not read (here a number of more than 300 digits, which Lark reads when
    it fits a float) goes to Lark alone, placed at its line and column; the items around it stay fast."""
    text = ('scenario s "S" {\n  owner "ops"\n}\nfield A: Yes | No\n'
            f"type T = record {{ a: bool }}\nsystem R: T\nlet Big = {'9' * 301}\n"
            "stage one {\n  when A == Yes and R.a -> do Go\n  otherwise -> do Go\n}\naction Go\n")
    program, fragments = fast_items(text)
    assert program is not None
    assert [f.split()[0] for f in fragments] == ["let"]
    assert_same(text)


@pytest.mark.parametrize("header", [
    'scenario s "S" "Desc." {\n  domain "telecom"\n  money "Penalty"\n  version "1"\n}\n',
    'scenario s {\n}\n',
    'scenario s "S" { notes """two\nlines""" }\n',
])
def test_a_header_with_metadata_is_read_without_lark(header: str) -> None:
    """The SAGE scenarios open with a metadata block: read by the fast path, a check of them no longer
    builds Lark's parser (a few hundred milliseconds of every command)."""
    text = header + 'field A: Yes | No "a"\naction Go "g"\nstage one { match A { Yes -> do Go  No -> do Go } }\n'
    program, fragments = fast_items(text)
    assert program is not None and fragments == []
    assert_same(text)


def test_malformed_text_gets_lark_diagnostics() -> None:
    for text in ("field A: Yes | No\nstage s {\n  when A = Yes -> do Go\n}\n",
                 "stage s { when A -> do Go otherwise -> t, }\n",
                 "field match: A | B\n", "stage s { -> t \n", "action Go [a,]\n", "let X = 1 < 2 < 3\n",
                 "field A: int[0..5 days]\n", "stage s { match A { B -> t up -> u } }\n", "let X = count(1: A, B)\n",
                 "let A = 0 not in { 0 week }\n", "stage s { match A { 2 days -> t } }\n"):
        assert isinstance(outcome(text, "t.sop", fast=True), list), text
        assert_same(text)


@EXAMPLES
@given(GRAMMAR_PROGRAMS)
def test_grammar_generated_programs_parse_the_same(text: str) -> None:
    assert_same(text)


@EXAMPLES
@given(_program())
def test_random_programs_parse_the_same(text: str) -> None:
    assert_same(text)


ONE_LINE_ARMS = """field A: Yes | No
field F: bool
system N: int[0..100]
system M: int[0..100]
action Go(x: int[0..9])
output O: int[0..9] = 0
stage s "S" {
    when F -> t
    when N < 5 -> do Go  # a comment after the target
    when N<=M->t
    otherwise when N >= 50 -> t
    when N == 7 -> do Go -> t
    when N != 8 -> do Go(x = 1)
    when N > 9 -> do Go { O = 1 }
    when N > 10 -> t up to 2 times
    when F
        -> t
    when true -> t
    when N < 12 days -> t
    when N > 1.5 -> do
        Go
    otherwise -> do Go
}
stage t {
    match A {
        Yes -> do Go
        No -> u
        otherwise -> do Go
    }
}
stage u {
    when N < 3 -> do Go
    otherwise -> s
}
"""


def test_one_line_arms_read_by_regex_build_the_token_readers_nodes() -> None:
    """`_WHEN_ARM`/`_OTHERWISE_ARM` take the commonest arms; anything else on the line (steps,
    arguments, outputs, `up to`, a keyword, a unit, a line break) goes to the token reader."""
    assert_same(ONE_LINE_ARMS)
    taken: list[str] = []
    real = fastparse._Items.quick_arm

    def spy(self: Any, pattern: Any, *, ordered: bool = False) -> Any:
        start = self.s
        found = real(self, pattern, ordered=ordered)
        if found is not None:
            taken.append(self.text[start:self.text.index("\n", start)].strip())
        return found

    fastparse._Items.quick_arm = spy  # type: ignore[method-assign]
    try:
        fast_items(ONE_LINE_ARMS)
    finally:
        fastparse._Items.quick_arm = real  # type: ignore[method-assign]
    assert taken == ["when F -> t", "when N < 5 -> do Go  # a comment after the target", "when N<=M->t",
                     "when N >= 50 -> t", "otherwise -> do Go", "otherwise -> do Go", "when N < 3 -> do Go",
                     "otherwise -> s"]


ONE_LINE_HEADS = '''field A: Yes | No "the answer"
field B: Yes|No|Maybe
field C: One | Two
    | Three
field D: bool
field E: bool? = true
system N: int[0..1000]
system M: float[-5..5] unit "s"
system P: int[ 0 .. 7 ] hidden
system Q: int[0..]
system R: int(0..9]
field S: bool.x
field T: Only
stage s "S" {
    match A {
        Yes -> t
        No -> t
    }
}
stage t "T \\"quoted\\"" {
    "more text"
    match N + 1 {
        1 -> do Go
        otherwise -> u
    }
}
stage u { match(B) { Yes -> do Go  No -> do Go  Maybe -> do Go } }
action Go
'''


def test_one_line_heads_read_by_regex_build_the_token_readers_nodes() -> None:
    """`_DECL_HEAD`, `_STAGE_HEAD` and `_MATCH_HEAD` take the commonest heads; other shapes (an enum
    going on on the next line, open or half-open ranges, a second text, an expression) do not."""
    assert_same(ONE_LINE_HEADS)
    taken: list[str] = []
    real = fastparse._Items.quick_decl

    def spy(self: Any) -> Any:
        found = real(self)
        if found is not None:
            taken.append(found[0])
        return found

    fastparse._Items.quick_decl = spy  # type: ignore[method-assign]
    try:
        program, fragments = fast_items(ONE_LINE_HEADS)
    finally:
        fastparse._Items.quick_decl = real  # type: ignore[method-assign]
    assert program is not None and fragments == []
    assert taken == ["A", "B", "D", "E", "N", "M", "P"]


QUICK_STAGES = '''field A: Yes | No
field F: bool
system N: int[0..100]
system M: int[0..100]
action Go
stage m1 "match, plain arms" {
    match A {
        Yes -> m2

        No -> do Go
    }
}
stage m2 "match, bools and otherwise" {
    match F {
        true -> m3
        otherwise -> do Go
    }
}
stage m3 "match, numbers" {
    match N {
        1 -> w1
        2.5 -> do Go
    }
}
stage w1 "whens" {
    when F -> w2
    when N < 5 -> do Go
    when N>=M->w2
    otherwise -> do Go
}
stage w2 "whens without otherwise" {
    when N == 7 -> x1
}
stage x1 "a comment" {
    when F -> x2  # why
    otherwise -> do Go
}
stage x2 "otherwise when" {
    when F -> x3
    otherwise when N > 3 -> x3
    otherwise -> do Go
}
stage x3 "up to" {
    when F -> x4 up to 2 times
    otherwise -> do Go
}
stage x4 "a step" {
    match A {
        Yes -> do Go -> x5
        No -> x5
    }
}
stage x5 "text" {
    "Ask for it."
    when F -> x6
    otherwise -> do Go
}
stage x6 "closing on one line" {
    match A {
        Yes -> x7
        No -> x7 } }
stage x7 "an arm going on" {
    when F
        -> x8
    otherwise -> do Go
}
stage x8 "a reserved word" {
    match A {
        Yes -> x9
        not -> x9
    }
}
stage x9 "two values" {
    match A {
        Yes, No -> do Go
    }
}
stage x10 {
    when F -> do Go
    otherwise -> do Go
}
'''


def test_whole_stages_read_by_regex_build_the_token_readers_nodes() -> None:
    """`quick_stage` takes whole stages of the commonest shapes (a `match` of one-line arms, or one-line
    `when` arms, an `otherwise`), one regex per line; any other stage goes to the token reader."""
    text = QUICK_STAGES.replace('        not -> x9\n', '        No -> x9\n')
    assert_same(text)
    assert isinstance(outcome(QUICK_STAGES, "t.sop", fast=True), list)  # `not` as a value: Lark's error
    assert_same(QUICK_STAGES)
    taken: list[str] = []
    real = fastparse._Items.quick_stage

    def spy(self: Any) -> Any:
        found = real(self)
        if found is not None:
            taken.append(found.id)
        return found

    fastparse._Items.quick_stage = spy  # type: ignore[method-assign]
    try:
        program, fragments = fast_items(text)
    finally:
        fastparse._Items.quick_stage = real  # type: ignore[method-assign]
    assert program is not None and fragments == []
    assert taken == ["m1", "m2", "m3", "w1", "w2", "x8"]


UNICODE_NAMES = '''scenario 退款 "电商退款"
field 意图: 退款 | 换货 | 咨询 "意图"
field Größe: Klein | Groß
system Ταχύτητα: int[0..10]
action 办理退款 "办理"
action Закрыть "закрыть"
stage 第一步 "分类" {
    when 意图 == 退款 and Ταχύτητα > 3 -> do 办理退款
    when Größe == Groß -> 第二步
    otherwise -> do Закрыть
}
stage 第二步 { match 意图 { 退款 -> do 办理退款  换货, 咨询 -> do Закрыть } }
'''


def test_names_in_any_script_parse_the_same() -> None:
    """Names are letters of any script (CJK, Greek, Cyrillic, accented Latin), digits and `_`: both the
    fast path and Lark read them, into the same program; a digit still cannot start a name."""
    assert_same(UNICODE_NAMES)
    program, fragments = fast_items(UNICODE_NAMES)
    assert program is not None and fragments == []
    assert_same(UNICODE_NAMES.replace("第二步 {", "2步 {"))  # a syntax error on both paths, alike


# ---------------------------------------------------------------------------------------------
# Differential fuzz over mutated text: the fast path never accepts what Lark rejects, and when both
# accept they build the same program (assert_same also compares the diagnostics of a rejection).

_WORD_TOKEN = re.compile(r'"""[\s\S]*?"""|"(?:[^"\\\n]|\\.)*"|[^\W\d]\w*(?:\.[^\W\d]\w*)*|\d+(?:\.\d+)?|->|==|!=|<=|>='
                         r"|\.\.|\S")
_STRAY = ["?", "|", ":", "=", ",", "->", "{", "}", "(", ")", "[", "]", "..", "-", "#", '"', "x", "1", "do", "when",
          "otherwise", "up to 2 times", "not", "in", "\n", " "]


def _seed_texts() -> list[str]:
    paths = sorted([*ROOT.glob("scenarios/*.sop"), *ROOT.glob("examples/**/*.sop")])
    texts = [p.read_text(encoding="utf-8").replace("\r\n", "\n") for p in paths]
    texts += [gen_sop().generate(6, kind=kind, seed=1) for kind in ("diamond", "chain", "mixed", "realistic")]
    return texts


MUTATION_SEEDS = _seed_texts()


def mutate_text(text: str, op: str, a: int, b: int) -> str:
    """One edit of `text` at token positions picked by `a` and `b` (modulo what exists)."""
    toks = [(m.start(), m.end()) for m in _WORD_TOKEN.finditer(text)] or [(0, 0)]
    s, e = toks[a % len(toks)]
    s2, e2 = toks[b % len(toks)]
    if op == "delete":
        return text[:s] + text[e:]
    if op == "duplicate":
        return text[:e] + " " + text[s:e] + text[e:]
    if op == "swap":
        (s, e), (s2, e2) = sorted(((s, e), (s2, e2)))
        return text if s == s2 or e > s2 else text[:s] + text[s2:e2] + text[e:s2] + text[s:e] + text[e2:]
    if op == "glue_keyword":  # a keyword runs into the next word
        keywords = [t for t in toks if text[t[0]:t[1]] in KEYWORDS] or toks
        s, e = keywords[a % len(keywords)]
        op = "glue"
    if op == "glue":  # the token runs into the next one: the whitespace after it goes
        gap = re.match(r"[ \t\n]+", text[e:])
        return text if gap is None else text[:e] + text[e + gap.end():]
    if op == "drop_newline":
        nl = text.find("\n", s)
        return text if nl < 0 else text[:nl] + text[nl + 1:]
    if op == "stray":
        return text[:s] + _STRAY[b % len(_STRAY)] + text[s:]
    if op == "truncate":
        return text[:s]
    raise AssertionError(op)


MUTATIONS = ["delete", "duplicate", "swap", "glue", "glue_keyword", "drop_newline", "stray", "truncate"]
MUTATION = st.tuples(st.sampled_from(MUTATIONS), st.integers(0, 10**6), st.integers(0, 10**6))


@settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), max_examples=150)
@given(st.sampled_from(range(len(MUTATION_SEEDS))), st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_text_parses_the_same(seed: int, edits: list[tuple[str, int, int]]) -> None:
    text = MUTATION_SEEDS[seed]
    for op, a, b in edits:
        text = mutate_text(text, op, a, b)
    assert_same(text)


@pytest.mark.parametrize("text", [
    'fieldA: bool\n', 'field A: bool\nsystemB: int\n', 'actionGo "go"\n', 'field A: bool\nstages { -> t }\n',
    'field A: bool\nletY = A\n', 'field A: bool\nstage s { whenA -> t otherwise -> t }\n',
    'stage s { -> t up to2 times otherwise -> u }\n', 'stage s { match A { B -> t otherwise-> u } }\n',
])
def test_keywords_glued_to_names_parse_the_same(text: str) -> None:
    """A keyword run into the next word (`systemB:`) is one name to the fast path's reader; Lark's
    contextual lexer would split it where no name can stand. Both reject it, with the same diagnostic."""
    assert_same(text)
    assert isinstance(outcome(text, "t.sop", fast=True), list) == ("otherwise->" not in text), text


QUOTED_ENUMS = '''field Visits: Never | "1-2 times" | "5+ times" "v"
system Kind: "Traffic/URL Cloaking" | Phishing
action Go(level: Low | "Very high") "g"
output Level: Low | "Very high" = Low
stage s1 {
    match Visits { "5+ times" -> do Go(level = "Very high") Never, "1-2 times" -> s2 }
}
stage s2 { when Kind == "Traffic/URL Cloaking" -> do Go(level = Low) otherwise -> do Go(level = "Very high") }
'''


def test_quoted_enum_values_parse_the_same_without_lark() -> None:
    """Enum values written in quotes (`"5+ times"`) are read by the fast path itself, into Lark's nodes;
    one quoted string alone is no type on either path."""
    assert_same(QUOTED_ENUMS)
    program, fragments = fast_items(QUOTED_ENUMS)
    assert program is not None and fragments == []
    assert_same('field V: "5+ times" "v"\n')
    assert_same('field V: A | "x" | \n')
    assert_same('type T = "a b" | C\nsystem S: T\n')
    two_first = 'field V: A | B | "c d" "v"\nfield W: A | B\n    | "c"\n'  # the one-line head regex gives way
    assert_same(two_first)
    assert fast_items(two_first)[1] == []


def test_optional_record_fields_parse_the_same() -> None:
    text = ('type Bill = record { amount: float, note: string?, due: date? }\nsystem B: Bill "b"\n'
            'system C: record { a: bool?, b: list of X | Y? } "c"\n')
    assert not isinstance(outcome(text, "t.sop", fast=True), list)  # a program, not diagnostics
    assert_same(text)
    assert_same('system C: record { a: bool?? } "c"\n')  # a syntax error on both paths, alike


def test_open_records_parse_the_same() -> None:
    text = ('type Seg = record open { flown: bool, inner: record { x: int } }\nsystem S: list of Seg "s"\n'
            'system M: record open { ok: bool? } "m"\nfield open: bool "o"\nlet X = open\n')
    assert not isinstance(outcome(text, "t.sop", fast=True), list)
    assert_same(text)
    assert_same('system M: record open open { ok: bool } "m"\n')


def test_list_outputs_parse_the_same() -> None:
    text = ('field X: bool "x"\noutput P: list[..3] of A | B | "C d" = [B, A] "p"\naction Go "g"\n'
            'stage s { when X -> do Go { P = [A, B when X and not X, "C d" when X] } otherwise -> do Go { P = [] } }\n')
    assert not isinstance(outcome(text, "t.sop", fast=True), list)
    assert_same(text)
    assert_same(text.replace("[B, A]", "[B, A when X]"))  # a default is a list of values: no conditions
    assert_same(text.replace("P = []", "P = [,]"))


@pytest.mark.parametrize("decl", [
    'action Restart "r" affects Up',
    'action Restart "r" [irreversible] affects Up, Level',
    'action Restart(mode: Soft | Hard) "r"\n    [irreversible]\n    affects Up,\n      Level',
    'action Restart affects Up',
    'action Restart "r" affects',           # no name: both refuse it
    'action Restart "r" affects Up,',       # a trailing comma: both refuse it
    'action Restart "r" affects stage',     # a keyword is no name
])
def test_affects_parses_the_same(decl: str) -> None:
    text = ('system Up: bool "u"\nsystem Level: int[0..3] "l"\naction Go "g"\n' + decl + "\n"
            "stage s { observe Up, Level when Up and Level > 1 -> do Restart -> s up to 2 times otherwise -> do Go }\n")
    assert_same(text)
    program, fragments = fast_items(text)
    if "affects Up" in decl and not decl.endswith(","):
        assert fragments == []  # read by the fast path itself
        action = next(i for i in program.items if getattr(i, "name", "") == "Restart")
        assert action.affects[:1] == ["Up"]


@pytest.mark.parametrize("decl", [
    'system Up: bool volatile "u"',
    'system Up: bool hidden volatile "u"',
    'system Up: int[0..3] unit "bars" volatile',
    'system Up: bool volatile volatile',
    'system volatile: bool "a name still"',
])
def test_volatile_parses_the_same(decl: str) -> None:
    text = (decl + '\naction Go "g"\naction Fix "f" affects Up\n'
            "stage s { observe Up when Up -> do Fix -> s up to 2 times otherwise -> do Go }\n")
    assert_same(text)
    program, _ = fast_items(text)
    var = next(i for i in program.items if getattr(i, "role", "") == "system")
    assert var.volatile == ("bool volatile" in decl or "volatile volatile" in decl or '" volatile' in decl
                            or "hidden volatile" in decl or '"bars" volatile' in decl)


@pytest.mark.parametrize("arm", [
    "when any(f in Fees where f.ok) -> for f in Fees where f.ok do Pay(id = f.id) -> s2",
    "when len(Fees) > 0 -> for f in Fees do Pay(id = f.id) -> do Pay(id = first(Fees).id) -> s2",
    "when len(Fees) > 1 and Fees[1].ok -> do Pay(id = last(Fees).id)",
    "when len(Fees) > 1 and Fees[-1].ok -> s2",           # not a position: both refuse it
    "when len(Fees) > 1 and Fees[1.5].ok -> s2",          # not a whole number: both refuse it
    "when len(Fees) > 0 -> for f in Fees where do Pay(id = f.id) -> s2",  # no condition: both refuse it
])
def test_for_each_steps_and_positions_parse_the_same(arm: str) -> None:
    text = ('system Fees: list[..3] of record { id: string, ok: bool } "f"\naction Pay(id: string) "p"\n'
            f'action Go "g"\nstage s {{ {arm} otherwise -> do Go }}\nstage s2 {{ -> do Go }}\n')
    assert_same(text)
    refused = "[-1]" in arm or "[1.5]" in arm or "where do" in arm
    assert isinstance(outcome(text, "t.sop", fast=False), list) == refused


# ---------------------------------------------------------------------------------------------
# Lists, records, `type` declarations, `sum(… for …)`, field reads, positions, list values, for-each
# steps, subflows and uses: read by the fast path itself (a file using them no longer builds Lark's
# parser, a few hundred milliseconds of every command), into Lark's nodes.


def _orders_programs() -> list[str]:
    """The `orders` programs of benchmarks/bench_analysis.py shape (e): seeds 0-24, at most 100 lines."""
    gen = gen_sop()
    out = []
    for seed in range(25):
        stages = 4 + (seed * 7) % 20
        text = gen.generate(stages, kind="orders", seed=seed)
        while len(text.splitlines()) > 100 and stages > 1:
            stages -= 1
            text = gen.generate(stages, kind="orders", seed=seed)
        out.append(text)
    return out


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_programs_are_read_without_lark(path: Path) -> None:
    text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
    if isinstance(outcome(text, str(path), fast=False), list):
        return  # a golden syntax error: Lark's diagnostics (test_shipped_programs_parse_the_same)
    program, fragments = fast_items(text, str(path))
    assert program is not None and fragments == []


def test_orders_programs_parse_the_same_without_lark() -> None:
    for text in _orders_programs():
        assert_same(text)
        program, fragments = fast_items(text)
        assert program is not None and fragments == []


@pytest.mark.parametrize("text", [
    "let X = sum + 1\n",                                     # `sum` where an expression starts: the keyword
    "field sum: bool\nlet X = sum\n",
    "stage s { when sum -> t }\n",
    "stage s { when N > sum -> t }\n",
    "stage s { match sum { A -> t } }\n",
    "stage s { when X -> for\n when Y -> t }\n",              # `for` where a target stands: the keyword
    "stage s { match X { A -> for } }\n",
    "stage s { match X { A -> for\n B -> t } }\n",
    "stage s {\n    when X -> for\n    otherwise -> t\n}\n",
    "field X: date | A\n",                                   # a type's word first: the type, then `|`
    "field X: list | A\n",
    "system X: string | A\n",
])
def test_keywords_only_where_they_stand_are_refused_alike(text: str) -> None:
    """Words that are names elsewhere but keywords where an expression or a target starts (`sum`, `for`)
    or where a type is written (`date`, `list`): Lark refuses them there, and so does the fast path (it
    used to read them as names)."""
    assert isinstance(outcome(text, "t.sop", fast=False), list)
    assert_same(text)


STRUCTURED = '''type Fee = record { id: string, amount: int[0..100], refundable: bool, }
type Leg = record open {
    origin: CDG | "J F K",
    flown: bool?,
    inner: record { at: datetime? }
} "a leg"
type Kind = A | "b c"
type Words = date | list | sum "names here, not types"
field for: bool
field of: Words
system Fees: list[..4] of Fee "fees"
system Legs: list(0..4) of Leg
system Tries: list[1.5..3.5) of int[0..10]?
system Big: list[..12345678901234567891] of bool
system Any: list of list[2..] of Kind
action Pay(id: string, all_fees: list[..4] of Fee) "pay"
action Go "go"
output Kinds: list[..3] of A | "b c" = [A, "b c"]
output None_: list of A | B = []
let Total = sum(f.amount for f in Fees where f.refundable and not (f.id matches "x-[0-9]+"))
let Every = sum(f.amount for f in Fees)
let Wrong = sum(Total, 1)
let Nothing = sum()
let First = first(Legs).origin
let Deep = Legs[0].inner.at
let Spaced = (Legs [ 1 ]) . origin
let Lit = [A, B when Total > 3][0]
let Count = count(l in Legs where l.flown) + len(Fees) - -Fees[2].amount
stage s {
    for f in Fees where f.refundable do Pay(id = f.id, all_fees = Fees) -> t
}
stage w {
    when for and Legs[0].sum -> do for
    otherwise -> w2
}
stage w2 { match of { list -> do Go  date, sum -> s } }
stage t {
    when Total > 3 -> for f in Fees do Go -> do Pay(id = last(Fees).id, all_fees = Fees) -> u
    when Every > 1 -> do Go { Kinds = [
        A when Total > 1,
        "b c"
    ] }
    otherwise -> for l in Legs where l.flown do Go -> u
}
subflow retry(again, done) {
    stage u { match Kind_ { A -> again  otherwise -> do Go } }
    use other as inner(next -> done)
}
subflow other(next) { stage v { -> next } }
use retry as r1(again -> s, done -> do Go { Kinds = [] })
use retry as r2()
'''


def test_structured_forms_parse_the_same_without_lark() -> None:
    assert not isinstance(outcome(STRUCTURED, "t.sop", fast=False), list)
    assert_same(STRUCTURED)
    program, fragments = fast_items(STRUCTURED)
    assert program is not None and fragments == []
    big = next(i for i in program.items if getattr(i, "name", "") == "Big")
    assert big.type.max_len == 12345678901234567891  # read as written, not through a float


@pytest.mark.parametrize("text", [
    "field A: bool # x?",            # a comment ends the file: none of it is read as a token (`?` was)
    "let X = A // B",
    'let X = A # "a text"',
    "let X = 2 days.origin\n",       # Lark's TIME_UNIT stops before the dot: a field of a duration
    "let X = 2 days .origin + 1.5 weeks\n",
])
def test_token_edges_parse_the_same_without_lark(text: str) -> None:
    assert not isinstance(outcome(text, "t.sop", fast=False), list)
    assert_same(text)
    program, fragments = fast_items(text)
    assert program is not None and fragments == []


@pytest.mark.parametrize("text", [
    "let X = sum(f.a for f.b in L)\n", "let X = sum(f.a for f not in L)\n", "let X = sum(f.a for f in {A})\n",
    "let X = sum(f.a for L)\n", "let X = sum(f.a for f in L where)\n", "let X = sum(a,)\n", "let X = sum\n",
    "let X = L[1.5]\n", "let X = L[-1]\n", "let X = L[]\n", "let X = L.\n", "let X = first(L).count\n", "let X = L..a\n",
    "let X = A in [A, B]\n", "let X = A not in []\n", "let X = [A,]\n", "let X = [,]\n", "let X = [A B]\n",
    "system L: list[..3]\n", "system L: list of\n", "system L: list[a..3] of int\n", "system L: list[..3] of int??\n",
    "system R: record { }\n", "system R: record { a: bool,, }\n", "system R: record { a: bool?? }\n",
    "system R: record open open { a: bool }\n", "system R: record { count: bool }\n", "system R: record a { b: bool }\n",
    "type T = A\n", "type T = record\n", "type T = A |\n", "type = A | B\n", "type T: A | B\n",
    "output O: list of A | B = [A when B]\n", "output O: list of A | B = [A,]\n", "field F: list of A | B = [A]\n",
    "stage s { -> for f in L do Go }\n", "stage s { -> for f in L where do Go -> t }\n", "stage s { -> for in L do Go -> t }\n",
    'stage s { -> for f in L do "where" -> t }\n', "stage s { -> for f in L do Go { O = 1 } -> t }\n",
    "subflow f() { }\n", "subflow f(a,) { stage s { -> a } }\n", "subflow f(a) { stage s { -> a } field X: bool }\n",
    "use f as g(a -> )\n", "use f g(a -> t)\n", "use f as g(a -> t,)\n", "use f as g(a t)\n",
])
def test_malformed_structured_forms_get_lark_diagnostics(text: str) -> None:
    """What the fast path does not fully recognise goes to Lark: the same diagnostics, never a wrong parse."""
    assert isinstance(outcome(text, "t.sop", fast=False), list), text
    assert_same(text)


# Generated programs of the new forms, with the boundary values of each: list bounds open and closed,
# left out, 0, negative, fractional, beyond the largest list; optional and open records, nested types;
# every postfix read; sums with and without `where`; keywords and context words where names stand.
_NAME = st.sampled_from(["a", "L", "x.y", "f", "for", "sum", "of", "open", "list", "type", "date", "where", "count"])
_LO = st.sampled_from(["", "0", "1", "-1", "2.5", "32", "0.0", "99999999999999999999"])
_HI = st.sampled_from(["", "0", "3", "4.5", "32", "33", "100"])
_BOUNDS = st.one_of(st.just(""), st.builds(lambda a, lo, hi, b: f"{a}{lo}..{hi}{b}", st.sampled_from("[("), _LO, _HI,
                                           st.sampled_from("])")))
_WS = st.sampled_from([" ", " ", "", "\n    ", "  # note\n"])
_SCALAR = st.sampled_from(["bool", "int", "float[0..2000]", "int(1..10]", "string", "date", "datetime", "duration",
                           "A | B", '"c d" | E', "Line", "list", "record", "open"])


def _types(inner: Any) -> Any:
    field = st.builds(lambda n, t, q, w: f"{w}{n}: {t}{'?' if q else ''}", _NAME, inner, st.booleans(), _WS)
    record = st.builds(lambda op, fields, trail, w: f"record {op}{{{', '.join(fields)}{',' if trail else ''}{w}}}",
                       st.sampled_from(["", "open ", "open"]), st.lists(field, min_size=1, max_size=3), st.booleans(), _WS)
    return st.one_of(st.builds(lambda b, t, w: f"list{b}{w}of {t}", _BOUNDS, inner, _WS), record)


_TYPE = st.recursive(_SCALAR, _types, max_leaves=5)
_HEAD = st.sampled_from(["x in L", "l in Lines", "x.y in L", "x not in L", "x in {A}", "x in [A]", "x", "x in L and y"])
_ATOM = st.sampled_from(["L", "Lines", "first(L)", "x", "3", "2.5", "true", '"s"', "len(L)", "[A, B when x]", "[]",
                         "(a + 1)", "missing(x)", "sum", "sum()", "2 days", "for", "of", "date(\"2026-01-02\")"])


def _exprs(inner: Any) -> Any:
    return st.one_of(
        st.builds(lambda e, w, f: f"{e}{w}.{f}", inner, st.sampled_from(["", " "]), _NAME),
        st.builds(lambda e, n: f"{e}[{n}]", inner, st.sampled_from(["0", "1", "31", " 2 ", "1.5", "-1", ""])),
        st.builds(lambda v, h, c, w: f"sum({v}{w}for {h}{'' if c is None else ' where ' + c})", inner, _HEAD,
                  st.none() | inner, _WS),
        st.builds(lambda fn, h, c: f"{fn}({h} where {c})", st.sampled_from(["any", "all", "count"]), _HEAD, inner),
        st.builds(lambda a, op, b: f"{a} {op} {b}", inner, st.sampled_from(["+", "-", "*", "==", "<", ">=", "and",
                                                                           "or", "in", "not in"]), inner),
        st.builds(lambda e: f'{e} matches "[A-Z]+"', inner),
        st.builds(lambda args: f"sum({', '.join(args)})", st.lists(inner, max_size=2)),
        st.builds(lambda items, w: f"[{w}{', '.join(items)}{w}]", st.lists(inner, max_size=3), _WS),
        st.builds(lambda e: f"-{e}", inner), st.builds(lambda e: f"not {e}", inner), st.builds(lambda e: f"({e})", inner),
    )


_EXPR = st.recursive(_ATOM, _exprs, max_leaves=6)
_TARGET = st.one_of(st.sampled_from(["t", "do Go", "for", "do Go { O = [A] }"]), st.builds(
    lambda v, src, c, t: f"for {v} in {src}{'' if c is None else ' where ' + c} do Pay(id = {v}.id) -> {t}",
    _NAME, _ATOM, st.none() | _EXPR, st.sampled_from(["t", "do Go", "for f in L do Go -> t"])))
_ITEM = st.one_of(
    st.builds(lambda n, t, d: f"type {n} = {t}{d}", _NAME, st.one_of(_TYPE.filter(lambda t: t.startswith("record")),
                                                                    st.sampled_from(["A | B", "date | list", "A"])),
              st.sampled_from(["", ' "doc"'])),
    st.builds(lambda role, n, t, q: f"{role} {n}: {t}{'?' if q else ''}", st.sampled_from(["field", "system"]), _NAME,
              _TYPE, st.booleans()),
    st.builds(lambda n, e: f"let {n} = {e}", _NAME, _EXPR),
    st.builds(lambda t, v: f"output O: {t}{v}", _TYPE, st.sampled_from(["", " = []", " = [A, B]", " = [A when B]", " = A"])),
    st.builds(lambda t: f"action Pay(id: {t}) \"p\"", _TYPE),
    st.builds(lambda g, a, b: f"stage s {{\n    when {g} -> {a}\n    otherwise -> {b}\n}}", _EXPR, _TARGET, _TARGET),
    st.builds(lambda t: f"stage s {{ {t} }}", _TARGET),
    st.builds(lambda p, t: f"subflow sf({p}) {{ stage u {{ -> {t} }} }}", st.sampled_from(["", "p", "p, q", "for"]), _TARGET),
    st.builds(lambda b: f"use sf as u1({b})", st.sampled_from(["", "p -> t", "p -> do Go, q -> for f in L do Go -> t"])),
)
STRUCTURED_PROGRAMS = st.lists(_ITEM, min_size=1, max_size=6).map(lambda items: "\n".join(items) + "\n")


@EXAMPLES
@given(STRUCTURED_PROGRAMS)
def test_generated_structured_programs_parse_the_same_without_lark(text: str) -> None:
    """Same program or same diagnostics on both paths; and what Lark reads, the fast path reads by itself."""
    assert_same(text)
    if not isinstance(outcome(text, "t.sop", fast=False), list):
        program, fragments = fast_items(text)
        assert program is not None and fragments == [], fragments


STRUCTURED_SEEDS = [
    *((ROOT / "tests" / "data" / name).read_text(encoding="utf-8") for name in (
        "refunds.sop", "fee_refund.sop", "lang_list_outputs.sop", "lang_open_records.sop", "lang_optional_fields.sop",
        "lost_card_lists.sop")),
    *((ROOT / "examples" / name).read_text(encoding="utf-8") for name in ("mobile_data.sop", "claim_intake.sop")),
    _orders_programs()[0], STRUCTURED,
]
_STRUCTURED_STRAY = [".", "[0]", "[", "]", "for", "where", "sum", "of", "open", "record", "list", "type", "?", "in",
                     "f in L", ",", "{", "}", "->", "do", "when", "use", "subflow", "as", "\n"]


@settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), max_examples=150)
@given(st.sampled_from(range(len(STRUCTURED_SEEDS))), st.lists(MUTATION, min_size=1, max_size=3),
       st.sampled_from(_STRUCTURED_STRAY))
def test_mutated_structured_text_parses_the_same(seed: int, edits: list[tuple[str, int, int]], stray: str) -> None:
    """The differential fuzz above, over programs full of lists, records, sums and subflows, with the words
    and signs of those forms strayed in; and what Lark reads of it, the fast path reads by itself."""
    text = STRUCTURED_SEEDS[seed]
    for op, a, b in edits:
        if op == "stray":
            toks = [m.start() for m in _WORD_TOKEN.finditer(text)] or [0]
            at = toks[a % len(toks)]
            text = text[:at] + stray + text[at:]
        else:
            text = mutate_text(text, op, a, b)
    assert_same(text)
    if not isinstance(outcome(text, "t.sop", fast=False), list):
        program, fragments = fast_items(text)
        assert program is not None and fragments == [], fragments
