"""zarr-python 2.18's own store and array tests, run through ShardedStore.

Each class below subclasses one of zarr's (``StoreTests``, ``TestArray`` and its
compressor / filter / path variants); only the store factory differs: a
``ShardedStore`` over a ``dict`` and over a temporary directory, with
``chunks_per_shard=2``. Tests that cannot pass yet are marked xfail (strict)
with the cause; see the user guide section "Differences from zarr 2's own stores".
"""

from __future__ import annotations

import atexit
import functools
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numcodecs.pickles
import pytest
from zarr2_suite import zarr2_test_module

from shardkv import ShardedStore

zcore = zarr2_test_module("test_core")
zstorage = zarr2_test_module("test_storage")
dimension_separator_fixture = zstorage.dimension_separator_fixture  # fixtures of zarr's modules and conftest


@pytest.fixture(params=[str, pathlib.Path])
def path_type(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.fixture(autouse=True)
def _pickles_written_here(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """zarr's object-array tests read back their own Pickle chunks; numcodecs >= 0.15 refuses those unless allowed."""
    monkeypatch.setattr(numcodecs.pickles, "ALLOW_UNSAFE_PICKLE_DECODE", True, raising=False)
    yield


def _tmpdir() -> str:
    path = tempfile.mkdtemp(prefix="shardkv-zarr2-suite-")
    atexit.register(shutil.rmtree, path, True)
    return path


def _over_dict() -> ShardedStore:
    return ShardedStore(dict(), chunks_per_shard=2)


def _over_dir() -> ShardedStore:
    return ShardedStore(_tmpdir(), chunks_per_shard=2)


def _xfail(cls: type, reasons: dict[str, str]) -> type:
    """Mark ``cls``'s inherited tests named in ``reasons`` as strict xfails (a wrapper each, the parent untouched)."""
    for name, reason in reasons.items():
        original: Callable[..., Any] = getattr(cls, name)

        @functools.wraps(original)
        def wrapper(self: Any, *args: Any, __original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            return __original(self, *args, **kwargs)

        setattr(cls, name, pytest.mark.xfail(reason=reason, strict=True)(wrapper))
    return cls


# -- what cannot pass yet, and why ------------------------------------------------------

_NOT_BYTES = (
    "documented difference: a value that is not bytes-like (here a list) raises TypeError; zarr's KVStore(dict) "
    "keeps it and getsize answers -1 (TestArrayWithPath.test_nbytes_stored stores one outside any try)"
)
_ARRAY_XFAILS: dict[str, str] = {}
_PATH_ARRAY_XFAILS = {"test_nbytes_stored": _NOT_BYTES}
_STORE_XFAILS: dict[str, dict[str, str]] = {}


# -- StoreTests --------------------------------------------------------------------


class TestProxyStoreOverDict(zstorage.StoreTests):
    def create_store(self, **kwargs: Any) -> ShardedStore:
        zstorage.skip_if_nested_chunks(**kwargs)
        return _over_dict()

    def test_setdel(self) -> None:  # zarr's TestMemoryStore adds the hierarchy checks
        zstorage.setdel_hierarchy_checks(self.create_store(), self.root)


class TestProxyStoreOverDirectory(zstorage.StoreTests):
    def create_store(self, **kwargs: Any) -> ShardedStore:
        zstorage.skip_if_nested_chunks(**kwargs)
        return _over_dir()

    def test_setdel(self) -> None:  # zarr's TestDirectoryStore adds the hierarchy checks
        zstorage.setdel_hierarchy_checks(self.create_store(), self.root)


# -- TestArray and its variants ---------------------------------------------------------

_ARRAY_CLASSES = {
    "TestArray": zcore.TestArray,
    "TestArrayWithPath": zcore.TestArrayWithPath,
    "TestArrayWithNoCompressor": zcore.TestArrayWithNoCompressor,
    "TestArrayWithBZ2Compressor": zcore.TestArrayWithBZ2Compressor,
    "TestArrayWithBloscCompressor": zcore.TestArrayWithBloscCompressor,
    "TestArrayWithLZMACompressor": zcore.TestArrayWithLZMACompressor,
    "TestArrayWithFilters": zcore.TestArrayWithFilters,
}


def _array_class(name: str, base: type, factory: Callable[[], ShardedStore], where: str) -> type:
    return type(
        f"TestProxy{name[4:]}Over{where}", (base,), {"create_store": lambda self: factory(), "__module__": __name__}
    )


if os.environ.get("SHARDKV_ZARR2_BASELINE") == "1":  # the same classes on zarr's own stores, for the pass counts

    class TestOwnMemoryStore(zstorage.TestMemoryStore):
        pass

    class TestOwnDirectoryStore(zstorage.TestDirectoryStore):
        pass  # its test_filesystem_path writes data/store under the working directory

    for _name, _base in _ARRAY_CLASSES.items():
        globals()[f"TestOwn{_name[4:]}"] = type(f"TestOwn{_name[4:]}", (_base,), {"__module__": __name__})

for _name, _base in _ARRAY_CLASSES.items():
    for _factory, _where in ((_over_dict, "Dict"), (_over_dir, "Directory")):
        _reasons = _PATH_ARRAY_XFAILS if _name == "TestArrayWithPath" else _ARRAY_XFAILS
        _cls = _xfail(_array_class(_name, _base, _factory, _where), _reasons)
        globals()[_cls.__name__] = _cls
for _name, _reasons in _STORE_XFAILS.items():
    _xfail(globals()[_name], _reasons)
