"""The progress manifest of ``shardkv convert``: what an interrupted conversion already finished.

A conversion writes :data:`MANIFEST_KEY` at the root of its destination
before its first shard, and rewrites it as tasks finish (at most every
:data:`FLUSH_SECONDS`, and at the end); it deletes it when the conversion
has completed (metadata written last). A destination that holds the manifest
is an unfinished conversion: running the same conversion again (same source,
same options) skips the shards recorded as finished, after reading back and
checking the last ones recorded (the ones most likely to have been cut short
by the interruption).

Format (msgpack map)::

    {"version": 1, "src": str, "options": {...}, "done": [[shard_key, nbytes, nbytes_read], ...]}

``done`` is in completion order.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import msgpack

from shardkv.errors import ManifestMismatchError, ShardKVError
from shardkv.format.layout import ShardLayout
from shardkv.storage.adapters import StoreAdapter

__all__ = ["MANIFEST_KEY", "FLUSH_SECONDS", "Manifest", "open_destination", "skippable_shards"]

MANIFEST_KEY = ".shardkv-convert-progress"
"""Key of the manifest in the destination (removed when the conversion completes)."""

FLUSH_SECONDS = 0.5
"""Least time between two rewrites of the manifest while tasks finish."""

_VERSION = 1


class Manifest:
    """The progress of one conversion, kept in its destination.

    Parameters
    ----------
    store : StoreAdapter
        The destination.
    src : str
        The source, as named (a resumed run must name the same).
    options : mapping
        The options that shape the shards (chunks per shard, index options).
    """

    def __init__(self, store: StoreAdapter, src: str, options: Mapping[str, Any]) -> None:
        self.store = store
        self.src = src
        self.options = dict(options)
        self.done: dict[str, tuple[int, int]] = {}  # shard key -> (shard bytes, chunk bytes read)
        self._last_flush = 0.0
        self._dirty = False

    @classmethod
    def load(cls, store: StoreAdapter, src: str, options: Mapping[str, Any], dst_name: str) -> Manifest | None:
        """The manifest left in ``store`` by an interrupted conversion, or ``None`` when there is none.

        Raises
        ------
        ManifestMismatchError
            If it records another source or other options, or cannot be decoded.
        """
        try:
            raw = store.get(MANIFEST_KEY)
        except KeyError:
            return None
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            version, done = doc["version"], doc["done"]
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            raise ManifestMismatchError(f"{dst_name}/{MANIFEST_KEY} cannot be read ({exc}); use --overwrite") from None
        if version != _VERSION or doc.get("src") != src or doc.get("options") != dict(options):
            raise ManifestMismatchError(
                f"{dst_name} holds an unfinished conversion of {doc.get('src')} with options {doc.get('options')}; "
                f"this one is of {src} with options {dict(options)} (run that one again, or use --overwrite)"
            )
        manifest = cls(store, src, options)
        manifest.done = {str(k): (int(n), int(r)) for k, n, r in done}
        return manifest

    def record(self, written: Any) -> None:
        """Record finished shards (``(shard_key, nbytes, nbytes_read)``); rewrite the manifest if it is due."""
        for key, nbytes, nbytes_read in written:
            self.done[key] = (int(nbytes), int(nbytes_read))
        self._dirty = True
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Write the manifest now."""
        doc = {"version": _VERSION, "src": self.src, "options": self.options, "done": [[k, n, r] for k, (n, r) in self.done.items()]}
        self.store.set_many({MANIFEST_KEY: msgpack.packb(doc, use_bin_type=True)})
        self._last_flush = time.monotonic()
        self._dirty = False

    def remove(self) -> None:
        """Delete the manifest (the conversion has completed)."""
        self.store.delete_many([MANIFEST_KEY])


def open_destination(
    target: StoreAdapter, dst_name: str, src_name: str, options: Mapping[str, Any], overwrite: bool
) -> Manifest | None:
    """The manifest of a new conversion (the destination emptied first with ``overwrite``), or of the
    same unfinished conversion found in the destination; ``None`` when the destination holds
    other keys (the caller refuses it).

    Raises
    ------
    ManifestMismatchError
        If the destination holds the manifest of another conversion.
    """
    if next(iter(target.iter_keys()), None) is not None:
        if overwrite:
            target.rmdir("")
        else:
            manifest = Manifest.load(target, src_name, options, dst_name)
            return manifest  # None: not empty, and no conversion to resume
    manifest = Manifest(target, src_name, options)
    manifest.flush()  # before the first shard: an interrupted run is resumable from here on
    return manifest


def skippable_shards(
    target: StoreAdapter, manifest: Manifest, planned: Mapping[str, tuple[ShardLayout, int]], n_last: int
) -> tuple[set[str], int]:
    """The shards of the manifest that can be skipped: every one recorded, except the last
    ``n_last`` recorded when they fail a read-back (missing, other size, index that does not
    decode or counts other chunks than the source holds). Returns (skippable, verified)."""
    done = [k for k in manifest.done if k in planned]
    last = done[-n_last:] if n_last else []
    skippable = set(done[: len(done) - len(last)])
    if last:
        blobs = target.get_many(last)
        for key in last:
            layout, n_chunks = planned[key]
            blob = blobs.get(key)
            if blob is None or len(blob) != manifest.done[key][0]:
                continue
            try:
                index = layout.index_of_shard(blob, key)
            except ShardKVError:
                continue
            if index.count_present() == n_chunks:
                skippable.add(key)
    return skippable, len(last)
