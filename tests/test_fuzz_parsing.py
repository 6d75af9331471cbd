"""Fuzzed shards read through ``ShardedStore``: only ``KeyError`` or ``CorruptShardError``, bounded memory.

A zarr-python 2 array is stored in shards on a ``dict``, a local directory,
an fsspec ``memory://`` store, a ``memory://`` store that does not tell
sizes, and local files behind fsspec's ``DirFileSystem`` (as a remote store,
neither tells sizes for free: index entries can then be checked only against
``max_chunk_nbytes``; the latter also allocates ``nbytes`` for a ranged read).
Shard ``a/0`` is then replaced by fuzzed bytes, by the valid shard with fuzzed index entries
(re-checksummed, so the range checks are what stands between a bogus entry and a read), or by the valid
shard with flipped bytes, and every chunk of the shard is read back.
"""

from __future__ import annotations

import dataclasses
import resource
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import crc32c
import fsspec
import numpy as np
import pytest
import zarr
from fsspec.implementations.dirfs import DirFileSystem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkv import ShardedStore
from shardkv.errors import CorruptShardError
from shardkv.storage.fsspec import FsspecStore

CPS = 4
INDEX_NBYTES = 16 * CPS + 4
KEYS = [f"a/{i}" for i in range(CPS)]
INTERESTING = [0, 1, 7, 8, 40, 2**31 - 1, 2**31, 2**40, 2**43, 2**44, 2**62, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


class Kind:
    """One base store holding the array; ``put`` replaces the raw bytes of shard ``a/0``."""

    def __init__(self, name: str, tmp: str) -> None:
        self.name = name
        if name == "dict":
            self.base: Any = {}
        elif name == "local":
            self.base = tmp
        elif name == "dirfs":  # local files behind a non-local protocol
            # (the store is made directly: open_kv() looks through a DirFileSystem over local files)
            self.base = FsspecStore(DirFileSystem(path=tmp, fs=fsspec.filesystem("file")), "")
        else:
            self.base = f"memory://fuzz-{uuid.uuid4().hex}"
        store = ShardedStore(self.base, chunks_per_shard=CPS)
        z = zarr.open_array(store, mode="w", path="a", shape=(32,), chunks=(8,), dtype="u1", compressor=None)
        z[:] = np.arange(32, dtype="u1")
        self.valid = bytes(store.base.get("a/0").whole())
        self._raw = store.base
        self.size_known = True

    def put(self, blob: bytes) -> None:
        self._raw.put("a/0", blob)

    def read_all(self) -> None:
        """Every chunk of the shard, batched and one by one; only the allowed errors pass."""
        store = ShardedStore(self.base, index_cache_bytes=0)
        for call in [lambda: store.getitems(KEYS, contexts={})] + [lambda k=k: store[k] for k in KEYS]:
            try:
                call()
            except (KeyError, CorruptShardError):  # ChecksumError is a CorruptShardError
                continue


@pytest.fixture(scope="module", params=["dict", "local", "memory", "memory-no-size", "dirfs"])
def kind(request: pytest.FixtureRequest) -> Iterator[Kind]:
    with tempfile.TemporaryDirectory() as tmp:
        patch = pytest.MonkeyPatch()
        if request.param == "memory-no-size":  # the store's reads tell no sizes
            original = FsspecStore.get_many
            patch.setattr(
                FsspecStore,
                "get_many",
                lambda self, reads: [dataclasses.replace(r, size=None) for r in original(self, reads)],
            )
        try:
            made = Kind(request.param.replace("-no-size", ""), tmp)
            # a DirFileSystem over local files is read as local files: sizes from fstat
            made.size_known = request.param != "memory-no-size"
            yield made
        finally:
            patch.undo()
            if request.param.startswith("memory"):
                fs = fsspec.filesystem("memory")
                for root in list(fs.store):
                    if "fuzz-" in root:
                        fs.rm(root)


def with_entries(valid: bytes, entries: list[tuple[int, int]]) -> bytes:
    raw = np.array(entries, dtype="<u8").tobytes()
    index = raw + crc32c.crc32c(raw).to_bytes(4, "little")
    return valid[:-INDEX_NBYTES] + index


uint64 = st.one_of(st.sampled_from(INTERESTING), st.integers(0, 2**64 - 1), st.integers(0, 80))
shards = st.one_of(
    st.binary(max_size=3 * INDEX_NBYTES).map(lambda b: ("bytes", b)),
    st.lists(st.tuples(uint64, uint64), min_size=CPS, max_size=CPS).map(lambda e: ("entries", e)),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4).map(lambda f: ("flips", f)),
    st.integers(0, 200).map(lambda n: ("truncate", n)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=shards)
def test_fuzzed_shards_raise_only_corrupt_shard_or_key_errors(kind: Kind, case: tuple[str, Any]) -> None:
    what, arg = case
    if what == "bytes":
        blob = arg
    elif what == "entries":
        blob = with_entries(kind.valid, arg)
    elif what == "flips":
        data = bytearray(kind.valid)
        for pos, mask in arg:
            data[pos % len(data)] ^= mask
        blob = bytes(data)
    else:
        blob = kind.valid[: len(kind.valid) - arg]
    kind.put(blob)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kind.read_all()
    growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert growth_kib < 200 * 1024  # peak RSS (KiB on Linux): no allocation sized by a bogus entry


@pytest.mark.parametrize(
    "entry, words",
    [
        ((0, 2**40), "outside the chunk data region"),
        ((2**63, 8), "outside the chunk data region"),
        ((2**64 - 8, 16), "outside the chunk data region"),  # offset + nbytes overflows uint64
        ((2**64 - 1, 8), "only one of offset/nbytes"),
    ],
)
def test_bogus_entries_name_the_shard(kind: Kind, entry: tuple[int, int], words: str) -> None:
    entries = [(0, 8), entry, (16, 8), (24, 8)]
    kind.put(with_entries(kind.valid, entries))
    store = ShardedStore(kind.base, index_cache_bytes=0)
    with pytest.raises(CorruptShardError, match=words) as info:
        store["a/1"]
    assert info.value.shard_key == "a/0"


def test_an_entry_past_the_end_is_a_short_read_when_the_size_is_unknown(kind: Kind) -> None:
    entries = [(0, 8), (8, 8), (16, 8), (len(kind.valid) + 100, 50)]  # below max_chunk_nbytes, beyond the shard
    kind.put(with_entries(kind.valid, entries))
    store = ShardedStore(kind.base, index_cache_bytes=0)
    if not kind.size_known:  # the index alone looks plausible: the chunk read comes back short
        assert store["a/0"] == bytes(range(8))
    with pytest.raises(CorruptShardError) as info:
        store["a/3"]
    assert info.value.shard_key == "a/0"
