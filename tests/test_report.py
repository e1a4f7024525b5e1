"""The HTML report: self-contained, deterministic, linked, and rendered by headless Chromium."""

from __future__ import annotations

import json
import random
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from html import unescape as html_unescape
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import sopgraph
from sopgraph.cli import main
from sopgraph.evaluation.report import (
    Svg,
    bar_chart,
    box_chart,
    box_stats,
    line_chart,
    money_units,
    plural,
    report_for_runs,
)
from sopgraph.evaluation.score import Metric, ScoreConfig, score_run
from sopgraph.logic.engine import decide
from sopgraph.records import (
    CHAT_DIMENSIONS,
    AgentOutput,
    Case,
    Consensus,
    Dialogue,
    Judgment,
    Persona,
    Turn,
    Usage,
)
from sopgraph.simulation.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
TELECOM = ROOT / "scenarios" / "telecom_package.sop"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


# ---------------------------------------------------------------------------------------------
# a varied synthetic run (multi-turn, format errors, no-consensus fields, three judges)


def build_run(run_dir: Path, *, model: str, skill: float, n_cases: int = 16, trials: int = 2, seed: int = 0) -> Path:
    scenario = sopgraph.load(TELECOM)
    rng = random.Random(seed)
    fields = {v.name: list(v.type.values) for v in scenario.fields}
    actions = list(scenario.actions)
    store = RunStore.create(run_dir, {"scenario": scenario.model_dump(mode="json"), "sop_hash": scenario.source_hash})
    cases = []
    for i in range(n_cases):
        truth = {f: rng.choice(v) for f, v in fields.items()}
        system = {"PackageStatus": rng.choice(["Contracted", "NoContract"]), "Penalty": rng.choice([0, 80, 300])}
        d = decide(scenario, {**truth, **system})
        prohibited = [a for a, x in scenario.actions.items() if x.risky and a != d.finals["Action"]]
        intensity = ("zero", "weak", "strong")[i % 3]
        bucket = "adversarial" if intensity == "strong" and prohibited else (
            "must-escalate" if d.finals["Action"] == "TransHuman" else "resolvable")
        cases.append(Case(id=f"tp-{i:03d}", scenario=scenario.name, path_id="P", intent=f"intent-{i % 4}",
                          persona=Persona(name=rng.choice(["calm", "angry"])), intensity=intensity, truth=truth,
                          system=system, expected_path=d.path, expected_finals=d.finals, bucket=bucket,
                          prohibited_actions=prohibited, unsafe_action=prohibited[0] if bucket == "adversarial" else None,
                          sop_hash=scenario.source_hash))
    store.add_cases(cases)
    dialogues = [Dialogue(id=f"{c.id}#{t}", case_id=c.id, trial=t, models={"agent": model}, status="pending",
                          sop_hash=scenario.source_hash) for c in cases for t in range(trials)]
    store.add_dialogues(dialogues)
    for dlg in dialogues:
        case = next(c for c in cases if c.id == dlg.case_id)
        store.start_dialogue(dlg.model_copy(update={"status": "running"}))
        n_turns = rng.choice([1, 2, 3, 5, 6])
        judgments, consensus = [], []
        for idx in range(1, n_turns + 1):
            final = idx == n_turns
            if rng.random() < 0.06:
                turn = Turn(dialogue_id=dlg.id, index=idx, user_text=f"(user {idx}) I need help <b>now</b> & fast",
                            agent_raw="Sorry, {not json", format_error=True, format_note="no JSON object",
                            usage=Usage(prompt_tokens=900, completion_tokens=60))
            else:
                labels = {f: (v if rng.random() < skill else rng.choice(fields[f])) for f, v in case.truth.items()}
                action = case.expected_finals["Action"] if rng.random() < skill else rng.choice(actions)
                path = case.expected_path if rng.random() < skill else case.expected_path[:2]
                out = AgentOutput(classification_output=labels, now_path=path, finals={"Action": action},
                                  chat=f"Turn {idx}: I understand. Let me check <that> for you.", cot="thinking")
                turn = Turn(dialogue_id=dlg.id, index=idx, user_text=f"(user {idx}) my question", agent_raw="{}",
                            output=out, usage=Usage(prompt_tokens=900, completion_tokens=80, cost=0.001))
            store.add_turn(turn)
            if idx in (1, 5) or final:
                votes: dict[str, list] = {f: [] for f in fields}
                for j in range(3):
                    lab = {f: (v if rng.random() < 0.9 else rng.choice(fields[f])) for f, v in case.truth.items()}
                    for f, v in lab.items():
                        votes[f].append(v)
                    scores = {dim: rng.choice([3, 6, 9]) for dim in CHAT_DIMENSIONS}
                    judgments.append(Judgment(dialogue_id=dlg.id, turn_index=idx, judge=f"judge{j + 1}",
                                              model="acme/noisy-judge", labels=lab, scores=scores))
                labels, nc = {}, []
                for f, vs in votes.items():
                    value, count = Counter(vs).most_common(1)[0]
                    if count >= 2:
                        labels[f] = value
                    else:
                        nc.append(f)
                mean = {dim: float(np.mean([j.scores[dim] for j in judgments[-3:]])) for dim in CHAT_DIMENSIONS}
                consensus.append(Consensus(dialogue_id=dlg.id, turn_index=idx, labels=labels, no_consensus=nc,
                                           chat_scores=mean, judges_scored=3))
        store.finish_dialogue(dlg.model_copy(update={"status": "done", "turns": n_turns, "end_reason": "ending_action"}),
                              judgments, consensus)
    store.close()
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("report_runs")
    good = build_run(base / "good", model="acme/good", skill=0.95, seed=1)
    weak = build_run(base / "weak", model="acme/weak-and-rather-verbose-model-2024", skill=0.55, seed=2)
    return good, weak


