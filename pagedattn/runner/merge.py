"""Saved JSON reports judged as a CI gate, one or several shards (``--shard I/N``) merged
into one verdict: ``python -m pagedattn report A.json B.json ...``.

The merged report is the union of the shards' cases by node id. A run fails when a report
is unfinished, recorded an error or a failing exit status, when two reports disagree on a
case, when a shard of the run is missing or a collected case is in no report (``not_run``),
when a case failed, or when no case (or fewer than ``--min-judged``) reached a verdict.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedattn.runner.gate import NOTHING_JUDGED, judged_reason
from pagedattn.runner.shard import collected_digest
from pagedattn.runner.status import FAILING, Status

#: failing statuses, as the report's strings
_FAILING = {s.value for s in FAILING}


def merge(reports: Sequence[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], list[str], int]:
    """``(merged report, problems, exit status)`` of the ``(path, report)`` pairs: one line per
    problem; the status 0, 1 (a failure of any kind) or ``NOTHING_JUDGED`` (nothing else
    failed, but too few cases reached a verdict)."""
    problems: list[str] = []
    cases: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    for path, report in reports:
        if not report.get("complete", True):
            running = ", ".join(report.get("running") or [])
            died = f" (it died running {running})" if running else ""
            problems.append(f"{path}: incomplete: the run did not finish{died}")
        if report.get("error"):
            problems.append(f"{path}: error: {report['error']}")
        exit_status = report.get("exit_status")
        if exit_status not in (0, None, NOTHING_JUDGED):  # the run's own judgement of nothing is redone below
            problems.append(f"{path}: the run exited {exit_status}")
        if not report.get("cases"):
            problems.append(f"{path}: no cases: the report accounts for no collected case")
        for reason in (report.get("gate") or {}).get("reasons") or []:
            if not reason.startswith(("nothing judged", "too few judged")):  # redone over the union below
                problems.append(f"{path}: {reason}")
        for case in report.get("cases") or []:
            key = case.get("nodeid") or case.get("id")
            if key in cases and cases[key].get("status") != case.get("status"):
                problems.append(
                    f"conflict: {key} is {cases[key].get('status')} in {origin[key]} but {case.get('status')} in {path}"
                )
                continue
            cases.setdefault(key, case)
            origin.setdefault(key, path)
    merged_cases = list(cases.values())
    problems += _shard_problems(reports, merged_cases)
    # an unexpected pass fails unless every run was lenient (--lenient-expectations)
    lenient = all((r.get("gate") or {}).get("strict_expectations") is False for _, r in reports)
    failing = _FAILING - ({Status.XPASSED.value} if lenient else set())
    if any(c.get("status") in failing for c in merged_cases):
        counts = _counts(merged_cases)
        problems.append("failing cases: " + ", ".join(f"{counts[s]} {s}" for s in sorted(counts) if s in failing))
    status = 1 if problems else 0
    floors = [g.get("min_judged") for _, r in reports if (g := r.get("gate")) and g.get("min_judged") is not None]
    why = judged_reason([str(c.get("status")) for c in merged_cases], max(floors) if floors else None)
    if why:
        problems.append(why)
        status = status or NOTHING_JUDGED
    first = reports[0][1] if reports else {}
    merged = {
        **{k: v for k, v in first.items() if k not in ("cases", "shard", "summary", "counts", "running")},
        "complete": all(r.get("complete", True) for _, r in reports),
        "running": sorted({n for _, r in reports for n in r.get("running") or []}),
        "counts": _counts(merged_cases),
        "cases": merged_cases,
    }
    return merged, problems, status


def _counts(cases: list[dict[str, Any]]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for c in cases:
        counts[str(c.get("status"))] = counts.get(str(c.get("status")), 0) + 1
    return {s: n for s, n in counts.items() if n}


def _shard_problems(reports: Sequence[tuple[str, dict[str, Any]]], merged: list[dict[str, Any]]) -> list[str]:
    """Shards missing, given twice or of different runs; collected cases no report ran (added
    to ``merged`` as ``not_run``)."""
    shards = [(path, r["shard"]) for path, r in reports if isinstance(r.get("shard"), dict)]
    if not shards:
        return []
    problems: list[str] = []
    if len(shards) != len(reports):
        problems.append("some reports are shards (--shard) and some are not")
    counts = {s["count"] for _, s in shards}
    if len(counts) > 1:
        problems.append(f"the shards split the run differently (N = {', '.join(map(str, sorted(counts)))})")
    seen: dict[int, str] = {}
    for path, s in shards:
        if s["index"] in seen:
            problems.append(f"shard {s['index']}/{s['count']} given twice: {seen[s['index']]} and {path}")
        seen[s["index"]] = path
    missing = sorted(set(range(1, max(counts) + 1)) - seen.keys())
    if missing:
        problems.append(f"shard(s) {', '.join(f'{i}/{max(counts)}' for i in missing)} missing: no report given")
    digests = {s.get("collected_sha256") for _, s in shards}
    if len(digests) > 1:
        problems.append("the shards collected different cases (different commands or versions): not one run")
    collected = [n for _, s in shards for n in s.get("collected_ids") or []]
    if not collected:
        return problems + ["the shards recorded no collected cases: cases missing from every shard cannot be named"]
    ran = {c.get("nodeid") for c in merged}
    absent = sorted(set(collected) - ran)
    for nodeid in absent:
        from pagedattn.runner.case_record import base_record

        rec = base_record(nodeid)
        rec.reason = "in no shard's report: the shard that holds it did not report it"
        merged.append(rec.to_dict())
    if absent:
        shown = ", ".join(absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
        problems.append(f"not run: {len(absent)} collected case(s) in no shard's report: {shown}")
    for _, s in shards:
        if collected_digest(s.get("collected_ids") or []) != s.get("collected_sha256"):
            problems.append("a shard's collected ids do not match its digest: the report was edited")
            break
    return problems
