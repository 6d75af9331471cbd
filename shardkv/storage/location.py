"""Where a base store keeps its data: the identity that locks and generations belong to.

Two stores over the same data (two fsspec mappers of one directory, a path and
a zarr ``DirectoryStore``) must share their per-shard locks and process
stamps, so a :class:`StoreLocation` names the data, not the object: a
``namespace`` in which paths are unique (``("file",)``, ``("memory",)``,
``("s3", endpoint_url)``, ``("mapping", id(mapping))``) and the store's
``root`` inside it. Locks are chosen by the full path (``root/key``), so
stores whose roots nest lock a shard alike. Pure: no I/O beyond
``os.path.realpath`` of a local root.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoreLocation:
    """The identity of a base store's data.

    Parameters
    ----------
    namespace : tuple of hashable
        The backend in which paths are unique (see the module docstring).
    root : str
        The store root inside the namespace, without a trailing ``/``.
    local_dir : str or None
        The absolute directory of the root when the data lives on a file system
        that the operating system mounts (cross-process file locks can live there).
    """

    namespace: tuple[Hashable, ...]
    root: str
    local_dir: str | None = None

    def full_path(self, key: str) -> str:
        """The path of ``key`` inside the namespace (``root/key``)."""
        return f"{self.root}/{key}" if self.root else key


def fs_location(fs: Any, root: str) -> StoreLocation:
    """The location of ``root`` inside an fsspec filesystem ``fs``.

    Local paths are resolved (``realpath``) so that symlinked and relative
    spellings of one directory are one location. Object stores add their
    endpoint to the namespace, so one bucket name on two servers is two locations.
    """
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    protocol = protocols[0]
    inner, prefix = getattr(fs, "fs", None), getattr(fs, "path", None)
    if protocol == "dir" and inner is not None and isinstance(prefix, str):  # DirFileSystem: its target
        return fs_location(inner, fs._join(root))
    stripped = fs._strip_protocol(root).rstrip("/")
    if "file" in protocols or "local" in protocols:
        real = os.path.realpath(stripped or "/")
        return StoreLocation(("file",), real, real)
    if protocol == "memory":
        return StoreLocation(("memory",), stripped)
    extra: Hashable = None
    client_kwargs = getattr(fs, "client_kwargs", None) or {}
    endpoint = getattr(fs, "endpoint_url", None) or client_kwargs.get("endpoint_url")
    if endpoint is not None:
        extra = str(endpoint)
    return StoreLocation((str(protocol), extra), stripped)
