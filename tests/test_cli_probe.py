"""The first probe of an object store: missing credentials are called credentials,
and a wrong endpoint is given up after a capped number of connections (no timed assertion)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("s3fs")


def _env_without_credentials() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true")
    return env


def _info(endpoint: str, options: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    storage_options = f'{{{options}"client_kwargs": {{"endpoint_url": "{endpoint}"}}}}'
    return subprocess.run(
        [sys.executable, "-m", "shardkv", "info", "s3://bucket/data.zarr", "--storage-options", storage_options],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


class _ClosingServer:
    """A loopback TCP server that accepts connections and closes them at once, counting them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        deadline = time.monotonic() + 300
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def __enter__(self) -> _ClosingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.sock.close()


def test_missing_credentials_are_called_credentials():
    with _ClosingServer() as server:
        proc = _info(f"http://127.0.0.1:{server.port}", "", _env_without_credentials())
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "credentials" in lines[0] and "cannot reach" not in lines[0], lines[0]
    assert "s3://bucket/data.zarr" in lines[0]


def test_a_wrong_endpoint_is_given_up_after_a_few_connections():
    with _ClosingServer() as server:
        proc = _info(f"http://127.0.0.1:{server.port}", '"key": "k", "secret": "s", ', _env_without_credentials())
        connections = server.connections
    assert proc.returncode == 1
    assert "cannot reach the store" in proc.stderr and "Traceback" not in proc.stderr
    assert 1 <= connections <= 5, connections  # s3fs and botocore retries together made about 50
