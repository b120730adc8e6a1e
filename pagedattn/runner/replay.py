"""Replay: a failing case saved to a file, the one-line command that reruns it, and the
saved case read back as the suite's only case (``--replay FILE``).

Torch-free at import (the plugin imports it in every session); torch comes with the
case files.
"""

from __future__ import annotations

import os
import re
import shlex
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pagedattn.oracle import PagedCase


#: failing cases kept under ``--replay-dir`` from earlier runs (the newest by time); a run
#: adds its own on top, so the folder stays bounded across runs, green or red
KEEP_FILES = 200

#: what ``ReplaySpec`` puts before a saved case's id (stripped again when it is saved anew)
PREFIX = "replay-"


def _absolute_spec(spec: str) -> str:
    """``--backend`` with a file path made absolute (``path/to/file.py:attr``), so that the
    printed command works from any directory; entry-point names and modules stay as given."""
    path, sep, attr = spec.rpartition(":")
    if sep and path.endswith(".py") and os.path.exists(path):
        return f"{os.path.abspath(path)}:{attr}"
    return spec


def case_name(case_id: str) -> str:
    """``case_id`` without the prefixes that replays add (``replay-replay-x`` -> ``x``)."""
    while case_id.startswith(PREFIX):
        case_id = case_id[len(PREFIX) :]
    return case_id


#: how a saved case's pickle begins its format tag (``pagedattn.cases.io.FORMAT``, which imports torch)
_CASE_TAG = b"pagedattn-case/"


def is_saved_case(path: str) -> bool:
    """Whether ``path`` is a case that pagedattn saved (a ``torch.save`` archive whose pickle
    holds the case format's tag), read without torch: other ``.pt`` files are never pruned."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            return any(_CASE_TAG in archive.read(n) for n in pickles)
    except (OSError, zipfile.BadZipFile):
        return False


def prune(directory: str, keep: int = KEEP_FILES, spare: str | None = None) -> int:
    """Remove all but the newest ``keep`` saved cases of ``directory`` (never ``spare``, the
    file being replayed, nor a file pagedattn did not save); how many were removed. Run once,
    before the run saves any."""
    try:
        entries = [e for e in os.scandir(directory) if e.is_file() and e.name.endswith(".pt")]
    except OSError:
        return 0
    spare = os.path.abspath(spare) if spare else None
    entries.sort(key=lambda e: e.stat().st_mtime_ns, reverse=True)
    removed = 0
    for e in entries[keep:]:
        if os.path.abspath(e.path) == spare or not is_saved_case(e.path):
            continue
        try:
            os.unlink(e.path)
            removed += 1
        except OSError:
            pass  # another run pruned it first
    return removed


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
            os.path.abspath(self.suite_path),
            f"--backend={_absolute_spec(self.backend_spec)}",
            f"--device={self.device}",
            "--replay",
            os.path.abspath(path),
            *self.extra_args,
        ]
        return " ".join(shlex.quote(a) for a in args)

    def path(self, name: str) -> str:
        """The file a case saved as ``name`` goes to (characters a file name should not hold
        become ``_``)."""
        return os.path.join(os.path.abspath(self.directory), re.sub(r"[^A-Za-z0-9_.+-]", "_", name) + ".pt")

    def save(self, case: PagedCase, name: str, **meta: Any) -> str:
        """Save ``case`` (moved to the CPU) as ``name``, with ``meta`` (``id``, ``family``,
        ``operation``); the command that replays it."""
        from pagedattn.cases import save_case

        # the name comes from the case id: a replayed case saved again keeps its file name
        family = str(meta.get("family", ""))
        name = case_name(name)
        if family and name.startswith(f"{family}-{PREFIX}"):  # ``suite.fail``'s name of a replayed case
            rest = case_name(name[len(family) + 1 :])
            name = rest if rest.startswith(family) else f"{family}-{rest}"
        if "id" in meta:
            meta["id"] = case_name(str(meta["id"]))
        path = self.path(name)
        save_case(case.to("cpu"), path, **meta)
        return self.command(path)


def rerun_command(nodeid: str, file: str | None, rootpath: str, spec: str | None, device: str, profile: str) -> str:
    """The command that reruns one case by its node id, isolated: for a case whose process
    died before a replay file could be saved (the case is rebuilt from its id)."""
    path, sep, rest = nodeid.partition("::")
    target = os.path.abspath(str(file or os.path.join(rootpath, path))) + sep + rest
    args = [
        "pytest",
        target,
        f"--backend={_absolute_spec(spec or '')}",
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
        self.id = PREFIX + case_name(str(self.meta.get("id", os.path.basename(path))))
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
