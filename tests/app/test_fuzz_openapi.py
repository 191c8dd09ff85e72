"""Schemathesis over /openapi.json: no generated input may make the server answer 5xx."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from apputil import SMALL  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402

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
