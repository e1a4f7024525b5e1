"""The parser: what it builds, and syntax errors named in the user's terms (never raw token names)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sopgraph.cli import main
from sopgraph.language import ir, syntax_errors
from sopgraph.language.diagnostics import SopError
from sopgraph.language.parse import (
    CONTEXT_KEYWORDS,
    KEYWORDS,
    MAX_DEPTH,
    MAX_DERIVED_CHAIN,
    load_source,
    parse_text,
)
from sopgraph.language.syntax_errors import CATALOGUE

HEAD = 'field Mood: Calm | Angry\nfield Vip: bool\nsystem Fee: int[0..100]\naction Help "h"\naction Wait "w"\n'
RAW_TOKEN_NAMES = ("__ANON", "RBRACE", "LBRACE", "RPAR", "LPAR", "$END", "COMP_OP", "NAME", "STRING",
                   "NUMBER", "Token(")


def syntax_error(text: str):
    loaded = load_source(None, text=text, name="t.sop")
    assert loaded.scenario is None, "expected a syntax error"
    assert len(loaded.diagnostics) == 1
    diag = loaded.diagnostics[0]
    rendered = diag.render(loaded.sources)
    for raw in RAW_TOKEN_NAMES:
        assert raw not in rendered, f"raw token name {raw!r} in:\n{rendered}"
    return diag, rendered


# ---------------------------------------------------------------------------------------------
# What the parser builds


def test_match_arms_become_membership_guards_on_the_subject() -> None:
    s = load_source(None, text=HEAD + "stage s { match Mood { Calm -> do Help Angry -> do Wait } }").scenario
    assert s is not None
    stage = s.stages["s"]
    assert stage.kind == "match"
    first = stage.branches[0]
    assert isinstance(first.guard, ir.InSet)
    assert isinstance(first.guard.operand, ir.Var) and first.guard.operand.name == "Mood"
    assert [v.value for v in first.values] == ["Calm"]
    assert first.target.kind == "action" and first.target.action == "Help"


def test_bare_names_resolve_to_enum_literals_and_variables_stay_variables() -> None:
    s = load_source(None, text=HEAD + "stage s { when Mood == Angry and Vip -> do Help otherwise -> do Wait }")
    guard = s.scenario.stages["s"].branches[0].guard
    assert isinstance(guard, ir.BoolOp) and guard.op == "and"
    cmp, vip = guard.operands
    assert isinstance(cmp.left, ir.Var) and isinstance(cmp.right, ir.Lit) and cmp.right.bare
    assert isinstance(vip, ir.Var)


def test_spans_point_at_names() -> None:
    s = load_source(None, text=HEAD + "stage step1 {\n  -> do Help\n}\n", name="x.sop").scenario
    span = s.stages["step1"].span
    assert (span.file, span.line, span.col) == ("x.sop", 6, 7)
    assert s.variables["Fee"].span.line == 3


def test_long_and_chains_are_flattened_in_linear_time() -> None:
    cond = " and ".join(["Vip"] * 3000)
    t0 = time.perf_counter()
    s = load_source(None, text=HEAD + f"stage s {{ when {cond} -> do Help otherwise -> do Wait }}").scenario
    elapsed = time.perf_counter() - t0
    guard = s.stages["s"].branches[0].guard
    assert isinstance(guard, ir.BoolOp) and len(guard.operands) == 3000
    assert elapsed < 10, f"3000-operand `and` took {elapsed:.1f}s"


def test_meta_keys_may_be_keywords_but_names_may_not() -> None:
    ok = load_source(None, text='scenario x "X" { money "Fee" }\n' + HEAD + "stage s { -> do Help }")
    assert ok.scenario is not None and ok.scenario.meta["money"] == "Fee"


def test_crlf_is_normalised() -> None:
    s = load_source(None, text=(HEAD + "stage s {\n -> do Help\n}\n").replace("\n", "\r\n"))
    assert s.scenario is not None and s.scenario.stages["s"].span.line == 6


def test_parse_text_raises_sop_error_with_one_diagnostic() -> None:
    with pytest.raises(SopError) as info:
        parse_text("stage {", "p.sop")
    assert info.value.diagnostics[0].span.file == "p.sop"


# ---------------------------------------------------------------------------------------------
# Syntax errors by category (each also has a golden file in tests/golden/syntax_*.sop)


@pytest.mark.parametrize("text", [
    HEAD + "stage s { match Mood { Calm do Help Angry -> do Wait } }",
    HEAD + "stage s { when Vip do Help otherwise -> do Wait }",
    HEAD + "stage s { match Mood { Calm Help Angry -> do Wait } }",
])
def test_missing_arrow(text: str) -> None:
    diag, rendered = syntax_error(text)
    assert diag.code == "E001" and "missing `->`" in diag.message
    assert "hint:" in rendered


def test_unclosed_block_at_end_of_file_points_at_the_open_brace() -> None:
    diag, _ = syntax_error(HEAD + "stage s {\n  match Mood {\n    Calm -> do Help\n    Angry -> do Wait\n}\n")
    assert diag.code == "E002" and "unclosed block" in diag.message
    assert (diag.span.line, diag.span.col) == (6, 9)


def test_unclosed_block_before_next_declaration() -> None:
    diag, _ = syntax_error(HEAD + "stage s {\n  match Mood {\n    Calm -> do Help\n    Angry -> do Wait\n"
                                  "stage t { -> do Help }\n")
    assert diag.code == "E002"
    assert "before `stage`" in diag.message
    assert diag.span.line == 7


@pytest.mark.parametrize("text, word", [
    ("field match: A | B\n", "match"),
    (HEAD + "stage when { -> do Help }\n", "when"),
    (HEAD + "stage s { -> stage }\n", "stage"),
    ("field A: true | false\n", "true"),
    ("action count \"c\"\n", "count"),
    (HEAD + "let money = Fee * 2\nstage s { -> do Help }\n", "money"),
])
def test_reserved_word_used_as_a_name(text: str, word: str) -> None:
    diag, rendered = syntax_error(text)
    assert diag.code == "E001"
    assert f"`{word}` is a reserved word" in diag.message
    assert "rename" in (diag.hint or "")
    assert "^" in rendered


@pytest.mark.parametrize("text, shown", [
    (HEAD + "stage s { when Vip && Vip -> do Help otherwise -> do Wait }", "`&`"),
    ("action Help 'h'\n", "`'`"),
    (HEAD + "stage s { -> do Help; }", "`;`"),
    ("field Ä： A | B\n", "`：`"),  # `Ä` is a letter (names take any script); the full-width colon is not ASCII
    ("field A\x00: A | B\n", "U+0000"),
    ("field A: B | C\n\u00a0", "U+00A0"),
])
def test_invalid_character(text: str, shown: str) -> None:
    diag, rendered = syntax_error(text)
    assert diag.code == "E005"
    assert diag.message == f"invalid character {shown}"
    assert diag.hint


def test_unterminated_string() -> None:
    diag, _ = syntax_error('action Help "help\nstage s { -> do Help }\n')
    assert diag.code == "E005" and "unterminated string" in diag.message
    assert (diag.span.line, diag.span.col) == (1, 13)


@pytest.mark.parametrize("text", ["field Mood:", "action", HEAD + "stage s", HEAD + "stage s { when Vip ->",
                                  "system Fee: int[0..5", "let X ="])
def test_unexpected_end_of_file(text: str) -> None:
    diag, _ = syntax_error(text)
    assert diag.code in ("E001", "E002")
    if diag.code == "E001":
        assert "unexpected end of file" in diag.message


def test_misspelt_top_level_keyword() -> None:
    diag, _ = syntax_error("feild Mood: A | B\n")
    assert "at top level" in diag.message and diag.hint == "did you mean `field`?"


def test_stage_without_decision() -> None:
    diag, _ = syntax_error(HEAD + 'stage s "S" { "text" }')
    assert diag.message == "stage has no decision"


def test_single_equals_in_a_condition() -> None:
    diag, _ = syntax_error(HEAD + "stage s { when Mood = Calm -> do Help otherwise -> do Wait }")
    assert diag.message == "`=` is not a comparison"


def test_unmatched_closing_brace() -> None:
    diag, _ = syntax_error(HEAD + "stage s { -> do Help } }")
    assert "unmatched `}`" in diag.message


def test_number_too_large() -> None:
    diag, _ = syntax_error("system P: int[0.." + "9" * 400 + "]\n")
    assert diag.message == "number too large" and (diag.span.line, diag.span.col) == (1, 18)


def test_enum_with_one_value() -> None:
    diag, _ = syntax_error("field A: X {")
    assert "at least two values" in diag.message


@pytest.mark.parametrize("snippet", [
    "stage s { match Mood { } }", "stage s { -> do Help { } }", "stage s { when -> do Help }",
    "field X: int[", "output O: A | B = ", "use", "subflow f( { }", "stage s { classify -> do Help }",
    "stage s { -> do Help { O = } }", "let X = (Fee", "let X = case { otherwise -> 1 }", "include",
    "scenario", "stage s { match Mood { Calm -> } }", "]", ")", "->", "==", "1", '"text"',
])
def test_no_raw_token_names_in_any_syntax_error(snippet: str) -> None:
    syntax_error(HEAD + snippet)


def test_deeply_nested_expression_is_a_diagnostic_not_a_crash() -> None:
    text = HEAD + "stage s { when " + "not " * 3000 + "Vip -> do Help otherwise -> do Wait }"
    loaded = load_source(None, text=text)
    if loaded.scenario is None:
        assert loaded.diagnostics[0].code == "E006"
    else:
        from sopgraph.logic.checker import check

        assert [d.code for d in check(loaded.scenario)] == ["E006"]


def test_unreadable_file(tmp_path: Path) -> None:
    missing = load_source(tmp_path / "nope.sop")
    assert missing.scenario is None and missing.diagnostics[0].code == "E003"
    binary = tmp_path / "bin.sop"
    binary.write_bytes(b"\xff\xfe\x00bad")
    assert load_source(binary).diagnostics[0].code == "E003"


def test_include_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.sop").write_text('include "b.sop"\naction Go "g"\nstage s { -> do Go }\n')
    (tmp_path / "b.sop").write_text('include "a.sop"\n')
    loaded = load_source(tmp_path / "a.sop")
    assert [d.code for d in loaded.diagnostics] == ["E004"]


def test_keywords_list_matches_the_grammar() -> None:
    from sopgraph.language.larkparse import parser

    literal = {t.pattern.value for t in parser().terminals if t.pattern.type == "str"}
    words = {w for w in literal if w.isalpha()}
    assert words <= set(KEYWORDS) | set(CONTEXT_KEYWORDS)


def test_a_program_written_with_chinese_names_checks_and_decides() -> None:
    """SOP owners write names in their own language: `field 意图: 退款 | 换货`, `stage 第一步`."""
    import json

    from click.testing import CliRunner

    from sopgraph.cli import main

    path = Path(__file__).parent / "data" / "unicode_names.sop"
    checked = CliRunner().invoke(main, ["check", str(path)])
    assert checked.exit_code == 0 and "0 errors, 0 warnings" in checked.output, checked.output
    decided = CliRunner().invoke(main, ["decide", str(path)],
                                 input=json.dumps({"意图": "退款", "订单状态": "未发货", "金额": 100}, ensure_ascii=False))
    assert json.loads(decided.output) == {"path": ["第一步", "第二步"], "finals": {"Action": "办理退款"}}


@pytest.mark.parametrize("body", ['observe Vip "Look again." -> do Help', 'classify Mood\n "Ask." -> do Help',
                                  'when Vip -> do Help\n "Then wait." otherwise -> do Wait'])
def test_stage_text_after_a_statement_says_texts_come_first(body: str) -> None:
    diag, _ = syntax_error(HEAD + f'stage s "S" {{\n {body}\n}}\n')
    assert diag.message.startswith("a stage's description text comes first"), diag.message
    assert diag.hint == "move the text up, right after `stage s ... {`"


@pytest.mark.parametrize(("text", "keyword", "glued"), [
    ("systemB: int\n", "system", "systemB"), ('actionGo "go"\n', "action", "actionGo"),
    ("stages { -> t }\n", "stage", "stages"), ("letY = 1\n", "let", "letY"),
    ("stage s { whenVip -> do Help otherwise -> do Help }\n", "when", "whenVip"),
    ("stage s { -> do Help up to2 times otherwise -> do Wait }\n", "to", "to2"),
])
def test_a_keyword_run_into_a_name_is_refused(text: str, keyword: str, glued: str) -> None:
    """Lark's contextual lexer split `systemB` where no name can stand; a keyword is a word of its own."""
    diag, _ = syntax_error(HEAD + text)
    assert diag.message == f"missing space after `{keyword}` in `{glued}`", diag.message
    assert diag.span.line == 6 and diag.span.end_col - diag.span.col == len(glued)


