"""Write epochs: a reader never caches an index older than one this process wrote (issue 9, item 4).

The race this prevents (seen as a "poisoned index cache" with one writer and
three readers on one proxy)::

    reader:  read index (generation 1) ......................... cache.put(index 1)
    writer:              write shard (generation 2), cache.put(index 2)

The reader's late ``put`` replaces the newer index with the older one, and
every later read of that shard through the proxy uses offsets into bytes that
are gone. With epochs, the reader takes a ticket before its index read and
may cache only if no write of that shard happened since::

    ticket = epochs.ticket(shard_key)         # before reading the index
    index = read_index(shard_key)
    epochs.put_if_current(cache, shard_key, ticket, index, validator)

and the writer calls ``epochs.bump(shard_key)`` once its shard is stored,
before putting the new index; better, it brackets the store with
``epochs.begin(keys)`` and ``epochs.end(keys)``: while a write is in flight no
index of its stripe is cached at all (a reader that read the old index just
before the store would otherwise cache it until the writer's own ``put``).
Counters are striped (a fixed array, by hash
of the shard key), so memory is bounded; a bump of a stripe also refuses
tickets of other shards in the stripe, which only skips a cache fill.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any, Hashable, Iterable

__all__ = ["WriteEpochs"]


class WriteEpochs:
    """Striped write counters of one store's shards.

    Parameters
    ----------
    n_stripes : int
        Counters (ints) kept, whatever the number of shards.

    Raises
    ------
    ValueError
        If ``n_stripes`` is below 1.
    """

    def __init__(self, n_stripes: int = 4096) -> None:
        if n_stripes < 1:
            raise ValueError(f"n_stripes must be >= 1, got {n_stripes}")
        self._counters = [0] * n_stripes
        self._in_flight = [0] * n_stripes
        self._lock = threading.Lock()

    def _stripe(self, shard_key: str) -> int:
        return zlib.crc32(shard_key.encode("utf-8")) % len(self._counters)

    def ticket(self, shard_key: str) -> int:
        """The shard's current epoch; take it before reading the shard's index."""
        with self._lock:
            return self._counters[self._stripe(shard_key)]

    def bump(self, shard_key: str) -> None:
        """Record that this process stored (or deleted) the shard: older tickets are refused."""
        with self._lock:
            self._counters[self._stripe(shard_key)] += 1

    def begin(self, shard_keys: Iterable[str]) -> None:
        """A write of the shards starts: older tickets are refused, and no index of theirs is cached until :meth:`end`."""
        with self._lock:
            for shard_key in shard_keys:
                stripe = self._stripe(shard_key)
                self._counters[stripe] += 1
                self._in_flight[stripe] += 1

    def end(self, shard_keys: Iterable[str]) -> None:
        """The write :meth:`begin` announced is over (stored, or failed): tickets taken during it are refused."""
        with self._lock:
            for shard_key in shard_keys:
                stripe = self._stripe(shard_key)
                self._counters[stripe] += 1
                self._in_flight[stripe] = max(0, self._in_flight[stripe] - 1)

    def changed_since(self, shard_key: str, ticket: int) -> bool:
        """True when a write of the shard's stripe began or ended since ``ticket`` was taken."""
        with self._lock:
            return self._counters[self._stripe(shard_key)] != ticket

    def is_current(self, shard_key: str, ticket: int) -> bool:
        """True when no write of the shard's stripe happened since ``ticket`` was taken, and none is in flight."""
        with self._lock:
            stripe = self._stripe(shard_key)
            return self._counters[stripe] == ticket and not self._in_flight[stripe]

    def put_if_current(self, cache: Any, shard_key: str, ticket: int, index: Any, validator: Hashable = None) -> bool:
        """``cache.put(shard_key, index, validator)`` only if ``ticket`` is current; True when cached.

        The check and the ``put`` happen under one lock, so a ``bump`` cannot
        slip in between (writers bump before they put their own index).
        """
        with self._lock:
            stripe = self._stripe(shard_key)
            if self._counters[stripe] != ticket or self._in_flight[stripe]:
                return False
            cache.put(shard_key, index, validator)
            return True
