"""Marks, on the node's disk, of the work an `embedserve index` actor has begun and not finished.

When an actor dies (a kill, an out-of-memory kill, a crash in native code), Ray restarts it and
retries its batch; an actor's memory dies with it, so the marks are what tells the restarted one
that its predecessor died on this very batch. It then embeds the batch one record at a time,
marking each, and a record that has killed RECORD_DEATHS workers is reported in the errors file
instead of being tried again: one poisonous record costs a bounded number of restarts, not a loop.
A Python exception is no death: its marks are removed (`end`)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

# deaths while embedding one record before it is given up (two: one kill from outside, an
# out-of-memory kill caused by another process, does not condemn a record)
RECORD_DEATHS = 2
DIED = "the worker embedding it died {n} times (killed, out of memory or a crash); not retried"


def work_key(ids: Sequence[str], texts: Sequence[str]) -> str:
    """The same records, retried on a restarted actor, have the same key."""
    h = hashlib.sha1()
    for i, t in zip(ids, texts, strict=True):
        h.update(i.encode() + b"\0" + t.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


class Ledger:
    """One job's marks: a file per piece of work begun, holding the deaths seen during it."""

    def __init__(self, job: str, folder: Path | None = None) -> None:
        # NOTE: the node's temporary folder, the same for an actor and its restarts on a node;
        # one per user, so another user's folder of that name cannot make the marks fail
        uid = getattr(os, "getuid", lambda: 0)()
        self.folder: Path | None = folder or Path(tempfile.gettempdir()) / f"embedserve-index-{uid}"
        self.job = job
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError:  # no marks, no guard: a record that kills its worker fails the job
            self.folder = None

    def begin(self, key: str) -> int:
        """Mark `key` begun; returns how many workers died doing it before (0: none)."""
        if self.folder is None:
            return 0
        path = self.folder / f"{self.job}-{key}"
        try:
            deaths = int(path.read_text() or 0) + 1
        except (FileNotFoundError, ValueError):
            deaths = 0
        try:
            path.write_text(str(deaths))  # read back by the next actor only if this one dies
        except OSError:
            return 0
        return deaths

    def end(self, key: str) -> None:
        if self.folder is not None:
            (self.folder / f"{self.job}-{key}").unlink(missing_ok=True)
