"""NVIDIA Dynamo's standalone KV indexer (`python -m dynamo.indexer`, `run_kv_indexer` in the
ai-dynamo-runtime wheel) as a subprocess on a free loopback port, for the benches and the tests
that hold kvscope's Dynamo-compatible routes to it.

It follows each registered worker's engine-side ZeroMQ publisher (vLLM's or SGLang's wire:
`[topic, seq, KvEventBatch]`), not Dynamo's event plane: a Dynamo `KvEventPublisher`'s envelopes
(four frames) are dropped by it ("Unexpected ZMQ frame count: 4"). So beside it a kvscope fleet
reads the same engines directly, or through `KvEventPublisher`s relaying them (`zmq_endpoint`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx


class DynamoIndexer:
    """`python -m dynamo.indexer --port P --threads T`; `call(method, path, json)` answers as
    an httpx.Response. Its log is kept in a temporary file (`log()`)."""

    def __init__(self, threads: int = 1, timeout_s: float = 60.0) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="dynamo-indexer-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dynamo.indexer", "--port", str(self.port), "--threads", str(threads)],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
        self.client = httpx.Client(base_url=self.url, timeout=30)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dynamo.indexer exited: {self.log()[-2000:]}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"dynamo.indexer did not answer on {self.url}: {self.log()[-2000:]}")
            time.sleep(0.1)

    def call(self, method: str, path: str, json=None) -> httpx.Response:
        return self.client.request(method, path, json=json)

    def log(self) -> str:
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        os.unlink(self._log.name)
