"""Build shim: all configuration lives in setup.cfg."""

from setuptools import setup

setup()
