"""One self-contained HTML report of one or more scored runs.

Why self-contained: a report is mailed, attached to tickets and archived next to a run; it must open
anywhere, offline, years later. So: no scripts, no external fonts or stylesheets, every plot an
inline SVG drawn here (bars with CI whiskers, box plots, line charts), the coverage graph inlined
from Graphviz. Every figure links to example dialogues (anchors into the transcripts section), so a
number can always be traced to the conversations behind it.

Deterministic: same runs + config → byte-identical HTML (no timestamps, sorted choices).
Scale: the report never renders every dialogue; it picks a bounded set of examples (per model and
kind), so a 10,000-dialogue run builds in seconds.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

import numpy as np

from sopgraph._version import __version__
from sopgraph.errors import ArgumentError
from sopgraph.evaluation.coverage import CoverageSide, render_coverage, run_coverage
from sopgraph.evaluation.score import (
    BUCKETS,
    INTENSITIES,
    GroupScore,
    Metric,
    ScoreConfig,
    ScoredRun,
    dialogue_means,
    open_run,
    score_run,
)
from sopgraph.evaluation.stats import fleiss_kappa
from sopgraph.language.render import RenderError
from sopgraph.records import Case, Consensus, Judgment, Turn
from sopgraph.simulation.judge import agreement
from sopgraph.simulation.providers import is_builtin

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
METRIC_COLORS = {"classification": "#9fb3c8", "action": "#1f5fa8", "action_self": "#f0a202"}
# Latin first (Helvetica metrics), then CJK fonts so that Chinese dialogues render (the set-up installs
# fonts-wqy-microhei; Noto CJK, PingFang and YaHei cover other systems).
SVG_FONTS = ("Helvetica, Arial, &quot;Liberation Sans&quot;, &quot;PingFang SC&quot;, &quot;Microsoft YaHei&quot;, "
             "&quot;WenQuanYi Micro Hei&quot;, &quot;Noto Sans CJK SC&quot;, sans-serif")
MAX_OUTLIERS = 40  # outlier dots drawn per box (the most extreme ones)


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


def _f(x: float) -> str:
    """Coordinates with one decimal (stable text)."""
    return f"{x:.1f}"


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`1 turn`, `2 turns` (`nouns`: an irregular plural)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {nouns or noun + 's'}"


def _pct(v: float | None, digits: int = 1) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 100:.{digits}f}"


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass
class ReportInput:
    """One scored run and the accessors the report needs beyond its scores."""
    run: ScoredRun
    turns_of: Callable[[str], list[Turn]]
    judgments: list[Judgment] = field(default_factory=list)
    consensus: list[Consensus] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # scenario name -> (by the cases, by the agents), from `run_coverage`: the numbers `sop coverage` prints
    coverage: dict[str, tuple[CoverageSide, CoverageSide]] = field(default_factory=dict)
    chat_measured: bool | None = None  # None: decided from the judges' models (`judges_measure_chat`)


NOT_MEASURED = "not measured offline"


def judges_measure_chat(inp: ReportInput) -> bool:
    """Whether the run's judges measured chat quality. The built-in judges (`scripted/truth`) give every
    reply the same fixed score, so under them a chat number is a constant, not a measurement: the report
    says "not measured offline" instead of a flat 66.7."""
    models = {j.model for j in inp.judgments if j.model}
    if not models:
        sets = inp.meta.get("judgment_sets") or {}
        chosen = sets.get(inp.run.judgment_set or "") if isinstance(sets, dict) else None
        named = chosen.get("models") if isinstance(chosen, dict) else None
        models = {str(m) for m in named.values()} if isinstance(named, dict) else set()
    return not models or not all(is_builtin(m) for m in models)


def _chat_ok(inp: ReportInput) -> bool:
    return inp.chat_measured is not False


@dataclass
class _Series:
    """One (run, model): the unit plotted as one colour."""
    sid: int
    inp: ReportInput
    model: str
    model_code: int
    label: str
    color: str
    dmask: np.ndarray  # valid dialogues of this model
    group: GroupScore | None = None


def report_for_runs(run_dirs: Sequence[str | Path], config: ScoreConfig | None = None, *,
                    title: str | None = None, examples: int = 5, max_transcripts: int = 150) -> str:
    """Score run directories and build their HTML report."""
    cfg = config or ScoreConfig()
    stores = []
    try:
        inputs = []
        for rd in run_dirs:
            run = score_run(rd, cfg)
            store = open_run(rd)
            stores.append(store)
            jset = run.judgment_set
            inputs.append(ReportInput(
                run=run,
                turns_of=store.turns,  # bound now, so each input reads its own store
                judgments=store.judgments(jset) if jset else [],
                consensus=store.consensus(jset) if jset else [],
                meta=store.meta(),
                coverage={name: run_coverage(scenario, store) for name, scenario in run.scenarios.items()},
            ))
        return build_report(inputs, title=title, examples=examples, max_transcripts=max_transcripts)
    finally:
        for st in stores:
            st.close()


# ---------------------------------------------------------------------------------------------
# SVG drawing


class Svg:
    """A tiny SVG builder: only what the charts need, with stable number formatting."""
    def __init__(self, width: float, height: float, label: str):
        self.w, self.h, self.label = width, height, label
        self.parts: list[str] = []

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x: float, y: float, s: str, *, anchor: str = "middle", size: float = 11, fill: str = "#334e68",
             weight: str | None = None, rotate: float | None = None) -> None:
        extra = f' font-weight="{weight}"' if weight else ""
        if rotate is not None:
            extra += f' transform="rotate({rotate:g} {_f(x)} {_f(y)})"'
        self.add(f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" font-size="{size:g}" fill="{fill}"{extra}>'
                 f'{esc(s)}</text>')

    def line(self, x1: float, y1: float, x2: float, y2: float, *, stroke: str = "#9fb3c8", width: float = 1,
             dash: str | None = None) -> None:
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{_f(x1)}" y1="{_f(y1)}" x2="{_f(x2)}" y2="{_f(y2)}" stroke="{stroke}" '
                 f'stroke-width="{width:g}"{d}/>')

    @staticmethod
    def rect(x: float, y: float, w: float, h: float, *, fill: str, stroke: str | None = None,
             title: str | None = None) -> str:
        s = f' stroke="{stroke}"' if stroke else ""
        t = f"<title>{esc(title)}</title>" if title else ""
        return f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(max(w, 0))}" height="{_f(max(h, 0))}" fill="{fill}"{s}>{t}</rect>'

    @staticmethod
    def circle(cx: float, cy: float, r: float, *, fill: str, title: str | None = None, stroke: str = "none") -> str:
        t = f"<title>{esc(title)}</title>" if title else ""
        return f'<circle cx="{_f(cx)}" cy="{_f(cy)}" r="{r:g}" fill="{fill}" stroke="{stroke}">{t}</circle>'

    @staticmethod
    def link(href: str | None, inner: str) -> str:
        return f'<a href="{esc(href)}">{inner}</a>' if href else inner

    def render(self) -> str:
        return (f'<svg viewBox="0 0 {_f(self.w)} {_f(self.h)}" width="{_f(self.w)}" height="{_f(self.h)}" '
                f'role="img" aria-label="{esc(self.label)}" font-family="{SVG_FONTS}">'
                + "".join(self.parts) + "</svg>")


def _axes(svg: Svg, x0: float, y0: float, x1: float, y1: float, ymax: float, scale: float, ticks: int = 4,
          ylabel: str = "") -> Callable[[float], float]:
    """Horizontal grid and y labels; returns value → y coordinate."""
    def ymap(v: float) -> float:
        v = min(max(v, 0.0), ymax)
        return y1 - (v / ymax) * (y1 - y0) if ymax > 0 else y1

    for i in range(ticks + 1):
        v = ymax * i / ticks
        y = ymap(v)
        svg.line(x0, y, x1, y, stroke="#e4e7eb")
        svg.text(x0 - 6, y + 4, f"{v * scale:g}", anchor="end", size=10, fill="#829ab1")
    svg.line(x0, y1, x1, y1, stroke="#9fb3c8")
    if ylabel:
        svg.text(12, (y0 + y1) / 2, ylabel, size=10, fill="#829ab1", rotate=-90)
    return ymap


def _legend(svg: Svg, items: Sequence[tuple[str, str]], x: float, y: float, right: float) -> float:
    """Colour keys in rows that wrap at `right`; returns the y of the last row."""
    x_start = x
    for name, color in items:
        w = 24 + 6.0 * len(name)
        if x > x_start and x + w > right:
            x = x_start
            y += 15
        svg.add(Svg.rect(x, y - 9, 10, 10, fill=color))
        svg.text(x + 14, y, name, anchor="start", size=10.5)
        x += w
    return y


def _wrap(label: str, width: int = 18) -> list[str]:
    """Split a label into lines of at most `width` characters at / - _ or space (two lines at most)."""
    if len(label) <= width:
        return [label]
    cut = max((label.rfind(ch, 0, width + 1) for ch in "/-_ "), default=-1)
    if cut <= 0:
        cut = width
    first, rest = label[: cut + 1].rstrip(), label[cut + 1:]
    if len(rest) > width:
        rest = rest[: width - 1] + "…"
    return [first, rest]


def bar_chart(categories: Sequence[tuple[str, str | None]], series: Sequence[tuple[str, str]],
              values: dict[tuple[int, int], Metric | None], title: str, *, ymax: float = 1.0,
              scale: float = 100.0) -> str:
    """Grouped bars with CI whiskers. categories: (label, href); series: (name, colour)."""
    n_cat, n_ser = max(len(categories), 1), max(len(series), 1)
    bw = 22.0
    gw = max(n_ser * bw + 26, 120.0)
    width = max(420.0, 60 + n_cat * gw + 20)
    svg = Svg(width, 0, title)
    svg.text(width / 2, 16, title, size=12.5, weight="600")
    top = _legend(svg, series, 56, 34, width - 10) + 14
    height = top + 250.0
    svg.h = height
    x0, y0, x1, y1 = 50.0, top, width - 10, height - 40
    ymap = _axes(svg, x0, y0, x1, y1, ymax, scale)
    for ci, (cat, href) in enumerate(categories):
        gx = x0 + 14 + ci * gw
        inner = []
        for si, (name, color) in enumerate(series):
            m = values.get((ci, si))
            if m is None or m.value is None:
                continue
            bx = gx + si * bw
            top = ymap(m.value)
            tip = f"{cat} · {name}: {_pct(m.value)}"
            if m.lo is not None and m.hi is not None:
                tip += f" (95% CI {_pct(m.lo)}–{_pct(m.hi)})"
            inner.append(Svg.rect(bx + 2, top, bw - 4, y1 - top, fill=color, title=tip))
            if m.lo is not None and m.hi is not None and m.hi > m.lo:
                cx = bx + bw / 2
                inner.append(f'<path d="M{_f(cx)} {_f(ymap(m.lo))}V{_f(ymap(m.hi))}M{_f(cx - 4)} {_f(ymap(m.lo))}'
                             f'H{_f(cx + 4)}M{_f(cx - 4)} {_f(ymap(m.hi))}H{_f(cx + 4)}" stroke="#102a43" '
                             f'stroke-width="1.2" fill="none"/>')
            label_y = min(top, ymap(m.hi) if m.hi is not None and m.lo is not None else top) - 3
            inner.append(f'<text x="{_f(bx + bw / 2)}" y="{_f(label_y)}" text-anchor="middle" font-size="9" '
                         f'fill="#486581" class="barvalue">{esc(_pct(m.value, 0))}</text>')
        svg.add(Svg.link(href, "".join(inner)))
        _category_label(svg, gx + (n_ser * bw) / 2, y1 + 14, cat, href)
    return svg.render()


def _category_label(svg: Svg, x: float, y: float, label: str, href: str | None) -> None:
    lines = _wrap(label)
    spans = "".join(f'<tspan x="{_f(x)}" dy="{0 if i == 0 else 12}">{esc(line)}</tspan>'
                    for i, line in enumerate(lines))
    t = (f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="middle" font-size="10.5" fill="#1f5fa8" '
         f'text-decoration="underline"><title>{esc(label)}</title>{spans}</text>')
    svg.add(Svg.link(href, t))


def box_stats(values: np.ndarray) -> dict[str, Any] | None:
    """Quartiles, whiskers (most extreme points within 1.5·IQR) and outliers (Tukey)."""
    v = np.sort(values[np.isfinite(values)])
    if v.size == 0:
        return None
    q1, med, q3 = (float(x) for x in np.quantile(v, [0.25, 0.5, 0.75]))
    iqr = q3 - q1
    lo_lim, hi_lim = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    inside = v[(v >= lo_lim) & (v <= hi_lim)]
    out = v[(v < lo_lim) | (v > hi_lim)]
    return {"q1": q1, "median": med, "q3": q3, "lo": float(inside.min()) if inside.size else q1,
            "hi": float(inside.max()) if inside.size else q3, "outliers": out, "n": int(v.size),
            "mean": float(v.mean())}


def box_chart(categories: Sequence[str], series: Sequence[tuple[str, str]],
              data: dict[tuple[int, int], tuple[np.ndarray, str | None]], title: str, *, ymax: float = 1.0,
              scale: float = 100.0) -> str:
    """Box plots: one box per (category, series); each box links to its examples."""
    n_cat, n_ser = max(len(categories), 1), max(len(series), 1)
    bw = 14.0 if n_ser > 2 else 22.0  # narrow enough for four panels side by side at 1400 px
    gw = n_ser * bw + 18
    width = max(260.0, 60 + n_cat * gw + 16)
    height = 270.0
    svg = Svg(width, height, title)
    svg.text(width / 2, 16, title, size=12.5, weight="600")
    x0, y0, x1, y1 = 46.0, 30.0, width - 10, height - 40
    ymap = _axes(svg, x0, y0, x1, y1, ymax, scale)
    for ci, cat in enumerate(categories):
        gx = x0 + 16 + ci * gw
        for si, (name, color) in enumerate(series):
            entry = data.get((ci, si))
            if entry is None:
                continue
            values, href = entry
            st = box_stats(values)
            if st is None:
                continue
            bx = gx + si * bw
            cx = bx + bw / 2
            tip = (f"{name} · {cat}: n={st['n']}, median {_pct(st['median'])}, IQR {_pct(st['q1'])}–"
                   f"{_pct(st['q3'])}, mean {_pct(st['mean'])}")
            parts = [
                f'<path d="M{_f(cx)} {_f(ymap(st["lo"]))}V{_f(ymap(st["q1"]))}M{_f(cx)} {_f(ymap(st["q3"]))}'
                f'V{_f(ymap(st["hi"]))}M{_f(cx - 4)} {_f(ymap(st["lo"]))}H{_f(cx + 4)}M{_f(cx - 4)} '
                f'{_f(ymap(st["hi"]))}H{_f(cx + 4)}" stroke="{color}" stroke-width="1.3" fill="none"/>',
                Svg.rect(bx + 2, ymap(st["q3"]), bw - 4, max(ymap(st["q1"]) - ymap(st["q3"]), 1.0), fill=color,
                         stroke="#102a43", title=tip).replace(f'fill="{color}"', f'fill="{color}" fill-opacity="0.55"'),
                f'<line x1="{_f(bx + 2)}" y1="{_f(ymap(st["median"]))}" x2="{_f(bx + bw - 2)}" '
                f'y2="{_f(ymap(st["median"]))}" stroke="#102a43" stroke-width="2"/>',
            ]
            outs = st["outliers"]
            if outs.size > MAX_OUTLIERS:
                keep = np.r_[outs[: MAX_OUTLIERS // 2], outs[-(MAX_OUTLIERS // 2):]]
                outs = keep
            for o in outs:
                parts.append(Svg.circle(cx, ymap(float(o)), 2.0, fill="none", stroke=color))
            svg.add(Svg.link(href, "".join(parts)))
        svg.text(gx + n_ser * bw / 2, y1 + 16, cat, size=10.5)
    return svg.render()


def line_chart(xlabels: Sequence[str], series: Sequence[tuple[str, str, Sequence[Metric | None], str | None]],
               title: str, *, ymax: float = 1.0, scale: float = 100.0, xtitle: str = "") -> str:
    """Lines with CI whiskers; series: (name, colour, one Metric per x, href of its examples)."""
    n = max(len(xlabels), 1)
    width = max(400.0, 90 + n * 60.0)
    svg = Svg(width, 0, title)
    svg.text(width / 2, 16, title, size=12.5, weight="600")
    top = _legend(svg, [(s[0], s[1]) for s in series], 50, 34, width - 10) + 14
    height = top + 230.0
    svg.h = height
    x0, y0, x1, y1 = 46.0, top, width - 16, height - 42
    ymap = _axes(svg, x0, y0, x1, y1, ymax, scale)
    step = (x1 - x0 - 30) / max(n - 1, 1)

    def xmap(i: int) -> float:
        return x0 + 15 + i * step

    for i, lab in enumerate(xlabels):
        svg.text(xmap(i), y1 + 15, lab, size=10.5)
    if xtitle:
        svg.text((x0 + x1) / 2, height - 6, xtitle, size=10, fill="#829ab1")
    for si, (name, color, metrics, href) in enumerate(series):
        off = (si - (len(series) - 1) / 2) * 3.0  # small horizontal offset so whiskers do not overlap
        pts = [(xmap(i) + off, m, m.value) for i, m in enumerate(metrics) if m is not None and m.value is not None]
        parts = []
        if len(pts) > 1:
            d = "M" + " L".join(f"{_f(x)} {_f(ymap(v))}" for x, _, v in pts)
            parts.append(f'<path d="{d}" stroke="{color}" stroke-width="2" fill="none"/>')
        for x, m, v in pts:
            if m.lo is not None and m.hi is not None and m.hi > m.lo:
                parts.append(f'<path d="M{_f(x)} {_f(ymap(m.lo))}V{_f(ymap(m.hi))}" stroke="{color}" '
                             f'stroke-width="1" stroke-opacity="0.7"/>')
            tip = f"{name}: {_pct(m.value)}" + (f" (95% CI {_pct(m.lo)}–{_pct(m.hi)})" if m.lo is not None else "")
            parts.append(Svg.circle(x, ymap(v), 3.5, fill=color, title=tip, stroke="#fff"))
        svg.add(Svg.link(href, "".join(parts)))
    return svg.render()


# ---------------------------------------------------------------------------------------------
# Report assembly


def _series(inputs: Sequence[ReportInput]) -> list[_Series]:
    raw = []
    for inp in inputs:
        run = inp.run
        for code, model in enumerate(run.models):
            dmask = (run.d_model == code) & run.valid
            if not np.any(run.d_model == code):
                continue
            raw.append((inp, model, code, dmask))
    names = [m for _, m, _, _ in raw]
    out = []
    for i, (inp, model, code, dmask) in enumerate(raw):
        label = model if names.count(model) == 1 else f"{model} · {inp.run.run}"
        s = _Series(sid=i, inp=inp, model=model, model_code=code, label=label, color=PALETTE[i % len(PALETTE)],
                    dmask=dmask)
        groups = [g for g in inp.run.aggregate(["model"]) if g.key["model"] == model]
        s.group = groups[0] if groups else None
        out.append(s)
    return out


class _Examples:
    """Example dialogues per (series, kind), and the set of dialogues to transcribe."""
    def __init__(self, per_group: int, max_transcripts: int):
        self.per_group = per_group
        self.max_transcripts = max_transcripts
        self.groups: dict[str, tuple[str, list[tuple[int, int, str]]]] = {}  # anchor → (title, [(inp, d, note)])
        self.order: list[str] = []
        self.chosen: dict[tuple[int, int], str] = {}  # (input index, dialogue) → anchor

    def add(self, anchor: str, title: str, inp_index: int, dialogues: Sequence[int], notes: Sequence[str] = ()) -> str:
        items = []
        for k, d in enumerate(dialogues[: self.per_group]):
            key = (inp_index, int(d))
            if key not in self.chosen and len(self.chosen) >= self.max_transcripts:
                continue
            self.chosen.setdefault(key, "")
            items.append((inp_index, int(d), notes[k] if k < len(notes) else ""))
        self.groups[anchor] = (title, items)
        self.order.append(anchor)
        return "#" + anchor


def dialogue_anchor(inp_index: int, dialogue_id: str) -> str:
    return f"d-{inp_index}-{slug(dialogue_id)}"


def build_report(inputs: Sequence[ReportInput], *, title: str | None = None, examples: int = 5,
                 max_transcripts: int = 150) -> str:
    """The HTML text of the report (see the module docstring)."""
    if not inputs:
        raise ArgumentError("no runs to report")
    for inp in inputs:
        if inp.chat_measured is None:
            inp.chat_measured = judges_measure_chat(inp)
    series = _series(inputs)
    ex = _Examples(examples, max_transcripts)
    index_of = {id(inp): i for i, inp in enumerate(inputs)}
    means = [dialogue_means(inp.run) for inp in inputs]
    hrefs = _choose_examples(inputs, series, ex, means, index_of)

    sections: list[tuple[str, str, str]] = []  # (anchor, heading, html)
    sections.append(("overview", "Overview", _overview(inputs)))
    sections.append(("leaderboard", "Leaderboard", _leaderboard(inputs, series, hrefs)))
    traces = _trace_section(series, hrefs)
    if traces:
        sections.append(("traces", "Action traces", traces))
    steps = _steps_section(series, hrefs)
    if steps:
        sections.append(("steps", "Procedure steps", steps))
    sections.append(("gap", "Execution gap", _gap_section(series, hrefs)))
    sections.append(("intensity", "By adversarial intensity", _intensity_section(inputs, series, means, hrefs,
                                                                                  index_of)))
    sections.append(("depth", "By turn depth", _depth_section(series, hrefs)))
    sections.append(("passk", "Reliability: pass^k", _passk_section(series, hrefs)))
    sections.append(("safety", "Safety", _safety_section(series, hrefs)))
    sections.append(("agreement", "Judge agreement", _agreement_section(inputs, series, hrefs)))
    sections.append(("coverage", "Coverage", _coverage_section(inputs, series, hrefs)))
    sections.append(("examples", "Example dialogues", _examples_section(inputs, ex)))
    sections.append(("transcripts", "Transcripts", _transcripts(inputs, ex, means)))

    body = "\n".join(f'<section id="{a}">\n<h2>{esc(h)}</h2>\n{content}\n</section>' for a, h, content in sections)
    nav = " ".join(f'<a href="#{a}">{esc(h)}</a>' for a, h, _ in sections)
    scen = sorted({s for inp in inputs for s in inp.run.scenario_names})
    runs = [inp.run.run for inp in inputs]
    page_title = title or f"sopgraph report — {', '.join(runs)}"
    subtitle = (f"runs: {', '.join(runs)} · scenarios: {', '.join(scen) or '–'} · "
                f"models: {', '.join(s.label for s in series)}")
    tpl = Template(_template("report.html"))
    return tpl.substitute(title=esc(page_title), subtitle=esc(subtitle), nav=nav, body=body,
                          css=_template("report.css"), version=esc(__version__))


def _template(name: str) -> str:
    return resources.files("sopgraph").joinpath("templates", "report", name).read_text(encoding="utf-8")


# -- example selection ------------------------------------------------------------------------


def _choose_examples(inputs, series: list[_Series], ex: _Examples, means, index_of) -> dict[str, str]:
    """Pick example dialogues for every figure; returns figure key → anchor href."""
    hrefs: dict[str, str] = {}
    for s in series:
        run = s.inp.run
        ii = index_of[id(s.inp)]
        d_all = np.flatnonzero(s.dmask)
        ids = [run.dialogues[d].id for d in d_all]
        order_id = d_all[np.argsort(np.array(ids, dtype=object), kind="stable")] if d_all.size else d_all

        def by_overall(ds: np.ndarray, worst: bool = True, run: ScoredRun = run) -> list[int]:
            vals = np.nan_to_num(run.d_overall, nan=-1.0)
            sign = 1.0 if worst else -1.0
            return sorted((int(d) for d in ds), key=lambda d: (sign * vals[d], run.dialogues[d].id))

        p = f"ex-s{s.sid}"
        cat = order_id[run.d_cat_turns[order_id] > 0]
        cat = cat[np.argsort(-run.d_revenue[cat], kind="stable")] if cat.size else cat
        hrefs[f"{s.sid}:catastrophic"] = ex.add(
            f"{p}-catastrophic", f"{s.label}: catastrophic failures (prohibited action taken)", ii, list(cat),
            [f"revenue at risk {run.d_revenue[d]:,.0f}" if run.d_revenue[d] else "" for d in cat])
        gap_rows = np.flatnonzero((run.t_act == 0) & (run.t_self == 1) & s.dmask[run.t_dlg])
        gap_d = _unique_in_order(run.t_dlg[gap_rows[np.argsort(run.t_dlg[gap_rows], kind="stable")]])
        gap_d = [d for d in order_id if d in set(gap_d)]
        hrefs[f"{s.sid}:gap"] = ex.add(f"{p}-gap", f"{s.label}: execution gap (wrong Action that is consistent "
                                                   "with the agent's own classification)", ii, gap_d)
        misperceive = np.flatnonzero((run.t_act == 0) & (run.t_self == 0) & s.dmask[run.t_dlg])
        mis_d = set(run.t_dlg[misperceive].tolist())
        hrefs[f"{s.sid}:inconsistent"] = ex.add(
            f"{p}-inconsistent", f"{s.label}: Action inconsistent with the agent's own classification", ii,
            [d for d in order_id if d in mis_d])
        for lvl, name in enumerate(INTENSITIES):
            ds = d_all[run.d_intensity[d_all] == lvl]
            fails = ds[~run.d_pass[ds]]
            chosen = by_overall(fails) or by_overall(ds)
            hrefs[f"{s.sid}:{name}"] = ex.add(f"{p}-{name}", f"{s.label}: {name}-intensity dialogues "
                                                             "(failures first, lowest overall first)", ii, chosen)
        longest = sorted(d_all.tolist(), key=lambda d: (-int(run.d_turns[d]), run.dialogues[d].id))
        hrefs[f"{s.sid}:long"] = ex.add(f"{p}-long", f"{s.label}: longest dialogues", ii, longest,
                                        [plural(int(run.d_turns[d]), "turn") for d in longest])
        flaky = []
        by_case: dict[int, list[int]] = {}
        for d in order_id:
            by_case.setdefault(int(run.d_case[d]), []).append(int(d))
        for ds in by_case.values():
            passes = [bool(run.d_pass[d]) for d in ds]
            if any(passes) and not all(passes):
                flaky.append(next(d for d in ds if not run.d_pass[d]))
                flaky.append(next(d for d in ds if run.d_pass[d]))
        hrefs[f"{s.sid}:flaky"] = ex.add(f"{p}-flaky", f"{s.label}: cases that pass on some trials and fail on "
                                                       "others (a failing and a passing trial each)", ii, flaky)
        must = order_id[(run.d_bucket[order_id] == BUCKETS.index("must-escalate")) & ~run.d_escalated[order_id]]
        hrefs[f"{s.sid}:missed"] = ex.add(f"{p}-missed", f"{s.label}: must-escalate cases not escalated", ii,
                                          list(must))
        over = order_id[(run.d_bucket[order_id] == BUCKETS.index("resolvable")) & ~run.d_expected_escalation[order_id]
                        & run.d_escalated[order_id]]
        hrefs[f"{s.sid}:over"] = ex.add(f"{p}-over", f"{s.label}: resolvable cases escalated", ii, list(over))
        fmt_d = set(run.t_dlg[run.t_format_error & s.dmask[run.t_dlg]].tolist())
        hrefs[f"{s.sid}:format"] = ex.add(f"{p}-format", f"{s.label}: dialogues with format errors", ii,
                                          [d for d in order_id if d in fmt_d])
        uns_d = set(run.t_dlg[(run.t_unscorable | (run.t_no_consensus > 0)) & s.dmask[run.t_dlg]].tolist())
        hrefs[f"{s.sid}:unscorable"] = ex.add(f"{p}-unscorable", f"{s.label}: turns without judge consensus or "
                                                                 "unscorable", ii, [d for d in order_id if d in uns_d])
        hrefs[f"{s.sid}:worst"] = ex.add(f"{p}-worst", f"{s.label}: lowest overall", ii, by_overall(d_all))
        hrefs[f"{s.sid}:best"] = ex.add(f"{p}-best", f"{s.label}: highest overall", ii, by_overall(d_all, False))
        first: dict[tuple, int] = {}
        count: dict[tuple, int] = {}
        for d in order_id:
            row = int(run.d_final_row[d])
            if row >= 0:
                key = (tuple(run.agent_path(row)), run.action_at(row) or "")
                first.setdefault(key, int(d))
                count[key] = count.get(key, 0) + 1
        walks = sorted(first, key=lambda k: (-count[k], k[1], k[0]))[: max(ex.per_group, 12)]
        hrefs[f"{s.sid}:paths"] = ex.add(
            f"{p}-paths", f"{s.label}: one dialogue per final path the agent reported (most frequent first)", ii,
            [first[k] for k in walks], [" > ".join(k[0]) + f" ⇒ {k[1] or '?'} ({count[k]} dialogues)" for k in walks])
    return hrefs


def _unique_in_order(values: np.ndarray) -> list[int]:
    seen: dict[int, None] = {}
    for v in values.tolist():
        seen.setdefault(int(v), None)
    return list(seen)


# -- sections ---------------------------------------------------------------------------------


def _overview(inputs: Sequence[ReportInput]) -> str:
    """One row per run: what was scored and how many items were excluded or could not be read."""
    cols = (("dialogues done", "done"), ("infra failures (excluded)", "infra_failures"), ("incomplete", "incomplete"),
            ("agent turns", "turns"), ("judged turns", "judged_turns"), ("unscorable turns", "unscorable_turns"),
            ("no-consensus fields", "no_consensus_fields"), ("unscored judgments", "unscored_judgments"),
            ("format errors", "format_errors"))
    rows = []
    for inp in inputs:
        run = inp.run
        c = run.counts
        hashes = ", ".join(sorted({s.source_hash for s in run.scenarios.values()}))
        rows.append(f"<tr><td class='l'>{esc(run.run)}</td><td class='l'>{esc(', '.join(run.scenario_names))}</td>"
                    f"<td class='l'><code>{esc(hashes)}</code></td><td class='l'>{esc(run.judgment_set or '–')}</td>"
                    + "".join(f"<td>{c.get(key, 0):,}</td>" for _, key in cols) + "</tr>")
    head = ("<tr><th class='l'>Run</th><th class='l'>Scenario</th><th class='l'>SOP</th><th class='l'>Judgment set</th>"
            + "".join(f"<th>{esc(name)}</th>" for name, _ in cols) + "</tr>")
    cfg = inputs[0].run.config
    return (f"<div class='tablewrap'><table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
            f"<p class='config'><b>Scoring configuration.</b> {esc(cfg.describe())}</p>"
            "<p class='note'>Scores are shown ×100 (SAGE's scale). ± values and whiskers are 95% cluster-bootstrap "
            "intervals over cases. Logic metrics compare the agent's JSON with the rule engine's reference "
            "computed from the judges' consensus labels and the case's system state; see docs/metrics.md.</p>")


def _cell(m: Metric | None, *, ci: bool = True, bad_above: float | None = None, n: bool = False) -> str:
    """A metric's table cell; `n` adds the number of units the rate is computed on."""
    if m is None or m.value is None:
        return f"<td>–{'<span class=ci>n=0</span>' if n and m is not None else ''}</td>"
    cls = ""
    if bad_above is not None and m.value > bad_above:
        cls = " class='num-bad'"
    text = _pct(m.value)
    if ci and m.lo is not None and m.hi is not None and m.hi > m.lo:
        text += f"<span class='ci'>±{(m.hi - m.lo) * 50:.1f}</span>"
    if n:
        text += f"<span class='ci'>n={m.n}</span>"
    return f"<td{cls}>{text}</td>"


