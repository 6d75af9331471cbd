"""The 2022 draft sharding storage transformer (``indexed`` binary shard format).

One :class:`ShardingStorageTransformer` serves one array (as the draft
configures sharding per array). Keys under the array's data prefix
``data/root/<path>/`` are chunk keys: the transformer stores the chunks of one
shard in one value of the underlying store, at the shard key (chunk coords
floor-divided by ``chunks_per_shard``, same separator: chunk ``c96/18`` with
``chunks_per_shard=[32, 2]`` lives in shard ``c3/9``). Every other key is
relayed unchanged. The shard bytes are the draft's ``indexed`` format
(:meth:`shardkv.format.layout.ShardLayout.draft_2022`)::

    +---------+---------+-----+----------------------------------------+
    | chunk a | chunk b | ... | index: n x (offset, nbytes)             |
    |         |         |     | little-endian uint64, row-major (C)     |
    +---------+---------+-----+----------------------------------------+
                                16 * n bytes, n = prod(chunks_per_shard)

Empty chunks have offset = nbytes = ``2**64 - 1``.

Request plan on the underlying store (draft "API implementation"):

* ``get_partial_values``: one ``get_partial_values`` for the indexes of the
  shards involved (together with the relayed keys), one for the chunk ranges;
* ``set_values`` / ``set_partial_values``: shards whose every available chunk
  is set whole are built directly; the others are read completely with one
  ``get_partial_values`` (the draft's simplification); then one ``set_values``
  writes every new shard (write strategy: compact rewrite, chunks in row-major
  order);
* ``erase_values``: shards whose every available chunk is erased are erased
  with one ``erase_values``; for the others one ``get_partial_values`` reads the
  indexes and one ``set_partial_values`` rewrites them in place at the end of
  the shard (a shard left without chunks is erased instead).

"Available" chunks are the shard's chunks inside the array's chunk grid when
the array shape is known, else all ``chunks_per_shard`` of them.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from typing import Any, Iterable, Iterator, Mapping, Sequence

from shardkv.errors import ConfigurationError, CorruptShardError
from shardkv.format.index import ShardIndex
from shardkv.format.layout import ShardLayout
from shardkv.format.ranges import ByteRange
from shardkv.keys.encodings import Draft2022ChunkKeyEncoding, grid_shape

from .api import AbstractStore, BytesLike, KeyRange, KeyStartValue, apply_partial_writes, normalize_prefix
from .keyspace import Local, ShardKeySpace

__all__ = ["ShardingStorageTransformer", "SHARDING_EXTENSION", "DATA_ROOT"]

SHARDING_EXTENSION = "https://purl.org/zarr/spec/storage_transformers/sharding/1.0"
"""The ``extension`` of the sharding transformer's metadata entry."""
DATA_ROOT = "data/root/"
"""Keys starting with this are data keys (v3 core draft "Storage keys")."""
_BATCH = 4096  # shards whose indexes are read in one request while listing



