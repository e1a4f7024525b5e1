"""Library code leaves the process alone (issue 8): the garbage collector, litellm's callbacks, loggers
and cost map are the same after loading, deciding, synthesizing and a floor-agent run as before."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import asyncio, gc, json, logging, os, sys
sys.path.insert(0, {tests!r})
# The user's own offline import of litellm; the variable is gone again before sopgraph runs, so a
# write of it by sopgraph shows in the environment comparison below.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
import litellm
del os.environ["LITELLM_LOCAL_MODEL_COST_MAP"]
from fakeserver import FakeServer

calls = []
def sentinel(*args, **kwargs):
    calls.append(1)

# (not in litellm.callbacks: litellm copies those into the lists below itself, and runs them as
# input callbacks whatever a call's no-log flag says)
litellm.success_callback = [sentinel]
litellm.failure_callback = [sentinel]
litellm.set_verbose = False
gc.set_threshold(1234, 11, 12)

def snapshot():
    return {{
        "gc_enabled": gc.isenabled(), "gc_threshold": list(gc.get_threshold()),
        "gc_frozen": gc.get_freeze_count(),
        "success_callback": [repr(c) for c in litellm.success_callback],
        "failure_callback": [repr(c) for c in litellm.failure_callback],
        "callbacks": [repr(c) for c in litellm.callbacks],
        "cost_map_size": len(litellm.model_cost),
        "cost_map_keys": sorted(k for k in litellm.model_cost if "/" in k and k.split("/")[0] in
                                ("baseline", "scripted", "openai", "aiohttp_openai")),
        "suppress_debug_info": litellm.suppress_debug_info,
        "loggers": {{n: logging.getLogger(n).level for n in ("LiteLLM", "LiteLLM Router", "litellm")}},
        "environ": dict(os.environ),
        "litellm_settings": litellm_settings(),
        "custom_providers_before": [item["provider"] for item in litellm.custom_provider_map],
    }}

SETTING_TYPES = (bool, int, float, str, type(None))

def litellm_settings():
    # every plain setting of the litellm module (flags, names, numbers) and the identity and size of its
    # lists and dicts: what a library could overwrite process-wide. The provider registry is compared
    # on its own below (sopgraph adds its built-in providers to it, keeping every other entry).
    out = {{}}
    for name, value in sorted(vars(litellm).items()):
        if name.startswith("_") or name == "custom_provider_map":
            continue
        if isinstance(value, SETTING_TYPES):
            out[name] = repr(value)
        elif type(value) in (list, dict, set):
            out[name] = f"{{type(value).__name__}} id={{id(value)}}"
    return out

before = snapshot()
import sopgraph
from sopgraph.simulation.gateway import Gateway, ModelSpec

sc = sopgraph.load({sop!r})
sopgraph.check(sc)
sopgraph.decide(sc, {values})
cases = sopgraph.synthesize(sc, 4, seed=1).cases
summary = sopgraph.run(sc, cases, ["agent=baseline/always-comply"], {out!r}, progress=False)
assert summary.by_status.get("done") == len(cases), summary
sopgraph.score_run({out!r})

async def http():
    with FakeServer() as server:
        gw = Gateway(cache=False, max_retries=0)
        spec = ModelSpec(role="agent", model="openai/unpriced-local-model",
                         params={{"api_base": server.base_url}})
        await gw.complete(spec, [{{"role": "user", "content": "hi"}}])
        await gw.aclose()
asyncio.run(http())
after = snapshot()
providers = [item["provider"] for item in litellm.custom_provider_map]
print(json.dumps({{"before": before, "after": after, "sentinel_calls": len(calls), "providers": providers}}))
"""


def test_library_use_changes_no_process_state(tmp_path: Path) -> None:
    telecom = ROOT / "scenarios" / "telecom_package.sop"
    values = _first_vector()
    code = SCRIPT.format(tests=str(ROOT / "tests"), sop=str(telecom), out=str(tmp_path / "run"), values=values)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOPGRAPH_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("SOPGRAPH_LITELLM_DEBUG", None)
    env.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)  # not preset: a write by the library must show
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "LITELLM_LOCAL_MODEL_COST_MAP" not in got["after"]["environ"]
    # litellm's own tokenizer module, imported lazily by litellm at its first token count, points
    # tiktoken at the tokenizers bundled with litellm (so tiktoken never downloads one): litellm's
    # write, made the same for any litellm user, and the only one allowed.
    for side in ("before", "after"):  # (the test process may have imported it already: then both have it)
        tiktoken_dir = got[side]["environ"].get("TIKTOKEN_CACHE_DIR")
        if tiktoken_dir is not None and "litellm" in tiktoken_dir:
            del got[side]["environ"]["TIKTOKEN_CACHE_DIR"]
    assert got["after"]["environ"] == got["before"]["environ"]
    # every public litellm setting the process had keeps its value (litellm's own private bookkeeping and
    # the attributes it creates lazily on first use are litellm's business, not a setting)
    settings_after = got["after"].pop("litellm_settings")
    settings_before = got["before"].pop("litellm_settings")
    assert {k: settings_after.get(k) for k in settings_before} == settings_before
    providers_before = got["before"].pop("custom_providers_before")
    got["after"].pop("custom_providers_before")
    assert got["after"] == got["before"]
    # the one registration the library makes: its built-in providers, every earlier entry kept
    from sopgraph.simulation.providers import BUILTIN_PROVIDERS

    assert got["providers"] == providers_before + sorted(BUILTIN_PROVIDERS)
    assert got["before"]["gc_threshold"] == [1234, 11, 12] and got["before"]["gc_enabled"]
    assert got["sentinel_calls"] == 0  # every call opted out of litellm's success/failure logging, per call


def _first_vector() -> str:
    vec = json.loads((ROOT / "tests" / "data" / "sage_vectors" / "telecom_package.vectors.json").read_text())[0]
    row = {k: v for k, v in vec["classification"].items() if v is not None}
    row.update({k: v for k, v in vec["system"].items() if v != "none"})
    return repr(row)


LIBRARY_GC = re.compile(r"\bgc\.(disable|freeze|set_threshold)\(|no_cyclic_gc\b")


def test_no_library_module_touches_the_collector() -> None:
    """Only perf.py (the helpers) and the CLI entry may change the collector."""
    offenders = []
    for path in (ROOT / "sopgraph").rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("sopgraph/perf.py", "sopgraph/cli/__init__.py"):
            continue
        if LIBRARY_GC.search(path.read_text(encoding="utf-8")):
            offenders.append(rel)
    assert offenders == []


ENV_SCRIPT = r"""
import json, os, sys
before = dict(os.environ)
import sopgraph.simulation.gateway as gateway
imported = dict(os.environ)
gateway.load_litellm()
print(json.dumps({"before": before, "imported": imported, "loaded": dict(os.environ)}))
"""


def test_loading_litellm_through_the_gateway_leaves_the_environment_alone(tmp_path: Path) -> None:
    """litellm needs LITELLM_LOCAL_MODEL_COST_MAP at its import (else it fetches its cost map from the
    internet); the gateway sets it for that import only."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SOPGRAPH_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("LITELLM_LOCAL_MODEL_COST_MAP", None)
    proc = subprocess.run([sys.executable, "-c", ENV_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["imported"] == got["before"]
    assert got["loaded"] == got["before"]
