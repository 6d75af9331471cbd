"""The run of ``shardkv convert`` (:func:`convert`): pack every array of a Zarr v2 hierarchy into shards.

Chunks are moved as stored: their bytes are never decoded or re-encoded,
only placed side by side in shards (v1.0 ``sharding_indexed`` layout, see
:class:`shardkv.format.layout.ShardLayout`). The result is exactly what
:class:`shardkv.ShardedStore` would have written had the arrays been created
through it: the same shards under the same keys and the same documents
(:func:`shardkv.cli.convert.meta.store_as_v3`). Each sharded array is stored
as a Zarr v3 array and nothing else (its ``zarr.json``, attributes inside, no
``.zarray``/``.zattrs``); the hierarchy is then v3 all the way down, as the
proxy keeps it: every group a v3 group, every unsharded array a ``zarr.json``
mirror beside its kept ``.zarray``/``.zattrs``, and a consolidated
``.zmetadata`` that zarr-python 2 without shardkv cannot misread.

Rules
-----
* ``chunks_per_shard`` as an int applies along every dimension of every
  array; as a tuple it applies to arrays with that many dimensions only, and
  the others are copied unsharded (the report says which and why). A tuple
  that fits no array at all is an error
  (:class:`~shardkv.cli.errors.ChunksPerShardMismatchError`) unless
  ``skip_mismatched``. 0-d arrays are copied unsharded too, and so are the
  arrays already sharded of a hierarchy that also stores v2 arrays; in a
  hierarchy of v3 documents only they are resharded
  (:class:`~shardkv.cli.convert.v3_job.V3Job`).
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

* Shards are written by shard-aligned tasks (:mod:`shardkv.cli.convert.tasks`),
  here or in parallel (``workers``, ``scheduler``); a progress manifest
  (:mod:`shardkv.cli.manifest`) in the destination lets the same conversion,
  run again after an interruption, skip the shards already finished.

Memory: the source is listed lazily, array by array
(:mod:`shardkv.cli.convert.listing`: groups walked directory by directory, an
array's keys streamed once into a bitmap of one bit per chunk-grid position),
never held as a list of keys; tasks are made one shard at a time and at most
a few per worker are in flight (:func:`shardkv.cli.convert.tasks.execute`);
one shard's chunks are read with one batched ``get_many``; finished shards are
written in batches; other keys are copied ``_COPY_BATCH_KEYS`` at a time; the
progress manifest keeps a bit per shard. Peak memory is bounded by the shards
in flight, not by the number of chunks.

Nothing is dropped: an array whose sharded form shardkv could not
read back (an object dtype, for example) is copied unsharded, a node named
like shardkv's own files is refused
(:class:`~shardkv.cli.errors.ReservedNameError`), and the finished output is
checked to present every array and group of the source to zarr-python 2
through shardkv and to zarr-python 3 opening the root
(:func:`shardkv.metadata.all_v3.zarr3_unreachable`), except the arrays no v3
reader decodes, which the report names
(:class:`~shardkv.cli.errors.ConversionIncompleteError` otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardkv._types import BytesLike
from shardkv.cli.convert.plan import ChunksPerShard
from shardkv.cli.convert.report import ArrayReport, ConvertReport
from shardkv.cli.convert.run import _Job
from shardkv.cli.convert.v3_job import V3Job
from shardkv.cli.convert.v3_listing import is_v3_root
from shardkv.cli.errors import DestinationNotEmptyError, SameLocationError
from shardkv.cli.info_draft import is_draft
from shardkv.cli.stores import open_store, refuse_regular_file
from shardkv.cli.view import HierarchyView
from shardkv.errors import ConfigurationError, MetadataError
from shardkv.format.layout import IndexLocation, ShardLayout
from shardkv.metadata.chunks_per_shard import check_chunks_per_shard
from shardkv.metadata.documents import ZARR_JSON, load_object
from shardkv.storage.kv import KVStore

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

TASK_CHUNKS = 256  # source chunks per shard-aligned task (whole shards; at least one shard)


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


# -- I/O helpers -----------------------------------------------------------------


def _name(store: Any) -> str:
    return store if isinstance(store, str) else repr(store) if not hasattr(store, "__fspath__") else str(store)


def _check_distinct(src: KVStore, dst: KVStore, src_name: str, dst_name: str) -> None:
    """Refuse a source and destination that are one store, or of which one lies inside the other.

    Raises
    ------
    SameLocationError
    """
    a, b = src.location, dst.location
    if src is dst or (a.namespace == b.namespace and a.root.rstrip("/") == b.root.rstrip("/")):
        raise SameLocationError(f"source and destination are the same store ({src_name})")
    if a.namespace != b.namespace:
        return
    ra, rb = a.root.rstrip("/"), b.root.rstrip("/")
    if not ra or not rb or rb.startswith(ra + "/") or ra.startswith(rb + "/"):
        raise SameLocationError(f"source {src_name} and destination {dst_name} overlap (one lies inside the other)")


def _is_array_document(raw: BytesLike) -> bool:
    try:
        return load_object(ZARR_JSON, raw).get("node_type") == "array"
    except MetadataError:
        return False  # reported by the job that reads it


def _stores_v2_arrays(source: KVStore) -> bool:
    """A Zarr v2 root, or a hierarchy shardkv stored as v3 with v2 arrays in it (a ``.zarray`` stored beside a
    ``zarr.json`` of the ``v2`` chunk key encoding); a hierarchy of v3 documents only is converted as Zarr v3.
    A root array (a ``zarr.json`` of an array, no ``.zarray``) has no nodes below it: nothing is listed."""
    root = source.values([".zgroup", ".zarray", ZARR_JSON])
    if ".zgroup" in root or ".zarray" in root:
        return True
    if ZARR_JSON in root and _is_array_document(root[ZARR_JSON]):
        return False
    zarr_jsons: list[str] = []
    zarrays: set[str] = set()
    for key in source.list_prefix(""):
        path, _, name = key.rpartition("/")
        if name == "zarr.json":
            zarr_jsons.append(path)
        elif name == ".zarray":
            zarrays.add(path)
    nodes = HierarchyView(source).nodes(p for p in zarr_jsons if p in zarrays).values()
    return any(((n.doc or {}).get("chunk_key_encoding") or {}).get("name") == "v2" for n in nodes)


# -- the conversion ----------------------------------------------------------------


def convert(
    src: Any,
    dst: Any,
    chunks_per_shard: ChunksPerShard | Sequence[int],
    index_location: IndexLocation = "end",
    index_checksum: bool = True,
    progress: bool = False,
    *,
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    src_storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    skip_mismatched: bool = False,
    workers: int = 1,
    scheduler: str | None = None,
    task_chunks: int = TASK_CHUNKS,
    all_v3: bool = False,
) -> ConvertReport:
    """Copy a Zarr v2 or v3 hierarchy, packing the chunks of its arrays into shards.

    A source whose root is a v3 ``zarr.json`` is converted by
    :class:`~shardkv.cli.convert.v3_job.V3Job`: each stored chunk becomes an
    inner chunk, byte for byte (its codec chain the inner codecs), and arrays
    already sharded are resharded (their inner chunks moved to shards of
    ``chunks_per_shard`` inner chunks).

    Parameters
    ----------
    src, dst : str, os.PathLike, MutableMapping or fsspec.FSMap
        Source hierarchy and destination (an fsspec URL, a local path, or a
        store :func:`shardkv.storage.open.open_kv` accepts). ``dst`` must be
        empty, or hold the progress manifest of the same conversion (resumed).
    chunks_per_shard : int or sequence of int
        Inner chunks per shard: an int for every dimension of every array, or
        one value per dimension for the arrays with that many dimensions
        (others are copied unsharded; fitting none is an error). For an
        array already sharded (a v3 source), inner chunks of its shards per new shard.
    index_location : {"end", "start"}
        Where each shard keeps its index (v1.0 codec ``index_location``).
    index_checksum : bool
        Whether shard indexes carry a CRC32C (``crc32c`` index codec).
    progress : bool
        Show a tqdm progress bar on stderr.
    overwrite : bool
        Delete everything in ``dst`` first instead of refusing a non-empty ``dst``
        (a local ``dst`` that is a regular file is always refused).
    all_v3 : bool
        Describe the hierarchy in v3 even when no array is sharded (every array and group gets a
        ``zarr.json`` beside its kept v2 documents); once an array is sharded it is anyway.
    storage_options : mapping, optional
        fsspec options for both URLs; ``src_storage_options`` /
        ``dst_storage_options`` replace them for one side.
    skip_mismatched : bool
        Copy the arrays unsharded even when a ``chunks_per_shard`` tuple fits none of them.
    workers : int
        Local processes writing shards (1: this process). They are started the
        ``spawn`` way: call from under ``if __name__ == "__main__":`` in a script.
    scheduler : str, optional
        Address of a dask.distributed scheduler whose workers write the shards.
    task_chunks : int
        Source chunks per shard-aligned task (whole shards, at least one).

    Returns
    -------
    ConvertReport
        Arrays sharded and copied, chunks, stale chunks, objects and bytes before and after,
        shards skipped by a resumed run, the arrays zarr-python 3 does not read (``zarr2_only``).

    Raises
    ------
    ConfigurationError
        If ``chunks_per_shard``, ``index_location`` or ``workers`` is invalid, or a
        ``.zarray`` cannot be used.
    ChunksPerShardMismatchError
        If a ``chunks_per_shard`` tuple fits no array (and not ``skip_mismatched``).
    NotAHierarchyError
        If ``src`` is missing, empty or neither a Zarr v2 nor a Zarr v3 hierarchy.
    DestinationNotEmptyError, DestinationIsFileError
        If ``dst`` holds keys (and no manifest of this conversion) and ``overwrite``
        is false; if ``dst`` is a regular file.
    ManifestMismatchError
        If ``dst`` holds the manifest of another conversion.
    SameLocationError
        If ``src`` and ``dst`` overlap.
    StoreAccessError
        If a store cannot be reached or used (endpoint, bucket, credentials).
    ConversionIncompleteError
        If the output lacks a node of the source, for zarr-python 2 through shardkv or for
        zarr-python 3 opening the root (arrays no v3 reader decodes excepted).
    """
    cps = check_chunks_per_shard(chunks_per_shard)
    ShardLayout((1,), index_location, "little", index_checksum)  # validates the options
    if workers < 1 or task_chunks < 1:
        raise ConfigurationError(f"workers and task_chunks must be >= 1, got {workers} and {task_chunks}")
    src_name, dst_name = _name(src), _name(dst)
    src_opts = dict(src_storage_options if src_storage_options is not None else storage_options or {})
    dst_opts = dict(dst_storage_options if dst_storage_options is not None else storage_options or {})
    if isinstance(dst, str):
        refuse_regular_file(dst)
    source_kv, target = open_store(src, src_opts, role="source"), open_store(dst, dst_opts, role="destination")
    _check_distinct(source_kv, target, src_name, dst_name)
    draft = is_draft(source_kv)
    if draft:  # a 2022 draft hierarchy gets the draft's sharding transformer
        from shardkv.cli.convert.draft import convert_draft

        if index_location != "end" or not index_checksum:
            raise ConfigurationError(
                f"{src_name} is a 2022 draft hierarchy: its shards use the draft's fixed 'indexed' layout "
                "(index at the end, no checksum), so --index-location start / --no-checksum do not apply"
            )
        if workers > 1 or scheduler is not None:
            raise ConfigurationError(
                f"{src_name} is a 2022 draft hierarchy: it is converted in one process "
                "(--workers / --scheduler apply to Zarr v2 sources)"
            )
        return convert_draft(
            source_kv,
            target,
            cps,
            progress,
            overwrite=overwrite,
            src_name=src_name,  # type: ignore[return-value]
            dst_name=dst_name,
        )
    job_type: type[_Job] = _Job
    if _stores_v2_arrays(source_kv):  # arrays already sharded (zarr.json only) appear with a .zarray
        source = HierarchyView(source_kv)
    else:
        source = HierarchyView(source_kv, present=False)
        if is_v3_root(source):
            job_type = V3Job
    remote = workers > 1 or scheduler is not None
    if remote and not (isinstance(src, str) and isinstance(dst, str)):
        raise ConfigurationError("workers and scheduler need the source and destination as paths or URLs")
    job = job_type(source, target, src_name, dst_name, cps, index_location, index_checksum, progress)
    job.all_v3 = all_v3
    job.base = dict(
        src=src_name,
        dst=dst_name,
        src_options=src_opts,
        dst_options=dst_opts,
        index_location=index_location,
        index_checksum=index_checksum,
    )
    return job.run(overwrite, skip_mismatched, workers, scheduler, task_chunks)
