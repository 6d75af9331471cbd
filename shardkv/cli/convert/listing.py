"""The source listing of ``shardkv convert``, streamed: arrays found by walking groups, chunks as bits.

A conversion must not hold one string per chunk: a million-chunk
array listed with fsspec's ``find`` and sorted costs about a kilobyte per
chunk. This module walks the hierarchy instead:

* :func:`walk_hierarchy` visits the groups directory by directory (their
  listings are small): a directory with a ``.zarray`` is an array, one with
  anything else is walked further. Names shardkv reserves for itself
  (``*.shardkv-tmp-*``, ``.shardkv-locks``) are refused when they name an
  array or a group (:class:`~shardkv.cli.errors.ReservedNameError`), never dropped.
* :func:`list_array` then reads one array's keys once, as a stream: local
  directories with ``os.scandir`` (one directory entry at a time), S3 through
  s3fs's paginated ``ListObjectsV2`` (a page of names at a time, no per-key
  ``info`` kept), other fsspec filesystems one directory at a time
  (``fs.walk``), other stores through :meth:`KVStore.list_prefix`. Each in-grid chunk key sets
  one bit of a bitmap over the chunk grid (:class:`ChunkBitmap`); only keys
  that are neither metadata nor chunks (rare) are kept as strings.

Peak memory is therefore one bit per chunk-grid position plus the directory
entry being looked at (local) or the listing page (S3: at most
:data:`PAGE_KEYS` names), whatever the number of chunks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shardkv.cli.errors import NotAHierarchyError, ReservedNameError
from shardkv.cli.view import HierarchyView
from shardkv.errors import ConfigurationError
from shardkv.keys.paths import join_path, path_prefix
from shardkv.keys.space import ChunkKeyEncoding, Separator, V2ChunkKeyEncoding, grid_shape
from shardkv.metadata.documents import META_NAMES
from shardkv.metadata.v3_view import v2_dimension_separator
from shardkv.storage.kv import LOCK_DIR, TEMP_MARKER, hidden
from shardkv.storage.local import LocalStore

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = [
    "ChunkBitmap",
    "block_coords",
    "ArrayListing",
    "HierarchyWalk",
    "walk_hierarchy",
    "list_array",
    "iter_array_keys",
    "PAGE_KEYS",
]

_NODE_DOCUMENTS = (".zarray", ".zgroup", ".zattrs", "zarr.json")

PAGE_KEYS = 1000
"""Names taken from an S3 listing at a time (one ``ListObjectsV2`` page holds at most 1,000)."""


def _reserved(name: str) -> bool:
    return TEMP_MARKER in name or name == LOCK_DIR


class ChunkBitmap:
    """One bit per position of a chunk grid (C order): which chunks are stored.

    Parameters
    ----------
    grid : tuple of int
        Chunks along each dimension.
    """

    __slots__ = ("grid", "bits", "count", "_strides")

    def __init__(self, grid: tuple[int, ...]) -> None:
        self.grid = grid
        size = 1
        for g in grid:
            size *= g
        self.bits = bytearray((size + 7) // 8)
        self.count = 0
        strides, step = [], 1
        for g in reversed(grid):
            strides.append(step)
            step *= g
        self._strides = tuple(reversed(strides))

    def _flat(self, coords: tuple[int, ...]) -> int:
        return sum(c * s for c, s in zip(coords, self._strides, strict=True))

    def add(self, coords: tuple[int, ...]) -> None:
        """Mark the chunk at ``coords`` (in the grid) as stored."""
        flat = self._flat(coords)
        byte, bit = flat >> 3, 1 << (flat & 7)
        if not self.bits[byte] & bit:
            self.bits[byte] |= bit
            self.count += 1

    def __contains__(self, coords: tuple[int, ...]) -> bool:
        flat = self._flat(coords)
        return bool(self.bits[flat >> 3] & (1 << (flat & 7)))

    def any_in(self, lo: tuple[int, ...], hi: tuple[int, ...]) -> bool:
        """True when a chunk of the block ``lo <= coords < hi`` is stored (rows of the last dimension at once)."""
        for coords in block_coords(lo[:-1], hi[:-1]):
            start = self._flat((*coords, lo[-1]))
            stop = start + hi[-1] - lo[-1]
            for flat in range(start, stop):
                if self.bits[flat >> 3] & (1 << (flat & 7)):
                    return True
        return False


def block_coords(lo: tuple[int, ...], hi: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Every coords ``lo <= c < hi`` in C order (one empty tuple for 0 dimensions)."""
    if not lo:
        yield ()
        return
    for first in range(lo[0], hi[0]):
        for rest in block_coords(lo[1:], hi[1:]):
            yield (first, *rest)


