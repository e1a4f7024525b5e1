"""Test-session setup shared by every test module.

The time-bounded tests (huge programs, fuzzing) model what `sop` does, and `sop` tunes the garbage
collector once at start (`perf.tune_gc_for_cli`, issue 8: library code never does). The test process
is an application too, so it applies the same setting; tests/test_global_state.py checks the library
in a fresh interpreter, where nothing is tuned.
"""

from __future__ import annotations

from sopgraph.perf import tune_gc_for_cli

tune_gc_for_cli()
