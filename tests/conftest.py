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


def _mount_reflink_image(base: Path) -> tuple[Path | None, str]:
    """Mount a fresh XFS image with reflinks under ``base``; ``(mount point, "")`` or ``(None, why not)``."""
    import subprocess

    if os.geteuid() != 0:
        return None, "mounting an XFS image needs root (or set SHARDKV_TEST_REFLINK_DIR to a reflink directory)"
    if shutil.which("mkfs.xfs") is None:
        return None, "mkfs.xfs is not installed (apt-get install xfsprogs), and SHARDKV_TEST_REFLINK_DIR is not set"
    image, mount_point = base / "reflink.img", base / "mnt"
    mount_point.mkdir()
    with open(image, "wb") as f:
        f.truncate(512 * 2**20)
    for cmd in (
        ["mkfs.xfs", "-q", "-m", "reflink=1", str(image)],
        ["mount", "-o", "loop", str(image), str(mount_point)],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode:
            return None, f"{' '.join(cmd[:1])} failed: {done.stderr.strip() or done.returncode}"
    return mount_point, ""


@pytest.fixture(scope="session")
def reflink_root(tmp_path_factory: pytest.TempPathFactory):
    """A directory on a file system that clones files (reflinks), for the whole session.

    ``$SHARDKV_TEST_REFLINK_DIR`` if set (an XFS-with-reflink or btrfs
    directory); else an XFS image made and loop-mounted under the session's
    temporary directory (root only), unmounted at the end; else the tests
    that need it skip, saying why.
    """
    import subprocess

    given = os.environ.get("SHARDKV_TEST_REFLINK_DIR")
    if given:
        root = Path(given) / f"shardkv-tests-{os.getpid()}"
        root.mkdir(parents=True, exist_ok=True)
        yield root
        shutil.rmtree(root, ignore_errors=True)
        return
    mount_point, why = _mount_reflink_image(tmp_path_factory.mktemp("reflink"))
    if mount_point is None:
        pytest.skip(why)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, check=False)


@pytest.fixture
def reflink_dir(reflink_root: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh directory of the test's own on the reflink file system (:func:`reflink_root`)."""
    import re

    path = reflink_root / re.sub(r"[^\w.-]", "_", request.node.name)[:100]
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path
