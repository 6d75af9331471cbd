"""The node table every facade keeps its nodes in: nodes by path, their generation, the owner walk. Pure.

docs/architecture.md, "The node table": no I/O here; :meth:`NodeCache.walk`
names the first path not read yet and the facade reads it its own way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, NamedTuple, TypeVar

N = TypeVar("N")


class Walked(NamedTuple, Generic[N]):
    """Where an owner walk stopped: at ``unread`` (the first path not read, ``None`` once done) or the deciding node."""

    unread: str | None = None
    path: str | None = None
    node: N | None = None


class NodeCache(Generic[N]):
    """Nodes of one kind by path (``""`` is the root), thread-safe.

    ``generation`` counts the changes that may change a key's owner (a node
    :meth:`set` or forgotten; not a first :meth:`load`): a memo of
    owners is valid while it stays the same.
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
        """Keep ``nodes`` just read (path -> node); the nodes to answer with.

        If :attr:`generation` has moved ``since`` the reads began, they may
        predate a write: nothing is kept, and a node set meanwhile answers instead.
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

    def walk(self, paths: Iterable[str], decides: Callable[[N], bool]) -> Walked[N]:
        """The first node among ``paths`` (owner paths, highest first) that ``decides``, or the first path not read."""
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

        One node per round, up to the first that decides; only nodes other
        threads change as fast as they are read outlast the rounds (none decides).
        """
        for _ in range(2 * len(paths) + 1):
            walked = self.walk(paths, decides)
            if walked.unread is None:
                return walked
            since = self.generation
            self.load({walked.unread: read(walked.unread)}, since)
        return Walked()
