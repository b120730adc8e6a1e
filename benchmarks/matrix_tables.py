"""Family tables and run unions for the conformance matrix, from the suite's JSON reports.

    python benchmarks/matrix_tables.py table REPORT.json              # one run, by family
    python benchmarks/matrix_tables.py union OUT.json RUN.json...     # several runs of one backend

A union takes, per case, the outcome of the run that finished it (passed, failed,
warned, unsupported, expected failure; of several that agree, the latest run's record);
a case no run finished keeps its most telling record: ``timed_out`` before ``crashed``
(here: the run was stopped while it ran) before ``not_run``. Two runs that finished a
case differently are listed under ``disagreements``, never merged. Counts are cases;
the worst budget is the largest ``budget_used`` of a finished, checked case. Nothing
here runs a kernel.
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any

from pagedattn.cases.io import RENAMED_FAMILIES

FINISHED = ("passed", "failed", "warned", "unsupported", "xfailed", "xpassed")
COLUMNS = ("passed", "failed", "warned", "unsupported", "timed_out", "crashed", "not_run")


def _rank(case: dict[str, Any]) -> int:
    """Finished beats a time-out, which beats a run stopped mid-case, which beats never run."""
    s = case["status"]
    return 3 if s in FINISHED else {"timed_out": 2, "crashed": 1}.get(s, 0)


def _budget(case: dict[str, Any]) -> float | None:
    m = case.get("metrics") or {}
    return m.get("budget_used") if case["status"] in ("passed", "warned", "failed", "xfailed", "xpassed") else None


def families(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{family: {status: count, ..., "worst_budget": float | None}}``, plus ``"all"``."""
    out: dict[str, dict[str, Any]] = collections.defaultdict(lambda: collections.Counter())
    worst: dict[str, float] = {}
    for c in cases:
        for fam in (c["family"], "all"):
            out[fam][c["status"]] += 1
            b = _budget(c)
            if b is not None:
                worst[fam] = max(worst.get(fam, 0.0), b)
    return {f: {**dict(v), "worst_budget": worst.get(f)} for f, v in out.items()}


def markdown(cases: list[dict[str, Any]]) -> str:
    fams = families(cases)
    cols = [c for c in COLUMNS if any(fams[f].get(c) for f in fams) or c in ("passed", "failed", "warned")]
    lines = ["| family | " + " | ".join(c.replace("_", " ") for c in cols) + " | worst budget |",
             "|---|" + "---|" * (len(cols) + 1)]  # fmt: skip
    for f in sorted(fams, key=lambda f: (f == "all", f)):
        row = fams[f]
        wb = "-" if row["worst_budget"] is None else f"{row['worst_budget']:.3g}"
        name = f"**all ({sum(row.get(c, 0) for c in COLUMNS)})**" if f == "all" else f
        lines.append(f"| {name} | " + " | ".join(str(row.get(c, 0)) for c in cols) + f" | {wb} |")
    return "\n".join(lines)


#: family renames: reports written by suites before 0.2.0 name families, their
#: test files and fp8 cache tokens the old way; a union matches a case across the rename
#: (the families as ``load_case`` renames them in old replay files)
RENAMED = tuple(
    pair
    for old, new in RENAMED_FAMILIES.items()
    for pair in ((f"test_{old}.py::test_{old}[{old}-", f"test_{new}.py::test_{new}[{new}-"), (f"[{old}-", f"[{new}-"))
) + (("-kve4m3", "-fp8_e4m3"), ("-kve5m2", "-fp8_e5m2"))


def current_nodeid(node: str) -> str:
    """``node`` in this release's vocabulary (unchanged when it already is)."""
    for old, new in RENAMED:
        node = node.replace(old, new)
    return node


def union(paths: list[str]) -> dict[str, Any]:
    reports = [json.load(open(p)) for p in paths]
    final: dict[str, dict[str, Any]] = {}
    source: dict[str, str] = {}
    disagreements = []
    for path, rep in zip(paths, reports):
        for c in rep["cases"]:
            node = current_nodeid(c["nodeid"])
            family = RENAMED_FAMILIES.get(c["family"], c["family"])
            c = dict(c, nodeid=node, id=current_nodeid("[" + c["id"])[1:], family=family)
            prev = final.get(node)
            if prev is not None and prev["status"] in FINISHED and c["status"] in FINISHED:
                if c["status"] != prev["status"]:
                    disagreements.append({"case": c["id"], source[node]: prev["status"], path: c["status"]})
                else:  # the same outcome: the latest run's record (its message, this release's suite)
                    final[node], source[node] = c, path
                continue
            if prev is None or _rank(c) >= _rank(prev):
                final[node], source[node] = c, path
    cases = [dict(final[n], run=source[n]) for n in sorted(final)]
    return {
        "runs": [
            {
                "report": p,
                "duration_s": r.get("duration_s"),
                "exit_status": r.get("exit_status"),
                "counts": r.get("counts"),
                "configurations": r.get("configurations"),
            }
            for p, r in zip(paths, reports)
        ],  # fmt: skip
        "target": reports[-1].get("target"),
        "families": families(cases),
        "disagreements": disagreements,
        "cases": cases,
    }


def main(argv: list[str]) -> None:
    if argv[:1] == ["table"]:
        print(markdown(json.load(open(argv[1]))["cases"]))
    elif argv[:1] == ["union"]:
        u = union(argv[2:])
        with open(argv[1], "w") as fh:
            json.dump(u, fh, indent=1)
        print(markdown(u["cases"]))
        print(f"\ndisagreements: {u['disagreements'] or 'none'}")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
