"""`sop draft`: prompt built from templates (grammar + example + numbered policy), check -> repair
rounds with the checker's diagnostics, citations of policy lines, marked questions; offline through
the scripted author and through litellm's real HTTP path against a local fake server."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from fakeserver import Behavior, FakeServer
from hypothesis import given, settings
from hypothesis import strategies as st

from sopgraph.authoring.draft import citations, draft, extract_program, numbered, questions, sanitize
from sopgraph.cli import main
from sopgraph.logic.checker import check_file
from sopgraph.simulation.gateway import Completion, Gateway, ModelSpec, parse_model_option

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "examples" / "authoring" / "late_delivery_policy.md"
GOOD = (ROOT / "examples" / "authoring" / "late_delivery.sop").read_text(encoding="utf-8")


def test_offline_draft_repairs_until_clean(tmp_path: Path) -> None:
    out = tmp_path / "late.sop"
    result = CliRunner().invoke(main, ["draft", str(POLICY), "--model", "author=scripted/author", "-o", str(out),
                                       "--no-cache"])
    assert result.exit_code == 0, result.output
    assert "round 1: 1 errors, 0 warnings -> repair requested" in result.output
    assert "round 2: 0 errors, 0 warnings" in result.output
    assert "(round 2) written to" in result.output and "clean; 7/7 stages cite the policy" in result.output
    text = out.read_text(encoding="utf-8")
    assert check_file(out).errors == 0
    assert text.startswith("scenario late ")
    policy_lines = POLICY.read_text(encoding="utf-8").splitlines()
    for stage, lines in citations(text, POLICY.name).items():
        assert lines, stage
        assert policy_lines[lines[0] - 1].lstrip()[:1].isdigit()  # a numbered rule ...
        assert all(policy_lines[n - 1][:1].isspace() for n in lines[1:])  # ... and the lines it goes on over
    # a rule written over two lines is drafted whole, not cut at its first line
    assert "hand the conversation to a human colleague." in text
    assert f"# {POLICY.name}:8-9" in text
    assert len(questions(text)) == 1 and "question(s) for the author" in result.output
    # titles are cut between words (or are a whole short sentence), never inside a word
    titles = re.findall(r'^stage s\d+ "([^"]*)"', text, re.M)
    assert len(titles) == 7
    for title in titles:
        assert len(title) <= 60, title
        rule = next(line for line in policy_lines if title.rstrip("…") in line)
        rest = rule[rule.index(title.rstrip("…")) + len(title.rstrip("…")):]
        assert not rest[:1].isalnum(), (title, rule)  # the next character ends a word


def test_repair_message_carries_the_checker_diagnostics(tmp_path: Path) -> None:
    spec = ModelSpec(role="author", model="scripted/author")
    result = asyncio.run(draft(POLICY.read_text(encoding="utf-8"), spec, gateway=Gateway(cache=False),
                               policy_file="POLICY.md", name="late"))
    first, second = result.rounds
    assert first.errors == 1 and "undefined action `Respond`" in first.feedback and "E104" in first.feedback
    assert "round 1 of 4" in first.feedback and second.errors == 0 and not second.feedback
    assert result.clean and set(result.citations) == {f"s{i}" for i in range(1, 8)}


def test_round_limit_leaves_the_broken_draft_and_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "late.sop"
    result = CliRunner().invoke(main, ["draft", str(POLICY), "--model", "author=scripted/author", "-o", str(out),
                                       "--rounds", "1", "--no-cache"])
    assert result.exit_code == 1 and "still has errors" in result.output
    assert check_file(out).errors == 1


def test_through_litellm_http_with_prompt_from_templates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real provider path (OpenAI-compatible HTTP on 127.0.0.1): a draft with an error, then its repair."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key-000")
    broken = GOOD.replace("    otherwise -> s2\n", "    otherwise -> s9\n", 1)
    with FakeServer(lifetime=120) as server:
        server.script([Behavior.ok("Here it is:\n```sop\n" + broken + "```\n"), Behavior.ok("```sop\n" + GOOD + "```")])
        spec = parse_model_option(f"author=openai/gpt-4o-mini,api_base={server.base_url},temperature=0")
        gateway = Gateway(cache=False, max_retries=0, default_timeout=10)
        result = asyncio.run(draft(POLICY.read_text(encoding="utf-8"), spec, gateway=gateway,
                                   policy_file="late_delivery_policy.md", name="late_delivery"))
        requests = list(server.requests)
    assert result.clean and [r.errors for r in result.rounds] == [1, 0] and len(requests) == 2
    system, user = requests[0].messages[0]["content"], requests[0].messages[1]["content"]
    assert "COMP_OP" in system and "stage s3 \"Compensation\"" in system  # grammar and example
    assert "# late_delivery_policy.md:LINE" in system and "QUESTION:" in system
    assert " 8| 1. If the customer's account carries a fraud flag" in user
    repair = requests[1].messages[-1]["content"]
    assert "undefined stage `s9`" in repair and requests[1].messages[-2]["role"] == "assistant"


def test_helpers() -> None:
    assert numbered("a\nb") == "1| a\n2| b"
    assert extract_program("text\n```sop\nstage a { -> do X }\n```\nmore") == "stage a { -> do X }\n"
    assert extract_program("```\nfield A: bool\n```") == "field A: bool\n"
    assert extract_program("field A: bool") == "field A: bool\n"
    text = "# P.md:3\n# P.md:4, 6\nstage a { -> b }\nstage b { -> do X }\n# QUESTION: why?\n"
    assert citations(text, "P.md") == {"a": [3, 4, 6], "b": []}
    assert questions(text) == ["why?"]


def test_bad_options_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["draft", str(POLICY), "--model", "agent=scripted/author"])
    assert result.exit_code == 2 and "author=MODEL" in result.output
    result = runner.invoke(main, ["draft", str(tmp_path / "none.md"), "--model", "author=scripted/author"])
    assert result.exit_code == 2 and "cannot read" in result.output


def test_questions_are_comment_lines_only() -> None:
    """Text the model echoed (inside a string, a triple-quoted text, or after code on a line such as
    prose with backticks) is not a question for the author; a `#` comment line is."""
    text = ('# QUESTION: a real one?\n'
            'Note: I left `# QUESTION:` comments where the policy was unclear.\n'
            'stage a "see # QUESTION: not this" {\n'
            '    """Long text\n'
            '    # QUESTION: nor this\n'
            '    """\n'
            '    -> do X  # QUESTION: after code, not a comment line\n'
            '}\n'
            '    # QUESTION:   an indented one\n')
    assert questions(text) == ["a real one?", "an indented one"]
    assert questions('stage a "x # QUESTION: y" { -> do X }\n') == []
    # a citation inside a long text is no citation either
    assert citations('# P.md:1\nstage a """\n# P.md:9\n""" { -> do X }\n', "P.md") == {"a": [1]}