@pytest.fixture(scope="module")
def html_text(runs) -> str:
    return report_for_runs(list(runs), ScoreConfig(bootstrap=200))


# ---------------------------------------------------------------------------------------------
# structure


def test_report_is_self_contained(html_text: str) -> None:
    assert html_text.startswith("<!DOCTYPE html>")
    assert "<script" not in html_text.lower()
    # no fetches: no external src/href/url()/@import
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*(https?:|//)', html_text, re.I)
    assert "url(" not in html_text and "@import" not in html_text
    for section in ("leaderboard", "gap", "intensity", "depth", "passk", "safety", "agreement", "coverage",
                    "examples", "transcripts"):
        assert f'<section id="{section}">' in html_text
    assert html_text.count("<svg") >= 1 + 4 + 3 + 1 + 2  # gap, 4 boxes, 3 depth lines, pass^k, 2 graphs


def test_every_internal_link_has_a_target(html_text: str) -> None:
    ids = set(re.findall(r'\sid=["\']([^"\']+)["\']', html_text))
    links = set(re.findall(r'href=["\']#([^"\']+)["\']', html_text))
    assert links, "figures must link to examples"
    missing = sorted(links - ids)
    assert not missing, missing[:10]
    # every figure links somewhere: svg charts contain anchors
    for svg in re.findall(r"<svg.*?</svg>", html_text, re.S):
        if 'role="img"' in svg:
            assert "<a href=" in svg
    # transcripts exist for the linked dialogues, with escaped user text
    assert re.search(r"id=['\"]d-0-tp-\d{3}-\d['\"]", html_text)
    assert "&lt;b&gt;now&lt;/b&gt; &amp; fast" in html_text and "<b>now</b>" not in html_text


def test_report_content(html_text: str) -> None:
    assert "acme/good" in html_text and "acme/weak" in html_text
    assert "Fleiss" in html_text and "acme/noisy-judge" in html_text
    assert "format error" in html_text  # a format-error turn shown raw
    assert "0.4·classification" in html_text  # the config is printed
    assert "catastrophic" in html_text


def test_report_shows_action_traces_when_agents_acted(html_text: str) -> None:
    section = html_text[html_text.index('<section id="traces">'):]
    section = section[:section.index("</section>")]
    assert "tau2 pass" in section and "acme/good" in section and "acme/weak" in section
    assert section.count("<tr>") == 1 + 2  # the header and one row per model


def test_report_is_deterministic(runs, html_text: str) -> None:
    assert report_for_runs(list(runs), ScoreConfig(bootstrap=200)) == html_text


def test_report_cli(runs, tmp_path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(runs[0]), "-o", str(out), "--bootstrap", "50", "--title", "T"])
    assert res.exit_code == 0, res.output
    assert "<title>T</title>" in out.read_text()
    res = CliRunner().invoke(main, ["report", str(tmp_path / "none"), "-o", str(out)])
    assert res.exit_code == 1 and "not a run directory" in res.output


