"""Schemathesis over /openapi.json: no generated input may make the server answer 5xx.

Twice: in process (ASGI, many examples, fast) and against a real uvicorn on loopback (fewer
examples), so that the HTTP server's own parsing and the middleware see the same inputs.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from support.apputil import SMALL

from app.main import create_app
from app.settings import Settings

APP = create_app(Settings(**{**SMALL, "max_pools": 4, "max_blocks": 4096, "max_pool_bytes": 4 << 20}))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def _lifespan():
    from fastapi.testclient import TestClient

    with TestClient(APP):  # runs the lifespan: the `default` pool exists while fuzzing
        yield


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_input_yields_a_server_error(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.path_parameters, case.body,
                                        response.status_code, response.text[:500])


# The same description, sent over real HTTP (a schema from a dict has no app to call in-process).
http_schema = schemathesis.openapi.from_dict(APP.openapi())


@http_schema.parametrize()
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_input_over_real_http_yields_a_server_error(case, server):
    response = case.call(base_url=server.url)  # the real uvicorn of conftest's `server` fixture
    assert response.status_code < 500, (case.method, case.path, case.path_parameters, case.body,
                                        response.status_code, response.text[:500])
