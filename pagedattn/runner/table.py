"""The summary table of a run: per (family, dtype), a count per status, the worst
budget used and the largest RMS ratio (the error's distribution against the model's); built
from the case records' dictionaries alone (``CaseRecord.to_dict``), so
that a finished run, a run in progress and a saved JSON report print the same table."""

from __future__ import annotations

from typing import Any

from pagedattn.runner.status import Status

COLUMNS = tuple(s.value for s in Status)


def summary_rows(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per ``(family, dtype)``: a count per status, the worst budget used (``"invalid"``
    when some output was rejected, ``None`` when nothing was judged) and the largest RMS ratio
    judged (``None``: none judged)."""
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for c in cases:
        row = table.setdefault(
            (c["family"], c["dtype"]), {s: 0 for s in COLUMNS} | {"worst_budget": None, "worst_rms": None}
        )
        row[c["status"]] += 1
        rec_metrics = c.get("metrics") or {}
        rms = rec_metrics.get("rms") or {}
        if rms.get("judged") and isinstance(rms.get("ratio"), (int, float)):
            row["worst_rms"] = rms["ratio"] if row["worst_rms"] is None else max(row["worst_rms"], rms["ratio"])
        if rec_metrics.get("problem") or rec_metrics.get("num_nonfinite"):
            row["worst_budget"] = "invalid"
            continue
        budget = rec_metrics.get("budget_used")
        if isinstance(budget, (int, float)) and row["worst_budget"] != "invalid":
            row["worst_budget"] = budget if row["worst_budget"] is None else max(row["worst_budget"], budget)
    return [{"family": f, "dtype": d, **row} for (f, d), row in sorted(table.items())]


def format_table(rows: list[dict[str, Any]]) -> list[str]:
    """The terminal summary table of ``summary_rows``."""
    base = ["passed", "failed", "warned", "unsupported"]
    cols = base + [c for c in COLUMNS if c not in base and any(r.get(c) for r in rows)]
    dw = max([7] + [len(r["dtype"]) + 2 for r in rows])
    fw = max([14] + [len(r["family"]) + 2 for r in rows])
    width = {c: max(8, len(c) + 2) for c in cols}
    head = (
        f"{'family':<{fw}}{'dtype':<{dw}}"
        + "".join(f"{c:>{width[c]}}" for c in cols)
        + f"{'worst budget':>14}{'worst rms':>11}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        wb = r.get("worst_budget")
        wb_s = "-" if wb is None else wb if isinstance(wb, str) else f"{wb:.3g}"
        cells = "".join(f"{r.get(c, 0):>{width[c]}}" for c in cols)
        rms = r.get("worst_rms")
        rms_s = "-" if rms is None else f"{rms:.3g}"
        lines.append(f"{r['family']:<{fw}}{r['dtype']:<{dw}}{cells}{wb_s:>14}{rms_s:>11}")
    return lines


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The table and the accounting lines of a JSON report, finished or not."""
    cases = report.get("cases", [])
    lines = format_table(summary_rows(cases))
    counts: dict[str, int] = {}
    for c in cases:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    lines.append(f"{len(cases)} cases: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if not report.get("complete", True):
        running = report.get("running") or []
        lines.append(
            "the run did not finish"
            + (f"; it died while running {', '.join(running)} (recorded as crashed)" if running else "")
            + ": rerun with --isolate to contain crashes"
        )
    for c in cases:
        if c["status"] in ("failed", "crashed", "timed_out", "xpassed"):
            first = (c.get("message") or "").splitlines()
            text = first[0] if first else ""
            lines.append(f"{c['status']}: " + (text if text.startswith(c["id"]) else f"{c['id']}: {text}"))
            if c.get("replay"):
                lines.append(f"  replay: {c['replay']}")
    return lines
