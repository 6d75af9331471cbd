"""Metadata documents, pure logic: v3, v2 and 2022 draft documents, the plans of a sharded hierarchy, the node table."""