# ---------------------------------------------------------------------------------------------
# Bounds on nesting (docs/language.md, "Limits"): located E006 diagnostics, never a RecursionError


def let_chain(n: int) -> str:
    lets = "".join(f"let X{i} = X{i - 1} * 2 - 1\n" for i in range(1, n + 1))
    return (f'scenario chain "c"\nsystem X0: float[0..10]\n{lets}action Go "g"\naction No "n"\n'
            f"stage s {{ when X{n} > 5 -> do Go otherwise -> do No }}\n")


def test_a_derived_chain_is_bounded_with_a_located_diagnostic() -> None:
    assert load_source(None, text=let_chain(MAX_DERIVED_CHAIN), name="c.sop").scenario is not None
    loaded = load_source(None, text=let_chain(1000), name="c.sop")
    assert loaded.scenario is None and len(loaded.diagnostics) == 1
    diag = loaded.diagnostics[0]
    assert diag.code == "E006" and diag.message.startswith(f"derived chain too long: `X{MAX_DERIVED_CHAIN + 1}` reads")
    assert diag.span.line == MAX_DERIVED_CHAIN + 3 and diag.span.col == 5


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, 5000])
def test_expression_nesting_is_bounded_at_parse_time(depth: int) -> None:
    text = HEAD + f"stage s {{ when {'not ' * depth}Vip -> do Help otherwise -> do Wait }}\n"
    if depth < MAX_DEPTH:  # `not` x (depth) over a name: depth + 1 levels
        assert parse_text(text, "t.sop") is not None
        return
    with pytest.raises(SopError) as exc:
        parse_text(text, "t.sop")
    diag = exc.value.diagnostics[0]
    assert diag.code == "E006" and diag.message == f"expression nested too deeply ({depth + 1} levels; at most {MAX_DEPTH})"
    assert diag.span.line == 6


