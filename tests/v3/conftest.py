"""tests/v3 (the zarr-python 3 environment): async tests and fixtures run under pytest-asyncio's auto mode.

zarr's own ``zarr.testing.store.StoreTests`` (tests/v3/test_zarr3_store_conformance.py)
declares async tests and async fixtures without markers, as zarr's own suite
does under ``asyncio_mode = "auto"``; the zarr 2 environment never collects this
directory (it has pytest-asyncio only so that pyproject.toml's loop-scope option is known).
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("asyncio") and not config.getoption("asyncio_mode", None):
        config.option.asyncio_mode = "auto"
