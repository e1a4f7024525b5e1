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


def _private_imports(source: str, module: str) -> list[str]:
    """`_private` names a module takes from other sopgraph modules: `from sopgraph.x import _y`
    (or relative), and `mod._y` / `Cls._y` on a name it imported from sopgraph."""
    tree = ast.parse(source)
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> sopgraph module it came from
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = ("." * node.level) + (node.module or "")
            if node.level == 0 and not (src == "sopgraph" or src.startswith("sopgraph.")):
                continue
            for alias in node.names:
                if _is_private(alias.name):
                    found.append(f"{module}: from {src} import {alias.name}")
                bound[alias.asname or alias.name] = src
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sopgraph."):
                    found += [f"{module}: import {alias.name}" for part in alias.name.split(".") if _is_private(part)
                              and part != "_version"]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and _is_private(node.attr)):
            found.append(f"{module}: {node.value.id}.{node.attr} (from {bound[node.value.id]})")
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_imports_another_modules_private_names() -> None:
    """Shared code is public and documented: a `_name` taken from another module hides a real API."""
    assert _private_imports("from sopgraph.logic.domain import _neg\n", "probe") == [
        "probe: from sopgraph.logic.domain import _neg"]
    assert _private_imports("from sopgraph.logic import domain\ndomain._Compiler(sp)\n", "probe") == [
        "probe: domain._Compiler (from sopgraph.logic)"]
    assert _private_imports("from ..parse import _ToIR\nfrom os import _exit\n", "probe") == [
        "probe: from ..parse import _ToIR"]
    offenders = [hit for p in sorted(PACKAGE.rglob("*.py"))
                 for hit in _private_imports(p.read_text(encoding="utf-8"), str(p.relative_to(PACKAGE)))]
    assert offenders == []


def test_cli_command_index_names_each_command_s_module() -> None:
    """`sop check` imports only its own command module (start-up time); the index that says where a
    command lives must agree with the modules themselves."""
    from sopgraph.cli import COMMAND_INDEX, COMMAND_MODULES, command_module, top_level_commands

    where = {c.name: name for name in COMMAND_MODULES for c in top_level_commands(command_module(name))}
    assert {k: where.get(k) for k in COMMAND_INDEX} == COMMAND_INDEX


def test_authoring_commands_do_not_load_the_simulation_or_evaluation_stages(tmp_path: Path) -> None:
    """Importing the package and running `sop check` / `sop synth` must not import the runner, the
    scorer or their heavy dependencies (numpy, httpx): every command pays for what it imports."""
    import subprocess
    import sys

    root = PACKAGE.parent
    script = ("import sys\nfrom sopgraph.cli import main\n"
              "for args in (['check', sys.argv[1]], ['synth', sys.argv[1], '-n', '3', '-q']):\n"
              "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
              "heavy = [m for m in sys.modules if m.split('.')[0] in ('numpy', 'httpx')\n"
              "         or m.startswith(('sopgraph.simulation.runner', 'sopgraph.evaluation'))]\n"
              "print(sorted(heavy))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(root / "scenarios" / "telecom_package.sop")],
                          capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
