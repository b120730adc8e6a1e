"""The warm-up ahead's start after collection: whether ``--warmup-ahead`` asks for it, over which items.

The walk itself is ``pagedattn.runner.warmup``, imported (with torch) only where it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pagedattn.runner import collection
from pagedattn.runner.case_record import noted
from pagedattn.runner.record_book import CRASH_HINT
from pagedattn.runner.session import Run

if TYPE_CHECKING:
    from pagedattn.runner.suite import Suite


def warmup_ahead_wanted(config: pytest.Config, run: Run) -> bool:
    """``--warmup-ahead`` asks for it here: ``on``, or ``auto`` off the CPU; never under
    ``--isolate``, ``--replay`` or ``--collect-only`` (the backend must offer it too)."""
    choice = config.getoption("--warmup-ahead")
    if run.isolate or config.getoption("--replay") or config.getoption("collectonly", False):
        return False
    return choice == "on" or (choice == "auto" and not run.device.startswith("cpu"))


def start_warmup_ahead(session: pytest.Session, run: Run, suite: Suite) -> None:
    """Start this process's warm-up ahead over the attention and lse items it may run, where
    ``--warmup-ahead`` and the backend allow; the choice goes into ``run.info``."""
    from pagedattn.adapters.protocol import SupportsWarmupAhead

    config = session.config
    on = isinstance(suite.backend, SupportsWarmupAhead) and warmup_ahead_wanted(config, run)
    run.info["warmup_ahead"] = on
    if not on:
        return
    from pagedattn.cases.spec import CaseSpec
    from pagedattn.runner import warmup

    cases = []
    for item in session.items:
        spec, facts = collection.spec_of(item), noted(item)
        if isinstance(spec, CaseSpec) and facts.get("operation") in ("attention", "lse"):
            cases.append((spec, facts["operation"]))
    worker = getattr(config, "workerinput", None)
    claims = warmup.claim_dir(worker["testrunuid"]) if worker and worker.get("testrunuid") else None
    suite.ahead = warmup.WarmupAhead(suite.backend, suite.device, warmup.plan(cases), claims, suite.caps)
    book = run.book
    if book is not None:  # a serial run: its own book words crashes while the walk is on
        book.crash_hint = CRASH_HINT  # (under xdist the controller learns it from AHEAD_KEY)
        suite.ahead.on_end = lambda: setattr(book, "crash_hint", "")
    suite.ahead.start()
