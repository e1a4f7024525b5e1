"""Golden files: each `tests/golden/<name>.sop` has its rendered diagnostics in
`<name>.diagnostics.txt` and, when it has no errors, its compiled graph in `<name>.graph.json`.

Regenerate after an intended change with `SOP_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`
and review the diff. Files under `tests/golden/lib/` are only included by others.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sopgraph.language.compile import compile_graph, graph_to_json
from sopgraph.language.parse import load_source
from sopgraph.logic.checker import check_file

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("SOP_UPDATE_GOLDEN", "") not in ("", "0")
CASES = sorted(p.stem for p in GOLDEN.glob("*.sop"))


def _portable(text: str) -> str:
    """Included files are named by absolute path; golden output names them relative to golden/."""
    return text.replace(str(GOLDEN) + os.sep, "")


def rendered_diagnostics(name: str) -> tuple[str, bool]:
    path = GOLDEN / f"{name}.sop"
    result = check_file(path, text=path.read_text(encoding="utf-8"), name=f"{name}.sop")
    blocks = [d.render(result.sources) for d in result.diagnostics]
    summary = f"{result.errors} errors, {result.warnings} warnings"
    return _portable("\n\n".join(blocks + [summary]) + "\n"), result.errors == 0


def compiled_graph(name: str) -> str:
    path = GOLDEN / f"{name}.sop"
    loaded = load_source(path, text=path.read_text(encoding="utf-8"), name=f"{name}.sop")
    assert loaded.scenario is not None
    return _portable(graph_to_json(compile_graph(loaded.scenario)))


def apply_compare(path: Path, actual: str) -> None:
    if UPDATE:
        path.write_text(actual, encoding="utf-8")
        return
    assert path.exists(), f"missing golden file {path.name}; run with SOP_UPDATE_GOLDEN=1"
    expected = path.read_text(encoding="utf-8")
    assert actual == expected, f"{path.name} differs (SOP_UPDATE_GOLDEN=1 regenerates it)"


FLOW_CODES = {"flow_non_exhaustive": "E301", "flow_overlap": "W301", "flow_dead_branches": "W303"}


@pytest.mark.parametrize("name, code", sorted(FLOW_CODES.items()))
def test_flow_diagnostics_are_part_of_check(name: str, code: str) -> None:
    text, _ = rendered_diagnostics(name)
    assert f"[{code}]" in text, text
    assert "= example:" in text or code == "W303"


def test_there_are_golden_cases() -> None:
    kinds = {name.split("_")[0] for name in CASES}
    assert {"syntax", "names", "types", "flow", "hygiene", "valid"} <= kinds
    assert len(CASES) >= 25


# What each golden program must give: errors, warnings only, or nothing at all. Every golden file is
# classified (a new one with no class fails), so a golden file can never silently flip between kinds.
ERRORS = ("syntax_", "names_", "types_", "depth_", "flow_stage_cycle", "flow_no_stages", "flow_non_exhaustive")
WARNINGS_ONLY = ("hygiene_", "flow_overlap", "flow_dead_branches", "flow_unreachable")
CLEAN = ("valid_",)


def expected_kind(name: str) -> str:
    for kind, prefixes in (("errors", ERRORS), ("warnings", WARNINGS_ONLY), ("clean", CLEAN)):
        if name.startswith(prefixes):
            return kind
    raise AssertionError(f"golden case {name} is not classified in test_golden.py")


@pytest.mark.parametrize("name", CASES)
def test_golden_diagnostics(name: str) -> None:
    text, clean = rendered_diagnostics(name)
    apply_compare(GOLDEN / f"{name}.diagnostics.txt", text)
    kind = expected_kind(name)
    if kind == "clean":
        assert clean and "0 errors, 0 warnings" in text, text
    elif kind == "warnings":
        assert clean and "0 errors, 0 warnings" not in text, f"{name} should have warnings and no errors"
    else:
        assert not clean, f"{name} should have errors"


@pytest.mark.parametrize("name", CASES)
def test_golden_graph(name: str) -> None:
    graph_file = GOLDEN / f"{name}.graph.json"
    _, clean = rendered_diagnostics(name)
    if not clean:
        assert not graph_file.exists() or UPDATE, f"{graph_file.name} is stale: {name} has errors"
        if UPDATE and graph_file.exists():
            graph_file.unlink()
        return
    apply_compare(graph_file, compiled_graph(name))


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("syntax_")])
def test_syntax_errors_use_user_terms(name: str) -> None:
    text, _ = rendered_diagnostics(name)
    for raw in ("__ANON", "RBRACE", "LBRACE", "$END", "NAME", "STRING", "Token(", "COMP_OP"):
        assert raw not in text, f"raw token name {raw!r} in {name}"
    assert "= hint:" in text and "^" in text
