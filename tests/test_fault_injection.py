"""Random ``OSError`` on base-store reads, writes and deletes under a random zarr 2 workload.

For each write strategy over a local directory, and for write-back
(``buffer_bytes``) over a ``dict``, a share of the adapter's reads (``get``,
``get_many``, ``get_ranges``), writes (``set_many``, ``write_at``) and deletes
(``delete_many``) raise ``OSError(EIO)``; on local files a share of the
low-level positional writes also stop after part of their bytes. A seeded
workload of whole-chunk writes, chunk deletes (writing the fill value, or
``del`` of the chunk key) and reads runs through zarr-python 2; a call that
returns is acknowledged. With the faults off:

* every chunk holds its last acknowledged value or the value of a failed
  write attempted after it (never a mix, never an older value);
* every read that returned saw one of those values too;
* every shard passes ``verify_store(store, decode=True)``;
* every exception was an ``OSError`` (or a shardkv error raised ``from`` one).
"""

from __future__ import annotations

import errno
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.errors import ShardKVError
from shardkv.proxy.verify import verify_store
from shardkv.storage import local as local_store
from shardkv.storage.local import LocalStore
from shardkv.storage.mapping import MappingStore

CHUNK = 64  # int32 elements per chunk
N_CHUNKS = 12  # 3 shards of 4 chunks
RATE = 0.15
OPERATIONS = 60
SECONDS = 8.0
FILL = np.zeros(CHUNK, dtype="i4")
READS = ("get_many",)  # the KVStore methods every shard read and write goes through
WRITES = ("put_many",)


class Faults:
    """Raises ``OSError(EIO)`` at ``rate`` in the wrapped adapter methods and low-level writes while armed."""

    def __init__(self, seed: int, rate: float) -> None:
        self.rng = random.Random(seed)
        self.rate = rate
        self.armed = False
        self.fired: dict[str, int] = {}

    def _fire(self, what: str) -> bool:
        if self.armed and self.rng.random() < self.rate:
            self.fired[what] = self.fired.get(what, 0) + 1
            return True
        return False

    def wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(adapter: Any, *args: Any, **kwargs: Any) -> Any:
            if self._fire(name):
                raise OSError(errno.EIO, f"injected EIO in {name}")
            return real(adapter, *args, **kwargs)

        return faulty

    def partial_writes(self, real: Callable[[int, memoryview, int], None]) -> Callable[[int, memoryview, int], None]:
        def write(fd: int, data: memoryview, offset: int) -> None:
            if self._fire("partial write"):
                real(fd, data[: self.rng.randrange(len(data) + 1)], offset)
                raise OSError(errno.EIO, "injected EIO after a partial write")
            real(fd, data, offset)

        return write

    def install(self, monkeypatch: pytest.MonkeyPatch, adapter_class: type, local: bool) -> None:
        for name in READS + WRITES:
            monkeypatch.setattr(adapter_class, name, self.wrap(name, getattr(adapter_class, name)))
        if local:
            write = self.partial_writes(local_store._pwrite_all)
            monkeypatch.setattr(local_store, "_pwrite_all", write)
            monkeypatch.setattr(
                local_store,
                "write_parts",
                lambda fd, parts: write(fd, memoryview(b"".join(parts)), os.lseek(fd, 0, os.SEEK_CUR)),
            )


def value_of(seq: int) -> np.ndarray:
    """Data of write ``seq``: ``seq + 1`` in the high digits, noise so the encoded size varies."""
    rng = np.random.default_rng(seq)
    return (seq + 1) * 100_000 + rng.integers(0, 1 + (seq * 37) % 90_000, CHUNK, dtype="i4")


class Model:
    """Per chunk: the last acknowledged value and the values of failed writes attempted after it."""

    def __init__(self) -> None:
        self.acked = [FILL] * N_CHUNKS
        self.pending: list[list[np.ndarray]] = [[] for _ in range(N_CHUNKS)]

    def allowed(self, c: int) -> list[np.ndarray]:
        return [self.acked[c], *self.pending[c]]

    def record(self, chunks: dict[int, np.ndarray], ok: bool) -> None:
        for c, value in chunks.items():
            if ok:
                self.acked[c], self.pending[c] = value, []
            else:
                self.pending[c].append(value)

    def check(self, c: int, got: np.ndarray, when: str) -> None:
        assert any(np.array_equal(got, a) for a in self.allowed(c)), (
            f"{when}: chunk {c} holds {got[:3]}..., neither its last acknowledged value "
            f"{self.acked[c][:3]}... nor one of {len(self.pending[c])} failed later writes"
        )


