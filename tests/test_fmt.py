"""`sop fmt`: golden layouts, idempotence, the parsed program unchanged, comments kept, a printer
for every IR node type, and the CLI's --check exit codes.

Regenerate the golden outputs after an intended change with
`SOP_UPDATE_GOLDEN=1 python -m pytest tests/test_fmt.py`.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark
from test_fastparse import MUTATION, MUTATION_SEEDS, mutate_text

from sopgraph.cli import main
from sopgraph.language import ir
from sopgraph.language import parse as parse_mod
from sopgraph.language import program as program_mod
from sopgraph.language.diagnostics import SopError
from sopgraph.language.fmt import EXPR_PRINTERS, PRINTERS, fmt_number, format_scenario, format_text
from sopgraph.language.larkparse import parser
from sopgraph.language.parse import load_source, parse_text

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("SOP_UPDATE_GOLDEN", "") not in ("", "0")
SHIPPED = sorted((ROOT / "scenarios").glob("*.sop")) + sorted((ROOT / "examples").rglob("*.sop")) + sorted(
    GOLDEN.glob("valid_*.sop"))
FMT_CASES = sorted(p.name[: -len(".sop.in")] for p in GOLDEN.glob("fmt_*.sop.in"))


def _strip(obj: Any) -> Any:
    """A model dump without source positions (formatting moves code, never changes it)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in ("span", "attribute_spans", "affects_spans", "pattern_span")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _program(text: str) -> Any:
    return _strip(parse_text(text, "x.sop").model_dump())


def _comments(text: str) -> list[str]:
    return [m.group(0).rstrip() for m in re.finditer(r"(#|//)[^\n]*", text)]


@pytest.mark.parametrize("name", FMT_CASES)
def test_golden_layout(name: str) -> None:
    source = (GOLDEN / f"{name}.sop.in").read_text(encoding="utf-8")
    expected_path = GOLDEN / f"{name}.sop.out"
    got = format_text(source, f"{name}.sop")
    if UPDATE:
        expected_path.write_text(got, encoding="utf-8")
    assert got == expected_path.read_text(encoding="utf-8")
    assert format_text(got) == got
    assert _program(got) == _program(source)


def test_golden_cases_exist() -> None:
    assert {"fmt_comments", "fmt_layout", "fmt_expressions"} <= set(FMT_CASES)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_programs_format_idempotently_and_keep_their_meaning(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    once = format_text(source, str(path))
    assert format_text(once, str(path)) == once
    assert _program(once) == _program(source)
    assert _comments(once) == _comments(source)  # every comment kept, in order


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_merged_scenario_prints_back_to_the_same_scenario(path: Path) -> None:
    """`format_scenario` writes a loaded scenario (includes and subflows resolved) as one file."""
    loaded = load_source(path)
    assert loaded.scenario is not None
    text = format_scenario(loaded.scenario)
    again = load_source(text=text, name=str(path))
    assert again.scenario is not None, [d.message for d in again.diagnostics]
    skip = {"files", "source_hash"}
    before = _strip(loaded.scenario.model_dump(exclude=skip))
    after = _strip(again.scenario.model_dump(exclude=skip))
    for stage in before["stages"].values():
        stage["origin"] = None
    assert after == before


def test_comments_stay_where_they_were() -> None:
    out = (GOLDEN / "fmt_comments.sop.out").read_text(encoding="utf-8")
    lines = out.splitlines()
    assert lines[0] == "// header comment" and lines[1] == ""
    assert "        X -> do Go  # arm comment" in lines
    assert lines[lines.index("        # between arms") + 1] == "        Y -> s2"
    assert "}  # after s2" in lines
    assert lines[-1] == "# final comment"


def test_every_ir_node_type_has_a_printer() -> None:
    """New syntax must come with a printer, or `sop fmt` would drop it."""
    not_syntax = {ir.Node, parse_mod.Loaded}
    node_types = {obj for module in (ir, parse_mod) for _, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, ir.Node) and obj.__module__ == module.__name__}
    missing = sorted(t.__name__ for t in node_types - not_syntax - set(PRINTERS) - set(EXPR_PRINTERS))
    assert missing == [], ("add one printing function per new node type to PRINTERS / EXPR_PRINTERS in "
                           "sopgraph/language/fmt.py (and print its new fields), or `sop fmt` drops it")
    expr_types = set(ir.Expr.__args__[0].__args__)  # the members of the Expr union
    assert expr_types <= set(EXPR_PRINTERS)


