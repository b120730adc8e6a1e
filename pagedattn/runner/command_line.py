"""The plugin's command-line options (``pytest --help``, group "paged-attention conformance").
Torch-free: every pytest session where pagedattn is installed registers them."""

from __future__ import annotations

import os

import pytest

from pagedattn.runner.gate import NOTHING_JUDGED, min_judged
from pagedattn.runner.options import DEFAULT_TIMEOUT_S, PROFILES, case_timeout, positive_seconds
from pagedattn.runner.shard import shard_spec


def add_options(parser: pytest.Parser) -> None:
    """Register the plugin's options on ``parser``."""
    group = parser.getgroup("pagedattn", "paged-attention conformance")
    group.addoption(
        "--backend",
        default=None,
        help="backend under test: an entry-point name (pagedattn.backends), package.module:attr, "
        "or path/to/file.py:attr",
    )
    group.addoption("--device", default=None, help="cuda when available, else cpu")
    group.addoption("--profile", default="quick", choices=PROFILES, help="case grid profile (default quick)")
    group.addoption("--report-json", default=None, metavar="PATH", help="write a JSON report here")
    group.addoption("--replay", default=None, metavar="FILE", help="run only the case saved in FILE")
    group.addoption(
        "--case-timeout",
        type=case_timeout,
        default=None,
        metavar="SECONDS|none",
        help="seconds (positive, finite) a case may take before it counts as timed out; implies --isolate. "
        f"'none': no limit. Default under --isolate: {DEFAULT_TIMEOUT_S:g}",
    )
    group.addoption(
        "--isolate",
        action="store_true",
        help="construct and run the backend in a child process that is replaced when it crashes (segfault, "
        "CUDA fault) or hangs",
    )
    group.addoption(
        "--expectations",
        default=None,
        metavar="FILE",
        help='JSON file of known failures: {"expected_failures": [{"case": PATTERN, "reason": TEXT}]}',
    )
    group.addoption(
        "--probe-unclaimed",
        type=int,
        nargs="?",
        const=3,
        default=0,
        metavar="N",
        help="run up to N (default 3) unclaimed cases per reason anyway and report which would pass",
    )
    group.addoption(
        "--search-examples",
        type=int,
        default=None,
        metavar="N",
        help="hypothesis draws of the whole search family, shared by its items (default: 25 quick, 100 standard, "
        "300 thorough)",
    )
    group.addoption(
        "--search-budget",
        type=positive_seconds,
        default=None,
        metavar="SECONDS|none",
        help="seconds for the whole search family, finding and shrinking, shared by its items (default: 60 on a "
        "GPU, 30 on the CPU); 'none': no time limit, --search-examples alone bounds it (the same cases every run)",
    )
    group.addoption(
        "--warmup-ahead",
        default="auto",
        choices=("auto", "on", "off"),
        help="compile later cases' kernels in a background thread while cases run, for backends with "
        "warmup_ahead (auto: on a GPU; never on the CPU unless 'on', nor under --isolate, --replay or "
        "--collect-only)",
    )
    group.addoption(
        "--replay-dir",
        default=os.path.join(".pagedattn", "failures"),
        metavar="DIR",
        help="where failing cases are saved for replay (default .pagedattn/failures)",
    )
    # the run as a CI gate (pagedattn.runner.gate, pagedattn.runner.shard)
    group.addoption(
        "--min-judged",
        type=min_judged,
        default=None,
        metavar="N|FRACTION",
        help=f"fail (exit {NOTHING_JUDGED}) unless at least N cases, or this fraction of the collected ones, reach a "
        "verdict (passed, failed, warned, xfailed, xpassed); default 1",
    )
    group.addoption(
        "--lenient-expectations",
        action="store_true",
        help="report unexpected passes and expectations that match no collected case without failing the run",
    )
    group.addoption(
        "--shard",
        type=shard_spec,
        default=None,
        metavar="I/N",
        help="run shard I of N (1-based): whole configurations per shard, every case in one shard; merge the "
        "shards' JSON reports with python -m pagedattn report A.json B.json ...",
    )
