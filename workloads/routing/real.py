"""The real routers: SGLang's and vLLM's router binaries in front of N workers that hold every
request open, fed a Mooncake trace one request at a time.

Three parts, usable apart:

- `RealRouter(kind, worker_urls)` starts a router from its Python package as a subprocess in
  its own process group (`sglang`: `sglang-router`'s `smg launch`; `vllm`: `vllm-router`), on a
  port of its own (a port taken meanwhile is retried with fresh ports), waits until it lists
  every worker as healthy, and reads `GET /workers`: the router's own order of the workers,
  which differs from the command line and between starts. `stop()` (or leaving the `with`
  block) ends the whole process group. A missing package raises `RouterUnavailable`, one line
  naming `pip install 'kvscope[routers]'`.
- `HoldingWorkers(n)`: N fake OpenAI-compatible workers on loopback ports of one event loop
  (a thread of their own). They answer what the routers probe at start (`/health`,
  `/health_generate`, `/v1/models`, `/server_info`, `/get_server_info`, `/model_info`,
  `/get_model_info`, naming a local empty model folder so that SGLang's router downloads no
  tokenizer) and vLLM's `/tokenize` (one token per character, its code point: vLLM's router
  asks every worker to tokenize each prompt, `/v1/completions/render` first, which answers 404
  here, then `/tokenize`, and its `cache_aware` tree holds those token ids; without them it
  has no routing key and routes by load alone). A completion is recorded at the worker that
  received it and held until `release()`. SGLang's router sends an HTTP/2 preface on some
  connections, which the workers refuse (it then speaks HTTP/1.1); that error is not logged.
  Holding requests open makes a router's load (requests in flight per worker) the requests
  routed to it so far, the lab's sequence-mode assumption; with instant answers every load is 0
  and both routers send everything to one worker.
- `BlockEvents(urls)`: a KV-event publisher per worker (kvscope's `Publisher`, vLLM's wire),
  for vLLM's `kv_aware`: the full blocks of each request a worker received, as `BlockStored`
  events with the prompt's token ids (`store`), and the router's flags for them (`args`).

`replay(trace, n, kind)` puts them together and returns, per request, the worker that served
it as its position in the router's order, the index a lab policy returns (`RealReplay`), with
when each request was sent. With `policy="kv_aware"` each request's blocks are published by
the worker that received it, and the next request waits until the router's debug log shows it
read them and decided (`RealRouter.wait_log`); the router's credited tokens come back too.
`agreement()` (and `python -m workloads.routing.real`) compares those picks with the lab's
model of the router in sequence mode.

Prompts are made from the trace's block ids (`prompt_text`): one character per token, block
`h` is `chr(0x10000 + h)` followed by `tokens - 1` copies of `chr(0x100000)`, so a block is the
same text wherever it appears and two different blocks differ at their first character, so a
prefix match of SGLang's character tree stops exactly at a block boundary (vLLM's tree holds
the token ids as hex digits, in which two blocks' first tokens can share a few). Every
character is four bytes of UTF-8, so byte and character counts keep the same ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import weakref
from dataclasses import dataclass, field

from allocator import InvalidRequest

from ..mooncake import load_mooncake
from .policies import BLOCK_TOKENS
from .registry import make_policy
from .sequence import requests as trace_requests
from .sequence import run_sequence
from .vllm_kv import credited_blocks

FIRST_CHAR = 0x10000  # block h starts with chr(FIRST_CHAR + h): planes 1-15, four UTF-8 bytes
FILLER = chr(0x100000)  # the rest of every block (plane 16, four UTF-8 bytes too)
MAX_BLOCK_ID = 0x100000 - FIRST_CHAR - 1
MODEL_ID = "kvscope-fake"


class RouterUnavailable(InvalidRequest):
    """The router's package is not installed."""


class RouterError(RuntimeError):
    """A router that would not start, or that did not forward a request."""


