"""Fleets on the server: each a `kvevents.fleet.Fleet` whose index changes run on the event loop
under the fleet's asyncio lock (the subscribers' threads hand them over through a LoopApplier),
plus a task sampling its figures once a second for the page's charts.

In-process use (what `kvscope serve --fleet` and `kvscope demo` do):

    handle = await services.fleets.create("demo", [{"name": "e0", "endpoint": "tcp://..."}])
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from allocator.errors import Conflict, InvalidRequest, NotFound
from kvevents.codec import WireError
from kvevents.fleet import CLOSE_DEADLINE_S, SAMPLE_EVERY_S, EngineSpec, Fleet
from kvevents.index import MAX_FLEET_ENGINES
from kvevents.listen import ListenSpec
from kvevents.nats_source import NatsAuth, NatsSpec
from kvevents.recording import read_records

from .mirrors import LoopApplier

log = logging.getLogger("kvscope.fleet")
MAX_FLEETS = 16
# Endpoints a server follows: each is a SUB socket and a monitor's pair of sockets (ZeroMQ's
# context holds 1,023 sockets by default), read by its fleet's one receiver thread.
MAX_TOTAL_ENGINES = 256


class FleetHandle:
    """One fleet on the server: the fleet, its lock, its sampling task and, when it plays a
    fleet recording, the thread that feeds it."""

    def __init__(self, fleet: Fleet, lock: asyncio.Lock) -> None:
        self.fleet, self.lock = fleet, lock
        self.name = fleet.name
        self.task = asyncio.get_running_loop().create_task(self._sample(), name=f"fleet-{fleet.name}")
        self._stop = threading.Event()
        self._player: threading.Thread | None = None

    def play(self, path: str, speed: float | None) -> None:
        """Feed a fleet recording in a daemon thread (changes still run on the loop)."""
        def run() -> None:
            try:
                self.fleet.play(path, speed, self._stop)
            except Exception as exc:  # a file cut short or not a recording: shown, not raised
                self.fleet.playback = {"path": path, "state": "failed", "error": f"{type(exc).__name__}: {exc}"}
        self._player = threading.Thread(target=run, daemon=True, name=f"fleet-{self.name}-play")
        self._player.start()

    async def _sample(self) -> None:
        while True:
            async with self.lock:
                self.fleet.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def release(self) -> None:
        """The prompt half of closing: under the fleet's lock no change applies any more and
        the index's memory is freed; the player, sampler, links and monitor are told to stop."""
        self._stop.set()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        async with self.lock:
            self.fleet.release()

    def finish(self, rounds: int = 12) -> bool:
        """The blocking half (run in a worker): wait for every thread, CLOSE_DEADLINE_S at a
        time (a thread stuck past one is waited for again, so it is counted until gone)."""
        for _ in range(rounds):
            deadline = time.monotonic() + CLOSE_DEADLINE_S
            if self._player is not None:
                self._player.join(max(0.0, deadline - time.monotonic()))
            if self.fleet.finish_close(deadline):
                return True
            log.warning("fleet %s: threads still running after %s s", self.name, CLOSE_DEADLINE_S)
        return False

    def engine_count(self) -> int:
        """Engines whose threads still run: specs followed, or closing and not gone yet (a
        listening fleet's pods share its one listener thread)."""
        fleet = self.fleet
        own = sum(not getattr(link, "shared", False) for link in fleet.links.values())
        sources = sum(source.alive() for source in fleet.sources())
        return own + sources + sum(link.alive() for link in fleet.closing_links())

    async def aclose(self) -> None:
        await self.release()
        await asyncio.to_thread(self.finish)


