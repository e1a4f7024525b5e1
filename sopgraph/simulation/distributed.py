"""Batches of work on a Ray cluster, streamed back to one driver.

Why this shape: the run store has one writer (the driver), so exactly-once and `--resume` hold as
they do with worker processes. The driver deals the work out in batches to Ray tasks and keeps a
bounded number of them in flight (flat driver memory whatever the run's size); each task runs its
batch with the function it is given (the runner's dialogue code, which builds the task's own
gateway and concurrency cap) and returns its result; the driver hands each result on as soon as it
arrives (`ray.wait`). A task lost with its worker or node is rerun by Ray (`max_retries`): its
result is applied only when it returns, so nothing is lost and nothing is applied twice.

This module knows nothing about dialogues or stores: the runner passes the batch function (a
module-level function, so Ray ships it by reference) and the data. Ray is an optional extra and is
imported only here, only when asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sopgraph.errors import Error

INSTALL_HINT = "--ray needs Ray, which is not installed: pip install 'sopgraph[ray]'"
LOCAL = "local"
"""The `ray` address meaning: start a Ray instance on this machine for this run only."""
LOCAL_OBJECT_STORE = 256 * 2**20
"""Object store of a local instance: batches' results are small and few are in flight at once."""
MAX_RETRIES = 5
"""Reruns of a batch whose worker or node died (Ray `max_retries`); an error raised by the batch
function itself is not retried (it would fail again)."""


class DistributedError(Error):
    """Ray is missing, a cluster cannot be joined, or a batch failed for good."""


def load_ray() -> ModuleType:
    """The `ray` module, or a `DistributedError` saying in one line how to install it."""
    try:
        import ray
    except ImportError:
        raise DistributedError(INSTALL_HINT) from None
    return ray


def check(address: str | None, timeout: float = 5.0) -> None:
    """Before a run creates anything: Ray must be installed and a cluster address must accept a TCP
    connection (`ray.init` on an unreachable address retries for minutes). One-line `DistributedError`."""
    load_ray()
    if address in (None, LOCAL, "auto"):
        return
    host, sep, port = str(address).rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise DistributedError(f"--ray takes HOST:PORT (e.g. 10.0.0.5:6379) or auto, not {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise DistributedError(f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}); "
                               "is `ray start --head` running there?") from None


@contextlib.contextmanager
def connect(address: str | None, num_cpus: int | None = None) -> Iterator[ModuleType]:
    """Ray, initialised for the duration of the block and shut down after it.

    `address` None or `local`: a new Ray instance on this machine (`num_cpus` CPUs, no dashboard,
    bound to 127.0.0.1 so that nothing listens on a public interface); otherwise the address of a
    running cluster to join (`ray start --head` prints it; `auto` finds one started on this machine).
    A Ray already initialised by the caller (a script, a test) is used as it is and left running."""
    ray = load_ray()
    if ray.is_initialized():
        yield ray
        return
    try:
        if address in (None, LOCAL):
            ray.init(address=LOCAL, num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                     object_store_memory=LOCAL_OBJECT_STORE, logging_level=logging.WARNING)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise DistributedError(f"cannot start or join Ray at {address or LOCAL}: {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


@dataclass
class BatchResult:
    """What one batch returned, where it ran and how long it took there."""
    index: int
    value: Any
    node_id: str
    seconds: float
    size: int


@dataclass
class NodeRates:
    """Items finished per node, for progress: which nodes pull their weight."""
    started: float = field(default_factory=time.monotonic)
    done: dict[str, int] = field(default_factory=dict)

    def add(self, node_id: str, items: int) -> None:
        self.done[node_id] = self.done.get(node_id, 0) + items

    def text(self) -> str:
        """`2 nodes: 3f9a1c 41 (12.3/s), 77b0de 39 (11.7/s)` (short node ids, in first-seen order)."""
        elapsed = max(time.monotonic() - self.started, 1e-6)
        parts = [f"{node[:6]} {n} ({n / elapsed:.1f}/s)" for node, n in self.done.items()]
        return f"{len(parts)} node{'s' if len(parts) != 1 else ''}: " + ", ".join(parts)


def _run_batch(fn: Callable[[Any, Any], Any], common: Any, payload: Any) -> tuple[Any, str, float]:
    """A Ray task's body: `fn(common, payload)`, with the node it ran on and its duration."""
    import ray

    started = time.perf_counter()
    value = fn(common, payload)
    return value, ray.get_runtime_context().get_node_id(), time.perf_counter() - started


def cluster_cpus(ray: ModuleType) -> int:
    """CPUs of the cluster as Ray counts them (at least 1)."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


async def run_batches(ray: ModuleType, fn: Callable[[Any, Any], Any], common: Any,
                      batches: Iterable[tuple[Any, int]], on_result: Callable[[BatchResult], None], *,
                      in_flight: int, max_retries: int = MAX_RETRIES, wait_s: float = 0.5) -> None:
    """Run `fn(common, payload)` for every `(payload, size)` of `batches` as Ray tasks, at most
    `in_flight` at once, and call `on_result` for each as it finishes (in finishing order).

    `common` goes to the object store once (`ray.put`), not with every task. `batches` is consumed
    lazily, so the driver holds only the batches in flight. A task whose worker or node died is rerun
    by Ray; one that still fails, or whose function raised, stops the run with a `DistributedError`
    (results already handed on stay handed on; the others are cancelled)."""
    common_ref = ray.put(common)
    task = ray.remote(num_cpus=1, max_retries=max_retries)(_run_batch)
    source = enumerate(batches)
    pending: dict[Any, tuple[int, int]] = {}

    def refill() -> None:
        while len(pending) < max(1, in_flight):
            nxt = next(source, None)
            if nxt is None:
                return
            index, (payload, size) = nxt
            pending[task.remote(fn, common_ref, payload)] = (index, size)

    refill()
    try:
        while pending:
            ready, _ = await asyncio.to_thread(ray.wait, list(pending), num_returns=1, timeout=wait_s)
            for ref in ready:
                index, size = pending.pop(ref)
                try:
                    value, node_id, seconds = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - any Ray or batch error ends the run cleanly
                    raise DistributedError(f"batch {index} failed on Ray: {_first_lines(exc)}") from None
                on_result(BatchResult(index=index, value=value, node_id=node_id, seconds=seconds, size=size))
            refill()
    finally:
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)


def _first_lines(exc: BaseException, lines: int = 12) -> str:
    text = str(exc).strip().splitlines()
    return "\n".join(text[:lines] + (["…"] if len(text) > lines else []))


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """`items` in lists of `size` (the last may be shorter), lazily."""
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def subset(mapping: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The entries of `mapping` for `keys` (a batch ships only the cases it needs)."""
    return {k: mapping[k] for k in dict.fromkeys(keys)}
