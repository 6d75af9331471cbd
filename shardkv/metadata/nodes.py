"""The node table every facade keeps its nodes in: nodes by path, their generation, the owner walk. Pure.

Each facade builds its own kind of node from the document it reads at a path
(``proxy/nodes.py``, ``proxy/draft_nodes.py``, ``zarr3/nodes.py``); what they
share is here once. The table does no I/O: :meth:`NodeCache.walk` stops at the
first path not read yet and names it, the facade reads it its own way
(blocking, or awaited on zarr's event loop), keeps it with
:meth:`NodeCache.load` and walks again; :meth:`NodeCache.first` is that loop
for a blocking read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, NamedTuple, TypeVar

N = TypeVar("N")


class Walked(NamedTuple, Generic[N]):
    """Where an owner walk stopped: at ``unread``, the first path not read yet, or at the deciding ``node``.

    ``unread`` is ``None`` when the walk is done; ``path`` and ``node`` are
    ``None`` when no node on it decides.
    """

    unread: str | None = None
    path: str | None = None
    node: N | None = None


class NodeCache(Generic[N]):
    """Nodes of one kind by path (``""`` is the root), with the generation of their owners.

    Attributes
    ----------
    generation : int
        Counts the changes that may change a key's owner (a node :meth:`set`,
        forgotten or cleared; not one :meth:`load` keeps after its first read).
        A memo of owners is valid while it stays the same.
    lock : threading.RLock
        Guards the nodes (thread-safe; racing threads may read a node twice).
    """

    def __init__(self) -> None:
        self._nodes: dict[str, N] = {}
        self.lock = threading.RLock()
        self.generation = 0

    def kept(self, paths: Iterable[str]) -> dict[str, N]:
        """The nodes kept at ``paths`` (paths not read yet are left out)."""
        with self.lock:
            return {p: self._nodes[p] for p in paths if p in self._nodes}

    def unread(self, paths: Iterable[str]) -> list[str]:
        """The paths among ``paths`` whose nodes are not kept yet, in order, each once."""
        with self.lock:
            return [p for p in dict.fromkeys(paths) if p not in self._nodes]

    def load(self, nodes: Mapping[str, N], since: int | None = None) -> dict[str, N]:
        """Keep nodes just read (what the paths already were: owners do not change); the nodes to answer with.

        Parameters
        ----------
        nodes : mapping of str to node
            Path -> the node read there.
        since : int, optional
            :attr:`generation` when the reads began. If it has moved since, a
            write or a delete ran meanwhile and the reads may predate it:
            nothing is kept (the next use reads again), and a node kept
            meanwhile (set by that write) answers instead of the one read.
        """
        with self.lock:
            if since is None or since == self.generation:
                self._nodes.update(nodes)
                return dict(nodes)
            return {p: self._nodes.get(p, node) for p, node in nodes.items()}

    def set(self, path: str, node: N) -> None:
        """Record what ``path`` now is (written through the facade: owners may change)."""
        with self.lock:
            self._nodes[path] = node
            self.generation += 1

    def forget(self, path: str) -> None:
        """Forget the node at ``path`` (read again on next use)."""
        with self.lock:
            self._nodes.pop(path, None)
            self.generation += 1

    def forget_under(self, path: str) -> None:
        """Forget the node at ``path`` and every node below it (every node for ``""``)."""
        with self.lock:
            for p in [p for p in self._nodes if not path or p == path or p.startswith(f"{path}/")]:
                del self._nodes[p]
            self.generation += 1

    def clear(self) -> None:
        """Forget every node."""
        with self.lock:
            self._nodes.clear()
            self.generation += 1

    def walk(self, paths: Iterable[str], decides: Callable[[N], bool]) -> Walked[N]:
        """The first node among ``paths`` (from the highest down) that ``decides``, or the first path not read.

        Parameters
        ----------
        paths : iterable of str
            The paths that could own a key, from the highest down
            (:func:`shardkv.keys.paths.chunk_owner_paths` and its kin).
        decides : callable
            True for a node that settles the walk (an array, in the owner
            rule); the others are passed over.
        """
        with self.lock:
            for path in paths:
                if path not in self._nodes:
                    return Walked(unread=path)
                node = self._nodes[path]
                if decides(node):
                    return Walked(path=path, node=node)
        return Walked()

    def first(self, paths: Sequence[str], decides: Callable[[N], bool], read: Callable[[str], N]) -> Walked[N]:
        """:meth:`walk` to the end, reading each node not kept yet with ``read`` (path -> node, blocking).

        Nodes are read one at a time, only up to the first that decides: a
        chunk of ``g/arr`` costs the read of ``g/arr`` alone. Each round reads
        one more path (or reads one again that a write changed while it was
        read); only nodes changed by other threads as fast as they are read
        outlast the rounds, and then none decides.
        """
        for _ in range(2 * len(paths) + 1):
            walked = self.walk(paths, decides)
            if walked.unread is None:
                return walked
            since = self.generation
            self.load({walked.unread: read(walked.unread)}, since)
        return Walked()
