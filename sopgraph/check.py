"""Static checks (placeholder wiring; the full pass list lands with the checker work)."""

from __future__ import annotations

from .diagnostics import Diagnostic
from .ir import Scenario


def check(scenario: Scenario) -> list[Diagnostic]:
    return []