def test_sanitize_strips_terminal_escapes_and_controls() -> None:
    raw = ("\x1b[31mstage\x1b[0m a {\r\n\t-> do X\x07\x00\r\n}\x1b]0;owned\x07\n"
           "# caf\u00e9 \u202eevil\u202c \x9b2J\x1bc done\x7f\n")
    clean, removed = sanitize(raw)
    assert clean == "stage a {\n\t-> do X\n}\n# caf\u00e9 evil  done\n"
    assert removed == len(raw.replace("\r\n", "\n")) - len(clean)
    assert sanitize("plain\ttext\n") == ("plain\ttext\n", 0)


def test_an_oversized_answer_is_not_used_nor_sent_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runaway answer (over --max-answer-chars) is neither checked, written nor sent back: the next request
    is as small as the first plus a one-line note; escapes in the answer never reach the file."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key-000")
    huge = "```sop\n" + GOOD + "```\n" + "junk " * 60_000  # 300,000+ characters
    coloured = "```sop\n" + GOOD.replace("scenario late", "\x1b[1;31mscenario\x1b[0m late", 1) + "```\x1b]0;t\x07"
    out = tmp_path / "late.sop"
    with FakeServer(lifetime=120) as server:
        server.script([Behavior.ok(huge), Behavior.ok(coloured)])
        result = CliRunner().invoke(main, [
            "draft", str(POLICY), "--model", f"author=openai/gpt-4o-mini,api_base={server.base_url},temperature=0",
            "-o", str(out), "--no-cache", "--max-answer-chars", "100000"])
        requests = list(server.requests)
    assert result.exit_code == 0, result.output
    assert f"round 1: answer of {len(huge):,} characters, over the cap: not used -> repair requested" in result.output
    assert "round 2: 0 errors, 0 warnings; 17 control characters removed" in result.output
    assert "(round 2) written to" in result.output
    sizes = [sum(len(m["content"]) for m in r.messages) for r in requests]
    assert len(requests) == 2 and sizes[1] < sizes[0] + 500, sizes
    assert "junk" not in requests[1].messages[-2]["content"] and "over the limit of 100,000" in \
        requests[1].messages[-1]["content"]
    text = out.read_text(encoding="utf-8")
    assert "\x1b" not in text and "\x07" not in text and check_file(out).errors == 0


