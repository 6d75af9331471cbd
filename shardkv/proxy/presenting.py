"""A store adapter that presents Zarr v3 nodes as Zarr v2 nodes (for zarr-python 2 through ShardedStore).

:class:`PresentingAdapter` wraps the base store adapter of a
:class:`~shardkv.ShardedStore` and serves the ``.zarray`` / ``.zattrs`` /
``.zgroup`` documents that :func:`shardkv.metadata.hierarchy.present` derives
from a v3 ``zarr.json``: the sharded arrays shardkv itself stores (issue 11:
on storage they are v3 arrays and nothing else), v3 groups, and the sharded
arrays written by zarr-python 3 or tensorstore, all by the same path. A
stored ``.zmetadata`` is presented with each sharded array's documents
(:func:`~shardkv.metadata.hierarchy.presented_zmetadata`).

Each node's ``zarr.json`` is read once and kept (opening an array costs one
request); :meth:`PresentingAdapter.forget` drops what was kept (the proxy's
``refresh``). Writes of presented documents are the proxy's job
(:mod:`shardkv.proxy.mirror`), which applies its plans with :meth:`apply`;
a write that reaches this adapter directly is refused with
:class:`~shardkv.errors.ReservedKeyError`.
"""

from __future__ import annotations

import threading
from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

from shardkv.errors import MetadataError, ReservedKeyError
from shardkv.format.ranges import ByteRange
from shardkv.keys.paths import join_path, split_key
from shardkv.metadata.documents import dump_json, load_json
from shardkv.metadata.hierarchy import ZARR_JSON, MetadataPlan, present
from shardkv.metadata.v2_view import V2View, v2_view_of_v3
from shardkv.proxy.nodes import present_stored_zmetadata
from shardkv.storage.adapters import StoreAdapter

__all__ = ["PresentingAdapter", "V3Node"]

_PRESENTED = (".zarray", ".zattrs", ".zgroup")
_ZMETADATA = ".zmetadata"


class V3Node:
    """One stored v3 ``zarr.json``: its bytes, its document and the v2 documents presenting it.

    Attributes
    ----------
    raw : bytes
        The stored bytes.
    doc : dict
        The parsed document (do not mutate).
    documents : dict of str to bytes
        ``.zarray``/``.zattrs`` or ``.zgroup``/``.zattrs`` as served; empty
        when the node cannot be presented.
    """

    __slots__ = ("raw", "doc", "documents")

    def __init__(self, path: str, raw: bytes, doc: dict[str, Any]) -> None:
        self.raw, self.doc = raw, doc
        self.documents = {
            name: dump_json(d, key=join_path(path, name), strict=name != ".zattrs")
            for name, d in present(doc, path).items()
        }


def _parse(path: str, raw: bytes | None) -> V3Node | None:
    if raw is None:
        return None
    try:
        doc = load_json(join_path(path, ZARR_JSON), raw)
    except MetadataError:
        return None
    if not isinstance(doc, dict) or doc.get("zarr_format") != 3:
        return None
    try:
        return V3Node(path, bytes(raw), doc)
    except MetadataError:
        return V3Node(path, bytes(raw), {})


def _cannot_be_stored(node: V3Node, name: str) -> bool:
    """True for a v2 document that no store holds beside a presented v3 node (no request needed).

    Only an array's ``.zattrs`` may be stored beside its ``zarr.json`` (the layout before issue 11).
    """
    return bool(node.documents) and not (name == ".zattrs" and ".zarray" in node.documents)


