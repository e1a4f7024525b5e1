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


def _contracts() -> list[dict]:
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["importlinter"]["contracts"]


def test_every_module_of_a_stage_package_is_in_its_package_s_layer_contract() -> None:
    """A module outside every layer list can import its siblings unchecked (issue 34)."""
    named: set[str] = set()
    for contract in _contracts():
        if contract["type"] == "layers":
            for layer in contract["layers"]:
                named.update(part.strip() for part in layer.split("|"))
    missing = []
    for package in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        modules = sorted(m.stem for m in package.glob("*.py") if m.stem != "__init__")
        if len(modules) < 2:  # a package of one module has no siblings to order
            continue
        missing += [f"sopgraph.{package.name}.{m}" for m in modules if f"sopgraph.{package.name}.{m}" not in named]
    top = sorted(m.stem for m in PACKAGE.glob("*.py") if m.stem != "__init__")
    missing += [f"sopgraph.{m}" for m in top if f"sopgraph.{m}" not in named]
    assert missing == []


def _module_graph(planted: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Every import between sopgraph's modules: at the top, inside functions and under `if TYPE_CHECKING:`
    alike (a type-checking import is a dependency that mypy and every reader follow). `from pkg import mod`
    is an edge to `mod`; a package's `__init__` is a target only when a name that is no submodule is taken
    from it. The parents a dotted import initialises first are no edge (every module would reach the
    façade). `planted` replaces or adds modules' sources (the test's own probes)."""
    planted = planted or {}
    paths = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    is_package = {name: path.name == "__init__.py" for name, path in paths.items()}
    is_package.update({name: False for name in planted if name not in paths})

    def resolve(target: str) -> str:
        while target and target not in is_package:
            target = target.rpartition(".")[0]
        return target

    graph: dict[str, set[str]] = {}
    for name, package_like in is_package.items():
        source = planted[name] if name in planted else paths[name].read_text(encoding="utf-8")
        package = name if package_like else name.rpartition(".")[0]
        found: list[str] = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for alias in node.names:
                    found.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in is_package else base)
            elif isinstance(node, ast.Import):
                found += [alias.name for alias in node.names]
        graph[name] = {t for t in map(resolve, found) if t and t not in (name, "sopgraph")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component (so no cycle hides behind another one found first)."""
    import networkx as nx

    g = nx.DiGraph([(a, b) for a, targets in graph.items() for b in targets])
    found = []
    for component in nx.strongly_connected_components(g):
        if len(component) > 1:
            edges = nx.find_cycle(g.subgraph(component), source=min(component))
            found.append([a for a, _ in edges] + [edges[0][0]])
    return sorted(found)


def test_no_import_cycle_even_counting_type_checking_imports() -> None:
    # the test sees what it must: a type-checking import back from the records into a stage, and one
    # inside a function, each close a cycle; `from package import module` is no edge to the package
    probe = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sopgraph.logic.engine import Decision\n"
    assert _cycles(_module_graph({"sopgraph.errors": probe}))
    lazy = "def f():\n    from .logic import engine\n    return engine\n"
    assert [c[:2] for c in _cycles(_module_graph({"sopgraph.errors": lazy}))] == [
        ["sopgraph.errors", "sopgraph.logic.engine"]]
    assert "sopgraph.logic" not in _module_graph()["sopgraph.logic.diffbound"] | _module_graph()["sopgraph.logic.domain"]
    assert _cycles(_module_graph()) == []


def test_every_error_the_library_defines_is_a_sopgraph_error() -> None:
    """`except sopgraph.Error` catches every error sopgraph raises on purpose (issue 34)."""
    import importlib
    import inspect

    import sopgraph

    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        if name.startswith("sopgraph.cli"):
            continue
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name
                    and not attr.startswith("_") and not issubclass(value, sopgraph.Error)):
                outside.append(f"{name}.{attr}")
    # control flow, not errors: the stepping engine's request for a value, which its session always catches,
    # and an analysis's CPU budget running out, which the analysis that made it active catches
    signals = {"sopgraph.logic.engine.NeedValue", "sopgraph.logic.budget.OutOfCpu"}
    assert [name for name in outside if name not in signals] == []
    assert issubclass(sopgraph.ArgumentError, ValueError)


MAX_CLASS_LINES = 450
MAX_FUNCTION_LINES = 150


def _oversized(source: str, module: str) -> list[str]:
    """Classes over 450 lines and functions (methods, nested ones too) over 150, counted from the first
    decorator to the last line of the body: a room that size has more than one reason to change."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            size = (node.end_lineno or node.lineno) - start + 1
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            if size > limit:
                found.append(f"{module}:{node.name}")
    return found


def test_no_class_over_450_lines_and_no_function_over_150() -> None:
    def body(n: int) -> str:
        return "".join("    x = 1\n" for _ in range(n))
    probe = (f"class Big:\n{body(450)}\nclass Fits:\n{body(449)}"
             f"@decorated\ndef long(\n    a: int,\n):\n{body(147)}\nasync def fine():\n{body(149)}"
             f"def outer():\n    def inner():\n{''.join('        y = 2' + chr(10) for _ in range(150))}")
    assert _oversized(probe, "probe") == ["probe:Big", "probe:long", "probe:outer", "probe:inner"]
    found = [hit for p in sorted(PACKAGE.rglob("*.py"))
             for hit in _oversized(p.read_text(encoding="utf-8"), p.relative_to(PACKAGE).as_posix())]
    assert found == []


def test_every_reducer_is_two_hops_from_the_where_does_x_live_table() -> None:
    """The table names each reducer and the file of `REDUCERS` (hop 1); its entry there is or names the
    function that computes it (hop 2: `stats.pass_hat_k` is pass^k's one formula) (issue 34)."""
    from sopgraph.evaluation import metrics

    table = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8").split(
        "### Where does X live?")[1].split("\n## ")[0]
    row = next(line for line in table.splitlines() if "`ReducerDef`" in line)
    source = Path(metrics.__file__).read_text(encoding="utf-8")
    assert "`sopgraph/evaluation/metrics.py`" in row and "REDUCERS: dict[str, ReducerDef]" in source
    for name, entry in metrics.REDUCERS.items():
        assert f"`{name}`" in row, name
        fn = entry.fn
        module = fn.__module__.rpartition(".")[2]
        assert fn.__module__ == metrics.__name__ or f"{module}.{fn.__name__}" in source, name
