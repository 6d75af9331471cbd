"""``shardkv convert``: pack every array of a Zarr v2 hierarchy into shards.

Chunks are moved as stored: their bytes are never decoded or re-encoded,
only placed side by side in shards (v1.0 ``sharding_indexed`` layout, see
:class:`shardkv.format.layout.ShardLayout`). The result is exactly what
:class:`shardkv.ShardedStore` would have written had the arrays been created
through it: the same shards under the same keys, the same ``.zarray``,
``.zattrs`` and ``.zgroup`` documents, and beside each sharded array's
``.zarray`` the ``zarr.json`` view of :func:`shardkv.metadata.v3_view.v3_view_of_v2`.

Rules
-----
* ``chunks_per_shard`` as an int applies along every dimension of every
  array; as a tuple it applies to arrays with that many dimensions only, and
  the others are copied unsharded (the report says which and why). 0-d arrays
  and arrays that are already sharded are copied unsharded too.
* Chunk keys outside an array's chunk grid (stale chunks) are skipped and
  counted; every other key of an array (its metadata, unknown files) and every
  key outside the arrays is copied as it is. Unsharded arrays are copied verbatim.
* An array whose ``.zarray`` names no ``dimension_separator`` but whose chunks
  are stored at ``/``-separated keys (zarr-python's ``NestedDirectoryStore``)
  is detected from its keys (:func:`shardkv.cli.info.detect_separator`); its
  destination ``.zarray`` then says ``"dimension_separator": "/"``, so any
  reader finds the shards (and consolidated ``.zmetadata`` says the same).
* Metadata is written last, so an interrupted conversion leaves no array that
  looks complete.

Memory: one shard's chunks are read with one batched ``get_many``; finished
shards are written in batches of at most ``_WRITE_BATCH_NBYTES`` bytes (or
``_WRITE_BATCH_OBJECTS`` objects); other keys are copied
``_COPY_BATCH_KEYS`` at a time. The whole array is never in memory; the key
listing is.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Sequence

from shardkv.cli.info import META_NAMES, ArrayKeys, read_hierarchy
from shardkv.errors import ConfigurationError, DestinationNotEmptyError, SameLocationError
from shardkv.format.layout import ShardLayout
from shardkv.keys.encodings import V2ChunkKeyEncoding, chunk_to_shard
from shardkv.metadata.chunks_per_shard import check_chunks_per_shard
from shardkv.metadata.documents import dump_json
from shardkv.metadata.draft import is_draft_hierarchy
from shardkv.metadata.v3_view import sharding_spec_from_v3, v3_view_of_v2
from shardkv.storage.adapters import FSMapAdapter, StoreAdapter, adapt

__all__ = [
    "ChunksPerShard",
    "ArrayReport",
    "ConvertReport",
    "DestinationNotEmptyError",
    "SameLocationError",
    "parse_chunks_per_shard",
    "check_chunks_per_shard",
    "convert",
]

ChunksPerShard = int | tuple[int, ...]

_WRITE_BATCH_NBYTES = 64 * 2**20  # bytes of finished shards held before one batched write
_WRITE_BATCH_OBJECTS = 64  # shards held before one batched write
_COPY_BATCH_KEYS = 32  # keys copied as they are per batched read + write


# -- options ---------------------------------------------------------------


def parse_chunks_per_shard(text: str) -> ChunksPerShard:
    """Parse the command line's ``--chunks-per-shard``: ``"4"`` -> 4, ``"2,2,1"`` -> (2, 2, 1).

    Raises
    ------
    ConfigurationError
        If ``text`` is not one int >= 1 or a comma-separated list of them.
    """
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ConfigurationError(
            f"expected an int >= 1 or a comma-separated list of ints >= 1 (like 2,2,1), got {text!r}"
        )
    values = tuple(int(p) for p in parts)
    if any(v < 1 for v in values):
        raise ConfigurationError(f"chunks per shard must be >= 1, got {text!r}")
    return values[0] if len(values) == 1 and "," not in text else values


# -- report ------------------------------------------------------------------


@dataclass
class ArrayReport:
    """What the conversion did with one array.

    Attributes
    ----------
    path : str
        Array path (``""`` for a root array).
    ndim : int
        Number of dimensions.
    chunks_per_shard : tuple of int or None
        Inner chunks per shard; ``None`` when the array was copied unsharded.
    reason : str or None
        Why the array was copied unsharded.
    chunks : int
        In-grid chunks stored in the source (packed into shards, or copied).
    stale_chunks : int
        Chunks outside the chunk grid that were skipped (sharded arrays only).
    shards : int
        Shards written.
    separator : {".", "/"}
        Chunk (and shard) key separator.
    separator_detected : bool
        True when ``"/"`` was detected from the stored keys and written to the destination ``.zarray``.
    """

    path: str
    ndim: int
    chunks_per_shard: tuple[int, ...] | None
    reason: str | None
    chunks: int
    stale_chunks: int
    shards: int
    separator: str
    separator_detected: bool

    @property
    def sharded(self) -> bool:
        return self.chunks_per_shard is not None


@dataclass
class ConvertReport:
    """The outcome of :func:`convert`.

    Attributes
    ----------
    src, dst : str
        Source and destination, as given.
    arrays : list of ArrayReport
        One per array, in path order.
    objects_before, objects_after : int
        Stored objects (keys) in the source, and written to the destination.
    bytes_before, bytes_after : int
        Their total size in bytes.
    """

    src: str
    dst: str
    arrays: list[ArrayReport] = field(default_factory=list)
    objects_before: int = 0
    objects_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def sharded(self) -> list[ArrayReport]:
        """The arrays packed into shards."""
        return [a for a in self.arrays if a.sharded]

    @property
    def unsharded(self) -> list[ArrayReport]:
        """The arrays copied unsharded."""
        return [a for a in self.arrays if not a.sharded]

    @property
    def chunks(self) -> int:
        """In-grid chunks of all arrays."""
        return sum(a.chunks for a in self.arrays)

    @property
    def stale_chunks(self) -> int:
        """Skipped chunks outside the chunk grid."""
        return sum(a.stale_chunks for a in self.arrays)

    @property
    def shards(self) -> int:
        """Shards written."""
        return sum(a.shards for a in self.arrays)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the report."""
        doc = asdict(self)
        for a, d in zip(self.arrays, doc["arrays"]):
            d["sharded"] = a.sharded
        return doc

    def summary(self, max_listed: int = 10) -> str:
        """A few human-readable lines: arrays, chunks, objects and bytes before and after."""
        lines = [
            f"converted {len(self.arrays)} arrays from {self.src} to {self.dst}: "
            f"{len(self.sharded)} sharded, {len(self.unsharded)} copied unsharded"
        ]
        if self.unsharded:
            names = [f"{a.path or '/'} ({a.reason})" for a in self.unsharded]
            more = f", ... and {len(names) - max_listed} more" if len(names) > max_listed else ""
            lines.append("  unsharded: " + ", ".join(names[:max_listed]) + more)
        packed = sum(a.chunks for a in self.sharded)
        lines.append(
            f"  chunks: {self.chunks} ({packed} packed into {self.shards} shards, "
            f"{self.chunks - packed} copied unsharded)"
        )
        if self.stale_chunks:
            lines.append(f"  stale chunks outside the array grid, skipped: {self.stale_chunks}")
        detected = [a.path or "/" for a in self.arrays if a.separator_detected]
        if detected:
            lines.append(
                "  '/' dimension_separator detected from the stored keys and written to .zarray: "
                + ", ".join(detected[:max_listed])
                + (f", ... and {len(detected) - max_listed} more" if len(detected) > max_listed else "")
            )
        lines.append(f"  objects: {self.objects_before} -> {self.objects_after}")
        ratio = f" ({100 * (self.bytes_after - self.bytes_before) / self.bytes_before:+.2f}%)" if self.bytes_before else ""
        lines.append(f"  bytes: {self.bytes_before} -> {self.bytes_after}{ratio}")
        return "\n".join(lines)