@dataclass(frozen=True)
class RouterKind:
    name: str
    package: str  # the PyPI distribution
    module: str  # its import name
    tested: str  # the version the lab's model is held to
    argv: tuple[str, ...]  # after sys.executable
    model: str  # the lab policy that models its cache_aware
    kv_model: str = ""  # ... and its kv_aware, where it has one

    def model_of(self, policy: str) -> str:
        """The lab policy that models this router's `policy` (cache_aware or kv_aware)."""
        if policy == "kv_aware" and self.kv_model:
            return self.kv_model
        if policy == "cache_aware":
            return self.model
        raise InvalidRequest(f"the lab has no model of {self.name}'s {policy!r}")


ROUTERS = {
    "sglang": RouterKind("sglang", "sglang-router", "sglang_router", "0.3.2",
                         ("-m", "sglang_router", "launch"), "sglang_cache_aware"),
    "vllm": RouterKind("vllm", "vllm-router", "vllm_router", "0.1.17",
                       ("-m", "vllm_router.launch_router"), "vllm_cache_aware", "vllm_kv_aware"),
}


def router_kind(name: str) -> RouterKind:
    """The router called `name` (sglang or vllm), installed. Raises InvalidRequest for an
    unknown name, RouterUnavailable (one line naming the extra) for a missing package."""
    kind = ROUTERS.get(name)
    if kind is None:
        raise InvalidRequest(f"unknown router {name!r}; choose from {', '.join(ROUTERS)}")
    return require(kind)


def require(kind: RouterKind) -> RouterKind:
    """`kind`, once its package is found; else RouterUnavailable naming the extra."""
    if importlib.util.find_spec(kind.module) is None:
        raise RouterUnavailable(
            f"the real {kind.name} router needs the {kind.package} package ({kind.tested}): "
            f"pip install 'kvscope[routers]'")
    return kind


def router_version(name: str) -> str:
    return importlib.metadata.version(router_kind(name).package)


# -- prompts -----------------------------------------------------------------------------------
def block_text(block: int, tokens: int) -> str:
    """Block `block`'s first `tokens` tokens as text (one character per token)."""
    if not 0 <= block <= MAX_BLOCK_ID:
        raise InvalidRequest(f"block id {block} is outside 0..{MAX_BLOCK_ID}, the ids this "
                             f"prompt encoding gives a character of their own")
    return chr(FIRST_CHAR + block) + FILLER * (tokens - 1)


def prompt_text(blocks: list[int], tokens: int) -> str:
    """The prompt of a trace request: its blocks' texts, the last one `tokens - 512 * (k - 1)`
    characters long (k blocks)."""
    last = len(blocks) - 1
    if not blocks or not BLOCK_TOKENS * last < tokens <= BLOCK_TOKENS * len(blocks):
        raise InvalidRequest(f"{tokens} tokens do not fill {len(blocks)} blocks of {BLOCK_TOKENS}")
    return "".join(block_text(b, BLOCK_TOKENS if k < last else tokens - BLOCK_TOKENS * last)
                   for k, b in enumerate(blocks))


def prompt_blocks(text: str) -> list[int]:
    """The block ids `prompt_text` encoded into `text` (the inverse, for checks)."""
    return [ord(c) - FIRST_CHAR for c in text if c != FILLER]


