"""The `sop` console script (`sopgraph.cli.entry`) and the start-up of `import sopgraph` / `sop check`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import ROOT, gen_sop

from sopgraph.cli import entry, exit_status

# `os._exit` reports on stderr before ending the process; an atexit handler, which both ways of ending run,
# writes there too.
PROBE = ("import atexit, os, sys\n"
         "real_exit = os._exit\n"
         "def reporting_exit(status):\n"
         "    os.write(2, f'hard exit {{status}}\\n'.encode())\n"
         "    real_exit(status)\n"
         "os._exit = reporting_exit\n"
         "atexit.register(lambda: sys.stderr.write('atexit ran\\n'))\n"
         "from sopgraph.cli import {name}\n"
         "{name}()\n")


def _sop(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE.format(name=name), *args], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT)}, timeout=300)


@pytest.fixture(scope="module")
def warned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program with 3,000 warnings: ~400 KB of output, more than a pipe holds, so it must be flushed."""
    path = tmp_path_factory.mktemp("entry") / "wide.sop"
    path.write_text(gen_sop().generate(3000, kind="diamond", seed=0))
    return path


def test_entry_prints_what_main_prints_and_keeps_the_exit_code(warned: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.sop"
    bad.write_text(warned.read_text() + "\nstage Broken \"b\" {\n  -> nowhere\n}\n")
    for path, code in ((warned, 0), (bad, 1)):
        fast, plain = _sop("entry", "check", str(path)), _sop("main", "check", str(path))
        assert (fast.returncode, plain.returncode) == (code, code), (fast.stderr[-500:], plain.stderr[-500:])
        assert fast.stdout == plain.stdout
        assert len(fast.stdout) > 300_000 and fast.stdout.rstrip().endswith("(ok)" if code == 0 else "(failed)")
        # the console script ends without finalizing objects (the point: no second spent freeing the IR),
        # after running the atexit handlers and flushing both streams
        assert fast.stderr.splitlines() == ["atexit ran", f"hard exit {code}"]
        assert plain.stderr.splitlines() == ["atexit ran"]


def test_entry_ends_other_commands_the_usual_way() -> None:
    proc = _sop("entry", "--version")
    assert proc.returncode == 0 and proc.stdout.startswith("sop")
    assert proc.stderr.splitlines() == ["atexit ran"]
    proc = _sop("entry", "nosuchcommand")
    assert proc.returncode == 2 and "No such command" in proc.stderr and proc.stderr.endswith("\natexit ran\n")


def test_entry_with_another_thread_running_ends_the_usual_way(warned: Path) -> None:
    # a thread that lives until the main thread is done (Python's shutdown then joins it)
    code = ("import threading, sys, os\n"
            "threading.Thread(target=threading.main_thread().join).start()\n"
            "os._exit = lambda status: sys.exit(f'os._exit({status}) called')\n"
            "from sopgraph.cli import entry\n"
            "entry()\n")
    proc = subprocess.run([sys.executable, "-c", code, "check", str(warned)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("(ok)")
    assert proc.stderr == ""


def test_exit_status_is_python_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status(None) == 0
    assert exit_status(3) == 3
    assert exit_status(False) == 0
    assert capsys.readouterr().err == ""
    assert exit_status("no such file") == 1
    assert capsys.readouterr().err == "no such file\n"


def test_main_called_in_process_returns_through_system_exit(warned: Path) -> None:
    """Only the console script ends the process: `main(...)` from Python raises SystemExit as click does."""
    from sopgraph.cli import main

    with pytest.raises(SystemExit) as info:
        main(["check", "--no-profile", str(warned)])
    assert info.value.code == 0
    assert threading.main_thread().is_alive()
    assert callable(entry)


def test_import_and_sop_check_load_only_what_they_use() -> None:
    """`import sopgraph` loads no stage; `sop check` loads neither networkx, yaml, asyncio, the gateway nor
    litellm (start-up time), and every public name still resolves."""
    script = ("import sys\n"
              "import sopgraph\n"
              "print(sorted(m for m in sys.modules if m.startswith('sopgraph.')))\n"
              "from sopgraph.cli import main\n"
              "try:\n    main(['check', '--no-profile', sys.argv[1]])\n"
              "except SystemExit:\n    pass\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('networkx', 'yaml', 'asyncio', 'litellm')"
              " or m.startswith(('sopgraph.simulation', 'sopgraph.cases'))))\n"
              "names = {n: getattr(sopgraph, n) for n in sopgraph.__all__}\n"
              "from sopgraph.logic.session import decide\n"
              "assert names['decide'] is decide and sopgraph.decide is decide\n"
              "print(sorted(n for n, v in names.items() if v is None))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(ROOT / "scenarios" / "telecom_package.sop")],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # the version and the root error (`except sopgraph.Error` must not load a stage) are all it loads
    assert (lines[0], lines[-2:]) == ("['sopgraph._version', 'sopgraph.errors']", ["[]", "[]"])
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import sopgraph

        sopgraph.nope  # noqa: B018


# What each common command must not import (start-up time): the Lark parser (the fast path reads every
# valid file), networkx (only pictures and graph exports), yaml with the profile reader and synthesis (only
# when a profile lies beside the file), and the model gateway with its libraries (no model is called);
# `sop --help` imports every command module, but still no HTTP client (an HTTP agent's run imports it) nor networkx.
MODEL_LIBRARIES = ("litellm", "aiohttp", "httpx", "sopgraph.simulation")
NOT_LOADED_BY = {
    "check": ("lark", "networkx", "yaml", "sopgraph.cases.profiles", "sopgraph.cases.synth", *MODEL_LIBRARIES),
    "decide": ("lark", "networkx", "yaml", *MODEL_LIBRARIES),
    "paths": ("lark", "networkx", "yaml", *MODEL_LIBRARIES),
    "compile": ("lark", "yaml", *MODEL_LIBRARIES),
    "synth": ("lark", "networkx", *MODEL_LIBRARIES),
    "--help": ("aiohttp", "litellm", "networkx"),  # every command module, but no HTTP client, model library or graph
}


@pytest.mark.parametrize("command", sorted(NOT_LOADED_BY))
def test_common_commands_load_no_parser_graph_profile_or_model_library_they_do_not_use(
        command: str, tmp_path: Path) -> None:
    """Each command runs in a fresh process on a valid file without a profile beside it (the output is
    the command's usual one); what it imported is compared with what it must not need."""
    sop = tmp_path / "bike.sop"
    sop.write_text((ROOT / "examples" / "bike_rental.sop").read_text(encoding="utf-8"), encoding="utf-8")
    args = {"synth": ["synth", str(sop), "-n", "3", "-q"], "--help": ["--help"]}.get(command, [command, str(sop)])
    script = ("import json, sys\n"
              "from sopgraph.cli import main\n"
              "try:\n    main(sys.argv[2:])\n"
              "except SystemExit:\n    pass\n"
              "banned = tuple(p + '.' for p in json.loads(sys.argv[1]))\n"
              "sys.stderr.write(json.dumps(sorted(m for m in sys.modules if (m + '.').startswith(banned))))\n")
    line = '{"Request": "Return", "Damaged": false, "HoursLate": 0, "Member": true}\n'  # for `sop decide`
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(NOT_LOADED_BY[command]), *args], input=line,
                          capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.stdout.strip(), proc.stderr  # the command did its work
    assert proc.stderr.splitlines()[-1] == "[]", proc.stderr


def test_sop_check_as_the_process_loads_without_the_collector_and_freezes_the_ir(warned: Path) -> None:
    """`perf.build_then_freeze` runs only when `main` is the process (not under click's test runner): the
    collector is off while loading, on again after, and the loaded objects are frozen."""
    script = ("import gc, sys\n"
              "from sopgraph.language import parse\n"
              "from sopgraph.logic import checker\n"
              "seen = []\n"
              "def load(*a, **k):\n"
              "    seen.append((gc.isenabled(), gc.get_freeze_count()))\n"
              "    return parse.load_source(*a, **k)\n"
              "checker.load_source = load\n"
              "from sopgraph.cli import main\n"
              "frozen = []\n"
              "orig = checker.check\n"
              "def check(*a, **k):\n"
              "    frozen.append((gc.isenabled(), gc.get_freeze_count()))\n"
              "    return orig(*a, **k)\n"
              "checker.check = check\n"
              "mode = sys.argv[2]\n"
              "try:\n"
              "    if mode == 'process':\n"
              "        main(['check', '--no-profile', sys.argv[1]])\n"
              "    else:\n"
              "        from click.testing import CliRunner\n"
              "        gc.unfreeze()\n"
              "        CliRunner().invoke(main, ['check', '--no-profile', sys.argv[1]])\n"
              "except SystemExit:\n"
              "    pass\n"
              "(enabled, at_load), = seen\n"
              "print(enabled, frozen[0][0], frozen[0][1] - at_load > 100_000, gc.isenabled())\n")
    lines = {}
    for mode in ("process", "runner"):
        proc = subprocess.run([sys.executable, "-c", script, str(warned), mode], capture_output=True, text=True,
                              env={"PYTHONPATH": str(ROOT)}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines[mode] = proc.stdout.splitlines()[-1]
    # while loading: collector off; at the passes: on again, and the IR (~300k objects) frozen
    assert lines == {"process": "False True True True", "runner": "True True False True"}


def test_build_then_freeze_restores_the_collector_when_the_block_fails() -> None:
    script = ("import gc\n"
              "from sopgraph.perf import build_then_freeze\n"
              "before = gc.get_freeze_count()\n"
              "try:\n"
              "    with build_then_freeze():\n"
              "        assert not gc.isenabled()\n"
              "        raise ValueError\n"
              "except ValueError:\n"
              "    pass\n"
              "print(gc.isenabled(), gc.get_freeze_count() == before)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.stdout.split() == ["True", "True"], proc.stderr
