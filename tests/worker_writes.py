"""Bytes written by the local stores of dask worker processes, counted in the workers.

:class:`CountWrites` is a ``distributed`` worker plugin: in each worker
process it wraps the local store's two low-level writes
(``shardkv.storage.local._pwrite_all`` and ``write_parts``, through which
every byte of a shard, a clone, an append, a temporary file or an append
intent goes) and counts the bytes handed to them, and the whole-file writes
(``atomic_write``) by path, with the wrappers of :class:`local_io.LocalIO`.
:func:`worker_writes` sums them over the workers and resets the counts; :func:`count_writes` registers the plugin on a
client's workers (it stays for the workers' life: use a cluster of the test's
own, such as :func:`counting_client`'s).

The case both the zarr 2 and the zarr 3 dask tests write is here too: a
``SHAPE`` array of ``CHUNK`` chunks, ``CPS`` x ``CPS`` per shard, whose row
of chunks ``ROWS`` is written by one task per chunk (:func:`data`,
:func:`bytes_bounds`).
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import distributed
import numpy as np
from distributed import WorkerPlugin
from local_io import LocalIO

from shardkv.format.tail import INTENT_MAGIC, AppendIntent

NAME = "shardkv-count-writes"

CHUNK = (32, 32)  # uint32, no compressor: 4096 bytes per chunk
CHUNK_NBYTES = 32 * 32 * 4
CPS = 4  # 4 x 4 chunks per shard
INDEX_NBYTES = 16 * CPS * CPS + 4  # offset/nbytes pairs and the CRC32C
SHAPE = (128, 256)  # two shards of 128 x 128
ROWS = slice(32, 64)  # one row of chunks: 8 tasks, 4 chunks of each shard

_COUNTS = LocalIO()  # this worker process's counts (the plugin installs its wrappers once)


class CountWrites(WorkerPlugin):
    """Count, in each worker process, the bytes its local stores write (see the module docstring)."""

    name = NAME

    def setup(self, worker: Any) -> None:
        import shardkv.storage.local as local_mod

        if getattr(local_mod, "_counted", False):
            return
        for name, wrapper in _COUNTS.wrappers(local_mod).items():
            setattr(local_mod, name, wrapper)
        local_mod._counted = True


def _take_counts() -> tuple[int, dict[str, int]]:
    out = (_COUNTS.written, dict(_COUNTS.whole))
    _COUNTS.reset()
    return out


def worker_writes(client: Any) -> tuple[int, collections.Counter[str]]:
    """``(bytes written, whole-file writes by path)`` summed over the workers since the last call (then reset)."""
    nbytes, whole = 0, collections.Counter[str]()
    for n, paths in client.run(_take_counts).values():
        nbytes += n
        whole.update(paths)
    return nbytes, whole


def count_writes(client: Any) -> None:
    """Count the writes of the client's workers from now on (:func:`worker_writes` reads the counts)."""
    client.register_plugin(CountWrites())
    worker_writes(client)


@contextlib.contextmanager
def counting_client() -> Iterator[Any]:
    """A client of a new ``LocalCluster`` (2 worker processes of 1 thread, loopback, no dashboards) counting writes."""
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",  # a free port: None still serves the scheduler's HTTP routes on 8787
            worker_dashboard_address=None,
            death_timeout=60,
        ) as cluster,
        distributed.Client(cluster, timeout=60) as client,
    ):
        count_writes(client)
        yield client


def data(version: int) -> np.ndarray:
    """The array's values at ``version`` (``SHAPE``, uint32)."""
    return (np.arange(SHAPE[0] * SHAPE[1], dtype="uint32").reshape(SHAPE) * 7 + version * 100_003).astype("uint32")


def bytes_bounds(shard_path: str, in_place: bool) -> tuple[int, int]:
    """Least and most bytes the workers may write for ``ROWS``: each task its chunk, at most with an index.

    An in-place append also records its intent in the lock file and clears it
    (zeros over the record's magic).
    """
    tasks = (ROWS.stop - ROWS.start) // CHUNK[0] * SHAPE[1] // CHUNK[1]
    intent = len(AppendIntent(os.path.realpath(shard_path), 0, 0, 0, 0, 0).encode() + INTENT_MAGIC) if in_place else 0
    return tasks * CHUNK_NBYTES, tasks * (CHUNK_NBYTES + INDEX_NBYTES + intent)