def _value(m: Metric | None) -> float | None:
    return None if m is None else m.value


def _plain(m: Metric | None, digits: int = 0) -> str:
    return "–" if m is None or m.value is None else f"{m.value:,.{digits}f}"


def _leaderboard(inputs, series: list[_Series], hrefs: dict[str, str]) -> str:
    one_scenario = len({n for s in series for n in s.inp.run.scenario_names}) <= 1  # said in the subtitle
    head = ("<tr><th class='l'>Model</th>" + ("" if one_scenario else "<th class='l'>Scenario</th>")
            + "<th>Dialogues</th><th>Classification</th>"
            "<th>Path</th><th>Action</th><th>Finals</th><th>Logic</th><th>Chat</th><th>Overall</th>"
            "<th>Format err %</th><th>Chat len</th><th>pass^1</th><th>pass^k</th><th>Catastrophic</th><th>Cost tier</th>"
            "</tr>")
    rows = []
    for s in series:
        for g in s.inp.run.aggregate(["model", "scenario"]):
            if g.key["model"] != s.model:
                continue
            m = g.metrics
            pk = g.pass_k[-1] if g.pass_k else None
            cat = m.get("catastrophic_failures")
            rows.append(
                f"<tr><td class='l'><a href='{hrefs[f'{s.sid}:worst']}'>{esc(s.label)}</a></td>"
                + ("" if one_scenario else f"<td class='l'>{esc(g.key['scenario'])}</td>")
                + f"<td>{g.dialogues:,}</td>"
                + _cell(m.get("classification")) + _cell(m.get("path")) + _cell(m.get("action"))
                + _cell(m.get("finals")) + _cell(m.get("logic")) + _chat_cell(s.inp, m.get("chat"))
                + _cell(m.get("overall"))
                + _cell(m.get("format_error_rate"), ci=False)
                + f"<td>{_plain(m.get('chat_length'), 0)}</td>"
                + _cell(g.pass_k[0] if g.pass_k else None)
                + (f"<td>{_pct(pk.value)} <span class='ci'>k={len(g.pass_k)}</span></td>" if pk else "<td>–</td>")
                + f"<td><a href='{hrefs[f'{s.sid}:catastrophic']}'>{'–' if cat is None or cat.value is None else int(cat.value)}"
                  f"</a></td><td>{esc(g.cost_tier or '–')}</td></tr>")
    scope = ""
    if one_scenario and series:
        scope = f"All rows: scenario {esc(', '.join(series[0].inp.run.scenario_names))}. "
    if any(not _chat_ok(s.inp) for s in series):
        scope += ("Chat is not measured offline: the built-in judges give every reply the same score, so no "
                  "chat number is shown for their runs (their Overall still counts that fixed score). ")
    return (f"<div class='tablewrap'><table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
            f"<p class='note'>{scope}SAGE Table 1 columns plus reliability and safety. Model names link to their "
            "lowest-scoring dialogues; catastrophic counts link to those dialogues.</p>")


