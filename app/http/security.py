"""Cross-site and auth gate for every request, as a pure-ASGI middleware (outermost).

What Jupyter Server does for a tool that listens on localhost, in one place so that every route,
present or future, gets it without naming it:

1. `Host` must be a loopback name (`localhost`, `*.localhost`, `127.x.x.x`, `::1`), the host the
   server was told to listen on, or in `KVSCOPE_ALLOWED_HOSTS` ("*" = any; the default when
   listening on all interfaces). Else 403 `host_not_allowed`: a DNS-rebinding page reaches the
   server under its own name and is refused.
2. A mutating request (POST, PUT, PATCH, DELETE) or a websocket handshake that carries an
   `Origin` must come from the server's own origin (host:port of the `Host` header) or one in
   `KVSCOPE_ALLOWED_ORIGINS`. Else 403 `origin_not_allowed` (a websocket is refused before it
   opens: the browser sees the handshake fail). Requests without `Origin` are not from a
   browser page, and go on to the token.
3. A mutating request with a body, or with a Content-Type, must declare the media type of
   its route (`application/json`; the raw-data upload and the recording upload
   `application/octet-stream`: a file is bytes, not JSON). Else 415 `unsupported_media_type`.
   Neither is a CORS-safelisted type, so a browser has to preflight, which the server never
   grants: a cross-site form post cannot be sent. A POST with neither body nor Content-Type
   (`curl -X POST`, `httpx.post(url)`) passes when nothing marks it as sent by another site:
   its Origin, if any, passed rule 2, and `Sec-Fetch-Site` is absent, `same-origin` or `none`
   (a user's own navigation). A browser sends such a bodiless POST cross-site only with the
   page's Origin (refused by rule 2) and, in every current browser, `Sec-Fetch-Site:
   cross-site` or `same-site` (refused here with 415).
   (Checked after the token, so an unauthenticated caller learns nothing about routes.)
4. The token (app/http/auth.py) on every path but the public ones; websockets get close 4401/4403.
5. Security headers on every HTTP answer: a CSP without inline scripts or styles,
   `X-Content-Type-Options`, `X-Frame-Options` and `frame-ancestors`, `Referrer-Policy`.
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import parse_qs, urlsplit

from starlette.routing import Match

from .auth import MUTATING, is_public, token_error, token_problem
from .errors import error_body
from .routing_index import flat_routes

CLOSE_TOKEN_MISSING = 4401
CLOSE_TOKEN_WRONG = 4403

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
# Swagger UI (vendored) sets style attributes from its scripts; it still runs no inline script.
DOCS_CSP = CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")
SECURITY_HEADERS = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)

JSON = "application/json"
# Sec-Fetch-Site values that do not say "another site sent this" (absent: not a browser).
FIRST_PARTY_FETCH_SITES = frozenset({"same-origin", "none"})
MAX_HEADER_BYTES = 16 * 1024  # as uvicorn's h11_max_incomplete_event_size (app/http/protocol.py)


def hostname_of(host: str) -> str:
    """The name part of a Host header or netloc ("[::1]:8000" -> "::1"), lowercased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_loopback_bind(bind_host: str) -> bool:
    """Whether listening on `bind_host` keeps the server to this machine."""
    return is_loopback(hostname_of(bind_host)) if bind_host.strip() not in WILDCARD_BINDS else False


def allowed_hosts_for(bind_host: str, configured: tuple[str, ...] | None) -> tuple[str, ...]:
    """Names besides loopback that `Host` may carry: the configured list, else any name ("*")
    when listening on all interfaces, else the one name the server listens on."""
    if configured is not None:
        return configured
    bind = bind_host.strip().lower()
    if bind in WILDCARD_BINDS:
        return ("*",)
    return (hostname_of(bind),)


def media_type(content_type: str | None) -> str:
    return (content_type or "").partition(";")[0].strip().lower()


