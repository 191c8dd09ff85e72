"""Fixtures for the server tests (the helpers live in apputil.py)."""

from __future__ import annotations

import pytest
from apputil import Server, make_client


@pytest.fixture
def client():
    with make_client() as c:
        yield c


@pytest.fixture
def authed():
    with make_client(token="s3cret") as c:
        yield c


@pytest.fixture(scope="module")
def server():
    srv = Server()
    yield srv
    log = srv.stop()
    assert "Traceback" not in log, log
