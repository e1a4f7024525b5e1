"""Test-session setup shared by every test module.

The time-bounded tests (huge programs, fuzzing) model what `sop` does, and `sop` tunes the garbage
collector once at start (`perf.tune_gc_for_cli`, issue 8: library code never does). The test process
is an application too, so it applies the same setting; tests/test_global_state.py checks the library
in a fresh interpreter, where nothing is tuned.
"""

from __future__ import annotations

from sopgraph.perf import tune_gc_for_cli

tune_gc_for_cli()


SLOW_LIST = "slow_tests.txt"
"""Tests that take the longest (each several seconds or more on two cores: runs in subprocesses, kills and
resumes, fuzzing, huge programs), one node id per line, measured with `pytest --durations`. They carry the
`slow` mark: `make test` leaves them out, `make test-slow` runs them, CI runs both."""


def pytest_configure(config):  # type: ignore[no-untyped-def]
    config.addinivalue_line("markers", "slow: among the slowest tests (tests/slow_tests.txt); `-m 'not slow'` skips them")


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    import pathlib

    import pytest

    listed = pathlib.Path(__file__).with_name(SLOW_LIST)
    if not listed.is_file():
        return
    slow = {line.strip() for line in listed.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")}
    for item in items:
        # a parametrized test is listed once, by its function's node id, for all its cases
        if item.nodeid in slow or item.nodeid.split("[")[0] in slow:
            item.add_marker(pytest.mark.slow)
