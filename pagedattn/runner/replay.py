"""Replay: a failing case saved to a file, the one-line command that reruns it, and the
saved case read back as the suite's only case (``--replay FILE``).

Torch-free at import (the plugin imports it in every session); torch comes with the
case files.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pagedattn.oracle import PagedCase


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (shorter commands)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


@dataclass(frozen=True)
class ReplayFiles:
    """Where failing cases are saved (``directory``) and the command that replays one:
    ``pytest <suite_path> --backend=<backend_spec> --device=<device> --replay <file>
    <extra_args>``."""

    directory: str
    suite_path: str
    backend_spec: str
    device: str
    extra_args: Sequence[str] = ()

    def command(self, path: str) -> str:
        """The command that replays the case saved at ``path``."""
        args = [
            "pytest",
            self.suite_path,
            f"--backend={self.backend_spec}",
            f"--device={self.device}",
            "--replay",
            path,
            *self.extra_args,
        ]
        return " ".join(shlex.quote(a) for a in args)

    def path(self, name: str) -> str:
        """The file a case saved as ``name`` goes to (characters a file name should not hold
        become ``_``)."""
        return os.path.join(self.directory, re.sub(r"[^A-Za-z0-9_.+-]", "_", name) + ".pt")

    def save(self, case: PagedCase, name: str, **meta: Any) -> str:
        """Save ``case`` (moved to the CPU) as ``name``, with ``meta`` (``id``, ``family``,
        ``operation``); the command that replays it."""
        from pagedattn.cases import save_case

        path = self.path(name)
        save_case(case.to("cpu"), path, **meta)
        return self.command(_shown(path))


def rerun_command(nodeid: str, file: str | None, rootpath: str, spec: str | None, device: str, profile: str) -> str:
    """The command that reruns one case by its node id, isolated: for a case whose process
    died before a replay file could be saved (the case is rebuilt from its id)."""
    path, sep, rest = nodeid.partition("::")
    target = str(file or os.path.join(rootpath, path)) + sep + rest
    args = [
        "pytest",
        target,
        f"--backend={spec}",
        f"--device={device}",
        f"--profile={profile}",
        "-p",
        "pagedattn.plugin",
        "--isolate",
    ]
    return " ".join(shlex.quote(a) for a in args)


def replay_families() -> frozenset[str]:
    """The families a saved case may name: those of the suite's modules (``FAMILY``)."""
    from pagedattn.cases import FAMILIES

    return frozenset(FAMILIES) | {"properties", "search-replay"}


class ReplaySpec:
    """A saved case posing as a grid spec (``id``, ``family``, ``build()``).
    ``ReplaySpec(path)`` reads the file once per process (every test module asks for it);
    a bad file is one ``pytest.UsageError`` naming the file and the problem, raised from
    ``pytest_configure``."""

    _loaded: dict[tuple[str, int | None], tuple[PagedCase, dict[str, Any]]] = {}  # by path and mtime

    def __init__(self, path: str):
        self.path = path
        case, self.meta = self.load(path)
        self.family: str = self.meta.get("family", "replay")
        self.id = "replay-" + str(self.meta.get("id", os.path.basename(path)))
        self.operation: str = self.meta.get("operation", "attention")
        self._case = case

    @classmethod
    def load(cls, path: str) -> tuple[PagedCase, dict[str, Any]]:
        """``(case, meta)`` of the file, or ``pytest.UsageError``."""
        key: tuple[str, int | None]
        try:
            key = (os.path.abspath(path), os.stat(path).st_mtime_ns)
        except OSError:
            key = (os.path.abspath(path), None)  # load_case says what is wrong
        if key not in cls._loaded:
            from pagedattn.cases import load_case
            from pagedattn.cases.io import CaseFileError

            try:
                case, meta = load_case(path)
            except CaseFileError as exc:
                raise pytest.UsageError(f"--replay={exc}") from None
            import torch

            # every generator draws a finite query (the poison of a poisoned-padding case sits
            # in the cache's unread slots): a non-finite one is a damaged or hand-edited file
            bad = int((~torch.isfinite(case.query.float())).sum())
            if bad:
                raise pytest.UsageError(
                    f"--replay={path}: query holds {bad} non-finite value(s) of {case.query.numel()}; "
                    "a case's query must be finite"
                )
            family = meta.get("family")
            families = replay_families()
            if family not in families:
                raise pytest.UsageError(
                    f"--replay={path}: unknown family {family!r} (known: {', '.join(sorted(families))})"
                )
            cls._loaded[key] = (case, meta)
        return cls._loaded[key]

    def build(self, seed: int = 0) -> PagedCase:
        return self._case.clone()
