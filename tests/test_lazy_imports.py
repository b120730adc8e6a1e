"""Importing pagedattn, and the pytest plugin every pytest session loads through its entry
point, costs no torch: torch, triton and the suite load when a conformance session starts."""

import importlib
import json
import subprocess
import sys

import pytest

import pagedattn
from pagedattn.runner import options

HEAVY = ("torch", "triton", "numpy", "hypothesis")

# a conftest that writes down, at the end of the session, which heavy modules were loaded
# and whether the pagedattn plugin was registered at all (a missing plugin would pass vacuously)
_SPY = """
import json, sys

def pytest_unconfigure(config):
    with open("loaded.json", "w") as f:
        json.dump({"heavy": [m for m in ("torch", "triton") if m in sys.modules],
                   "plugin": config.pluginmanager.has_plugin("pagedattn.plugin")}, f)
"""


def test_import_pagedattn_and_its_plugin_loads_no_heavy_module():
    code = (
        "import pagedattn, pagedattn.plugin, sys; "
        f"bad = [m for m in {HEAVY!r} if m in sys.modules]; assert not bad, bad; "
        "pagedattn.__version__"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def _spied(pytester, *args):
    pytester.makeconftest(_SPY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    with open(pytester.path / "loaded.json") as f:
        return result, json.load(f)


def test_pytest_without_backend_does_not_import_torch(pytester):
    pytester.makepyfile(test_plain="def test_one():\n    assert 1 + 1 == 2\n")
    result, loaded = _spied(pytester)
    result.assert_outcomes(passed=1)
    assert loaded == {"heavy": [], "plugin": True}
    result, loaded = _spied(pytester, "--help")
    assert "--backend" in result.stdout.str()
    assert loaded == {"heavy": [], "plugin": True}


def test_a_conformance_session_loads_torch(pytester):
    result, loaded = _spied(
        pytester, "--pyargs", "pagedattn.conformance.test_decode", "--backend=reference", "--collect-only", "-q"
    )
    assert result.ret == 0, result.stdout.str()
    assert loaded["plugin"] and "torch" in loaded["heavy"]


def test_public_names_resolve_lazily():
    from pagedattn.adapters import protocol
    from pagedattn.oracle import PagedCase

    for name in pagedattn.__all__:
        assert getattr(pagedattn, name) is not None, name
        assert name in dir(pagedattn)
    assert pagedattn.PagedCase is PagedCase and pagedattn.Capabilities is protocol.Capabilities
    with pytest.raises(AttributeError, match="no_such_name"):
        pagedattn.no_such_name  # noqa: B018


def test_the_grid_takes_its_profiles_from_the_torch_free_options():
    grid = importlib.import_module("pagedattn.cases.grid")  # the module: pagedattn.cases.grid is also a function

    assert grid.PROFILES is options.PROFILES, "grid.PROFILES must be pagedattn.runner.options.PROFILES"


def test_collecting_the_suite_imports_no_hypothesis(pytester):
    """The search's items import hypothesis when they run, not when the suite is collected:
    ~1 s of every xdist worker's start, before any case can run."""
    pytester.makeconftest(
        """
import json, sys
def pytest_collection_finish(session):
    with open("collected.json", "w") as f:
        json.dump({"hypothesis": "hypothesis" in sys.modules, "items": [i.name for i in session.items]}, f)
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--pyargs", "pagedattn.conformance", "--backend=reference", "--collect-only", "-q"
    )
    assert result.ret == 0, result.stdout.str()
    with open(pytester.path / "collected.json") as f:
        collected = json.load(f)
    assert any(name.startswith("test_search[") for name in collected["items"]), len(collected["items"])
    assert collected["hypothesis"] is False
