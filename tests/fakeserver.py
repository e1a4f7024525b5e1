"""A scriptable, fault-injecting, OpenAI-compatible HTTP server for tests.

Why: the gateway must be tested through litellm's real HTTP code path (sockets,
keep-alive, status codes, broken bodies) without any internet.  The server
listens on 127.0.0.1 only, on a random free port, runs an asyncio loop in a
daemon thread, bounds its connections and requests, and stops by itself after
``lifetime`` seconds.

Usage::

    from fakeserver import Behavior, FakeServer

    with FakeServer() as server:
        server.script([Behavior.rate_limit(retry_after=0), Behavior.ok("hello")])
        ...  # call litellm with model="openai/x", api_base=server.base_url
        assert len(server.requests) == 2

Per request the behaviour is taken from, in order: the scripted queue
(``script``), the ``responder`` hook (may return ``None`` to fall through),
then the default (``set_default``; initially ``Behavior.ok()``).

It can also run standalone (used by the benchmark, so the server does not share
the client's GIL)::

    python tests/fakeserver.py --latency 0.05 --lifetime 120
    # prints "PORT <n>" on its first stdout line
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Behavior", "FakeServer", "RecordedRequest"]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass(frozen=True)
class Behavior:
    """What the server does with one request.

    kind:
      ``ok``        a chat.completion JSON with ``content`` and ``usage`` (and ``tool_calls``, if any:
                    ``Behavior.tools``)
      ``error``     an OpenAI-style error JSON with HTTP ``status``
      ``timeout``   sleeps ``latency`` seconds (set it past the client timeout), then closes
      ``drop``      sends headers and a partial body, then aborts the socket
      ``empty``     HTTP 200 with an empty body
      ``malformed`` HTTP 200 with a body that is not valid JSON
      ``raw``       HTTP ``status`` with ``body`` bytes as given
    ``latency`` is applied before the response for every kind.
    """

    kind: str = "ok"
    content: str = "ok"
    status: int = 200
    latency: float = 0.0
    prompt_tokens: int = 10
    completion_tokens: int = 5
    reasoning_tokens: int = 0
    retry_after: float | None = None
    message: str = "fake error"
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    finish_reason: str = "stop"
    tool_calls: tuple[tuple[str, str], ...] = ()
    """(function name, arguments as sent: JSON text, or anything to test malformed calls)."""

    @classmethod
    def tools(cls, *calls: tuple[str, Any], content: str = "", latency: float = 0.0) -> Behavior:
        """A function-calling answer: each call is ``(name, arguments)``; arguments that are not a
        string are sent as JSON text (as OpenAI does), a string is sent verbatim (e.g. broken JSON)."""
        sent = tuple((name, args if isinstance(args, str) else json.dumps(args)) for name, args in calls)
        return cls(kind="ok", content=content, latency=latency, tool_calls=sent, finish_reason="tool_calls")

    @classmethod
    def ok(
        cls,
        content: str = "ok",
        *,
        latency: float = 0.0,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        reasoning_tokens: int = 0,
        finish_reason: str = "stop",
    ) -> Behavior:
        """A successful completion whose message content is ``content``."""
        return cls(
            kind="ok",
            content=content,
            latency=latency,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            reasoning_tokens=reasoning_tokens,
            finish_reason=finish_reason,
        )

    @classmethod
    def json_reply(cls, obj: Any, **kw: Any) -> Behavior:
        """A successful completion whose content is ``obj`` serialised as JSON."""
        return cls.ok(json.dumps(obj, ensure_ascii=False), **kw)

    @classmethod
    def error(
        cls,
        status: int,
        message: str = "fake error",
        *,
        retry_after: float | None = None,
        latency: float = 0.0,
    ) -> Behavior:
        """An HTTP error with an OpenAI-style error body."""
        return cls(kind="error", status=status, message=message, retry_after=retry_after, latency=latency)

    @classmethod
    def rate_limit(cls, retry_after: float | None = 0.0, latency: float = 0.0) -> Behavior:
        """HTTP 429 with a ``Retry-After`` header (seconds)."""
        return cls.error(429, "Rate limit reached (fake)", retry_after=retry_after, latency=latency)

    @classmethod
    def server_error(cls, status: int = 500, latency: float = 0.0) -> Behavior:
        """HTTP 5xx."""
        return cls.error(status, "internal failure (fake)", latency=latency)

    @classmethod
    def unauthorized(cls) -> Behavior:
        """HTTP 401 like a provider rejecting the API key."""
        return cls.error(401, "Incorrect API key provided (fake).")

    @classmethod
    def timeout(cls, seconds: float = 5.0) -> Behavior:
        """Hold the request for ``seconds`` without answering."""
        return cls(kind="timeout", latency=seconds)

    @classmethod
    def drop(cls, latency: float = 0.0) -> Behavior:
        """Close the socket in the middle of the response."""
        return cls(kind="drop", latency=latency)

    @classmethod
    def empty(cls, latency: float = 0.0) -> Behavior:
        """HTTP 200 with an empty body."""
        return cls(kind="empty", latency=latency)

    @classmethod
    def malformed(cls, latency: float = 0.0) -> Behavior:
        """HTTP 200 whose body is truncated JSON."""
        return cls(kind="malformed", latency=latency)

    @classmethod
    def raw(cls, status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> Behavior:
        """Any status and body, verbatim."""
        return cls(kind="raw", status=status, body=body, headers=tuple(headers))


@dataclass
class RecordedRequest:
    """One request as the server received it (headers lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    raw_body: bytes
    received_at: float
    body: Any = None
    behavior: Behavior | None = None

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages of the request body (empty if none)."""
        if isinstance(self.body, dict):
            return list(self.body.get("messages") or [])
        return []


Responder = Callable[[RecordedRequest], "Behavior | None"]


@dataclass
class _State:
    queue: collections.deque[Behavior] = field(default_factory=collections.deque)
    default: Behavior = field(default_factory=Behavior.ok)
    responder: Responder | None = None


class FakeServer:
    """OpenAI-compatible ``/v1/chat/completions`` (and ``/chat/completions``) test server."""

    def __init__(
        self,
        *,
        default: Behavior | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = 512,
        max_requests: int = 200_000,
        lifetime: float = 300.0,
        record: bool = True,
    ) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("FakeServer only listens on loopback")
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self.max_requests = max_requests
        self.lifetime = lifetime
        self.record = record
        self._state = _State()
        if default is not None:
            self._state.default = default
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self.preflights: list[RecordedRequest] = []
        self.answer_preflight = True
        """Answer sopgraph's preflight calls (one per model before a run) with ``{"ok": true}`` and
        record them in ``preflights``, not ``requests``: scripts, responders and request counts see
        only the run's own calls. Set False to script the preflight like any request."""
        self.request_count = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop_event: asyncio.Event | None = None
        self._start_error: BaseException | None = None

    # ------------------------------------------------------------------ scripting
    def script(self, behaviors: Iterable[Behavior]) -> None:
        """Queue behaviours; each request consumes one, in order."""
        with self._lock:
            self._state.queue.extend(behaviors)

    def set_default(self, behavior: Behavior) -> None:
        """Behaviour used when the queue is empty and the responder passes."""
        with self._lock:
            self._state.default = behavior

    def responder(self, fn: Responder | None) -> Responder | None:
        """Install a hook ``fn(request) -> Behavior | None`` (usable as a decorator)."""
        with self._lock:
            self._state.responder = fn
        return fn

    def reset(self) -> None:
        """Forget the queue, responder, recorded requests and counters."""
        with self._lock:
            self._state = _State()
            self.requests.clear()
            self.request_count = 0
            self.max_in_flight = self.in_flight

    @property
    def pending(self) -> int:
        """Scripted behaviours not yet consumed."""
        with self._lock:
            return len(self._state.queue)

    @property
    def base_url(self) -> str:
        """The ``api_base`` to give an OpenAI-compatible client."""
        return f"http://{self.host}:{self.port}/v1"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeServer:
        """Start serving in a daemon thread; returns once the port is bound."""
        self._thread = threading.Thread(target=self._run, name="fakeserver", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        if self._start_error is not None:
            raise RuntimeError("fake server failed to start") from self._start_error
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        loop, ev = self._loop, self._stop_event
        if loop is not None and ev is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(ev.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._start_error = exc
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

    async def _main(self) -> None:
        self._stop_event = asyncio.Event()
        server = await asyncio.start_server(self._handle_conn, self.host, self.port, backlog=1024)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop_event.wait(), self.lifetime)
            server.close()

    # ------------------------------------------------------------------ serving
    async def _handle_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.connections > self.max_connections:
                await self._send(writer, 503, {"error": {"message": "too many connections"}}, close=True)
                return
            while True:
                keep = await self._handle_one(reader, writer)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:
            # Shutting down: swallow, or asyncio's stream callback logs it as an error.
            pass
        finally:
            self.connections -= 1
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        try:
            method, target, _version = lines[0].split(" ", 2)
        except ValueError:
            await self._send(writer, 400, {"error": {"message": "bad request line"}}, close=True)
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0") or 0)
        raw = await reader.readexactly(length) if length else b""
        keep_alive = headers.get("connection", "").lower() != "close"
        path = target.split("?", 1)[0]
        req = RecordedRequest(
            method=method, path=path, headers=headers, raw_body=raw, received_at=time.monotonic()
        )
        with contextlib.suppress(ValueError):
            req.body = json.loads(raw) if raw else None

        if method != "POST" or path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            await self._send(writer, 404, {"error": {"message": f"no route {method} {path}"}})
            return keep_alive

        if self.answer_preflight and _is_preflight(req):
            with self._lock:
                self.preflights.append(req)
            await self._perform(Behavior.ok('{"ok": true}'), req, writer, keep_alive)
            return keep_alive

        with self._lock:
            self.request_count += 1
            over = self.request_count > self.max_requests
            if self.record:
                self.requests.append(req)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if over:
                await self._send(writer, 503, {"error": {"message": "request budget exhausted"}}, close=True)
                return False
            behavior = self._pick(req)
            req.behavior = behavior
            return await self._perform(behavior, req, writer, keep_alive)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _pick(self, req: RecordedRequest) -> Behavior:
        with self._lock:
            if self._state.queue:
                return self._state.queue.popleft()
            fn = self._state.responder
            default = self._state.default
        if fn is not None:
            try:
                chosen = fn(req)
            except Exception as exc:  # noqa: BLE001 - a test bug becomes a visible 500
                return Behavior.error(500, f"responder raised {exc!r}")
            if chosen is not None:
                return chosen
        return default

    async def _perform(
        self, b: Behavior, req: RecordedRequest, writer: asyncio.StreamWriter, keep_alive: bool
    ) -> bool:
        if b.latency > 0:
            await asyncio.sleep(b.latency)
        if b.kind == "timeout":
            writer.transport.abort()
            return False
        if b.kind == "drop":
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
                b'{"id": "chatcmpl-fake", "object": "chat.comp'
            )
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.transport.abort()
            return False
        if b.kind == "empty":
            await self._send_bytes(writer, 200, b"", keep_alive=keep_alive)
            return keep_alive
        if b.kind == "malformed":
            await self._send_bytes(
                writer, 200, b'{"id": "chatcmpl-fake", "choices": [{"index": 0, "mess', keep_alive
            )
            return keep_alive
        if b.kind == "raw":
            await self._send_bytes(writer, b.status, b.body, keep_alive, extra=b.headers)
            return keep_alive
        if b.kind == "error":
            extra: tuple[tuple[str, str], ...] = b.headers
            if b.retry_after is not None:
                extra = (*extra, ("Retry-After", f"{b.retry_after:g}"))
            payload = {"error": {"message": b.message, "type": "fake_error", "code": b.status}}
            await self._send(writer, b.status, payload, close=not keep_alive, extra=extra)
            return keep_alive
        model = req.body.get("model", "fake") if isinstance(req.body, dict) else "fake"
        payload = {
            "id": f"chatcmpl-fake-{self.request_count}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": _message(b, self.request_count),
                    "finish_reason": b.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": b.prompt_tokens,
                "completion_tokens": b.completion_tokens,
                "total_tokens": b.prompt_tokens + b.completion_tokens,
                "completion_tokens_details": {"reasoning_tokens": b.reasoning_tokens},
            },
        }
        await self._send(writer, 200, payload, close=not keep_alive, extra=b.headers)
        return keep_alive

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        payload: Any,
        *,
        close: bool = False,
        extra: Iterable[tuple[str, str]] = (),
    ) -> None:
        await self._send_bytes(writer, status, json.dumps(payload).encode(), not close, extra=extra)

    async def _send_bytes(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        keep_alive: bool,
        extra: Iterable[tuple[str, str]] = (),
    ) -> None:
        head = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
        ]
        head += [f"{k}: {v}" for k, v in extra]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()


