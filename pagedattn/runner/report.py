"""The run's reports, built from the case records: the terminal header (backend, where it
runs, its claims), the terminal summary (the table and every case that needs a word), and
the JSON report's non-case part (schema, execution target, expectations, probes).

Torch-free at import: torch is imported by the functions that name its version.
"""

from __future__ import annotations

import platform
import time
from typing import Any

import pytest

from pagedattn._version import __version__, dist_version
from pagedattn.runner.case_record import CaseRecord
from pagedattn.runner.expectations import stale_expectations
from pagedattn.runner.session import RUN_KEY, Run
from pagedattn.runner.status import Status
from pagedattn.runner.table import format_table
from pagedattn.verdict_kernel import triton_problem

#: the JSON report's schema, named in every report
SCHEMA = "pagedattn-report/2"


def device_name(device: str) -> str:
    """``cuda:0 (NVIDIA H200)`` for a CUDA device, the device as given otherwise."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device


def target(run: Run) -> str:
    """Where the backend's kernels run, in words (its own ``target`` when it says)."""
    if run.info.get("target"):
        return str(run.info["target"])
    if run.info.get("name"):
        return f"{run.info['name']} ({run.device})"
    return f"{run.spec} (loaded in the xdist workers)" if run.controller else f"{run.spec} (not loaded)"


def _guard_line(run: Run) -> str:
    if run.isolate:
        limit = f"{run.timeout:g} s per case" if run.timeout else "no time limit (--case-timeout=none)"
        return f"  guard: each case runs in a child process that is replaced when it crashes; {limit}"
    return (
        "  guard: none: a crash or a hang of the backend ends the run (the JSON report still accounts for "
        "every case); --isolate contains them"
    )


def _claims_lines(info: dict[str, Any]) -> list[str]:
    caps = info.get("capabilities") or {}
    precisions = f", q.k precision {info['qk_precision']}" if info.get("qk_precision", "fp32") != "fp32" else ""
    if info.get("tanh_precision", "ieee") != "ieee":
        precisions += f", soft-cap tanh {info['tanh_precision']}"
    if info.get("partials_precision", "fp32") != "fp32":
        precisions += f", split-K partials {info['partials_precision']}"
    if precisions and info.get("declared_on", "all") != "all":
        precisions += f" (q.k and partials on {info['declared_on']} cases)"
    factor = info.get("tolerance_factor", 1)
    loosened = f", tolerance x{factor:g} (backend override)" if factor != 1 else ""
    lines = [
        f"  policy: fp32 dot precision {info.get('fp32_precision', 'ieee')}{precisions}{loosened}",
        f"  claims: operations {', '.join(caps.get('operations', []))}; "
        f"variants {', '.join(caps.get('variants', [])) or 'none'}",
    ]
    if info.get("limit_lines"):  # Capabilities.limit_lines: every limit, declined invariances included
        return lines + [f"  limit: {line}" for line in info["limit_lines"]]
    declined = {k: v for k, v in (info.get("invariances") or {}).items() if v}
    lines += [f"  declined: {reason}" for reason in declined.values()]
    lines += [f"  narrowed {key}: {note_}" for key, note_ in (info.get("notes") or {}).items()]
    return lines


def _check_lines() -> list[str]:
    """Where the check cannot take its GPU verdict kernel, a line that says so (the torch path
    judges alike, slower on a GPU)."""
    problem = triton_problem()
    if not problem or dist_version("triton") == "not installed":
        return []
    return [f"  check: the torch path judges on every device ({problem}; the same verdicts)"]


