"""Stub of the vllm package for kvscope tests (see tests/kvevents/stubs/README.md)."""