# -- I/O helpers -----------------------------------------------------------------


class _Writer:
    """Batched writes to the destination, with counts of objects and bytes written."""

    def __init__(self, store: StoreAdapter, max_nbytes: int, max_objects: int) -> None:
        self.store = store
        self.max_nbytes = max_nbytes
        self.max_objects = max_objects
        self.pending: dict[str, bytes] = {}
        self.pending_nbytes = 0
        self.objects = 0
        self.nbytes = 0

    def put(self, key: str, value: bytes) -> None:
        if key in self.pending:
            raise ConfigurationError(f"two source objects map to the destination key {key!r}")
        self.pending[key] = value
        self.pending_nbytes += len(value)
        if self.pending_nbytes >= self.max_nbytes or len(self.pending) >= self.max_objects:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        self.store.set_many(self.pending)
        self.objects += len(self.pending)
        self.nbytes += self.pending_nbytes
        self.pending = {}
        self.pending_nbytes = 0


def _name(store: Any) -> str:
    return store if isinstance(store, str) else repr(store) if not hasattr(store, "__fspath__") else str(store)


def _check_distinct(src: StoreAdapter, dst: StoreAdapter, src_name: str, dst_name: str) -> None:
    same_mapping = hasattr(src, "mapping") and hasattr(dst, "mapping") and src.mapping is dst.mapping
    if src is dst or same_mapping:
        raise SameLocationError(f"source and destination are the same store ({src_name})")
    if isinstance(src, FSMapAdapter) and isinstance(dst, FSMapAdapter) and src.fs.protocol == dst.fs.protocol:
        a = src.fs._strip_protocol(src.root).rstrip("/")
        b = dst.fs._strip_protocol(dst.root).rstrip("/")
        if a == b or b.startswith(a + "/") or a.startswith(b + "/"):
            raise SameLocationError(
                f"source {src_name} and destination {dst_name} overlap (one lies inside the other)"
            )


