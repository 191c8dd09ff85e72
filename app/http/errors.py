"""The one place that turns failures into HTTP errors: `{"error": {code, message, details}}`.

Core errors map by type (NotFound 404, Conflict 409, TooLarge 413, InvalidRequest 422,
OutOfMemory 507); FastAPI's validation errors, and bodies that are not JSON, become 422
naming the field (`body` for unparsable JSON); auth and body-size errors are `ApiError`s, also
when FastAPI wraps one raised while it reads the body. Routes never catch core errors themselves.
Anything else is a bug, answered 500 `internal` by InternalErrorMiddleware.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from allocator.errors import Conflict, InvalidRequest, KVScopeError, NotFound, OutOfMemory, TooLarge

from .routing_index import flat_routes

log = logging.getLogger("kvscope")

# Most specific first: TooLarge is an InvalidRequest.
STATUS_OF: tuple[tuple[type[KVScopeError], int], ...] = (
    (NotFound, 404),
    (Conflict, 409),
    (TooLarge, 413),
    (InvalidRequest, 422),
    (OutOfMemory, 507),
)

HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
              405: "method_not_allowed", 406: "not_acceptable", 409: "conflict",
              413: "too_large", 415: "unsupported_media_type", 422: "invalid_request",
              431: "headers_too_large"}


# FastAPI's detail on the 400 it raises when reading a JSON body fails other than by a decode error.
BODY_PARSE_FAILED = "There was an error parsing the body"


class ApiError(Exception):
    """An HTTP-level failure that is not the core's (auth, body size)."""

    def __init__(self, status: int, code: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}


def error_body(code: str, message: str, details: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def status_of(exc: KVScopeError) -> int:
    for cls, status in STATUS_OF:
        if isinstance(exc, cls):
            return status
    return 422


def core_error_result(exc: KVScopeError) -> dict:
    """The `error` object of a failed batch op (same shape as an HTTP error body)."""
    return error_body(exc.code, str(exc), _jsonable(exc.details()))["error"]


def _jsonable(details: dict) -> dict:
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
            for k, v in details.items()}


def _field_of(err: dict) -> str:
    if err.get("type") == "json_invalid":  # its loc is ("body", character offset)
        return "body"
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
    return ".".join(loc) or "body"


def _message_of(err: dict) -> str:
    msg = str(err.get("msg", "invalid value"))
    if err.get("type") == "json_invalid":
        loc = err.get("loc", ())
        reason = (err.get("ctx") or {}).get("error")
        where = f" at position {loc[-1]}" if len(loc) > 1 else ""
        return f"{msg}{where}" + (f": {reason}" if reason else "")
    return msg


async def handle_core(request: Request, exc: KVScopeError) -> JSONResponse:
    return JSONResponse({"error": core_error_result(exc)}, status_code=status_of(exc))


async def handle_api(request: Request, exc: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(error_body(exc.code, exc.message, exc.details), exc.status, headers=headers)


async def handle_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    field = _field_of(first) if first else "body"
    message = f"{field}: {_message_of(first)}" if first else "invalid request"
    problems = [{"field": _field_of(e), "message": _message_of(e)} for e in errors[:20]]
    return JSONResponse(error_body("invalid_request", message, {"field": field, "errors": problems}), 422)


async def handle_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    # An ApiError raised while FastAPI reads the body (the body cap, app/http/limits.py, counting a
    # chunked body) reaches here wrapped in FastAPI's 400: answer with the ApiError itself.
    if isinstance(exc.__cause__, ApiError):
        return await handle_api(request, exc.__cause__)
    if exc.status_code == 400 and exc.detail == BODY_PARSE_FAILED:
        return _unparsable_body(exc.__cause__)
    code = HTTP_CODES.get(exc.status_code, "error")
    headers = getattr(exc, "headers", None)
    if exc.status_code == 405:
        allow = allowed_methods(request)
        headers = {**(headers or {}), "Allow": ", ".join(allow)}
        return JSONResponse(error_body(code, f"{request.method} is not allowed here; use {', '.join(allow)}",
                                       {"allow": allow}), 405, headers=headers)
    return JSONResponse(error_body(code, str(exc.detail)), exc.status_code, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route answers on this path (HEAD with GET: app/http/head.py), sorted.
    Starlette's own 405 names only the first route that matched the path."""
    path = request.url.path
    methods: set[str] = set()
    for route in flat_routes(request.app):
        regex = getattr(route, "path_regex", None)
        if regex is not None and getattr(route, "methods", None) and regex.match(path):
            methods |= set(route.methods)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def _unparsable_body(cause: BaseException | None) -> JSONResponse:
    """FastAPI's 400 for a body `json.loads` gave up on with something other than a decode
    error (nesting past the recursion limit, an integer past int's digit limit): it is invalid
    input like any other, so 422 `invalid_request` on the field `body`."""
    if isinstance(cause, RecursionError):
        reason = "nested too deeply"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        reason = "an integer has too many digits"
    else:
        reason = "not parsable"
    problem = f"invalid JSON ({reason})"
    return JSONResponse(error_body("invalid_request", f"body: {problem}", {
        "field": "body", "errors": [{"field": "body", "message": problem}]}), 422)


INTERNAL_BODY = json.dumps(error_body("internal", "internal server error")).encode()


class InternalErrorMiddleware:
    """Pure-ASGI: an exception no handler above took (a bug: no input may produce a 5xx, and
    tests assert it never happens) is logged and answered 500 `internal` in the error shape,
    and the connection stays usable for the client's next request.

    NOTE: not `add_exception_handler(Exception, ...)`: Starlette gives that handler to its
    outermost ServerErrorMiddleware, which re-raises after answering so the server sees the
    error, and uvicorn then closes the keep-alive connection under the client (the client's
    next request on it fails with a connection reset). Here the exception ends with the answer.
    An exception after the answer started cannot be answered: it propagates, and uvicorn logs
    it and closes the connection, the only way left to tell the client its body is cut short.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            if started:
                raise  # uvicorn logs it (once, however many of these it crosses)
            log.exception("unhandled error on %s %s", scope["method"], scope.get("path", ""))
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(INTERNAL_BODY)).encode())]})
            await send({"type": "http.response.body",
                        "body": b"" if scope["method"] == "HEAD" else INTERNAL_BODY})


def install_error_handlers(app: FastAPI) -> None:
    """The handlers of expected errors; unexpected ones: InternalErrorMiddleware (app/main.py)."""
    app.add_exception_handler(KVScopeError, handle_core)
    app.add_exception_handler(ApiError, handle_api)
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.add_exception_handler(StarletteHTTPException, handle_http)
