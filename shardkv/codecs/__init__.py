"""Codecs: the v1.0 sharding_indexed codec (array -> bytes) and the inner codec pipeline.

The codec registry of :mod:`shardkv.codecs.inner` knows the inner codecs on
its own; ``sharding_indexed`` (which itself builds inner pipelines, so
nested sharding works) is registered here, explicitly, once the package is
imported: importing any ``shardkv.codecs.*`` module imports this package
first, so :func:`~shardkv.codecs.inner.codec_from_config` always knows it.
"""

from shardkv.codecs import numcodecs_v3  # noqa: F401 - registers the v2 filter and object codecs
from shardkv.codecs.inner import register_codec
from shardkv.codecs.sharding import ShardingCodec

register_codec(ShardingCodec.name, ShardingCodec.from_config)
