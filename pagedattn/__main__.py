"""``python -m pagedattn``: what this machine has and what each backend can run here.

``python -m pagedattn report FILE [FILE ...]`` prints the summary table of a JSON report
(``--report-json``), finished or not (a run that died leaves a valid report), or of the
shards of one run merged (``--shard``), and exits with the run's verdict.
"""

from __future__ import annotations

import json
import platform
import sys

import torch

from pagedattn._version import __version__, dist_version


def report() -> list[str]:
    from pagedattn.adapters.loading import BackendLoadError, available_backends, load_backend

    cuda = torch.cuda.is_available()
    device = f"cuda ({torch.cuda.get_device_name()}, {torch.cuda.device_count()} device(s))" if cuda else "cpu"
    lines = [
        f"pagedattn {__version__}",
        f"python {platform.python_version()}, torch {torch.__version__}, triton {dist_version('triton')}",
        f"device: {device}",
        "backends (pytest conformance --backend=NAME):",
    ]
    here = "cuda" if cuda else "cpu"
    for name in sorted(available_backends()):
        try:
            backend = load_backend(name)
        except BackendLoadError as exc:
            if isinstance(exc.__cause__, ImportError):  # a contrib adapter whose package is absent
                lines.append(f"  {name:<10} not installed: {exc.__cause__}")
                continue
            first = str(exc).strip().splitlines()
            lines.append(f"  {name:<10} cannot load here: {first[-1] if first else exc}")
            continue
        caps = backend.capabilities
        d = caps.describe()
        runs = "runs here" if here in caps.devices else f"does not run on {here} (claims {', '.join(d['devices'])})"
        target = getattr(backend, "target", None) or name
        lines.append(f"  {name:<10} {runs}: {target}")
        lines.append(
            f"  {'':<10} dtypes {', '.join(d['dtypes'])}; operations {', '.join(d['operations'])}; "
            f"fp32 dots {d['fp32_precision']}"
            + (f"; tolerance x{caps.tolerance_factor:g}" if caps.tolerance_factor != 1.0 else "")
        )
        lines.append(f"  {'':<10} variants {', '.join(d['variants']) or 'none'}")
        for key, note in caps.notes.items():
            lines.append(f"  {'':<10} {key}: {note}")
    return lines


def print_report(*paths: str) -> int:
    """The summary of the JSON reports at ``paths`` (``--report-json``; several: the shards of
    one run, ``--shard``, merged) and the verdict as the run's exit status: 0 if every case
    passed (or was unsupported or expected to fail) and cases were judged; 1 for a failing
    case, a conflict between shards, a missing shard or case, an unfinished run, a report
    without cases or the run's ``error`` (a backend that could not be loaded or built);
    ``NOTHING_JUDGED`` (6) where no case, or fewer than ``--min-judged``, reached a verdict; 2
    if a file is not a report. Each reason is one line."""
    from pagedattn.runner.merge import merge
    from pagedattn.runner.table import summary_lines

    reports = []
    for path in paths:
        try:
            with open(path) as f:
                report = json.load(f)
            if not isinstance(report["cases"], list):
                raise TypeError("'cases' is not a list")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"{path}: not a pagedattn JSON report ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        reports.append((path, report))
    merged, problems, status = merge(reports)
    target = merged.get("target") or {}
    unfinished = "" if merged.get("complete", True) else " (unfinished run)"
    shown = paths[0] if len(paths) == 1 else f"{len(paths)} reports merged"
    print(
        f"pagedattn report {shown}: backend {target.get('backend')} on {target.get('runs_on')}, "
        f"profile {target.get('profile')}{unfinished}"
    )
    if merged.get("error") and len(paths) == 1:
        print(f"ERROR: {merged['error']}")
    print("\n".join(summary_lines(merged)))
    for problem in problems:
        print(f"FAILED: {problem}")
    return status


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        print(f"pagedattn {__version__}")
        return 0
    if args and args[0] == "report":
        if len(args) < 2:
            print("usage: python -m pagedattn report FILE [FILE ...]", file=sys.stderr)
            return 2
        return print_report(*args[1:])
    if args:
        print("usage: python -m pagedattn [--version | report FILE [FILE ...]]", file=sys.stderr)
        return 2
    print("\n".join(report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
