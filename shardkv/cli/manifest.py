"""The progress manifest of ``shardkv convert`` / ``unshard``: what an interrupted run already finished.

A run writes its manifest (:data:`MANIFEST_KEY` for convert,
:data:`UNSHARD_MANIFEST_KEY` for unshard) at the root of its destination
before its first shard, rewrites it as tasks finish (at most every
:data:`FLUSH_SECONDS`, and at the end), and deletes it when the run has
completed (metadata written last). A destination that holds the manifest is
an unfinished run: running the same command again (same source, same
options) skips the shards recorded as finished, after reading back and
checking the last ones recorded (the ones most likely to have been cut short
by the interruption).

The manifest stays small whatever the number of shards: per
array, one bit per position of its shard grid and the totals of the shards
recorded; the last :data:`LAST_KEPT` shards recorded are kept by key.

Format (msgpack map)::

    {"version": 2, "src": str, "options": {...},
     "arrays": {path: {"bits": bytes, "shards": int, "nbytes": int, "nbytes_read": int, "chunks": int}, ...},
     "last": [[path, shard_index, shard_key, nbytes, nbytes_read], ...],
     "flags": {"all_v3": true, ...}}

``flags`` (optional) are the command's switches that do not shape the shards
(``--all-v3``, ``--skip-mismatched``): not compared on resume, kept so that
``info`` and ``verify`` on an unfinished destination can say the exact command
that resumes it (:func:`find_unfinished`).

``shard_index`` is the shard's position in its array's shard grid (C order);
``nbytes`` the bytes written for it, ``nbytes_read`` the bytes read for it;
``chunks`` (optional, 0 when absent) the chunk objects written for the
recorded shards (``unshard``), so a resumed run reports the whole job.
"""

from __future__ import annotations

import shlex
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

from shardkv.cli.errors import ManifestMismatchError
from shardkv.cli.stores import delete_all, put_all, remove_everything
from shardkv.errors import ShardKVError
from shardkv.storage.kv import KVStore

__all__ = [
    "MANIFEST_KEY",
    "UNSHARD_MANIFEST_KEY",
    "FLUSH_SECONDS",
    "LAST_KEPT",
    "ArrayProgress",
    "Manifest",
    "open_destination",
    "verify_last",
    "UnfinishedRun",
    "find_unfinished",
]

MANIFEST_KEY = ".shardkv-convert-progress"
"""Key of the convert manifest in the destination (removed when the conversion completes)."""

UNSHARD_MANIFEST_KEY = ".shardkv-unshard-progress"
"""Key of the unshard manifest in the destination (removed when the run completes)."""

FLUSH_SECONDS = 0.5
"""Least time between two rewrites of the manifest while tasks finish."""

LAST_KEPT = 256
"""Shards recorded most recently, kept by key (the candidates for a read-back on resume)."""

_VERSION = 2


@dataclass
class ArrayProgress:
    """The shards of one array recorded as finished: a bit per shard-grid position and their totals."""

    bits: bytearray = field(default_factory=bytearray)
    shards: int = 0
    nbytes: int = 0
    nbytes_read: int = 0
    chunks: int = 0

    def __contains__(self, index: int) -> bool:
        byte = index >> 3
        return byte < len(self.bits) and bool(self.bits[byte] & (1 << (index & 7)))

    def add(self, index: int, nbytes: int, nbytes_read: int, chunks: int = 0) -> None:
        byte = index >> 3
        if byte >= len(self.bits):
            self.bits.extend(bytes(byte + 1 - len(self.bits)))
        if not self.bits[byte] & (1 << (index & 7)):
            self.bits[byte] |= 1 << (index & 7)
            self.shards += 1
            self.nbytes += nbytes
            self.nbytes_read += nbytes_read
            self.chunks += chunks

    def remove(self, index: int, nbytes: int, nbytes_read: int) -> None:
        if index in self:
            self.bits[index >> 3] &= ~(1 << (index & 7)) & 0xFF
            self.shards -= 1
            self.nbytes -= nbytes
            self.nbytes_read -= nbytes_read


