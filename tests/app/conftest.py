"""Fixtures for the server tests (the helpers live in tests/support/apputil.py)."""

from __future__ import annotations

import pytest
from support.apputil import Server, make_client


@pytest.fixture(autouse=True)
def no_internal_errors(caplog):
    """A request that hit a bug (answered 500 `internal` by app/http/errors.py, which logs it) fails
    its test even when the test never looks at that answer: the middleware ends the exception,
    so TestClient no longer re-raises it. A test that causes one on purpose clears the log."""
    yield
    bugs = [r for r in caplog.get_records("call") + caplog.get_records("teardown")
            if r.name == "kvscope" and r.getMessage().startswith("unhandled error")]
    assert not bugs, [r.getMessage() for r in bugs]


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
