"""Every fenced ``python`` block of the user guide runs as written (in order, one namespace,
an empty temporary directory; the S3 examples against moto's server on 127.0.0.1)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "user-guide.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[str]:
    """The fenced ``python`` code blocks of a Markdown text, in order."""
    return [m.group(1) for m in _BLOCK.finditer(text)]


def test_python_blocks_are_found():
    blocks = python_blocks("x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = 2\n```\n")
    assert blocks == ["a = 1\n", "b = 2\n"]


@pytest.fixture
def s3_endpoint(monkeypatch):
    """A moto S3 server on 127.0.0.1 with the guide's bucket, credentials in the environment."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "S3_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="my-bucket")
    try:
        yield endpoint
    finally:
        server.stop()


def test_every_python_example_of_the_user_guide_runs(tmp_path, monkeypatch, s3_endpoint):
    blocks = python_blocks(GUIDE.read_text())
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__guide__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{GUIDE.name}[python block {i + 1}]", "exec"), namespace)
