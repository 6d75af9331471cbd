"""``Options``: every runtime option of shardkv's facades, validated once, picklable as it is.

The engine and write-back read their fields unchecked. ``storage_options`` travels inside the opened base
store and ``journal`` names a file of one process, so neither is here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, TypedDict, Unpack, get_args

from shardkv.engine.locks import DEFAULT_LOCK_TIMEOUT, Concurrency
from shardkv.errors import ConfigurationError
from shardkv.format.layout import IndexLocation
from shardkv.format.ranges import ReadPolicy
from shardkv.metadata.chunks_per_shard import ChunksPerShardOption, ChunksPerShardRule

DEFAULT_INDEX_CACHE_BYTES = 64 * 2**20

ShardUpdates = Literal["auto", "append", "rewrite"]  # how an update of a few chunks of a stored shard is written
DEFAULT_MAX_DEAD_FRACTION = 0.5


class OptionKeywords(TypedDict, total=False):
    """The options as keywords of a facade (each as in :class:`Options`; ``read_policy=None``: the default)."""

    index_location: IndexLocation
    index_checksum: bool
    index_cache_bytes: int
    read_policy: ReadPolicy | None
    buffer_bytes: int | None
    concurrency: Concurrency
    lock_timeout: float | None
    shard_updates: ShardUpdates
    max_dead_fraction: float


def _nonnegative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} must be an int >= 0 (bytes), got {value!r}")


def _one_of(name: str, value: Any, choices: Any) -> None:
    if value not in get_args(choices):
        raise ConfigurationError(f"{name} must be one of {list(get_args(choices))}, got {value!r}")


@dataclass(frozen=True)
class Options:
    """The runtime options of a sharding facade (the one place they are checked).

    Parameters
    ----------
    chunks_per_shard : ChunksPerShardRule
        Which arrays created through the facade are sharded, and how.
    index_location : {"end", "start"}
        Where new shards keep their index (v1.0 ``sharding_indexed`` codec).
    index_checksum : bool
        Whether new shards protect their index with a CRC32C.
    index_cache_bytes : int
        Limit (bytes) of the cache of decoded shard indexes (default 64 MiB;
        0 disables it). With the index cached, reading a chunk costs one
        request. The facade keeps the cache right across its own writes, and
        chunk reads check entries against other writers' changes where the
        store allows.
    read_policy : ReadPolicy
        How nearby chunk ranges of one shard merge into one request and when
        the whole shard is read instead (default ``ReadPolicy()``: gaps up to
        64 KiB, requests up to 16 MiB, whole shard from half its bytes).
    buffer_bytes : int or None
        Write-back mode: hold chunk writes per shard, up to this many bytes of
        chunk data, and write each shard once: when all its in-grid chunks
        are buffered, on ``flush()``, ``close()`` or leaving a ``with``
        block, or when the limit forces the oldest shard out (then merged
        with what is stored). ``None`` (default) writes within each call.
        Buffered writes are visible to reads through the facade at once, and
        reach the base store only when written: call ``flush()`` (or use
        ``with``) before other readers look. A shard whose write fails stays
        buffered (the error propagates; the next ``flush()`` writes it).
        Write-back data belongs to the process that buffered it: a pickled
        copy of the store (a dask.distributed or ``multiprocessing``
        worker's) writes through, so no worker holds acknowledged writes that
        no one flushes; pickling a store that holds unflushed writes raises
        ``UnflushedWritesError``. For parallel writes that fill whole shards,
        see :func:`shardkv.rechunk_to_shards`.
    concurrency : {"auto", "files", "conditional", "process", "none"}
        How writers of one shard (threads, stores, processes) keep each
        other's chunks. ``"auto"``: lock files in each array's
        ``.shardkv-locks/`` on local and network file systems;
        compare-and-swap writes (ETag ``If-Match``, retried on 412) on S3
        (s3fs or obstore) and obstore's GCS, Azure and memory stores; locks
        shared in this process for ``memory://`` and in-memory mappings;
        ``ConfigurationError`` for other stores, which need ``"process"``
        (this process only) or ``"none"`` (shard-aligned writers).
    lock_timeout : float or None
        Longest wait (seconds) for a shard lock (then ``LockTimeoutError``,
        naming the shard, the lock file and what to do). Default 300 (five
        minutes): a live writer holds a shard's lock for one read-modify-write
        of that shard, seconds even for a shard of a GiB on a slow network
        file system, and an NFSv4 server frees the locks of a client that
        died once its lease lapses (90 s by default); a lock held past five
        minutes is held by a process that hangs, is stopped, or was forked
        while a thread held it, and waiting longer would only hide that.
        Readers that meet a torn index wait for the same lock, as long.
        ``None`` waits as long as it takes.
    shard_updates : {"auto", "append", "rewrite"}
        How an update of some chunks of a stored shard is written.
        ``"auto"`` (default): where the shard's file system clones files
        (reflinks: XFS with ``reflink=1``, btrfs, bcachefs, OCFS2), a clone of
        the shard plus the new chunks and a new index, renamed over the shard:
        about the bytes of the new chunks are written, and every old chunk
        keeps its offset, so readers (with or without shardkv) read old or new
        values. On S3 through s3fs, a multipart upload copying the kept bytes
        on the server, with the new chunks and index as its last part,
        completed with ``If-Match`` (shards keeping at least 5 MiB, index at
        the end). Elsewhere (ext4, obstore, mappings, memory) the shard is
        rewritten whole (on object stores a whole-shard conditional put). ``"append"``: as ``"auto"``
        where files clone; elsewhere, on local and network directories in
        concurrency mode ``"files"``, the new chunks and a new index are
        appended to the live shard file (shards with the index at the end and
        a CRC32C on it; others are rewritten whole). While such an append is
        in flight, a reader without shardkv (zarr 3, tensorstore) may meet a
        checksum error on that shard's index (never wrong values); shardkv's
        own readers repair and read again. ``"rewrite"``: every update
        rewrites its shard whole.
    max_dead_fraction : float
        Largest fraction of a shard file's bytes that replaced chunks and old
        indexes may take (``0 < x <= 1``, default 0.5): an update that would
        leave more rewrites the shard whole (compacted). At 0.5 a shard file
        stays within twice the bytes it uses, and the bytes written per
        update stay within twice the new bytes when amortised over the
        updates between two rewrites.

    Raises
    ------
    ConfigurationError
        If a value is invalid (checked once, here).
    """

    chunks_per_shard: ChunksPerShardRule = field(default_factory=lambda: ChunksPerShardRule.parse(None))
    index_location: IndexLocation = "end"
    index_checksum: bool = True
    index_cache_bytes: int = DEFAULT_INDEX_CACHE_BYTES
    read_policy: ReadPolicy = field(default_factory=ReadPolicy)
    buffer_bytes: int | None = None
    concurrency: Concurrency = "auto"
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT
    shard_updates: ShardUpdates = "auto"
    max_dead_fraction: float = DEFAULT_MAX_DEAD_FRACTION

    def __post_init__(self) -> None:
        if not isinstance(self.chunks_per_shard, ChunksPerShardRule):
            raise ConfigurationError(
                f"chunks_per_shard must be a ChunksPerShardRule here, got {self.chunks_per_shard!r}"
            )
        if self.index_location not in get_args(IndexLocation):
            raise ConfigurationError(f"index_location must be 'start' or 'end', got {self.index_location!r}")
        if not isinstance(self.index_checksum, bool):  # bool() would take any string for True
            raise ConfigurationError(f"index_checksum must be True or False, got {self.index_checksum!r}")
        _nonnegative_int("index_cache_bytes", self.index_cache_bytes)
        if not isinstance(self.read_policy, ReadPolicy):
            raise ConfigurationError(f"read_policy must be a ReadPolicy, got {self.read_policy!r}")
        if self.buffer_bytes is not None:
            _nonnegative_int("buffer_bytes", self.buffer_bytes)
        _one_of("concurrency", self.concurrency, Concurrency)
        if self.lock_timeout is not None:
            timeout = self.lock_timeout
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout < 0:
                raise ConfigurationError(f"lock_timeout must be None or a number of seconds >= 0, got {timeout!r}")
        _one_of("shard_updates", self.shard_updates, ShardUpdates)
        dead = self.max_dead_fraction
        if isinstance(dead, bool) or not isinstance(dead, (int, float)) or not 0 < dead <= 1:
            raise ConfigurationError(f"max_dead_fraction must be a number with 0 < x <= 1, got {dead!r}")

    @classmethod
    def from_keywords(
        cls, chunks_per_shard: ChunksPerShardOption = None, **keywords: Unpack[OptionKeywords]
    ) -> Options:
        """The options from the keywords users give a facade (``chunks_per_shard`` as users write it).

        Raises
        ------
        ConfigurationError
            If a value is invalid.
        TypeError
            For a keyword that names no option.
        """
        unknown = sorted(set(keywords) - set(OptionKeywords.__annotations__))
        if unknown:
            raise TypeError(f"unexpected option {unknown[0]!r}; the options are {[f.name for f in fields(cls)]}")
        given: dict[str, Any] = dict(keywords)
        if given.get("read_policy", 0) is None:
            del given["read_policy"]
        return cls(ChunksPerShardRule.parse(chunks_per_shard), **given)

    @classmethod
    def of(cls, options: Options | None, chunks_per_shard: ChunksPerShardOption, keywords: OptionKeywords) -> Options:
        """A facade's options: ``options=`` as given, or else built from its keywords (not both).

        Raises
        ------
        ConfigurationError
            If a value is invalid, or ``options`` comes with ``chunks_per_shard`` or option keywords.
        TypeError
            For a keyword that names no option.
        """
        if options is None:
            return cls.from_keywords(chunks_per_shard, **keywords)
        if not isinstance(options, Options):
            raise ConfigurationError(f"options must be an Options, got {options!r}")
        if chunks_per_shard is not None or keywords:
            given = sorted(keywords) + (["chunks_per_shard"] if chunks_per_shard is not None else [])
            raise ConfigurationError(f"options= comes with all the options; got {given} beside it")
        return options

    def for_copy(self) -> Options:
        """The options of a pickled copy: the same, except that the copy writes through (no write-back)."""
        return self if self.buffer_bytes is None else replace(self, buffer_bytes=None)