class SecurityMiddleware:
    """Host, Origin, media-type and token checks, and security headers (module docstring).

    `allowed_hosts` and `allowed_origins` are fixed at construction; "*" in either allows any.
    """

    def __init__(self, app, settings) -> None:
        self.app = app
        self.settings = settings
        self.allowed_hosts = frozenset(allowed_hosts_for(settings.host, settings.allowed_hosts))
        self.allowed_origins = frozenset(o.lower().rstrip("/") for o in settings.allowed_origins)
        self._media_types: dict[int, frozenset[str]] = {}
        self._routes: list | None = None  # the app's routes, read at the first request
        self._special: list = []  # those that declare a body type of their own
        self._host_verdicts: dict[str, bool] = {}  # Host header -> allowed (bounded, see host_ok)
        self._csp = CSP.encode()
        self._docs_csp = DOCS_CSP.encode()

    # -- checks ---------------------------------------------------------------------------------
    def host_ok(self, host: str | None) -> bool:
        if host is None or "*" in self.allowed_hosts:
            return True
        verdict = self._host_verdicts.get(host)
        if verdict is None:
            name = hostname_of(host)
            verdict = is_loopback(name) or name in self.allowed_hosts
            if len(self._host_verdicts) < 256:  # a client can send any Host: keep the memo small
                self._host_verdicts[host] = verdict
        return verdict

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        if origin is None or "*" in self.allowed_origins:
            return True
        origin = origin.strip().lower().rstrip("/")
        if origin in self.allowed_origins:
            return True
        parts = urlsplit(origin) if origin != "null" else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            return False
        # Same host and port as the request; the scheme may differ behind a TLS proxy.
        return host is not None and parts.netloc == host.strip().lower()

    def route_media_types(self, scope, only_special: bool = False) -> frozenset[str] | None:
        """The body media types of the route `scope` goes to: what its OpenAPI requestBody
        declares (openapi_extra), else JSON. None when no route takes this method and path
        (the router answers 404 / 405 then). `only_special`: look only at the routes that
        declare a type of their own (None when none of them matches)."""
        app = scope.get("app")
        if self._routes is None and app is not None:
            self._routes = flat_routes(app)
            self._special = [r for r in self._routes
                             if ((getattr(r, "openapi_extra", None) or {}).get("requestBody") or {}).get("content")]
        for route in (self._special if only_special else self._routes) or ():
            match, _ = route.matches(scope)
            if match is Match.FULL:
                key = id(route)
                types = self._media_types.get(key)
                if types is None:
                    extra = getattr(route, "openapi_extra", None) or {}
                    content = (extra.get("requestBody") or {}).get("content") or {JSON: {}}
                    types = frozenset(content)
                    self._media_types[key] = types
                return types
        return None

    # -- ASGI ---------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {}
        head_bytes = 0
        for name, value in scope.get("headers", ()):
            head_bytes += len(name) + len(value) + 4
            if name in (b"host", b"origin", b"content-type", b"content-length", b"transfer-encoding",
                        b"authorization", b"sec-fetch-site"):
                headers[name] = value.decode("latin-1")
        host = headers.get(b"host")
        path = scope.get("path", "")
        if kind == "websocket":
            await self._websocket(scope, receive, send, headers, host, path, head_bytes)
            return
        send = self._with_headers(send, path)
        if head_bytes > MAX_HEADER_BYTES:
            # h11 caps a head that arrives in pieces; one that arrives whole is caught here
            await _refuse(send, 431, "headers_too_large",
                          f"request headers of {head_bytes} bytes exceed {MAX_HEADER_BYTES}",
                          {"max_bytes": MAX_HEADER_BYTES})
            return
        if not self.host_ok(host):
            await _refuse(send, 403, "host_not_allowed",
                          f"Host {host!r} is not allowed; add it to KVSCOPE_ALLOWED_HOSTS",
                          {"host": host})
            return
        method = scope["method"]
        if method in MUTATING:
            origin = headers.get(b"origin")
            if not self.origin_ok(origin, host):
                await _refuse(send, 403, "origin_not_allowed",
                              f"requests from origin {origin!r} may not change this server; "
                              "add it to KVSCOPE_ALLOWED_ORIGINS", {"origin": origin})
                return
        if not is_public(path):
            status = token_problem(self.settings.token, headers.get(b"authorization"))
            if status:
                err = token_error(status)
                extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
                await _refuse(send, status, err.code, err.message, err.details, extra)
                return
        if method in MUTATING:
            problem = self._media_problem(scope, method, headers)
            if problem is not None:
                await _refuse(send, 415, "unsupported_media_type", *problem)
                return
        await self.app(scope, receive, send)

    def _media_problem(self, scope, method: str, headers: dict) -> tuple[str, dict] | None:
        declared = headers.get(b"content-type")
        has_body = b"transfer-encoding" in headers or headers.get(b"content-length", "0").strip() not in ("", "0")
        if not has_body and declared is None:
            if method != "POST":
                return None
            site = headers.get(b"sec-fetch-site")
            if site is None or site.strip().lower() in FIRST_PARTY_FETCH_SITES:
                return None  # a script's bare POST; a foreign Origin was refused before this
        given = media_type(declared)
        # Fast path: JSON is every route's type but the few that declare others (the raw-data
        # upload); only those need matching, not the whole route list.
        accepted = self.route_media_types(scope, only_special=given == JSON)
        if accepted is None or given in accepted:
            return None
        want = " or ".join(sorted(accepted))
        what = f"Content-Type {declared!r}" if declared is not None else "no Content-Type"
        return (f"{what}: send Content-Type: {want} (a POST sent by another site too, even without a body)",
                {"content_type": declared, "accepted": sorted(accepted)})

    async def _websocket(self, scope, receive, send, headers, host, path, head_bytes: int) -> None:
        if (head_bytes > MAX_HEADER_BYTES or not self.host_ok(host)
                or not self.origin_ok(headers.get(b"origin"), host)):
            # Refused before it opens: the server answers the handshake with HTTP 403.
            await send({"type": "websocket.close", "code": 1008, "reason": "host or origin not allowed"})
            return
        if not is_public(path):
            query = _query_token(scope.get("query_string", b""))
            status = token_problem(self.settings.token, headers.get(b"authorization"), query)
            if status:
                message = await receive()
                if message["type"] != "websocket.connect":
                    return
                await send({"type": "websocket.accept"})
                await send({"type": "websocket.close",
                            "code": CLOSE_TOKEN_MISSING if status == 401 else CLOSE_TOKEN_WRONG,
                            "reason": "token required" if status == 401 else "wrong token"})
                return
        # The socket itself, for dropping a client that stopped reading (app/routes/stream.py):
        # uvicorn's send is a method of its protocol, which holds the transport.
        scope["kvscope.transport"] = getattr(getattr(send, "__self__", None), "transport", None)
        await self.app(scope, receive, send)

    def _with_headers(self, send, path: str):
        csp = self._docs_csp if path == "/docs" else self._csp

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", ())}
                extra = [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                if b"content-security-policy" not in present:
                    extra.append((b"content-security-policy", csp))
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return send_with_headers


def _query_token(query_string: bytes) -> str | None:
    values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True).get("token")
    return values[0] if values else None


async def _refuse(send, status: int, code: str, message: str, details: dict,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(error_body(code, message, details)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
