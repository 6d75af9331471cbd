"""Write epochs keep an older index out of the index cache (shardkv.engine.epochs, issue 9 item 4)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from shardkv.engine.cache import IndexCache
from shardkv.engine.epochs import WriteEpochs
from shardkv.format.index import ShardIndex


def _index(offset: int) -> ShardIndex:
    entries = np.full((2, 2), 2**64 - 1, dtype="<u8")
    entries[0] = (offset, 4)
    return ShardIndex(entries)


def test_a_slow_reader_cannot_put_back_an_index_older_than_our_write() -> None:
    cache, epochs = IndexCache(1 << 20), WriteEpochs()
    ticket = epochs.ticket("a/0")  # reader: before its index read ...
    old = _index(0)  # ... reads the index of generation 1
    epochs.bump("a/0")  # writer: stores generation 2, then caches its index
    new = _index(100)
    cache.put("a/0", new)
    assert epochs.put_if_current(cache, "a/0", ticket, old) is False  # the reader's late put is refused
    assert cache.get("a/0") is new
    fresh = epochs.ticket("a/0")
    assert epochs.put_if_current(cache, "a/0", fresh, new) is True and epochs.is_current("a/0", fresh)


def test_racing_readers_never_leave_a_stale_index() -> None:
    """One writer, three readers, bounded rounds: after every write the cache holds that write's index or none."""
    cache, epochs = IndexCache(1 << 20), WriteEpochs(n_stripes=8)
    stored = {"gen": 0}
    stop = threading.Event()
    guard = threading.Lock()  # the "shard": its bytes and generation change together

    def reader() -> None:
        for _ in range(2000):
            if stop.is_set():
                return
            ticket = epochs.ticket("s")
            with guard:
                gen = stored["gen"]
            time.sleep(0)  # let the writer run between our read and our put
            epochs.put_if_current(cache, "s", ticket, _index(gen))

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for gen in range(1, 200):
            with guard:
                stored["gen"] = gen
            epochs.bump("s")
            cache.put("s", _index(gen))
            cached = cache.get("s")
            assert cached is None or int(cached.entries[0, 0]) == gen
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    cached = cache.get("s")
    assert cached is None or int(cached.entries[0, 0]) == 199


def test_stripes_are_bounded() -> None:
    with pytest.raises(ValueError):
        WriteEpochs(0)
    epochs = WriteEpochs(n_stripes=4)
    for i in range(1000):
        epochs.bump(f"a/{i}")
    assert len(epochs._counters) == 4


def test_no_index_is_cached_while_a_write_is_in_flight() -> None:
    cache, epochs = IndexCache(1 << 20), WriteEpochs()
    before = epochs.ticket("a/0")  # a reader started before the write ...
    epochs.begin(["a/0"])
    during = epochs.ticket("a/0")  # ... and one during it: it may read either shard
    assert epochs.changed_since("a/0", before) and not epochs.is_current("a/0", during)
    assert epochs.put_if_current(cache, "a/0", during, _index(0)) is False
    epochs.end(["a/0"])
    assert epochs.put_if_current(cache, "a/0", during, _index(0)) is False  # taken before the end
    after = epochs.ticket("a/0")
    assert not epochs.changed_since("a/0", after)
    assert epochs.put_if_current(cache, "a/0", after, _index(8)) is True and cache.get("a/0") == _index(8)
