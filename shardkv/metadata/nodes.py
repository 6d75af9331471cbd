"""The node table every facade asks: nodes kept by path, their generation, the owner walk. Pure.

A facade (the zarr 2 proxy, the 2022 draft proxy, the zarr 3 store) learns
what each path of a hierarchy is from a document it reads there, and builds
its own kind of node from it (v2 documents presented from a v3 one, a draft
array with its transformer stack, a stored sharded document presented
unsharded). What they share is kept here once:

* the nodes by path, read once and kept until forgotten (:meth:`NodeCache.forget`,
  :meth:`NodeCache.forget_under`, :meth:`NodeCache.clear`);
* the :attr:`NodeCache.generation`, which counts the changes that may change
  which array owns a key, so that a facade's memos of owners know when they
  are stale;
* the owner walk of :mod:`shardkv.keys.paths`: among the paths that could own
  a key (from the highest down), the first node that decides it.

The table does no I/O. The walk (:meth:`NodeCache.walk`) stops at the first
path whose node is not kept yet and names it; the facade reads that node its
own way (the proxies with a blocking read, the zarr 3 store with an ``await``
of zarr's ``Store.get`` on its event loop), keeps it (:meth:`NodeCache.load`)
and walks again. :meth:`NodeCache.first` is that loop for a blocking read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["NodeCache", "Walked"]

N = TypeVar("N")


@dataclass(frozen=True)
class Walked(Generic[N]):
    """Where an owner walk stopped.

    Attributes
    ----------
    unread : str or None
        The first path of the walk whose node is not kept yet (read it, then
        walk again); ``None`` when the walk is done.
    path : str or None
        The path of the node that decides (``None``: no node on the walk does).
    node : N or None
        That node.
    """

    unread: str | None = None
    path: str | None = None
    node: N | None = None


class NodeCache(Generic[N]):
    """Nodes of one kind by path (``""`` is the root), with the generation of their owners.

    Attributes
    ----------
    generation : int
        Counts the changes that may change a key's owner (a node recorded with
        :meth:`set`, forgotten or cleared; not a node read for the first time
        with :meth:`load`, which only learns what was already there). A memo of
        owners is valid while it stays the same.
    lock : threading.RLock
        Guards the nodes; a facade may hold it to read several nodes and the
        generation together.

    Notes
    -----
    Thread-safe. A node read by racing threads may be read twice and loaded
    twice (the same node).
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

    def load(self, nodes: Mapping[str, N]) -> None:
        """Keep nodes just read (what the paths already were: owners do not change)."""
        with self.lock:
            self._nodes.update(nodes)

    def set(self, path: str, node: N) -> None:
        """Record what ``path`` now is (written through the facade: owners may change)."""
        with self.lock:
            self._nodes[path] = node
            self.generation += 1

    def set_default(self, path: str, node: N) -> None:
        """Record ``node`` at ``path`` unless a node is kept there already (owners may change)."""
        with self.lock:
            self._nodes.setdefault(path, node)
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
            The paths that could own a key, from the highest down (as
            :func:`shardkv.keys.paths.chunk_owner_paths`,
            :func:`~shardkv.keys.paths.prefix_owner_paths` or
            :func:`~shardkv.keys.paths.owner_candidates` give them).
        decides : callable
            True for a node that settles the walk (an array, in the owner
            rule); the nodes that do not are passed over.

        Returns
        -------
        Walked
            ``unread`` set when a path before the deciding node is not kept
            yet (nothing after it is looked at); else the deciding node and
            its path, or neither when no node decides.
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

        The nodes are read one at a time, from the highest down, and only up
        to the first that decides: a chunk of ``g/arr`` costs the read of
        ``g/arr`` alone.

        Each round reads one more path, so ``len(paths) + 1`` rounds end the
        walk; only nodes forgotten by other threads as fast as they are read
        could outlast them, and then no node decides (as before they were
        written).
        """
        for _ in range(len(paths) + 1):
            walked = self.walk(paths, decides)
            if walked.unread is None:
                return walked
            self.load({walked.unread: read(walked.unread)})
        return Walked()