def header_lines(config: pytest.Config, run: Run) -> list[str]:
    """The terminal report header: suite and backend versions, where it runs, the guard
    against crashes, the policy and the claims. On the xdist controller, torch-free: the header
    is written before xdist starts the workers (``Run.device``)."""
    versions = f"triton {dist_version('triton')}, python {platform.python_version()}"
    if run.controller:
        dist = config.getoption("dist")
        how = "(each configuration on one worker)"
        if dist != "loadgroup":
            how = "(--dist loadgroup keeps each configuration on one worker; the default with --isolate)"
        from pagedattn.runner.workers import loadgroup_problem  # workers imports this module

        ungrouped = loadgroup_problem() if run.grouping_lost or run.isolate else ""
        if ungrouped:  # said at the start, not only in the summary
            how = f"(not grouped: a configuration may compile on each worker; {ungrouped})"
        device = run.chosen_device or "the default (cuda where torch sees one, else cpu)"
        return [
            f"pagedattn {__version__}: backend {run.spec} (loaded in each xdist worker, not in this process)",
            f"  device {device}; profile {run.profile}; --dist {dist} {how}",
            f"  torch {dist_version('torch')}, {versions}",
            _guard_line(run),
            *_check_lines(),
        ]
    import torch

    env = f"  torch {torch.__version__}, {versions}"
    name = f"{run.info.get('name', run.spec)} {run.info.get('version', '') or ''}".rstrip()
    lines = [
        f"pagedattn {__version__}: backend {name}",
        f"  runs on: {target(run)}; device {device_name(run.device)}; profile {run.profile}",
        env,
        _guard_line(run),
        *_check_lines(),
    ]
    if run.broken:
        return lines + [f"  ERROR: {run.broken}"]
    return lines + _claims_lines(run.info)


def records(config: pytest.Config) -> list[CaseRecord]:
    """The case records this process owns (none on an xdist worker)."""
    run = config.stash.get(RUN_KEY, None)
    return list(run.book.records.values()) if run is not None and run.book is not None else []