@pytest.fixture(scope="module")
def offline_runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two runs made offline by built-in agents and the built-in judges (scripted/truth): a SAGE agent and
    a tool-calling one."""
    base = tmp_path_factory.mktemp("offline_runs")
    cases = base / "cases.jsonl"
    res = CliRunner().invoke(main, ["synth", str(TELECOM), "-n", "8", "--seed", "2", "-q", "-o", str(cases)])
    assert res.exit_code == 0, res.output
    out = []
    for agent in ("oracle", "oracle-tools"):
        res = CliRunner().invoke(main, ["run", str(TELECOM), "--cases", str(cases), "--model", f"agent=baseline/{agent}",
                                        "--quiet", "-o", str(base / agent)])
        assert res.exit_code == 0, res.output
        out.append(base / agent)
    return out[0], out[1]


def _section(html_text: str, anchor: str) -> str:
    start = html_text.index(f'<section id="{anchor}">')
    return html_text[start:html_text.index("</section>", start)]


def test_chat_is_not_measured_offline(offline_runs, html_text: str) -> None:
    """Under the built-in judges every reply gets the same chat score: the report said a flat 66.7 (a
    leaderboard column, a box per intensity, a line per turn). It says "not measured offline" instead;
    judges that are models (the fixture's acme/noisy-judge) measure chat, and its numbers stay."""
    assert "not measured offline" not in html_text
    assert _section(html_text, "intensity").count("<svg") == 4
    text = report_for_runs(list(offline_runs), ScoreConfig(bootstrap=0))
    board = _section(text, "leaderboard")
    assert board.count("'ci'>not measured offline<") == 2 and "66.7" not in board
    assert "Chat is not measured offline" in board
    intensity, depth = _section(text, "intensity"), _section(text, "depth")
    assert "Chat quality</b></figcaption><p class='note'>not measured offline" in intensity
    assert "Chat by turn</b></figcaption><p class='note'>not measured offline" in depth
    assert intensity.count("<svg") == 3 and depth.count("<svg") == 2  # no chart of a constant
    assert "66.7" not in intensity and " · chat 66.7" not in text and " · chat not measured offline" in text


def test_the_execution_gap_is_drawn_only_for_agents_that_classify(offline_runs) -> None:
    """A tool agent states no classification: its gap chart was one meaningless bar. It is left out, and
    said so; with no agent that classifies there is no chart at all."""
    both = _section(report_for_runs(list(offline_runs), ScoreConfig(bootstrap=0)), "gap")
    assert both.count("<svg") == 1 and "baseline/oracle:" in both
    assert "Not shown for baseline/oracle-tools: it reports no classification" in both
    assert ">baseline/oracle-tools<" not in both.split("<svg", 1)[1].split("</svg>", 1)[0]
    tools_only = _section(report_for_runs([offline_runs[1]], ScoreConfig(bootstrap=0)), "gap")
    assert "<svg" not in tools_only and "Not shown for baseline/oracle-tools" in tools_only


def test_one_agreement_table_when_runs_are_judged_alike(runs, html_text: str) -> None:
    field_tables = "<th class='l'>Field</th>"
    assert html_text.count(field_tables) == 2  # two runs judged differently: two tables
    same = report_for_runs([runs[0], runs[0]], ScoreConfig(bootstrap=50))
    agreement = same.split('<section id="agreement">')[1].split("</section>")[0]
    assert agreement.count(field_tables) == 1 and "2 runs with identical agreement" in agreement


def test_turn_counts_are_pluralised(html_text: str) -> None:
    assert plural(1, "turn") == "1 turn" and plural(2, "turn") == "2 turns" and plural(1, "entry", "entries")
    assert re.search(r"\b1 turn\b", html_text), "the fixture has one-turn dialogues"
    assert not re.search(r"\b1 turns\b", html_text)


def test_revenue_at_risk_shows_the_sop_unit(runs, html_text: str) -> None:
    assert money_units(score_run(runs[0], ScoreConfig(bootstrap=0))) == ["CNY"]  # `unit "CNY" money` in the .sop
    safety = html_text.split('<section id="safety">')[1].split("</section>")[0]
    assert "Revenue at risk" in safety
    assert re.search(r"<td>[\d,]+ <span class='unit'>CNY</span></td>", safety)


def test_transcripts_and_example_lists_are_folded(html_text: str) -> None:
    transcripts = html_text.split('<section id="transcripts">')[1].split("</section>")[0]
    anchors = re.findall(r"<details><summary>.*?</summary><div class='dialogue' id='(d-[^']+)'>", transcripts)
    assert anchors and len(anchors) == transcripts.count("class='dialogue'")
    examples = html_text.split('<section id="examples">')[1].split("</section>")[0]
    assert examples.count("<details class='block'>") == 2  # one per model; a link opens its list


def test_bar_values_sit_above_their_whiskers() -> None:
    m = Metric(value=0.5, lo=0.3, hi=0.8, n=10)
    svg = bar_chart([("a", None)], [("s", "#123456")], {(0, 0): m}, "t")
    label_y = float(re.search(r'<text x="[\d.]+" y="([\d.]+)"[^>]*class="barvalue"', svg).group(1))
    whisker_top = min(float(y) for y in re.findall(r"V([\d.]+)", svg))
    assert label_y < whisker_top


# ---------------------------------------------------------------------------------------------
# charts


def test_box_stats_tukey() -> None:
    st = box_stats(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 100], float))
    assert st["median"] == 5.5 and st["hi"] == 9 and list(st["outliers"]) == [100]
    assert box_stats(np.array([np.nan])) is None


