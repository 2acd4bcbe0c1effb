"""The result cache (`--cache-size`, issue 56): the model-side row each distinct token sequence
got, kept so a query that repeats (autocomplete, popular searches) is answered without a server
call. Off by default (size 0).

Keyed by (tenant, model-side head, token ids): the ids after the request's prompt and
truncation, so two texts that tokenize alike share an entry and a different prompt, truncation
or head does not. A sequence's row does not depend on its batch
(tests/engine/test_batch_invariance.py), so the row kept is the answer a fresh call would give.

Isolation: one cache per model's `Pipeline`, never shared; the tenant is a digest of the API key
the request authenticated with (`set_tenant`, from the app's key check), so one key's traffic
never answers, nor reveals by its speed, another's. No keys configured: one tenant.

Bounded: the bytes counted are the row's, the key's and `ENTRY_OVERHEAD` per entry; the least
recently used go until the total is under the bound. Each gateway worker holds its own, of
size / workers (`gateway.main.make_pipeline`). Cleared when the model may have changed: a
replica of the model's pool turned healthy, or one was added (`ReplicaPool.on_change`).
"""

from __future__ import annotations

import contextvars
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import numpy as np

from embedserve.core.head import Head

# Python's own bytes per entry beyond the row's data and the key's bytes: the OrderedDict slot
# and link, the key tuple, two bytes objects' headers, the ndarray object, and the request's
# `Head` when the entry is the last to hold it. tracemalloc measured 268, 372 with a Head of its
# own (tests/gateway/test_result_cache.py holds it under this)
ENTRY_OVERHEAD = 400
OFF = 0  # `--cache-size`'s default: no cache
TENANT_BYTES = 16  # a blake2b digest: the key itself is never kept

# the tenant of the request now handled (`set_tenant`); b"": no keys configured, one tenant
_TENANT: contextvars.ContextVar[bytes] = contextvars.ContextVar("embedserve_tenant", default=b"")

Key = tuple[bytes, Head | None, bytes]


def set_tenant(api_key: bytes) -> None:
    """The request now handled authenticated with `api_key` (b"": none needed)."""
    _TENANT.set(hashlib.blake2b(api_key, digest_size=TENANT_BYTES).digest() if api_key else b"")


class CacheStats(Protocol):
    """Where the cache reports (`gateway.metrics.Metrics.cache`)."""

    def looked_up(self, hits: int, misses: int) -> None: ...

    def changed(self, nbytes: int, entries: int, evictions: int) -> None: ...


class NoStats:
    def looked_up(self, hits: int, misses: int) -> None:
        pass

    def changed(self, nbytes: int, entries: int, evictions: int) -> None:
        pass


class ResultCache:
    """An LRU of rows under `max_bytes` (`OFF`: nothing kept or looked up)."""

    def __init__(self, max_bytes: int = OFF, stats: CacheStats | None = None) -> None:
        self.max_bytes = max_bytes
        self.stats: CacheStats = NoStats() if stats is None else stats
        self._rows: OrderedDict[Key, np.ndarray] = OrderedDict()
        self.nbytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._rows)

    async def rows(
        self,
        seqs: Sequence[Sequence[int]],
        compute: Callable[[Sequence[Sequence[int]]], Awaitable[np.ndarray]],
        head: Head | None,
    ) -> np.ndarray:
        """The distinct sequences' rows under `head`, in order: the ones kept from here, the
        others from `compute(those)` (the servers), then kept; off: `compute(seqs)`."""
        if not self.enabled:
            return await compute(seqs)
        keys = self.keys(seqs, head)
        found = self.get_many(keys)
        missing = [i for i, row in enumerate(found) if row is None]
        if missing:
            fresh = await compute([seqs[i] for i in missing])
            self.put_many([keys[i] for i in missing], fresh)
            for j, i in enumerate(missing):
                found[i] = fresh[j]
        return np.stack(found)  # type: ignore[arg-type]  # each found here or computed

    def keys(self, seqs: Sequence[Sequence[int]], head: Head | None) -> list[Key]:
        """The sequences' keys for the current request's tenant."""
        tenant = _TENANT.get()
        # int32 bytes: compact, hashable, and their size is what the bound counts
        return [(tenant, head, np.asarray(s, dtype=np.int32).tobytes()) for s in seqs]

    def get_many(self, keys: Sequence[Key]) -> list[np.ndarray | None]:
        """Each key's row (None: a miss); the found ones become the most recently used."""
        found: list[np.ndarray | None] = []
        for key in keys:
            row = self._rows.get(key)
            if row is not None:
                self._rows.move_to_end(key)
            found.append(row)
        hits = sum(r is not None for r in found)
        self.stats.looked_up(hits, len(keys) - hits)
        return found

    def put_many(self, keys: Sequence[Key], rows: np.ndarray) -> None:
        """Keep row i under keys[i], then evict the least recently used down to the bound."""
        evicted = 0
        for key, row in zip(keys, rows, strict=True):
            # a copy: a view would keep the whole response array alive, uncounted
            row = np.array(row, copy=True)
            size = entry_bytes(key, row)
            if size > self.max_bytes:
                continue  # it would evict everything and still not fit
            old = self._rows.pop(key, None)
            if old is not None:
                self.nbytes -= entry_bytes(key, old)
            self._rows[key] = row
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                old_key, old_row = self._rows.popitem(last=False)
                self.nbytes -= entry_bytes(old_key, old_row)
                evicted += 1
        self.stats.changed(self.nbytes, len(self._rows), evicted)

    def clear(self) -> None:
        """Forget every row (the model behind them may have changed)."""
        if self._rows:
            self._rows.clear()
            self.nbytes = 0
            self.stats.changed(0, 0, 0)


def entry_bytes(key: Key, row: np.ndarray) -> int:
    """What one entry costs: its row's data, its key's bytes and `ENTRY_OVERHEAD`."""
    return row.nbytes + len(key[0]) + len(key[2]) + ENTRY_OVERHEAD
