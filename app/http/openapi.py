"""The OpenAPI description, completed with what FastAPI cannot infer from the routes.

- every error status a route can answer, each with the one error shape (`Error`), in place of
  FastAPI's `HTTPValidationError` (the server never answers with it: app/http/errors.py);
- the "exactly one of" rules that pydantic checks in `model_validator`s, as `oneOf`;
- the key pattern the server really accepts in a path (no '/', no U+FFFD);
- a bearer security scheme on every gated route, so that /docs can send the token;
- a JSON request body `{}` on the POSTs that take no fields (the server wants the media type).

Done as a post-processing pass over the generated description, so new routes get it too.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .auth import MUTATING, is_public

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {
        "type": "object",
        "required": ["code", "message", "details"],
        "properties": {
            "code": {"type": "string", "description": "stable machine-readable name",
                     "examples": ["not_found"]},
            "message": {"type": "string", "description": "what went wrong and what to fix"},
            "details": {"type": "object", "description": "plain values about the failure"},
        },
    }},
}

WHY = {
    401: "the token is missing (when the server has one)",
    403: "wrong token, or Host / Origin not allowed",
    404: "no such pool, allocation, entry or fleet (or what the path names in it)",
    405: "method not allowed on this path (see the Allow header)",
    409: "clashes with current state (`history_reset`: an events cursor from an earlier server)",
    413: "body over the cap, or a request larger than the pool could ever hold (`details.capacity_bytes`)",
    415: "a POST, or a body, without the route's Content-Type (application/json)",
    422: "invalid input; `details.field` names it",
    507: "out of memory now (memory is in use); may succeed later",
}

# Request bodies whose validators require exactly one of two fields.
EXACTLY_ONE = {"SizeIn": ("bytes", "tokens"), "EntryPut": ("bytes", "tokens"),
               "PoolCreate": ("num_blocks", "capacity_bytes")}
# Routes that can run out of memory (507) or be too large for the pool (413).
ALLOCATING = ("/allocations", "/entries/{key}", "/ops", "/workload", "/api/pools")

# What a path parameter `key` may be: the body's key pattern, less '/' (it would end the path
# segment) and U+FFFD (what invalid UTF-8 in a path decodes to; app/schemas/common.py check_key).
PATH_KEY_PATTERN = "^[^\\x00-\\x1f\\x7f-\\x9f/\\ufffd]{1,256}$"


# A POST that takes no fields still declares JSON (app/http/security.py refuses a POST without it).
EMPTY_JSON_BODY = {
    "required": True,
    "description": "No fields: send `{}` (or no body) with `Content-Type: application/json`; a POST "
                   "without it is 415, so that a cross-site form cannot send one.",
    "content": {"application/json": {"schema": {"type": "object", "maxProperties": 0}, "example": {}}},
}


def exactly_one(a: str, b: str) -> list[dict]:
    return [{"required": [a], "properties": {b: {"type": "null"}}},
            {"required": [b], "properties": {a: {"type": "null"}}}]


def error_statuses(method: str, path: str) -> set[int]:
    statuses = {403, 422}
    if path.startswith("/api/"):
        statuses |= {401}
    if "{pool}" in path or "{fleet}" in path:
        statuses.add(404)
    if path.endswith("/events") or "/entries" in path or path.endswith("/cache/policy"):
        statuses.add(409)  # history_reset; a pool without a cache
    if method.upper() in MUTATING:
        statuses |= {409, 413, 415}
        if path.endswith(ALLOCATING):
            statuses.add(507)
    return statuses


def complete(schema: dict, token_required: bool = True) -> dict:
    """Add error responses, oneOf rules, the path key pattern and bearer security (in place).
    Without a token on the server the bearer scheme is declared but optional (`{}` allowed)."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Error"] = ERROR_SCHEMA
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    for name, (a, b) in EXACTLY_ONE.items():
        if name in schemas:
            schemas[name]["oneOf"] = exactly_one(a, b)
            schemas[name].setdefault("description", f"Give exactly one of '{a}' or '{b}'.")
    if "PoolCreate" in schemas:  # and a block size: `block_bytes`, or a `model` to derive it from
        schemas["PoolCreate"]["anyOf"] = [
            {"required": ["block_bytes"], "properties": {"block_bytes": {"type": "integer"}}},
            {"required": ["model"], "properties": {"model": {"type": "string"}}}]
    components["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer",
        "description": "KVSCOPE_TOKEN (or the one the server printed at start); "
                       "required on every /api route when the server has one"}}
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            if method.upper() not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                continue
            responses = op.setdefault("responses", {})
            for status in sorted(error_statuses(method, path)):
                responses[str(status)] = {"description": WHY[status], **ref}
            if method.upper() == "POST" and "requestBody" not in op:
                op["requestBody"] = EMPTY_JSON_BODY
            if not is_public(path):
                op["security"] = [{"bearer": []}] if token_required else [{}, {"bearer": []}]
            for param in op.get("parameters", ()):
                if param.get("in") == "path" and param.get("name") == "key":
                    param["schema"]["pattern"] = PATH_KEY_PATTERN
    return schema


def install_openapi(app: FastAPI, token_required: bool) -> None:
    """Replace `app.openapi` with one that completes the generated description once
    (`token_required`: the server asks for a bearer token)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = complete(get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes),
                token_required=token_required)
        return app.openapi_schema

    app.openapi = openapi
