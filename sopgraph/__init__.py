"""sopgraph: compile customer-service SOPs into executable graphs and evaluate agents on them.

The public API is the handful of functions a user scripts against; everything else is internal.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

from .diagnostics import Diagnostic, SopError  # noqa: E402
from .engine import DecideError, Decision, decide  # noqa: E402
from .ir import Scenario  # noqa: E402


def load(path: str | Path | None = None, *, text: str | None = None, check: bool = True) -> Scenario:
    """Load a `.sop` program (file or text), merge includes, inline subflows and, by default,
    run the static checker. Raises `SopError` (with every diagnostic) if there are errors."""
    from .parse import load_source

    loaded = load_source(path, text=text)
    diagnostics = list(loaded.diagnostics)
    if loaded.scenario is not None and check and not any(d.is_error for d in diagnostics):
        from .checker import check as run_checks

        diagnostics += run_checks(loaded.scenario)
    errors = [d for d in diagnostics if d.is_error]
    if errors or loaded.scenario is None:
        raise SopError(errors or diagnostics, loaded.sources)
    return loaded.scenario


def check(scenario: Scenario) -> list[Diagnostic]:
    """Every static-check diagnostic of a loaded scenario (errors and warnings)."""
    from .checker import check as _check

    return _check(scenario)


def compile_graph(scenario: Scenario):
    """The scenario's NetworkX DiGraph (see `sopgraph.compile`)."""
    from .compile import compile_graph as _compile

    return _compile(scenario)


def iter_paths(scenario: Scenario, *, limit: int | None = None):
    """Lazily enumerate the feasible paths (`PathInfo`: stages, finals, constraints, witness)."""
    from .paths import iter_paths as _iter

    return _iter(scenario, limit=limit)


def count_paths(scenario: Scenario):
    """Feasible paths and distinct stage sequences, counted without enumerating."""
    from .paths import count_paths as _count

    return _count(scenario)


def synthesize(scenario: Scenario, n: int, seed: int = 0, *, profile=None, **options):
    """Coverage-balanced test cases (`SynthResult`); the profile defaults to the shipped library."""
    from .profiles import default_profile
    from .synth import synthesize as _synthesize

    return _synthesize(scenario, profile or default_profile(scenario), n, seed, **options)


def run(*args, **kwargs):
    """Simulate and judge dialogues (blocking wrapper of `sopgraph.runner.run`)."""
    from .runner import run_sync

    return run_sync(*args, **kwargs)


def score_run(run_dir: str | Path, config=None):
    """Score a stored run (`ScoredRun`; `.summary()` gives the headline metrics)."""
    from .score import score_run as _score

    return _score(run_dir, config)


__all__ = [
    "Decision",
    "DecideError",
    "Diagnostic",
    "Scenario",
    "SopError",
    "check",
    "compile_graph",
    "count_paths",
    "decide",
    "load",
    "iter_paths",
    "run",
    "score_run",
    "synthesize",
]
