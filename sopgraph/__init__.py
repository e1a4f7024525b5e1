"""sopgraph: compile customer-service SOPs into executable graphs and evaluate agents on them.

The public API is the handful of functions a user scripts against; everything else lives in the
stage packages (`language`, `logic`, `cases`, `simulation`, `evaluation`, `cli`). No module inside
the package imports this façade.
"""

from __future__ import annotations

import importlib as _importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sopgraph._version import __version__
from sopgraph.errors import ArgumentError, Error

if TYPE_CHECKING:
    import networkx as nx

    from sopgraph.cases.profiles import Profile, default_profile
    from sopgraph.cases.synth import SynthResult
    from sopgraph.evaluation.score import ScoreConfig, ScoredRun
    from sopgraph.language.diagnostics import Diagnostic, SopError
    from sopgraph.language.ir import Scenario
    from sopgraph.logic.checker import load
    from sopgraph.logic.engine import DecideError, Decision
    from sopgraph.logic.paths import PathCount, PathInfo
    from sopgraph.logic.session import Act, End, Need, Session, decide, start
    from sopgraph.simulation.runner import run_sync


def check(scenario: Scenario) -> list[Diagnostic]:
    """Every static-check diagnostic of a loaded scenario (errors and warnings)."""
    from sopgraph.logic.checker import check as _check

    return _check(scenario)


def compile_graph(scenario: Scenario) -> nx.DiGraph:
    """The scenario's NetworkX DiGraph (see `sopgraph.language.compile`)."""
    from sopgraph.language.compile import compile_graph as _compile_graph

    return _compile_graph(scenario)


def iter_paths(scenario: Scenario, *, limit: int | None = None) -> Any:
    """Lazily enumerate the feasible paths (`PathInfo`: stages, finals, constraints, witness)."""
    from sopgraph.logic.paths import iter_paths as _iter_paths

    return _iter_paths(scenario, limit=limit)


def count_paths(scenario: Scenario) -> PathCount:
    """Feasible paths and distinct stage sequences, counted without enumerating."""
    from sopgraph.logic.paths import count_paths as _count_paths

    return _count_paths(scenario)


def synthesize(scenario: Scenario, n: int, seed: int = 0, *, profile: Profile | None = None,
               **options: Any) -> SynthResult:
    """Coverage-balanced test cases (`SynthResult`); the profile defaults to the shipped library."""
    from sopgraph.cases.profiles import default_profile as _default_profile
    from sopgraph.cases.synth import synthesize as _synthesize

    return _synthesize(scenario, profile or _default_profile(scenario), n, seed, **options)


# Every stage loads on first use of its names, not on `import sopgraph`: importing the package is what
# every `sop` command pays at start-up (Python imports this façade before any `sopgraph.*` module), and
# `sop check` needs neither the graph library (networkx), the profiles (yaml), synthesis, nor the simulation
# and evaluation stages (httpx, asyncio, numpy, the runner and its store). `sopgraph.X` and
# `from sopgraph import X` import X's module once and keep the name here.
_LAZY = {"run_sync": "sopgraph.simulation.runner",
         "ScoreConfig": "sopgraph.evaluation.score",
         "ScoredRun": "sopgraph.evaluation.score",
         "Profile": "sopgraph.cases.profiles",
         "default_profile": "sopgraph.cases.profiles",
         "SynthResult": "sopgraph.cases.synth",
         "Diagnostic": "sopgraph.language.diagnostics",
         "SopError": "sopgraph.language.diagnostics",
         "Scenario": "sopgraph.language.ir",
         "load": "sopgraph.logic.checker",
         "DecideError": "sopgraph.logic.engine",
         "Decision": "sopgraph.logic.engine",
         "decide": "sopgraph.logic.session",
         "start": "sopgraph.logic.session",
         "Session": "sopgraph.logic.session",
         "Need": "sopgraph.logic.session",
         "Act": "sopgraph.logic.session",
         "End": "sopgraph.logic.session",
         "PathCount": "sopgraph.logic.paths",
         "PathInfo": "sopgraph.logic.paths"}


def __getattr__(name: str) -> Any:
    """The public names of the stages (`_LAZY`), imported on first use."""
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sopgraph' has no attribute {name!r}")


def run(*args: Any, **kwargs: Any) -> Any:
    """Simulate and judge dialogues, blocking (wrapper of `sopgraph.simulation.runner.run`).

    Inside a running event loop (a Jupyter notebook, an async application) use `await arun(...)`;
    called there anyway, `run` runs the run on its own loop in a helper thread and waits for it."""
    import asyncio
    import threading

    run_sync = __getattr__("run_sync")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_sync(*args, **kwargs)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = run_sync(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=target, name="sopgraph-run")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


async def arun(*args: Any, **kwargs: Any) -> Any:
    """`run` as a coroutine, for code already in an event loop: `summary = await sopgraph.arun(...)`."""
    from sopgraph.simulation.runner import run as _arun  # lazy: see _LAZY above

    return await _arun(*args, **kwargs)


def score_run(run_dir: str | Path, config: Any = None) -> Any:
    """Score a stored run (`ScoredRun`; `.summary()` gives the headline metrics; `config`: a `ScoreConfig`)."""
    from sopgraph.evaluation.score import score_run as _score_run  # lazy: see _LAZY above

    return _score_run(run_dir, config)


__all__ = [
    "Act",
    "ArgumentError",
    "Decision",
    "DecideError",
    "Diagnostic",
    "End",
    "Error",
    "Need",
    "PathCount",
    "PathInfo",
    "Profile",
    "Scenario",
    "ScoreConfig",
    "ScoredRun",
    "Session",
    "SopError",
    "SynthResult",
    "__version__",
    "arun",
    "check",
    "compile_graph",
    "count_paths",
    "decide",
    "default_profile",
    "load",
    "iter_paths",
    "run",
    "run_sync",
    "score_run",
    "start",
    "synthesize",
]


def __dir__() -> list[str]:
    """`dir(sopgraph)` lists the public API, not the names this module happens to import."""
    return sorted(__all__)
