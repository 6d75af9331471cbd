"""Storage transformers (installed as ``shardkv.transformers``)."""
