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
