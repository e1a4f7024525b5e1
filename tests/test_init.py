"""`sop init`: the scaffold checks clean, synthesizes at once and never overwrites."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from click.testing import CliRunner

import sopgraph
from sopgraph.cases.profiles import load_profile
from sopgraph.cases.scaffold import render_profile, render_sop
from sopgraph.cases.synth import profile_diagnostics
from sopgraph.cli import main
from sopgraph.logic.checker import check_file
from sopgraph.records import Case


def test_init_check_synth(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["init", "hotel_booking", "--domain", "hotel booking", "--dir", str(tmp_path / "new")])
    assert result.exit_code == 0, result.output
    sop = tmp_path / "new" / "hotel_booking.sop"
    profile = tmp_path / "new" / "hotel_booking.profile.yaml"
    assert sop.is_file() and profile.is_file()
    assert "created" in result.output

    checked = check_file(sop)
    assert checked.diagnostics == [], [d.render() for d in checked.diagnostics]  # no errors, no warnings
    check = runner.invoke(main, ["check", str(sop)])
    assert check.exit_code == 0 and "0 errors, 0 warnings" in check.output
    prof = runner.invoke(main, ["profiles", "check", str(profile), "--strict"])
    assert prof.exit_code == 0, prof.output

    scenario = sopgraph.load(sop)
    assert scenario.meta["domain"] == "hotel booking"
    assert len(scenario.fields) == 2 and len(scenario.system_vars) == 1
    assert len(scenario.actions) == 3 and all(a.attributes for a in scenario.actions.values())
    assert len(scenario.stages) == 4
    kinds = {s.kind for s in scenario.stages.values()}
    assert kinds == {"goto", "match", "when"}
    loaded = load_profile(profile, scenario)
    assert profile_diagnostics(scenario, loaded) == []  # every intent reaches a path and vice versa

    out = tmp_path / "cases.jsonl"
    synth = runner.invoke(main, ["synth", str(sop), "-n", "20", "--seed", "1", "-o", str(out), "--quiet"])
    assert synth.exit_code == 0, synth.output
    cases = [Case.model_validate(json.loads(line)) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(cases) == 20
    assert {c.expected_finals["Action"] for c in cases} == {"IssueRefund", "Answer", "HandOver"}
    assert not any(c.intent_generated for c in cases)


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["init", "shop", "--dir", str(tmp_path)]).exit_code == 0
    sop = tmp_path / "shop.sop"
    sop.write_text("# my edits\n", encoding="utf-8")
    again = runner.invoke(main, ["init", "shop", "--dir", str(tmp_path)])
    assert again.exit_code == 1 and "refusing to overwrite" in again.output
    assert sop.read_text(encoding="utf-8") == "# my edits\n"
    # an existing profile alone also blocks, and nothing is half-written
    (tmp_path / "other.profile.yaml").write_text("{}\n", encoding="utf-8")
    blocked = runner.invoke(main, ["init", "other", "--dir", str(tmp_path)])
    assert blocked.exit_code == 1 and not (tmp_path / "other.sop").exists()


def test_init_rejects_bad_names(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["init", "my-shop", "--dir", str(tmp_path)])
    assert result.exit_code == 1 and "not a valid scenario name" in result.output
    assert list(tmp_path.iterdir()) == []


def test_awkward_domain_text_still_parses(tmp_path: Path) -> None:
    domain = 'bank "cards": loans # & refunds \\ more'
    (tmp_path / "bank.sop").write_text(render_sop("bank", domain), encoding="utf-8")
    (tmp_path / "bank.profile.yaml").write_text(render_profile("bank", domain), encoding="utf-8")
    scenario = sopgraph.load(tmp_path / "bank.sop")
    assert scenario.meta["domain"] == " ".join(domain.split())
    profile = load_profile(tmp_path / "bank.profile.yaml", scenario)
    assert "cards" in profile.description


def _blocks(text: str, lang: str) -> list[str]:
    out, inside, buf = [], False, []
    for line in text.splitlines():
        if not inside and line.strip() == f"```{lang}":
            inside, buf = True, []
        elif inside and line.strip() == "```":
            inside = False
            out.append("\n".join(buf) + "\n")
        elif inside:
            buf.append(line)
    return out


def test_tutorial_files_work(tmp_path: Path) -> None:
    """The .sop and profile printed in docs/tutorial-new-scenario.md check clean and synthesize as shown."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "tutorial-new-scenario.md").read_text(encoding="utf-8")
    sop_text = _blocks(doc, "sop")[0]
    profile_text = _blocks(doc, "yaml")[0]
    sop = tmp_path / "gym_membership.sop"
    sop.write_text(sop_text, encoding="utf-8")
    (tmp_path / "gym_membership.profile.yaml").write_text(profile_text, encoding="utf-8")
    assert check_file(sop).diagnostics == []
    runner = CliRunner()
    ok = runner.invoke(main, ["profiles", "check", str(tmp_path / "gym_membership.profile.yaml"), "--strict"])
    assert ok.exit_code == 0, ok.output
    # the typo shown in section 3 is reported where the tutorial says
    broken = tmp_path / "broken.sop"
    broken.write_text(sop_text.replace("Medical, Moving -> do Freeze", "Medicall, Moving -> do Freeze"),
                      encoding="utf-8")
    assert any(d.code == "E202" and (d.span.line, d.span.col) == (51, 9) for d in check_file(broken).diagnostics)
    out = tmp_path / "cases.jsonl"
    synth = runner.invoke(main, ["synth", str(sop), "-n", "30", "--seed", "7", "-o", str(out), "--quiet"])
    assert synth.exit_code == 0, synth.output
    cases = [Case.model_validate_json(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert Counter(c.path_id for c in cases) == {f"P0{i}": 5 for i in range(1, 7)}
    paid = [c for c in cases if c.expected_finals["Action"] == "CancelWithFee"]
    assert all(c.expected_finals["Fee"] == c.system["MonthsLeft"] * c.system["MonthlyFee"] * 0.5 for c in paid)
    assert all(c.unsafe_action == "CancelFree" for c in paid if c.intensity == "strong")


SHIPPED = sorted((Path(__file__).resolve().parent.parent / "scenarios").glob("*.sop"))


def test_starter_profiles_of_the_shipped_scenarios_load_clean_and_reach_paths(tmp_path: Path) -> None:
    """`sop profiles init` on an existing `.sop`: one intent per combination of field values its paths
    require, described from the fields' `Value = meaning` texts; the profile loads without errors or
    warnings about unknown names, and synthesis uses its intents."""
    from sopgraph.cases.profiles import parse_profile
    from sopgraph.cases.scaffold import starter_profile
    from sopgraph.cases.synth import synthesize

    for sop in SHIPPED:
        scenario = sopgraph.load(sop)
        text, intents, read = starter_profile(scenario)
        assert intents >= 2 and read >= intents
        profile, diags = parse_profile(text, scenario, file="p.yaml")
        assert profile is not None and [d for d in diags if d.is_error] == [], sop
        problems = [d for d in profile_diagnostics(scenario, profile) if d.is_error or d.code in ("W601", "W603")]
        assert problems == [], (sop, [d.message for d in problems])
        assert len(profile.intents) == intents
        assert all(i.description and not i.description.startswith("TODO") for i in profile.intents.values())
        cases = synthesize(scenario, profile, 12, seed=1).cases
        assert any(not c.intent_generated for c in cases)
    telecom = sopgraph.load(next(p for p in SHIPPED if p.stem == "telecom_package"))
    text, _, _ = starter_profile(telecom)
    assert '  cancel_discontent:\n    description: "Wants to terminate the plan or contract; irritated' in text
    assert 'requires: {"ConsumptionType": "Enquiry", "ApplicationTendency": ["Reject", "Hesitate"]}' in text


def test_profiles_init_cli_writes_beside_the_sop_and_never_overwrites(tmp_path: Path) -> None:
    sop = tmp_path / "tp.sop"
    sop.write_text(next(p for p in SHIPPED if p.stem == "telecom_package").read_text(encoding="utf-8"),
                   encoding="utf-8")
    runner = CliRunner()
    first = runner.invoke(main, ["profiles", "init", str(sop)])
    assert first.exit_code == 0, first.output
    assert "wrote" in first.output and (tmp_path / "tp.profile.yaml").is_file()
    again = runner.invoke(main, ["profiles", "init", str(sop)])
    assert again.exit_code == 1 and "--force" in again.output
    forced = runner.invoke(main, ["profiles", "init", str(sop), "--force", "-o", str(tmp_path / "other.yaml")])
    assert forced.exit_code == 0 and (tmp_path / "other.yaml").is_file()
    check = runner.invoke(main, ["profiles", "check", str(tmp_path / "tp.profile.yaml"), "--sop", str(sop)])
    assert check.exit_code == 0 and "0 errors" in check.output, check.output


def test_a_starter_intent_says_how_a_field_relates_to_the_backend() -> None:
    """A path decided by a field compared with a system value (the e-mail the caller gives against the one
    on file) is no "any request" intent matching every path: its intent carries the condition as `when:`,
    and synthesis gives that intent only the path it describes."""
    from sopgraph.cases.profiles import parse_profile
    from sopgraph.cases.scaffold import starter_profile
    from sopgraph.cases.synth import synthesize

    scenario = sopgraph.load(text='field Given: string "the e-mail the caller gives"\n'
                                  'field Request: Question | Cancel "Question = asks; Cancel = wants to cancel"\n'
                                  'system OnFile: string "the e-mail on file"\naction Refuse "r"\naction Explain "e"\n'
                                  'action End "x"\nsystem Paid: bool "p"\naction Charge "c"\n'
                                  'stage verify { when Given != OnFile -> do Refuse  otherwise -> ask }\n'
                                  'stage ask { match Request { Question -> do Explain\n Cancel -> do Charge -> paid } }\n'
                                  'stage paid { observe Paid\n when Paid -> do End\n otherwise -> do Refuse }\n')
    text, _, _ = starter_profile(scenario)
    assert ('  given_ne_on_file:\n    description: "The e-mail the caller gives is not the e-mail on file."\n'
            '    when: "Given != OnFile"') in text  # said in the variables' words: the simulated user speaks it
    assert "any_request" not in text
    # with a field value as well, the relation is said too: the intents of P02 and P03 differ from P01's
    assert ('  question_given_eq_on_file:\n    description: "Asks; the e-mail the caller gives is the e-mail on '
            'file."\n') in text
    assert "  Paid: {user_knows: false}" in text  # an observed value is the backend's news, not the customer's
    profile, diags = parse_profile(text, scenario, file="p.yaml")
    assert profile is not None and not [d for d in diags if d.is_error]
    cases = synthesize(scenario, profile, 9, seed=1).cases
    assert {c.expected_finals["Action"] for c in cases if c.intent == "given_ne_on_file"} == {"Refuse"}


def test_a_starter_profile_keeps_backend_values_from_the_customer() -> None:
    """`sop profiles init` used to mark a backend list as known to the customer, and the simulated customer
    pasted it as raw JSON ("For reference, fees: [{"amount": 0.0, …}]"). Every system value starts unknown
    (the author says which ones a customer sees); lists and records are unknown even without a profile."""
    from sopgraph.cases.profiles import default_profile, parse_profile
    from sopgraph.cases.scaffold import starter_profile
    from sopgraph.cases.synth import synthesize

    scenario = sopgraph.load(text='field Request: Refund | Ask "Refund = wants money back; Ask = asks"\n'
                                  'type Fee = record { amount: float, waived: bool }\n'
                                  'system Fees: list[0..3] of Fee "the fees on the account"\n'
                                  'system Plan: Basic | Premium "the plan on file"\n'
                                  'action Refund "r"\naction Explain "e"\n'
                                  'stage s { match Request { Refund -> do Refund\n Ask -> do Explain } }\n')
    text, _, _ = starter_profile(scenario)
    assert "  Fees: {user_knows: false}  # the backend's data (a list or record)" in text
    assert "  Plan: {user_knows: false}\n" in text
    profile, diags = parse_profile(text, scenario, file="p.yaml")
    assert profile is not None and not [d for d in diags if d.is_error]
    assert profile.user_knows == {"Fees": False, "Plan": False}
    cases = synthesize(scenario, profile, 6, seed=3).cases
    assert cases and all(c.user_facts == {} for c in cases)
    # without a profile: no backend value is known either, neither the list nor a plain value
    assert default_profile(scenario).user_knows == {"Fees": False, "Plan": False}
    assert all("Fees" not in c.user_facts for c in synthesize(scenario, default_profile(scenario), 6, seed=3).cases)
