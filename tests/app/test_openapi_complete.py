"""The OpenAPI description says what the server really does (app/http/openapi.py): every error
status with the one error shape, the exactly-one-of rules, the path key pattern, a JSON body on
the POSTs without fields."""

from __future__ import annotations

import re

import pytest


@pytest.fixture(scope="module")
def spec():
    from support.apputil import make_client

    with make_client() as c:
        return c.get("/openapi.json").json()


def test_every_operation_lists_its_errors_with_the_error_schema(spec):
    ref = {"$ref": "#/components/schemas/Error"}
    for path, item in spec["paths"].items():
        for method, op in item.items():
            errors = {s: r for s, r in op["responses"].items() if s[0] in "45"}
            assert "422" in errors and "403" in errors, (method, path)
            if path.startswith("/api/"):
                assert "401" in errors, (method, path)
            if "{pool}" in path or "{fleet}" in path:
                assert "404" in errors, (method, path)
            if method in ("post", "put", "delete"):
                assert {"409", "413", "415"} <= set(errors), (method, path)
            for status, response in errors.items():
                assert response["content"]["application/json"]["schema"] == ref, (method, path, status)
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def branch_holds(branch: dict, body: dict) -> bool:
    """The little of JSON Schema the oneOf/anyOf branches use: `required`, and `type` null /
    integer / string on the named properties."""
    kinds = {"null": type(None), "integer": int, "string": str}
    if any(k not in body for k in branch.get("required", ())):
        return False
    return all(k not in body or isinstance(body[k], kinds[rule["type"]])
               for k, rule in branch.get("properties", {}).items())


@pytest.mark.parametrize("name,body,valid", [
    ("SizeIn", {"bytes": 1}, True), ("SizeIn", {"tokens": 1}, True), ("SizeIn", {"bytes": 1, "tokens": None}, True),
    ("SizeIn", {"bytes": 1, "tokens": 1}, False), ("SizeIn", {}, False),
    ("EntryPut", {"tokens": 3}, True), ("EntryPut", {"bytes": 1, "tokens": 1}, False),
    ("PoolCreate", {"name": "a", "num_blocks": 4, "block_bytes": 64}, True),
    ("PoolCreate", {"name": "a", "capacity_bytes": 64, "model": "tiny"}, True),
    ("PoolCreate", {"name": "a", "num_blocks": 4, "capacity_bytes": 64, "block_bytes": 64}, False),
    ("PoolCreate", {"name": "a", "num_blocks": 4}, False),
])
def test_the_exactly_one_of_rules_are_in_the_schema(spec, name, body, valid):
    schema = spec["components"]["schemas"][name]
    one = sum(branch_holds(b, body) for b in schema["oneOf"]) == 1
    some = any(branch_holds(b, body) for b in schema["anyOf"]) if "anyOf" in schema else True
    assert (one and some) is valid


def test_the_path_key_pattern_is_what_the_server_accepts(spec, client):
    param = next(p for p in spec["paths"]["/api/pools/{pool}/entries/{key}"]["get"]["parameters"]
                 if p["name"] == "key")
    pattern = re.compile(param["schema"]["pattern"])
    assert pattern.match("café 1") and not pattern.match("a/b") and not pattern.match("a\ufffdb")
    assert not pattern.match("") and not pattern.match("k" * 257)


def test_fieldless_posts_declare_an_empty_json_body(spec):
    body = spec["paths"]["/api/pools/{pool}/reset"]["post"]["requestBody"]
    assert body["required"] and "application/json" in body["content"]
