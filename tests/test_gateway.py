"""Gateway tests: litellm driven for real over loopback sockets against the fault-injecting fake server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeserver import Behavior, FakeServer

from sopgraph.simulation import gateway as gw
from sopgraph.simulation import providers
from sopgraph.simulation.gateway import (
    Completion,
    Gateway,
    InfraFailure,
    ModelOptionError,
    ModelSpec,
    parse_model_option,
    redact,
    roles_from_options,
)

SECRET = "sk-test-SECRET123"
MESSAGES = [{"role": "system", "content": "You are a service agent."}, {"role": "user", "content": "hi"}]


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer(lifetime=120) as srv:
        yield srv


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def gateway(cache_dir: Path) -> Gateway:
    return Gateway(
        cache_dir=cache_dir, max_retries=3, base_delay=0.001, max_delay=0.02, default_timeout=5, seed=1
    )


def spec_for(server: FakeServer, model: str = "openai/gpt-4o-mini", **params: Any) -> ModelSpec:
    extra = "".join(f",{k}={v}" for k, v in params.items())
    return parse_model_option(f"agent={model},api_base={server.base_url}{extra}")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def spy_on_litellm(
    monkeypatch: pytest.MonkeyPatch, before: Callable[[dict[str, Any]], Awaitable[None]] | None = None
) -> list[dict[str, Any]]:
    """The keyword arguments of every `litellm.acompletion` call from now on (the calls still go through,
    after `before`, if given, has seen, and possibly changed, the arguments: a stand-in for litellm's own work)."""
    litellm = gw.load_litellm()
    seen: list[dict[str, Any]] = []
    real = litellm.acompletion

    async def spy(**kwargs: Any) -> Any:
        seen.append(kwargs)
        if before is not None:
            await before(kwargs)
        return await real(**kwargs)

    monkeypatch.setattr(litellm, "acompletion", spy)
    return seen


# The OpenAI SDK route and litellm's lighter aiohttp route must behave the same for every fault.
ROUTES = ["openai/gpt-4o-mini", "aiohttp_openai/gpt-4o-mini"]


# --------------------------------------------------------------------------- --model parsing and roles
def test_parse_model_option_full_syntax() -> None:
    spec = parse_model_option(
        "agent=openai/gpt-4o,temperature=0,max_tokens=256,api_base=http://127.0.0.1:8000/v1,"
        "timeout=30,top_p=0.9,seed=7,drop_params=true,structured=yes,cache=off"
    )
    assert spec.role == "agent"
    assert spec.model == "openai/gpt-4o"
    assert spec.params.temperature == 0.0
    assert spec.params.max_tokens == 256
    assert spec.params.api_base == "http://127.0.0.1:8000/v1"
    assert spec.params.timeout == 30.0
    assert spec.params.extra == {"top_p": 0.9, "seed": 7, "drop_params": True}
    assert spec.structured is True
    assert spec.cache is False
    assert spec.provider == "openai"
    assert not spec.is_builtin


@pytest.mark.parametrize(
    "text",
    [
        "openai/gpt-4o",  # no role
        "agent=",  # no model
        "boss=openai/gpt-4o",  # unknown role
        "agent=openai/gpt-4o,api_key=sk-abc",  # keys only from the environment
        "agent=openai/gpt-4o,openai_api_key=x",
        "agent=openai/gpt-4o,temperature=hot",
        "agent=openai/gpt-4o,max_tokens=1.5",
        "agent=openai/gpt-4o,justakey",
        "agent=baseline/nonexistent",
        "agent=openai/gpt-4o,timeout=0",
    ],
)
def test_parse_model_option_rejects(text: str) -> None:
    with pytest.raises(ModelOptionError):
        parse_model_option(text)


def test_api_key_refusal_message_points_at_environment() -> None:
    with pytest.raises(ModelOptionError, match="environment variable"):
        parse_model_option("agent=openai/gpt-4o,api_key=sk-abcdef123")


def test_roles_defaults_and_single_judge_used_thrice() -> None:
    roles = roles_from_options(["agent=baseline/oracle"])
    assert roles.agent is not None and roles.agent.model == "baseline/oracle"
    assert roles.user.model == "scripted/user" and roles.user.role == "user"
    assert [j.model for j in roles.judges] == ["scripted/truth"] * 3
    assert [j.role for j in roles.judges] == ["judge1", "judge2", "judge3"]

    one = roles_from_options(["agent=baseline/oracle", "judge=openai/gpt-4o,temperature=0"])
    assert [(j.role, j.model, j.params.temperature) for j in one.judges] == [
        ("judge1", "openai/gpt-4o", 0.0),
        ("judge2", "openai/gpt-4o", 0.0),
        ("judge3", "openai/gpt-4o", 0.0),
    ]
    assert one.by_role("judge2").model == "openai/gpt-4o"


def test_roles_three_judges_fill_slots_in_order() -> None:
    roles = roles_from_options(
        ["agent=baseline/oracle", "judge2=ollama/llama3", "judge=openai/a", "judge=openai/b", "user=openai/u"]
    )
    assert [(j.role, j.model) for j in roles.judges] == [
        ("judge1", "openai/a"),
        ("judge2", "ollama/llama3"),
        ("judge3", "openai/b"),
    ]
    assert roles.user.model == "openai/u"
    assert [s.role for s in roles.all()] == ["agent", "user", "judge1", "judge2", "judge3"]


@pytest.mark.parametrize(
    "options",
    [
        ["agent=baseline/oracle", "judge=openai/a", "judge=openai/b"],  # two judges: ambiguous
        ["agent=baseline/oracle"] + ["judge=openai/a"] * 4,
        ["agent=baseline/oracle", "agent=baseline/oracle"],
        ["agent=baseline/oracle", "judge1=openai/a", "judge1=openai/b", "judge=openai/c"],
        [],  # no agent
    ],
)
def test_roles_rejects(options: list[str]) -> None:
    with pytest.raises(ModelOptionError):
        roles_from_options(options)


def test_roles_without_agent_when_allowed() -> None:
    assert roles_from_options([], require_agent=False).agent is None


# --------------------------------------------------------------------------- retries
FAULTS = {
    "429": Behavior.rate_limit(retry_after=0),
    "500": Behavior.server_error(500),
    "502": Behavior.server_error(502),
    "503": Behavior.server_error(503),
    "timeout": Behavior.timeout(3.0),
    "dropped": Behavior.drop(),
    "empty-body": Behavior.empty(),
    "malformed-body": Behavior.malformed(),
    "no-choices": Behavior.raw(200, b'{"id": "x", "object": "chat.completion", "choices": []}'),
    "null-content": Behavior.raw(
        200,
        b'{"id": "x", "object": "chat.completion", "choices": [{"index": 0, '
        b'"message": {"role": "assistant", "content": null}, "finish_reason": "stop"}]}',
    ),
}


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_retries_each_fault_then_succeeds(fault: str, model: str, server: FakeServer, gateway: Gateway) -> None:
    server.script([FAULTS[fault], FAULTS[fault], Behavior.ok("recovered")])
    # a short client timeout only where the fault is a timeout: elsewhere a loaded machine could
    # turn a slow (but answered) call into an extra timeout retry
    spec = spec_for(server, model, timeout=0.4 if fault == "timeout" else 10.0)
    completion = run(gateway.complete(spec, MESSAGES))
    assert completion.text == "recovered"
    assert completion.attempts == 3
    assert len(server.requests) == 3
    assert gateway.stats.retries == 2
    assert gateway.stats.failures == 0


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize(
    ("behavior", "kind"),
    [
        (Behavior.server_error(500), "server_error"),
        (Behavior.rate_limit(retry_after=0), "rate_limit"),
        (Behavior.drop(), "connection"),
        (Behavior.malformed(), "malformed"),
    ],
)
def test_exhausted_retries_raise_infra_failure(
    behavior: Behavior, kind: str, model: str, server: FakeServer, gateway: Gateway
) -> None:
    server.set_default(behavior)
    with pytest.raises(InfraFailure) as info:
        run(gateway.complete(spec_for(server, model), MESSAGES))
    exc = info.value
    assert exc.kind == kind
    assert exc.retryable
    assert exc.attempts == gateway.max_retries + 1 == 4
    assert len(server.requests) == 4
    assert exc.__cause__ is None
    assert "after 4 attempts" in str(exc) and model in str(exc)
    assert gateway.stats.failures == 1


@pytest.mark.parametrize("model", ROUTES)
def test_timeout_exhaustion_is_infra_failure(model: str, server: FakeServer, cache_dir: Path) -> None:
    gateway = Gateway(cache_dir=cache_dir, max_retries=1, base_delay=0.001, max_delay=0.01)
    server.set_default(Behavior.timeout(3.0))
    started = time.monotonic()
    with pytest.raises(InfraFailure) as info:
        run(gateway.complete(spec_for(server, model, timeout=0.3), MESSAGES))
    assert info.value.kind == "timeout"
    assert info.value.attempts == 2
    assert time.monotonic() - started < 4.0  # the server would hold each attempt for 3 s


@pytest.mark.parametrize("model", ROUTES)
@pytest.mark.parametrize(
    ("behavior", "kind", "status"),
    [
        (Behavior.unauthorized(), "auth", 401),
        (Behavior.error(403, "forbidden"), "auth", 403),
        (Behavior.error(400, "bad request: unknown parameter"), "bad_request", 400),
        (Behavior.error(404, "model not found"), "bad_request", 404),
    ],
)
def test_non_retryable_errors_fail_immediately(
    behavior: Behavior, kind: str, status: int, model: str, server: FakeServer, gateway: Gateway
) -> None:
    server.script([behavior, Behavior.ok("must not be reached")])
    with pytest.raises(InfraFailure) as info:
        run(gateway.complete(spec_for(server, model), MESSAGES))
    assert info.value.kind == kind
    assert info.value.status_code == status
    assert info.value.attempts == 1
    assert not info.value.retryable
    assert "not retryable" in str(info.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize("model", ROUTES)
def test_retry_after_header_is_honoured(model: str, server: FakeServer, cache_dir: Path) -> None:
    gateway = Gateway(cache_dir=cache_dir, max_retries=2, base_delay=0.001, max_delay=2.0, seed=3)
    server.script([Behavior.rate_limit(retry_after=0.3), Behavior.ok("after wait")])
    completion = run(gateway.complete(spec_for(server, model), MESSAGES))
    assert completion.text == "after wait"
    first, second = server.requests
    assert second.received_at - first.received_at >= 0.29


def test_backoff_is_exponential_with_equal_jitter(cache_dir: Path) -> None:
    gateway = Gateway(cache_dir=cache_dir, base_delay=1.0, max_delay=5.0, seed=0)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        delays = [gateway._backoff(attempt, None) for _ in range(300)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)  # a floor: the window rides out restarts
        assert max(delays) > 0.9 * ceiling and min(delays) < 0.6 * ceiling  # jitter spans the upper half
    assert gateway._backoff(1, 3.0) >= 3.0
    assert gateway._backoff(1, 100.0) == 5.0


def test_model_text_is_returned_verbatim_not_retried(server: FakeServer, gateway: Gateway) -> None:
    """Non-JSON or truncated agent output is a model failure for the scorers, not an infra failure."""
    for content in ["Sure, I can help!", '{"classification_output": {"intent": "ref', '{"ok": true}']:
        server.script([Behavior.ok(content)])
        completion = run(gateway.complete(spec_for(server), MESSAGES))
        assert completion.text == content
        assert completion.attempts == 1


# --------------------------------------------------------------------------- cache
def test_cache_hit_avoids_second_http_call(server: FakeServer, gateway: Gateway, cache_dir: Path) -> None:
    server.set_default(Behavior.ok("cached answer", prompt_tokens=100, completion_tokens=20))
    spec = spec_for(server, temperature=0)
    first = run(gateway.complete(spec, MESSAGES))
    second = run(gateway.complete(spec, MESSAGES))
    assert len(server.requests) == 1
    assert not first.cached and first.cost > 0 and first.attempts == 1
    assert second.cached and second.cost == 0.0 and second.attempts == 0
    assert second.text == first.text == "cached answer"
    assert second.usage == first.usage
    assert gateway.stats.cache_hits == 1
    # A fresh gateway on the same directory hits too (on disk, not in memory).
    third = run(Gateway(cache_dir=cache_dir).complete(spec, MESSAGES))
    assert third.cached and len(server.requests) == 1
    files = list(cache_dir.rglob("*.json"))
    assert len(files) == 1 and files[0].parent.name == files[0].stem[:2]


def test_cache_misses_on_different_messages_or_params(server: FakeServer, gateway: Gateway) -> None:
    spec = spec_for(server, temperature=0)
    run(gateway.complete(spec, MESSAGES))
    run(gateway.complete(spec, [*MESSAGES, {"role": "user", "content": "more"}]))
    run(gateway.complete(spec_for(server, temperature=0, max_tokens=10), MESSAGES))
    run(gateway.complete(spec_for(server, model="openai/gpt-4o", temperature=0), MESSAGES))
    assert len(server.requests) == 4


def test_cache_only_at_temperature_zero_unless_forced(
    server: FakeServer, gateway: Gateway, cache_dir: Path
) -> None:
    warm = spec_for(server, temperature=0.7)
    run(gateway.complete(warm, MESSAGES))
    assert not run(gateway.complete(warm, MESSAGES)).cached
    assert len(server.requests) == 2
    forced = spec_for(server, temperature=0.7, cache="true")
    run(gateway.complete(forced, MESSAGES))
    assert run(gateway.complete(forced, MESSAGES)).cached
    assert len(server.requests) == 3
    off = spec_for(server, temperature=0, cache="false")
    run(gateway.complete(off, MESSAGES))
    run(gateway.complete(off, MESSAGES))
    assert len(server.requests) == 5
    disabled = Gateway(cache_dir=cache_dir, cache=False)
    cold = spec_for(server, temperature=0)
    run(disabled.complete(cold, MESSAGES))
    run(disabled.complete(cold, MESSAGES))
    assert len(server.requests) == 7


def test_failures_are_not_cached(server: FakeServer, gateway: Gateway, cache_dir: Path) -> None:
    server.set_default(Behavior.server_error())
    with pytest.raises(InfraFailure):
        run(gateway.complete(spec_for(server, temperature=0), MESSAGES))
    assert not list(cache_dir.rglob("*.json"))


def test_corrupt_cache_entry_is_a_miss(server: FakeServer, gateway: Gateway, cache_dir: Path) -> None:
    spec = spec_for(server, temperature=0)
    run(gateway.complete(spec, MESSAGES))
    (entry,) = cache_dir.rglob("*.json")
    entry.write_text("{not json")
    assert not run(gateway.complete(spec, MESSAGES)).cached
    assert run(gateway.complete(spec, MESSAGES)).cached
    assert len(server.requests) == 2


# --------------------------------------------------------------------------- concurrency, usage, cost
@pytest.mark.parametrize("model", ROUTES)
def test_concurrency_limit_is_respected(model: str, server: FakeServer, cache_dir: Path) -> None:
    gateway = Gateway(cache_dir=cache_dir, concurrency=3, cache=False)
    server.set_default(Behavior.ok("slow", latency=0.1))
    spec = spec_for(server, model)

    async def many() -> list[Completion]:
        return await asyncio.gather(*(gateway.complete(spec, MESSAGES) for _ in range(12)))

    started = time.monotonic()
    results = run(many())
    assert len(results) == 12 and all(r.text == "slow" for r in results)
    assert server.max_in_flight == 3
    assert time.monotonic() - started >= 0.39  # 12 calls / 3 slots x 0.1 s


@pytest.mark.parametrize("model", ROUTES)
def test_waiting_for_a_slot_does_not_count_against_the_timeout(
    model: str, server: FakeServer, cache_dir: Path
) -> None:
    gateway = Gateway(cache_dir=cache_dir, concurrency=1, cache=False, max_retries=0)
    server.set_default(Behavior.ok("slow", latency=0.25))
    spec = spec_for(server, model, timeout=0.6)

    async def many() -> list[Completion]:
        return await asyncio.gather(*(gateway.complete(spec, MESSAGES) for _ in range(4)))

    results = run(many())  # the last call waits ~0.75 s for the slot, then takes 0.25 s
    assert [r.attempts for r in results] == [1, 1, 1, 1]
    assert max(r.latency for r in results) > 0.6


def test_a_slot_is_held_only_while_the_request_is_at_the_provider(
    server: FakeServer, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap counts requests a provider is serving: litellm's work before sending a request (here a
    0.3 s stand-in) overlaps another call's request instead of holding the one slot."""
    gateway = Gateway(cache_dir=cache_dir, concurrency=1, cache=False)
    server.set_default(Behavior.ok("slow", latency=0.3))
    spec = spec_for(server, "aiohttp_openai/gpt-4o-mini")
    run(gateway.complete(spec, MESSAGES))  # litellm's first-call work, not timed

    async def slow_to_prepare(kwargs: dict[str, Any]) -> None:
        await asyncio.sleep(0.3)

    spy_on_litellm(monkeypatch, before=slow_to_prepare)

    async def three() -> list[Completion]:
        return await asyncio.gather(*(gateway.complete(spec, MESSAGES) for _ in range(3)))

    started = time.monotonic()
    assert [r.text for r in run(three())] == ["slow"] * 3
    assert server.max_in_flight == 1
    # 0.3 s of preparation (all three at once), then three requests of 0.3 s one after the other;
    # a slot held around the whole call makes it 3 x 0.6 = 1.8 s
    assert time.monotonic() - started < 1.5


def test_a_litellm_that_bypasses_the_session_still_gets_the_cap(
    server: FakeServer, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should litellm not send through the session the gateway hands it (the slot is never taken), the
    gateway goes back to holding the slot around the whole call, so the cap still holds."""
    gateway = Gateway(cache_dir=cache_dir, concurrency=2, cache=False)
    server.set_default(Behavior.ok("slow", latency=0.1))
    spec = spec_for(server, "aiohttp_openai/gpt-4o-mini")

    async def own_session(kwargs: dict[str, Any]) -> None:
        kwargs.pop("client", None)

    spy_on_litellm(monkeypatch, before=own_session)

    async def one_then_many() -> list[Completion]:  # one loop: litellm's own session is bound to it
        await gateway.complete(spec, MESSAGES)
        server.reset()
        server.set_default(Behavior.ok("slow", latency=0.1))
        return await asyncio.gather(*(gateway.complete(spec, MESSAGES) for _ in range(8)))

    assert [r.text for r in run(one_then_many())] == ["slow"] * 8
    assert server.max_in_flight == 2


@pytest.mark.parametrize("model", ROUTES)
def test_a_failed_or_cancelled_request_gives_its_slot_back(model: str, server: FakeServer, cache_dir: Path) -> None:
    gateway = Gateway(cache_dir=cache_dir, concurrency=1, cache=False, max_retries=0)
    spec = spec_for(server, model)
    server.script([Behavior.drop(), Behavior.server_error(), Behavior.ok("late", latency=2.0)])
    server.set_default(Behavior.ok("ok"))

    async def scenario() -> list[str]:
        seen = []
        for _ in range(2):
            try:
                await gateway.complete(spec, MESSAGES)
            except InfraFailure as exc:
                seen.append(exc.kind)
        late = asyncio.ensure_future(gateway.complete(spec, MESSAGES))
        await asyncio.sleep(0.5)  # on the wire, holding the only slot
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        seen.append((await asyncio.wait_for(gateway.complete(spec, MESSAGES), 1.5)).text)
        return seen

    kinds = run(scenario())
    assert kinds[-1] == "ok" and len(kinds) == 3


def _logged_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models of the calls whose litellm success logging runs from now on (litellm's payload builder,
    whether or not a callback then receives the payload)."""
    from litellm.litellm_core_utils.litellm_logging import Logging

    seen: list[str] = []
    real = Logging.async_success_handler

    async def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(self.model))
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(Logging, "async_success_handler", spy)
    return seen


def test_litellm_builds_no_logging_payload_for_calls_it_is_told_not_to_log(
    server: FakeServer, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`no-log` only kept litellm's callbacks from the payload it still built for every call (~0.4 ms of CPU);
    the gateway's calls without litellm logging now skip the building too, built-in and real alike."""
    gw.load_litellm()
    seen = _logged_calls(monkeypatch)

    async def calls() -> None:
        gateway = Gateway(cache_dir=cache_dir, cache=False)
        await gateway.complete(ModelSpec(role="user", model="scripted/user"), MESSAGES, context={})
        await gateway.complete(spec_for(server, "aiohttp_openai/gpt-4o-mini"), MESSAGES)
        await gateway.complete(spec_for(server, "openai/gpt-4o-mini"), MESSAGES)
        await asyncio.sleep(0.2)  # litellm logs in a task of its own after the call
        await gateway.aclose()

    run(calls())
    assert seen == []


def test_with_litellm_logging_on_its_callbacks_see_every_call(
    server: FakeServer, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    litellm = gw.load_litellm()
    from litellm.integrations.custom_logger import CustomLogger

    logged: list[str] = []

    class Recorder(CustomLogger):  # type: ignore[misc]
        async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            logged.append(str(kwargs.get("model")))

    monkeypatch.setattr(litellm, "callbacks", [Recorder()])

    async def calls(logging_on: bool) -> None:
        gateway = Gateway(cache_dir=cache_dir, cache=False, litellm_logging=logging_on)
        await gateway.complete(ModelSpec(role="user", model="scripted/user"), MESSAGES, context={})
        await gateway.complete(spec_for(server, "aiohttp_openai/gpt-4o-mini"), MESSAGES)
        await asyncio.sleep(0.3)
        await gateway.aclose()

    run(calls(False))
    assert logged == []
    run(calls(True))
    assert sorted(logged) == ["gpt-4o-mini", "user"]


def test_usage_and_cost_are_captured(server: FakeServer, gateway: Gateway) -> None:
    server.script([Behavior.ok("x", prompt_tokens=1000, completion_tokens=500, reasoning_tokens=120)])
    completion = run(gateway.complete(spec_for(server), MESSAGES))
    assert completion.usage.prompt_tokens == 1000
    assert completion.usage.completion_tokens == 500
    assert completion.usage.reasoning_tokens == 120
    prices = gw.load_litellm().model_cost["gpt-4o-mini"]
    expected = 1000 * prices["input_cost_per_token"] + 500 * prices["output_cost_per_token"]
    assert completion.cost == pytest.approx(expected)
    assert completion.cost_known
    assert completion.latency > 0
    stats = gateway.stats
    assert (stats.prompt_tokens, stats.completion_tokens, stats.reasoning_tokens) == (1000, 500, 120)
    assert stats.cost == pytest.approx(expected)


@pytest.mark.parametrize("model", ["openai/my-local-finetune", "aiohttp_openai/my-local-finetune"])
def test_unpriced_model_cost_is_zero_and_flagged(model: str, server: FakeServer, gateway: Gateway) -> None:
    completion = run(gateway.complete(spec_for(server, model=model), MESSAGES))
    assert completion.cost == 0.0
    assert not completion.cost_known
    assert gateway.stats.unknown_cost_calls == 1
    # litellm's global cost map is never written to (issue 8): the model stays unknown to it.
    assert model not in gw.load_litellm().model_cost
    again = run(gateway.complete(spec_for(server, model=model), MESSAGES))
    assert (again.cost, again.cost_known, gateway.stats.unknown_cost_calls) == (0.0, False, 2)
    # A priced model is unaffected.
    priced = run(gateway.complete(spec_for(server), MESSAGES))
    assert priced.cost > 0 and priced.cost_known


def test_a_priced_model_is_never_registered_at_zero() -> None:
    """A response litellm could not price (e.g. no usage) for a model its cost map knows: that call
    is of unknown cost, but the model keeps its real price for the next calls."""
    litellm = gw.load_litellm()
    price = litellm.model_cost["gpt-4o-mini"]["input_cost_per_token"]
    spec = ModelSpec(role="agent", model="openai/gpt-4o-mini")
    unpriced = litellm.ModelResponse(choices=[{"index": 0, "message": {"role": "assistant", "content": "x"}}])
    unpriced._hidden_params["response_cost"] = None
    assert Gateway._cost(spec, unpriced) == (0.0, False)
    assert "openai/gpt-4o-mini" not in litellm.model_cost
    assert litellm.model_cost["gpt-4o-mini"]["input_cost_per_token"] == price > 0
    priced = litellm.ModelResponse(choices=[{"index": 0, "message": {"role": "assistant", "content": "x"}}])
    priced._hidden_params["response_cost"] = 0.25
    assert Gateway._cost(spec, priced) == (0.25, True)


# --------------------------------------------------------------------------- secrets
@pytest.mark.parametrize("model", ROUTES)
def test_api_key_is_sent_but_never_returned_or_stored(
    model: str, server: FakeServer, gateway: Gateway, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    spec = spec_for(server, model, temperature=0)
    server.script([Behavior.ok(f"my key is {SECRET} and bearer Bearer {SECRET}")])
    completion = run(gateway.complete(spec, MESSAGES))
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"  # it was sent
    assert SECRET not in completion.text
    assert SECRET not in completion.model_dump_json() and SECRET not in repr(completion)
    cached = run(gateway.complete(spec, MESSAGES))
    assert cached.cached and SECRET not in cached.model_dump_json()

    server.script([Behavior.unauthorized()])
    server.set_default(Behavior.error(401, f"Incorrect API key provided: {SECRET}"))
    for _ in range(2):
        with pytest.raises(InfraFailure) as info:
            run(gateway.complete(spec_for(server, model, temperature=0.5), MESSAGES))
        assert SECRET not in str(info.value) and SECRET not in repr(info.value)
        assert SECRET not in info.value.message
    server.set_default(Behavior.error(500, f"upstream said {SECRET}"))
    with pytest.raises(InfraFailure) as info:
        run(gateway.complete(spec_for(server, model, temperature=0.5), MESSAGES))
    assert SECRET not in str(info.value)

    files = [p for p in cache_dir.rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        assert SECRET.encode() not in data and b"SECRET123" not in data


def test_api_key_env_option_reads_named_variable(
    server: FakeServer, gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_VLLM_API_KEY", "local-token-abcdef")
    spec = spec_for(server, model="openai/qwen", api_key_env="MY_VLLM_API_KEY")
    server.script([Behavior.ok("echo local-token-abcdef")])
    completion = run(gateway.complete(spec, MESSAGES))
    assert server.requests[0].headers["authorization"] == "Bearer local-token-abcdef"
    assert "local-token-abcdef" not in completion.text


@pytest.mark.parametrize("model", ["openai/llama-3-8b", "aiohttp_openai/llama-3-8b"])
def test_local_server_without_key_gets_placeholder(
    model: str, server: FakeServer, gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    run(gateway.complete(spec_for(server, model=model), MESSAGES))
    assert server.requests[0].headers["authorization"] == "Bearer no-key-required"


def test_redact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_API_KEY", "acme-0123456789")
    monkeypatch.setenv("SHORT_API_KEY", "abc")  # too short to redact safely
    text = redact("k=sk-proj-AbC_123-xyz; Authorization: Bearer tok.en/123456789; acme-0123456789 abc")
    assert "sk-proj" not in text and "tok.en" not in text and "acme-0123456789" not in text
    assert text.endswith(" abc")
    assert redact("") == ""
    assert redact("nothing secret here") == "nothing secret here"


# --------------------------------------------------------------------------- structured output, context
@pytest.mark.parametrize("model", ROUTES)
def test_structured_output_passes_json_schema(model: str, server: FakeServer, gateway: Gateway) -> None:
    schema = {"type": "object", "properties": {"chat": {"type": "string"}}, "required": ["chat"]}
    spec = spec_for(server, model, structured="true")
    ctx = {
        "response_schema": schema,
        "response_schema_name": "agent_turn",
        "case": {"truth": {"x": "SECRET-TRUTH"}},
    }
    run(gateway.complete(spec, MESSAGES, context=ctx))
    body = server.requests[0].body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "agent_turn", "schema": schema},
    }
    # The context never travels to a real provider (only built-ins read it).
    assert "SECRET-TRUTH" not in server.requests[0].raw_body.decode()
    assert "metadata" not in body
    # Without a schema: JSON-object mode; without structured: nothing.
    run(gateway.complete(spec, MESSAGES))
    assert server.requests[1].body["response_format"] == {"type": "json_object"}
    run(gateway.complete(spec_for(server, model), MESSAGES, context=ctx))
    assert "response_format" not in server.requests[2].body


@pytest.mark.parametrize("model", ROUTES)
def test_request_carries_params(model: str, server: FakeServer, gateway: Gateway) -> None:
    spec = spec_for(server, model, temperature=0.2, max_tokens=33, seed=5)
    run(gateway.complete(spec, MESSAGES))
    body = server.requests[0].body
    assert body["model"] == "gpt-4o-mini"
    assert body["messages"] == MESSAGES
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.2, 33, 5)


@pytest.mark.parametrize("via_litellm", [False, True])
def test_builtin_answers_with_context(cache_dir: Path, via_litellm: bool) -> None:
    """Built-ins answer the same with or without litellm in between (the gateway uses it by default)."""
    gateway = Gateway(cache_dir=cache_dir, max_retries=3, base_delay=0.001, max_delay=0.02, default_timeout=5,
                      seed=1, builtins_via_litellm=via_litellm)
    litellm = gw.load_litellm()
    registered = {item["provider"] for item in litellm.custom_provider_map}
    assert {"baseline", "scripted"} <= registered
    ctx = {
        "case": {
            "truth": {"intent": "refund"},
            "expected_path": ["a", "b"],
            "expected_finals": {"Action": "x"},
        }
    }
    spec = ModelSpec(role="agent", model="baseline/oracle", params={"temperature": 0})
    completion = run(gateway.complete(spec, [{"role": "user", "content": "hello"}], context=ctx))
    reply = json.loads(completion.text)
    assert reply["classification_output"] == {"intent": "refund"}
    assert (completion.cost, completion.cost_known, completion.cached) == (0.0, True, False)
    assert completion.attempts == 1
    # Built-ins are never cached (their answer depends on the context, not only the prompt).
    assert not run(gateway.complete(spec, [{"role": "user", "content": "hello"}], context=ctx)).cached
    assert not cache_dir.exists() or not list(cache_dir.rglob("*.json"))


def test_builtin_calls_carry_their_provider_and_a_logged_one_its_price(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A built-in call tells litellm, per call, its provider (not resolved from the model string) and, when
    litellm logs it, its price (0: the logging payload does not search the cost map for the model); the
    price stays on the call (litellm's global cost map is not written to)."""
    litellm = gw.load_litellm()
    cost_map = dict(litellm.model_cost)
    seen = spy_on_litellm(monkeypatch)
    gateway = Gateway(cache_dir=cache_dir, default_timeout=5)
    spec = ModelSpec(role="user", model="scripted/user")
    ctx = {"case": {"intent_description": "I want a refund"}, "turn": 1}
    completion = run(gateway.complete(spec, [{"role": "user", "content": "start"}], context=ctx))
    assert completion.text and (completion.cost, completion.cost_known) == (0.0, True)
    (kwargs,) = seen
    assert kwargs["custom_llm_provider"] == "scripted"
    # not logged by litellm (the default), a built-in call needs no price: its answer states its cost
    assert "input_cost_per_token" not in kwargs and "output_cost_per_token" not in kwargs
    logged = Gateway(cache_dir=cache_dir, default_timeout=5, litellm_logging=True)
    assert run(logged.complete(spec, [{"role": "user", "content": "start"}], context=ctx)).cost_known
    assert (seen[-1]["input_cost_per_token"], seen[-1]["output_cost_per_token"]) == (0.0, 0.0)
    assert litellm.model_cost == cost_map
    agent = ModelSpec(role="agent", model="openai/gpt-4o-mini", params={"api_base": "http://127.0.0.1:9/v1"})
    real_kwargs = gateway._call_kwargs(agent, [], None)
    assert not {"custom_llm_provider", "input_cost_per_token", "output_cost_per_token"} & real_kwargs.keys()


JUDGE_PROMPT = ("## Conversation\n[Turn 1]\nCustomer: My intent is a refund; f is 1.\nAgent: Noted.\n\n"
                "## Output format\n")
"""What the scripted judge reads: the conversation of a judge prompt (it labels what the customer named)."""


def test_direct_litellm_call_reaches_builtin() -> None:
    """The same path any litellm caller takes: metadata carries the context."""
    litellm = gw.load_litellm()
    ctx = {"case": {"truth": {"f": 1}}, "scenario": {"fields": {"f": [1, 2]}}}
    response = run(
        litellm.acompletion(
            model="scripted/truth",
            messages=[{"role": "user", "content": JUDGE_PROMPT}],
            metadata={gw.CONTEXT_METADATA_KEY: ctx},
        )
    )
    assert json.loads(response.choices[0].message.content)["labels"] == {"f": 1}  # the customer named f


@pytest.mark.parametrize("via_litellm", [False, True])
def test_builtin_provider_bug_is_not_retried(cache_dir: Path, monkeypatch: pytest.MonkeyPatch, via_litellm: bool) -> None:
    gateway = Gateway(cache_dir=cache_dir, max_retries=3, base_delay=0.001, max_delay=0.02, default_timeout=5,
                      seed=1, builtins_via_litellm=via_litellm)
    calls: list[int] = []

    def broken(messages: Any, context: Any) -> str:
        calls.append(1)
        raise RuntimeError("provider bug")

    monkeypatch.setitem(providers.BUILTIN_MODELS, "baseline/oracle", broken)
    with pytest.raises(InfraFailure) as info:
        run(gateway.complete(ModelSpec(role="agent", model="baseline/oracle"), MESSAGES, context={}))
    assert info.value.kind == "bad_request" and info.value.attempts == 1
    assert "provider bug" in str(info.value)
    assert len(calls) == 1


@pytest.mark.parametrize("model", ROUTES)
def test_complete_sync_across_event_loops(model: str, server: FakeServer, cache_dir: Path) -> None:
    gateway = Gateway(cache_dir=cache_dir, concurrency=2, cache=False)
    spec = spec_for(server, model)
    assert gateway.complete_sync(spec, MESSAGES).text == "ok"
    assert gateway.complete_sync(spec, MESSAGES).text == "ok"  # a new loop gets a new semaphore
    assert gateway.stats.calls == 2


def test_aiohttp_session_is_per_loop_and_closed_with_it(
    server: FakeServer, cache_dir: Path, recwarn: pytest.WarningsRecorder
) -> None:
    """litellm's own aiohttp session is bound to the first loop ("Event loop is closed" after it);
    the gateway's is one per loop, reused within it, and closed when the loop ends or on aclose."""
    gateway = Gateway(cache_dir=cache_dir, cache=False)
    spec = spec_for(server, "aiohttp_openai/local-model")
    sessions = []

    async def twice() -> None:
        for _ in range(2):
            await gateway.complete(spec, MESSAGES)
            sessions.append(gateway.wire.session)

    run(twice())
    assert sessions[0] is sessions[1] and sessions[0].closed  # reused in the loop, closed at its end
    run(twice())
    assert sessions[2] is not sessions[0] and sessions[2].closed

    async def explicit() -> bool:
        async with Gateway(cache_dir=cache_dir, cache=False) as g:
            await g.complete(spec, MESSAGES)
            session = g.wire.session
        return session.closed

    assert run(explicit())
    assert len(server.requests) == 5
    assert not [w for w in recwarn if "Unclosed" in str(w.message)]


# --------------------------------------------------------------------------- import hygiene
def test_import_is_lazy_and_offline(tmp_path: Path) -> None:
    """Importing gateway must not import litellm; loading it and a built-in call must not touch the network."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys, time\n"
        "hits = []\n"
        "def hook(event, args):\n"
        "    if event in ('socket.connect', 'socket.getaddrinfo', 'socket.gethostbyname'):\n"
        "        hits.append((event, str(args)[:80]))\n"
        "sys.addaudithook(hook)\n"
        "t = time.perf_counter()\n"
        "import sopgraph.simulation.gateway as g\n"
        "assert 'litellm' not in sys.modules, 'litellm imported eagerly'\n"
        "import_s = time.perf_counter() - t\n"
        "g.load_litellm()\n"
        "import asyncio\n"
        "spec = g.ModelSpec(role='agent', model='baseline/oracle')\n"
        "asyncio.run(g.Gateway(cache=False).complete(spec, [{'role': 'user', 'content': 'hi'}]))\n"
        "assert not hits, hits\n"
        "print(f'ok {import_s:.3f}')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ok ")
    # Laziness is asserted inside the probe ('litellm' not in sys.modules); the time is only a sanity
    # bound, generous for a loaded shared machine (an eager litellm import takes ~2 s idle, ~12 s loaded).
    assert float(proc.stdout.split()[1]) < 20.0


def test_infra_failure_pickles() -> None:
    import pickle

    exc = InfraFailure(
        "agent x: timeout", kind="timeout", role="agent", model="x", attempts=3, retryable=True
    )
    back = pickle.loads(pickle.dumps(exc))
    assert (str(back), back.kind, back.attempts, back.retryable) == ("agent x: timeout", "timeout", 3, True)


def test_pydantic_objects_in_context_reach_builtins(gateway: Gateway) -> None:
    from pydantic import BaseModel

    class FakeCase(BaseModel):
        id: str
        truth: dict[str, str]

    ctx = {"case": FakeCase(id="c1", truth={"intent": "refund"})}
    completion = run(gateway.complete(ModelSpec(role="judge1", model="scripted/truth"),
                                      [{"role": "user", "content": JUDGE_PROMPT}], context=ctx))
    assert json.loads(completion.text)["labels"] == {"intent": "refund"}  # the customer named the intent


def test_an_unpriced_model_gets_a_zero_per_call_price_after_its_first_answer(
        server: FakeServer, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """litellm searched its whole cost map for an unpriced model on every call (~0.3 ms); once a call
    shows that it cannot price the model, later calls carry a zero per-call price and still count as of
    unknown cost. A priced model, and a model the user priced, never get the zero price."""
    seen = spy_on_litellm(monkeypatch)
    gateway = Gateway(cache=False, cache_dir=cache_dir, default_timeout=5, max_retries=0)
    local = spec_for(server, model="aiohttp_openai/my-local-finetune")
    answers = [run(gateway.complete(local, MESSAGES)) for _ in range(3)]
    assert [(a.cost, a.cost_known) for a in answers] == [(0.0, False)] * 3
    assert gateway.stats.unknown_cost_calls == 3
    assert ["input_cost_per_token" in k for k in seen] == [False, True, True]
    assert all(k.get("input_cost_per_token", 0.0) == 0.0 for k in seen)
    # the zero price comes as the call's deployment entry too (litellm then does not search its cost map
    # to explain a zero), which litellm keeps to itself: the server never sees it
    entries = [(k.get("litellm_metadata") or {}).get("model_info") for k in seen]
    assert entries[0] is None and entries[1] == entries[2]
    assert entries[1]["input_cost_per_token"] == entries[1]["output_cost_per_token"] == 0.0
    assert not any(b"model_info" in r.raw_body or b"metadata" in r.raw_body for r in server.requests)
    seen.clear()
    priced = [run(gateway.complete(spec_for(server), MESSAGES)) for _ in range(2)]
    assert all(p.cost > 0 and p.cost_known for p in priced) and not any("input_cost_per_token" in k for k in seen)
    seen.clear()
    own = spec_for(server, model="openai/my-priced-finetune", input_cost_per_token="0.001",
                   output_cost_per_token="0.002")
    mine = [run(gateway.complete(own, MESSAGES)) for _ in range(2)]
    assert all(m.cost > 0 and m.cost_known for m in mine)
    assert [k["input_cost_per_token"] for k in seen] == [0.001, 0.001]


def test_the_inline_executor_runs_marked_work_on_the_calling_thread_and_the_rest_on_threads() -> None:
    """Only the task that marked itself prepares inline: a task started during its call (as litellm starts
    its logging worker) inherits the mark but not inline execution."""
    import threading

    from sopgraph.simulation.gateway import _INLINE_PREPARATION, InlinePreparationExecutor

    async def probe() -> tuple[bool, bool, bool, bool]:
        here = threading.get_ident()
        with InlinePreparationExecutor(max_workers=1) as executor:
            unmarked = executor.submit(threading.get_ident).result() == here
            token = _INLINE_PREPARATION.set(asyncio.current_task())
            try:
                marked = executor.submit(threading.get_ident).result() == here
                failed = executor.submit(int, "not a number").exception()

                async def spawned() -> bool:
                    return executor.submit(threading.get_ident).result() == here

                child = await asyncio.create_task(spawned())
            finally:
                _INLINE_PREPARATION.reset(token)
        return unmarked, marked, isinstance(failed, ValueError), child

    assert asyncio.run(probe()) == (False, True, True, False)


class _CountingExecutor(gw.InlinePreparationExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.inline = self.pooled = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        if gw._inline_here():
            self.inline += 1
        else:
            self.pooled += 1
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize(("model", "inline"), [("scripted/user", True), ("aiohttp_openai/local", True),
                                               ("openai/local", False)])
def test_gateway_calls_prepare_inline_only_on_cpu_only_routes(model: str, inline: bool, server: FakeServer,
                                                              cache_dir: Path) -> None:
    """Built-in providers and aiohttp routes prepare on the loop's thread (no GIL hand-off per call);
    other routes (whose preparation may refresh credentials over the network) keep litellm's thread."""
    gateway = Gateway(cache=False, cache_dir=cache_dir, default_timeout=5, max_retries=0)
    spec = (ModelSpec(role="user", model=model) if model.startswith("scripted/")
            else spec_for(server, model=model))
    ctx = {"case": {"intent_description": "I want a refund"}, "turn": 1}

    async def call() -> tuple[int, int]:
        executor = _CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        await gateway.complete(spec, MESSAGES, context=ctx)
        return executor.inline, executor.pooled

    counts = run(call())
    assert counts[0 if inline else 1] >= 1 and counts[1 if inline else 0] == 0, counts


def test_the_aiohttp_route_counts_the_tokens_the_server_reports(server: FakeServer, cache_dir: Path) -> None:
    """litellm's `aiohttp_openai/` route drops the body's `usage`: every call counted 0 tokens and a model
    priced per call cost 0. The gateway's session keeps the usage and the call is priced from it, as on
    `openai/`; an unpriced model stays of unknown cost (its later calls too, with their tokens)."""
    gateway = Gateway(cache=False, cache_dir=cache_dir, default_timeout=5, max_retries=0)
    for route in ("aiohttp_openai", "openai"):
        priced = spec_for(server, model=f"{route}/my-priced-finetune", input_cost_per_token="0.001",
                          output_cost_per_token="0.002")
        server.script([Behavior.ok("x", prompt_tokens=1000, completion_tokens=500)])
        answer = run(gateway.complete(priced, MESSAGES))
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (1000, 500), route
        assert answer.cost == pytest.approx(1000 * 0.001 + 500 * 0.002) and answer.cost_known, route
    unpriced = spec_for(server, model="aiohttp_openai/my-local-finetune")
    for tokens in (300, 200):
        server.script([Behavior.ok("x", prompt_tokens=tokens, completion_tokens=7)])
        answer = run(gateway.complete(unpriced, MESSAGES))
        assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.cost, answer.cost_known) == (
            tokens, 7, 0.0, False)


_FORKED_FIRST_CALL = r"""
import asyncio, json, os, sys, threading
from sopgraph.simulation.gateway import Gateway, ModelSpec, load_litellm, warm_up_litellm
load_litellm()
if sys.argv[1] == "warm":
    warm_up_litellm()
threads = threading.active_count()
logging_worker = sys.modules.get("litellm.litellm_core_utils.logging_worker")
pending = logging_worker.GLOBAL_LOGGING_WORKER.pending_count if logging_worker else 0  # litellm's property
read, write = os.pipe()
if os.fork() == 0:
    async def first_call():
        gateway = Gateway(concurrency=1, cache=False)
        await gateway.complete(ModelSpec(role="user", model="scripted/user"), [{"role": "user", "content": "hi"}],
                               context={})
        await gateway.aclose()
    before = set(sys.modules)
    asyncio.run(first_call())
    os.write(write, json.dumps(sorted(set(sys.modules) - before)).encode())
    os._exit(0)
os.close(write)
print(json.dumps({"threads": threads, "pending_logs": pending,
                  "imported_by_child": json.loads(os.read(read, 1 << 20) or b"[]")}))
"""


@pytest.mark.parametrize("warm", [False, True])
def test_a_warmed_up_process_forks_children_whose_first_call_imports_nothing(warm: bool) -> None:
    """litellm imports about 65 modules and loads a tokenizer on a process's first call; `warm_up_litellm`
    does that work in the process about to fork (and leaves it with no other thread and nothing queued in
    litellm's logging worker for the children to inherit), so a forked child's first call imports nothing.
    Cold, the child does it all again."""
    out = subprocess.run([sys.executable, "-c", _FORKED_FIRST_CALL, "warm" if warm else "cold"],
                         capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["threads"] == 1 and report["pending_logs"] == 0
    imported = [m for m in report["imported_by_child"] if m.startswith(("litellm", "tiktoken"))]
    assert (imported == []) if warm else (len(imported) > 10)


@pytest.mark.parametrize("model", ROUTES)
def test_an_answer_over_the_size_limit_is_refused_not_retried(model: str, server: FakeServer, gateway: Gateway) -> None:
    """Issue 29: nothing bounded a model's answer; one over `max_answer_bytes` (default 1 MiB) is an
    infrastructure failure naming its size, not retried (the model would say the same) and never returned."""
    server.set_default(Behavior.ok("é" * 600_000))  # 600,000 characters, 1,200,000 bytes
    with pytest.raises(InfraFailure) as info:
        run(gateway.complete(spec_for(server, model), MESSAGES))
    assert info.value.kind == "too_large" and not info.value.retryable and len(server.requests) == 1
    assert "the answer is 1,200,000 bytes, over the limit of 1,048,576 (max_answer_bytes=)" in str(info.value)
    answer = run(gateway.complete(spec_for(server, model, max_answer_bytes=2_000_000), MESSAGES))
    assert len(answer.text) == 600_000
    assert spec_for(server, model, max_answer_bytes=5).params.max_answer_bytes == 5
