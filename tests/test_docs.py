"""Every fenced ``python`` block of the README and the user guide runs as written, each alone.

Each block runs in its own namespace and its own empty temporary directory, in the zarr 2
environment (the ``python zarr3`` blocks run in the zarr 3 one: tests/v3/test_zarr3_docs.py);
the S3 examples against moto's server on 127.0.0.1, its endpoint and credentials in the
environment as the guide tells a reader to set them. A reader copies one block, not the page.
"""

from __future__ import annotations

import re
from pathlib import Path

import moto_strict
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/user-guide.md"]
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
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    server, endpoint = moto_strict.start_server()  # conditional writes decided as S3 decides them
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


def _blocks_of(doc: str) -> list[tuple[int, str]]:
    text = (ROOT / doc).read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in _BLOCK.finditer(text)]


@pytest.mark.parametrize("doc", DOCS)
def test_every_python_example_runs_alone(doc, tmp_path, monkeypatch, s3_endpoint):
    blocks = _blocks_of(doc)
    assert len(blocks) >= (5 if doc.startswith("docs") else 1)
    for line, block in blocks:
        workdir = tmp_path / f"line-{line}"
        workdir.mkdir()
        monkeypatch.chdir(workdir)
        exec(compile(block, f"{doc}[python block at line {line}]", "exec"), {"__name__": "__doc_block__"})
