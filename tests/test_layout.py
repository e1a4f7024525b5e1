"""The package layout is the pipeline: no module imports the façade, litellm lives in one module."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sopgraph"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def test_no_module_imports_the_package_facade() -> None:
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if p.name != "__init__.py" or p.parent != PACKAGE
                 for m in _imports(p) if m == "sopgraph" or (m == ".." and p.parent.parent == PACKAGE)]
    assert offenders == []


def test_litellm_is_imported_in_exactly_one_module() -> None:
    importers = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                       if any(m == "litellm" or m.startswith("litellm.") for m in _imports(p)))
    assert importers == ["simulation/gateway.py"]


def test_stage_packages_exist_in_pipeline_order() -> None:
    stages = ["language", "logic", "cases", "simulation", "evaluation", "authoring", "cli"]
    assert all((PACKAGE / s / "__init__.py").is_file() for s in stages)
    text = (PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8")
    positions = [text.index(f'"sopgraph.{s}"') for s in reversed(stages)]
    assert positions == sorted(positions)