def _chat_cell(inp: ReportInput, m: Metric | None) -> str:
    return _cell(m) if _chat_ok(inp) else f"<td><span class='ci'>{NOT_MEASURED}</span></td>"


_TRACE_METRICS = ("trace_precision", "trace_recall", "trace_order", "journey_coverage", "tau2_pass")


def _groups_with(series: list[_Series], names: tuple[str, ...]) -> Iterator[tuple[_Series, Any]]:
    """(series, its model × scenario group) for the groups where any of the metrics `names` has a value."""
    for s in series:
        for g in s.inp.run.aggregate(["model", "scenario"]):
            m = g.metrics
            if g.key["model"] == s.model and any(m.get(k) is not None and m[k].value is not None for k in names):
                yield s, g


def _trace_section(series: list[_Series], hrefs: dict[str, str]) -> str:
    """Action-trace scores per model and scenario, or "" when no agent acted (SAGE-mode runs only)."""
    rows = []
    for s, g in _groups_with(series, _TRACE_METRICS):
        m = g.metrics
        pk = g.tau2_pass_k[-1] if g.tau2_pass_k else None
        rows.append(f"<tr><td class='l'><a href='{hrefs[f'{s.sid}:worst']}'>{esc(s.label)}</a></td>"
                    f"<td class='l'>{esc(g.key['scenario'])}</td>"
                    + "".join(_cell(m.get(k)) for k in _TRACE_METRICS)
                    + (f"<td>{_pct(pk.value)} <span class='ci'>k={len(g.tau2_pass_k)}</span></td>"
                       if pk and pk.value is not None else "<td>–</td>") + "</tr>")
    if not rows:
        return ""
    head = ("<tr><th class='l'>Model</th><th class='l'>Scenario</th><th>Precision</th><th>Recall</th>"
            "<th>Order</th><th>Journey</th><th>tau2 pass</th><th>tau2 pass^k</th></tr>")
    return (f"<div class='tablewrap'><table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
            "<p class='note'>The agent's actions (tool calls, or the actions it reported) against the rule engine's "
            "reference trace for the judged classification: precision and recall of the actions, order (longest "
            "common subsequence), journey coverage of the reference path's stages, and tau2-bench's pass (every "
            "required action with the right arguments, no prohibited action). Formulas in docs/metrics.md; rows "
            "only for agents with a trace.</p>")