@pytest.mark.parametrize("value", [0.5, 1e-7, 1e20, 2.0, 3, -4.25, 123456789.125])
def test_numbers_print_in_the_grammar_and_read_back(value: float) -> None:
    text = fmt_number(value)
    assert re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text)
    assert type(program_mod.number(text.lstrip("-"), text.startswith("-"))) is type(value)
    assert float(text) == value


def test_syntax_errors_are_diagnostics() -> None:
    with pytest.raises(SopError) as exc:
        format_text("stage {", "bad.sop")
    assert exc.value.diagnostics[0].code == "E001"


# ---------------------------------------------------------------------------------------------
# Generated programs (grammar-driven, as in test_fuzz)

NAMES = st.sampled_from(["A", "B", "X", "step1", "Go", "Calm", "sub.x", "_q"])
EXPLICIT: dict[str, st.SearchStrategy[str]] = {
    t.name: st.just(f" {t.pattern.value} ") for t in parser().terminals if t.pattern.type == "str"
}
EXPLICIT.update({
    "NAME": NAMES.map(lambda s: f" {s} "),
    "STRING": st.sampled_from(['"t"', '"a \\"quoted\\" word"', '""', '"back\\\\slash"']).map(lambda s: f" {s} "),
    "LONG_STRING": st.just(' """long\ntext""" '),
    "NUMBER": st.sampled_from(["0", "1", "2.5", "10", "0.000001"]).map(lambda s: f" {s} "),
    "COMP_OP": st.sampled_from(["==", "!=", "<", "<=", ">", ">="]).map(lambda s: f" {s} "),
    "COMMENT": st.sampled_from(["\n# a comment\n", " // trailing\n"]),
    "WS": st.sampled_from([" ", "\n", "  \n\n "]),
})