class Fleets:
    """The server's fleets by name (at most MAX_FLEETS)."""

    def __init__(self, max_fleets: int = MAX_FLEETS, max_total_engines: int = MAX_TOTAL_ENGINES) -> None:
        self.max_fleets = max_fleets
        self.max_total_engines = max_total_engines
        self._fleets: dict[str, FleetHandle] = {}
        self._creating: set[str] = set()
        # What is closing in the background (deleted fleets, removed engines), counted against
        # the engine limit until its threads are gone.
        self._closing: set = set()
        self._tasks: set[asyncio.Task] = set()
        self.nats_auth: NatsAuth | None = None  # the server's NATS credentials (settings)

    def __iter__(self):
        return iter(list(self._fleets.values()))

    def __contains__(self, name: str) -> bool:
        return name in self._fleets

    def get(self, name: str) -> FleetHandle:
        handle = self._fleets.get(name)
        if handle is None:
            raise NotFound("fleet", name)
        return handle

    async def create(self, name: str, engines: list[dict], record: str | None = None,
                     max_engines: int = MAX_FLEET_ENGINES, play: str | None = None,
                     speed: float | None = None, listen: dict | None = None,
                     nats: dict | None = None) -> FleetHandle:
        """Start a fleet following `engines` (dicts of EngineSpec's fields) and, with `listen`
        (ListenSpec's fields), every pod publishing to that bound endpoint, recording them to
        `record`, or fed from the fleet recording `play` at `speed` times real time. Raises
        Conflict (name taken, duplicate engine, too many fleets) or InvalidRequest (too many
        engines, an unusable endpoint, a file that is not a recording); then nothing was
        started."""
        if play is not None:
            try:
                next(iter(read_records(play)), None)
            except (OSError, WireError) as exc:
                raise InvalidRequest(f"cannot play {play}: {exc}") from None
        if name in self._fleets or name in self._creating:
            raise Conflict(f"fleet {name!r} exists; delete it first or pick another name")
        if len(self._fleets) + len(self._creating) >= self.max_fleets:
            raise Conflict(f"the server has {len(self._fleets)} fleets, the most it takes "
                           f"({self.max_fleets}); delete one first")
        if len(engines) > max_engines:
            raise InvalidRequest(f"{len(engines)} engines; a fleet takes at most {max_engines}")
        self._room_for(len(engines) + (listen is not None) + (nats is not None))
        specs = [EngineSpec.parse(e) for e in engines]
        seen: set[str] = set()
        for s in specs:
            if s.name in seen:
                raise Conflict(f"engine name {s.name!r} is given twice")
            seen.add(s.name)
        self._creating.add(name)
        try:
            lock = asyncio.Lock()
            fleet = Fleet(name, apply=LoopApplier(asyncio.get_running_loop(), lock), record=record,
                          max_engines=max_engines)
            try:
                for s in specs:
                    fleet.add(s)
                if listen is not None:
                    fleet.listen(_listen_spec(listen))
                if nats is not None:
                    fleet.follow_nats(_nats_spec(nats, self.nats_auth))
            except Exception:
                await asyncio.to_thread(fleet.close)
                raise
            handle = FleetHandle(fleet, lock)
            self._fleets[name] = handle
            if play is not None:
                handle.play(play, speed)
            return handle
        finally:
            self._creating.discard(name)

    def engines_running(self) -> int:
        """Engines the server runs threads for: those followed and those still closing."""
        total = sum(h.engine_count() for h in self._fleets.values())
        return total + sum(c.engine_count() for c in list(self._closing))

    def _room_for(self, n: int) -> None:
        total = self.engines_running()
        if total + n > self.max_total_engines:
            closing = sum(c.engine_count() for c in list(self._closing))
            also = f" ({closing} of them still closing)" if closing else ""
            raise Conflict(f"the server follows {total} engines{also}; {n} more would pass its "
                           f"limit of {self.max_total_engines}: delete a fleet or remove engines first")

    def _in_background(self, closing, finish) -> None:
        """Run `finish` (blocking) in a worker; `closing` counts against the limit until then."""
        self._closing.add(closing)

        async def run() -> None:
            try:
                await asyncio.to_thread(finish)
            except Exception:
                log.exception("closing %s failed", closing)
            finally:
                self._closing.discard(closing)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for everything closing in the background (tests; server shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def delete(self, name: str, *, handle: FleetHandle | None = None) -> bool:
        """Remove and close the fleet `name`. Raises NotFound. Given `handle`, only that very
        fleet: False (nothing done) when the fleet by that name is another one or gone."""
        if handle is not None and self._fleets.get(name) is not handle:
            return False
        handle = self.get(name)
        del self._fleets[name]
        await handle.release()  # memory back and no change applied from here; threads told to stop
        self._in_background(handle, handle.finish)
        return True

    async def add_engine(self, name: str, engine: dict) -> None:
        handle = self.get(name)
        spec = EngineSpec.parse(engine)
        self._room_for(1)
        async with handle.lock:
            handle.fleet.add(spec)

    async def remove_engine(self, name: str, engine: str) -> None:
        handle = self.get(name)
        async with handle.lock:
            link = handle.fleet.remove(engine)
        if link is not None:
            link.stop_soon()
            self._in_background(_Closing(link), lambda: link.join(time.monotonic() + CLOSE_DEADLINE_S))

    async def close_all(self) -> None:
        for name in list(self._fleets):
            try:
                await self.delete(name)
            except Exception:
                log.exception("closing fleet %s failed", name)
        await self.settle()


def _listen_spec(d: dict) -> ListenSpec:
    """The REST body's `listen` (its `replay_endpoint` is ListenSpec's `replay`)."""
    d = dict(d)
    d["replay"] = d.pop("replay_endpoint", None)
    return ListenSpec(**d)


def _nats_spec(d: dict, auth: NatsAuth | None) -> NatsSpec:
    """The REST body's `nats`, with the credentials the server was given (settings or files;
    an `auth` in `d` comes from the command line, never from a request)."""
    d = dict(d)
    d.setdefault("auth", auth)
    return NatsSpec(**d)


class _Closing:
    """A removed engine's link while its threads stop."""

    def __init__(self, link) -> None:
        self.link = link

    def engine_count(self) -> int:
        return int(self.link.alive())

    def __repr__(self) -> str:
        return f"engine {self.link.spec.name}"
