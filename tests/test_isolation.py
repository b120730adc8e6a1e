"""The isolated backend is typed by what its backend has: the proxy carries exactly the
optional methods (protocols) of the backend in its child, never a method set to None; its
capabilities answer every field the suite and the search read (the search ran under
--isolate only once ``RemoteCapabilities`` had ``max_seq_len``)."""

import glob
import os
import re
import signal
import subprocess
import sys
import time
import types

import pytest

from pagedattn.adapters.loading import accepts_out, backend_info, load_backend
from pagedattn.adapters.protocol import (
    Backend,
    SupportsClose,
    SupportsGather,
    SupportsLse,
    SupportsOut,
    SupportsWarmup,
    SupportsWriteCache,
)
from pagedattn.runner.case_record import noted
from pagedattn.runner.isolation import IsolatedBackend, isolated_backend
from pagedattn.runner.search import SearchRun
from pagedattn.runner.search_plan import SearchItem
from pagedattn.runner.suite import Suite
from tests.helpers import searched

OPTIONAL = (SupportsGather, SupportsLse, SupportsWarmup, SupportsWriteCache)
CORRECT = os.path.join(os.path.dirname(__file__), "planted", "bad_backends.py") + ":Correct"


@pytest.fixture(scope="module", params=["reference", CORRECT], ids=["reference", "attention-only"])
def pair(request):
    """``(backend, proxy)``: the backend loaded here, and the same backend isolated."""
    proxy = isolated_backend(request.param, "cpu", 120.0)
    yield load_backend(request.param), proxy
    proxy.close()


def test_the_proxy_has_exactly_its_backends_optional_methods(pair):
    backend, proxy = pair
    assert isinstance(proxy, IsolatedBackend) and isinstance(proxy, Backend)
    for protocol in OPTIONAL:
        assert isinstance(proxy, protocol) == isinstance(backend, protocol), (
            f"{type(proxy).__name__}: {protocol.__name__} is {isinstance(proxy, protocol)}, the backend's "
            f"{isinstance(backend, protocol)}"
        )
    # the proxy itself always takes out= (it forwards it) and holds a process to close
    assert isinstance(proxy, SupportsOut) and isinstance(proxy, SupportsClose)
    assert proxy.accepts_out == backend_info(backend)["accepts_out"]
    none = [m for m in ("gather", "write_cache", "paged_attention_lse", "warmup") if getattr(proxy, m, 0) is None]
    assert not none, f"methods set to None on the proxy: {none}"


def test_remote_capabilities_answer_every_claim_the_suite_reads(pair):
    backend, proxy = pair
    mine, theirs = backend.capabilities, proxy.capabilities
    for name in (
        "dtypes",
        "operations",
        "variants",
        "devices",
        "fp32_precision",
        "qk_precision",
        "tanh_precision",
        "tolerance_factor",
        "notes",
        "max_seq_len",
        "decode_only",
        "default_scale_only",
    ):
        assert getattr(theirs, name) == getattr(mine, name), name
    assert theirs.limit_lines() == mine.limit_lines() and theirs.describe() == mine.describe()
    for name in ("determinism", "batch_invariance", "placement_invariance"):
        assert theirs.invariance_reason(name) == mine.invariance_reason(name), name
    assert theirs.unsupported_reason(head_dim=80) == mine.unsupported_reason(head_dim=80)


def test_the_search_runs_under_isolation(tmp_path):
    proxy = isolated_backend("reference", "cpu", 120.0)
    try:
        suite = Suite(backend=proxy, backend_spec="reference", device="cpu", profile="quick", replay_dir=str(tmp_path))
        node = types.SimpleNamespace(user_properties=[])
        searched(SearchRun(suite, node, SearchItem(0, 2, 3), budget_s=20.0))
    finally:
        proxy.close()
    rec = noted(node)
    assert rec["status"] == "passed" and rec["examples"] >= 1, rec


