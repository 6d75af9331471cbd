"""Kill an O(chunk) shard update at each of its steps (shared by tests/test_tail_kill.py and tests/v3).

The parent creates a small sharded array (:func:`create_zarr2` / the v3 test's own), then runs this
file as a child process (``python tail_kill.py ROOT SHARD_UPDATES HOLD_AT TORN FD RELEASE PATH``).
The child opens the array (at ``PATH`` in the hierarchy, empty: the root) through shardkv (the zarr
2 proxy or ``shardkv.zarr3.ShardedStore``, whichever zarr is installed), counts every low-level step
of the local store from the update on (the two writes, ``fsync``/``fdatasync``, ``ftruncate``,
``os.replace``, the clone ``ioctl``) and, at step ``HOLD_AT``, writes ``H`` to the pipe ``FD`` and
waits on the pipe ``RELEASE``; with ``TORN``, a write step first writes half of its bytes, as a kill
inside ``write`` would leave. The parent reads that byte and SIGKILLs the child: no timer decides
where the kill lands. A child that ran every step writes ``D`` instead, after its update returned
(acknowledged).

The update: chunks 0, 1 and 2 of shard ``0`` (chunks of 8 ``uint16``, 4 per shard, no
compressor) go from ``OLD`` (``chunk index + 1``) to ``NEW`` (``100 + chunk index``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

CHUNK, N_CHUNKS, PER_SHARD = 8, 8, 4
UPDATED = (0, 1, 2)  # chunks of shard 0 the update sets (shard 0 covered in part)
MAX_STEPS = 64  # bound of the step loops


def old_data() -> np.ndarray:
    return np.repeat(np.arange(1, N_CHUNKS + 1, dtype="u2"), CHUNK)


def new_data() -> np.ndarray:
    data = old_data()
    for c in UPDATED:
        data[c * CHUNK : (c + 1) * CHUNK] = 100 + c
    return data


def check_old_or_new(got: np.ndarray, acknowledged: bool) -> None:
    """Each chunk holds its old or its new value (the new one once the update was acknowledged)."""
    old, new = old_data(), new_data()
    for c in range(N_CHUNKS):
        part = got[c * CHUNK : (c + 1) * CHUNK]
        allowed = [new[c * CHUNK : (c + 1) * CHUNK]] if c in UPDATED else []
        if not (acknowledged and c in UPDATED):
            allowed.append(old[c * CHUNK : (c + 1) * CHUNK])
        if not any(np.array_equal(part, a) for a in allowed):
            raise AssertionError(f"chunk {c} holds {part.tolist()}, neither of {[a[0] for a in allowed]}")


def create_zarr2(root: Path, **options: object) -> None:
    import zarr

    from shardkv import ShardedStore

    store = ShardedStore(str(root), chunks_per_shard=PER_SHARD, **options)
    z = zarr.create(shape=(CHUNK * N_CHUNKS,), chunks=(CHUNK,), dtype="u2", compressor=None, store=store)
    z[:] = old_data()


def create_zarr3(root: Path, **options: object) -> None:
    """The same array through ``shardkv.zarr3.ShardedStore`` (zarr 3): shards at ``c/<i>``."""
    import zarr

    import shardkv.zarr3

    store = shardkv.zarr3.ShardedStore(str(root), chunks_per_shard=PER_SHARD, **options)
    z = zarr.create_array(store, shape=(CHUNK * N_CHUNKS,), chunks=(CHUNK,), dtype="uint16", compressors=None)
    z[:] = old_data()


def start_held(
    root: Path, shard_updates: str, hold_at: int, torn: bool, path: str = ""
) -> tuple[subprocess.Popen, int, str]:
    """Start the child; ``(child, release fd, "held" or "done")`` once it holds at step ``hold_at`` or has ended.

    Writing a byte to the release descriptor lets a held child go on; closing it too.
    """
    read_fd, write_fd = os.pipe()
    release_r, release_w = os.pipe()
    cmd = [sys.executable, __file__, root, shard_updates, hold_at, int(torn), write_fd, release_r, path]
    child = subprocess.Popen([str(c) for c in cmd], pass_fds=(write_fd, release_r), stderr=subprocess.PIPE)
    os.close(write_fd)
    os.close(release_r)
    try:
        ready, _, _ = select.select([read_fd], [], [], 120)  # a bound for a hung child, not a timing
        said = os.read(read_fd, 1) if ready else b""
    finally:
        os.close(read_fd)
    if said == b"H":
        return child, release_w, "held"
    os.close(release_w)
    _, err = child.communicate(timeout=120)
    if said == b"D" and child.returncode == 0:
        return child, -1, "done"
    child.kill()
    raise AssertionError(f"the child neither held nor finished (exit {child.returncode}):\n{err.decode()}")


def run_held(root: Path, shard_updates: str, hold_at: int, torn: bool, path: str = "") -> str:
    """Run the child until it holds at step ``hold_at`` (then SIGKILL it: ``"killed"``) or ends (``"done"``)."""
    child, release, state = start_held(root, shard_updates, hold_at, torn, path)
    if state == "done":
        return "done"
    child.send_signal(signal.SIGKILL)
    child.wait()
    os.close(release)
    return "killed"


def _child(root: str, shard_updates: str, hold_at: int, torn: bool, notify: int, release: int, path: str) -> None:
    import fcntl

    import zarr

    import shardkv.storage.local as local_mod

    if zarr.__version__.startswith("2."):
        from shardkv import ShardedStore

        z = zarr.open(ShardedStore(root, shard_updates=shard_updates), mode="r+", path=path or None)
    else:
        import shardkv.zarr3

        z = zarr.open_array(shardkv.zarr3.ShardedStore(root, shard_updates=shard_updates), mode="r+", path=path)
    steps = [0]

    def hold() -> None:  # until the parent kills this process or lets it go on
        os.write(notify, b"H")
        os.read(release, 1)

    def step(real, is_write: bool = False):
        def hooked(*args):
            steps[0] += 1
            if steps[0] == hold_at:
                if torn and is_write:
                    fd, data = args[0], args[1]
                    if isinstance(data, list):  # write_parts(fd, parts), at the descriptor's position
                        joined = b"".join(bytes(p) for p in data)
                        real(fd, [memoryview(joined[: len(joined) // 2])])
                        os.lseek(fd, -(len(joined) // 2), os.SEEK_CUR)  # released: the whole write from there
                    else:  # _pwrite_all(fd, data, offset)
                        real(fd, data[: len(data) // 2], args[2])
                hold()
            return real(*args)

        return hooked

    local_mod._pwrite_all = step(local_mod._pwrite_all, True)
    local_mod.write_parts = step(local_mod.write_parts, True)
    for name in ("fsync", "fdatasync", "ftruncate", "replace"):
        setattr(os, name, step(getattr(os, name)))
    fcntl.ioctl = step(fcntl.ioctl)
    z[0 : CHUNK * len(UPDATED)] = new_data()[0 : CHUNK * len(UPDATED)]
    try:
        os.write(notify, b"D")
    except BrokenPipeError:  # a parent that released this child stopped listening
        pass


if __name__ == "__main__":
    root, shard_updates, hold_at, torn, notify, release, path = sys.argv[1:8]
    _child(root, shard_updates, int(hold_at), bool(int(torn)), int(notify), int(release), path)