def _copy(src: StoreAdapter, keys: Sequence[str], writer: _Writer, progress: Any) -> int:
    """Copy keys as they are, a batch at a time; returns the bytes read."""
    nbytes = 0
    for start in range(0, len(keys), _COPY_BATCH_KEYS):
        batch = keys[start : start + _COPY_BATCH_KEYS]
        values = src.get_many(batch)
        for k in batch:
            if k in values:  # a key deleted since the listing is not copied
                value = bytes(values[k])
                nbytes += len(value)
                writer.put(k, value)
        progress.update(len(batch))
    return nbytes


def _plan(
    keys: ArrayKeys, meta: Mapping[str, bytes], chunks_per_shard: ChunksPerShard
) -> tuple[tuple[int, ...] | None, str | None]:
    """``chunks_per_shard`` for one array, or ``None`` and the reason it stays unsharded."""
    ndim = keys.ndim
    zjson = meta.get(f"{keys.path}/zarr.json" if keys.path else "zarr.json")
    if zjson is not None and sharding_spec_from_v3(json.loads(bytes(zjson)), keys.path) is not None:
        return None, "already sharded"
    if ndim == 0:
        return None, "0-d"
    if isinstance(chunks_per_shard, int):
        return (chunks_per_shard,) * ndim, None
    if len(chunks_per_shard) != ndim:
        spec = ",".join(str(c) for c in chunks_per_shard)
        return None, f"{ndim}-d; chunks_per_shard {spec} is for {len(chunks_per_shard)}-d arrays"
    return tuple(chunks_per_shard), None


# -- the conversion ----------------------------------------------------------------


