// sop view: the page of the read-only run browser. Plain DOM, no framework, no build step.
// Every piece of run data is put in the page with textContent (never innerHTML): transcripts are
// free text written by models and users.
"use strict";

const FILTERS = ["pass", "failure", "intensity", "path_id", "bucket", "metric", "min", "max", "sort", "order", "q"];
const PERCENT = new Set(["overall", "logic", "chat", "classification", "path", "action", "finals",
  "trace_precision", "trace_recall", "trace_order", "journey_coverage", "step_recall", "step_precision",
  "step_order", "end_state"]);
const state = { runs: [], run: null, summary: null, query: {}, offset: 0, limit: 100, dialogue: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setContent(node, ...children) {
  node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

async function api(path) {
  const res = await fetch(path, { method: "GET", headers: { Accept: "application/json" } });
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

const runPath = (name) => "/api/runs/" + encodeURIComponent(name);
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1));
const fmtMetric = (name, x) => (x === null || x === undefined ? "–" : PERCENT.has(name) ? pct(x) : String(x));

// ------------------------------------------------------------------ URL state (#run=..&d=..&pass=..)
function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const query = {};
  for (const key of FILTERS) if (params.get(key)) query[key] = params.get(key);
  return { run: params.get("run"), dialogue: params.get("d"), offset: Number(params.get("offset") || 0), query };
}

function writeHash() {
  const params = new URLSearchParams();
  if (state.run) params.set("run", state.run);
  for (const [k, v] of Object.entries(state.query)) if (v) params.set(k, v);
  if (state.offset) params.set("offset", String(state.offset));
  if (state.dialogue) params.set("d", state.dialogue);
  history.replaceState(null, "", "#" + params.toString());
}

// ------------------------------------------------------------------ runs and summary
async function loadRuns() {
  const data = await api("/api/runs");
  state.runs = data.runs;
  const nav = document.getElementById("runs");
  nav.replaceChildren(...data.runs.map((r) => el("a", {
    href: "#run=" + encodeURIComponent(r.name), "data-run": r.name,
    onclick: (ev) => { ev.preventDefault(); selectRun(r.name, {}, 0, null); },
  }, r.name)));
  if (data.notes && data.notes.length) nav.append(el("div", { class: "warn" }, data.notes.join("; ")));
}

