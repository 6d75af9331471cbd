"""Build shim: the configuration lives in setup.cfg, except the package list found here."""

from setuptools import find_packages, setup

# every package under shardkv/ (a new subpackage needs no edit here), and transformers/, which
# setup.cfg's package_dir installs as shardkv.transformers: no search finds it under that name
setup(packages=[*find_packages(include=["shardkv", "shardkv.*"]), "shardkv.transformers"])