_STEP_METRICS = ("step_recall", "step_precision", "step_order", "steps_followed", "end_state")


def _steps_section(series: list[_Series], hrefs: dict[str, str]) -> str:
    """Procedure-step scores per model and scenario, or "" when no agent acted through tools."""
    rows = []
    for s, g in _groups_with(series, _STEP_METRICS):
        m = g.metrics
        div = m.get("first_divergence")
        rows.append(f"<tr><td class='l'><a href='{hrefs[f'{s.sid}:worst']}'>{esc(s.label)}</a></td>"
                    f"<td class='l'>{esc(g.key['scenario'])}</td>"
                    + "".join(_cell(m.get(k)) for k in _STEP_METRICS[:4])
                    + (f"<td>{div.value:.1f}</td>" if div is not None and div.value is not None else "<td>–</td>")
                    + _cell(m.get("end_state")) + "</tr>")
    if not rows:
        return ""
    head = ("<tr><th class='l'>Model</th><th class='l'>Scenario</th><th>Recall</th><th>Precision</th><th>Order</th>"
            "<th>Followed</th><th>1st divergence (step)</th><th>End state</th></tr>")
    return (f"<div class='tablewrap'><table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
            "<p class='note'>A tool-acting agent's calls against the procedure stepped online: each next step is the "
            "engine session's answer given what the agent's own calls did to the world (the case-scripted backend, "
            "or the run's environment). Recall and precision of the steps with their arguments, order, the share of "
            "dialogues that never left the procedure, the mean step where the others first did (each dialogue page "
            "names it: expected vs done), and the end-state match (runs with an environment). Formulas in "
            "docs/metrics.md, \"Procedure steps\".</p>")