PROFILE_FOR_DEEP = """scenario: p
intents:
  deep:
    description: deep
    intensity: zero
    when: "{when}"
"""


@pytest.mark.parametrize("command", [["check"], ["paths"], ["decide", "--values", '{"X0": 3}'], ["synth"], ["prompt"],
                                     ["fmt", "--check"]])
def test_deep_inputs_never_traceback_in_any_command(tmp_path: Path, command: list[str]) -> None:
    """A 1,000-`let` chain and a profile `when` of 5,000 nested `not`: diagnostics, no RecursionError."""
    chain = tmp_path / "chain.sop"
    chain.write_text(let_chain(1000), encoding="utf-8")
    deep = tmp_path / "deep.sop"
    deep.write_text('scenario p "p"\nfield Calm: bool\naction Go "g"\naction No "n"\n'
                    "stage s { when Calm -> do Go otherwise -> do No }\n", encoding="utf-8")
    (tmp_path / "deep.profile.yaml").write_text(PROFILE_FOR_DEEP.format(when="not " * 5000 + "Calm"), encoding="utf-8")
    for path in (chain, deep):
        result = CliRunner().invoke(main, [*command, str(path)])
        assert result.exception is None or isinstance(result.exception, SystemExit), (command, path, result.output)
        assert "Traceback" not in result.output
        if command[0] in ("check", "paths", "synth", "decide", "prompt") and path is chain:
            assert f"chain.sop:{MAX_DERIVED_CHAIN + 3}:5: error[E006]: derived chain too long" in result.output
        if command[0] in ("check", "synth") and path is deep:
            assert "deep.profile.yaml:6:" in result.output and "nested too deeply (5001 levels; at most 100)" \
                in result.output


