"""API keys: the keys a client must send as `Authorization: Bearer <key>`.

From `--api-key` (repeatable) and `--api-key-file` (one key per line; blank lines and `#`
comments skipped). The file is read again on SIGHUP (the gateway supervisor forwards it to its
workers), so keys rotate without a restart. No keys: no authentication.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("embedserve.gateway")


def read_key_file(path: Path) -> frozenset[bytes]:
    """The keys of a key file; an unreadable or empty file is an error (it would lock out, or
    let in, everyone)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ValueError(f"--api-key-file {path}: cannot read it ({e.strerror})") from None
    # NOTE: stripped before the comment test, so an indented `  # note` is a comment, not a key
    stripped = (line.strip() for line in lines)
    keys = frozenset(line.encode() for line in stripped if line and not line.startswith("#"))
    if not keys:
        raise ValueError(f"--api-key-file {path}: no keys in it")
    return keys


class KeyRing:
    def __init__(self, keys: Sequence[str], key_file: str | None) -> None:
        self.fixed = frozenset(k.encode() for k in keys)
        if any(not k.strip() for k in keys):
            raise ValueError("--api-key must not be empty")
        self.key_file = Path(key_file) if key_file else None
        self._keys = self.fixed | (read_key_file(self.key_file) if self.key_file else frozenset())

    def __call__(self) -> frozenset[bytes]:
        return self._keys

    def reload(self) -> None:
        """Read the key file again (SIGHUP); on an error, keep the keys in force and log it."""
        if self.key_file is None:
            return
        try:
            self._keys = self.fixed | read_key_file(self.key_file)
        except ValueError as e:
            log.error("keeping the API keys in force: %s", e)
            return
        log.warning("API keys reloaded from %s (%d keys)", self.key_file, len(self._keys))