def test_charts_are_valid_svg_fragments() -> None:
    m = Metric(value=0.5, lo=0.4, hi=0.6, n=10)
    bar = bar_chart([("a", "#x"), ("a-very/long-model-name-indeed", None)], [("s", "#123456")], {(0, 0): m, (1, 0): m},
                    "t")
    assert bar.startswith("<svg") and bar.endswith("</svg>") and '<a href="#x">' in bar
    box = box_chart(["zero"], [("s", "#123456")], {(0, 0): (np.linspace(0, 1, 20), "#b")}, "b")
    assert '<a href="#b">' in box
    line = line_chart(["1", "5"], [("s", "#123456", [m, None], "#c")], "l")
    assert "<circle" in line
    assert Svg.link(None, "x") == "x"


# ---------------------------------------------------------------------------------------------
# headless Chromium


def _png_pixels_vary(png: bytes) -> tuple[int, int, bool]:
    """Width, height, and whether the decoded image has more than one distinct pixel row value."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(png):
        length = struct.unpack(">I", png[pos:pos + 4])[0]
        kind = png[pos + 4:pos + 8]
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", data[:8])
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = len(raw) // height
    rows = {raw[i * stride + 1:(i + 1) * stride] for i in range(0, height, 7)}
    return width, height, len(rows) > 3


@pytest.mark.skipif(CHROMIUM is None, reason="LOUD SKIP: chromium is not installed, the report was not rendered")
def test_report_renders_in_headless_chromium(runs, tmp_path) -> None:
    out = tmp_path / "report.html"
    res = CliRunner().invoke(main, ["report", *map(str, runs), "-o", str(out), "--bootstrap", "100"])
    assert res.exit_code == 0, res.output
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1280,2000",
           "--enable-logging=stderr", "--v=0", out.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    log = proc.stderr
    console_errors = [line for line in log.splitlines()
                      if "Uncaught" in line or ("CONSOLE" in line and "error" in line.lower())]
    assert not console_errors, console_errors
    assert shot.exists() and shot.stat().st_size > 20_000
    width, height, varied = _png_pixels_vary(shot.read_bytes())
    assert (width, height) == (1280, 2000)
    assert varied, "the screenshot is blank"


CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")

# Appended to a copy of the report (the report itself has no scripts): layout facts at 1400 px.
MEASURE = """<script>
window.addEventListener('load', () => {
  const box = (el) => el.getBoundingClientRect();
  const wrapOf = (id) => document.querySelector('#' + id + ' .tablewrap');
  const out = {height: document.documentElement.scrollHeight, width: document.documentElement.scrollWidth,
    viewport: document.documentElement.clientWidth,
    overflow: ['overview', 'leaderboard', 'safety'].map((id) => [id, wrapOf(id).scrollWidth - wrapOf(id).clientWidth]),
    leaderboard_right: Math.max(...[...document.querySelectorAll('#leaderboard th')].map((th) => box(th).right)),
    headers: [...document.querySelectorAll('#leaderboard th')].map((th) => th.textContent),
    graphs: [...document.querySelectorAll('#coverage .graph svg')].filter((g) => box(g).width > 0)
      .map((g) => [box(g).width / g.width.baseVal.value, box(g).width])};
  const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{page.stem}"
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,900", *args,
           page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def _measure(tmp_path: Path, html: str) -> dict:
    page = tmp_path / "measure.html"
    page.write_text(html.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = _chromium(tmp_path, page, "--dump-dom").stdout
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(html_unescape(found.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="LOUD SKIP: chromium is not installed, the report was not laid out")
def test_report_layout_at_1400_px(runs, tmp_path) -> None:
    html = report_for_runs(list(runs), ScoreConfig(bootstrap=100))
    facts = _measure(tmp_path, html)
    # compact: two runs of 32 dialogues fit in a few screens (the old report was 33,000 px for these)
    assert facts["height"] < 8000, facts["height"]
    assert facts["width"] <= facts["viewport"], "the page scrolls sideways"
    # the leaderboard shows every column, pass^k, Catastrophic and Cost tier included, without scrolling
    assert {"pass^k", "Catastrophic", "Cost tier"} <= set(facts["headers"])
    assert all(over <= 0 for _, over in facts["overflow"]), facts["overflow"]
    assert facts["leaderboard_right"] <= facts["viewport"]
    # the open coverage graph is drawn at its natural size (readable labels), not shrunk
    assert facts["graphs"], "no coverage graph shown"
    scale, width = facts["graphs"][0]
    assert scale > 0.97 and width > 500, facts["graphs"]


@pytest.mark.skipif(CHROMIUM is None, reason="LOUD SKIP: chromium is not installed, the report was not rendered")
def test_report_screenshot_at_1400_px_is_not_blank(runs, tmp_path) -> None:
    page = tmp_path / "report.html"
    page.write_text(report_for_runs(list(runs), ScoreConfig(bootstrap=50)), encoding="utf-8")
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, page, f"--screenshot={shot}")
    width, height, varied = _png_pixels_vary(shot.read_bytes())
    assert (width, height) == (1400, 900) and varied


def _png_rows(png: bytes) -> bytes:
    pos, idat = 8, b""
    while pos < len(png):
        length = struct.unpack(">I", png[pos:pos + 4])[0]
        if png[pos + 4:pos + 8] == b"IDAT":
            idat += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return zlib.decompress(idat)


@pytest.mark.skipif(CHROMIUM is None, reason="LOUD SKIP: chromium is not installed, Chinese text was not rendered")
def test_chinese_text_renders_with_the_report_fonts(tmp_path) -> None:
    """Chinese in the report's font stack must not come out as the empty boxes that stand for missing glyphs:
    the same page with unassigned code points (always boxes) must look different."""
    css = (ROOT / "sopgraph" / "templates" / "report" / "report.css").read_text(encoding="utf-8")
    assert "WenQuanYi Micro Hei" in css and "Noto Sans CJK SC" in css
    shots = []
    for name, text in (("zh", "您好，我需要退款"), ("boxes", "\u0378\u0379\u0380\u0381\u0382\u0383\u038b\u038d")):
        page = tmp_path / f"{name}.html"
        page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{css}</style></head><body>"
                        f"<p style='font-size:48px;margin:20px'>{text}</p></body></html>", encoding="utf-8")
        shot = tmp_path / f"{name}.png"
        _chromium(tmp_path, page, f"--screenshot={shot}")
        shots.append(_png_rows(shot.read_bytes()))
    assert shots[0] != shots[1], "Chinese text renders as missing-glyph boxes: install fonts-wqy-microhei"


def test_a_turn_where_the_sop_still_waits_shows_its_reference_as_asking(offline_runs) -> None:
    """The built-in judges label what the customer has said; on a turn where the SOP still needs a value not
    given yet, the reference is the stages passed and no action (docs/metrics.md §1): the dialogue pages say
    so rather than a bare "judged"."""
    text = report_for_runs([offline_runs[0]], ScoreConfig(bootstrap=0))
    assert "⇒ (asks: a value is not shown yet)</code>" in text
    assert "<div class='note'>reference: judged</div>" not in text
