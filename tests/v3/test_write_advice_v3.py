"""Where the once-per-store PartialShardWriteWarning points on Python >= 3.12 (``skip_file_prefixes``)."""

from __future__ import annotations

import sys

import pytest

from shardkv.proxy.store import PartialShardWriteWarning, _warn_outside_libraries


@pytest.mark.skipif(sys.version_info < (3, 12), reason="skip_file_prefixes is new in Python 3.12")
def test_the_warning_names_the_first_line_outside_shardkv_and_zarr():
    with pytest.warns(PartialShardWriteWarning) as record:
        _warn_outside_libraries(PartialShardWriteWarning("advice", "a", 16))
    assert [w.filename for w in record] == [__file__]
