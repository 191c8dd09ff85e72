"""An engine's own Prometheus `/metrics`: its KV block count, KV usage and prefix hit ratio."""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
import urllib.parse

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
MAX_BODY = 8 << 20


class MetricsError(ValueError):
    """The metrics URL could not be read or does not say what was asked."""


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition as (name, labels, value) rows; comments and junk skipped."""
    rows = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        rows.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), value))
    return rows


def fetch(url: str, timeout: float = 3.0, on_connection=None) -> str:
    """GET `url`, all of it within `timeout` seconds however slowly the server answers (a
    server trickling bytes is cut at the deadline). `on_connection(conn)`, when given, is called
    with the HTTP connection once it exists, so another thread can cut it short (`shutdown`)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MetricsError(f"metrics_url must be http:// or https://, got {url[:80]!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + timeout
    try:
        conn = cls(parts.hostname, parts.port, timeout=timeout)
    except (ValueError, http.client.HTTPException) as exc:
        raise MetricsError(f"could not read {url}: {exc}") from None
    timer = threading.Timer(timeout, shutdown, (conn,))
    timer.daemon = True
    try:
        if on_connection is not None:
            on_connection(conn)
        timer.start()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Accept": "text/plain"})
        r = conn.getresponse()
        if r.status != 200:
            raise MetricsError(f"{url} answered HTTP {r.status}")
        chunks, size = [], 0
        while size <= MAX_BODY:
            if time.monotonic() > deadline:
                raise MetricsError(f"{url} did not answer within {timeout} s")
            chunk = r.read1(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        body = b"".join(chunks)
    except MetricsError:
        raise
    except Exception as exc:
        if time.monotonic() >= deadline:
            raise MetricsError(f"{url} did not answer within {timeout} s") from None
        raise MetricsError(f"could not read {url}: {exc}") from None
    finally:
        timer.cancel()
        conn.close()
    if len(body) > MAX_BODY:
        raise MetricsError(f"{url} answered more than {MAX_BODY} bytes")
    return body.decode("utf-8", "replace")


def shutdown(conn) -> None:
    """Cut an HTTP connection in flight (its blocked read returns at once)."""
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def summarize(rows) -> dict:
    """What kvscope shows of an engine: num_gpu_blocks and block_size (vLLM's
    `vllm:cache_config_info`), KV usage (0..1), prefix cache queries and hits (counters, summed
    over label sets), or None where the engine does not export it."""
    out: dict = {"num_gpu_blocks": None, "block_size": None, "kv_usage": None,
                 "prefix_queries": None, "prefix_hits": None, "hit_rate": None}
    sums: dict[str, float] = {}
    for name, labels, value in rows:
        if name == "vllm:cache_config_info":
            for key in ("num_gpu_blocks", "block_size"):
                v = labels.get(key)
                if v and v.isdigit():
                    out[key] = int(v)
        elif name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"):
            out["kv_usage"] = value
        elif name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                      "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"):
            key = "prefix_queries" if "queries" in name else "prefix_hits"
            sums[key] = sums.get(key, 0.0) + value
        elif name == "sglang:cache_hit_rate":
            out["hit_rate"] = value
    out.update(sums)
    return out


def num_gpu_blocks(url: str, timeout: float = 3.0) -> int:
    """The engine's KV block count from its metrics. Raises MetricsError."""
    n = summarize(parse(fetch(url, timeout)))["num_gpu_blocks"]
    if not n:
        raise MetricsError(f"{url} has no vllm:cache_config_info with num_gpu_blocks; give num_blocks")
    return n


class MetricsPoller:
    """Polls `url` every `every_s` in a daemon thread. `latest` holds the last summary plus the hit
    ratio over the last interval (from the counters' deltas), `history` the last 600 of them."""

    def __init__(self, url: str, every_s: float = 2.0) -> None:
        self.url = url
        self.every_s = every_s
        self.latest: dict | None = None
        self.history: list[dict] = []
        self.errors = 0
        self.failing = False  # the latest poll failed
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._conn = None  # the connection of the poll in flight (cut by stop_soon)
        self._thread = threading.Thread(target=self._run, daemon=True, name="kvevents-metrics")

    def start(self) -> MetricsPoller:
        self._thread.start()
        return self

    def poll_once(self) -> None:
        try:
            s = summarize(parse(fetch(self.url, on_connection=self._set_conn)))
        except MetricsError as exc:
            self.errors += 1
            self.failing = True
            self.last_error = str(exc)[:300]
            return
        self.failing = False
        s["at"] = time.time()
        prev = self.latest
        if (prev and s["prefix_queries"] is not None and prev.get("prefix_queries") is not None
                and s["prefix_hits"] is not None):
            dq = s["prefix_queries"] - prev["prefix_queries"]
            dh = s["prefix_hits"] - prev["prefix_hits"]
            s["hit_ratio"] = dh / dq if dq > 0 else None
        else:
            s["hit_ratio"] = s.get("hit_rate")
        self.latest = s
        self.history = (self.history + [s])[-600:]

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._conn = None
            self._stop.wait(self.every_s)

    def status(self) -> dict:
        return {"url": self.url, "latest": self.latest, "errors": self.errors,
                "failing": self.failing, "last_error": self.last_error}

    def _set_conn(self, conn) -> None:
        self._conn = conn
        if self._stop.is_set():
            shutdown(conn)

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_soon()
        self.join(timeout)

    def stop_soon(self) -> None:
        """Stop polling; a poll in flight is cut now."""
        self._stop.set()
        conn = self._conn
        if conn is not None:
            shutdown(conn)

    def join(self, timeout: float | None = None) -> bool:
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread.is_alive()