@dataclass
class ArrayListing:
    """One array of the source, listed once.

    Attributes
    ----------
    path : str
        Array path (``""`` for a root array).
    zarray : dict
        Its ``.zarray`` document.
    separator : {".", "/"}
        Chunk key separator in use (named by ``.zarray``, or detected from the keys).
    separator_detected : bool
        True when ``.zarray`` names none and ``"/"``-separated chunk keys were found.
    chunks : ChunkBitmap
        The in-grid chunks stored.
    meta_keys : list of str
        The array's metadata documents (``.zarray``, ``.zattrs`` ...).
    stale_keys : list of str
        Chunk keys outside the chunk grid.
    other_keys : list of str
        Keys in the array's directory that are neither metadata nor chunks.
    encoding : ChunkKeyEncoding or None
        The keys of chunks and shards (a v3 array's ``chunk_key_encoding``); ``None``: v2 keys with ``separator``.
    """

    path: str
    zarray: dict[str, Any]
    separator: Separator
    separator_detected: bool
    chunks: ChunkBitmap
    meta_keys: list[str] = field(default_factory=list)
    stale_keys: list[str] = field(default_factory=list)
    other_keys: list[str] = field(default_factory=list)
    encoding: ChunkKeyEncoding | None = None

    @property
    def key_encoding(self) -> ChunkKeyEncoding:
        """The encoding of the array's chunk keys, and of its shard keys once sharded."""
        return self.encoding or V2ChunkKeyEncoding(self.separator)

    @property
    def ndim(self) -> int:
        return len(self.zarray["shape"])

    @property
    def n_chunks(self) -> int:
        """In-grid chunks stored."""
        return self.chunks.count

    def chunk_key(self, coords: tuple[int, ...]) -> str:
        """The stored key of the chunk at ``coords``."""
        return path_prefix(self.path) + self.key_encoding.encode(coords)


@dataclass
class HierarchyWalk:
    """The nodes of a Zarr v2 hierarchy, found by walking its groups.

    Attributes
    ----------
    arrays : dict of str to dict
        Array path -> its ``.zarray`` document, in path order.
    groups : list of str
        Group paths (directories holding node metadata but no ``.zarray``).
    group_keys : list of str
        Keys outside every array (group metadata and other files).
    """

    arrays: dict[str, dict[str, Any]]
    groups: list[str]
    group_keys: list[str]


class _Lister:
    """Directory listings of the source: local ``os.scandir``, an fsspec file system's ``ls``, or ``list_dir``."""

    def __init__(self, source: HierarchyView) -> None:
        self.source = source
        kv = source.kv
        self.root: str | None = kv.root if isinstance(kv, LocalStore) else None
        # other fsspec filesystems (s3fs, memory://): listed unfiltered, so that shardkv's own names are seen
        fs: AbstractFileSystem | None = getattr(kv, "fs", None) if self.root is None else None
        self.fs = fs
        self.fs_root: str = str(getattr(kv, "root", "")) if fs is not None else ""

    def children(self, path: str) -> list[tuple[str, bool | None]]:
        """``(name, is_dir)`` of the entries of ``path``; ``is_dir`` is None when the store cannot tell cheaply."""
        if self.root is not None:
            try:
                with os.scandir(os.path.join(self.root, path) if path else self.root) as it:
                    names = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            except (FileNotFoundError, NotADirectoryError):
                return []
            if self.source.presents and any(n == "zarr.json" for n, _ in names):
                have = {n for n, _ in names}
                names += [(n, False) for n in self.source.documents(path) if n not in have]
            return sorted(names)
        if self.fs is not None:
            directory = f"{self.fs_root}/{path}" if path and self.fs_root else path or self.fs_root
            try:
                entries = self.fs.ls(directory, detail=False)
            except FileNotFoundError:
                entries = []
            found = {str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries}
            found |= set(self.source.list_names(path))  # documents the view presents
            return [(n, None) for n in sorted(found) if n]
        return [(n, None) for n in self.source.list_names(path)]

    def is_file(self, key: str, is_dir: bool | None) -> bool:
        if is_dir is not None:
            return not is_dir
        return self.source.contains(key)


