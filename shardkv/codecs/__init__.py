"""Codecs: the v1.0 sharding_indexed codec (array -> bytes) and the inner codec pipeline."""
