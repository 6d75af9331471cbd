"""``info`` and ``verify`` on the destination of an interrupted ``convert`` or ``unshard``.

The destination of an interrupted run holds shards and the run's progress manifest but no
metadata yet (metadata is written last): both commands say which run is unfinished there and
the exact command that resumes it, and that command, run as printed, completes the run.
The runs are interrupted in this process at a chosen shard (the manifest's ``record`` raises
``KeyboardInterrupt`` after writing itself), so nothing races a signal.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.cli.main import main
from shardkv.cli.manifest import Manifest, find_unfinished
from shardkv.storage.open import open_kv


def _source(root: Path) -> Path:
    g = zarr.open_group(str(root), mode="w")
    g.create_dataset("a", data=np.arange(80, dtype="i4"), chunks=(2,))
    g.create_dataset("b", data=np.arange(64.0).reshape(8, 8), chunks=(2, 2))
    return root


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, n_shards: int) -> None:
    """The run stops (as at Ctrl-C) right after the manifest records its ``n_shards``-th shard."""
    record = Manifest.record
    seen: list[int] = []

    def interrupted(self: Manifest, *args: object, **kwargs: object) -> None:
        record(self, *args, **kwargs)  # type: ignore[arg-type]
        self.flush()
        seen.append(1)
        if len(seen) == n_shards:
            raise KeyboardInterrupt

    monkeypatch.setattr(Manifest, "record", interrupted)


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return status, err[0]


def _resume(line: str) -> list[str]:
    words = shlex.split(line.split("resume it with: ", 1)[1])
    assert words[0] == "shardkv"
    return words[1:]


@pytest.mark.parametrize(
    "options", [[], ["--index-location", "start", "--no-checksum", "--all-v3"]], ids=["default", "options"]
)
def test_info_and_verify_on_an_interrupted_convert_say_how_to_resume(tmp_path, monkeypatch, capsys, options):
    src, dst = _source(tmp_path / "in.zarr"), tmp_path / "out.zarr"
    command = ["convert", str(src), str(dst), "--chunks-per-shard", "2", "--no-progress", *options]
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 5)
        assert main(command) == 130
    capsys.readouterr()
    for cmd in ("info", "verify"):
        status, line = _one_line(capsys, [cmd, str(dst)])
        assert status == 1
        assert f"{dst} holds a conversion from {src} in progress" in line, line
        assert "5 shards of 1 arrays finished" in line, line
        assert "not a Zarr v2 hierarchy" not in line
    resume = _resume(line)
    assert resume[:5] == ["convert", str(src), str(dst), "--chunks-per-shard", "2"]
    assert sorted(resume[5:]) == sorted(o for o in options)
    assert main(resume) == 0
    capsys.readouterr()
    assert main(["info", str(dst)]) == 0 and main(["verify", str(dst)]) == 0
    with ShardedStore(str(dst)) as store:
        np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[...], np.arange(80, dtype="i4"))


def test_info_and_verify_on_an_interrupted_unshard_say_how_to_resume(tmp_path, monkeypatch, capsys):
    src, sharded, plain = _source(tmp_path / "in.zarr"), tmp_path / "sharded.zarr", tmp_path / "plain.zarr"
    assert main(["convert", str(src), str(sharded), "--chunks-per-shard", "2", "--no-progress"]) == 0
    capsys.readouterr()
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 3)
        assert main(["unshard", str(sharded), str(plain), "--no-progress"]) == 130
    capsys.readouterr()
    for cmd in ("info", "verify"):
        status, line = _one_line(capsys, [cmd, str(plain)])
        assert status == 1 and f"{plain} holds an unshard from {sharded} in progress" in line, line
    assert _resume(line) == ["unshard", str(sharded), str(plain)]
    assert main(_resume(line)) == 0
    np.testing.assert_array_equal(zarr.open_array(str(plain), path="b", mode="r")[...], np.arange(64.0).reshape(8, 8))


def test_an_unreadable_manifest_is_named_with_overwrite(tmp_path):
    kv = open_kv(str(tmp_path / "d"))
    kv.put(".shardkv-convert-progress", b"\xc1 not msgpack")
    run = find_unfinished(kv)
    assert run is not None and run.src is None
    assert "--overwrite (its manifest cannot be read)" in run.describe("d")


def test_a_url_destination_reminds_of_storage_options():
    from shardkv.cli.manifest import UnfinishedRun

    run = UnfinishedRun("convert", "s3://b/in.zarr", {"chunks_per_shard": [2, 2, 1]}, {"skip_mismatched": True}, 4, 2)
    assert run.resume_command("s3://b/out.zarr") == (
        "shardkv convert s3://b/in.zarr s3://b/out.zarr --chunks-per-shard 2,2,1 --skip-mismatched"
        " (with the --storage-options it was given, if any)"
    )


def _stored(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def test_a_resumed_unshard_reports_the_whole_job_then_this_run(tmp_path, monkeypatch):
    from shardkv.cli.convert import convert
    from shardkv.cli.unshard import unshard

    src, sharded = _source(tmp_path / "in.zarr"), tmp_path / "sharded.zarr"
    convert(str(src), str(sharded), 2)
    whole = unshard(str(sharded), str(tmp_path / "one-shot.zarr"))
    resumed_dst = tmp_path / "resumed.zarr"
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 7)
        with pytest.raises(KeyboardInterrupt):
            unshard(str(sharded), str(resumed_dst))
    resumed = unshard(str(sharded), str(resumed_dst))
    assert resumed.shards_skipped == 7  # shards of 'a': 2 chunks each
    for field in ("shards", "chunks", "objects_before", "objects_after", "bytes_before", "bytes_after"):
        assert getattr(resumed, field) == getattr(whole, field), field
    # the objects counted are the stored ones (the zarr.json views present .zarray/.zattrs/.zgroup too)
    assert (resumed.objects_before, resumed.bytes_before) == _stored(sharded)
    assert (resumed.objects_after, resumed.bytes_after) == _stored(resumed_dst) == _stored(tmp_path / "one-shot.zarr")
    lines = resumed.summary().splitlines()
    assert f"  chunks: {whole.chunks} taken out of {whole.shards} shards" in lines
    assert (
        f"  resumed: this run took {whole.chunks - 14} chunks out of {whole.shards - 7} shards; an earlier run "
        "had done the other 7 shards (14 chunks)"
    ) in lines


def test_a_resumed_convert_reports_the_whole_job(tmp_path, monkeypatch):
    from shardkv.cli.convert import convert

    src = _source(tmp_path / "in.zarr")
    whole = convert(str(src), str(tmp_path / "one-shot.zarr"), 2)
    dst = tmp_path / "resumed.zarr"
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 7)
        with pytest.raises(KeyboardInterrupt):
            convert(str(src), str(dst), 2)
    resumed = convert(str(src), str(dst), 2)
    assert resumed.shards_skipped >= 7 - 4  # the last 4 recorded are read back, and kept when whole
    for field in ("shards", "chunks", "objects_before", "objects_after", "bytes_before", "bytes_after"):
        assert getattr(resumed, field) == getattr(whole, field), field
    assert (resumed.objects_after, resumed.bytes_after) == _stored(dst)
    assert f"{resumed.shards - resumed.shards_skipped} written now" in resumed.summary()
