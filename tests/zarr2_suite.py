"""zarr-python 2.18's own test modules (``zarr.tests.test_core``, ``zarr.tests.test_storage``), importable.

The zarr 2.18.7 wheel ships them. When an install lacks them, the sdist of the
installed zarr version is fetched once with pip (``pip download --no-binary
:all: --no-deps``) into ``$SHARDKV_ZARR2_TESTS_CACHE`` (default
``~/.cache/shardkv/zarr2-tests``) and its ``zarr/tests`` joins the installed
package's ``__path__``, so the modules import under their own names.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import zarr


def _sdist_tests(version: str) -> Path:
    cache = (
        Path(os.environ.get("SHARDKV_ZARR2_TESTS_CACHE", Path.home() / ".cache" / "shardkv" / "zarr2-tests")) / version
    )
    tests = cache / f"zarr-{version}" / "zarr" / "tests"
    if not tests.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-binary",
                ":all:",
                "--no-deps",
                f"zarr=={version}",
                "-d",
                str(cache),
            ],
            check=True,
            timeout=300,
        )
        (archive,) = cache.glob(f"zarr-{version}.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(cache, filter="data")
    return tests


def zarr2_test_module(name: str) -> ModuleType:
    """``zarr.tests.<name>`` of the installed zarr 2, from the wheel or else from its sdist."""
    if importlib.util.find_spec("zarr.tests") is None:
        tests = _sdist_tests(zarr.__version__)
        zarr.__path__.append(str(tests.parent))  # type: ignore[attr-defined]
    return importlib.import_module(f"zarr.tests.{name}")