def test_the_bundled_backends_meet_the_typed_contract() -> None:
    """Checked twice: by mypy (this function is typed: the assignments are the claim) and at
    run time (the protocols are runtime-checkable)."""
    from pagedattn.adapters.capabilities import Capabilities
    from pagedattn.adapters.protocol import Claims
    from pagedattn.adapters.reference import ReferenceBackend
    from pagedattn.adapters.tlsim import TLSimBackend

    claims: Claims = Capabilities()
    reference: Backend = ReferenceBackend()
    tlsim: Backend = TLSimBackend()
    assert claims.max_seq_len is None and not claims.decode_only
    for backend in (reference, tlsim):
        assert isinstance(backend, Backend), type(backend).__name__
    assert isinstance(reference, SupportsLse) and isinstance(reference, SupportsGather)
    assert isinstance(reference, SupportsWriteCache) and not accepts_out(reference)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (``/proc/<pid>/task/*/children``, recursively)."""
    found: set[int] = set()
    stack = [pid]
    while stack:
        for path in glob.glob(f"/proc/{stack.pop()}/task/*/children"):
            try:
                kids = [int(k) for k in open(path).read().split()]
            except OSError:
                continue
            found.update(kids)
            stack.extend(kids)
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting for a parent that does not reap it, does not)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    "sig, mode",
    [
        pytest.param(signal.SIGKILL, [], id="SIGKILL"),
        pytest.param(signal.SIGTERM, [], id="SIGTERM", marks=pytest.mark.slow),
        # the workers end with their controller, and their children with them
        pytest.param(signal.SIGKILL, ["-n", "2"], id="SIGKILL-xdist", marks=pytest.mark.slow),
    ],
)
def test_killing_pytest_while_a_case_hangs_leaves_no_process_behind(pytester, bad, sig, mode):
    args = ["-p", "no:cacheprovider", "--pyargs", "pagedattn.conformance.test_decode", *mode]
    proc = pytester.popen(
        [sys.executable, "-m", "pytest", *args, f"--backend={bad}:HangsForever", "--isolate", "--case-timeout=none"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    marker = pytester.path / "hanging.pid"
    below: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() or not marker.read_text():
            assert proc.poll() is None, f"the run ended (exit status {proc.returncode}) before a case hung"
            assert time.monotonic() < deadline, "no case started hanging within 120 s"
            time.sleep(0.2)
        child = int(marker.read_text())
        below = _descendants(proc.pid)
        assert child in below, f"the hanging process {child} is not below pytest {proc.pid}: {sorted(below)}"
        proc.send_signal(sig)
        proc.wait(30)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = sorted(p for p in below if _alive(p))
        commands = {p: open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:200] for p in left}
        assert not left, f"{sig.name} of pytest left its descendants running: {commands}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in below:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_the_isolated_backends_output_is_the_cases_captured_output(pytester, bad):
    args = ["-p", "no:cacheprovider", "--pyargs", "pagedattn.conformance.test_decode", "-k", "fp32"]
    result = pytester.runpytest_subprocess(*args, f"--backend={bad}:PrintsWrongOnSingleSequence", "--isolate")
    assert result.ret == 1, f"exit status {result.ret}, want 1 (the single-sequence cases fail)"
    out = result.stdout.str()
    failures = out.split("Captured stdout call")[1:]
    assert failures, f"no captured output of a failed case in:\n{out[-3000:]}"
    for section in failures:  # up to the next section or the summary
        assert section.split("\n_")[0].split("\n==")[0].count("planted-print 1 sequence(s)") == 1, section[:500]
    # the passed (multi-sequence) cases' prints are captured and dropped: never on the terminal
    shown = set(re.findall(r"planted-print (\d+) sequence", out + result.stderr.str()))
    assert shown == {"1"}, f"prints of cases of {sorted(shown)} sequences on the terminal:\n{out[-3000:]}"
