"""The on-disk states a power loss may leave after the local store's writes (ALICE / CrashMonkey style).

:class:`IORecorder` records, in order, what the local store hands the kernel for the files under
a directory: its two low-level writes (``_pwrite_all``, ``write_parts``: wrapped on
``shardkv.storage.local`` as tests/local_io.py does), ``fsync``/``fdatasync`` and ``ftruncate``.
:func:`crash_states` then gives, for a crash after the first ``k`` of those calls, every state
the file system may keep: per file, everything up to its last completed sync, plus any subset of
the 4 KiB blocks written since (a block not kept reads as its synced bytes, or zeros past the
synced size: XFS's unwritten extents, ext4's delayed allocations written back in any order),
at any size the file had since that sync.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 4096

Op = tuple[str, str, int, bytes]
"""``(kind, path, offset or size, data)``: ``("write", path, offset, data)``, ``("sync", path, 0, b"")``,
``("truncate", path, size, b"")``; ``path`` relative to the recorded directory."""


class IORecorder:
    """Records the local store's writes, syncs and truncations of regular files under ``root`` (see the module)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.ops: list[Op] = []

    def _path(self, fd: int) -> str | None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not path.startswith(self.root + "/"):
            return None
        return path[len(self.root) + 1 :]

    def install(self, monkeypatch: Any, local_mod: Any) -> None:
        """Wrap the local store's low-level writes (on ``local_mod``) and ``os``'s syncs and ``ftruncate``."""
        real_pwrite, real_parts = local_mod._pwrite_all, local_mod.write_parts
        real = {name: getattr(os, name) for name in ("fsync", "fdatasync", "ftruncate")}

        def pwrite_all(fd: int, data: Any, offset: int) -> None:
            path = self._path(fd)
            if path is not None:
                self.ops.append(("write", path, offset, bytes(data)))
            real_pwrite(fd, data, offset)

        def write_parts(fd: int, parts: Any) -> None:
            path = self._path(fd)
            if path is not None:
                data = b"".join(bytes(p) for p in parts)
                self.ops.append(("write", path, os.lseek(fd, 0, os.SEEK_CUR), data))
            real_parts(fd, parts)

        def sync(name: str) -> Any:
            def synced(fd: int) -> None:
                real[name](fd)
                path = self._path(fd)
                if path is not None:
                    self.ops.append(("sync", path, 0, b""))

            return synced

        def ftruncate(fd: int, size: int) -> None:
            path = self._path(fd)
            if path is not None:
                self.ops.append(("truncate", path, size, b""))
            real["ftruncate"](fd, size)

        monkeypatch.setattr(local_mod, "_pwrite_all", pwrite_all)
        monkeypatch.setattr(local_mod, "write_parts", write_parts)
        monkeypatch.setattr(os, "fsync", sync("fsync"))
        monkeypatch.setattr(os, "fdatasync", sync("fdatasync"))
        monkeypatch.setattr(os, "ftruncate", ftruncate)


def _apply(content: bytes, op: Op) -> bytes:
    kind, _, at, data = op
    if kind == "truncate":
        return content[:at] + bytes(max(0, at - len(content)))
    if kind == "write":
        padded = content + bytes(max(0, at - len(content)))
        return padded[:at] + data + padded[at + len(data) :]
    return content


def _file_states(synced: bytes, pending: list[Op], max_blocks: int) -> list[bytes]:
    """Every content a file synced as ``synced`` may hold after ``pending`` writes and a power loss."""
    latest, sizes, blocks = synced, {len(synced)}, set()
    for op in pending:
        latest = _apply(latest, op)
        sizes.add(len(latest))
        if op[0] == "write":
            blocks.update(range(op[2] // BLOCK, (op[2] + len(op[3]) - 1) // BLOCK + 1))
    if len(blocks) > max_blocks:
        raise ValueError(f"{len(blocks)} blocks written since the last sync: more than {max_blocks} to enumerate")
    lost_bytes = synced + bytes(max(0, max(sizes) - len(synced)))  # a block never written back: old bytes or zeros
    latest += bytes(max(0, max(sizes) - len(latest)))
    out = set()
    for n in range(len(blocks) + 1):
        for kept in itertools.combinations(sorted(blocks), n):
            content = bytearray(lost_bytes)
            for b in kept:
                content[b * BLOCK : (b + 1) * BLOCK] = latest[b * BLOCK : (b + 1) * BLOCK]
            out.update(bytes(content[:size]) for size in sizes)
    return sorted(out)


def crash_states(
    before: dict[str, bytes], ops: list[Op], crash_at: int, max_blocks: int = 6
) -> Iterator[dict[str, bytes]]:
    """The states (path -> content of each file written) a power loss after ``ops[:crash_at]`` may leave.

    ``before`` holds the files' synced contents before the first op (a file not there: empty).
    """
    per_file: dict[str, list[bytes]] = {}
    for path in dict.fromkeys(op[1] for op in ops):
        mine = [op for op in ops[:crash_at] if op[1] == path]
        last_sync = max((i for i, op in enumerate(mine) if op[0] == "sync"), default=-1)
        synced = before.get(path, b"")
        for op in mine[: last_sync + 1]:
            synced = _apply(synced, op)
        per_file[path] = _file_states(synced, mine[last_sync + 1 :], max_blocks)
    paths = sorted(per_file)
    for contents in itertools.product(*(per_file[p] for p in paths)):
        yield dict(zip(paths, contents, strict=True))


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root``: relative path -> bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def placed_states(root: Path, pristine: Path, before: dict[str, bytes], ops: list[Op]) -> Iterator[tuple[int, str]]:
    """Put every crash state of ``ops`` on disk at ``root`` in turn; ``(crash point, description)`` for each.

    Call right after the recorded writes: the files they wrote keep their
    inodes (hard links beside ``pristine``, the copy of ``root`` made before
    them), as an append intent names its shard's; every other file is
    ``pristine``'s again for each state.
    """
    inodes = pristine.with_name(pristine.name + "-inodes")
    inodes.mkdir()
    for path in {op[1] for op in ops}:
        os.link(root / path, inodes / path.replace("/", "_"))
    n = 0
    for crash_at in range(len(ops) + 1):
        for state in crash_states(before, ops, crash_at):
            n += 1
            shutil.rmtree(root)
            shutil.copytree(pristine, root)
            for path, content in state.items():  # written into the file's own inode, linked back in place
                inode = inodes / path.replace("/", "_")
                with open(inode, "r+b") as f:
                    f.write(content)
                    f.truncate(len(content))
                os.link(inode, root / f"{path}.tmp")
                os.replace(root / f"{path}.tmp", root / path)
            yield crash_at, f"state {n}: crash after {crash_at} of {[op[:3] for op in ops]}"