def _reports_labels(s: _Series) -> bool:
    """Whether an agent states its classification (SAGE JSON): the execution gap compares that reading with
    its action, so for an agent that only acts (through tools) it is not defined."""
    m = s.group.metrics if s.group is not None else {}
    return all(m.get(k) is not None and m[k].value is not None for k in ("classification", "action_self"))


def _gap_section(series: list[_Series], hrefs) -> str:
    shown = [s for s in series if _reports_labels(s)]
    left = [s for s in series if not _reports_labels(s)]
    skipped = (f"<p class='note'>Not shown for {esc(', '.join(s.label for s in left))}: "
               f"{'it reports' if len(left) == 1 else 'they report'} no classification of the conversation "
               "(an agent that acts through tools), so there is no reading of the SOP to compare its action "
               "with.</p>") if left else ""
    if not shown:
        return skipped
    cats = [(s.label, hrefs[f"{s.sid}:gap"]) for s in shown]
    ser = [("classification", METRIC_COLORS["classification"]), ("action (vs consensus)", METRIC_COLORS["action"]),
           ("action given own classification", METRIC_COLORS["action_self"])]
    values = {}
    for ci, s in enumerate(shown):
        if s.group is None:
            continue
        for si, key in enumerate(("classification", "action", "action_self")):
            values[(ci, si)] = s.group.metrics.get(key)
    svg = bar_chart(cats, ser, values, "Classification vs action accuracy")
    rows = "".join(
        f"<li><a href='{hrefs[f'{s.sid}:gap']}'>{esc(s.label)}: wrong Action consistent with its own labels</a> · "
        f"<a href='{hrefs[f'{s.sid}:inconsistent']}'>Action inconsistent with its own labels</a></li>" for s in shown)
    return (f"<div class='figs'><figure>{svg}</figure><div class='side'><p class='note'>SAGE's execution gap: "
            "models often classify the conversation right but still choose the wrong Action. The orange bar runs "
            "the rule engine on the agent's <i>own</i> labels: a high orange bar with a low blue one means the "
            "agent acts on what it perceives but perceives wrongly; a low orange bar means it does not follow its "
            "own reading of the SOP. Bars link to examples.</p><ul class='note'>" + rows + "</ul>" + skipped
            + "</div></div>")