def convert(
    src: Any,
    dst: Any,
    chunks_per_shard: ChunksPerShard | Sequence[int],
    index_location: Literal["start", "end"] = "end",
    index_checksum: bool = True,
    progress: bool = False,
    *,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> ConvertReport:
    """Copy a Zarr v2 hierarchy, packing the chunks of its arrays into shards.

    Parameters
    ----------
    src, dst : str, os.PathLike, MutableMapping or fsspec.FSMap
        Source hierarchy and destination (an fsspec URL, a local path, or a
        store :func:`shardkv.storage.adapters.adapt` accepts). ``dst`` must be empty.
    chunks_per_shard : int or sequence of int
        Inner chunks per shard: an int for every dimension of every array, or
        one value per dimension for the arrays with that many dimensions
        (others are copied unsharded).
    index_location : {"end", "start"}
        Where each shard keeps its index (v1.0 codec ``index_location``).
    index_checksum : bool
        Whether shard indexes carry a CRC32C (``crc32c`` index codec).
    progress : bool
        Show a tqdm progress bar on stderr.
    overwrite : bool
        Delete everything in ``dst`` first instead of refusing a non-empty ``dst``.
    storage_options : mapping, optional
        fsspec options for URLs.

    Returns
    -------
    ConvertReport
        Arrays sharded and copied, chunks, stale chunks, objects and bytes before and after.

    Raises
    ------
    ConfigurationError
        If ``chunks_per_shard`` or ``index_location`` is invalid, or a
        ``.zarray`` cannot be used.
    NotAHierarchyError
        If ``src`` is missing, empty or not a Zarr v2 hierarchy.
    DestinationNotEmptyError
        If ``dst`` holds keys and ``overwrite`` is false.
    SameLocationError
        If ``src`` and ``dst`` overlap.
    """
    from tqdm import tqdm

    cps = check_chunks_per_shard(chunks_per_shard)
    ShardLayout((1,), index_location, "little", index_checksum)  # validates the options
    src_name, dst_name = _name(src), _name(dst)
    source, target = adapt(src, storage_options), adapt(dst, storage_options)
    _check_distinct(source, target, src_name, dst_name)
    if is_draft_hierarchy(source):  # a 2022 draft hierarchy gets the draft's sharding transformer
        from shardkv.cli.convert_draft import convert_draft

        if index_location != "end" or not index_checksum:
            raise ConfigurationError(
                f"{src_name} is a 2022 draft hierarchy: its shards use the draft's fixed 'indexed' layout "
                "(index at the end, no checksum), so --index-location start / --no-checksum do not apply"
            )

        return convert_draft(source, target, cps, progress, overwrite=overwrite, src_name=src_name, dst_name=dst_name)  # type: ignore[return-value]
    hierarchy = read_hierarchy(source, src_name)
    if next(iter(target.iter_keys()), None) is not None:
        if not overwrite:
            raise DestinationNotEmptyError(dst_name)
        target.rmdir("")

    report = ConvertReport(src_name, dst_name, objects_before=len(hierarchy.keys))
    writer = _Writer(target, _WRITE_BATCH_NBYTES, _WRITE_BATCH_OBJECTS)
    meta_out: dict[str, bytes] = {}
    amended: dict[str, dict[str, Any]] = {}  # array path -> .zarray with the detected separator
    bytes_before = 0
    with tqdm(
        total=len(hierarchy.keys), disable=not progress, file=sys.stderr, unit="obj", desc="shardkv convert"
    ) as bar:
        for path, keys in hierarchy.arrays.items():
            meta = source.get_many(keys.meta_keys)
            bytes_before += sum(len(v) for v in meta.values())
            bar.update(len(keys.meta_keys))
            array_cps, reason = _plan(keys, meta, cps)
            if array_cps is None:
                meta_out.update({k: bytes(v) for k, v in meta.items()})
                data_keys = [*keys.chunk_keys.values(), *keys.stale_keys, *keys.other_keys]
                bytes_before += _copy(source, data_keys, writer, bar)
                report.arrays.append(
                    ArrayReport(path, keys.ndim, None, reason, len(keys.chunk_keys), 0, 0, keys.separator, False)
                )
                continue
            layout = ShardLayout.v3(array_cps, index_location, "little", index_checksum)
            n_shards, nbytes = _write_shards(source, keys, layout, writer, bar)
            bytes_before += nbytes
            bytes_before += sum(source.size(k) for k in keys.stale_keys)
            bar.update(len(keys.stale_keys))
            bytes_before += _copy(source, keys.other_keys, writer, bar)
            meta_out.update(_array_metadata(keys, meta, layout, amended))
            report.arrays.append(
                ArrayReport(
                    path, keys.ndim, array_cps, None, len(keys.chunk_keys), len(keys.stale_keys), n_shards,
                    keys.separator, keys.separator_detected,
                )
            )  # fmt: skip
        group_meta = [k for k in hierarchy.group_keys if k.rpartition("/")[2] in META_NAMES]
        group_meta_set = set(group_meta)
        bytes_before += _copy(source, [k for k in hierarchy.group_keys if k not in group_meta_set], writer, bar)
        values = source.get_many(group_meta)
        bytes_before += sum(len(v) for v in values.values())
        meta_out.update({k: bytes(v) for k, v in values.items()})
        bar.update(len(group_meta))
        writer.flush()
        _amend_consolidated(meta_out, amended)
        for key in sorted(meta_out, key=_metadata_order):
            writer.put(key, meta_out[key])
        writer.flush()
    report.bytes_before = bytes_before
    report.objects_after = writer.objects
    report.bytes_after = writer.nbytes
    return report


def _write_shards(
    source: StoreAdapter, keys: ArrayKeys, layout: ShardLayout, writer: _Writer, bar: Any
) -> tuple[int, int]:
    """Pack the in-grid chunks of one array into shards; returns (shards written, bytes read)."""
    by_shard: dict[tuple[int, ...], dict[tuple[int, ...], str]] = {}
    for coords, key in keys.chunk_keys.items():
        shard_coords, local = chunk_to_shard(coords, layout.chunks_per_shard)
        by_shard.setdefault(shard_coords, {})[local] = key
    encoding = V2ChunkKeyEncoding(keys.separator)  # type: ignore[arg-type]
    prefix = f"{keys.path}/" if keys.path else ""
    n_shards = nbytes = 0
    for shard_coords in sorted(by_shard):
        members = by_shard[shard_coords]
        values = source.get_many(list(members.values()))
        chunks = {local: values[k] for local, k in members.items() if k in values}
        if chunks:
            nbytes += sum(memoryview(v).nbytes for v in chunks.values())
            writer.put(prefix + encoding.encode(shard_coords), layout.encode_shard(chunks))
            n_shards += 1
        bar.update(len(members))
    return n_shards, nbytes


def _array_metadata(
    keys: ArrayKeys, meta: Mapping[str, bytes], layout: ShardLayout, amended: dict[str, dict[str, Any]]
) -> dict[str, bytes]:
    """The destination metadata of a sharded array: its documents, amended ``.zarray``, ``zarr.json``."""
    prefix = f"{keys.path}/" if keys.path else ""
    out = {k: bytes(v) for k, v in meta.items()}
    zarray = dict(keys.zarray)
    if keys.separator_detected:
        zarray["dimension_separator"] = keys.separator
        out[prefix + ".zarray"] = dump_json(zarray)
        amended[keys.path] = zarray
    zattrs_raw = meta.get(prefix + ".zattrs")
    zattrs = json.loads(bytes(zattrs_raw)) if zattrs_raw is not None else {}
    out[prefix + "zarr.json"] = dump_json(v3_view_of_v2(zarray, zattrs, layout).metadata, strict=True)
    return out


def _amend_consolidated(meta_out: dict[str, bytes], amended: Mapping[str, dict[str, Any]]) -> None:
    """Put the amended ``.zarray`` documents into the consolidated ``.zmetadata`` above them."""
    if not amended:
        return
    for key in [k for k in meta_out if k.rpartition("/")[2] == ".zmetadata"]:
        group = key.rpartition("/")[0]
        doc = json.loads(meta_out[key])
        entries = doc.get("metadata")
        if not isinstance(entries, dict):
            continue
        changed = False
        for path, zarray in amended.items():
            if group and not path.startswith(group + "/"):
                continue
            rel = path[len(group) + 1 :] if group else path
            entry = f"{rel}/.zarray" if rel else ".zarray"
            if entry in entries:
                entries[entry] = zarray
                changed = True
        if changed:
            meta_out[key] = dump_json(doc)


def _metadata_order(key: str) -> tuple[int, int, str]:
    """Deepest documents first, and in each directory ``.zarray`` / ``.zgroup`` last."""
    name = key.rpartition("/")[2]
    return (-key.count("/"), name in (".zarray", ".zgroup"), key)
