"""GPU-free engines a real router can talk to: N simulated OpenAI-compatible servers in one process.

Each engine (`sim_engine.SimEngine`) is a real kvscope prefix-caching pool under the serving
simulator's schedule, run in wall-clock time, with vLLM's /metrics and KV events; its HTTP API
(`sim_http.build_app`) answers what sglang-router, vllm-router and Dynamo's frontend probe and
send, each answer when the simulator says the request is done. So a router in front sees real
load and queueing, and its decisions show up as cache hits or misses in the engines' own
counters.

`SimEngines` runs N of them on one event loop in a thread of its own, each on a port of its own;
`kvscope sim-engines` (`main`) is that from the command line, with a fleet file for
`kvscope serve --fleet`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import socket
import sys
import threading
import time

from allocator import InvalidRequest
from workloads.routing.serving import add_cost_flags, costs_from_args

from .sim_engine import SimEngine, SimEngineConfig
from .sim_http import build_app

TICK_S = 0.002  # how often the simulators are advanced to the wall clock


def _bound_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(512)
    sock.setblocking(False)
    return sock


class SimEngines:
    """N engines on one event loop, in a thread of their own (`start()` / `stop()`, or a context
    manager). Each engine's HTTP server binds `host:port` (port 0: one the system picks; else
    `port + i`); `urls`, `events` say where they are."""

    def __init__(self, configs: list[SimEngineConfig], *, host: str = "127.0.0.1", port: int = 0,
                 speed: float = 1.0, events: bool = True) -> None:
        if not configs:
            raise InvalidRequest("give at least one engine")
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise InvalidRequest(f"engine names must differ: {names}")
        self.configs, self.host, self.port, self.speed = configs, host, port, speed
        self.want_events = events
        self.engines: list[SimEngine] = []
        self.urls: list[str] = []
        self._sockets: list[socket.socket] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers = []
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None

    @classmethod
    def uniform(cls, n: int, *, prefix: str = "sim", **engine_kw) -> list[SimEngineConfig]:
        return [SimEngineConfig(f"{prefix}-{i}", **engine_kw) for i in range(n)]

    def start(self, timeout: float = 30.0) -> SimEngines:
        for c in self.configs:
            c.check()
        try:
            for i, _ in enumerate(self.configs):
                self._sockets.append(_bound_socket(self.host, self.port + i if self.port else 0))
        except OSError as exc:
            for s in self._sockets:
                s.close()
            self._sockets.clear()
            raise OSError(exc.errno, f"engine port {self.port + len(self._sockets)} on {self.host}: "
                                     f"{exc.strerror}") from None
        self.urls = [f"http://{self.host}:{s.getsockname()[1]}" for s in self._sockets]
        self._thread = threading.Thread(target=self._run, name="sim-engines", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the simulated engines did not start")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start(); a started thread ends quietly
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    async def _main(self) -> None:
        import uvicorn

        self._stop = asyncio.Event()
        t0 = time.monotonic()
        ev = "tcp://127.0.0.1:*" if self.want_events else None
        try:
            self.engines = [SimEngine(c, events_endpoint=ev, replay_endpoint=ev, speed=self.speed,
                                      t0=t0) for c in self.configs]
            tasks = []
            for engine, sock in zip(self.engines, self._sockets):
                # "error": a router's HTTP/2 probe (SGLang's) is a warning per probe otherwise
                config = uvicorn.Config(build_app(engine), log_level="error", lifespan="off",
                                        access_log=False, timeout_keep_alive=30, http="h11")
                server = uvicorn.Server(config)
                server.install_signal_handlers = lambda: None
                self._servers.append(server)
                tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
            ticker = asyncio.create_task(self._tick())
            while not all(s.started for s in self._servers):
                if any(t.done() for t in tasks):
                    for t in tasks:
                        if t.done() and t.exception():
                            raise t.exception()
                    raise RuntimeError("an engine's server stopped while starting")
                await asyncio.sleep(0.01)
            self._ready.set()
            await self._stop.wait()
            for s in self._servers:
                s.should_exit = True
            await asyncio.gather(*tasks, return_exceptions=True)
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        finally:
            for e in self.engines:
                e.close()
            for s in self._sockets:
                s.close()

    async def _tick(self) -> None:
        while True:
            for e in self.engines:
                try:
                    e.advance()
                except Exception as exc:  # a bug: fail that engine's requests, say why, go on
                    e.fail(exc)
            await asyncio.sleep(TICK_S)

    def call(self, fn, timeout: float = 10.0):
        """Run fn() on the engines' loop and return its result (reads state consistently)."""
        if self._loop is None:
            raise RuntimeError("not started")

        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stats(self) -> list[dict]:
        return self.call(lambda: [e.stats() for e in self.engines])

    def events(self) -> list[dict | None]:
        return self.call(lambda: [e.events_info() for e in self.engines])

    def stop(self, timeout: float = 30.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread and self._thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
            self._thread.join(timeout)

    def __enter__(self) -> SimEngines:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- `kvscope sim-engines` -------------------------------------------------------------------------
PROG = "kvscope sim-engines"


def parse(argv: list[str]):
    p = argparse.ArgumentParser(prog=PROG, description=(
        "Run N simulated OpenAI-compatible engines (no GPU, no model): each a real prefix-caching "
        "pool under the serving simulator's costs, with vLLM's /metrics and KV events. Put a real "
        "router in front of them (e.g. smg launch --worker-urls URL... --policy cache_aware)."))
    p.add_argument("--engines", type=int, default=4, help="how many (default 4, at most 64)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0,
                   help="engine i listens on PORT+i (default 0: ports the system picks, printed)")
    p.add_argument("--num-blocks", type=int, default=4096, help="KV blocks per engine (default 4096)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    p.add_argument("--token-scale", type=int, default=1,
                   help="model tokens one prompt word stands for, for the costs (default 1)")
    p.add_argument("--speed", type=float, default=1.0, help="simulated seconds per wall second (default 1)")
    add_cost_flags(p, "engine")
    p.add_argument("--fleet-file", metavar="FILE.json",
                   help="write the engines as a kvscope fleet file (kvscope serve --fleet FILE.json)")
    args = p.parse_args(argv)
    if not 1 <= args.engines <= 64:
        p.error("--engines must be 1..64")
    if not 0 <= args.port <= 65535 - args.engines:
        p.error(f"--port must be 0..{65535 - args.engines}")
    if not (math.isfinite(args.speed) and args.speed > 0):
        p.error("--speed must be a positive number")
    try:
        args.costs = costs_from_args(args)
    except InvalidRequest as exc:
        p.error(str(exc))
    return args


def fleet_file(engines: SimEngines, name: str = "sim") -> dict:
    """The engines as a kvscope fleet file (the format of `kvscope serve --fleet`)."""
    out = []
    for cfg, url, ev in zip(engines.configs, engines.urls, engines.events()):
        row = {"name": cfg.name, "endpoint": ev["endpoint"], "replay_endpoint": ev["replay_endpoint"],
               "metrics_url": url + "/metrics", "block_size": cfg.block_size,
               "num_blocks": cfg.num_blocks}
        out.append(row)
    return {"name": name, "engines": out}


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        costs = args.costs
        configs = SimEngines.uniform(args.engines, num_blocks=args.num_blocks,
                                     block_size=args.block_size, token_scale=args.token_scale,
                                     costs=costs)
        engines = SimEngines(configs, host=args.host, port=args.port, speed=args.speed).start()
    except (InvalidRequest, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        for cfg, url, ev in zip(configs, engines.urls, engines.events()):
            print(f"{cfg.name}  {url}  events {ev['endpoint']}  replay {ev['replay_endpoint']}",
                  flush=True)
        if args.fleet_file:
            with open(args.fleet_file, "w") as f:
                json.dump(fleet_file(engines), f, indent=1)
            print(f"{PROG}: fleet file {args.fleet_file} (kvscope serve --fleet {args.fleet_file})",
                  flush=True)
        print(f"{PROG}: {args.engines} engines up; Ctrl-C stops them", flush=True)
        done.wait()
    finally:
        engines.stop()
    return 0
