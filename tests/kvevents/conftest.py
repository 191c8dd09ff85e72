"""Fixtures for the KV-event tests: the engines' own kv_events modules (see kve_engines.py)."""

from __future__ import annotations

import pytest
from kve_engines import load


@pytest.fixture(scope="session")
def vllm_kv():
    return load("vllm")


@pytest.fixture(scope="session")
def sglang_kv():
    return load("sglang")


@pytest.fixture
def ipc(tmp_path):
    """A fresh ipc:// endpoint per name, in this test's own folder."""
    def make(name: str) -> str:
        return f"ipc://{tmp_path}/{name}.sock"
    return make
