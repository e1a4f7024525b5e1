"""An example agent speaking sopgraph's agent protocol (`sopgraph.agent/1`, docs/agents.md).

It is deliberately simple — a keyword policy, no model — so that the demo runs offline:
it greets, asks two clarifying questions, then calls the first tool whose name or description shares
a word with what the customer said (else the first escalation-like tool, else the first tool).

Run it as a server:   python examples/agents/rule_agent.py --port 8765
and evaluate it:      sop run FILE.sop --cases cases.jsonl --model agent=http://127.0.0.1:8765/agent -o runs/mine
or, in-process:       --model agent=python:examples.agents.rule_agent:respond
"""

from __future__ import annotations

import argparse
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROTOCOL = "sopgraph.agent/1"
_ESCALATE = re.compile(r"human|escalat|transfer|review", re.IGNORECASE)


_LOOKUPS = ("lookup", "sop_lookup")
_QUESTIONS = ("Thanks for reaching out. Could you tell me a little more about your situation?",
              "Thank you. Is there anything else I should know before I act on this?")


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]{4,}", text.lower())}


def respond(request: dict[str, Any]) -> dict[str, Any]:
    """One agent turn: the protocol request in, `{"reply", "tool_calls"}` out."""
    if request.get("protocol") != PROTOCOL:
        return {"reply": f"unsupported protocol {request.get('protocol')!r}", "tool_calls": []}
    said = " ".join(m["content"] for m in request["messages"] if m["role"] == "user")
    # the back-office `lookup` tool answers questions; this agent only picks an action to take
    tools = [t["function"] for t in request.get("tools") or [] if t["function"]["name"] not in _LOOKUPS]
    turn = request.get("turn", 1)
    if turn <= len(_QUESTIONS) or not tools:
        return {"reply": _QUESTIONS[min(turn, len(_QUESTIONS)) - 1], "tool_calls": []}
    heard = _words(said)
    best = max(tools, key=lambda f: len(heard & _words(f["name"] + " " + f.get("description", ""))))
    if not heard & _words(best["name"] + " " + best.get("description", "")):
        best = next((f for f in tools if _ESCALATE.search(f["name"] + f.get("description", ""))), tools[0])
    params = best.get("parameters", {}).get("properties", {})
    args = {name: _placeholder(schema) for name, schema in params.items()}
    return {"reply": f"I'll take care of that now ({best['name']}).",
            "tool_calls": [{"name": best["name"], "arguments": args}]}


def _placeholder(schema: dict[str, Any]) -> Any:
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind in ("number", "integer"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    return ""


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            answer = respond(json.loads(body))
            data, status = json.dumps(answer).encode(), 200
        except (ValueError, KeyError, TypeError) as exc:
            data, status = json.dumps({"error": str(exc)}).encode(), 400
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:  # quiet
        pass


def serve(port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server bound to host:port (0 = any free port); call `serve_forever()` on it."""
    return ThreadingHTTPServer((host, port), _Handler)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    ns = parser.parse_args()
    server = serve(ns.port, ns.host)
    print(f"agent on http://{ns.host}:{server.server_address[1]}/agent", flush=True)
    server.serve_forever()
