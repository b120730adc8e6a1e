"""``python -m pagedattn``: what this machine has and what each backend can run here."""

from __future__ import annotations

import importlib.metadata
import platform
import sys

import torch

from pagedattn._version import __version__


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def report() -> list[str]:
    from pagedattn.adapters.loading import BackendLoadError, available_backends, load_backend

    cuda = torch.cuda.is_available()
    device = f"cuda ({torch.cuda.get_device_name()}, {torch.cuda.device_count()} device(s))" if cuda else "cpu"
    lines = [
        f"pagedattn {__version__}",
        f"python {platform.python_version()}, torch {torch.__version__}, triton {_version('triton')}",
        f"device: {device}",
        "backends (pytest conformance --backend=NAME):",
    ]
    here = "cuda" if cuda else "cpu"
    for name in sorted(available_backends()):
        try:
            backend = load_backend(name)
        except BackendLoadError as exc:
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


def main() -> int:
    print("\n".join(report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