def _intensity_section(inputs, series: list[_Series], means, hrefs, index_of) -> str:
    figs = []
    panels = (("overall", "Overall (per dialogue)"), ("logic", "Logic (per dialogue)"), ("chat", "Chat quality"),
              ("format", "Format-error rate"))
    ser = [(s.label, s.color) for s in series]
    for key, title in panels:
        data = {}
        if key == "chat" and not any(_chat_ok(s.inp) for s in series):
            figs.append(_not_measured_figure(title))
            continue
        for si, s in enumerate(series):
            if key == "chat" and not _chat_ok(s.inp):
                continue
            run = s.inp.run
            m = means[index_of[id(s.inp)]]
            if key == "overall":
                vals = run.d_overall
            elif key == "format":
                turns = np.bincount(run.t_dlg, minlength=len(run.dialogues)).astype(float)
                fmt = np.bincount(run.t_dlg, weights=run.t_format_error.astype(float), minlength=len(run.dialogues))
                with np.errstate(invalid="ignore", divide="ignore"):
                    vals = fmt / turns
            else:
                vals = m[key]
            for ci, lvl in enumerate(INTENSITIES):
                mask = s.dmask & (run.d_intensity == ci)
                if np.any(mask):
                    data[(ci, si)] = (vals[mask], hrefs[f"{s.sid}:{lvl}"])
        figs.append(f"<figure>{box_chart(list(INTENSITIES), ser, data, title)}</figure>")
    legend = " ".join(f"<span class='tag' style='background:{s.color};color:#fff'>{esc(s.label)}</span>"
                      for s in series)
    table = _intensity_table(series, hrefs)
    return (f"<p>{legend}</p><div class='figs'>{''.join(figs)}</div><p class='note'>Boxes: quartiles and median "
            "of per-dialogue values, whiskers 1.5·IQR, circles outliers (SAGE Fig. 5). Each box links to that "
            f"intensity's weakest dialogues.</p>{table}")


def _intensity_table(series: list[_Series], hrefs) -> str:
    rows = []
    for s in series:
        for g in s.inp.run.aggregate(["model", "intensity"]):
            if g.key["model"] != s.model:
                continue
            m = g.metrics
            lvl = g.key["intensity"]
            rows.append(f"<tr><td class='l'>{esc(s.label)}</td><td class='l'><a href='{hrefs[f'{s.sid}:{lvl}']}'>"
                        f"{esc(lvl)}</a></td><td>{g.dialogues:,}</td>" + _cell(m.get("overall")) + _cell(m.get("logic"))
                        + _chat_cell(s.inp, m.get("chat")) + _cell(m.get("action"))
                        + _cell(m.get("format_error_rate"), ci=False)
                        + _cell(m.get("pass_rate")) + _cell(m.get("catastrophic_rate"), ci=False) + "</tr>")
    head = ("<tr><th class='l'>Model</th><th class='l'>Intensity</th><th>Dialogues</th><th>Overall</th><th>Logic</th>"
            "<th>Chat</th><th>Action</th><th>Format err %</th><th>Pass</th><th>Catastrophic %</th></tr>")
    return f"<div class='tablewrap'><table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"


def _depth_section(series: list[_Series], hrefs) -> str:
    labels: list[str] = []
    per: dict[int, dict[str, GroupScore]] = {}
    for s in series:
        per[s.sid] = {g.key["depth"]: g for g in s.inp.run.aggregate(["model", "depth"]) if g.key["model"] == s.model}
        for k in per[s.sid]:
            if k not in labels:
                labels.append(k)
    order = [str(d) for d in series[0].inp.run.config.depths] + ["final"] if series else []
    labels = [x for x in order if x in labels]
    figs = []
    for key, title in (("overall", "Overall by turn"), ("logic", "Logic by turn"), ("chat", "Chat by turn")):
        shown = [s for s in series if key != "chat" or _chat_ok(s.inp)]
        if not shown:
            figs.append(_not_measured_figure(title))
            continue
        lines = [(s.label, s.color, [per[s.sid][x].metrics.get(key) if x in per[s.sid] else None for x in labels],
                  hrefs[f"{s.sid}:long"]) for s in shown]
        figs.append(f"<figure>{line_chart(labels, lines, title, xtitle='agent turn')}</figure>")
    return (f"<div class='figs'>{''.join(figs)}</div><p class='note'>Metrics on the agent's turns 1, 5, 10, 15 "
            "and the final turn (SAGE §4.5: information gain, then context fatigue). Points link to the longest "
            "dialogues.</p>")


def _not_measured_figure(title: str) -> str:
    """A panel in place of a chart of chat scores that are a constant (built-in judges)."""
    return (f"<figure class='empty'><figcaption><b>{esc(title)}</b></figcaption><p class='note'>{NOT_MEASURED}: "
            "the built-in judges give every reply the same chat score. Judge with a model "
            "(<code>--model judge=…</code>) to measure it.</p></figure>")


def _passk_section(series: list[_Series], hrefs) -> str:
    kmax = max((len(s.group.pass_k) for s in series if s.group), default=0)
    if kmax == 0:
        return "<p class='note'>No completed dialogues.</p>"
    labels = [str(k) for k in range(1, kmax + 1)]
    lines = [(s.label, s.color, list(s.group.pass_k) + [None] * (kmax - len(s.group.pass_k)) if s.group else [],
              hrefs[f"{s.sid}:flaky"]) for s in series]
    svg = line_chart(labels, lines, "pass^k: all k trials pass", xtitle="k (trials)")
    crit = series[0].inp.run.config.describe().split("pass = ")[1].split(";")[0] if series else ""
    return (f"<div class='figs'><figure>{svg}</figure><p class='note side'>Unbiased estimator C(c,k)/C(n,k) per "
            "case, averaged over cases (ResolveBench); k runs to the smallest number of completed trials. "
            f"Pass = {esc(crit)}. Infra failures are excluded. Points link to cases that pass on some trials and "
            "fail on others.</p></div>")


def _safety_section(series: list[_Series], hrefs) -> str:
    head = ("<tr><th class='l'>Model</th><th>Dialogues</th><th>Catastrophic failures</th><th>Catastrophic turns</th>"
            "<th>Revenue at risk</th><th>Adversarial safety</th><th>Escalation accuracy</th><th>Over-escalation</th>"
            "<th>Resolution</th><th>Tokens / 1k dlg</th><th>Cost / 1k dlg</th><th>Tier</th></tr>")
    rows = []
    for s in series:
        g = s.group
        if g is None:
            continue
        m = g.metrics
        cat = m.get("catastrophic_failures")
        rev = m.get("revenue_at_risk")
        tok = m.get("tokens_per_1k")
        cost = m.get("cost_per_1k")
        rows.append(
            f"<tr><td class='l'>{esc(s.label)}</td><td>{g.dialogues:,}</td>"
            f"<td class='{'num-bad' if cat and cat.value else 'num-good'}'><a href='{hrefs[f'{s.sid}:catastrophic']}'>"
            f"{int(cat.value) if cat and cat.value is not None else '–'}</a></td>"
            f"<td>{g.counts.get('catastrophic_turns', 0)}</td>"
            f"<td>{'–' if rev is None or rev.value is None else f'{rev.value:,.0f}'}"
            f"{'' if rev is None or rev.value is None else _unit_suffix(s.inp.run)}</td>"
            + _cell(m.get("adversarial_safety"), n=True)
            + f"<td><a href='{hrefs[f'{s.sid}:missed']}'>{_pct(_value(m.get('escalation_accuracy')))}</a></td>"
            + f"<td><a href='{hrefs[f'{s.sid}:over']}'>{_pct(_value(m.get('over_escalation')))}</a></td>"
            + _cell(m.get("resolution_rate"))
            + f"<td>{'–' if tok is None or tok.value is None else f'{tok.value:,.0f}'}</td>"
            + f"<td>{'–' if cost is None or cost.value is None else f'${cost.value:,.2f}'}</td>"
            + f"<td>{esc(g.cost_tier or '–')}</td></tr>")
    return (f"<div class='tablewrap'><table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
            "<p class='note'>A catastrophic failure is a turn whose Action is one of the case's prohibited actions "
            "(risky actions other than the reference); the count is of dialogues with at least one. Revenue at risk "
            "sums the scenario's money variable over those dialogues, in the unit its <code>.sop</code> declares. Adversarial safety: share of trap cases "
            "(the user pushes for an unsafe action) with no catastrophic failure. Escalation accuracy: must-escalate "
            "cases handed over; over-escalation: resolvable cases handed over. Deterministic signals: no judge is "
            "involved (SupportAgentBench).</p>")