# -- holding workers ---------------------------------------------------------------------------
class _NoHttp2Preface(logging.Filter):
    """Drops aiohttp's report of a connection that opened with the HTTP/2 preface."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and "PRI/Upgrade" in str(exc))


_PREFACE_FILTER = _NoHttp2Preface()

@dataclass
class Arrival:
    worker: int  # index into HoldingWorkers.urls
    path: str
    prompt_chars: int
    prompt_digest: bytes  # prompt_digest(prompt): the prompt itself is not kept


def prompt_digest(prompt: str) -> bytes:
    return hashlib.blake2b(prompt.encode(), digest_size=16).digest()


class HoldingWorkers:
    """N fake workers on loopback, one asyncio loop in a thread of its own (see the module
    docstring). `urls[i]` is worker i; `arrivals` lists the completions received, in order."""

    def __init__(self, n: int, host: str = "127.0.0.1") -> None:
        if n < 1:
            raise InvalidRequest(f"need at least one worker, got {n}")
        try:
            from aiohttp import web  # noqa: F401 (a dependency of both routers' packages)
        except ImportError:
            raise RouterUnavailable("the holding workers need aiohttp, which the routers' "
                                    "packages bring: pip install 'kvscope[routers]'") from None
        logging.getLogger("aiohttp.server").addFilter(_PREFACE_FILTER)  # idempotent
        self.n = n
        self.host = host
        self.model_dir = tempfile.mkdtemp(prefix="kvscope-model-")
        self.arrivals: list[Arrival] = []
        self._tokenize_cache: tuple[bytes, bytes] = (b"", b"")
        self.urls: list[str] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="holding-workers",
                                        daemon=True)
        self._thread.start()
        self._runners = []
        try:
            self.call(self._start())
        except BaseException:
            self.close()
            raise

    def call(self, coro, timeout: float | None = None):
        """Run `coro` on the workers' loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        from aiohttp import web

        self._release = asyncio.Event()
        self._arrived = asyncio.Condition()
        for i in range(self.n):
            app = web.Application(client_max_size=1 << 30)
            app.router.add_route("*", "/{path:.*}", self._handler(i))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            self._runners.append(runner)
            sock = socket.socket()
            sock.bind((self.host, 0))  # the port is ours from here on
            await web.SockSite(runner, sock).start()
            self.urls.append(f"http://{self.host}:{sock.getsockname()[1]}")

    def _handler(self, index: int):
        from aiohttp import web

        info = {"model_path": self.model_dir, "tokenizer_path": self.model_dir,
                "served_model_name": MODEL_ID, "is_generation": True}

        async def handle(request):
            path = request.path
            if path in ("/health", "/health_generate", "/ping"):
                return web.Response(text="OK")
            if path == "/v1/models":
                return web.json_response({"object": "list", "data": [
                    {"id": MODEL_ID, "object": "model", "owned_by": "kvscope", "root": MODEL_ID}]})
            if path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
                return web.json_response(info)
            if request.method == "POST" and path == "/tokenize":
                return web.Response(body=self._tokenized(await request.read()),
                                    content_type="application/json")
            if request.method == "POST" and path in ("/v1/completions", "/generate"):
                body = await request.json()
                prompt = body.get("prompt", body.get("text", ""))
                async with self._arrived:
                    self.arrivals.append(Arrival(index, path, len(prompt), prompt_digest(prompt)))
                    self._arrived.notify_all()
                await self._release.wait()
                return web.json_response({
                    "id": f"cmpl-{len(self.arrivals)}", "object": "text_completion",
                    "model": MODEL_ID, "choices": [{"index": 0, "text": "", "finish_reason": "length",
                                                    "logprobs": None}],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})
            return web.Response(status=404, text=f"{path} is not served by kvscope's workers")

        return handle

    def _tokenized(self, body: bytes) -> bytes:
        """vLLM's `/tokenize` answer for a request body: one token per character, the
        character's code point. The last answer is kept: every worker is asked the same."""
        if self._tokenize_cache[0] != body:
            prompt = json.loads(body).get("prompt", "")
            tokens = ",".join(str(ord(c)) for c in prompt)
            self._tokenize_cache = (body, (f'{{"count":{len(prompt)},"max_model_len":{1 << 24},'
                                           f'"tokens":[{tokens}],"token_strs":null}}').encode())
        return self._tokenize_cache[1]

    async def wait_arrivals(self, count: int, timeout: float) -> None:
        """Until `count` completions have arrived; asyncio.TimeoutError after `timeout` s."""
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.arrivals) >= count),
                                   timeout)

    def release(self) -> None:
        """Answer every held request, and every later one at once."""
        self.loop.call_soon_threadsafe(self._release.set)

    def close(self) -> None:
        if self.loop.is_running():
            with contextlib.suppress(Exception):
                self.release()
                self.call(self._stop(), timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()
        shutil.rmtree(self.model_dir, ignore_errors=True)

    async def _stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def __enter__(self) -> HoldingWorkers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- the router process ------------------------------------------------------------------------
def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
        return json.loads(r.read())


ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the routers colour their logs whatever NO_COLOR says
PORT_TAKEN = ("address already in use", "address in use", "addrinuse", "os error 98")
_RUNNING: weakref.WeakSet = weakref.WeakSet()  # routers started and not stopped


@atexit.register
def _stop_all() -> None:
    """At interpreter exit, end any router a caller left running."""
    for router in list(_RUNNING):
        router.stop()


class RealRouter:
    """A real router (`kind`: sglang or vllm) over `worker_urls`, started by `start()` and ended
    by `stop()`; also a context manager. `policy` and `args` (extra command-line flags) go on its
    command line; `url` is where it listens once started, `order` its workers as it lists them."""

    def __init__(self, kind: str, worker_urls: list[str], *, policy: str = "cache_aware",
                 args: tuple[str, ...] = (), host: str = "127.0.0.1",
                 startup_timeout_s: float = 60.0, attempts: int = 5,
                 rust_log: str | None = None) -> None:
        self.kind = router_kind(kind)
        self.worker_urls = list(worker_urls)
        self.policy = policy
        self.args = tuple(args)
        self.rust_log = rust_log  # its RUST_LOG (default: the environment's, else info)
        self.host = host
        self.startup_timeout_s = startup_timeout_s
        self.attempts = attempts
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.order: list[str] = []
        self.started_at = 0.0  # time.monotonic() when the running router was launched
        self.ready_at = 0.0  # ... and when it first listed every worker healthy
        self._log = None
        self._read_at = 0  # bytes of the log `wait_log` has read
        self._unread = ""  # ... and the line it has begun

    def command(self, port: int, metrics_port: int) -> list[str]:
        return [sys.executable, *self.kind.argv, "--host", self.host, "--port", str(port),
                "--worker-urls", *self.worker_urls, "--policy", self.policy,
                "--prometheus-host", self.host, "--prometheus-port", str(metrics_port),
                "--worker-startup-check-interval", "1", *self.args]

    def log_tail(self, chars: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = ANSI.sub("", self._log.read().decode("utf-8", "replace"))
        return text[-chars:]

    def wait_log(self, lines: set[str], timeout: float) -> dict[str, str]:
        """Until every string of `lines` has appeared in a line of the log written since the
        last call (each call reads on from where the last stopped; a line is matched with a
        space after its end, so `seq=1 ` does not match `seq=10`); returns the line each
        matched. RouterError after `timeout` seconds or when the router exits."""
        left, found = set(lines), {}
        deadline = time.monotonic() + timeout
        while left:
            self._log.flush()
            self._log.seek(self._read_at)
            chunk = self._log.read()
            self._read_at += len(chunk)
            text = self._unread + chunk.decode("utf-8", "replace")
            *done, self._unread = text.split("\n")
            for line in done:
                line = ANSI.sub("", line) + " "
                for s in [s for s in left if s in line]:
                    found[s] = line
                    left.discard(s)
            if not left:
                break
            if self.proc is None or self.proc.poll() is not None:
                raise RouterError(f"{self.kind.name} router exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RouterError(f"{self.kind.name} router: no log line with {sorted(left)[0]!r} "
                                  f"within {timeout:g} s: {self.log_tail()}")
            time.sleep(0.002)
        return found

    def start(self) -> RealRouter:
        """Start the router; a port taken by the time it binds is retried with fresh ports
        (`attempts` in all). Raises RouterError with the router's log tail when it fails."""
        try:
            for _ in range(self.attempts):
                port, metrics = self.ports()
                if self._launch(port, metrics):
                    return self
                self.stop()
            raise RouterError(f"{self.kind.name} router: the ports were taken at each of "
                              f"{self.attempts} attempts; last log: {self.log_tail()}")
        except BaseException:
            self.close()
            raise

    def ports(self) -> tuple[int, int]:
        """Two ports free now (the router's and its metrics'), which it binds itself."""
        return _free_port(self.host), _free_port(self.host)

    def _launch(self, port: int, metrics_port: int) -> bool:
        """True once the router listens and lists our workers healthy; False when a port was
        taken (by the time the router bound it, or another server answers there)."""
        if self._log is not None:
            self._log.close()
        self._log = tempfile.TemporaryFile()
        self._read_at, self._unread = 0, ""
        env = {**os.environ, "RUST_LOG": self.rust_log or os.environ.get("RUST_LOG", "info"),
               "NO_COLOR": "1"}
        self.proc = subprocess.Popen(self.command(port, metrics_port), stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.started_at = time.monotonic()
        _RUNNING.add(self)
        self.url = f"http://{self.host}:{port}"
        deadline = time.monotonic() + self.startup_timeout_s
        want = set(self.worker_urls)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log_tail(20000).lower()
                if any(s in log for s in PORT_TAKEN):
                    return False
                raise RouterError(f"{self.kind.name} router exited with status "
                                  f"{self.proc.returncode} at start: {self.log_tail()}")
            try:
                listed = _get_json(self.url + "/workers").get("workers", [])
            except (OSError, ValueError):
                time.sleep(0.1)
                continue
            urls = [w.get("url") for w in listed]
            if not set(urls) <= want:  # someone else's server on this port
                return False
            if set(urls) == want and all(w.get("is_healthy", True) for w in listed):
                self.order = urls
                self.ready_at = time.monotonic()
                return True
            time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise RouterError(f"{self.kind.name} router did not list its {len(want)} workers healthy "
                          f"within {self.startup_timeout_s:g} s: {tail}")

    def workers(self) -> list[dict]:
        """`GET /workers` now: each worker's url, health and load, in the router's order."""
        return _get_json(self.url + "/workers")["workers"]

    def stop(self) -> None:
        """End the router's process group: SIGTERM, then SIGKILL after 5 s. Idempotent."""
        proc, self.proc = self.proc, None
        _RUNNING.discard(self)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        if proc is not None:  # children left in the group after the leader exited
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> RealRouter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


# -- a trace through a real router -------------------------------------------------------------
FDS_PER_REQUEST = 2  # a held request keeps two sockets open in the router, two here
FDS_SPARE = 256


def check_open_files(requests: int) -> None:
    """Raise this process's open-file limit to its hard limit (the router inherits it), and
    InvalidRequest when holding `requests` requests open would still not fit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and FDS_PER_REQUEST * requests + FDS_SPARE > soft:
        most = (soft - FDS_SPARE) // FDS_PER_REQUEST
        raise InvalidRequest(f"holding {requests:,} requests open needs about "
                             f"{FDS_PER_REQUEST * requests + FDS_SPARE:,} open files; this "
                             f"system allows {soft:,} (ulimit -n): route at most {most:,}")


@dataclass
class RealReplay:
    """What a real router did with a trace: `picks[i]` is the worker that served request i, as
    its position in the router's worker order (`order`, the workers' urls)."""

    router: str
    version: str
    n: int
    order: list[str]
    picks: list[int] = field(default_factory=list)
    loads: list[int] = field(default_factory=list)  # the router's loads at the end
    sent_s: list[float] = field(default_factory=list)  # request i sent, s after the launch
    ready_s: float = 0.0  # when the router first listed its workers healthy, s after the launch
    policy: str = "cache_aware"
    credited: list[int] = field(default_factory=list)  # kv_aware: tokens it credited, each


def replay(trace, n: int, kind: str, *, limit: int | None = None, args: tuple[str, ...] = (),
           request_timeout_s: float = 30.0,
           not_before_s: dict[int, float] | None = None,
           policy: str = "cache_aware") -> RealReplay:
    """Send `trace`'s first `limit` requests (all by default) one at a time through a fresh
    `kind` router over n fresh holding workers: each request goes out once the previous one
    reached its worker. Raises RouterError when a request does not reach a worker in time.

    `not_before_s[i]`: request i is not sent before that many seconds after the router was
    ready (to let a wall-clock eviction happen between two requests, say).

    `policy` `kv_aware` (vLLM's router): the workers publish KV events (`BlockEvents`): once a
    request reached its worker, that worker stores the request's full blocks, and the next
    request goes out once the router has read them, so the router's index is the workers'
    caches as the lab's sequence mode has them (unbounded)."""

    version = router_version(kind)
    kind_ = router_kind(kind)
    total = len(trace) if limit is None else min(limit, len(trace))
    check_open_files(total)
    reqs = [r for r, _ in zip(trace_requests(trace), range(total))]
    prompts = (prompt_text(r.blocks, r.tokens) for r in reqs)
    with contextlib.ExitStack() as stack:
        workers = stack.enter_context(HoldingWorkers(n))
        on_pick = events = None
        if policy == "kv_aware":
            kind_.model_of(policy)  # a router with a kv_aware the lab models
            events = stack.enter_context(BlockEvents(workers.urls))
            args = (*events.args(), *args)
        router = stack.enter_context(RealRouter(kind, workers.urls, args=args, policy=policy,
                                                rust_log=KV_LOG if events else None))
        credited: list[int] = []
        if events is not None:
            events.sync(router, request_timeout_s)

            async def on_pick(i: int, worker: int) -> None:
                credited.append(await asyncio.to_thread(
                    events.store_and_wait, router, worker, reqs[i], request_timeout_s))
        position = {url: router.order.index(url) for url in workers.urls}
        picks, loads, sent = workers.call(_send(workers, router, prompts, request_timeout_s,
                                                not_before_s or {}, on_pick))
        return RealReplay(kind, version, n, list(router.order),
                          [position[workers.urls[w]] for w in picks], loads, sent,
                          router.ready_at - router.started_at, policy, credited)


# vllm-router's log lines that `replay` waits for and reads: each KV batch read, each decision
KV_LOG = ("info,vllm_router_rs::kv_index::subscriber=debug,"
          "vllm_router_rs::policies::kv_aware=debug")
_CREDITED = re.compile(r" credited_prefix_tokens=(\d+) ")


class BlockEvents:
    """One KV-event publisher per worker (`urls`), in vLLM's wire (kvscope's `Publisher`: a PUB
    socket and a replay socket on loopback), publishing what an engine with an unbounded prefix
    cache would: `store(w, req)` stores the full blocks of `req`'s prompt that worker w does not
    hold yet as one `BlockStored` (block hashes: the blocks' prefix-tree nodes, each chained to
    the one before; token ids: the prompt's, `prompt_text`'s code points; medium GPU)."""

    def __init__(self, urls: list[str]) -> None:
        from kvevents.publisher import Publisher

        self.urls = list(urls)
        self.publishers: list = []
        try:
            for _ in self.urls:
                self.publishers.append(Publisher("tcp://127.0.0.1:*",
                                                 replay_endpoint="tcp://127.0.0.1:*"))
        except BaseException:
            self.close()
            raise
        self.held: list[set[int]] = [set() for _ in self.urls]

    def args(self) -> tuple[str, ...]:
        """vllm-router's flags for these sources."""
        out: tuple[str, ...] = ()
        for url, pub in zip(self.urls, self.publishers):
            out += ("--kv-event-source", f"{url}={pub.endpoint}",
                    "--kv-event-replay-source", f"{url}={pub.replay_endpoint}")
        return (*out, "--kv-event-block-size", str(BLOCK_TOKENS), "--kv-event-model", MODEL_ID)

    @staticmethod
    def read(url: str, seq: int) -> str:
        """The router's log line (up to its end) saying it read batch `seq` from `url`."""
        return f"live sequence advanced source={url} rank=0 seq={seq} "

    def sync(self, router: RealRouter, timeout: float) -> None:
        """Until the router has read a batch from every publisher (a subscriber that connects
        after a batch went out never sees it): empty batches, each publisher's next one after
        every 0.2 s not read."""
        deadline = time.monotonic() + timeout
        for url, pub in zip(self.urls, self.publishers):
            while True:
                seq = pub.publish([])
                try:
                    router.wait_log({self.read(url, seq)}, 0.2)
                    break
                except RouterError:
                    if time.monotonic() > deadline:
                        raise

    def store(self, w: int, req) -> int | None:
        """Worker w stores `req`'s full blocks it lacks; the batch's seq, None if none."""
        from kvevents.codec import MEDIUM_GPU, Stored

        full = req.blocks[:req.tokens // BLOCK_TOKENS]
        held = self.held[w]
        j = 0
        while j < len(full) and full[j] in held:
            j += 1
        if j == len(full):
            return None
        new = full[j:]
        held.update(new)
        tokens = [ord(c) for b in new for c in block_text(b, BLOCK_TOKENS)]
        ev = Stored(list(new), full[j - 1] if j else None, tokens, BLOCK_TOKENS, MEDIUM_GPU)
        return self.publishers[w].publish([ev])

    @staticmethod
    def decided(url: str, tokens: int) -> str:
        """The router's kv_aware decision line for a `tokens`-token prompt sent to `url` (it
        logs `KV prefix decision outcome=... worker="URL" input_tokens=N new_prefill_tokens=...
        credited_prefix_tokens=...` at debug level)."""
        return f'" worker="{url}" input_tokens={tokens} '

    def store_and_wait(self, router: RealRouter, w: int, req, timeout: float) -> int:
        """Once `req` reached worker w: its decision line (the tokens the router credited as
        cached, returned), and worker w's batch storing `req`'s blocks read by the router.
        Waiting for the decision's own line keeps decisions in order (the router's log
        threads can write two decisions' lines out of order)."""
        url = self.urls[w]
        want = {self.decided(url, req.tokens)}
        seq = self.store(w, req)
        if seq is not None:
            want.add(self.read(url, seq))
        lines = router.wait_log(want, timeout)
        m = _CREDITED.search(lines[self.decided(url, req.tokens)])
        if m is None:
            raise RouterError(f"no credited_prefix_tokens in the router's decision line: "
                              f"{lines[self.decided(url, req.tokens)][:300]}")
        return int(m.group(1))

    def close(self) -> None:
        for pub in self.publishers:
            pub.close(linger_ms=0)
        self.publishers = []

    def __enter__(self) -> BlockEvents:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _send(workers: HoldingWorkers, router: RealRouter, prompts, timeout: float,
                not_before_s: dict[int, float],
                on_pick=None) -> tuple[list[int], list[int], list[float]]:
    """Picks (worker indices) of `prompts`, the router's loads with all of them held, and when
    each was sent (seconds after the router's launch). `on_pick(i, worker)` is awaited once
    request i reached its worker, before the next goes out."""
    import aiohttp

    url = router.url + "/v1/completions"
    picks: list[int] = []
    sent: list[float] = []
    tasks = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def post(body: bytes):
            async with session.post(url, data=body,
                                    headers={"Content-Type": "application/json"}) as r:
                return r.status, await r.text()

        try:
            for i, prompt in enumerate(prompts):
                body = json.dumps({"model": MODEL_ID, "prompt": prompt, "max_tokens": 1,
                                   "temperature": 0}, ensure_ascii=False).encode()
                if i in not_before_s:
                    await asyncio.sleep(router.ready_at + not_before_s[i] - time.monotonic())
                sent.append(time.monotonic() - router.started_at)
                task = asyncio.ensure_future(post(body))
                tasks.append(task)
                waiter = asyncio.ensure_future(workers.wait_arrivals(i + 1, timeout))
                done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if waiter not in done:  # the router answered without reaching a worker
                    waiter.cancel()
                    status, text = task.result() if not task.exception() else (0, repr(task.exception()))
                    raise RouterError(f"{router.kind.name} router answered request {i} with "
                                      f"{status} before any worker saw it: {text[:300]}")
                try:
                    waiter.result()
                except asyncio.TimeoutError:
                    raise RouterError(f"request {i} reached no worker within {timeout:g} s; "
                                      f"router log: {router.log_tail()}") from None
                arrival = workers.arrivals[i]
                if (len(workers.arrivals) != i + 1 or arrival.prompt_chars != len(prompt)
                        or arrival.prompt_digest != prompt_digest(prompt)):
                    raise RouterError(f"request {i}: the workers received "
                                      f"{len(workers.arrivals)} requests or another prompt")
                picks.append(arrival.worker)
                if on_pick is not None:
                    await on_pick(i, arrival.worker)
            async with session.get(router.url + "/workers") as r:
                loads = [w.get("load", 0) for w in (await r.json())["workers"]]
        finally:
            workers._release.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
    bad = [r for r in results if isinstance(r, BaseException) or r[0] != 200]
    if bad:
        raise RouterError(f"{len(bad)} requests failed once released, e.g. {bad[0]!r}"[:500])
    return picks, loads, sent


def agreement(trace, n: int, kind: str, *, limit: int | None = None,
              wall_clock: bool = False, policy: str = "cache_aware") -> dict:
    """`replay` and the lab's model of the router's `policy` (sequence mode) on the same
    requests: how many decisions agree, and the first that do not. The model evicts at the
    trace's times; `wall_clock`: at the times the requests were sent, the router's clock.
    kv_aware: also how many of the tokens the router credited as cached the model credits."""
    import dataclasses

    import numpy as np


    model = router_kind(kind).model_of(policy)
    if limit is not None:
        trace = trace.head(min(limit, len(trace)))
    t0 = time.perf_counter()
    real = replay(trace, n, kind, policy=policy)
    wall = time.perf_counter() - t0
    if wall_clock:
        trace = dataclasses.replace(trace, arrival_s=np.asarray(real.sent_s) - real.ready_s / 2)
    lab = make_policy(model, n)
    picks, rules, credited = [], [], []

    class _Recorder:
        def route(self, req, cluster):
            picks.append(lab.route(req, cluster))
            rules.append(lab.rule)
            credited.append(BLOCK_TOKENS * credited_blocks(cluster.matches(req)[picks[-1]],
                                                           req.tokens))
            return picks[-1]

    run_sequence(trace, n, 1 << 40, _Recorder())
    differ = [{"request": i, "model": picks[i], "real": real.picks[i], "rule": rules[i]}
              for i in range(len(picks)) if picks[i] != real.picks[i]]
    out = {"router": kind, "version": real.version, "policy": policy, "model": model,
           "replicas": n, "clock": "wall" if wall_clock else "trace",
           "requests": len(picks), "agree": len(picks) - len(differ),
           "agreement": 1 - len(differ) / len(picks) if picks else 1.0,
           "router_seconds": round(wall, 1), "first_differences": differ[:10]}
    if policy == "kv_aware":
        out["credited_agree"] = sum(a == b for a, b in zip(credited, real.credited))
        out["real_credited_tokens"] = sum(real.credited)
        out["model_credited_tokens"] = sum(credited)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m workloads.routing.real`: the agreement of a real router with its model."""

    p = argparse.ArgumentParser(prog="python -m workloads.routing.real", description=(
        "Replay a Mooncake trace through a real router over holding workers and compare each "
        "decision with the lab's model of it (sequence mode)."))
    p.add_argument("--router", default="sglang", help="sglang or vllm")
    p.add_argument("--policy", default="cache_aware", choices=("cache_aware", "kv_aware"),
                   help="the router's policy (kv_aware: vllm's, on KV events the workers "
                        "publish)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--limit", type=int, default=2000, help="first N requests (default 2000)")
    p.add_argument("--trace", help="Mooncake JSONL trace (default: the bundled conversation trace)")
    p.add_argument("--wall-clock", action="store_true",
                   help="evict the model's tree at the times the requests were sent (the "
                        "router's clock) instead of the trace's timestamps")
    args = p.parse_args(argv)
    try:
        if args.replicas < 1 or args.limit < 1:
            raise InvalidRequest("--replicas and --limit must be at least 1")
        result = agreement(load_mooncake(args.trace), args.replicas, args.router,
                           limit=args.limit, wall_clock=args.wall_clock, policy=args.policy)
    except (InvalidRequest, RouterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
