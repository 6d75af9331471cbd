"""The ranged-read cases every store answers alike (``KVStore.get`` with byte ranges of ``b"0123456789"``)."""

from __future__ import annotations

import pytest

from shardkv.format.ranges import ByteRange

STORED = b"0123456789"

GET_RANGE_CASES = [
    pytest.param(ByteRange(0, 3), b"012", id="prefix"),
    pytest.param(ByteRange(4, 7), b"456", id="middle"),
    pytest.param(ByteRange.suffix(2), b"89", id="suffix"),
    pytest.param(ByteRange(7), b"789", id="open-ended"),
    pytest.param(ByteRange(8, 20), b"89", id="past-end-is-short"),
    pytest.param(ByteRange(5, 5), b"", id="empty"),
]
