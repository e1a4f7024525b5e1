"""Helpers shared by several test modules (imported as a plain module: tests/ is on sys.path)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def gen_sop() -> ModuleType:
    """The benchmark generator of large synthetic SOPs (benchmarks/gen_sop.py), loaded once."""
    if "gen_sop" in sys.modules:
        return sys.modules["gen_sop"]
    spec = importlib.util.spec_from_file_location("gen_sop", ROOT / "benchmarks" / "gen_sop.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_sop"] = mod
    spec.loader.exec_module(mod)
    return mod