# ---------------------------------------------------------------------------------------------
# The syntax-error catalogue (sopgraph/language/syntax_errors.py), matched by example


@pytest.mark.parametrize(("label", "example"), [(e.label, x) for e in CATALOGUE for x in e.examples])
def test_every_catalogue_example_gets_its_message(label: str, example: str) -> None:
    entry = next(e for e in CATALOGUE if e.label == label)
    with pytest.raises(SopError) as exc:
        parse_text(example, "t.sop", fast=False)
    diag = exc.value.diagnostics[0]
    head = entry.message.split("{")[0].replace("}}", "}")
    assert diag.message.startswith(head), (example, diag.message)


def test_the_catalogue_is_matched_by_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the entries' `expects` gone, their examples alone still name the errors they stand for."""
    bare = tuple(dataclasses.replace(e, expects=frozenset()) if e.examples else e for e in CATALOGUE)
    monkeypatch.setattr(syntax_errors, "CATALOGUE", bare)
    monkeypatch.setattr(syntax_errors, "_MATCHED", {})
    for text, message in (("stage s { match A { B do X } }", "missing `->` before `do`"),
                          ("stage s { }", "stage has no decision"),
                          ("stage s { when A = B -> t }", "`=` is not a comparison"),
                          ("feild A: bool", "unexpected `feild` at top level")):
        with pytest.raises(SopError) as exc:
            parse_text(text, "t.sop", fast=False)
        assert exc.value.diagnostics[0].message == message


