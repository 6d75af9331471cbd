"""Adapters over the base store: the only code that touches a store (fsspec, mappings, zarr-python 2 stores)."""
