"""The one retry and wait loop of the engine (:func:`attempts`), its backoffs and the engine's counters.

Reads, writes and lock waits go round :func:`attempts`: bounded in count or by a deadline, waits growing
exponentially up to a cap, with full jitter so writers that collided spread out.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

READ_ATTEMPTS = 8  # rounds of one chunk read whose shards keep changing under it, at most
WRITE_ATTEMPTS = 16  # rounds of one conditional shard write that keeps losing its race, at most


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts: a uniformly random part of ``initial * factor**n`` seconds, at most ``maximum``."""

    initial: float = 0.005
    factor: float = 2.0
    maximum: float = 0.5

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first)."""
        return random.uniform(0.0, min(self.maximum, self.initial * self.factor ** max(0, attempt - 1)))


READ_BACKOFF = Backoff(0.001, 2.0, 0.05)  # between read rounds (0.2 s in all at most)
WRITE_BACKOFF = Backoff()  # between write rounds
LOCK_BACKOFF = Backoff(0.001, 2.0, 0.05)  # between tries of a lock file another writer holds


def attempts(limit: int | None, backoff: Backoff, deadline: float | None = None, made: int = 0) -> Iterator[int]:
    """The one retry loop: attempt numbers from ``made + 1``, waiting ``backoff.delay(n)`` before attempt ``n + 1``.

    ``limit`` counts attempts at most (those ``made`` before entering included; ``None``: as many as
    ``deadline``, a ``time.monotonic()``, allows: no attempt starts and no wait runs past it). A caller enters
    the loop only once its first attempt failed (``made=1``), breaks out on success, and sees the generator
    end when every attempt failed.
    """
    attempt = made
    while True:
        if attempt:
            if limit is not None and attempt >= limit:
                return
            delay = backoff.delay(attempt)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                delay = min(delay, left)
            time.sleep(delay)
        attempt += 1
        yield attempt


@dataclass
class EngineStats:
    """Counters of one :class:`~shardkv.engine.engine.ShardEngine` (a public probe for tests and users).

    Attributes
    ----------
    read_attempts, write_attempts : int
        Rounds of chunk reads and of shard writes (one per call, more after changes under it or lost races).
    read_stale : int
        Chunk reads refused because their shard changed since its index was cached.
    whole_shard_reads : int
        Shards read whole (index and chunks in one request).
    write_lost : int
        Conditional shard puts refused because another writer changed the shard.
    writes_queued : int
        Shard changes that went into the next commit of a shard whose commit was running (group commit).
    tail_updates : int
        Stored shards updated by writing only their changed chunks and a new index (O(chunk)).
    """

    read_attempts: int = 0
    read_stale: int = 0
    whole_shard_reads: int = 0
    write_attempts: int = 0
    write_lost: int = 0
    writes_queued: int = 0
    tail_updates: int = 0