def expected_error(exc: BaseException) -> bool:
    """An ``OSError``, or a shardkv error raised ``from`` one (directly or down the chain)."""
    if isinstance(exc, OSError) and not isinstance(exc, ShardKVError):
        return True
    cause = exc.__cause__
    return isinstance(exc, ShardKVError) and cause is not None and expected_error(cause)


def run_workload(st: ShardedStore, faults: Faults, seed: int, flush: bool) -> tuple[Model, list[BaseException]]:
    z = zarr.open_array(
        st,
        mode="w",
        path="a",
        shape=(CHUNK * N_CHUNKS,),
        chunks=(CHUNK,),
        dtype="i4",
        fill_value=0,
        compressor=numcodecs.Zlib(level=1),
        write_empty_chunks=False,
    )
    model = Model()
    errors: list[BaseException] = []
    rng = random.Random(seed)
    faults.armed = True
    started = time.monotonic()
    for seq in range(OPERATIONS):
        if time.monotonic() - started > SECONDS:
            break
        c = rng.randrange(N_CHUNKS)
        op = rng.choices(["write", "write2", "fill", "del", "read", "flush"], [5, 2, 1, 1, 3, 1 if flush else 0])[0]
        chunks: dict[int, np.ndarray] = {}
        try:
            if op == "write":
                chunks = {c: value_of(seq)}
                z[c * CHUNK : (c + 1) * CHUNK] = chunks[c]
            elif op == "write2":  # two neighbouring chunks in one call (often two shards' worth of work)
                c = min(c, N_CHUNKS - 2)
                chunks = {c: value_of(seq), c + 1: value_of(seq + 10_000)}
                z[c * CHUNK : (c + 2) * CHUNK] = np.concatenate([chunks[c], chunks[c + 1]])
            elif op == "fill":  # all fill: zarr 2 deletes the chunk key
                chunks = {c: FILL}
                z[c * CHUNK : (c + 1) * CHUNK] = FILL
            elif op == "del":
                chunks = {c: FILL}
                try:
                    del st[f"a/{c}"]
                except KeyError:  # not stored: already the fill value
                    pass
            elif op == "read":
                got = z[:]
                for k in range(N_CHUNKS):
                    model.check(k, got[k * CHUNK : (k + 1) * CHUNK], f"read at step {seq}")
            else:
                st.flush()
        except Exception as exc:  # every type is collected and checked below
            errors.append(exc)
            model.record(chunks, ok=False)
        else:
            model.record(chunks, ok=True)
    faults.armed = False
    return model, errors


def check_after(
    st_factory: Callable[[], ShardedStore], model: Model, errors: list[BaseException], faults: Faults
) -> None:
    unexpected = [e for e in errors if not expected_error(e)]
    assert not unexpected, f"unexpected exception types: {[type(e).__name__ + ': ' + str(e) for e in unexpected]}"
    assert errors, "no fault surfaced as an error"
    assert any(faults.fired.get(n) for n in READS) and any(faults.fired.get(n) for n in WRITES), faults.fired
    st = st_factory()
    report = verify_store(st, decode=True)
    assert report.ok, report.damaged
    data = zarr.open_array(st, mode="r", path="a")[:]
    for c in range(N_CHUNKS):
        model.check(c, data[c * CHUNK : (c + 1) * CHUNK], "after the workload")


@pytest.mark.parametrize("strategy", ["rewrite"])
def test_strategies_under_random_read_write_delete_faults(
    tmp_path: Path, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path / "store")
    faults = Faults(seed=len(strategy), rate=RATE)
    faults.install(monkeypatch, LocalStore, local=True)

    def open_store() -> ShardedStore:
        return ShardedStore(root, chunks_per_shard=4)

    model, errors = run_workload(open_store(), faults, seed=len(strategy) * 7, flush=False)
    assert faults.fired.get("partial write"), faults.fired
    check_after(open_store, model, errors, faults)


@pytest.mark.parametrize("seed", [3, 4])
def test_write_back_under_random_read_write_delete_faults(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    base: dict[str, bytes] = {}
    faults = Faults(seed=seed, rate=RATE)
    faults.install(monkeypatch, MappingStore, local=False)
    st = ShardedStore(base, chunks_per_shard=4, buffer_bytes=5 * CHUNK * 4)  # ~5 chunks: evictions
    model, errors = run_workload(st, faults, seed=seed, flush=True)
    st.flush()  # faults off: what was acknowledged reaches the base store
    check_after(lambda: ShardedStore(base), model, errors, faults)
