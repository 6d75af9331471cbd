"""The command line and ShardedStore against an S3-protocol server on loopback (moto's server).

The server is started on 127.0.0.1 on a free port by the ``s3`` fixture and
stopped at the end of the module; s3fs reaches it through
``client_kwargs={"endpoint_url": ...}`` with dummy credentials given as
storage options (``--storage-options`` on the command line).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import moto_strict
import numpy as np
import pytest
import zarr

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from shardkv import ShardedStore  # noqa: E402

ASTRONAUT = "zarr_implementations/examples/zarr.zr"
BUCKET = "shardkv-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _options(endpoint: str, key: str = "testing", secret: str = "testing") -> dict:
    return {"key": key, "secret": secret, "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


@pytest.fixture(scope="module")
def s3():
    """(endpoint URL, storage options, s3fs filesystem) of a moto S3 server with one bucket."""
    import logging

    import s3fs

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    server, endpoint = moto_strict.start_server()  # conditional writes decided as S3 decides them
    options = _options(endpoint)
    boto3 = pytest.importorskip("boto3")
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    try:
        yield endpoint, options, fs
    finally:
        server.stop()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardkv", *args], capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _unique(name: str) -> str:
    return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}.zarr"


def _objects(fs, url: str) -> dict[str, int]:
    root = url[len("s3://") :]
    fs.invalidate_cache()
    return {p[len(root) + 1 :]: fs.size(p) for p in fs.find(root)}


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _arrays_of(store) -> dict[str, np.ndarray]:
    group = zarr.open_group(store, mode="r")
    return {name: a[...] for name, a in group.arrays()}


def test_convert_local_to_s3_then_info_compact_and_proxy_reads(s3, shared_data):
    endpoint, options, fs = s3
    src, dst = shared_data / ASTRONAUT, _unique("out")
    opts = json.dumps(options)
    proc = run("convert", str(src), dst, "--chunks-per-shard", "2", "--storage-options", opts, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    stored = _objects(fs, dst)
    assert report["objects_after"] == len(stored)
    assert report["shards"] == sum(1 for k in stored if k.rpartition("/")[2][0].isdigit())
    assert not any(".shardkv-convert" in k for k in stored)  # the manifest is gone once complete
    assert report["bytes_after"] == sum(stored.values())

    info = run("info", dst, "--storage-options", opts, "--json")
    assert info.returncode == 0, info.stderr
    arrays = {a["path"]: a for a in json.loads(info.stdout)["arrays"]}
    assert set(arrays) == {"raw", "gzip", "zlib", "blosc"}
    assert all(a["chunks_present"] == 108 and a["chunks_per_shard"] == [2, 2, 2] for a in arrays.values())

    compact = run("compact", dst, "--storage-options", opts)
    assert compact.returncode == 0, compact.stderr
    assert "0 bytes reclaimed" in compact.stdout
    assert _objects(fs, dst) == stored

    expected = _arrays_of(zarr.DirectoryStore(str(src)))
    got = _arrays_of(ShardedStore(dst, storage_options=options))
    assert set(got) == set(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


def test_convert_s3_to_local_equals_a_local_conversion(s3, shared_data, tmp_path):
    endpoint, options, fs = s3
    src = _unique("plain")
    fs.put(str(shared_data / ASTRONAUT), src[len("s3://") :], recursive=True)
    assert len(_objects(fs, src)) == len(_files(shared_data / ASTRONAUT))
    from_s3, local = tmp_path / "from-s3", tmp_path / "local"
    proc = run(
        "convert", src, str(from_s3), "--chunks-per-shard", "3,2,1", "--source-storage-options", json.dumps(options)
    )
    assert proc.returncode == 0, proc.stderr
    assert run("convert", str(shared_data / ASTRONAUT), str(local), "--chunks-per-shard", "3,2,1").returncode == 0
    assert _files(from_s3) == _files(local)


def test_unshard_s3_to_local_is_plain_zarr(s3, shared_data, tmp_path):
    endpoint, options, fs = s3
    sharded = _unique("sharded")
    opts = json.dumps(options)
    assert (
        run(
            "convert", str(shared_data / ASTRONAUT), sharded, "--chunks-per-shard", "4", "--storage-options", opts
        ).returncode
        == 0
    )
    plain = tmp_path / "plain"
    proc = run("unshard", sharded, str(plain), "--source-storage-options", opts, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["chunks"] == 4 * 108 and report["unsharded_arrays"] == 4
    # the chunk files are byte for byte the original ones, and zarr 2 reads them without shardkv
    source_files = _files(shared_data / ASTRONAUT)
    out_files = _files(plain)
    assert {k: v for k, v in out_files.items() if ".z" not in k} == {
        k: v for k, v in source_files.items() if ".z" not in k
    }
    expected = _arrays_of(zarr.DirectoryStore(str(shared_data / ASTRONAUT)))
    got = _arrays_of(zarr.DirectoryStore(str(plain)))
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


def test_sharded_store_writes_and_reads_on_s3(s3):
    endpoint, options, fs = s3
    url = _unique("written")
    data = np.arange(60 * 80, dtype="<i4").reshape(60, 80)
    with ShardedStore(url, chunks_per_shard=2, storage_options=options) as store:
        z = zarr.create(shape=data.shape, chunks=(10, 10), dtype=data.dtype, store=store)
        z[...] = data
    stored = _objects(fs, url)
    shards = sorted(k for k in stored if k[0].isdigit())
    assert shards == [f"{i}.{j}" for i in range(3) for j in range(4)]  # 6 x 8 chunks in 3 x 4 shards
    assert set(stored) - set(shards) == {"zarr.json"}  # v3 only
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(url, storage_options=options), mode="r")[...], data)


def test_missing_bucket_is_one_line_and_never_created(s3, shared_data):
    endpoint, options, fs = s3
    opts = json.dumps(options)
    proc = run(
        "convert",
        str(shared_data / ASTRONAUT),
        "s3://no-such-bucket-x/out.zarr",
        "--chunks-per-shard",
        "2",
        "--storage-options",
        opts,
    )
    line = assert_one_line_error(proc, "s3://no-such-bucket-x/out.zarr", "no-such-bucket-x", "does not exist")
    assert "never creates" in line
    fs.invalidate_cache()
    assert "no-such-bucket-x" not in [b.rstrip("/") for b in fs.ls("")]
    assert_one_line_error(run("info", "s3://no-such-bucket-x/x.zarr", "--storage-options", opts), "does not exist")


def test_sharded_store_never_creates_a_bucket(s3):
    endpoint, options, fs = s3
    store = ShardedStore("s3://typo-bucket-y/data.zarr", chunks_per_shard=2, storage_options=options)
    with pytest.raises(FileNotFoundError):
        zarr.create(shape=(4,), chunks=(2,), dtype="u1", store=store)
    fs.invalidate_cache()
    assert "typo-bucket-y" not in [b.rstrip("/") for b in fs.ls("")]


def test_unreachable_endpoint_is_one_line(s3):
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    options = {**_options(dead), "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}
    start = time.monotonic()
    proc = run("info", f"s3://{BUCKET}/x.zarr", "--storage-options", json.dumps(options))
    assert_one_line_error(proc, f"s3://{BUCKET}/x.zarr", "cannot reach")
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 60


def test_an_access_key_the_server_does_not_know_is_a_credentials_error(s3, monkeypatch):
    # s3fs turns InvalidAccessKeyId into a PermissionError whose message ("The AWS Access Key Id
    # you provided does not exist in our records.") names no code: the code is in its cause
    import moto.settings

    endpoint, _, _ = s3
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server checks credentials now
    proc = run("info", f"s3://{BUCKET}/x.zarr", "--storage-options", json.dumps(_options(endpoint, key="wrong")))
    line = assert_one_line_error(proc, f"s3://{BUCKET}/x.zarr", "credentials for the store are missing or refused")
    assert "denied" not in line


def test_valid_credentials_without_permission_are_access_denied(s3, monkeypatch):
    import boto3
    import moto.settings

    endpoint, _, _ = s3
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    iam.create_user(UserName="no-policy")
    key = iam.create_access_key(UserName="no-policy")["AccessKey"]
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server checks credentials now
    options = _options(endpoint, key=key["AccessKeyId"], secret=key["SecretAccessKey"])
    proc = run("info", f"s3://{BUCKET}/x.zarr", "--storage-options", json.dumps(options))
    line = assert_one_line_error(proc, f"s3://{BUCKET}/x.zarr", f"access to bucket '{BUCKET}' denied")
    assert "credentials" not in line


def test_bad_storage_options_are_usage_errors():
    proc = run("info", "s3://b/x.zarr", "--storage-options", "{not json")
    assert proc.returncode == 2 and "--storage-options" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run("info", "s3://b/x.zarr", "--storage-options", "[1, 2]")
    assert proc.returncode == 2 and "JSON object" in proc.stderr


def test_verify_on_s3_passes_a_converted_store_and_names_a_damaged_shard(s3, shared_data):
    endpoint, options, fs = s3
    url, opts = _unique("verify"), json.dumps(options)
    assert (
        run(
            "convert", str(shared_data / ASTRONAUT), url, "--chunks-per-shard", "2", "--storage-options", opts
        ).returncode
        == 0
    )
    clean = run("verify", url, "--decode", "--storage-options", opts)
    assert clean.returncode == 0, clean.stderr
    assert ", 0 damaged" in clean.stdout and clean.stdout.strip().endswith("ok")

    shard = sorted(k for k in _objects(fs, url) if k.startswith("raw/") and k.rpartition("/")[2][0].isdigit())[0]
    path = f"{url[len('s3://') :]}/{shard}"
    blob = bytearray(fs.cat_file(path))
    blob[-5] ^= 0xFF  # the last byte of the index entries (v1.0 index at the end, then its 4-byte CRC32C)
    fs.pipe_file(path, bytes(blob))
    damaged = run("verify", url, "--storage-options", opts)
    assert damaged.returncode == 1, damaged.stderr
    assert f"DAMAGED {shard}: " in damaged.stdout and "crc32c mismatch" in damaged.stdout
    assert damaged.stdout.count("DAMAGED") == 1 and damaged.stdout.strip().endswith("damage found")


def test_verify_on_a_missing_bucket_is_one_line(s3):
    endpoint, options, fs = s3
    proc = run("verify", "s3://no-such-bucket-v/x.zarr", "--storage-options", json.dumps(options))
    assert_one_line_error(proc, "s3://no-such-bucket-v/x.zarr", "does not exist")
    assert "Traceback" not in proc.stderr
