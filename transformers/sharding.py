"""The 2022 draft sharding storage transformer (``indexed`` binary shard format).

One :class:`ShardingStorageTransformer` per array: keys under its data prefix ``data/root/<path>/`` are chunk
keys, stored by shard (chunk coords floor-divided by ``chunks_per_shard``, same separator: chunk ``c96/18``
with ``chunks_per_shard=[32, 2]`` lives in shard ``c3/9``); other keys are relayed unchanged. Shards go
through the shard engine over the base store's own ``KVStore`` (``AdapterStore.kv``). A shard's "available"
chunks are those inside the chunk grid when the array shape is known, else all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from shardkv._types import BytesLike, LocalCoords
from shardkv.engine.engine import ShardEngine
from shardkv.engine.locks import Concurrency
from shardkv.engine.merge import ChunkPatch, ShardChange
from shardkv.engine.options import DEFAULT_INDEX_CACHE_BYTES, DEFAULT_LOCK_TIMEOUT, Options
from shardkv.errors import ConfigurationError, UnsupportedError
from shardkv.format.layout import ShardLayout, chunk_nbytes_bound
from shardkv.format.ranges import ReadPolicy
from shardkv.keys.listing import expand_shard_prefix, shard_prefix, split_prefix
from shardkv.keys.space import ChunkRef, Draft2022ChunkKeyEncoding, Separator, ShardedArray

from .adapter import AdapterStore
from .api import AbstractStore, KeyRange, KeyStartValue, normalize_prefix

SHARDING_EXTENSION = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
"""The ``extension`` of the sharding transformer's metadata entry."""
DATA_ROOT = "data/root/"
"""Keys starting with this are data keys (v3 core draft "Storage keys")."""


def _draft_itemsize(data_type: Any) -> int | None:
    """Bytes per element of a 2022 draft ``data_type`` (``"<f8"``, ``"bool"``, ``"r16"``), or ``None``."""
    if not isinstance(data_type, str):
        return None
    if data_type.startswith("r") and data_type[1:].isdigit() and int(data_type[1:]) % 8 == 0:
        return int(data_type[1:]) // 8 or None
    try:
        return np.dtype(data_type).itemsize or None
    except TypeError:
        return None


def _base_store(underlying: Any, array_path: str) -> AdapterStore:
    """The store below a sharding transformer: an ``AdapterStore`` (what it takes is wrapped in one)."""
    if isinstance(underlying, AdapterStore):
        return underlying
    if isinstance(underlying, ShardingStorageTransformer):
        raise UnsupportedError(stacked_refusal(array_path, 2))
    if isinstance(underlying, AbstractStore):
        raise UnsupportedError(
            f"array {array_path!r}: a sharding transformer over {type(underlying).__name__} is not supported: "
            "it caches shard indexes and checks them against the stored shards' generations, and locks shards "
            "by where their data lives, which only the store itself tells; pass the store itself (an AdapterStore, "
            "or a path, URL, fsspec mapper, MutableMapping or KVStore)"
        )
    return AdapterStore(underlying)


def stacked_refusal(array_path: str, n: int, entries: str = "") -> str:
    """Why a stack of ``n`` sharding transformers in one array is refused (the message of its error)."""
    listed = f" ({entries})" if entries else ""
    return (
        f"array {array_path!r}: {n} sharding storage transformers are stacked{listed}; shardkv refuses a stack: "
        "each transformer holds the locks of its own shards while the one below takes the locks of its shards, "
        "so two writers whose shards cross take the same locks in opposite orders and could wait for each "
        "other until the lock timeout; store the array with one sharding transformer"
    )


def storage_transformer_entries(array_metadata: Mapping[str, Any], path: str | None = None) -> list[dict[str, Any]]:
    """The ``storage_transformers`` list of array metadata (``[]`` when absent).

    Raises
    ------
    ConfigurationError
        If the field is present but not a list.
    """
    entries = array_metadata.get("storage_transformers") or []
    if not isinstance(entries, list):
        raise ConfigurationError(f"storage_transformers must be a list, got {entries!r}", path)
    return [dict(e) if isinstance(e, Mapping) else e for e in entries]


