"""The error hierarchy: every shardkv error is a ShardKVError *and* the builtin it resembles,
carries the data that explains it, and says so in its message."""

from __future__ import annotations

import pytest

import shardkv
from shardkv import errors


@pytest.mark.parametrize(
    "cls, builtin",
    [
        pytest.param(errors.InvalidKeyError, ValueError, id="InvalidKeyError-ValueError"),
        pytest.param(errors.ChunkOutOfGridError, ValueError, id="ChunkOutOfGridError-ValueError"),
        pytest.param(errors.ReservedKeyError, ValueError, id="ReservedKeyError-ValueError"),
        pytest.param(errors.ConfigurationError, ValueError, id="ConfigurationError-ValueError"),
        pytest.param(errors.CorruptShardError, ValueError, id="CorruptShardError-ValueError"),
        pytest.param(errors.ChecksumError, ValueError, id="ChecksumError-ValueError"),
        pytest.param(errors.UnsupportedError, NotImplementedError, id="UnsupportedError-NotImplementedError"),
        pytest.param(errors.MetadataError, ValueError, id="MetadataError-ValueError"),
        pytest.param(errors.LockTimeoutError, TimeoutError, id="LockTimeoutError-TimeoutError"),
        pytest.param(errors.ConcurrentUpdateError, RuntimeError, id="ConcurrentUpdateError-RuntimeError"),
        pytest.param(errors.JournalCorruptError, ValueError, id="JournalCorruptError-ValueError"),
        pytest.param(errors.JournalMismatchError, ValueError, id="JournalMismatchError-ValueError"),
    ],
)
def test_every_error_is_a_shardkv_error_and_its_builtin(cls: type, builtin: type) -> None:
    assert issubclass(cls, errors.ShardKVError)
    assert issubclass(cls, builtin)
    # never a KeyError: a KeyError means "missing chunk, use the fill value" to zarr
    assert not issubclass(cls, KeyError)


def test_key_errors_are_invalid_key_errors() -> None:
    assert issubclass(errors.ChunkOutOfGridError, errors.InvalidKeyError)
    assert issubclass(errors.ReservedKeyError, errors.InvalidKeyError)
    assert issubclass(errors.ChecksumError, errors.CorruptShardError)


def test_invalid_key_error_carries_key_and_reason() -> None:
    exc = errors.InvalidKeyError("a/../b", "path segment '..' is not allowed")
    assert exc.key == "a/../b"
    assert exc.reason == "path segment '..' is not allowed"
    assert "'a/../b'" in str(exc) and "'..'" in str(exc)


def test_chunk_out_of_grid_error_names_coords_and_grid() -> None:
    exc = errors.ChunkOutOfGridError("arr/7.1", (7, 1), (3, 4))
    assert exc.key == "arr/7.1"
    assert exc.chunk_coords == (7, 1)
    assert exc.grid_shape == (3, 4)
    assert "(7, 1)" in str(exc) and "(3, 4)" in str(exc) and "'arr/7.1'" in str(exc)


def test_configuration_error_names_path_when_known() -> None:
    assert str(errors.ConfigurationError("bad", "g/a")) == "array 'g/a': bad"
    assert str(errors.ConfigurationError("bad")) == "bad"
    assert errors.ConfigurationError("bad", "g/a").path == "g/a"


def test_corrupt_shard_error_names_shard_key() -> None:
    exc = errors.CorruptShardError("arr/0.1", "truncated")
    assert exc.shard_key == "arr/0.1" and exc.reason == "truncated"
    assert "'arr/0.1'" in str(exc) and "truncated" in str(exc)


def test_checksum_error_shows_stored_and_computed() -> None:
    exc = errors.ChecksumError("arr/0", 0xDEADBEEF, 0x01020304)
    assert (exc.stored, exc.computed) == (0xDEADBEEF, 0x01020304)
    assert exc.shard_key == "arr/0"
    assert "0xdeadbeef" in str(exc) and "0x01020304" in str(exc)


def test_public_names_are_exported() -> None:
    for name in shardkv.__all__:
        assert hasattr(shardkv, name), name
    assert shardkv.EMPTY == 2**64 - 1


def test_the_one_key_error_is_a_key_below_a_stored_key() -> None:
    """``KeyBelowKeyError`` is raised on a write only (zarr 2's stores refuse such a key with KeyError); no read
    error is ever a KeyError, which zarr would take for a missing chunk."""
    assert issubclass(errors.KeyBelowKeyError, KeyError)
    keyish = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, KeyError)]
    assert keyish == [errors.KeyBelowKeyError]


def test_a_journal_held_elsewhere_is_a_lock_timeout_naming_the_journal() -> None:
    exc = errors.LockTimeoutError("journal '/x/wb.journal'", 0.0, "it is open in another process", path="/x/wb.journal")
    assert str(exc) == "could not lock journal '/x/wb.journal': it is open in another process"
    assert exc.path == "/x/wb.journal" and isinstance(exc, OSError)
    waited = errors.LockTimeoutError("/d/.shardkv-locks/3.lock", 2.5)
    assert str(waited) == "could not lock /d/.shardkv-locks/3.lock within 2.5 s: another writer holds it"
    shard = errors.LockTimeoutError(
        "lock file '/d/.shardkv-locks/3.lock'", 2.5, "held", "/d/.shardkv-locks/3.lock", "c0"
    )
    assert str(shard) == "could not lock shard 'c0' (lock file '/d/.shardkv-locks/3.lock') within 2.5 s: held"
    assert (shard.shard_key, shard.path) == ("c0", "/d/.shardkv-locks/3.lock")


def test_concurrent_update_message_names_no_option_that_does_not_exist() -> None:
    exc = errors.ConcurrentUpdateError("a/0.0", 8, 8)
    assert "'a/0.0'" in str(exc) and "8 of 8" in str(exc) and "max_attempts" not in str(exc)
    assert exc.operation == "update" and str(exc).startswith("conditional update of 'a/0.0' failed")
    read = errors.ConcurrentUpdateError("a/0.0", 8, 8, operation="read")
    assert str(read).startswith("conditional read of 'a/0.0' failed") and "in 8 of 8 rounds" in str(read)
