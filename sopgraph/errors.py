"""The one root of every error sopgraph raises on purpose.

A user scripting against the library writes `except sopgraph.Error` and catches every problem sopgraph
reports (bad input, a run that cannot go on, a model that cannot be reached) without catching programming
errors of their own. Each stage package defines its own errors as children of `Error`; where a diagnostic
code exists (`E101`, `W301`, ...) the error carries it as `.code`.
"""

from __future__ import annotations


class Error(Exception):
    """Root of every error sopgraph raises on purpose; `code` is the diagnostic code where one exists."""

    code: str | None = None


class ArgumentError(Error, ValueError):
    """A library function was called with an argument it cannot use (a ValueError too, for old callers)."""
