"""The zarr-python 2 proxy under zarr-python 3 says which store to use and which extra installs it.

zarr 3 refuses the proxy with ``TypeError: Unsupported type for store_like: 'ShardedStore'``,
naming neither the zarr 3 store nor the install that fixes it; shardkv refuses it first.
"""

from __future__ import annotations

import pytest
import zarr

import shardkv
from shardkv.errors import ConfigurationError

pytestmark = pytest.mark.zarr3


def test_the_zarr2_proxy_under_zarr3_names_the_zarr3_store_and_extra(tmp_path):
    with pytest.raises(ConfigurationError) as info:
        zarr.open(store=shardkv.ShardedStore(str(tmp_path / "a.zarr"), chunks_per_shard=4), mode="w", shape=(4,))
    text = str(info.value)
    assert "shardkv.zarr3.ShardedStore" in text and 'pip install "shardkv[zarr3]"' in text
    assert zarr.__version__ in text
    assert not (tmp_path / "a.zarr").exists()  # refused before anything was written