def money_units(run: ScoredRun) -> list[str]:
    """Units of the money variables summed as revenue at risk (from the `.sop` `unit "…"` declarations)."""
    units = set()
    for scenario in run.scenarios.values():
        name = scenario.money_variable
        var = scenario.variables.get(name) if name else None
        if var is not None:
            units.add(var.unit or "(no unit declared)")
    return sorted(units)


def _unit_suffix(run: ScoredRun) -> str:
    units = money_units(run)
    if not units:
        return ""
    if len(units) > 1:
        return f" <span class='unit'>{esc(' + '.join(units))} (mixed)</span>"
    return f" <span class='unit'>{esc(units[0])}</span>"


def _agreement_section(inputs, series: list[_Series], hrefs) -> str:
    """One table pair per distinct agreement: runs judged alike (same judges, same verdicts, e.g. the
    offline truth judges) share one table instead of repeating it per run."""
    groups: dict[str, list[str]] = {}  # table html → runs
    links: dict[str, list[str]] = {}
    for inp in inputs:
        run = inp.run
        fields = sorted({v.name for s in run.scenarios.values() for v in s.fields})
        agent_model = run.models[0] if len(run.models) == 1 else None
        try:
            ag = agreement(inp.judgments, fields, agent_model=agent_model, judgment_set=run.judgment_set,
                           consensus_rows=inp.consensus)
            field_rows = [(name, fa.items, fa.kappa, fa.observed, fa.no_consensus) for name, fa in ag.fields.items()]
            dims = [(d, sp.items, sp.mean_abs_dev, sp.mean_range) for d, sp in ag.dimensions.items()]
            judges = ", ".join(f"{r}: {m}" for r, m in ag.judges.items())
            selfpref = ag.self_preference
        except ImportError:  # pragma: no cover - judge module always present in the package
            field_rows, dims, judges, selfpref = _agreement_fallback(inp, fields)
        rows = "".join(
            f"<tr><td class='l'>{esc(n)}</td><td>{items}</td><td>{'–' if k is None else f'{k:.3f}'}</td>"
            f"<td>{'–' if o is None else f'{o:.3f}'}</td><td>{nc}</td></tr>" for n, items, k, o, nc in field_rows)
        drows = "".join(
            f"<tr><td class='l'>{esc(d)}</td><td>{items}</td><td>{'–' if mad is None else f'{mad:.2f}'}</td>"
            f"<td>{'–' if rng is None else f'{rng:.2f}'}</td></tr>" for d, items, mad, rng in dims)
        warn = (f"<p class='num-bad'>Self-preference risk: {esc(', '.join(selfpref))} judge with the agent's "
                "model.</p>") if selfpref else ""
        table = (
            f"<p class='note'>judgment set {esc(run.judgment_set or '–')} · judges: {esc(judges or '–')}</p>{warn}"
            "<div class='figs'><div class='tablewrap'><table><thead><tr>"
            "<th class='l'>Field</th><th>Turns</th><th>Fleiss' κ</th><th>Observed agreement</th><th>No consensus</th>"
            f"</tr></thead><tbody>{rows}</tbody></table></div><div class='tablewrap'><table><thead><tr>"
            "<th class='l'>Chat dimension</th><th>Turns</th><th>Mean abs. deviation</th><th>Mean range</th></tr>"
            f"</thead><tbody>{drows}</tbody></table></div></div>")
        groups.setdefault(table, []).append(run.run)
        nc_href = next((hrefs[f"{sr.sid}:unscorable"] for sr in series if sr.inp is inp), "#examples")
        links.setdefault(table, []).append(f"<a href='{nc_href}'>{esc(run.run)}</a>")
    out = []
    for table, runs in groups.items():
        head = "run " + runs[0] if len(runs) == 1 else f"{len(runs)} runs with identical agreement: {', '.join(runs)}"
        out.append(f"<h3>{esc(head)}</h3>{table}<p class='note'>Turns without consensus: "
                   f"{' · '.join(links[table])}.</p>")
    out.append("<p class='note'>κ is undefined (–) when every judge always gives the same label.</p>")
    return "\n".join(out)


def _agreement_fallback(inp: ReportInput, fields: Sequence[str]):

    by_turn: dict[tuple[str, int], list[Judgment]] = {}
    for j in inp.judgments:
        by_turn.setdefault((j.dialogue_id, j.turn_index), []).append(j)
    rows = []
    for f in fields:
        items = [[j.labels.get(f) for j in js if j.labels is not None] for js in by_turn.values()]
        items = [x for x in items if len(x) >= 2 and all(v is not None for v in x)]
        k = fleiss_kappa(items)
        rows.append((f, len(items), None if math.isnan(k) else k, None, 0))
    return rows, [], "", []


def _coverage_section(inputs, series: list[_Series], hrefs) -> str:
    """One table for every run, then per run and scenario the heat graph at its natural size (readable
    labels) with the uncovered items beside it; only the first graph is open, the others one click away."""
    rows: list[str] = []
    blocks: list[str] = []
    seen_cases: dict[str, tuple] = {}
    for inp in inputs:
        run = inp.run
        for name, scenario in run.scenarios.items():
            if name not in inp.coverage:
                continue
            exp, agents = inp.coverage[name]
            exp_key = (exp.walks, exp.invalid_walks, exp.node_counts, exp.edge_counts, exp.path_counts)
            sides = [agents]
            if seen_cases.get(name) != exp_key:  # the cases row once while runs share their cases
                seen_cases[name] = exp_key
                sides.insert(0, exp)
            for side in sides:
                rows.append(
                    f"<tr><td class='l'>{esc(run.run if side is agents else '(cases)')}</td><td class='l'>{esc(name)}"
                    f"</td><td class='l'>{esc(side.source)}</td><td>{side.walks:,}</td><td>{side.invalid_walks:,}</td>"
                    f"<td>{side.nodes_covered}/{side.nodes_total}</td><td>{side.edges_covered}/{side.edges_total}</td>"
                    f"<td>{side.paths_covered}/{side.paths_total}{'' if side.paths_exact else ' (≥)'}</td></tr>")
            blocks.append(_coverage_block(inp, series, hrefs, scenario, name, agents, open_=not blocks))
    if not rows:
        return "<p class='note'>No coverage: the report was built without the runs' stores.</p>"
    head = ("<tr><th class='l'>Run</th><th class='l'>Scenario</th><th class='l'>Walks of</th><th>Walks</th>"
            "<th>Invalid</th><th>Nodes</th><th>Edges</th><th>Paths</th></tr>")
    return (f"<div class='tablewrap'><table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"
            "<p class='note'>Cases: the expected paths of the test cases; agents: the final-turn paths agents "
            "reported. The graphs colour each stage and branch by how often agents' final-turn paths crossed it "
            "(darker blue = more); dashed grey items were never traversed. A graph links to one example "
            "dialogue per traversed path.</p>" + "".join(blocks))


def _coverage_block(inp: ReportInput, series: list[_Series], hrefs, scenario, name: str, agents,
                    *, open_: bool) -> str:
    run = inp.run
    lists = ""
    for title, items in (("stages and actions never reached", agents.uncovered_nodes),
                         ("branches never taken", agents.uncovered_edges),
                         ("paths never walked", agents.uncovered_paths)):
        if items:
            shown = "".join(f"<li>{esc(x)}</li>" for x in items[:20])
            more = f"<li>… {len(items) - 20} more</li>" if len(items) > 20 else ""
            lists += f"<div><b>{esc(title)}</b> ({len(items)})<ul>{shown}{more}</ul></div>"
    if agents.invalid_examples:
        lists += ("<div><b>invalid walks</b> (not a path of the graph), e.g.<ul>"
                  + "".join(f"<li>{esc(x)}</li>" for x in agents.invalid_examples[:5]) + "</ul></div>")
    lists = lists or "<p>Every stage, branch and path was traversed.</p>"
    try:
        svg = _inline_svg(render_coverage(scenario, agents, "svg").decode("utf-8"))
        link = next((hrefs[f"{sr.sid}:paths"] for sr in series if sr.inp is inp), "#examples")
        graph = f"<div class='graph'><a href='{esc(link)}'>{svg}</a></div>"
    except RenderError as exc:
        graph = f"<p class='note'>Graph not drawn: {esc(exc)}</p>"
    summary = (f"{run.run} · {name}: agents reached {agents.nodes_covered}/{agents.nodes_total} stages and actions, "
               f"{agents.edges_covered}/{agents.edges_total} branches, {agents.paths_covered}/{agents.paths_total} "
               "paths")
    return (f"<details class='block'{' open' if open_ else ''}><summary>{esc(summary)}</summary>"
            f"<div class='covgrid'>{graph}<div class='covside'>{lists}</div></div></details>")


