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


def _assert_names_zarr2_for_the_draft(error: ConfigurationError) -> None:
    text = str(error)
    assert "DraftShardedStore" in text and 'pip install "shardkv[zarr2]"' in text, text
    assert zarr.__version__ in text and "2022 draft" in text, text


def test_the_draft_proxy_under_zarr3_names_zarr2_and_its_extra(tmp_path):
    from shardkv.proxy.draft import DraftShardedStore

    with pytest.raises(ConfigurationError) as info:
        DraftShardedStore(str(tmp_path / "d.zarr"), chunks_per_shard=2)
    _assert_names_zarr2_for_the_draft(info.value)
    with pytest.raises(ConfigurationError) as info:
        shardkv.open_store(str(tmp_path / "d.zarr"), chunks_per_shard=2, layout="draft2022")
    _assert_names_zarr2_for_the_draft(info.value)
    assert not (tmp_path / "d.zarr").exists()  # refused before anything was written


@pytest.mark.shared_data
def test_open_store_of_a_draft_hierarchy_under_zarr3_refuses_and_the_command_line_still_reads_it(
    shared_data, tmp_path, capsys
):
    from shardkv.cli.main import main

    src = shared_data / "zarr_implementations/examples/zarrita.zr3"  # ../shared/data/...: a 2022 draft hierarchy
    with pytest.raises(ConfigurationError) as info:
        shardkv.open_store(str(src))  # detected as the 2022 draft
    _assert_names_zarr2_for_the_draft(info.value)
    # the command line reads and writes draft hierarchies without zarr-python, so any zarr may be installed
    dst = tmp_path / "sharded.zr3"
    assert main(["convert", str(src), str(dst), "--chunks-per-shard", "2", "--no-progress"]) == 0
    assert main(["info", str(dst)]) == 0
    assert "raw" in capsys.readouterr().out
