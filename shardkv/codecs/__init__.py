"""Codecs: the v1.0 sharding_indexed codec (array -> bytes) and the inner codec pipeline.

``sharding_indexed`` is registered here, once the package is imported (before
any of its modules), so nested sharding resolves through ``codec_from_config``.
"""

from shardkv.codecs import numcodecs_v3  # noqa: F401 - registers the v2 filter and object codecs
from shardkv.codecs.inner import register_codec
from shardkv.codecs.sharding import ShardingCodec

register_codec(ShardingCodec.name, ShardingCodec.from_config)
