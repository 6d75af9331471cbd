"""A convert task writes its shards on a thread of their own while it reads the next ones.

The stores here hand each other events: the read of the second shard waits
until the first shard's write has begun, and that write waits until the
second shard has been read. A task that read every shard before writing any
would wait out both bounds and be seen doing so.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from shardkv.cli.convert.tasks import ShardTask, run_task
from shardkv.format.layout import ShardLayout
from shardkv.storage.kv import Generation, ReadRequest, ReadResult, Value
from shardkv.storage.mapping import MappingStore

WAIT_SECONDS = 10.0  # each event's bound; a task that does not overlap waits out two of them

# four shards of two chunks each, 1-d: chunks c/0..c/7, shards s/0..s/3
CHUNKS = {f"c/{i}": bytes([i]) * (100 + i) for i in range(8)}
SHARDS = tuple((s, f"s/{s}", (((0,), f"c/{2 * s}"), ((1,), f"c/{2 * s + 1}"))) for s in range(4))


def _task(**kw: Any) -> ShardTask:
    return ShardTask("src", "dst", {}, {}, (2,), "end", True, SHARDS, **kw)


class _Source(MappingStore):
    """Reads of shard 1's chunks wait until a write has begun, then say they happened."""

    def __init__(self, writing: threading.Event, read_second: threading.Event) -> None:
        super().__init__(dict(CHUNKS))
        self.writing, self.read_second = writing, read_second
        self.waited: list[bool] = []

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        if any(key == "c/2" for key, _, _ in reads):
            self.waited.append(self.writing.wait(WAIT_SECONDS))
            self.read_second.set()
        return super().get_many(reads)


class _Target(MappingStore):
    """The first write says it has begun, then waits until shard 1 has been read."""

    def __init__(self, writing: threading.Event, read_second: threading.Event) -> None:
        super().__init__({})
        self.writing, self.read_second = writing, read_second
        self.waited: list[bool] = []
        self.threads: set[str] = set()

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        self.threads.add(threading.current_thread().name)
        if not self.writing.is_set():
            self.writing.set()
            self.waited.append(self.read_second.wait(WAIT_SECONDS))
        return super().put_many(writes)


def test_shards_are_written_while_the_next_are_read() -> None:
    writing, read_second = threading.Event(), threading.Event()
    source, target = _Source(writing, read_second), _Target(writing, read_second)
    result = run_task(_task(), source, target)
    assert source.waited == [True] and target.waited == [True]  # each side saw the other within its bound
    assert threading.current_thread().name not in target.threads
    layout = ShardLayout.v3((2,), "end", "little", True)
    assert [key for _, key, _, _ in result.written] == [f"s/{s}" for s in range(4)]
    for s, key, nbytes, nbytes_read in result.written:
        blob = bytes(target.values([key])[key])
        assert len(blob) == nbytes and nbytes_read == len(CHUNKS[f"c/{2 * s}"]) + len(CHUNKS[f"c/{2 * s + 1}"])
        chunks = {local: bytes(v) for local, v in layout.chunks_of_shard(blob, key).items()}
        assert chunks == {(0,): CHUNKS[f"c/{2 * s}"], (1,): CHUNKS[f"c/{2 * s + 1}"]}  # the bytes as stored


class _Failing(MappingStore):
    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        raise PermissionError(13, "denied", "s/0")


def test_a_write_error_is_raised_by_the_task() -> None:
    with pytest.raises(PermissionError, match="denied"):
        run_task(_task(), MappingStore(dict(CHUNKS)), _Failing({}))
    assert not [t for t in threading.enumerate() if t.name.startswith("shardkv-convert-write")]