class ShardingStorageTransformer(AbstractStore):
    """Sharding of one array's chunk keys over an underlying store (2022 draft).

    Parameters
    ----------
    underlying : AbstractStore
        The next transformer of the stack, or the store adapter at its bottom.
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
        as available.
    type : {"indexed"}
        The binary shard format.

    Raises
    ------
    ConfigurationError
        If ``type`` is not ``"indexed"``, a ``chunks_per_shard`` value is < 1,
        or ``shape`` / ``chunk_shape`` do not match its length.
    """

    extension = SHARDING_EXTENSION
    types = ("indexed",)

    def __init__(
        self,
        underlying: AbstractStore,
        chunks_per_shard: Sequence[int],
        *,
        array_path: str = "",
        separator: str = "/",
        shape: Sequence[int] | None = None,
        chunk_shape: Sequence[int] | None = None,
        type: str = "indexed",
    ) -> None:
        if type not in self.types:
            raise ConfigurationError(
                f"sharding transformer type {type!r} is not supported; the 2022 draft defines only 'indexed'",
                array_path,
            )
        self.underlying = underlying
        self.type = type
        self.layout = ShardLayout.draft_2022(tuple(int(c) for c in chunks_per_shard))
        self.array_path = array_path.strip("/")
        self.key_prefix = f"{DATA_ROOT}{self.array_path}/" if self.array_path else DATA_ROOT
        self.encoding = Draft2022ChunkKeyEncoding(separator)  # type: ignore[arg-type]
        ndim = len(self.layout.chunks_per_shard)
        self.chunk_grid_shape: tuple[int, ...] | None = None
        if shape is not None and chunk_shape is not None:
            if len(shape) != ndim or len(chunk_shape) != ndim:
                raise ConfigurationError(
                    f"chunks_per_shard {list(self.layout.chunks_per_shard)} has {ndim} entries but the array "
                    f"shape {list(shape)} and chunk shape {list(chunk_shape)} have {len(shape)} and "
                    f"{len(chunk_shape)}",
                    array_path,
                )
            self.chunk_grid_shape = grid_shape(shape, chunk_shape)
        self.keys = ShardKeySpace(self.key_prefix, self.encoding, self.layout.chunks_per_shard, self.chunk_grid_shape)
        self._lock = threading.Lock()
        self._shard_locks: dict[str, threading.Lock] = {}

    # -- configuration ------------------------------------------------------------

    @classmethod
    def from_metadata(
        cls,
        entry: Mapping[str, Any],
        array_metadata: Mapping[str, Any],
        array_path: str,
        underlying: AbstractStore,
        chunk_shape: Sequence[int] | None = None,
    ) -> ShardingStorageTransformer:
        """Build the transformer an array's ``storage_transformers`` entry describes.

        Parameters
        ----------
        entry : mapping
            ``{"extension": ..., "type": "indexed", "configuration": {"chunks_per_shard": [...]}}``.
        array_metadata : mapping
            The array's 2022 draft metadata (``shape``, ``chunk_grid``).
        array_path : str
            The array's path in the hierarchy.
        underlying : AbstractStore
            The store below this transformer.
        chunk_shape : sequence of int, optional
            The chunk shape this transformer sees (elements); by default the
            array's ``chunk_grid.chunk_shape`` (a transformer lower in a stack
            of sharding transformers sees the shards of the ones above).

        Raises
        ------
        ConfigurationError
            If the entry lacks ``chunks_per_shard``, or it does not have one
            positive int per dimension of the array (draft "Configuration").
        """
        config = entry.get("configuration") or {}
        cps = config.get("chunks_per_shard")
        shape = list(array_metadata.get("shape", []))
        if (
            not isinstance(cps, (list, tuple))
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in cps)
        ):
            raise ConfigurationError(
                f"sharding transformer configuration needs chunks_per_shard, a list of ints >= 1; got {cps!r}",
                array_path,
            )
        if len(cps) != len(shape):
            raise ConfigurationError(
                f"chunks_per_shard {list(cps)} must have one entry per dimension of shape {shape}",
                array_path,
            )
        grid = array_metadata.get("chunk_grid") or {}
        return cls(
            underlying,
            cps,
            array_path=array_path,
            separator=grid.get("separator", "/"),
            shape=shape,
            chunk_shape=list(chunk_shape if chunk_shape is not None else grid.get("chunk_shape", [])),
            type=entry.get("type", "indexed"),
        )

    @classmethod
    def outer_chunk_shape(cls, entry: Mapping[str, Any], chunk_shape: Sequence[int]) -> list[int]:
        """The chunk shape seen by the store below: the shard shape (elements)."""
        cps = (entry.get("configuration") or {}).get("chunks_per_shard") or []
        return [c * n for c, n in zip(chunk_shape, cps)]

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

    # -- keys (see ShardKeySpace) ------------------------------------------------------

    def chunk_key(self, chunk_coords: Sequence[int]) -> str:
        """The key of a chunk as code above the transformer uses it."""
        return self.keys.chunk_key(chunk_coords)

    def shard_key(self, shard_coords: Sequence[int]) -> str:
        """The key of a shard in the underlying store."""
        return self.keys.shard_key(shard_coords)

    def locate(self, key: str) -> tuple[str, Local] | None:
        """``(shard_key, local_coords)`` of a chunk key of this array, ``None`` for other keys.

        Raises
        ------
        InvalidKeyError
            If ``key`` lies under the array's data prefix but is not one of its chunk keys.
        """
        return self.keys.locate(key)

    def _shard_lock(self, shard_key: str) -> threading.Lock:
        with self._lock:
            lock = self._shard_locks.get(shard_key)
            if lock is None:
                lock = self._shard_locks[shard_key] = threading.Lock()
            return lock

    # -- indexes --------------------------------------------------------------------

    def _decode_index(self, shard_key: str, data: bytes | None) -> ShardIndex | None:
        return None if data is None else self.layout.decode_index(data, shard_key)

    def _read_indexes(self, shard_keys: Sequence[str]) -> dict[str, ShardIndex]:
        """Indexes of the stored shards among ``shard_keys`` (one ``get_partial_values``)."""
        if not shard_keys:
            return {}
        suffix = self.layout.index_range()
        raw = self.underlying.get_partial_values([(k, suffix) for k in shard_keys])
        out = {}
        for k, data in zip(shard_keys, raw):
            index = self._decode_index(k, data)
            if index is not None:
                out[k] = index
        return out

    def _present_chunk_keys(self, shard_key: str, index: ShardIndex) -> Iterator[str]:
        shard_coords = self.keys.shard_coords_of(shard_key)
        for local in index.present():
            yield self.keys.chunk_key(self.keys.chunk_coords(shard_coords, local))  # type: ignore[arg-type]

    def _unshard(self, shard_keys: Sequence[str], prefix: str) -> list[str]:
        """Chunk keys (starting with ``prefix``) of the chunks stored in ``shard_keys``."""
        out: list[str] = []
        for start in range(0, len(shard_keys), _BATCH):
            batch = list(shard_keys[start : start + _BATCH])
            for shard_key, index in self._read_indexes(batch).items():
                out.extend(k for k in self._present_chunk_keys(shard_key, index) if k.startswith(prefix))
        return out

    # -- reads ----------------------------------------------------------------------

    def get_partial_values(self, key_ranges: Sequence[KeyRange]) -> list[bytes | None]:
        """Byte ranges of values; chunk ranges are ranges inside the chunk.

        Two ``get_partial_values`` calls on the underlying store at most: the
        shard indexes together with the relayed keys, then the chunk ranges.

        Raises
        ------
        InvalidKeyError
            For a key under the array's data prefix that is not a chunk key.
        CorruptShardError
            For an index of the wrong size, pointing at bytes past the end of
            its shard.
        """
        located: list[tuple[str, Local] | None] = [self.keys.locate(k) for k, _ in key_ranges]
        shard_keys = list(dict.fromkeys(loc[0] for loc in located if loc is not None))
        relayed = [i for i, loc in enumerate(located) if loc is None]
        suffix = self.layout.index_range()
        first = self.underlying.get_partial_values(
            [(k, suffix) for k in shard_keys] + [key_ranges[i] for i in relayed]
        )
        out: list[bytes | None] = [None] * len(key_ranges)
        for i, value in zip(relayed, first[len(shard_keys) :]):
            out[i] = value
        indexes = {k: self._decode_index(k, d) for k, d in zip(shard_keys, first[: len(shard_keys)])}
        wanted: list[tuple[int, str, int, int, bool]] = []  # (position, shard key, start, stop, to chunk end)
        for i, loc in enumerate(located):
            if loc is None:
                continue
            index = indexes[loc[0]]
            entry = None if index is None else index.get(loc[1])
            if entry is None:
                continue
            offset, nbytes = entry
            r = key_ranges[i][1]
            if r.is_suffix:
                start, stop = max(0, nbytes + r.start), nbytes
            else:
                start = min(r.start, nbytes)
                stop = nbytes if r.stop is None else min(r.stop, nbytes)
            wanted.append((i, loc[0], offset + start, offset + stop, stop == nbytes))
        if not wanted:
            return out
        # a read reaching the end of a chunk also asks for the index_nbytes bytes after it: at
        # least the index follows every chunk, so fewer bytes mean a truncated shard or an entry
        # pointing into the index, never bytes returned as a chunk
        guard = self.layout.index_nbytes
        second = self.underlying.get_partial_values(
            [(sk, ByteRange(a, b + guard if to_end else b)) for _, sk, a, b, to_end in wanted]
        )
        for (i, shard_key, start, stop, to_end), value in zip(wanted, second):
            if value is None:
                continue  # the shard was erased between the two reads
            expected = stop - start + (guard if to_end else 0)
            if len(value) != expected:
                raise CorruptShardError(
                    shard_key,
                    f"the index points at bytes [{start}, {stop}) for chunk {key_ranges[i][0]!r}, which must "
                    f"lie before the {guard}-byte index, but the shard ends {expected - len(value)} bytes "
                    "too early (truncated shard or entry pointing into the index)",
                )
            out[i] = value[: stop - start] if to_end else value
        return out

    def contains(self, key: str) -> bool:
        loc = self.keys.locate(key)
        if loc is None:
            return self.underlying.contains(key)
        index = self._read_indexes([loc[0]]).get(loc[0])
        return index is not None and index.get(loc[1]) is not None

    # -- writes -----------------------------------------------------------------------

    def set_values(self, values: Mapping[str, BytesLike]) -> None:
        """Set whole values; the chunks of one shard are written with one shard write.

        Raises
        ------
        InvalidKeyError
            For a key under the array's data prefix that is not a chunk key.
        """
        relayed: dict[str, BytesLike] = {}
        by_shard: dict[str, dict[Local, Any]] = {}
        for key, value in values.items():
            loc = self.keys.locate(key)
            if loc is None:
                relayed[key] = value
            else:
                by_shard.setdefault(loc[0], {})[loc[1]] = ("set", memoryview(value).cast("B"))
        if relayed:
            self.underlying.set_values(relayed)
        if by_shard:
            self._rewrite(by_shard)

    def set_partial_values(self, key_start_values: Sequence[KeyStartValue]) -> None:
        """Write byte ranges inside values; a chunk's old bytes come from its shard.

        Raises
        ------
        InvalidKeyError
            For a key under the array's data prefix that is not a chunk key.
        ValueError
            If a write would leave a gap in a chunk.
        """
        relayed: list[KeyStartValue] = []
        by_shard: dict[str, dict[Local, Any]] = {}
        for key, start, value in key_start_values:
            loc = self.keys.locate(key)
            if loc is None:
                relayed.append((key, start, value))
                continue
            updates = by_shard.setdefault(loc[0], {})
            op = updates.setdefault(loc[1], ("patch", key, []))
            op[2].append((int(start), value))
        if relayed:
            self.underlying.set_partial_values(relayed)
        if by_shard:
            self._rewrite(by_shard)

    def _rewrite(self, by_shard: Mapping[str, dict[Local, Any]]) -> None:
        """Build and set the new shards: at most one read round and one write."""
        with ExitStack() as stack:
            for shard_key in sorted(by_shard):
                stack.enter_context(self._shard_lock(shard_key))
            need_old = []
            for shard_key, updates in by_shard.items():
                avail = self.keys.available(self.keys.shard_coords_of(shard_key))  # type: ignore[arg-type]
                whole = all(op[0] == "set" for op in updates.values())
                if not (whole and avail and avail <= updates.keys()):
                    need_old.append(shard_key)
            old: dict[str, bytes | None] = {}
            if need_old:
                old = dict(zip(need_old, self.underlying.get_partial_values([(k, ByteRange(0)) for k in need_old])))
            new_shards: dict[str, bytes] = {}
            emptied: list[str] = []
            for shard_key, updates in by_shard.items():
                blob = old.get(shard_key)
                chunks: dict[Local, BytesLike] = {}
                if blob is not None:
                    chunks.update(self.layout.chunks_of_shard(blob, shard_key))
                for local, op in updates.items():
                    if op[0] == "set":
                        chunks[local] = op[1]
                    elif op[0] == "patch":
                        chunks[local] = apply_partial_writes(op[1], chunks.get(local), op[2])
                    else:
                        chunks.pop(local, None)
                if chunks:
                    new_shards[shard_key] = self.layout.encode_shard(chunks)
                elif blob is not None:
                    emptied.append(shard_key)
            if new_shards:
                self.underlying.set_values(new_shards)
            if emptied:
                self.underlying.erase_values(emptied)

    def erase_values(self, keys: Iterable[str]) -> None:
        """Erase chunks; whole shards go with one ``erase_values``, others get an in-place index.

        Raises
        ------
        InvalidKeyError
            For a key under the array's data prefix that is not a chunk key.
        """
        relayed: list[str] = []
        by_shard: dict[str, set[Local]] = {}
        for key in keys:
            loc = self.keys.locate(key)
            if loc is None:
                relayed.append(key)
            else:
                by_shard.setdefault(loc[0], set()).add(loc[1])
        if relayed:
            self.underlying.erase_values(relayed)
        if not by_shard:
            return
        with ExitStack() as stack:
            for shard_key in sorted(by_shard):
                stack.enter_context(self._shard_lock(shard_key))
            whole, partial = [], []
            for shard_key, locals_ in by_shard.items():
                avail = self.keys.available(self.keys.shard_coords_of(shard_key))  # type: ignore[arg-type]
                (whole if avail and avail <= locals_ else partial).append(shard_key)
            indexes = self._read_indexes(partial)
            writes: list[KeyStartValue] = []
            for shard_key, index in indexes.items():
                before = index.count_present()
                for local in by_shard[shard_key]:
                    index.clear(local)
                if index.is_empty():
                    whole.append(shard_key)
                elif index.count_present() != before:
                    writes.append((shard_key, -self.layout.index_nbytes, self.layout.encode_index(index)))
            if whole:
                self.underlying.erase_values(whole)
            if writes:
                self.underlying.set_partial_values(writes)

    # -- prefixes -----------------------------------------------------------------------

    def list_prefix(self, prefix: str) -> list[str]:
        """Stored keys starting with ``prefix``; shards are listed as their stored chunks.

        One ``list_prefix`` on the underlying store (with the prefix translated
        to shard coords where it names chunk coords), then one
        ``get_partial_values`` of indexes per 4096 listed shards.
        """
        prefix = normalize_prefix(prefix)
        split = self.keys.split_prefix(prefix)
        if split is not None and not split[1]:
            listed = self.underlying.list_prefix(prefix)  # no chunk key can match
            return [k for k in listed if self.keys.shard_coords_of(k) is None]
        translated = prefix if split is None else self.keys.shard_prefix(split[0])
        plain, shards = [], []
        for key in self.underlying.list_prefix(translated):
            if self.keys.shard_coords_of(key) is not None:
                shards.append(key)
            elif key.startswith(prefix):
                plain.append(key)
        return plain + self._unshard(shards, prefix)

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
        split = self.keys.split_prefix(directory)
        if split is not None and not split[1]:
            keys, prefixes = self.underlying.list_dir(prefix)
            return [k for k in keys if self.keys.shard_coords_of(k) is None], prefixes
        dir_coords = [] if split is None else split[0]
        translated = directory if split is None else self.keys.shard_prefix(dir_coords)
        keys, prefixes = self.underlying.list_dir(translated)
        out_keys, shards = [], []
        for key in keys:
            if self.keys.shard_coords_of(key) is not None:
                shards.append(key)
            elif key.startswith(prefix):
                out_keys.append(key)
        out_keys.extend(self._unshard(shards, prefix))
        out_prefixes: set[str] = set()
        for p in prefixes:
            expanded = self.keys.expand_shard_prefix(p, dir_coords)
            if expanded is None:
                if p.startswith(prefix):
                    out_prefixes.add(p)
                continue
            out_prefixes.update(e for e in expanded if e.startswith(prefix))
        return sorted(out_keys), sorted(out_prefixes)

    def erase_prefix(self, prefix: str) -> None:
        """Erase every key starting with ``prefix``.

        A prefix that does not reach into the chunk-grid part of the keys is
        relayed (it covers whole shards). Otherwise the shards that can hold
        matching chunks are listed and their indexes read: shards all of whose
        available chunks match are erased with one ``erase_values`` on the
        underlying store, the matching chunks of the others with
        :meth:`erase_values` on this transformer.
        """
        prefix = normalize_prefix(prefix)
        split = self.keys.split_prefix(prefix)
        if split is None:
            self.underlying.erase_prefix(prefix)
            return
        if not split[1]:
            listed = self.underlying.list_prefix(prefix)
            self.underlying.erase_values([k for k in listed if self.keys.shard_coords_of(k) is None])
            return
        plain, whole, partial_keys = [], [], []
        shards = []
        for key in self.underlying.list_prefix(self.keys.shard_prefix(split[0])):
            if self.keys.shard_coords_of(key) is not None:
                shards.append(key)
            elif key.startswith(prefix):
                plain.append(key)
        for shard_key in shards:
            coords = self.keys.shard_coords_of(shard_key)
            avail = self.keys.available(coords)  # type: ignore[arg-type]
            if avail and all(
                self.keys.chunk_key(self.keys.chunk_coords(coords, local)).startswith(prefix)  # type: ignore[arg-type]
                for local in avail
            ):
                whole.append(shard_key)
            else:
                partial_keys.append(shard_key)
        matching = self._unshard(partial_keys, prefix)
        if plain or whole:
            self.underlying.erase_values(plain + whole)
        if matching:
            self.erase_values(matching)