function runListTable() {
  const rows = state.runs.map((r) => el("tr", { onclick: () => selectRun(r.name, {}, 0, null) },
    el("td", {}, el("a", { href: "#run=" + encodeURIComponent(r.name) }, r.name)),
    el("td", {}, r.scenario || "–"), el("td", {}, r.agent || "–"),
    el("td", { class: "n" }, r.dialogues ?? "–"), el("td", { class: "n" }, r.turns ?? "–"),
    el("td", {}, r.error ? el("span", { class: "error" }, r.error)
      : Object.entries(r.by_status || {}).map(([k, v]) => `${k} ${v}`).join(", ")),
    el("td", {}, (r.judgment_sets || []).join(", ") || "not judged")));
  return el("table", { class: "runlist" },
    el("thead", {}, el("tr", {}, ["run", "scenario", "agent", "dialogues", "turns", "status", "judgment sets"]
      .map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}

async function selectRun(name, query, offset, dialogue) {
  state.run = name;
  state.query = query;
  state.offset = offset;
  state.dialogue = dialogue;
  for (const a of document.querySelectorAll("nav#runs a")) a.classList.toggle("on", a.dataset.run === name);
  document.getElementById("summary").replaceChildren(el("p", { class: "note" }, "Scoring " + name + "…"));
  try {
    state.summary = await api(runPath(name) + "/summary");
  } catch (err) {
    document.getElementById("summary").replaceChildren(el("p", { class: "error" }, String(err.message)));
    return;
  }
  renderSummary();
  setupFilters();
  await loadPage();
  if (dialogue) await openDialogue(dialogue);
  else closeDetail();
}

function renderSummary() {
  const s = state.summary;
  const c = s.counts;
  const cards = [["dialogues", c.dialogues], ["turns", c.turns], ["format errors", c.format_errors],
    ["infra failures", (c.infra_failures || []).length]];
  const scoreCards = [];
  for (const [model, m] of Object.entries(s.scores)) {
    for (const key of ["overall", "pass_rate", "pass^1", "action", "path", "classification", "catastrophic_failures",
      "tau2_pass"]) {
      if (m[key] === undefined || m[key] === null) continue;
      const value = key === "catastrophic_failures" ? String(m[key]) : pct(m[key]);
      scoreCards.push(el("div", { class: "card" }, el("b", {}, value),
        el("span", {}, key.replace(/_/g, " ") + (Object.keys(s.scores).length > 1 ? " · " + model : ""))));
    }
  }
  const models = Object.entries(s.models).map(([role, model]) => [role + " ", el("b", {}, model), "  "]);
  setContent(document.getElementById("summary"),
    el("h2", {}, s.name + (s.scenario ? " — " + s.scenario : "")),
    el("div", { class: "kv" }, models),
    el("div", { class: "kv" }, "status ", el("b", {}, Object.entries(c.by_status).map(([k, v]) => `${k} ${v}`).join(", ")),
      "  judgment set ", el("b", {}, s.judgment_set || "none"), "  sop ", el("b", {}, s.sop_hash || "–"),
      "  created ", el("b", {}, s.created || "–")),
    el("div", { class: "cards" }, cards.map(([k, v]) => el("div", { class: "card" }, el("b", {}, v ?? "–"),
      el("span", {}, k))), scoreCards),
    el("div", { id: "notes" }, s.notes.map((n) => el("p", { class: "warn" }, n)),
      s.scored ? null : el("p", { class: "warn" }, "This run is not scored: rows show what the store holds.")));
}

function options(select, items, allLabel) {
  select.replaceChildren(el("option", { value: "" }, allLabel),
    ...items.map(([value, count]) => el("option", { value }, count === undefined ? value : `${value} (${count})`)));
}

function setupFilters() {
  const s = state.summary;
  const form = document.getElementById("filter-form");
  options(form.elements.failure, [...s.facets.failure, ["none", undefined]], "any");
  options(form.elements.intensity, s.facets.intensity, "all");
  options(form.elements.path_id, s.facets.path_id, "all");
  options(form.elements.bucket, s.facets.bucket, "all");
  options(form.elements.metric, s.metrics.map((m) => [m, undefined]), "overall");
  options(form.elements.sort, s.metrics.map((m) => [m, undefined]), "dialogue id");
  for (const key of FILTERS) {
    let value = state.query[key] || "";
    if ((key === "min" || key === "max") && value !== "" && state.query.metric !== "turns") value = String(Number(value) * 100);
    form.elements[key].value = value;
  }
  document.getElementById("filters").hidden = false;
}

function readFilters() {
  const form = document.getElementById("filter-form");
  const query = {};
  for (const key of FILTERS) {
    let value = form.elements[key].value.trim();
    if (!value) continue;
    if ((key === "min" || key === "max") && form.elements.metric.value !== "turns") value = String(Number(value) / 100);
    query[key] = value;
  }
  if (query.order === "asc") delete query.order;
  return query;
}

// ------------------------------------------------------------------ the dialogue list
async function loadPage() {
  const params = new URLSearchParams(state.query);
  params.set("offset", String(state.offset));
  params.set("limit", String(state.limit));
  const list = document.getElementById("list");
  let page;
  try {
    page = await api(runPath(state.run) + "/dialogues?" + params.toString());
  } catch (err) {
    list.replaceChildren(el("p", { class: "error" }, String(err.message)));
    return;
  }
  writeHash();
  const metric = state.query.sort || state.query.metric || "overall";
  const head = [["dialogue"], ["intensity"], ["path"], ["bucket", "opt"], ["verdict"], ["overall"],
    [metric !== "overall" ? metric : "path", "opt"], ["action (ref)"], ["turns", "opt"], ["failures"]];
  const rows = page.rows.map((r) => {
    const extra = metric !== "overall" ? metric : "path";
    const action = r.final_action === null ? "–" : r.final_action;
    return el("tr", { "data-id": r.id, class: r.id === state.dialogue ? "sel" : null, onclick: () => openDialogue(r.id) },
      el("td", {}, r.id), el("td", {}, r.intensity || "–"), el("td", { title: (r.reference_path || []).join(" → ") }, r.path_id || "–"),
      el("td", { class: "opt" }, r.bucket || "–"),
      el("td", {}, r.pass === null ? el("span", { class: "note" }, r.status)
        : el("span", { class: r.pass ? "ok" : "bad" }, r.pass ? "pass" : "fail")),
      el("td", { class: "n" }, pct(r.metrics.overall)), el("td", { class: "n opt" }, fmtMetric(extra, r.metrics[extra])),
      el("td", {}, el("span", { class: r.final_action && r.final_action !== r.reference_action ? "bad" : null }, action),
        el("span", { class: "note" }, " (" + (r.reference_action || "–") + ")")),
      el("td", { class: "n opt" }, r.turns),
      el("td", { class: "fail-kinds" }, r.failures.filter((f) => f !== "failed").map((f) => el("span", {
        class: ["unsafe_action", "wrong_action", "format_error", "infra_failure"].includes(f) ? "tag" : "tag mild",
      }, f.replace(/_/g, " ")))));
  });
  const last = Math.min(page.offset + page.rows.length, page.matched);
  const pager = el("div", { class: "pager" },
    el("button", { disabled: page.offset === 0, onclick: () => { state.offset = Math.max(0, page.offset - page.limit); loadPage(); } }, "‹ prev"),
    el("span", {}, page.matched ? `${page.offset + 1}–${last} of ${page.matched} matching` : "no dialogue matches",
      page.matched !== page.total ? ` (${page.total} in the run)` : ""),
    el("button", { disabled: last >= page.matched, onclick: () => { state.offset = page.offset + page.limit; loadPage(); } }, "next ›"));
  list.replaceChildren(pager, el("table", { id: "dialogues" },
    el("thead", {}, el("tr", {}, head.map(([h, cls]) => el("th", { class: cls }, h)))), el("tbody", {}, rows)));
}

// ------------------------------------------------------------------ one transcript
function chips(path, other, cls) {
  const set = new Set(other || []);
  return el("div", { class: "chips" }, path.length ? path.map((step) => el("span", {
    class: "chip" + (other && !set.has(step) ? " " + cls : ""), title: state.summary.stages[step] || null,
  }, step)) : el("span", { class: "note" }, "none"));
}

function traceChips(trace, other, cls) {
  const names = new Set((other || []).map((c) => c.name));
  return el("div", { class: "chips" }, trace.length ? trace.map((c) => el("span", {
    class: "chip act" + (other && !names.has(c.name) ? " " + cls : ""),
  }, c.name + (Object.keys(c.args || {}).length ? "(" + Object.entries(c.args).map(([k, v]) => `${k}=${v}`).join(", ") + ")" : "")))
    : el("span", { class: "note" }, "none"));
}

function sidePanel(title, side, other, cls) {
  const finals = Object.entries(side.finals || {}).map(([k, v]) => `${k} = ${v}`).join(", ");
  return el("div", { class: "side-" + title.toLowerCase().split(" ")[0] }, el("h3", {}, title),
    el("div", { class: "note" }, "path"), chips(side.path, other ? other.path : null, cls),
    el("div", { class: "note" }, "action trace"), traceChips(side.trace, other ? other.trace : null, cls),
    el("div", { class: "note" }, "finals: " + (finals || "–")));
}

function prettyRaw(raw) {
  try {
    return JSON.stringify(JSON.parse(raw), null, 2);
  } catch (err) {
    return raw || "(empty)";
  }
}

function turnBlock(t, lastTurn) {
  const out = t.output;
  const agent = out
    ? el("div", { class: "bubble agent" }, el("span", { class: "who" }, "agent · turn " + t.index), out.chat || "(no chat text)")
    : el("div", { class: "bubble agent err" }, el("span", { class: "who" }, "agent · turn " + t.index + " · format error"),
      t.agent_raw || "(empty reply)");
  const s = t.scores;
  const scoreLine = s ? el("div", { class: "scores" },
    `overall ${pct(s.overall)} · classification ${pct(s.classification)} · path ${pct(s.path)} · action ${pct(s.action_acc)}`
    + ` · chat ${pct(s.chat)}` + (s.catastrophic ? " · CATASTROPHIC" : "") + (s.unscorable ? " · unscorable" : "")
    + (s.reference_action ? ` · judges' reference ${s.reference_action}` : "")) : null;
  const pathLine = out && out.now_path && out.now_path.length
    ? el("div", { class: "scores" }, "agent path: " + out.now_path.join(" → ")) : null;
  const calls = out && out.tool_calls && out.tool_calls.length
    ? el("div", { class: "scores" }, "tool calls: " + out.tool_calls.map((c) => c.name).join(", ")) : null;
  return el("div", { class: "turn", "data-turn": t.index },
    el("div", { class: "bubble user" }, el("span", { class: "who" }, "user"), t.user_text),
    agent, pathLine, calls, scoreLine,
    el("details", { open: t.index === lastTurn }, el("summary", {}, "agent JSON" + (t.format_note ? " (" + t.format_note + ")" : "")),
      el("pre", { class: "json" }, out ? JSON.stringify(out, null, 2) : t.agent_raw)),
    out ? el("details", {}, el("summary", {}, "raw reply" + (out.source === "tools" ? " (tool calls and results)" : "")),
      el("pre", { class: "json" }, prettyRaw(t.agent_raw))) : null,
    t.consensus ? el("details", {}, el("summary", {}, "judges' consensus"),
      el("pre", { class: "json" }, JSON.stringify({ labels: t.consensus.labels, no_consensus: t.consensus.no_consensus,
        chat_scores: t.consensus.chat_scores }, null, 2))) : null);
}

async function openDialogue(id) {
  state.dialogue = id;
  writeHash();
  for (const tr of document.querySelectorAll("#dialogues tbody tr")) tr.classList.toggle("sel", tr.dataset.id === id);
  const detail = document.getElementById("detail");
  detail.hidden = false;
  document.body.classList.add("detail-open");
  detail.replaceChildren(el("p", { class: "note" }, "Loading " + id + "…"));
  let data;
  try {
    data = await api(runPath(state.run) + "/dialogues/" + encodeURIComponent(id));
  } catch (err) {
    detail.replaceChildren(el("p", { class: "error" }, String(err.message)));
    return;
  }
  const d = data.dialogue;
  const c = data.case || {};
  const row = data.row || { failures: [] };
  setContent(detail,
    el("div", { class: "pager" }, el("button", { onclick: closeDetail }, "× close"), el("h2", { id: "detail-title" }, d.id)),
    el("div", { class: "kv" }, "status ", el("b", {}, d.status), "  end ", el("b", {}, d.end_reason || "–"),
      "  verdict ", row.pass === null || row.pass === undefined ? el("b", {}, "–")
        : el("b", { class: row.pass ? "ok" : "bad" }, row.pass ? "pass" : "fail"),
      "  turns ", el("b", {}, d.turns)),
    el("div", { class: "kv" }, "intent ", el("b", {}, c.intent || "–"), "  persona ", el("b", {}, (c.persona || {}).name || "–"),
      "  intensity ", el("b", {}, c.intensity || "–"), "  bucket ", el("b", {}, c.bucket || "–"),
      "  path ", el("b", {}, c.path_id || "–")),
    row.failures.length ? el("div", {}, row.failures.map((f) => el("span", { class: "tag" }, f.replace(/_/g, " ")))) : null,
    d.error ? el("p", { class: "error" }, d.error) : null,
    el("div", { class: "side" }, sidePanel("Reference (SOP)", data.reference, null, ""),
      sidePanel("Agent", data.agent, data.reference, "extra")),
    data.divergence ? el("p", { class: "error" }, "left the procedure at " + data.divergence) : null,
    c.prohibited_actions && c.prohibited_actions.length
      ? el("p", { class: "note" }, "prohibited actions: " + c.prohibited_actions.join(", ")) : null,
    el("h3", {}, "Transcript"), data.turns.map((t) => turnBlock(t, data.turns.length ? data.turns[data.turns.length - 1].index : 0)),
    d.closing_user_text ? el("div", { class: "bubble user" }, el("span", { class: "who" }, "user (closing)"), d.closing_user_text) : null,
    el("details", {}, el("summary", {}, "case"), el("pre", { class: "json" }, JSON.stringify(c, null, 2))));
}

function closeDetail() {
  state.dialogue = null;
  const detail = document.getElementById("detail");
  detail.hidden = true;
  document.body.classList.remove("detail-open");
  detail.replaceChildren();
  for (const tr of document.querySelectorAll("#dialogues tbody tr.sel")) tr.classList.remove("sel");
  writeHash();
}

// ------------------------------------------------------------------ start
async function start() {
  const form = document.getElementById("filter-form");
  form.addEventListener("change", () => { state.query = readFilters(); state.offset = 0; loadPage(); });
  form.addEventListener("submit", (ev) => { ev.preventDefault(); state.query = readFilters(); state.offset = 0; loadPage(); });
  form.addEventListener("reset", () => setTimeout(() => { state.query = {}; state.offset = 0; loadPage(); }, 0));
  try {
    await loadRuns();
  } catch (err) {
    document.getElementById("summary").replaceChildren(el("p", { class: "error" }, String(err.message)));
    return;
  }
  const wanted = readHash();
  const known = state.runs.find((r) => r.name === wanted.run);
  if (known) await selectRun(known.name, wanted.query, wanted.offset, wanted.dialogue);
  else if (state.runs.length === 1) await selectRun(state.runs[0].name, {}, 0, null);
  else if (state.runs.length === 0) document.getElementById("summary").replaceChildren(el("p", { class: "warn" }, "No runs found."));
  else document.getElementById("summary").replaceChildren(el("h2", {}, state.runs.length + " runs"), runListTable());
  document.body.dataset.ready = "1";
}

start();