def build_stack(
    entries: Sequence[Mapping[str, Any]],
    array_metadata: Mapping[str, Any],
    array_path: str,
    store: AbstractStore,
    **options: Any,
) -> AbstractStore:
    """The array's sharding transformer over ``store`` (``store`` itself for no entries).

    Every entry must be the sharding transformer (``SHARDING_EXTENSION``, type ``"indexed"``): an entry of
    another transformer is refused, never skipped (its stored bytes would be read as the array's chunks), and
    so is a stack of two sharding transformers (:func:`stacked_refusal`).

    Parameters
    ----------
    entries : sequence of mapping
        The array's ``storage_transformers`` entries.
    array_metadata : mapping
        The array's 2022 draft metadata.
    array_path : str
        The array's path in the hierarchy.
    store : AbstractStore
        The store the shards live in.
    **options
        Runtime options of the transformer (:meth:`ShardingStorageTransformer.from_metadata`).

    Raises
    ------
    ConfigurationError
        If an entry is not an object with an ``extension``, or its configuration does not fit the array.
    UnsupportedError
        For an entry of another transformer (naming it), or more than one entry.
    """
    for entry in entries:
        if not isinstance(entry, Mapping) or "extension" not in entry:
            raise ConfigurationError(
                f"a storage_transformers entry is an object with an 'extension', got {entry!r}", array_path
            )
        if (entry["extension"], entry.get("type")) != (SHARDING_EXTENSION, "indexed"):
            raise UnsupportedError(
                f"array {array_path!r}: storage transformer {entry['extension']!r} of type {entry.get('type')!r} "
                f"is not supported, so the array cannot be read or written safely (supported: "
                f"{SHARDING_EXTENSION} (indexed))"
            )
    if len(entries) > 1:
        listed = ", ".join(str((e.get("configuration") or {}).get("chunks_per_shard")) for e in entries)
        raise UnsupportedError(stacked_refusal(array_path, len(entries), f"chunks_per_shard {listed}"))
    if not entries:
        return store
    return ShardingStorageTransformer.from_metadata(entries[0], array_metadata, array_path, store, **options)