def probe_summary(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per reason a case was unclaimed: how many were probed, how many would pass, and each
    probed case's verdict (``--probe-unclaimed``)."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        if "probe" in r:
            row = out.setdefault(r.get("reason", ""), {"probed": 0, "would_pass": 0, "cases": {}})
            row["probed"] += 1
            row["would_pass"] += r["probe"] in ("would pass", "would hold")
            row["cases"][r["id"] + (f" ({r['property']})" if r.get("property") else "")] = r["probe"]
    return out


def report_header(config: pytest.Config) -> dict[str, Any]:
    """The JSON report's non-case part: the schema, the execution target, expectations."""
    import torch

    run = config.stash[RUN_KEY]
    cases = run.book.case_dicts() if run.book is not None else []
    info = run.info
    return {
        "schema": SCHEMA,
        "suite_version": __version__,
        "exit_status": getattr(config, "_pagedattn_exit", None),
        "duration_s": round(time.time() - getattr(config, "_pagedattn_start", time.time()), 3),
        "target": {
            "backend": info.get("name", run.spec),
            "backend_spec": run.spec,
            "backend_version": info.get("version", ""),
            "runs_on": target(run),
            "device": device_name(run.device),
            "profile": run.profile,
            "isolated": run.isolate,
            "case_timeout_s": run.timeout,
            "torch": torch.__version__,
            "triton": dist_version("triton"),
            "python": platform.python_version(),
            "check": " ".join(_check_lines()).strip() or "the GPU verdict kernel where the case is on CUDA",
            "capabilities": info.get("capabilities"),
            "limits": info.get("limit_lines", []),
            "declined_invariances": {k: v for k, v in (info.get("invariances") or {}).items() if v},
            "qk_precision": info.get("qk_precision", "fp32"),
            "tanh_precision": info.get("tanh_precision", "ieee"),
            "partials_precision": info.get("partials_precision", "fp32"),
            "declared_on": info.get("declared_on", "all"),
            "warmup_ahead": ahead_summary(info),
        },
        "error": run.broken or None,
        "grouping_lost": run.grouping_lost or None,
        "worker_start_failure": run.start_failure or None,
        "expectations": {
            "file": config.getoption("--expectations", None),
            "stale": stale_expectations(run.expectations, cases),
            "unexpected_passes": [r["id"] for r in cases if r["status"] == "xpassed"],
        },
        "probes": probe_summary(cases),
    }


def ahead_summary(info: dict[str, Any]) -> dict[str, Any] | None:
    """The warm-up ahead of the run (``pagedattn.runner.warmup``): its counts summed over the
    processes, or ``None`` where it was off."""
    if not info.get("warmup_ahead"):
        return None
    return dict(info.get("warmup_ahead_stats") or {})


def terminal_summary(tr: Any, config: pytest.Config, run: Run) -> None:
    """The summary at the end of the run: the table, then every case and entry that needs a
    word (unsupported reasons, probes, unexpected passes, stale expectations, crashes and
    timeouts, cases never run)."""
    recs = records(config)
    if run.book is None or not (recs or run.broken):
        return
    tr.write_sep("=", f"pagedattn conformance: {run.info.get('name', run.spec)} on {target(run)}")
    if run.broken:
        tr.write_line(f"ERROR: {run.broken}; no case ran", red=True)
    if not recs:  # nothing collected: the workers did not start (the backend)
        return
    cases = [r.to_dict() for r in recs]
    if run.grouping_lost:
        tr.write_line(f"warning: {run.grouping_lost}", yellow=True)
    if run.start_failure and run.start_failure != run.broken:
        tr.write_line(f"warning: a pytest-xdist worker failed to start: {run.start_failure}", yellow=True)
    for line in format_table(run.book.report()["summary"]):
        tr.write_line(line)
    for reason in sorted({r.reason for r in recs if r.status is Status.UNSUPPORTED}):
        tr.write_line(f"unsupported: {reason}")
    forms = sum(1 for r in recs if r.extra.get("decode_form_of"))
    if forms:
        tr.write_line(
            f"decode forms: {forms} cases of several query tokens per sequence offered as the decodes they imply "
            "(ids ending in -as-decode, each record's description says which rows; the cases themselves: unsupported)"
        )
    for reason, row in probe_summary(cases).items():
        tr.write_line(f"probe of unclaimed cases ({reason}): {row['would_pass']} of {row['probed']} would pass")
        for case_id, verdict in row["cases"].items():
            tr.write_line(f"  {case_id}: {verdict}")
    for r in recs:
        if r.status is Status.XPASSED:
            tr.write_line(f"unexpected pass (listed in --expectations): {r.id} ({r.nodeid})")
    for e in stale_expectations(run.expectations, cases):
        tr.write_line(f"stale expectation: {e['case']!r} matched no case ({e['reason']})")
    for r in recs:
        if r.status in (Status.CRASHED, Status.TIMED_OUT):
            first = r.message.splitlines()[0] if r.message else ""
            tr.write_line(f"{r.status.value}: " + (first if first.startswith(r.id) else f"{r.id}: {first}"), red=True)
    never: dict[str, int] = {}
    for r in recs:
        if r.status is Status.NOT_RUN:
            never[r.reason] = never.get(r.reason, 0) + 1
    for reason, n in never.items():
        tr.write_line(f"not run: {n} case{'s' if n > 1 else ''}: {reason}", red=True)
    starved = sum(1 for r in recs if r.extra.get("starved"))
    if starved:
        tr.write_line(
            f"search: {starved} {'item' if starved == 1 else 'items'} starved: {'it' if starved == 1 else 'they'} "
            "judged no case within --search-budget on this machine (warned, not failed); raise it, or give "
            "--search-budget=none with --search-examples N (the same cases every run)",
            yellow=True,
        )
    configurations = {r.configuration for r in recs if r.configuration}
    tr.write_line(f"{len(recs)} cases in {len(configurations)} configurations")
    ahead = ahead_summary(run.info)
    if ahead is not None:
        tr.write_line(
            f"warm-up ahead: {ahead.get('compiled', 0)} kernel classes compiled beside the cases "
            f"({ahead.get('seconds', 0):g} s; {ahead.get('reached_first', 0)} reached first by their cases, "
            f"{ahead.get('failed', 0)} failed)"
        )
        if ahead.get("errors"):
            tr.write_line(f"warm-up ahead: ended early in {ahead['errors']} process(es)", yellow=True)
    path = config.getoption("--report-json")
    if path:
        tr.write_line(f"JSON report: {path} (python -m pagedattn report {path})")
