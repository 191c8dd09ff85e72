"""A real HTTP server answering GET /metrics with what a test sets, as an engine exports it."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def metrics_server(answer: Callable[[], tuple[int, str]]) -> Iterator[str]:
    """Serve `answer()` (status, Prometheus text) on a free loopback port; yield the /metrics URL."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, text = answer()
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()
