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

from sopgraph.authoring.draft import citations, draft, extract_program, numbered, questions
from sopgraph.cli import main
from sopgraph.logic.checker import check_file
from sopgraph.simulation.gateway import Gateway, ModelSpec, parse_model_option

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