# ---------------------------------------------------------------------------------------------
# Quoted enum values (values that are not names: `"5+ times"`, `"Traffic/URL Cloaking"`)

QUOTED = '''field Visits: Never | "1-2 times" | "5+ times" "v"
type Abuse = "Traffic/URL Cloaking" | Phishing | "count"
system Kind: Abuse "k"
output Level: Low | "Very high" = Low "l"
action Go "g"
action Stop "s"
stage s1 {
    match Visits {
        "5+ times" -> do Stop { Level = "Very high" }
        Never, "1-2 times" -> s2
    }
}
stage s2 {
    when Kind == "Traffic/URL Cloaking" or Kind == "count" -> do Stop
    otherwise -> do Go
}
'''


def _errors(text: str) -> list[Any]:
    from sopgraph.logic.checker import check_file

    return [d for d in check_file("q.sop", text=text).diagnostics if d.is_error]


def test_quoted_enum_values_are_values_of_fields_aliases_and_outputs() -> None:
    assert _errors(QUOTED) == []
    loaded = load_source(None, text=QUOTED, name="q.sop")
    s = loaded.scenario
    assert s is not None
    assert s.variables["Visits"].type.values == ["Never", "1-2 times", "5+ times"]
    assert s.variables["Kind"].type.values == ["Traffic/URL Cloaking", "Phishing", "count"]
    assert s.outputs["Level"].type.values == ["Low", "Very high"]
    assert ir.describe_type(s.variables["Visits"].type) == 'Never | "1-2 times" | "5+ times"'
    diag, _ = syntax_error('field V: "5+ times" "v"\n')  # one quoted string is no type
    assert diag.code == "E001"


def test_a_quoted_value_not_in_the_enum_is_e202_and_a_bad_one_e005() -> None:
    assert [d.code for d in _errors(QUOTED.replace('"5+ times" ->', '"5 times" ->'))] == ["E202"]
    for bad, what in (('""', "is empty"), ('" A"', "starts or ends with a space"), ('"a\\nb"', "control character")):
        errors = _errors(f'field V: A | {bad} "v"\naction Go "g"\nstage s {{ match V {{ A -> do Go otherwise -> do Go }} }}\n')
        assert [d.code for d in errors] == ["E005"] and what in errors[0].message, errors


def test_a_record_field_may_be_optional() -> None:
    text = ('type Bill = record { amount: float, note: string?, due: date? }\nsystem B: Bill "b"\n'
            'system C: record { a: bool, tags: list of X | Y? } "c"\naction Go "g"\n'
            'stage s { when missing(B.note) or missing(C.tags) -> do Go otherwise -> do Go }\n')
    assert _errors(text) == []
    s = load_source(None, text=text, name="q.sop").scenario
    assert s is not None
    assert [(f.name, f.optional) for f in s.variables["B"].type.fields] == [
        ("amount", False), ("note", True), ("due", True)]
    assert [f.optional for f in s.variables["C"].type.fields] == [False, True]
    assert ir.describe_type(s.variables["B"].type) == "Bill"
    assert "note: string?" in ir.describe_type(s.variables["B"].type.model_copy(update={"alias": None}))


def test_a_record_may_be_open() -> None:
    text = ('type Seg = record open { flown: bool, inner: record { x: int } }\nsystem S: list of Seg "s"\n'
            'system M: record open { ok: bool? } "m"\nfield open: bool "o"\naction Go "g"\n'
            'stage s { when open and any(x in S where x.flown) and M.ok -> do Go otherwise -> do Go }\n')
    s = load_source(None, text=text, name="q.sop").scenario
    assert s is not None
    seg = s.variables["S"].type.item
    assert seg.open and not seg.fields[1].type.open
    assert s.variables["M"].type.open and s.variables["M"].type.fields[0].optional
    diag, _ = syntax_error('system M: record opened { ok: bool } "m"\n')
    assert diag.code == "E001"


# ---------------------------------------------------------------------------------------------
# List outputs (`output P: list of A | B = []`, `P = [A, B when C]`)

