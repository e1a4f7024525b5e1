"""The gateway's one use of a private litellm name (the per-context "do not log this call" mark) sits behind
a feature check: with a litellm that has it the mark is used, with one that lacks it calls go on exactly as
before (logged by litellm and discarded). Both branches run here on the installed litellm (issue 34)."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeServer
from test_gateway import _logged_calls

from sopgraph.simulation import gateway as gw
from sopgraph.simulation.gateway import Gateway, ModelSpec

MESSAGES = [{"role": "user", "content": "My phone shows no service."}]


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as srv:
        yield srv


def _calls(server: FakeServer, cache_dir: Path) -> list[str]:
    async def go() -> list[str]:
        gateway = Gateway(cache_dir=cache_dir, cache=False)
        answers = [
            (await gateway.complete(ModelSpec(role="user", model="scripted/user"), MESSAGES, context={})).text,
            (await gateway.complete(ModelSpec(role="agent", model="aiohttp_openai/gpt-4o-mini",
                                              params={"api_base": server.base_url}), MESSAGES)).text,
        ]
        await asyncio.sleep(0.2)  # litellm logs in a task of its own after the call
        await gateway.aclose()
        return answers

    return asyncio.run(go())


def test_the_feature_check_finds_the_mark_where_litellm_has_it() -> None:
    gw.load_litellm()
    mark = gw._unlogged_mark()
    assert isinstance(mark, ContextVar)


def test_the_feature_check_gives_none_where_litellm_lacks_the_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    gw.load_litellm()
    real_import = builtins.__import__

    def without_internal_context(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "litellm._internal_context":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_internal_context)
    assert gw._unlogged_mark() is None


def test_with_the_mark_litellm_logs_nothing(server: FakeServer, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    gw.load_litellm()
    assert gw._UNLOGGED_MARK is not None
    seen = _logged_calls(monkeypatch)
    answers = _calls(server, tmp_path)
    assert all(answers) and seen == []


def test_without_the_mark_calls_work_and_litellm_logs_them_as_before(server: FakeServer, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gw.load_litellm()
    monkeypatch.setattr(gw, "_UNLOGGED_MARK", None)
    seen = _logged_calls(monkeypatch)
    answers = _calls(server, tmp_path)
    assert all(answers)
    assert len(seen) == 2  # built and discarded, as on a litellm without the mark
