"""What ``--backend=...`` names, told without importing torch or the backend: the
entry-point group, the installed names, and ``spec_problem``, which the pytest-xdist
controller (which imports no torch: its workers load the backend) asks before it starts them.
``pagedattn.adapters.loading`` loads what these name."""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.metadata import EntryPoint, entry_points

GROUP = "pagedattn.backends"


def available_backends() -> dict[str, EntryPoint]:
    """Entry points of the ``pagedattn.backends`` group, by name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def spec_problem(spec: str) -> str | None:
    """Why ``spec`` cannot name a backend, as far as can be told without importing the
    backend's code (an unknown entry-point name, a missing file, a top-level module Python
    cannot find), else ``None``. The pytest-xdist controller asks this before it starts the
    workers, which load the backend: a typo is then one usage error, not every worker failing
    to start. Anything past it (the module's own imports, the attribute, the constructor) is
    ``load_backend``'s to find."""
    if ":" in spec:
        where = spec.rsplit(":", 1)[0]
        if where.endswith(".py") or os.sep in where or "/" in where:
            return None if os.path.exists(where) else f"--backend={spec}: file {where!r} does not exist"
        top = where.split(".", 1)[0]
        if top in sys.modules:  # imported already (a plugin or conftest may put modules there)
            return None
        try:
            found = importlib.util.find_spec(top) is not None  # the top level only: no package is imported
        except (ImportError, ValueError):
            found = True  # cannot tell without importing it: the workers will
        return None if found else f"--backend={spec}: no module named {top!r} (importing {where!r})"
    known = available_backends()
    if spec not in known:
        names = ", ".join(sorted(known)) or "(none installed)"
        return (
            f"--backend={spec}: unknown backend. Available: {names}. "
            "Or give package.module:attr or path/to/file.py:attr."
        )
    return None