class Manifest:
    """The progress of one run, kept in its destination.

    Parameters
    ----------
    store : KVStore
        The destination.
    src : str
        The source, as named (a resumed run must name the same).
    options : mapping
        The options that shape the output (chunks per shard, index options).
    key : str
        Where the manifest is kept in the destination.
    """

    def __init__(
        self,
        store: KVStore,
        src: str,
        options: Mapping[str, Any],
        key: str = MANIFEST_KEY,
        flags: Mapping[str, bool] | None = None,
    ) -> None:
        self.store = store
        self.src = src
        self.options = dict(options)
        self.key = key
        self.flags = {k: True for k, v in (flags or {}).items() if v}
        self.arrays: dict[str, ArrayProgress] = {}
        self.last: deque[tuple[str, int, str, int, int]] = deque(maxlen=LAST_KEPT)
        self._last_flush = 0.0

    @property
    def n_shards(self) -> int:
        """Shards recorded as finished."""
        return sum(a.shards for a in self.arrays.values())

    def progress(self, path: str) -> ArrayProgress:
        """The recorded shards of the array at ``path`` (empty when none is)."""
        return self.arrays.setdefault(path, ArrayProgress())

    def is_done(self, path: str, index: int) -> bool:
        """True when the shard at ``index`` of the array at ``path`` is recorded as finished."""
        progress = self.arrays.get(path)
        return progress is not None and index in progress

    @classmethod
    def load(
        cls, store: KVStore, src: str, options: Mapping[str, Any], dst_name: str, key: str = MANIFEST_KEY
    ) -> Manifest | None:
        """The manifest left in ``store`` by an interrupted run, or ``None`` when there is none.

        Raises
        ------
        ManifestMismatchError
            If it records another source or other options, or cannot be decoded.
        """
        raw = store.values([key]).get(key)
        if raw is None:
            return None
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            version = doc["version"]
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            raise ManifestMismatchError(f"{dst_name}/{key} cannot be read ({exc}); use --overwrite") from None
        if version != _VERSION or doc.get("src") != src or doc.get("options") != dict(options):
            what = "conversion" if key == MANIFEST_KEY else "unshard"
            raise ManifestMismatchError(
                f"{dst_name} holds an unfinished {what} of {doc.get('src')} with options {doc.get('options')} "
                f"(manifest version {version}); this one is of {src} with options {dict(options)} "
                "(run that one again, or use --overwrite)"
            )
        manifest = cls(store, src, options, key)
        try:
            for path, entry in doc["arrays"].items():
                manifest.arrays[str(path)] = ArrayProgress(
                    bytearray(entry["bits"]),
                    int(entry["shards"]),
                    int(entry["nbytes"]),
                    int(entry["nbytes_read"]),
                    int(entry.get("chunks", 0)),
                )
            for path, index, shard_key, nbytes, nbytes_read in doc["last"]:
                manifest.last.append((str(path), int(index), str(shard_key), int(nbytes), int(nbytes_read)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestMismatchError(f"{dst_name}/{key} cannot be read ({exc!r}); use --overwrite") from None
        return manifest

    def record(self, path: str, index: int, shard_key: str, nbytes: int, nbytes_read: int, chunks: int = 0) -> None:
        """Record one finished shard (``chunks``: chunk objects written for it); rewrite the manifest if it is due."""
        self.progress(path).add(index, int(nbytes), int(nbytes_read), int(chunks))
        self.last.append((path, index, shard_key, int(nbytes), int(nbytes_read)))
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the manifest now."""
        arrays = {
            p: {
                "bits": bytes(a.bits),
                "shards": a.shards,
                "nbytes": a.nbytes,
                "nbytes_read": a.nbytes_read,
                "chunks": a.chunks,
            }
            for p, a in self.arrays.items()
        }
        doc = {
            "version": _VERSION,
            "src": self.src,
            "options": self.options,
            "arrays": arrays,
            "last": [list(entry) for entry in self.last],
            "flags": self.flags,
        }
        put_all(self.store, {self.key: msgpack.packb(doc, use_bin_type=True)})
        self._last_flush = time.monotonic()

    def remove(self) -> None:
        """Delete the manifest (the run has completed)."""
        delete_all(self.store, [self.key])


def open_destination(
    target: KVStore,
    dst_name: str,
    src_name: str,
    options: Mapping[str, Any],
    overwrite: bool,
    key: str = MANIFEST_KEY,
    flags: Mapping[str, bool] | None = None,
) -> Manifest | None:
    """The manifest of a new run (the destination emptied first with ``overwrite``), or of the
    same unfinished run found in the destination; ``None`` when the destination holds
    other keys (the caller refuses it).

    Raises
    ------
    ManifestMismatchError
        If the destination holds the manifest of another run.
    """
    if next(iter(target.list_prefix("")), None) is not None:
        if overwrite:
            remove_everything(target)
        else:
            found = Manifest.load(target, src_name, options, dst_name, key)  # None: not empty, nothing to resume
            if found is not None:
                found.flags = {k: True for k, v in (flags or {}).items() if v}
            return found
    manifest = Manifest(target, src_name, options, key, flags)
    manifest.flush()  # before the first shard: an interrupted run is resumable from here on
    return manifest


def verify_last(
    target: KVStore, manifest: Manifest, path: str, n_last: int, check: Callable[[str, int, bytes], bool]
) -> int:
    """Read back the shards of ``path`` among the last ``n_last`` recorded; forget the ones that fail.

    Parameters
    ----------
    target : KVStore
        The destination.
    manifest : Manifest
    path : str
        The array whose shards are checked now.
    n_last : int
        How many of the most recent records are candidates (all arrays together).
    check : callable
        ``check(shard_key, shard_index, blob) -> bool``: True when the blob read back is
        the complete shard (a :class:`~shardkv.errors.ShardKVError` it raises counts as False).

    Returns
    -------
    int
        Shards of ``path`` read back.
    """
    recent = list(manifest.last)[-n_last:] if n_last else []
    mine = [entry for entry in recent if entry[0] == path and manifest.is_done(path, entry[1])]
    if not mine:
        return 0
    blobs = target.values([entry[2] for entry in mine])
    progress = manifest.progress(path)
    for _, index, key, nbytes, nbytes_read in mine:
        blob = blobs.get(key)
        try:
            good = blob is not None and len(blob) == nbytes and check(key, index, bytes(blob))
        except ShardKVError:
            good = False
        if not good:
            progress.remove(index, nbytes, nbytes_read)
    return len(mine)


@dataclass(frozen=True)
class UnfinishedRun:
    """An interrupted ``convert`` or ``unshard`` whose manifest a destination holds.

    Attributes
    ----------
    command : {"convert", "unshard"}
        The run that was interrupted.
    src : str or None
        Its source as it was named; ``None`` when the manifest cannot be read.
    options : dict
        The options that shaped its output (chunks per shard, index options).
    flags : dict of str to bool
        Its switches that did not (``all_v3``, ``skip_mismatched``).
    shards : int
        Shards recorded as finished.
    arrays : int
        Arrays with a shard recorded.
    """

    command: Literal["convert", "unshard"]
    src: str | None
    options: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)
    shards: int = 0
    arrays: int = 0

    def resume_command(self, dst: str) -> str:
        """The command line that resumes the run into ``dst`` (with ``--overwrite`` when its manifest is unreadable)."""
        if self.src is None:
            return f"shardkv {self.command} SRC {shlex.quote(dst)} ... --overwrite (its manifest cannot be read)"
        words = ["shardkv", self.command, self.src, dst]
        if self.command == "convert":
            cps = self.options.get("chunks_per_shard")
            words += ["--chunks-per-shard", ",".join(map(str, cps)) if isinstance(cps, list) else str(cps)]
            if self.options.get("index_location", "end") != "end":
                words += ["--index-location", str(self.options["index_location"])]
            if self.options.get("index_checksum", True) is False:
                words.append("--no-checksum")
            words += [f"--{name.replace('_', '-')}" for name in sorted(self.flags) if self.flags[name]]
        command = " ".join(shlex.quote(w) for w in words)
        if "://" in self.src or "://" in dst:
            command += " (with the --storage-options it was given, if any)"
        return command

    def describe(self, dst: str) -> str:
        """One line: what is unfinished in ``dst`` and the command that resumes it."""
        what = "a conversion" if self.command == "convert" else "an unshard"
        source = f" from {self.src}" if self.src is not None else ""
        return (
            f"{dst} holds {what}{source} in progress, interrupted with {self.shards} shards of "
            f"{self.arrays} arrays finished; resume it with: {self.resume_command(dst)}"
        )


def find_unfinished(store: KVStore) -> UnfinishedRun | None:
    """The interrupted ``convert`` or ``unshard`` whose manifest ``store`` holds, or ``None`` (one batched read)."""
    found = store.values([MANIFEST_KEY, UNSHARD_MANIFEST_KEY])
    runs: tuple[tuple[str, Literal["convert", "unshard"]], ...] = (
        (MANIFEST_KEY, "convert"),
        (UNSHARD_MANIFEST_KEY, "unshard"),
    )
    for key, command in runs:
        raw = found.get(key)
        if raw is None:
            continue
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            arrays = doc["arrays"]
            return UnfinishedRun(
                command,
                str(doc["src"]),
                dict(doc.get("options") or {}),
                {str(k): bool(v) for k, v in (doc.get("flags") or {}).items()},
                sum(int(a["shards"]) for a in arrays.values()),
                sum(1 for a in arrays.values() if int(a["shards"])),
            )
        except (ValueError, KeyError, TypeError, AttributeError, msgpack.UnpackException):
            return UnfinishedRun(command, None)
    return None