def _inline_svg(svg: str) -> str:
    """Graphviz SVG without the XML prolog/doctype (inline SVG in HTML needs neither)."""
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    svg = re.sub(r"<!--.*?-->", "", svg, flags=re.S)
    return svg.strip()


def _examples_section(inputs, ex: _Examples) -> str:
    """Example lists per model, folded (a link from a figure opens its list: browsers open the <details>
    around a link target)."""
    out = ["<p class='note'>Every figure links here; each entry links to its transcript below.</p>"]
    owners: dict[str, list[str]] = {}
    empty: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    for anchor in ex.order:
        title, items = ex.groups[anchor]
        owner, _, kind = title.partition(": ")
        blocks = owners.setdefault(owner, [])
        empty.setdefault(owner, [])
        if not items:
            empty[owner].append(kind)
            blocks.append(f"<div id='{anchor}' class='exempty'></div>")
            continue
        lis = []
        for ii, d, note in items:
            run = inputs[ii].run
            dlg = run.dialogues[d]
            ok = bool(run.d_pass[d])
            lis.append(f"<li><a href='#{dialogue_anchor(ii, dlg.id)}'>{esc(dlg.id)}</a>"
                       f"<span class='tag {'good' if ok else 'bad'}'>{'pass' if ok else 'fail'}</span>"
                       f"{(' <span class=note>' + esc(note) + '</span>') if note else ''}</li>")
        counts[owner] = counts.get(owner, 0) + len(items)
        blocks.append(f"<div id='{anchor}' class='exgroup'><h4>{esc(kind)}</h4><ul>{''.join(lis)}</ul></div>")
    for owner, blocks in owners.items():
        n_lists = len(blocks) - len(empty[owner])
        note = f"<p class='note'>No examples: {esc('; '.join(empty[owner]))}.</p>" if empty[owner] else ""
        out.append(f"<details class='block'><summary>{esc(owner)} — {plural(n_lists, 'list')}, "
                   f"{plural(counts.get(owner, 0), 'entry', 'entries')}</summary>{note}"
                   f"<div class='examples'>{''.join(blocks)}</div></details>")
    return "\n".join(out)


def _transcripts(inputs, ex: _Examples, means) -> str:
    """The chosen dialogues, one folded line each, grouped by model; a link opens and scrolls to one."""
    groups: dict[str, list[str]] = {}
    keys = sorted(ex.chosen, key=lambda k: (k[0], inputs[k[0]].run.dialogues[k[1]].id))
    for ii, d in keys:
        inp = inputs[ii]
        run = inp.run
        dlg = run.dialogues[d]
        case = run.case_of(d)
        turns = {t.index: t for t in inp.turns_of(dlg.id)}
        rows = {int(run.t_index[r]): int(r) for r in run.turn_rows(d)}
        label = f"{run.run} · {run.model_of(d)}"
        groups.setdefault(label, []).append(_dialogue_html(ii, run, d, dlg.id, case, turns, rows, _chat_ok(inp)))
    if not groups:
        return "<p class='note'>No dialogues.</p>"
    return ("<p class='note'>Each line opens its transcript: user, agent, and what was scored per turn.</p>"
            + "".join(f"<h3>{esc(label)}</h3><div class='tgrid'>{''.join(items)}</div>"
                      for label, items in groups.items()))


def _dialogue_html(ii: int, run: ScoredRun, d: int, did: str, case: Case | None, turns: dict[int, Turn],
                   rows: dict[int, int], chat_ok: bool = True) -> str:
    ok = bool(run.d_pass[d])
    tags = [f"<span class='tag {'good' if ok else 'bad'}'>{'pass' if ok else 'fail'}</span>"]
    if run.d_cat_turns[d]:
        tags.append("<span class='tag bad'>catastrophic</span>")
    if run.d_escalated[d]:
        tags.append("<span class='tag warn'>escalated</span>")
    meta = [f"model {esc(run.model_of(d))}", f"trial {run.dialogues[d].trial}", plural(int(run.d_turns[d]), "turn"),
            f"end: {esc(run.dialogues[d].end_reason or '–')}", f"overall {_pct(float(run.d_overall[d]))}"]
    if case is not None:
        meta += [f"case {esc(case.id)}", f"intent {esc(case.intent)}", f"persona {esc(case.persona.name)}",
                 f"intensity {esc(case.intensity)}", f"bucket {esc(case.bucket)}",
                 f"expected {esc(' > '.join(case.expected_path))} ⇒ {esc(case.expected_finals.get('Action'))}"]
        if case.prohibited_actions:
            meta.append(f"prohibited {esc(', '.join(case.prohibited_actions))}")
        if case.unsafe_action:
            meta.append(f"user pushes for {esc(case.unsafe_action)}")
    divergence = run.divergence_text(d)
    if divergence:
        meta.append(f"left the procedure at {esc(divergence)}")
        tags.append("<span class='tag bad'>left the procedure</span>")
    brief = [plural(int(run.d_turns[d]), "turn"), f"overall {_pct(float(run.d_overall[d]))}"]
    if case is not None:
        brief += [esc(case.intensity), esc(case.intent)]
    parts = [f"<details><summary><b>{esc(did)}</b>{''.join(tags)} <span class='meta'>· {' · '.join(brief)}</span>"
             f"</summary><div class='dialogue' id='{dialogue_anchor(ii, did)}'>"
             f"<div class='meta'>{' · '.join(meta)}</div>"]
    for idx in sorted(set(turns) | set(rows)):
        t = turns.get(idx)
        r = rows.get(idx)
        user = esc(t.user_text) if t else ""
        if t is not None and (t.format_error or t.output is None):
            agent = f"<div class='agent err'>format error{': ' + esc(t.format_note) if t.format_note else ''}\n" \
                    f"{esc(t.agent_raw[:1500])}</div>"
        else:
            agent = f"<div class='agent'>{esc(t.output.chat) if t and t.output else ''}</div>"
        score = ""
        if r is not None:
            rec = run.turn_record(r)
            own = ""
            if t is not None and t.output is not None:
                labels = ", ".join(f"{k}={v}" for k, v in sorted(t.output.classification_output.items()))
                own = (f"<div>agent: <code>{esc(' > '.join(map(str, t.output.now_path)))} ⇒ "
                       f"{esc(t.output.finals.get('Action'))}</code></div><div>labels: <code>{esc(labels)}</code></div>")
            ref = ("<div>reference: <code>" + esc(" > ".join(rec["reference_path"] or [])) + " ⇒ "
                   + esc(rec["reference_action"] or "(asks: a value is not shown yet)") + "</code></div>") \
                if rec["reference_action"] or rec["reference_waits"] else \
                ("<div class='note'>reference: " + ("unscorable (no consensus on a needed field)" if rec["unscorable"]
                                                   else "judged" if rec["judged"] else "not judged") + "</div>")
            flags = ""
            if rec["catastrophic"]:
                flags += "<span class='tag bad'>prohibited action</span>"
            if rec["selected"]:
                flags += "<span class='tag'>scored</span>"
            score = (own + ref + f"<div>cls {_pct(rec['classification'] if rec['classification'] is not None else math.nan)}"
                     f" · path {_pct(rec['path'] if rec['path'] is not None else math.nan)}"
                     f" · action {_pct(rec['action_acc'] if rec['action_acc'] is not None else math.nan, 0)}"
                     f" · logic {_pct(rec['logic'] if rec['logic'] is not None else math.nan)}"
                     f" · chat {_pct(rec['chat'] if rec['chat'] is not None else math.nan) if chat_ok else NOT_MEASURED}"
                     f" {flags}</div>")
        parts.append(f"<div class='turn'><div class='idx'>#{idx}</div><div class='user'>{user}</div>{agent}"
                     f"<div class='score'>{score}</div></div>")
    parts.append("<div class='back'><a href='#examples'>↑ examples</a></div></div></details>")
    return "".join(parts)
