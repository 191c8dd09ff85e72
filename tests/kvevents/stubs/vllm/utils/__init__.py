"""Stub package (tests/kvevents/stubs/README.md)."""
