"""The store contract on :class:`~shardkv.transformers.adapter.UnderlyingKV` (the transformer's underlying store).

Over an :class:`~shardkv.transformers.adapter.AdapterStore` (a dict, a local
directory: the data's own location) and over an abstract store that is no
adapter (a location private to the store object).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kv_contract import KVContract, put_ok

from shardkv.storage.kv import KVStore
from shardkv.transformers import AbstractStore, AdapterStore
from shardkv.transformers.adapter import UnderlyingKV
from shardkv.transformers.api import BytesLike, KeyRange, KeyStartValue


class PlainAbstractStore(AbstractStore):
    """An abstract store that is no :class:`AdapterStore` (it holds one and passes each operation on by name)."""

    def __init__(self) -> None:
        self.inner = AdapterStore({})

    def get_partial_values(self, key_ranges: Sequence[KeyRange]) -> list[bytes | None]:
        return self.inner.get_partial_values(key_ranges)

    def set_partial_values(self, key_start_values: Sequence[KeyStartValue]) -> None:
        self.inner.set_partial_values(key_start_values)

    def set_values(self, values: Mapping[str, BytesLike]) -> None:
        self.inner.set_values(values)

    def erase_values(self, keys: Iterable[str]) -> None:
        self.inner.erase_values(keys)

    def erase_prefix(self, prefix: str) -> None:
        self.inner.erase_prefix(prefix)

    def list_prefix(self, prefix: str) -> list[str]:
        return self.inner.list_prefix(prefix)

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        return self.inner.list_dir(prefix)


def _underlying(kind: str, tmp_path: Path) -> UnderlyingKV:
    if kind == "adapter-dict":
        return UnderlyingKV(AdapterStore({}))
    if kind == "adapter-directory":
        (tmp_path / "data").mkdir()
        return UnderlyingKV(AdapterStore(str(tmp_path / "data")))
    if kind == "abstract-store":
        return UnderlyingKV(PlainAbstractStore())
    raise AssertionError(kind)


class TestUnderlyingKVContract(KVContract):
    @pytest.fixture(params=["adapter-dict", "adapter-directory", "abstract-store"])
    def kv(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
        kv = _underlying(request.param, tmp_path)
        yield kv
        kv.close()


@pytest.mark.parametrize(
    ("kind", "in_process", "lock_dir"),
    [
        ("adapter-dict", True, False),
        ("adapter-directory", False, True),
        ("abstract-store", False, False),
    ],
)
def test_caps_follow_the_data(kind: str, in_process: bool, lock_dir: bool, tmp_path: Path) -> None:
    kv = _underlying(kind, tmp_path)
    assert (kv.caps.in_process, kv.caps.lock_dir) == (in_process, lock_dir)
    assert kv.caps.ranged and kv.caps.stamps == "process" and not kv.caps.conditional_put


def test_two_views_of_one_adapter_share_stamps() -> None:
    adapter: Any = AdapterStore({})
    one, two = UnderlyingKV(adapter), UnderlyingKV(adapter)
    g = put_ok(one, "k", b"v1")
    assert two.put("k", b"v2", if_generation=g) is not None
    assert one.get("k", if_generation=g).state == "stale"  # the other view's write is seen