class PresentingAdapter(StoreAdapter):
    """A store adapter that adds the v2 documents of v3 nodes to what the base adapter holds.

    Parameters
    ----------
    inner : StoreAdapter
        The adapter over the base store; every call is passed to it, except
        reads of ``.zarray`` / ``.zattrs`` / ``.zgroup`` at a path whose
        ``zarr.json`` is a v3 node that can be presented (answered from it),
        and reads of ``.zmetadata`` (presented).

    Notes
    -----
    Thread-safe: one lock guards the kept documents; a ``zarr.json`` read by
    racing threads may be read twice (same result).
    """

    def __init__(self, inner: StoreAdapter) -> None:
        self.inner = inner
        self.supports_ranges = inner.supports_ranges
        self.round_trips = inner.round_trips
        self._nodes: dict[str, tuple[bytes | None, V3Node | None]] = {}
        self._lock = threading.RLock()

    # -- the kept documents ------------------------------------------------

    def node(self, path: str) -> V3Node | None:
        """The v3 ``zarr.json`` at ``path`` (read once, then kept), or ``None``."""
        return self._entry(path.strip("/"))[1]

    def _entry(self, path: str) -> tuple[bytes | None, V3Node | None]:
        """``(stored zarr.json bytes or None, its v3 node or None)``, read once."""
        with self._lock:
            if path in self._nodes:
                return self._nodes[path]
        key = join_path(path, ZARR_JSON)
        return self._keep(path, self.inner.get_many([key]).get(key))

    def _keep(self, path: str, raw: bytes | None) -> tuple[bytes | None, V3Node | None]:
        entry = (None if raw is None else bytes(raw), _parse(path, raw))
        with self._lock:
            self._nodes[path] = entry
        return entry

    def nodes(self, paths: Iterable[str]) -> dict[str, V3Node]:
        """The v3 nodes among ``paths`` (the ones not kept yet read in one batch)."""
        paths = sorted({p.strip("/") for p in paths})
        with self._lock:
            missing = [p for p in paths if p not in self._nodes]
        if missing:
            found = self.inner.get_many([join_path(p, ZARR_JSON) for p in missing])
            for p in missing:
                self._keep(p, found.get(join_path(p, ZARR_JSON)))
        with self._lock:
            return {p: n for p in paths if (n := self._nodes.get(p, (None, None))[1]) is not None}

    def forget(self, path: str = "") -> None:
        """Drop the kept documents of ``path`` and below (all for ``""``)."""
        path = path.strip("/")
        with self._lock:
            for p in [p for p in self._nodes if not path or p == path or p.startswith(f"{path}/")]:
                del self._nodes[p]

    def forget_node(self, path: str) -> None:
        """Drop the kept ``zarr.json`` of ``path`` alone."""
        with self._lock:
            self._nodes.pop(path.strip("/"), None)

    def _touched(self, keys: Iterable[str]) -> None:
        """Forget the nodes whose metadata ``keys`` change."""
        with self._lock:
            for key in keys:
                path, name = split_key(key)
                if name == ZARR_JSON or name in _PRESENTED:
                    self._nodes.pop(path, None)

    def apply(self, plan: MetadataPlan) -> None:
        """Write and delete what ``plan`` says (v3 documents first), keeping what was written."""
        values = {k: dump_json(doc, key=k, strict=split_key(k)[1] == ZARR_JSON) for k, doc in plan.writes.items()}
        self._touched([*values, *plan.deletes])
        if values:
            self.inner.set_many(values)
        if plan.deletes:
            self.inner.delete_many(sorted(plan.deletes))
        for key, raw in values.items():
            path, name = split_key(key)
            if name == ZARR_JSON:
                self._keep(path, raw)

    # -- presentation ------------------------------------------------------

    def _presents(self, key: str) -> bool:
        path, name = split_key(key)
        if name not in _PRESENTED:
            return False
        node = self.node(path)
        return node is not None and bool(node.documents)

    def _zmetadata(self, key: str, raw: bytes) -> bytes:
        """The stored ``.zmetadata`` with each sharded array's documents presented."""
        return present_stored_zmetadata(key, raw, lambda paths: {p: n.doc for p, n in self.nodes(paths).items()})

    def view_of(self, path: str) -> V2View | None:
        """The v2 view of the v3 node at ``path`` (documents, or why it is not presented); ``None`` if none."""
        node = self.node(path)
        return None if node is None else v2_view_of_v3(node.doc, path.strip("/"))

    # -- reads -------------------------------------------------------------

    def get(self, key: str) -> bytes:
        found = self.get_many([key])
        if key not in found:
            raise KeyError(key)
        return found[key]

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        rest: list[str] = []
        self.nodes(split_key(k)[0] for k in keys if split_key(k)[1] in _PRESENTED)  # one batch of probes
        for key in keys:
            path, name = split_key(key)
            if name == ZARR_JSON and path in self._nodes:
                raw = self._nodes[path][0]
                if raw is not None:
                    out[key] = raw
                continue
            node = self.node(path) if name in _PRESENTED else None
            if node is not None and name in node.documents:
                out[key] = node.documents[name]
            elif node is None or not _cannot_be_stored(node, name):
                rest.append(key)
        if rest:
            found = self.inner.get_many(rest)
            for key, value in found.items():
                if split_key(key)[1] == _ZMETADATA:
                    value = self._zmetadata(key, bytes(value))
                out[key] = value
        return out

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | memoryview | None]:
        return self.inner.get_ranges(requests)

    def contains(self, key: str) -> bool:
        path, name = split_key(key)
        if self._presents(key):
            node = self.node(path)
            if name in node.documents:  # type: ignore[union-attr]
                return True
            if _cannot_be_stored(node, name):  # type: ignore[arg-type]
                return False
        return self.inner.contains(key)

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        zarr_jsons: list[str] = []
        v2_meta: set[str] = set()
        for key in self.inner.iter_keys(prefix):
            path, name = split_key(key)
            if name == ZARR_JSON:
                zarr_jsons.append(path)
            elif name in _PRESENTED:
                v2_meta.add(key)
            yield key
        for path, node in self.nodes(zarr_jsons).items():
            for name in node.documents:
                if join_path(path, name) not in v2_meta:
                    yield join_path(path, name)

    def list_dir(self, path: str = "") -> list[str]:
        names = self.inner.list_dir(path)
        if ZARR_JSON in names:
            node = self.node(path)
            if node is not None:
                names = sorted(set(names) | set(node.documents))
        return names

    def size(self, key: str) -> int:
        return len(self.get(key)) if self._presents(key) else self.inner.size(key)

    def validator(self, key: str) -> Hashable:
        return self.inner.validator(key)

    def size_if_free(self, key: str) -> int | None:
        return self.inner.size_if_free(key)

    # -- writes ------------------------------------------------------------

    def _refuse_presented(self, keys: Iterable[str]) -> None:
        for key in keys:
            if self._presents(key):
                raise ReservedKeyError(
                    key, "the v2 documents of a Zarr v3 node are read-only; change its zarr.json with a v3 library"
                )

    def set_many(self, values: Mapping[str, Any]) -> None:
        self._refuse_presented(values)
        self._touched(values)
        self.inner.set_many(values)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._refuse_presented(keys)
        self._touched(keys)
        self.inner.delete_many(keys)

    def rmdir(self, path: str) -> None:
        self.forget(path)
        self.inner.rmdir(path)

    @property
    def supports_append(self) -> bool:
        return self.inner.supports_append

    def write_at(self, key: str, writes: Sequence[tuple[int, bytes]]) -> None:
        self.inner.write_at(key, writes)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # anything else a concrete adapter offers
        return getattr(self.inner, name)
