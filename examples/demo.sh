#!/usr/bin/env bash
# The offline demo: every stage of the pipeline on the six SAGE scenarios, no network needed.
# Outputs go to out/ (graphs, SVGs, cases, runs, scores, coverage SVG, HTML report).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
rm -rf "$OUT"; mkdir -p "$OUT"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1. compile, check and render the six SAGE scenarios"
sop check scenarios/*.sop
for f in scenarios/*.sop; do
  name=$(basename "$f" .sop)
  sop compile "$f" -o "$OUT/$name.graph.json"
  sop render "$f" -o "$OUT/$name.svg"
  sop paths "$f" --count
done

say "2. decide every SAGE reference vector with the rule engine"
for f in scenarios/*.sop; do
  name=$(basename "$f" .sop)
  python - "$name" > "$OUT/$name.values.jsonl" <<'PY'
import json, sys
name = sys.argv[1]
for vec in json.load(open(f"tests/data/sage_vectors/{name}.vectors.json")):
    row = {k: v for k, v in vec["classification"].items() if v is not None}
    row.update({k: v for k, v in vec["system"].items() if v != "none"})
    print(json.dumps(row))
PY
  # exit status 1 when a line fails: SAGE's errata vectors (see tests/test_scenarios.py) do, on purpose
  sop decide "$f" < "$OUT/$name.values.jsonl" > "$OUT/$name.decisions.jsonl" 2>/dev/null || true
  echo "$name: $(wc -l < "$OUT/$name.decisions.jsonl") decisions, $(grep -c '"error"' "$OUT/$name.decisions.jsonl" || true) refused (errata)"
done

say "3. the agent's SOP text for telecom_package (first lines)"
sop prompt scenarios/telecom_package.sop -o "$OUT/telecom_package.prompt.txt"
head -n 25 "$OUT/telecom_package.prompt.txt"

say "4. synthesize coverage-balanced cases"
sop synth scenarios/telecom_package.sop -n 60 --seed 7 --min-per-path 1 -o "$OUT/cases.jsonl"

say "5. simulate dialogues with the offline floor agents (scripted user, truth judges)"
for agent in oracle always-escalate always-comply random-path; do
  sop run scenarios/telecom_package.sop --cases "$OUT/cases.jsonl" --model agent=baseline/$agent \
      --trials 2 --concurrency 16 --quiet -o "$OUT/runs/$agent"
done

say "5b. your own agent over HTTP: examples/agents/rule_agent.py on 127.0.0.1 (docs/agents.md)"
python examples/agents/rule_agent.py --port 0 > "$OUT/agent.url" &
AGENT_PID=$!
trap 'kill $AGENT_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q http "$OUT/agent.url" 2>/dev/null && break; sleep 0.1; done
URL=$(sed -n 's/^agent on //p' "$OUT/agent.url")
test -n "$URL" || { echo "the example agent did not start" >&2; exit 1; }
sop run scenarios/telecom_package.sop --cases "$OUT/cases.jsonl" --model "agent=$URL" \
    --trials 2 --concurrency 16 --quiet -o "$OUT/runs/http-agent"
kill $AGENT_PID; trap - EXIT

say "5c. the graph-guided baseline: the same model fed one SOP stage at a time, the engine moving the state"
sop run scenarios/telecom_package.sop --cases "$OUT/cases.jsonl" --model agent=baseline/guided:baseline/random-path \
    --trials 2 --concurrency 16 --quiet -o "$OUT/runs/guided-random-path"
say "5d. tool calling (mode b): baseline/oracle-tools acts through OpenAI-style tool calls, the simulated backend answers"
sop run scenarios/telecom_package.sop --cases "$OUT/cases.jsonl" --model agent=baseline/oracle-tools \
    --trials 2 --concurrency 16 --quiet -o "$OUT/runs/oracle-tools"
python - "$OUT"/runs/* <<'PY'
import sqlite3, sys
from collections import Counter
for run in sys.argv[1:]:
    rows = sqlite3.connect(f"file:{run}/run.sqlite?mode=ro", uri=True).execute("SELECT turns FROM dialogues")
    lengths = Counter(n for (n,) in rows)
    print(f"{run.rsplit('/', 1)[-1]:>20}: dialogue turns " + " ".join(f"{k}×{v}" for k, v in sorted(lengths.items())))
PY

say "6. score, leaderboard, coverage and report"
sop score "$OUT/runs/oracle"
# floor agents, your HTTP agent, the tool-calling oracle and the guided baseline side by side (random-path
# beside its guided form)
sop leaderboard "$OUT"/runs/*
sop compare "$OUT/runs/always-escalate" "$OUT/runs/oracle" > "$OUT/compare.txt"
head -n 20 "$OUT/compare.txt"
sop coverage scenarios/telecom_package.sop --run "$OUT/runs/random-path" --render svg -o "$OUT/coverage.svg"
sop report "$OUT/runs/oracle" "$OUT/runs/always-escalate" "$OUT/runs/always-comply" "$OUT/runs/random-path" \
    "$OUT/runs/guided-random-path" \
    -o "$OUT/report.html"
sop export "$OUT/runs/oracle" --format openai --min-overall 50 -o "$OUT/corpus.jsonl"

say "7. authoring: canonical layout, a draft held against labelled decisions, a semantic diff"
sop fmt --check examples/authoring/*.sop
# the deliberately wrong draft: accuracy, confusion, and the edits that explain the disagreements
sop validate examples/authoring/late_delivery_draft.sop --data examples/authoring/late_delivery_decisions.csv \
    --expect Action=decision --expect Amount=amount --map Premium=premium_member --map FraudFlag=fraud_flag \
    --map DaysLate=promised_date --map OrderValue=order_value --now 2024-06-30
# version 2 of telecom_package waives small fees: which inputs and which of the cases above change
# (exit status 1 = the versions decide differently, as intended here)
status=0
sop diff scenarios/telecom_package.sop examples/authoring/telecom_package_v2.sop --cases "$OUT/cases.jsonl" \
    > "$OUT/telecom_package.diff.txt" || status=$?
test "$status" -eq 1
head -n 16 "$OUT/telecom_package.diff.txt"; grep '^cases:' "$OUT/telecom_package.diff.txt"

say "done: see $OUT/ (report.html, coverage.svg, *.svg graphs, cases.jsonl, runs/)"
echo "browse the runs: sop view $OUT/runs/   (read-only, on 127.0.0.1; Ctrl-C to stop)"
