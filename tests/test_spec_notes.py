"""spec_notes/ names code and tests that exist.

Each row of ``spec_notes/*.md`` maps a normative clause to the code that implements it and the
test that proves it. A rename or a move that leaves a row pointing at nothing makes the row a
claim nobody can check, so every backticked reference is resolved here:

* ``file.py::test_name`` (with or without ``tests/``, parameters allowed): that test in that file;
* ``test_name`` alone: a test function or a test module of that name;
* ``path/file.py``: a file of the package, the transformers or the tests;
* a dotted name (``ShardLayout.encode_shard``, ``metadata.v3_view``): a module of the package, or
  a name (function, class, attribute) that the package or the transformers define.

Names of other libraries (``zarr.``, ``numpy.`` ...) and JSON members (``shardkv.v2_...``) are not
references.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOREIGN = ("zarr.", "np.", "numpy.", "numcodecs.", "ts.", "tensorstore.", "fsspec.", "s3fs.", "obstore.", "os.")
FOREIGN += ("xarray.", "xr.", "dask.", "sys.", "shardkv.v2_")


def _sources() -> tuple[list[Path], list[Path]]:
    code = [p for folder in ("shardkv", "transformers") for p in (ROOT / folder).rglob("*.py")]
    return code, list((ROOT / "tests").rglob("*.py"))


def _unresolved(notes: Path, code: list[Path], tests: list[Path]) -> list[str]:
    code_text = "\n".join(p.read_text() for p in code)
    defined = set(re.findall(r"^\s*(?:async )?(?:def|class) (\w+)", code_text, re.M))
    defined |= set(re.findall(r"^\s*(?:self\.)?(\w+)\s*[:=]", code_text, re.M))
    test_files: dict[str, set[str]] = {}
    for path in tests:
        for name in re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M):
            test_files.setdefault(name, set()).add(path.as_posix())
    paths = [p.as_posix() for p in code + tests]
    bad = []
    for n, line in enumerate(notes.read_text().splitlines(), 1):
        for ref in (t.strip() for t in re.findall(r"`([^`\n]+)`", line)):
            where = f"{notes.name}:{n}: {ref}"
            if m := re.fullmatch(r"(?:tests/)?([\w/]+\.py)::(test_\w+)(\[.*\])?", ref):
                if not any(f.endswith("/" + m.group(1)) for f in test_files.get(m.group(2), ())):
                    bad.append(where)
            elif m := re.fullmatch(r"(test_\w+)(\[.*\])?", ref):
                if m.group(1) not in test_files and not any(p.stem == m.group(1) for p in tests):
                    bad.append(where)
            elif re.fullmatch(r"[\w/]+\.py", ref):
                if not any(p.endswith("/" + ref) for p in paths):
                    bad.append(where)
            elif m := re.fullmatch(r"(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)(\(\))?", ref):
                module = ref.removeprefix("shardkv.").replace(".", "/")
                is_module = (ROOT / "shardkv" / f"{module}.py").exists() or (ROOT / "shardkv" / module).is_dir()
                is_module |= ref == "shardkv.transformers"
                if not is_module and not ref.startswith(FOREIGN) and m.group(1) not in defined:
                    bad.append(where)
    return bad


def test_every_reference_of_the_spec_notes_resolves() -> None:
    code, tests = _sources()
    notes = sorted((ROOT / "spec_notes").glob("*.md"))
    assert len(notes) == 3
    assert [ref for path in notes for ref in _unresolved(path, code, tests)] == []


def test_the_reference_check_sees_a_stale_reference(tmp_path: Path) -> None:
    code, tests = _sources()
    notes = tmp_path / "notes.md"
    notes.write_text(
        "| `test_codec.py::test_no_such_test` | `shardkv/no_such_module.py` | `ShardLayout.no_such_method` |\n"
        "| `test_codec.py::test_name_must_be_sharding_indexed` | `format/layout.py` | `ShardLayout.encode_shard` |\n"
    )
    assert [ref.split(": ", 1)[1] for ref in _unresolved(notes, code, tests)] == [
        "test_codec.py::test_no_such_test",
        "shardkv/no_such_module.py",
        "ShardLayout.no_such_method",
    ]