@settings(deadline=None, database=None, max_examples=int(os.environ.get("FMT_EXAMPLES", "150")), suppress_health_check=list(HealthCheck))
@given(from_lark(parser(), explicit=EXPLICIT))
def test_generated_programs_format_idempotently_and_keep_their_meaning(text: str) -> None:
    try:
        before = _program(text)
    except SopError:
        assume(False)
        return
    once = format_text(text)
    assert format_text(once) == once
    assert _program(once) == before
    assert len(_comments(once)) == len(_comments(text))


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_check_rewrite_and_errors(tmp_path: Path) -> None:
    messy = tmp_path / "messy.sop"
    messy.write_text((GOLDEN / "fmt_comments.sop.in").read_text(encoding="utf-8"), encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(main, ["fmt", "--check", str(messy)])
    assert result.exit_code == 1 and "would reformat" in result.output
    assert messy.read_text(encoding="utf-8") == (GOLDEN / "fmt_comments.sop.in").read_text(encoding="utf-8")
    diff = runner.invoke(main, ["fmt", "--diff", str(messy)])
    assert diff.exit_code == 1 and "+field A: bool  # trailing field" in diff.output
    assert runner.invoke(main, ["fmt", str(messy)]).exit_code == 0
    assert messy.read_text(encoding="utf-8") == (GOLDEN / "fmt_comments.sop.out").read_text(encoding="utf-8")
    assert runner.invoke(main, ["fmt", "--check", str(messy)]).exit_code == 0
    bad = tmp_path / "bad.sop"
    bad.write_text("stage {\n", encoding="utf-8")
    result = runner.invoke(main, ["fmt", "--check", str(bad)])
    assert result.exit_code == 2 and "bad.sop:1:7" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("text", ["fieldA: bool\n", 'field A: bool\nsystemB: int\naction Go "g"\nstage s { -> do Go }\n',
                                  'action Go "g"\nstage s { whenX -> do Go otherwise -> do Go }\n'])
def test_cli_on_text_the_fast_path_once_took_prints_diagnostics(tmp_path: Path, text: str) -> None:
    """Keywords run into names (`fieldA:`) were read by the fast path and refused by fmt's own Lark
    parse, which escaped as a raw `UnexpectedToken`: now a located diagnostic, as `sop check` gives."""
    bad = tmp_path / "glued.sop"
    bad.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(main, ["fmt", "--check", str(bad)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert re.search(r"glued\.sop:\d+:\d+: error\[E001\]", result.output), result.output
    check = CliRunner().invoke(main, ["check", str(bad)])
    assert check.exit_code == 1 and result.output.split("\n")[0] in check.output


@settings(deadline=None, database=None, max_examples=60, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(range(len(MUTATION_SEEDS))), st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_text_formats_or_gets_diagnostics(seed: int, edits: list[tuple[str, int, int]]) -> None:
    """`format_text` on broken text raises `SopError` and nothing else, as `sop check` would."""
    text = MUTATION_SEEDS[seed]
    for op, a, b in edits:
        text = mutate_text(text, op, a, b)
    try:
        parse_text(text, "m.sop")
    except SopError as exc:
        with pytest.raises(SopError) as fmt_exc:
            format_text(text, "m.sop")
        assert fmt_exc.value.diagnostics == exc.diagnostics
        return
    assert _program(format_text(text, "m.sop")) == _program(text)


LANGUAGE_GAPS = sorted((ROOT / "tests" / "data").glob("lang_*.sop"))


@pytest.mark.parametrize("path", LANGUAGE_GAPS, ids=lambda p: p.name)
def test_newer_constructs_format_canonically_and_read_back(path: Path) -> None:
    """Quoted enum values, optional record fields, open records, list outputs: written canonically, read back
    to the same program, merged scenarios too."""
    source = path.read_text(encoding="utf-8")
    assert format_text(source, str(path)) == source  # the files are kept in canonical layout
    test_shipped_programs_format_idempotently_and_keep_their_meaning(path)
    test_merged_scenario_prints_back_to_the_same_scenario(path)


def test_enum_values_that_are_not_names_keep_their_quotes() -> None:
    text = 'type T = "5+ times" | Never | "count" | "a|b"\nfield F: T "f"\nfield G: Low | "Very high" "g"\n'
    out = format_text(text)
    assert 'type T = "5+ times" | Never | "count" | "a|b"' in out and 'field G: Low | "Very high"' in out
    assert _program(out) == _program(text)


def test_volatile_prints_back_and_stays() -> None:
    text = ('system Up: bool money volatile "u"\naction Go "g"\naction Fix "f" affects Up\n'
            "stage s { observe Up when Up -> do Fix -> s up to 2 times otherwise -> do Go }\n")
    once = format_text(text)
    assert "system Up: bool money volatile" in once
    assert format_text(once) == once
    assert parse_text(once).items[0].volatile


def test_for_each_steps_and_positions_print_back_and_stay() -> None:
    text = (Path(__file__).resolve().parent / "data" / "refunds.sop").read_text(encoding="utf-8")
    once = format_text(text)
    assert "-> for f in Fees where f.refundable do Refund(fee_id = f.id, amount = f.amount)" in once
    assert "first(Legs).origin == CDG" in once and "origin = Legs[0].origin" in once
    assert format_text(once) == once
    assert _program(once) == _program(text)


def test_strings_with_backslashes_and_quotes_print_back_and_stay() -> None:
    """A string ending in a backslash (`"C:\\"`), quotes, `\n` and `\t` in titles, texts, conditions and
    patterns: the layout is stable, every value reads back the same, and a guard shown in a label or a
    diagnostic (`ir.show`) is the text the formatted file holds."""
    text = ('system Folder: string "The folder, as typed \\\\"\nsystem Label: string "l"\n'
            'action Open "o"\naction Refuse "r"\n'
            'stage folder "Folder \\"C:\\\\\\"" {\n  "Check the folder \\\\ the label."\n'
            '  when Folder == "C:\\\\" or Folder == "\\"quoted\\"" -> do Open\n'
            '  when Label matches "[A-Z]+\\\\\\\\" and Label != "tab\\there\\n" -> do Refuse\n'
            '  otherwise -> do Refuse\n}\n')
    once = format_text(text)
    assert format_text(once) == once
    assert _program(once) == _program(text)
    assert 'when Folder == "C:\\\\" or Folder == "\\"quoted\\"" -> do Open' in once
    assert 'Label matches "[A-Z]+\\\\\\\\" and Label != "tab\\there\\n"' in once
    stage = next(i for i in parse_text(once).items if isinstance(i, ir.Stage))
    assert all(ir.show(b.guard) in once for b in stage.branches if b.guard is not None)
    loaded = load_source(text=text, name="esc.sop")
    assert loaded.scenario is not None
    merged = format_scenario(loaded.scenario)
    assert format_text(merged) == merged and 'Folder == "C:\\\\"' in merged