def walk_hierarchy(source: HierarchyView, name: str) -> HierarchyWalk:
    """Find the arrays and groups of a Zarr v2 hierarchy without listing the arrays' chunks.

    Parameters
    ----------
    source : HierarchyView
        The hierarchy (presenting v3 nodes for sources whose sharded arrays are stored as v3 only).
    name : str
        How to call it in errors.

    Raises
    ------
    NotAHierarchyError
        If the store is empty, or holds no ``.zgroup`` or ``.zarray`` at its root.
    ReservedNameError
        If an array or group is named like one of shardkv's own files.
    ConfigurationError
        If a ``.zarray`` is not a JSON object with ``shape`` and ``chunks`` of one length.
    """
    lister = _Lister(source)
    arrays: dict[str, None] = {}
    pending: list[tuple[str, list[tuple[str, bool | None]]]] = []
    if source.contains(".zarray"):
        arrays[""] = None  # a root array: its directory is never listed here
    elif source.contains(".zgroup"):
        pending.append(("", lister.children("")))
    else:
        top_names = {n for n, _ in lister.children("")}
        if not top_names:
            raise NotAHierarchyError(f"{name} does not exist or is empty")
        hint = " (it has a zarr.json: Zarr v3?)" if "zarr.json" in top_names else ""
        raise NotAHierarchyError(f"{name} is not a Zarr v2 hierarchy: no .zgroup or .zarray at its root{hint}")
    groups: list[str] = []
    group_keys: list[str] = []
    while pending:
        path, entries = pending.pop()
        names = {n for n, _ in entries}
        if ".zgroup" in names or "zarr.json" in names:
            groups.append(path)
        for child, is_dir in entries:
            key = join_path(path, child)
            if lister.is_file(key, is_dir):
                if not _reserved(child):
                    group_keys.append(key)
                continue
            # a directory: an array is never listed here (its keys are streamed by list_array)
            node_docs = [n for n in _NODE_DOCUMENTS if source.contains(join_path(key, n))]
            if _reserved(child):
                if node_docs:
                    raise ReservedNameError(name, key)
                continue  # shardkv's own files (lock files, temporaries of interrupted writes)
            if ".zarray" in node_docs:
                arrays[key] = None
            else:
                pending.append((key, lister.children(key)))
    docs = source.values([join_path(p, ".zarray") for p in arrays])
    zarrays: dict[str, dict[str, Any]] = {}
    for path in sorted(arrays):
        key = join_path(path, ".zarray")
        try:
            doc = json.loads(bytes(docs[key]))
        except (KeyError, ValueError) as exc:
            raise ConfigurationError(f"cannot read {key!r} as a JSON .zarray document: {exc}", path) from exc
        if not isinstance(doc, dict) or len(doc.get("shape", ())) != len(doc.get("chunks", ())):
            raise ConfigurationError(f"{key!r}: shape and chunks are missing or differ in length", path)
        zarrays[path] = doc
    return HierarchyWalk(zarrays, sorted(groups), sorted(group_keys))


def iter_array_keys(source: HierarchyView, path: str) -> Iterator[str]:
    """Every stored key under an array's path, streamed (never a whole listing in memory on local disks).

    The keys shardkv keeps for itself (temporaries, lock files) are left out.
    Metadata documents the view presents are not included (ask for them with ``contains``).
    """
    lister = _Lister(source)
    root = lister.root
    if lister.fs is not None:
        fs = lister.fs
        base = lister.fs_root
        start = len(base) + 1 if base else 0
        for file_path in _files_under(fs, join_path(base, path) if path else base):
            key = file_path[start:]
            if key and not hidden(key):
                yield key
        return
    if root is None:
        yield from source.kv.list_prefix(path_prefix(path))
        return
    base = os.path.join(root, path) if path else root
    stack = [(base, path)]
    while stack:
        directory, prefix = stack.pop()
        try:
            it = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for entry in it:
                if _reserved(entry.name):
                    continue
                key = join_path(prefix, entry.name)
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, key))
                else:
                    yield key


def _is_s3(fs: AbstractFileSystem) -> bool:
    try:
        from s3fs import S3FileSystem
    except ImportError:
        return False
    return isinstance(fs, S3FileSystem)


def _files_under(fs: AbstractFileSystem, directory: str) -> Iterator[str]:
    """The paths of the files under ``directory`` (no protocol), streamed.

    S3: page by page of ``ListObjectsV2`` (:func:`_s3_files_under`); other
    filesystems: one directory listing at a time (``fs.walk``), which is what
    they can do lazily. Never one ``find`` of every key with its ``info``.
    """
    if _is_s3(fs):
        yield from _s3_files_under(fs, directory)
        return
    for parent, _, names in fs.walk(directory, on_error=_raise_unless_missing):
        for name in names:
            yield f"{parent.rstrip('/')}/{name}"