def _message(b: Behavior, n: int) -> dict[str, Any]:
    """The assistant message of an ``ok`` answer (content null when it only calls functions)."""
    if not b.tool_calls:
        return {"role": "assistant", "content": b.content}
    calls = [{"id": f"call_{n}_{i}", "type": "function", "function": {"name": name, "arguments": args}}
             for i, (name, args) in enumerate(b.tool_calls)]
    return {"role": "assistant", "content": b.content or None, "tool_calls": calls}


def _is_preflight(req: RecordedRequest) -> bool:
    """A sopgraph preflight call (see ``gateway.PREFLIGHT_PROMPT``)."""
    msgs = req.messages
    return len(msgs) == 1 and str(msgs[0].get("content", "")).startswith("sopgraph preflight:")


def main(argv: list[str] | None = None) -> int:
    """Run standalone with a fixed default behaviour until ``--lifetime`` passes or stdin closes."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency", type=float, default=0.0)
    ap.add_argument("--content", default="ok")
    ap.add_argument("--lifetime", type=float, default=120.0)
    args = ap.parse_args(argv)
    server = FakeServer(
        port=args.port,
        default=Behavior.ok(args.content, latency=args.latency),
        lifetime=args.lifetime,
        record=False,
    )
    server.start()
    print(f"PORT {server.port}", flush=True)
    # Stop when the parent closes our stdin, or when the lifetime runs out.
    reader = threading.Thread(target=sys.stdin.read, daemon=True)
    reader.start()
    deadline = time.monotonic() + args.lifetime
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(0.2)
    server.stop()
    print(f"SERVED {server.request_count} MAX_IN_FLIGHT {server.max_in_flight}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
