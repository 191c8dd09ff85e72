"""The demo's load generator: a Mooncake trace replayed against real engines' `/v1/completions`.

Requests leave at the trace's arrival times divided by `speed`, to the engines that are up, in
round robin (`pick` is the one place a routing policy plugs in). A few worker threads keep up to
`per_engine` requests in flight per engine; when the engines fall behind, arrivals wait for a
free worker rather than pile up. Prompts come from `workloads.engine_prompts`.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from workloads.engine_prompts import EnginePrompt, prompt
from workloads.mooncake import MooncakeTrace
from workloads.routing.policies import BLOCK_TOKENS
from workloads.routing.real_prompts import prompt_text

from .server import SERVED_NAME


def text_prompt(trace: MooncakeTrace, i: int, max_tokens: int):
    """Request i as text (`workloads.routing.real_prompts.prompt_text`), its first `max_tokens` tokens
    at most (whole blocks kept), and its output length (at most 256)."""
    blocks = trace.hash_ids[trace.offsets[i]:trace.offsets[i + 1]].tolist()
    tokens = min(int(trace.input_length[i]), max_tokens)
    blocks = blocks[:-(-tokens // BLOCK_TOKENS)]
    out = max(1, min(256, int(trace.output_length[i])))
    return EnginePrompt(float(trace.arrival_s[i]), prompt_text(blocks, tokens), out)


class RoundRobin:
    """Engines in turn, skipping those not up."""

    def __init__(self) -> None:
        self._n = itertools.count()

    def pick(self, urls: Sequence[str]) -> str:
        return urls[next(self._n) % len(urls)]


class LoadGenerator:
    """Replays `trace` (looping at its end) against the engines `ready_urls()` returns."""

    def __init__(self, trace: MooncakeTrace, ready_urls: Callable[[], list[str]], *,
                 speed: float = 1.0, per_engine: int = 4, max_prompt: int = 2000,
                 engines: int = 1, text: bool = False) -> None:
        self.trace, self.ready_urls, self.speed = trace, ready_urls, speed
        self.max_prompt = max_prompt
        # text: prompts as the routing lab writes them for the real routers (one character per
        # token, workloads/routing/real_prompts.py), up to `max_prompt` tokens, for engines that
        # tokenize by character behind a router that routes on text
        self.text = text
        self.router = RoundRobin()
        self.sent = self.done = self.failed = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._slots = threading.Semaphore(per_engine * engines)
        self._pool = ThreadPoolExecutor(per_engine * engines, thread_name_prefix="demo-load")
        self._thread = threading.Thread(target=self._run, daemon=True, name="demo-load")

    def start(self) -> LoadGenerator:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        n = len(self.trace)
        while not self._stop.is_set() and not self.ready_urls():
            self._stop.wait(0.5)
        t0 = time.monotonic()
        for k in itertools.count():
            i = k % n
            lap = (k // n) * (float(self.trace.arrival_s[-1]) + 1.0)
            p = text_prompt(self.trace, i, self.max_prompt) if self.text else \
                prompt(self.trace, i, max_prompt=self.max_prompt)
            due = t0 + (lap + p.arrival_s) / self.speed
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            while not self._slots.acquire(timeout=0.2):
                if self._stop.is_set():
                    return
            urls = self.ready_urls()
            if not urls:
                self._slots.release()
                self._stop.wait(0.5)
                continue
            self.sent += 1
            self._pool.submit(self._send, self.router.pick(urls), p.tokens, p.max_tokens, f"r{i}")

    def _send(self, url: str, tokens: list[int], max_tokens: int, tag: str) -> None:
        # `user` names the request by its trace line: simulated engines record who served it
        body = json.dumps({"model": SERVED_NAME, "prompt": tokens, "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True, "user": tag}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310 (our own engines)
                r.read()
            self.done += 1
        except Exception as exc:
            self.failed += 1
            self.last_error = f"{url}: {exc}"[:300]
        finally:
            self._slots.release()

    def status(self) -> str:
        return f"{self.sent} requests sent, {self.done} answered, {self.failed} failed"