class ShardingStorageTransformer(AbstractStore):
    """Sharding of one array's chunk keys over an underlying store (2022 draft).

    Parameters
    ----------
    underlying : AdapterStore or anything it takes
        The store the shards live in: an
        :class:`~shardkv.transformers.adapter.AdapterStore`, or what it takes
        (a path, URL, fsspec mapper, ``MutableMapping`` or ``KVStore``, wrapped
        in one).
    chunks_per_shard : sequence of int
        Chunks per shard along each dimension (each >= 1); its length is the
        array's number of dimensions.
    array_path : str
        The array's path in the hierarchy (``""`` for a root array); its chunk
        keys start with ``data/root/<array_path>/`` (``data/root/`` at the root).
    separator : {"/", "."}
        The array's chunk key separator (``chunk_grid.separator``).
    shape, chunk_shape : sequence of int, optional
        Array shape and chunk shape (elements), from the array metadata; with
        them, shards at the edge of the array count only their in-grid chunks
        as available, and merging a shard drops chunks outside the grid.
    type : {"indexed"}
        The binary shard format.
    index_cache_bytes, read_policy, concurrency, lock_timeout
        As :class:`~shardkv.engine.options.Options` (defaults 64 MiB,
        ``ReadPolicy()``, ``"auto"``, 300 s).
    itemsize : int, optional
        Bytes per element; with ``chunk_shape`` it bounds each index entry's
        ``nbytes`` (:func:`shardkv.format.layout.chunk_nbytes_bound`; else 2 GiB).

    Raises
    ------
    ConfigurationError
        If ``type`` is not ``"indexed"``, a ``chunks_per_shard`` value is < 1,
        ``shape`` / ``chunk_shape`` do not match its length, or a write
        option is invalid.
    UnsupportedError
        If ``underlying`` is another transformer (a stack) or an ``AbstractStore``
        other than an ``AdapterStore`` (no generations to check cached indexes against).
    TypeError
        If ``underlying`` cannot be used as a store.
    """

    extension = SHARDING_EXTENSION

    def __init__(
        self,
        underlying: Any,
        chunks_per_shard: Sequence[int],
        *,
        array_path: str = "",
        separator: Separator = "/",
        shape: Sequence[int] | None = None,
        chunk_shape: Sequence[int] | None = None,
        type: str = "indexed",
        index_cache_bytes: int = DEFAULT_INDEX_CACHE_BYTES,
        read_policy: ReadPolicy | None = None,
        concurrency: Concurrency = "auto",
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
        itemsize: int | None = None,
    ) -> None:
        if type != "indexed":
            raise ConfigurationError(
                f"sharding transformer type {type!r} is not supported; the 2022 draft defines only 'indexed'",
                array_path,
            )
        self.underlying = _base_store(underlying, array_path)
        self.type = type
        bound = chunk_nbytes_bound(chunk_shape, itemsize) if chunk_shape is not None else None
        self.layout = ShardLayout.draft_2022(tuple(int(c) for c in chunks_per_shard), bound)
        self.array_path = array_path.strip("/")
        self.key_prefix = f"{DATA_ROOT}{self.array_path}/" if self.array_path else DATA_ROOT
        self.encoding = Draft2022ChunkKeyEncoding(separator)
        ndim = len(self.layout.chunks_per_shard)
        if shape is not None and chunk_shape is not None:
            if len(shape) != ndim or len(chunk_shape) != ndim:
                raise ConfigurationError(
                    f"chunks_per_shard {list(self.layout.chunks_per_shard)} has {ndim} entries but the array "
                    f"shape {list(shape)} and chunk shape {list(chunk_shape)} have {len(shape)} and "
                    f"{len(chunk_shape)}",
                    array_path,
                )
            shape, chunk_shape = tuple(int(s) for s in shape), tuple(int(c) for c in chunk_shape)
        else:
            shape = chunk_shape = None
        self.array = ShardedArray(
            self.array_path, self.key_prefix, shape, chunk_shape, self.layout, self.encoding, self.encoding
        )
        self.engine = ShardEngine(
            self.underlying.kv,
            Options.from_keywords(
                index_cache_bytes=index_cache_bytes,
                read_policy=read_policy,
                concurrency=concurrency,
                lock_timeout=lock_timeout,
            ),
        )

    # -- configuration ------------------------------------------------------------

    @classmethod
    def from_metadata(
        cls,
        entry: Mapping[str, Any],
        array_metadata: Mapping[str, Any],
        array_path: str,
        underlying: AbstractStore,
        **options: Any,
    ) -> ShardingStorageTransformer:
        """Build the transformer an array's ``storage_transformers`` entry describes.

        Parameters
        ----------
        entry : mapping
            ``{"extension": ..., "type": "indexed", "configuration": {"chunks_per_shard": [...]}}``.
        array_metadata : mapping
            The array's 2022 draft metadata (``shape``, ``chunk_grid``, ``data_type``).
        array_path : str
            The array's path in the hierarchy.
        underlying : AbstractStore
            The store below this transformer.
        **options
            Runtime options of the constructor (``index_cache_bytes``, ``read_policy``, ``concurrency``,
            ``lock_timeout``); never part of the metadata.

        Raises
        ------
        ConfigurationError
            If the entry lacks ``chunks_per_shard``, or it does not have one
            positive int per dimension of the array (draft "Configuration").
        """
        cps = (entry.get("configuration") or {}).get("chunks_per_shard")
        if not isinstance(cps, (list, tuple)) or any(
            isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in cps
        ):
            raise ConfigurationError(
                f"sharding transformer configuration needs chunks_per_shard, a list of ints >= 1; got {cps!r}",
                array_path,
            )
        grid = array_metadata.get("chunk_grid") or {}
        return cls(
            underlying,
            cps,
            array_path=array_path,
            separator=grid.get("separator", "/"),
            shape=list(array_metadata.get("shape", [])),
            chunk_shape=list(grid.get("chunk_shape", [])),
            type=entry.get("type", "indexed"),
            itemsize=_draft_itemsize(array_metadata.get("data_type")),
            **options,
        )

    @property
    def chunks_per_shard(self) -> tuple[int, ...]:
        return self.layout.chunks_per_shard

    @property
    def ndim(self) -> int:
        return len(self.layout.chunks_per_shard)

    def get_config(self) -> dict[str, Any]:
        """The ``configuration`` object of the metadata entry."""
        return {"chunks_per_shard": list(self.chunks_per_shard)}

    def to_metadata(self) -> dict[str, Any]:
        """The array metadata ``storage_transformers`` entry (draft "Configuration")."""
        return {"extension": self.extension, "type": self.type, "configuration": self.get_config()}

    def __repr__(self) -> str:
        return (
            f"ShardingStorageTransformer(chunks_per_shard={list(self.chunks_per_shard)}, "
            f"array_path={self.array_path!r}, separator={self.encoding.separator!r}, "
            f"underlying={self.underlying!r})"
        )

    @property
    def chunk_grid_shape(self) -> tuple[int, ...] | None:
        """Chunks along each dimension, when the array shape is known."""
        return self.array.chunk_grid_shape

    @property
    def index_cache(self) -> Any:
        """The shard index cache (``hits``, ``misses``, ``nbytes``, ``clear()``)."""
        return self.engine.cache

    @property
    def concurrency_mode(self) -> str:
        """The resolved ``concurrency`` mode: ``"files"``, ``"conditional"``, ``"process"`` or ``"none"``."""
        return self.engine.locks.mode

    def refresh(self) -> None:
        """Forget cached shard indexes."""
        self.engine.forget()

    # -- keys (see ShardedArray) ------------------------------------------------------

    def chunk_key(self, chunk_coords: Sequence[int]) -> str:
        """The key of a chunk as code above the transformer uses it."""
        return self.array.chunk_key(chunk_coords)

    def shard_key(self, shard_coords: Sequence[int]) -> str:
        """The key of a shard in the underlying store."""
        return self.array.shard_key(shard_coords)

    def _ref(self, key: str) -> ChunkRef | None:
        """Where a chunk key of this array lives (outside the grid too: it may be stored), ``None``: relayed."""
        if not isinstance(key, str):
            raise TypeError(f"store keys are str, got {type(key).__name__}: {key!r}")
        if not self.array.owns(key):
            return None
        return self.array.locate(key, check_grid=False)

    def locate(self, key: str) -> tuple[str, LocalCoords] | None:
        """``(shard_key, local_coords)`` of a chunk key of this array, ``None`` for other keys.

        Raises
        ------
        InvalidKeyError
            If ``key`` lies under the array's data prefix but is not one of its chunk keys.
        """
        ref = self._ref(key)
        return None if ref is None else (ref.shard_key, ref.local_coords)

    # -- reads ----------------------------------------------------------------------

    def get_partial_values(self, key_ranges: Sequence[KeyRange]) -> list[bytes | None]:
        """Byte ranges of values; chunk ranges are ranges inside the chunk (two store requests at most).

        Raises
        ------
        InvalidKeyError
            For a key under the array's data prefix that is not a chunk key.
        CorruptShardError
            For an index of the wrong size, or pointing at bytes past the end
            of its shard's chunk data.
        """
        refs = [self._ref(k) for k, _ in key_ranges]
        chunks = [i for i, ref in enumerate(refs) if ref is not None]
        relayed = [i for i, ref in enumerate(refs) if ref is None]
        values = self.engine.reads.read_ranges(
            [(ref, key_ranges[i][1]) for i in chunks if (ref := refs[i]) is not None], [key_ranges[i] for i in relayed]
        )
        out: list[bytes | None] = [None] * len(key_ranges)
        for i, value in zip(chunks + relayed, values, strict=True):
            out[i] = None if value is None else bytes(value)
        return out

    def contains(self, key: str) -> bool:
        ref = self._ref(key)
        if ref is None:
            return self.underlying.contains(key)
        return self.engine.reads.has_chunks([ref])[0]

    # -- writes -----------------------------------------------------------------------

    def _group(self, keys: Iterable[str], update: Callable[[str], Any]) -> tuple[list[str], dict[str, ShardChange]]:
        """Relayed keys, and this array's chunk changes (``update(key)``) grouped by shard."""
        relayed: list[str] = []
        by_shard: dict[str, ShardChange] = {}
        for key in keys:
            ref = self._ref(key)
            if ref is None:
                relayed.append(key)
            else:
                change = by_shard.get(ref.shard_key)
                if change is None:
                    change = by_shard[ref.shard_key] = ShardChange(self.array, ref.shard_coords)
                change.chunks[ref.local_coords] = update(key)
        return relayed, by_shard

    def set_values(self, values: Mapping[str, BytesLike]) -> None:
        """Set whole values: one shard write per shard, in one ``set_values``.

        Shards whose available chunks are all set are built without a read;
        the others are read whole (one ``get_partial_values``) and merged,
        chunks outside the grid dropped.

        Raises
        ------
        InvalidKeyError
            For a key under the array's data prefix that is not a chunk key.
        """
        relayed, by_shard = self._group(values, lambda key: memoryview(values[key]).cast("B"))
        if relayed:
            self.underlying.set_values({k: values[k] for k in relayed})
        if by_shard:
            self.engine.writes.write(by_shard)

    def set_partial_values(self, key_start_values: Sequence[KeyStartValue]) -> None:
        """Write byte ranges inside values; a chunk's old bytes come from its shard (merged in one write).

        Raises
        ------
        InvalidKeyError
            For a key under the array's data prefix that is not a chunk key.
        ValueError
            If a write would leave a gap in a chunk.
        """
        patches: dict[str, ChunkPatch] = {}
        for key, start, value in key_start_values:
            patches.setdefault(key, ChunkPatch(key)).writes.append((int(start), value))
        relayed, by_shard = self._group(patches, patches.__getitem__)
        if relayed:
            relayed_keys = set(relayed)
            self.underlying.set_partial_values([w for w in key_start_values if w[0] in relayed_keys])
        if by_shard:
            self.engine.writes.write(by_shard)

    def erase_values(self, keys: Iterable[str]) -> None:
        """Erase chunks; whole shards go with one ``erase_values``, others are rewritten without them.

        Raises
        ------
        InvalidKeyError
            For a key under the array's data prefix that is not a chunk key.
        """
        relayed, by_shard = self._group(keys, lambda key: None)
        if relayed:
            self.underlying.erase_values(relayed)
        if by_shard:
            self.erase_chunks(by_shard)

    def erase_chunks(self, by_shard: Mapping[str, ShardChange]) -> None:
        """Erase chunks through the engine's one write path (the draft's ``erase_values`` plan, A9 and A10).

        A shard that loses every available chunk is deleted without a read,
        holding its lock (unconditioned: what another writer stored meanwhile
        is erased after it); the others are rewritten without them, as any
        change (never the draft's in-place index overwrite: a torn one has no
        checksum to tell it).
        """
        changes = {k: ShardChange(c.array, c.shard_coords, dict.fromkeys(c.chunks)) for k, c in by_shard.items()}
        whole: dict[str, ShardedArray] = {}
        for shard_key, change in changes.items():
            available = {local for _, local in change.array.chunks_in_shard(change.shard_coords)}
            if available and available <= set(change.chunks):
                whole[shard_key] = change.array
        self.engine.writes.erase(whole)  # whatever another writer stored there, it is erased after it
        self.engine.writes.write({k: c for k, c in changes.items() if k not in whole})

    # -- prefixes (draft "API implementation": a prefix naming chunk coords is translated to shards) ----

    def _is_shard(self, key: str) -> bool:
        return self.array.shard_coords_of(key) is not None

    def _unshard(self, shard_keys: Sequence[str], prefix: str) -> list[str]:
        """Chunk keys (starting with ``prefix``) of the chunks stored in ``shard_keys``."""
        found = self.engine.reads.chunk_keys({k: self.array for k in shard_keys}, in_grid_only=False)
        return [k for k in found if k.startswith(prefix)]

    def _listed(self, keys: Iterable[str], prefix: str) -> tuple[list[str], dict[str, tuple[int, ...]]]:
        """Listed underlying keys split into plain keys starting with ``prefix``, and shard keys -> shard coords."""
        plain: list[str] = []
        shards: dict[str, tuple[int, ...]] = {}
        for key in keys:
            coords = self.array.shard_coords_of(key)
            if coords is not None:
                shards[key] = coords
            elif key.startswith(prefix):
                plain.append(key)
        return plain, shards

    def list_prefix(self, prefix: str) -> list[str]:
        """Stored keys starting with ``prefix``; shards are listed as their stored chunks.

        One ``list_prefix`` on the underlying store (with the prefix translated
        to shard coords where it names chunk coords), then one
        ``get_partial_values`` of the indexes not cached per 4096 listed shards.
        """
        prefix = normalize_prefix(prefix)
        split = split_prefix(self.array, prefix)
        if split is not None and not split[1]:
            return [k for k in self.underlying.list_prefix(prefix) if not self._is_shard(k)]  # no chunk key can match
        translated = prefix if split is None else shard_prefix(self.array, split[0])
        plain, shards = self._listed(self.underlying.list_prefix(translated), prefix)
        return plain + self._unshard(list(shards), prefix)

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """Keys and prefixes directly below ``prefix``, as seen above the transformer.

        Retrieved shard keys are replaced by the keys of their stored chunks
        (their indexes are read); retrieved prefixes of partial shard keys are
        replaced by the prefixes of every chunk the shard can hold, without
        checking that any is stored (draft note: listed prefixes may be empty).
        """
        prefix = normalize_prefix(prefix)
        if not prefix.startswith(self.key_prefix):
            return self.underlying.list_dir(prefix)
        directory = prefix[: prefix.rfind("/") + 1]
        split = split_prefix(self.array, directory)
        if split is not None and not split[1]:
            keys, prefixes = self.underlying.list_dir(prefix)
            return [k for k in keys if not self._is_shard(k)], prefixes
        fixed = [] if split is None else split[0]
        keys, prefixes = self.underlying.list_dir(directory if split is None else shard_prefix(self.array, fixed))
        out_keys, shards = self._listed(keys, prefix)
        out_keys.extend(self._unshard(list(shards), prefix))
        out_prefixes: set[str] = set()
        for p in prefixes:
            expanded = expand_shard_prefix(self.array, p, fixed)
            if expanded is None:
                expanded = [p]
            out_prefixes.update(e for e in expanded if e.startswith(prefix))
        return sorted(out_keys), sorted(out_prefixes)

    def erase_prefix(self, prefix: str) -> None:
        """Erase every key starting with ``prefix``.

        A prefix that does not reach into the chunk-grid part of the keys is
        relayed (it covers whole shards). Otherwise the shards that can hold
        matching chunks are listed: shards all of whose available chunks match
        are erased without a read, the matching chunks of the others as by
        :meth:`erase_values`.
        """
        prefix = normalize_prefix(prefix)
        split = split_prefix(self.array, prefix)
        if split is None:
            self.underlying.erase_prefix(prefix)
            self.engine.forget()  # shards of this array may be gone
            return
        if not split[1]:
            self.underlying.erase_values([k for k in self.underlying.list_prefix(prefix) if not self._is_shard(k)])
            return
        plain, shards = self._listed(self.underlying.list_prefix(shard_prefix(self.array, split[0])), prefix)
        erasures: dict[str, ShardChange] = {}
        partial = []
        for shard_key, coords in shards.items():
            available = [(self.array.chunk_key(c), local) for c, local in self.array.chunks_in_shard(coords)]
            if available and all(k.startswith(prefix) for k, _ in available):
                erasures[shard_key] = ShardChange(self.array, coords, dict.fromkeys(local for _, local in available))
            else:
                partial.append(shard_key)
        erasures.update(self._group(self._unshard(partial, prefix), lambda key: None)[1])  # their matching chunks
        if plain:
            self.underlying.erase_values(plain)
        if erasures:
            self.erase_chunks(erasures)

    def compact(self) -> int:
        """Rewrite the array's stored shards that hold unused bytes (after erases or appends).

        Returns
        -------
        int
            Bytes reclaimed in the underlying store.
        """
        shards = [k for k in self.underlying.list_prefix(self.key_prefix) if self._is_shard(k)]
        return self.engine.writes.compact(self.array, shards)
