"""What the real routers route to in the agreement replays: workers that hold every request open,
and the KV events they publish.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass

from allocator import InvalidRequest
from kvevents.codec import MEDIUM_GPU, Stored
from kvevents.publisher import Publisher

from .policies import BLOCK_TOKENS
from .real_prompts import block_text
from .real_router import RealRouter, RouterError, RouterUnavailable

MODEL_ID = "kvscope-fake"


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


# vllm-router's log lines that `BlockEvents` waits for and reads: each KV batch read, each decision
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