def test_every_answer_oversized_exits_2_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key-000")
    out = tmp_path / "late.sop"
    with FakeServer(lifetime=120) as server:
        server.set_default(Behavior.ok("x" * 5_000))
        result = CliRunner().invoke(main, [
            "draft", str(POLICY), "--model", f"author=openai/gpt-4o-mini,api_base={server.base_url}",
            "-o", str(out), "--no-cache", "--max-answer-chars", "1000", "--rounds", "3"])
        requests = list(server.requests)
    assert result.exit_code == 2, result.output
    assert "over the answer cap (5,000 characters at most, the cap is 1,000); nothing written" in result.output
    assert "Traceback" not in result.output and not out.exists() and len(requests) == 3
    assert max(sum(len(m["content"]) for m in r.messages) for r in requests[1:]) < \
        sum(len(m["content"]) for m in requests[0].messages) + 500


def test_repair_rounds_send_only_the_latest_draft() -> None:
    """Each repair request carries the system prompt, the policy, the latest draft and its diagnostics:
    it does not grow with the rounds."""
    sent: list[list[dict]] = []
    broken = GOOD.replace("    otherwise -> s2\n", "    otherwise -> s9\n", 1)
    reply = "```sop\n" + broken + "```\n" + "prose " * 100

    class Replaying:
        """Answers the same broken draft every round and records each request."""
        async def complete(self, spec: ModelSpec, messages: list[dict], **kw: object) -> Completion:
            sent.append([dict(m) for m in messages])
            return Completion(text=reply, model=spec.model, role=spec.role)

    spec = ModelSpec(role="author", model="scripted/author")
    gateway = Replaying()
    result = asyncio.run(draft(POLICY.read_text(encoding="utf-8"), spec, gateway=gateway,  # type: ignore[arg-type]
                               policy_file="POLICY.md", name="late", max_rounds=3))
    assert [r.errors for r in result.rounds] == [1, 1, 1]
    assert [len(m) for m in sent] == [2, 4, 4]
    # same draft, same diagnostics: the third request is the second's (but for the round number), not longer
    assert sent[1][:3] == sent[2][:3]
    assert sent[2][3]["content"] == sent[1][3]["content"].replace("round 1 of 3", "round 2 of 3")
    assert "prose" not in sent[1][2]["content"] and sent[1][2]["content"].startswith("```sop\n")


_PIECES = st.sampled_from(["#", "# QUESTION: q", "\"", '"""', "\\", "\n", "\r", "\t", " ", "stage a", "//", "`",
                           "\x1b[31m", "\x1b]0;t\x07", "\x1b", "\x9b", "\x00", "\u202e", "x", "\u00e9"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=5), st.just("\u2028")), max_size=40).map("".join))
def test_mutated_answers_are_sanitized_and_read_without_error(text: str) -> None:
    """Any answer: sanitising leaves no control character but newline and tab (and is idempotent); every
    question comes from a line that is a comment; nothing raises."""
    clean, removed = sanitize(text)
    assert removed >= 0 and sanitize(clean) == (clean, 0)
    assert not any((ord(ch) < 32 and ch not in "\n\t") or 0x7F <= ord(ch) <= 0x9F for ch in clean)
    lines = clean.split("\n")
    from sopgraph.authoring.draft import comment_lines
    for number, comment in comment_lines(clean).items():
        assert lines[number - 1].strip() == comment.strip()
    assert len(questions(clean)) <= sum(1 for line in lines if line.lstrip().startswith("#"))
    citations(clean, "P.md")
