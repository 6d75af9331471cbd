"""Shard I/O: reading indexes and inner chunks from shards, and writing shards, over a backend.

:class:`ShardIO` is the one shard engine of shardkv: the v2/v3 proxy
(:class:`shardkv.ShardedStore`) and the 2022 draft sharding storage
transformer (:class:`shardkv.transformers.ShardingStorageTransformer`) both
call it. It knows nothing of keys above them: it works on
:class:`~shardkv.keys.space.ChunkRef` (which shard, where in it) and on
updates grouped by shard, over a :class:`~shardkv.engine.backend.ShardBackend`.
Request plan:

* read, backend with ranged reads: one batched read of the indexes not in
  the :class:`~shardkv.engine.cache.IndexCache` (prefix or suffix ranges;
  keys the caller relays ride along), then one batched read of chunk ranges,
  merged per shard by a :class:`~shardkv.format.ranges.ReadPolicy` (or the
  whole shard when most is wanted). Shards whose index is not cached, whose
  size is not free (object stores) and of which the batch wants most chunks
  are read whole in the first batch instead, index included: one request per
  shard (:mod:`shardkv.engine.whole_reads`). Where a shard's size is not free and its
  index is at the end, each range also asks for the ``index_nbytes`` bytes
  after it: at least the index follows every chunk, so fewer bytes mean a
  truncated shard or an entry pointing into the index (never served as data);
* read, backend without ranged reads: one batched read of whole shards;
* write: one batched read of the shards a call covers only in part (none for
  shards whose every available chunk is set whole), then one batched write;
  shards merge by :mod:`shardkv.engine.merge` (chunks outside the chunk grid
  are dropped). With the ``append``/``inplace`` strategies on a backend with
  positional writes, partly covered shards get positional writes instead
  (:mod:`shardkv.engine.strategies`);
* erase with the index updated in place (:meth:`ShardIO.erase_chunks`, the
  draft's plan): shards losing every available chunk are deleted without a
  read; the others get one index read (unless cached) and one positional
  write of the new index.

Concurrent writers (issue 9): every shard read-modify-write holds the
shard's lock of the base store's *location*
(:class:`~shardkv.engine.locks.ShardLocks`, chosen by
:func:`~shardkv.engine.concurrency.plan_concurrency`): in-process stripes
shared by every ``ShardIO`` of that location, plus lock files for a
directory. On S3 (``"conditional"``) the write also runs as a compare-and-swap
transaction (:func:`~shardkv.engine.cas.run_conditionally`): a shard changed
by another process since it was read is re-read, re-merged and written again.
Readers never cache an index older than one this object wrote
(:class:`~shardkv.engine.epochs.WriteEpochs`), and a chunk read whose shard
changed or vanished between the index read and the chunk read is read
again, index first, so a chunk read returns the value of some completed
write, never a mix of an old index and new bytes, and an acknowledged chunk
is never returned as missing. The change is seen by the backend's validator
(local files: inode, mtime, size; ``memory://``: the stored object), by the
ranged read finding nothing, or, on object stores that other processes
write (S3, obstore: a ``remote`` conditional store, whatever the
``concurrency=`` mode), by generations: indexes are read and cached with
their ETag and chunk ranges are read with ``If-Match``, a ``412`` meaning
"changed" (:mod:`shardkv.engine.generation_reads`; the same request counts).
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Mapping, Sequence

from shardkv.engine.backend import ShardBackend
from shardkv.engine.cache import IndexCache
from shardkv.engine.cas import GenerationTrackingAdapter
from shardkv.engine.concurrency import Concurrency, plan_concurrency
from shardkv.engine.epochs import WriteEpochs
from shardkv.engine.generation_reads import PinnedReads, pinned_store_for
from shardkv.engine.merge import covers_shard
from shardkv.engine.retry import Backoff, RetryStats
from shardkv.engine.shard_writes import ShardErasures, ShardUpdates, ShardWrites
from shardkv.engine.strategies import WriteStrategy
from shardkv.engine.whole_reads import shards_to_read_whole
from shardkv.errors import ConcurrentUpdateError, ConfigurationError, CorruptShardError
from shardkv.format.index import ShardIndex
from shardkv.format.ranges import ByteRange, CoalescedRead, ReadPolicy, plan_reads
from shardkv.keys.space import ChunkRef, ShardedArray
from shardkv.storage.base import MISSING
from shardkv.storage.conditional import InProcessConditional

__all__ = ["ShardIO", "ShardUpdates", "ShardErasures", "covers_shard"]

_BATCH = 4096  # shards whose indexes are read in one request while listing
_READ_ATTEMPTS = 8  # reads of one request whose shards keep changing under it, at most
_READ_BACKOFF = Backoff(0.001, 2.0, 0.05)  # waits between them (seconds; 0.2 s in all at most)


class ShardIO(ShardWrites):
    """Batched shard reads and writes over one backend.

    Parameters
    ----------
    base : ShardBackend
        The store below (a :class:`~shardkv.storage.adapters.StoreAdapter`,
        or the backend of a transformer's underlying store).
    index_cache_bytes : int
        Limit (bytes) of the decoded-index cache; 0 disables it.
    validate_index_cache : bool
        Check cached indexes against the backend's cheap validator first.
    read_policy : ReadPolicy
        Merging of chunk ranges and the whole-shard threshold.
    write_strategy : {"rewrite", "append", "inplace"}
        How partly covered shards are updated (append/inplace only where the
        backend supports positional writes).
    slack_bytes : int
        Zero bytes after each chunk written with ``"inplace"`` (bytes).
    concurrency : {"auto", "files", "conditional", "process", "none"}
        How writers of one shard in other objects, threads and processes are
        excluded (:mod:`shardkv.engine.concurrency`).
    lock_timeout : float or None
        Longest wait (seconds) for a shard lock; ``None`` waits as long as it takes.

    Attributes
    ----------
    plan : ConcurrencyPlan
        The resolved concurrency mode and its locks.
    retry_stats : RetryStats
        Compare-and-swap attempts and lost races (``precondition_failures``:
        the 412 answers of S3) of this object's shard writes.
    read_stats : RetryStats
        Chunk reads on object stores (:mod:`shardkv.engine.generation_reads`):
        ``attempts`` (index-then-chunk rounds) and ``precondition_failures``
        (chunk ranges refused because their shard changed since its index was
        read; the read was then made again).

    Raises
    ------
    ConfigurationError
        For an unknown strategy or a negative slack; for a concurrency mode the
        store cannot give (``"auto"`` where it offers neither lock files nor
        conditional writes).
    """

    def __init__(
        self,
        base: ShardBackend,
        *,
        index_cache_bytes: int,
        validate_index_cache: bool,
        read_policy: ReadPolicy,
        write_strategy: WriteStrategy,
        slack_bytes: int,
        concurrency: Concurrency = "auto",
        lock_timeout: float | None = None,
    ) -> None:
        if write_strategy not in ("rewrite", "append", "inplace"):
            raise ConfigurationError(f"write_strategy must be 'rewrite', 'append' or 'inplace', got {write_strategy!r}")
        if slack_bytes < 0:
            raise ConfigurationError(f"slack_bytes must be >= 0, got {slack_bytes}")
        self.base = base
        self.index_cache = IndexCache(index_cache_bytes)
        self.validate_index_cache = bool(validate_index_cache)
        self.read_policy = read_policy
        self.write_strategy = write_strategy
        self.slack_bytes = int(slack_bytes)
        self.concurrency = concurrency
        self.lock_timeout = lock_timeout
        self.plan = plan_concurrency(base, concurrency, timeout=lock_timeout)
        self.epochs = WriteEpochs()
        self.retry_stats = RetryStats()
        self.read_stats = RetryStats()
        # chunk reads pinned to their index's generation wherever other processes can change the
        # shards (object stores), whatever the writers' concurrency mode
        self._pinned_store = pinned_store_for(base)
        # compare-and-swap where other processes can reach the data (S3); the in-process
        # emulation (memory://, mappings) adds nothing to the stripe locks every writer holds
        cas = self.plan.conditional is not None and not isinstance(self.plan.conditional, InProcessConditional)
        self._rw: GenerationTrackingAdapter | None = GenerationTrackingAdapter(base, self.plan.conditional) if cas else None  # type: ignore[arg-type]

    # -- reads ------------------------------------------------------------------

    def read_indexes(
        self, shards: Mapping[str, ShardedArray], *, fresh: bool = False
    ) -> tuple[dict[str, ShardIndex], dict[str, bytes]]:
        """Indexes of the stored shards among ``shards`` (at most one batched request).

        Returns the indexes and, for a backend without ranged reads, the
        whole shards that were read to get them.

        Parameters
        ----------
        shards : mapping of shard key to ShardedArray
            The shards and their arrays.
        fresh : bool
            Read every index from the store (not from the cache): what a
            writer holding the shards' locks must do, since other processes
            may have changed them.

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged index.
        """
        indexes, blobs, _ = self._read_indexes(shards, (), fresh=fresh, pinned=self._pinned_reads())
        return indexes, blobs

    def _pinned_reads(self) -> PinnedReads | None:
        """The bookkeeping of one read attempt pinned to generations, where the store needs it."""
        return None if self._pinned_store is None else PinnedReads(self._pinned_store)

    def _read_indexes(
        self,
        shards: Mapping[str, ShardedArray],
        relayed: Sequence[tuple[str, ByteRange]],
        *,
        fresh: bool = False,
        whole: frozenset[str] = frozenset(),
        pinned: PinnedReads | None = None,
        contended: frozenset[str] = frozenset(),
        known: Mapping[str, Any] | None = None,
        wanted: Mapping[str, set[tuple[int, ...]]] | None = None,
    ) -> tuple[dict[str, ShardIndex], dict[str, bytes], list[bytes | None]]:
        """:meth:`read_indexes`, with ``relayed`` ranges of other keys read in the same batch.

        The shards in ``whole`` whose index is not cached and whose size is
        not free are read whole instead (their index from the object, checked
        against its size) and returned among the blobs. With ``pinned``, the
        indexes are read (or taken from the cache) with their generations,
        and cached with them; ``relayed`` ranges are then read apart. The
        ``contended`` shards not cached are read whole whatever their size.
        ``known`` validators (taken by the caller, so free here) are checked
        against every cached index whatever ``validate_index_cache`` says: an
        index another process made stale is never used to read chunk bytes.
        With ``pinned``, a cached index is used only if it holds every chunk
        ``wanted`` of its shard: a chunk read pinned to the index's generation
        proves the index current, an absent entry proves nothing (a chunk
        another process wrote since would read as missing, and zarr would
        patch fill values over it), so such a shard's index is read again.
        """
        keys = list(shards)
        if not self.base.supports_ranges:
            blobs = self.base.get_many(keys) if keys else {}
            extra = self.base.get_ranges(relayed) if relayed else []
            return {k: shards[k].layout.index_of_shard(b, k) for k, b in blobs.items()}, blobs, extra
        indexes: dict[str, ShardIndex] = {}
        validators: dict[str, Any] = {}
        tickets: dict[str, int] = {}
        missing: list[str] = []
        blobs: dict[str, bytes] = {}
        for k in keys:
            if known is not None and known.get(k) is not None:
                validator = known[k]
            else:
                validator = self.base.validator(k) if self.validate_index_cache else None
            ticket = self.epochs.ticket(k)  # before the read: a write after it refuses our put
            if fresh or not self.epochs.is_current(k, ticket):
                cached = None
            elif pinned is not None:
                cached = pinned.cached(self.index_cache, k)
                if cached is not None and any(cached.get(c) is None for c in (wanted or {}).get(k, ())):
                    cached = None  # an absent chunk is not proven by a pinned read: read the index again
            else:
                cached = self.index_cache.get(k, validator)
            if cached is None:
                missing.append(k)
                validators[k] = validator
                tickets[k] = ticket
            else:
                indexes[k] = cached
        if not missing and not relayed:
            return indexes, {}, []
        sizes = {k: self.base.size_if_free(k) for k in missing}
        taken_whole = {k for k in missing if (k in whole and sizes[k] is None) or k in contended}
        ranges = [(k, ByteRange(0) if k in taken_whole else shards[k].layout.index_range()) for k in missing]
        if pinned is None:
            raw = self.base.get_ranges(ranges + list(relayed))
        else:  # relayed keys are not shards: no generation to pin
            raw = pinned.read_indexes(ranges) + (self.base.get_ranges(relayed) if relayed else [])
            validators = pinned.generations
        for k, data in zip(missing, raw):
            if data is None:
                continue
            if k in taken_whole:  # one request: index and chunks of one object
                index = indexes[k] = shards[k].layout.index_of_shard(data, k)
                blobs[k] = data
            else:
                # checked against the shard's size where that is free: a suffix read
                # alone cannot tell a truncated shard from an intact one
                index = indexes[k] = shards[k].layout.decode_index(data, k, sizes[k])
            # a validator taken while the shard was not stored yet would match again once it is deleted
            if validators[k] != MISSING:
                self.epochs.put_if_current(self.index_cache, k, tickets[k], index, validators[k])
        return indexes, blobs, list(raw[len(missing) :])

    def read_chunks(self, refs: Sequence[ChunkRef]) -> dict[str, bytes]:
        """Encoded bytes of the stored chunks among ``refs``, by chunk key (missing ones left out).

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged shard (an index entry past the shard's end included).
        ConcurrentUpdateError
            If the shards kept changing between index and chunk reads.
        """
        values = self.read_ranges([(ref, ByteRange(0)) for ref in refs])
        return {ref.chunk_key: v for ref, v in zip(refs, values) if v is not None}

    def read_ranges(
        self, requests: Sequence[tuple[ChunkRef, ByteRange]], relayed: Sequence[tuple[str, ByteRange]] = ()
    ) -> list[bytes | None]:
        """Byte ranges inside chunks, and ranges of other keys read along (two batched requests at most).

        Parameters
        ----------
        requests : sequence of (ChunkRef, ByteRange)
            A chunk and a range *inside its bytes* (clipped to the chunk; a
            suffix range counts from the chunk's end).
        relayed : sequence of (str, ByteRange)
            Ranges of keys that are not chunks, read in the same batch as the
            indexes (the draft transformer's relayed keys).

        Returns
        -------
        list of bytes or None
            The values of ``requests`` then of ``relayed``, in order; ``None``
            where a chunk or key is not stored.

        Raises
        ------
        CorruptShardError, ChecksumError
            For a damaged shard (an index entry past the shard's data included).
        ConcurrentUpdateError
            If a shard changed between its index read and its chunk read in
            every one of 8 attempts (a writer rewriting it without pause).

        Notes
        -----
        A shard that another writer replaced between the index read and the
        chunk read (its validator changed: local files, where a rewrite is a
        new inode; its generation changed: object stores, where the chunk
        read is conditional, :mod:`shardkv.engine.generation_reads`) or
        deleted (the ranged read found nothing) is read again, index first,
        so neither a torn mix nor a missing chunk is returned. On object
        stores a shard refused twice is then read whole (one request, index
        and chunks of one generation), so a reader makes progress even
        against a writer rewriting the shard without pause.
        """
        shards = {ref.shard_key: ref.array for ref, _ in requests}
        changed: set[str] = set()
        contended: set[str] = set()  # pinned reads refused twice: read whole next (one self-consistent GET)
        for attempt in range(1, _READ_ATTEMPTS + 1):
            tickets = {k: self.epochs.ticket(k) for k in shards}  # writes of this object in between show here
            before = {k: self.base.validator(k) for k in shards} if self.base.supports_ranges else {}
            pinned = self._pinned_reads()
            try:
                out, extra, changed = self._read_ranges_once(
                    requests, relayed, shards, pinned, frozenset(contended), before
                )
                damage = None
            except CorruptShardError as exc:  # damaged, or torn by a rewrite: the validators tell
                out, extra, changed, damage = [], [], set(), exc
            finally:
                if pinned is not None:
                    self.read_stats.attempts += 1
                    self.read_stats.precondition_failures += pinned.refused
            changed |= {k for k, v in before.items() if v is not None and self.base.validator(k) != v}
            # without a validator, a write of this object in between is what can be seen (pinned
            # reads need no such check: their bytes are those of their index's generation)
            if pinned is None:
                changed |= {k for k, t in tickets.items() if before.get(k) is None and self.epochs.changed_since(k, t)}
            elif attempt > 1:
                contended |= changed
            if damage is not None and not changed:
                raise damage
            if not changed:
                return out + extra
            for shard_key in changed:
                self.index_cache.discard(shard_key)
            time.sleep(_READ_BACKOFF.delay(attempt))
        raise ConcurrentUpdateError(sorted(changed)[0], _READ_ATTEMPTS, _READ_ATTEMPTS)

    def _read_ranges_once(
        self,
        requests: Sequence[tuple[ChunkRef, ByteRange]],
        relayed: Sequence[tuple[str, ByteRange]],
        shards: Mapping[str, ShardedArray],
        pinned: PinnedReads | None = None,
        contended: frozenset[str] = frozenset(),
        known: Mapping[str, Any] | None = None,
    ) -> tuple[list[bytes | None], list[bytes | None], set[str]]:
        """One index read and one chunk read; the shards whose chunk ranges had vanished (or changed) are returned.

        ``known``: the shards' validators, taken just before (a cached index is
        used only if it was cached with the same validator).

        The ``contended`` shards (pinned reads refused again and again: a
        writer rewriting them without pause) are read whole, index included.
        """
        remote = self.base.supports_ranges and getattr(self.base, "round_trips", False)
        whole = shards_to_read_whole(requests, self.read_policy) if remote else frozenset()
        wanted_chunks: dict[str, set[tuple[int, ...]]] = {}
        if pinned is not None:
            for ref, _ in requests:
                wanted_chunks.setdefault(ref.shard_key, set()).add(ref.local_coords)
        indexes, blobs, extra = self._read_indexes(
            shards, relayed, whole=whole, pinned=pinned, contended=contended, known=known, wanted=wanted_chunks
        )
        out: list[bytes | None] = [None] * len(requests)
        wanted: list[tuple[int, ChunkRef, int, int]] = []  # (position, ref, start, stop) in the shard
        for i, (ref, byte_range) in enumerate(requests):
            index = indexes.get(ref.shard_key)
            entry = None if index is None else index.get(ref.local_coords)
            if entry is None:
                continue
            start, stop = byte_range.resolve(entry[1])
            if start == stop:
                out[i] = b""
            elif ref.shard_key in blobs:  # whole shards, their indexes checked against their sizes
                blob = memoryview(blobs[ref.shard_key])
                part = blob[entry[0] + start : entry[0] + stop]
                out[i] = part if blob.readonly else bytes(part)  # a view (no copy) unless the blob is mutable
            else:
                wanted.append((i, ref, entry[0] + start, entry[0] + stop))
        vanished = self._read_wanted(wanted, indexes, out, pinned) if wanted else set()
        return out, extra, vanished

    def _read_wanted(
        self,
        wanted: list[tuple[int, ChunkRef, int, int]],
        indexes: Mapping[str, ShardIndex],
        out: list[Any],
        pinned: PinnedReads | None = None,
    ) -> set[str]:
        """One batched read of the wanted shard ranges, merged per shard by the read policy; the vanished shards.

        With ``pinned``, each range is read only if its shard's generation is
        still that of its index; a changed shard counts as vanished.
        """
        by_shard: dict[str, list[tuple[int, ChunkRef, int, int]]] = {}
        for item in wanted:
            by_shard.setdefault(item[1].shard_key, []).append(item)
        requests: list[tuple[str, ByteRange]] = []
        plans: list[tuple[list[tuple[int, ChunkRef, int, int]], CoalescedRead, int]] = []
        for shard_key, items in by_shard.items():
            layout = items[0][1].array.layout
            guard = 0
            if layout.index_location == "end" and self.base.size_if_free(shard_key) is None:
                guard = layout.index_nbytes
            ranges = [ByteRange(a, b) for _, _, a, b in items]
            for read in plan_reads(ranges, indexes[shard_key].used_nbytes(), self.read_policy):
                r = read.range
                requests.append((shard_key, r if r.stop is None else ByteRange(r.start, r.stop + guard)))
                plans.append((items, read, guard))
        vanished: set[str] = set()
        values = self.base.get_ranges(requests) if pinned is None else pinned.read_ranges(requests)
        for (items, read, guard), value in zip(plans, values):
            if value is None:  # deleted, being replaced, or (pinned) changed since the index read: read again
                vanished.add(items[0][1].shard_key)
                continue
            layout = items[0][1].array.layout
            limit = read.range.start + len(value)  # the end of the chunk data the read proves
            if read.range.stop is None and layout.index_location == "end":
                limit -= layout.index_nbytes
            else:
                limit -= guard
            view = memoryview(value)
            for member, rel, nbytes in read.members:
                i, ref, start, stop = items[member]
                if stop > limit:
                    raise CorruptShardError(
                        ref.shard_key,
                        f"index entry {ref.local_coords} of chunk {ref.chunk_key!r} points at bytes "
                        f"[{start}, {stop}) but the chunk data ends at byte {limit}: the shard ends "
                        f"{stop - limit} bytes too early (truncated shard, or an entry pointing into the index)",
                    )
                part = view[rel : rel + nbytes]
                out[i] = part if view.readonly else bytes(part)  # a view (no copy) unless the value is mutable
        return vanished

    def chunk_keys(self, shards: Mapping[str, ShardedArray], *, in_grid_only: bool = True) -> Iterator[str]:
        """Keys of the chunks stored in ``shards`` (indexes read 4096 shards per request).

        Parameters
        ----------
        shards : mapping of shard key to ShardedArray
            Stored shard keys and their arrays.
        in_grid_only : bool
            Leave out chunks outside the chunk grid (when it is known).
        """
        keys = list(shards)
        for start in range(0, len(keys), _BATCH):
            batch = {k: shards[k] for k in keys[start : start + _BATCH]}
            indexes, _ = self.read_indexes(batch)
            for shard_key, index in indexes.items():
                arr = batch[shard_key]
                shard_coords = arr.shard_coords_of(shard_key)
                for local in index.present():
                    chunk = arr.chunk_coords(shard_coords, local)  # type: ignore[arg-type]
                    if not in_grid_only or arr.in_grid(chunk):
                        yield arr.chunk_key(chunk)
