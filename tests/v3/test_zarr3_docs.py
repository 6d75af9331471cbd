"""Every fenced ``python zarr3`` block of the README and the user guide runs as written, in the zarr 3 environment.

(tests/test_docs.py runs the plain ``python`` blocks in the zarr 2 environment; the
zarr-python 3 examples are fenced ``python zarr3`` so that each runs where its zarr is.)
Each block runs alone, in its own namespace and empty temporary directory; what
each block prints is checked against the ``# ...`` comment after each ``print``.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("zarr.abc.store")
pytest.importorskip("xarray")

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"^```python zarr3\n(.*?)^```", re.S | re.M)
_PRINT = re.compile(r"^print\(.*\)\s+#\s*(.*)$")

pytestmark = pytest.mark.zarr3


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("doc", ["README.md", "docs/user-guide.md"])
def test_zarr3_examples_run_and_print_what_they_say(doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _BLOCK.findall((ROOT / doc).read_text())
    assert blocks, f"no python zarr3 block in {doc}"
    for i, block in enumerate(blocks):
        workdir = tmp_path / f"block-{i + 1}"
        workdir.mkdir()
        monkeypatch.chdir(workdir)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"{doc}[python zarr3 block {i + 1}]", "exec"), {"__name__": "__doc_block__"})
        expected = [m.group(1).split(":")[0].strip() for line in block.splitlines() if (m := _PRINT.match(line))]
        printed = [line.strip() for line in out.getvalue().splitlines()]
        assert len(printed) == len(expected)
        for got, want in zip(printed, expected, strict=True):
            assert got.startswith(want), (got, want)