LIST_OUTPUT = '''field X: bool "x"
field Y: int[0..9] "y"
output P: list[..3] of A | B | "C d" = [B, A, B] "p"
action Go "g"
stage s { -> do Go { P = [A, B when X and Y > 2, "C d" when not X] } }
'''


def test_list_outputs_hold_list_literals_with_conditions_and_spans() -> None:
    assert _errors(LIST_OUTPUT) == []
    s = load_source(None, text=LIST_OUTPUT, name="q.sop").scenario
    assert s is not None
    out = s.outputs["P"]
    assert isinstance(out.type, ir.ListType) and out.type.item.values == ["A", "B", "C d"]
    assert isinstance(out.default, ir.ListLit) and out.default.value == ["A", "B"]  # the enum's order, once each
    value = s.stages["s"].branches[0].target.outputs[0].value
    assert isinstance(value, ir.ListLit) and [i.value for i in value.items] == ["A", "B", "C d"]
    assert isinstance(value.conds[0], ir.Lit) and value.conds[0].value is True
    assert ir.show(value.conds[1]) == "X and Y > 2"
    assert (value.span.line, value.span.col, value.span.end_col) == (5, 26, 67)
    assert ir.show(value) == '[A, B when X and Y > 2, "C d" when not X]'
    diag, _ = syntax_error('output P: list of A | B "p"\naction Go "g"\nstage s { -> do Go { P = [when X] } }\n')
    assert diag.code == "E001"  # an item is a value first


@pytest.mark.parametrize(("text", "code", "fragment"), [
    (LIST_OUTPUT.replace("do Go { P = [A,", "do Go { P = [Z,"), "E204", "`Z` is not a value of output `P`"),
    (LIST_OUTPUT.replace("do Go { P = [A,", "do Go { P = A, Q = [A,"), "E107", "Q"),
    (LIST_OUTPUT.replace("[B, A, B]", "[A, B, \"C d\", A]").replace("list[..3]", "list[..2]"), "E204",
     "holds 3 values but output `P` holds at most 2"),
    (LIST_OUTPUT + "stage t { when [A] -> do Go otherwise -> do Go }\n", "E201", "only a list output takes"),
    (LIST_OUTPUT + 'let L = [A]\n', "E201", "only a list output takes"),
    (LIST_OUTPUT.replace("when not X", "when Y"), "E201", "not a condition"),
    (LIST_OUTPUT.replace("list[..3] of A | B | \"C d\" = [B, A, B]", "list of int").replace(
        "[A, B when X and Y > 2, \"C d\" when not X]", "[1]"), "E201", "a list output holds enum values"),
])
def test_list_output_mistakes_are_located_errors(text: str, code: str, fragment: str) -> None:
    errors = _errors(text)
    assert any(d.code == code and (fragment in d.message or fragment in (d.hint or "")) for d in errors), [
        (d.code, d.message, d.hint) for d in errors]


# ---------------------------------------------------------------------------------------------
# For-each steps and list positions (docs/language.md §6.5, §7)

REFUNDS = Path(__file__).resolve().parent / "data" / "refunds.sop"


def test_for_each_steps_and_positions_parse_into_the_ir() -> None:
    scenario = load_source(REFUNDS).scenario
    target = scenario.stages["fees"].branches[0].target
    each, statement = target.steps
    assert (each.action, each.each, ir.show(each.source), ir.show(each.cond)) == ("Refund", "f", "Fees", "f.refundable")
    assert [(a.name, ir.show(a.value)) for a in each.args] == [("fee_id", "f.id"), ("amount", "f.amount")]
    assert isinstance(each.args[0].value, ir.Get) and isinstance(each.args[0].value.base, ir.Item)
    origin = statement.args[1].value
    assert isinstance(origin, ir.Get) and isinstance(origin.base, ir.Index) and origin.base.index == 0
    guard = scenario.stages["fees"].branches[0].guard
    assert "first(Legs).origin == CDG" in ir.show(guard)
    assert ir.show_step(each) == "for f in Fees where f.refundable do Refund(fee_id = f.id, amount = f.amount)"
    assert target.describe() == "for f in Fees do Refund -> do Statement -> done"


def test_a_list_position_is_a_whole_number() -> None:
    with pytest.raises(SopError) as exc:
        parse_text('system L: list[..3] of int[0..9] "l"\naction Go "g"\nstage s { when L[1.5] > 2 -> do Go otherwise -> do Go }\n')
    assert "a list position is a whole number" in str(exc.value.diagnostics[0].message)
