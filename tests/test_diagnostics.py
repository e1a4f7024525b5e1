"""Rendering diagnostics: source lines are read from the text as `text.split("\\n")` would give them."""

from __future__ import annotations

import pytest

from sopgraph.language.diagnostics import SourceLines, error
from sopgraph.language.ir import Span


@pytest.mark.parametrize("text", ["", "a", "a\n", "\n\nb", "x\ny\n\nz", "one\r\ntwo\n"])
def test_source_lines_are_the_split_lines(text: str) -> None:
    lines, split = SourceLines(text), text.split("\n")
    assert len(lines) == len(split)
    assert [lines[i] for i in range(len(split))] == split
    assert lines[-1] == split[-1]
    with pytest.raises(IndexError):
        lines[len(split)]


def test_rendering_points_at_the_line_and_columns() -> None:
    text = "field A: bool\nstage s {\n    -> t\n}\n"
    diag = error("E101", "undefined stage `t`", Span(file="f.sop", line=3, col=8, end_line=3, end_col=9))
    cache: dict[str, SourceLines] = {}
    assert diag.render({"f.sop": text}, split=cache) == (
        "f.sop:3:8: error[E101]: undefined stage `t`\n   3 |     -> t\n" + " " * 14 + "^")
    assert list(cache) == ["f.sop"]  # the file's lines are kept for the next diagnostic


def test_example_values_are_shown_as_an_input_writes_them() -> None:
    """A missing optional value is `null` (not Python's `None`); a bool is `true`; free text is quoted only
    for the keys the checker marks as text, so an enum value stays bare."""
    from sopgraph.language.diagnostics import Diagnostic, mark_text_values

    d = Diagnostic(code="W301", severity="warning", message="m",
                   witness={"Due": None, "Vip": True, "Kind": "Gold", "Ref": "text"})
    assert "Due=null, Vip=true, Kind=Gold, Ref=text" in d.render()
    from sopgraph.language.parse import load_source

    scenario = load_source(None, text='system Ref: string "r"\nfield Kind: Gold | Plain "k"\naction A "a"\n'
                                      'stage s { -> do A }\n').scenario
    assert scenario is not None
    mark_text_values([d], scenario)
    assert "Due=null, Vip=true, Kind=Gold, Ref=\"text\"" in d.render()


def test_carets_line_up_under_wide_characters() -> None:
    """A CJK character takes two terminal columns: the caret goes under the character, not a column early."""
    from sopgraph.language.diagnostics import Diagnostic
    from sopgraph.language.ir import Span

    d = Diagnostic(code="E005", severity="error", message="m", span=Span(file="f", line=1, col=9, end_line=1, end_col=10))
    lines = d.render({"f": "field 意图： A | B"}).splitlines()
    assert lines[2] == " " * (len("   1 | field ") + 4) + "^^"  # 意图: four columns; ：itself two


# ---------------------------------------------------------------------------------------------
# Long user text: quoted short in a message, the source line cut around the caret

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sopgraph.language.diagnostics import QUOTE_MAX, SOURCE_WIDTH, Diagnostic, clip  # noqa: E402


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(alphabet=st.sampled_from("ab \n\r\t`\\\"é東")), st.sampled_from([8, 40, QUOTE_MAX]))
def test_clip_keeps_short_text_and_cuts_long_text_in_the_middle_on_one_line(text: str, limit: int) -> None:
    shown = clip(text, limit)
    assert "\n" not in shown and "\r" not in shown
    assert len(shown) <= limit
    if "\n" in text or "\r" in text:  # line breaks (and the blanks around them) become one space
        if len(text) <= limit:
            assert shown.split() == text.split()
        return
    if len(text) <= limit:
        assert shown == text
    else:
        head, cut, tail = shown.partition(" … ")
        assert cut and text.startswith(head) and text.endswith(tail)


def test_clip_names_the_start_and_the_end_of_a_huge_condition() -> None:
    text = "not " * 5000 + "Member"
    shown = clip(text)
    assert len(shown) <= QUOTE_MAX and shown.startswith("not not ") and shown.endswith(" not Member")
    assert clip("Kind == Byu") == "Kind == Byu"  # short text: as it is


@pytest.mark.parametrize("col", [1, 30, 2500, 4990, 5000, 5003])
def test_a_long_source_line_is_cut_around_the_caret_which_stays_under_its_character(col: int) -> None:
    line = "".join(f"{i:05d} " for i in range(834))[:5001]  # 5,001 characters, each place different
    diag = Diagnostic(code="E606", severity="error", message="m",
                      span=Span(file="f", line=1, col=col, end_line=1, end_col=col + 3))
    _, shown, caret = diag.render({"f": line}).splitlines()
    assert len(shown) <= len("   1 | ") + SOURCE_WIDTH + 4
    at = caret.index("^")
    end = min(col + 2, len(line))  # the span, cut at the end of the line
    assert shown[at:at + len(caret) - at] == line[col - 1:end][:len(caret) - at]
    assert caret[at:] == "^" * len(line[col - 1:end]) or col > len(line)
    assert shown.startswith("   1 | … ") == (col > SOURCE_WIDTH // 3 + 1)


def test_a_long_line_of_wide_characters_keeps_the_caret_under_its_character() -> None:
    line = "意" * 400 + "X" + "图" * 400
    diag = Diagnostic(code="E005", severity="error", message="m",
                      span=Span(file="f", line=1, col=401, end_line=1, end_col=402))
    _, shown, caret = diag.render({"f": line}).splitlines()
    before = shown[:shown.index("X")]
    assert caret == " " * sum(2 if "\u4e00" <= ch <= "\u9fff" else 1 for ch in before) + "^"
    assert shown.startswith("   1 | … ") and shown.endswith(" …")
