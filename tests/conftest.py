"""Fixtures shared by the whole suite: base stores, counting wrappers, shared data."""

from __future__ import annotations

import os
import shutil
from collections.abc import MutableMapping
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("SHARDKV_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


class CountingStore(MutableMapping):
    """A dict-backed MutableMapping that counts the operations made on it.

    ``reads`` counts ``__getitem__`` and ``__contains__``, ``writes`` counts
    ``__setitem__``, ``deletes`` counts ``__delitem__``; ``log`` keeps
    ``(op, key)`` in order.
    """

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.reads = self.writes = self.deletes = 0
        self.log: list[tuple[str, str]] = []

    def reset(self) -> None:
        self.reads = self.writes = self.deletes = 0
        self.log.clear()

    def __getitem__(self, key: str) -> bytes:
        self.reads += 1
        self.log.append(("get", key))
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        self.reads += 1
        self.log.append(("contains", key))  # type: ignore[arg-type]
        return key in self.data

    def __setitem__(self, key: str, value: bytes) -> None:
        self.writes += 1
        self.log.append(("set", key))
        self.data[key] = bytes(value)

    def __delitem__(self, key: str) -> None:
        self.deletes += 1
        self.log.append(("del", key))
        del self.data[key]

    def __iter__(self):
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)


@pytest.fixture
def counting_store() -> CountingStore:
    return CountingStore()


@pytest.fixture(scope="session")
def shared_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of ../shared/data (one per test session; treat it as read-only).

    Fails under CI (``CI`` set) when the data is missing, skips elsewhere.
    """
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"shared data not found at {SHARED_DATA} (required under CI)")
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    dst = tmp_path_factory.mktemp("shared") / "data"
    shutil.copytree(SHARED_DATA, dst)
    return dst
