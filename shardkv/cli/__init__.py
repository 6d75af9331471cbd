"""The command line and its jobs: convert, info, compact, demo."""
