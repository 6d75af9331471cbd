"""Bytes written by the local stores of dask worker processes, counted in the workers.

:class:`CountWrites` is a ``distributed`` worker plugin: in each worker
process it wraps the local store's two low-level writes
(``shardkv.storage.local._pwrite_all`` and ``write_parts``, through which
every byte of a shard, a clone, an append, a temporary file or an append
intent goes) and counts the bytes handed to them, and the whole-file writes
(``atomic_write``) by path. :func:`worker_writes` sums them over the workers
and resets the counts; :func:`count_writes` registers the plugin on a
client's workers (it stays for the workers' life: use a cluster of the test's
own, such as :func:`counting_client`'s).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import distributed
from distributed import WorkerPlugin

NAME = "shardkv-count-writes"

_COUNTS: dict[str, Any] = {"nbytes": 0, "whole": collections.Counter()}


class CountWrites(WorkerPlugin):
    """Count, in each worker process, the bytes its local stores write (see the module docstring)."""

    name = NAME

    def setup(self, worker: Any) -> None:
        import shardkv.storage.local as local_mod

        if getattr(local_mod, "_counted", False):
            return
        real_pwrite, real_parts, real_atomic = local_mod._pwrite_all, local_mod.write_parts, local_mod.atomic_write

        def pwrite_all(fd: int, data: Any, offset: int) -> None:
            _COUNTS["nbytes"] += memoryview(data).nbytes
            real_pwrite(fd, data, offset)

        def write_parts(fd: int, parts: Any) -> None:
            _COUNTS["nbytes"] += sum(memoryview(p).nbytes for p in parts)
            real_parts(fd, parts)

        def atomic_write(path: str, *args: Any, **kwargs: Any) -> Any:
            _COUNTS["whole"][path] += 1
            return real_atomic(path, *args, **kwargs)

        local_mod._pwrite_all, local_mod.write_parts, local_mod.atomic_write = pwrite_all, write_parts, atomic_write
        local_mod._counted = True


def _take_counts() -> tuple[int, dict[str, int]]:
    out = (_COUNTS["nbytes"], dict(_COUNTS["whole"]))
    _COUNTS["nbytes"] = 0
    _COUNTS["whole"].clear()
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
