"""`ir.show` writes expressions back as `.sop` text: what it writes must read back as the same expression
(labels, diagnostics, `sop paths` and `sop fmt` quote it to the user)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sopgraph.language import ir
from sopgraph.language.parse import parse_text
from sopgraph.language.program import unquote

# The boundary texts: a backslash at either end, quotes at either end, the escapes the language has
# (`\\`, `\"`, `\n`, `\t`), escapes it has not (`\r` is the letter r), characters written as they are.
BOUNDARY = ["", "C:\\", "\\", "\\\\", '"', '""', 'a"', '"a', '\\"', '"\\', "a\\b", "\\n", "\n", "\t", "\r",
            "line\nbreak", "'", "`x`", "x\\", "élan 東京", "\x01", " ", "\\\\\"\\"]
GUARDS = st.sampled_from(["X == {}", "X != {}", "X in {{{}, Calm}}", "not (X == {} and Vip)"])


def _guard(shown: str, *, fast: bool) -> object:
    """The guard of a one-stage program whose condition is `shown`, read back by one parser."""
    program = parse_text(f"stage s {{\n  when {shown} -> do A\n  otherwise -> do B\n}}\n", fast=fast)
    stage = next(i for i in program.items if isinstance(i, ir.Stage))
    return stage.branches[0].guard


def _lit(value: str) -> ir.Compare:
    return ir.Compare(op="==", left=ir.Var(name="X"), right=ir.Lit(value=value))


def _string_values(expr: object) -> list[str]:
    out, stack = [], [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Lit) and isinstance(e.value, str):
            out.append(e.value)
        stack.extend(ir.children(e))
    return out


def _assert_reads_back(value: str) -> None:
    shown = ir.show(_lit(value))
    assert "\n" not in shown  # one line: a label, a diagnostic, a path listing
    for fast in (True, False):
        back = _guard(shown, fast=fast)
        assert isinstance(back, ir.Compare) and back.right.value == value, (fast, shown)
        assert ir.show(back) == shown


@pytest.mark.parametrize("value", BOUNDARY)
def test_a_string_literal_is_shown_so_that_it_reads_back_as_the_same_value(value: str) -> None:
    _assert_reads_back(value)


def test_a_trailing_backslash_is_written_escaped() -> None:
    assert ir.show(_lit("C:\\")) == 'X == "C:\\\\"'  # the .sop text `X == "C:\\"`
    assert ir.show(_lit('say "hi"\n')) == 'X == "say \\"hi\\"\\n"'


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(), st.sampled_from(["", "\\", '"', "\\\\", '\\"']), st.sampled_from(["", "\\", '"', '"\\']))
def test_any_string_literal_reads_back(body: str, head: str, tail: str) -> None:
    _assert_reads_back(head + body + tail)


@settings(max_examples=100, deadline=None, database=None)
@given(GUARDS, st.text(max_size=20))
def test_a_string_inside_a_larger_condition_reads_back(form: str, value: str) -> None:
    shown = form.format(ir.quote_string(value))
    for fast in (True, False):
        back = _guard(shown, fast=fast)
        assert value in _string_values(back) and ir.show(back) == ir.show(_guard(ir.show(back), fast=fast))


@settings(max_examples=200, deadline=None, database=None)
@given(st.text())
def test_quote_string_is_the_inverse_of_unquote(value: str) -> None:
    assert unquote(ir.quote_string(value)) == value


# A pattern keeps its regex escapes as written: the token `"\d+\\"` holds the text `\d+\\`. Every STRING
# token a user can write must come back from `show` as written.
PATTERN_TOKEN = re.compile(r'(?:[^"\\\n]|\\.)*')


@settings(max_examples=300, deadline=None, database=None)
@given(st.from_regex(PATTERN_TOKEN, fullmatch=True), st.text())
def test_a_pattern_is_shown_as_it_was_written(body: str, built: str) -> None:
    written = f'X matches "{body}"'
    for fast in (True, False):
        back = _guard(written, fast=fast)
        assert isinstance(back, ir.Matches)
        assert ir.show(back) == written
        # a text no parser gives (built in code) is still shown as one token that shows the same again
        shown = ir.show(ir.Matches(operand=ir.Var(name="X"), pattern=built))
        again = _guard(shown, fast=fast)
        assert isinstance(again, ir.Matches) and ir.show(again) == shown


@pytest.mark.parametrize(("pattern", "written", "read"), [
    ("\\d+", '"\\d+"', "\\d+"),  # regex escapes stay as written
    ('say "x"', '"say \\"x\\""', 'say "x"'),
    ("C:\\\\", '"C:\\\\"', "C:\\\\"),  # a pattern for a text ending in a backslash
    ('\\"', '"\\""', '"'),  # not a parser's text (a regex `\"` is `"`): the same strings match
    ("a\\", '"a\\\\"', "a\\\\"),  # a lone backslash at the end: one token still
    ("a\nb", '"a\\nb"', "a\\nb"),  # a raw line break: the regex `\n`
])
def test_a_pattern_no_parser_gives_is_still_one_token(pattern: str, written: str, read: str) -> None:
    shown = ir.show(ir.Matches(operand=ir.Var(name="X"), pattern=pattern))
    assert shown == f"X matches {written}"
    back = _guard(shown, fast=False)
    assert isinstance(back, ir.Matches) and back.pattern == read
    if pattern != "a\\":  # a lone backslash is no regex at all
        assert {s: bool(re.fullmatch(back.pattern, s)) for s in ('"', "a\nb", "C:\\", "12")} == {
            s: bool(re.fullmatch(pattern, s)) for s in ('"', "a\nb", "C:\\", "12")}
