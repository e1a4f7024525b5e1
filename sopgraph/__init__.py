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
        from .check import check as run_checks

        diagnostics += run_checks(loaded.scenario)
    errors = [d for d in diagnostics if d.is_error]
    if errors or loaded.scenario is None:
        raise SopError(errors or diagnostics, loaded.sources)
    return loaded.scenario


def compile_graph(scenario: Scenario):
    """The scenario's NetworkX DiGraph (see `sopgraph.compile`)."""
    from .compile import compile_graph as _compile

    return _compile(scenario)


__all__ = [
    "Decision",
    "DecideError",
    "Diagnostic",
    "Scenario",
    "SopError",
    "compile_graph",
    "decide",
    "load",
]