def _raise_unless_missing(exc: BaseException) -> None:
    """``fs.walk``'s error handler: a directory gone meanwhile lists nothing; anything else (permissions) is raised."""
    if not isinstance(exc, FileNotFoundError):
        raise exc


def _s3_files_under(fs: Any, directory: str) -> Iterator[str]:
    """``bucket/key`` of each object below ``directory``, taken :data:`PAGE_KEYS` at a time from s3fs's pager.

    ``S3FileSystem._iterdir`` fetches one ``ListObjectsV2`` page per step of
    its async generator; the info dicts of a page are dropped once their names
    are taken, so at most one page is held, however many keys the array has.

    Raises
    ------
    PermissionError, OSError
        As s3fs translates the S3 error (a missing bucket lists nothing).
    """
    import fsspec.asyn
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    bucket, key, _ = fs.split_path(directory)
    prefix = f"{key.strip('/')}/" if key else ""
    entries = fs._iterdir(bucket, delimiter="", prefix=prefix)

    async def take() -> list[str]:
        page: list[str] = []
        while len(page) < PAGE_KEYS:
            try:
                info = await entries.__anext__()
            except StopAsyncIteration:
                break
            except ClientError as exc:
                raise translate_boto_error(exc) from exc
            name = info["name"]
            if info.get("type") == "file" and not name.endswith("/"):  # "dir/" markers some tools write
                page.append(name)
        return page

    try:
        while True:
            try:
                page = fsspec.asyn.sync(fs.loop, take)
            except FileNotFoundError:  # no such bucket: nothing stored
                return
            yield from page
            if len(page) < PAGE_KEYS:
                return
    finally:
        fsspec.asyn.sync(fs.loop, entries.aclose)


def _decode(encoding: V2ChunkKeyEncoding, suffix: str, ndim: int) -> tuple[int, ...] | None:
    try:
        return encoding.decode(suffix, ndim)
    except ValueError:
        return None


def list_array(source: HierarchyView, path: str, zarray: Mapping[str, Any], meta_keys: list[str]) -> ArrayListing:
    """List one array's keys once, chunks as bits of a grid bitmap.

    ``meta_keys`` are the array's metadata documents (read by the caller).

    The separator of an array whose ``.zarray`` names none is detected from
    its keys as :func:`shardkv.cli.info.detect_separator` does: ``/``-separated
    chunk keys (zarr-python's ``NestedDirectoryStore``) mean ``"/"``.

    Raises
    ------
    ConfigurationError
        If the ``.zarray`` names an invalid separator, or names none while the
        stored chunk keys use both ``.`` and ``/``.
    """
    shape = tuple(int(s) for s in zarray["shape"])
    grid = grid_shape(shape, tuple(int(c) for c in zarray["chunks"]))
    ndim = len(shape)
    named = zarray.get("dimension_separator") is not None
    candidates: list[Separator] = [v2_dimension_separator(zarray)] if named else ([".", "/"] if ndim >= 2 else ["."])
    bitmaps = {sep: ChunkBitmap(grid) for sep in candidates}
    stale: dict[str, list[str]] = {sep: [] for sep in candidates}
    encodings = {sep: V2ChunkKeyEncoding(sep) for sep in candidates}
    prefix = path_prefix(path)
    other: list[str] = []
    for key in iter_array_keys(source, path):
        suffix = key[len(prefix) :]
        if suffix in META_NAMES:
            continue
        for sep in candidates:
            coords = _decode(encodings[sep], suffix, ndim)
            if coords is None:
                continue
            if all(c < g for c, g in zip(coords, grid, strict=True)):
                bitmaps[sep].add(coords)
            else:
                stale[sep].append(key)
            break
        else:
            other.append(key)
    if named or len(candidates) == 1:
        separator, detected = candidates[0], False
    else:
        n_dot = bitmaps["."].count + len(stale["."])
        n_slash = bitmaps["/"].count + len(stale["/"])
        if n_dot and n_slash:
            raise ConfigurationError(
                f".zarray names no dimension_separator and the stored chunk keys use both '.' "
                f"({n_dot} keys) and '/' ({n_slash} keys)",
                path,
            )
        separator, detected = ("/", True) if n_slash else (".", False)
    return ArrayListing(path, dict(zarray), separator, detected, bitmaps[separator], meta_keys, stale[separator], other)
