"""Fixtures of tests/latest: the readers without shardkv (see latest_helpers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from latest_helpers import Reader, find_latest_python


@pytest.fixture(scope="session")
def latest_python() -> str:
    return find_latest_python()


@pytest.fixture
def reader(latest_python: str, tmp_path: Path) -> Reader:
    return Reader(latest_python, tmp_path / "reader-out")
