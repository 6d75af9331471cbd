"""Metadata views, pure logic.

The v3 zarr.json of a sharded v2 array, the v2 documents presented for v3 arrays, the 2022 draft metadata.
"""
