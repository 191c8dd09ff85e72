"""Dynamo's event plane over NATS core: one subscription carries every worker of a component.

A Dynamo worker publishing on NATS (`DYN_EVENT_PLANE=nats`) sends each `EventEnvelope`
(kvevents/dynamo.py) on `namespace.{ns}.component.{comp}.endpoint.{ep}.kv-events` (ai-dynamo
1.6; earlier releases: `namespace.{ns}.component.{comp}.kv-events`). `NatsSource` subscribes to
both for one namespace and component, in a thread running its own event loop (nats-py), and
makes an engine of every worker its RouterEvents name: `worker-<worker_id>` (further DP ranks
`worker-<worker_id>:dp<rank>`), past the fleet's engine limit refused and counted.

Sequencing is per publisher (each envelope's `publisher_id` and `sequence`), with a Subscriber's
state per publisher: a gap is counted lost (NATS core keeps nothing to replay), a sequence that
goes back is a restart, and so is a new publisher feeding an engine another one fed.

Connection: a server that cannot be reached, or refuses the credentials, shows `unreachable`
with the reason, retried with backoff (RECONNECT_MS doubled per try up to RECONNECT_MAX_MS);
once connected a drop shows `disconnected` and is retried the same way. Credentials (a token,
a user and password, or a creds file) come from the server's settings or files, never from a
request; the fleet shows which kind is used, never its value, and no message carries one.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass

from .codec import WireError
from .dynamo import decode_envelope
from .dynamo_wire import DynamoWire
from .engine_link import LAGS, EngineSpec, lag_percentiles
from .listen import snapshot
from .subscriber import Subscriber

RECONNECT_MS = 100
RECONNECT_MAX_MS = 5000
CONNECT_TIMEOUT_S = 2.0
SUBJECT_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
PUBLISHERS_PER_ENGINE = 4  # publishers followed at most: this times the fleet's engine limit
REFUSED_NAMES_KEPT = 16
PROBLEMS_KEPT = 8


@dataclass(slots=True, repr=False)
class NatsAuth:
    """NATS credentials: a token, a user and password, or a creds file (its path). `repr` and
    `kind` never show a value."""

    token: str | None = None
    user: str | None = None
    password: str | None = None
    creds_file: str | None = None

    @classmethod
    def from_env(cls, env=os.environ) -> NatsAuth | None:
        """From KVSCOPE_NATS_TOKEN (or _TOKEN_FILE), KVSCOPE_NATS_USER with KVSCOPE_NATS_PASSWORD
        (or _PASSWORD_FILE), KVSCOPE_NATS_CREDS (a creds file); None when none is set. Raises
        ValueError naming a file that cannot be read."""
        auth = cls(token=env.get("KVSCOPE_NATS_TOKEN") or _read(env.get("KVSCOPE_NATS_TOKEN_FILE")),
                   user=env.get("KVSCOPE_NATS_USER") or None,
                   password=env.get("KVSCOPE_NATS_PASSWORD") or _read(env.get("KVSCOPE_NATS_PASSWORD_FILE")),
                   creds_file=env.get("KVSCOPE_NATS_CREDS") or None)
        return auth if auth.kind() else None

    def kind(self) -> str | None:
        if self.creds_file:
            return "creds"
        if self.user:
            return "user"
        if self.token:
            return "token"
        return None

    def secrets(self) -> list[str]:
        return [s for s in (self.token, self.password) if s]

    def options(self) -> dict:
        out: dict = {}
        if self.creds_file:
            out["user_credentials"] = self.creds_file
        elif self.user:
            out["user"], out["password"] = self.user, self.password or ""
        elif self.token:
            out["token"] = self.token
        return out

    def __repr__(self) -> str:
        return f"NatsAuth(kind={self.kind()!r})"


def _read(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None


@dataclass(slots=True)
class NatsSpec:
    """Which component's KV events to follow on which NATS server (`nats://host:4222`;
    credentials never in the URL: `auth`). `subject` overrides the subjects Dynamo uses."""

    url: str
    namespace: str
    component: str
    subject: str | None = None
    block_size: int | None = None
    num_blocks: int | None = None
    auth: NatsAuth | None = None

    def check(self) -> None:
        """Raises ValueError naming what is wrong."""
        if not re.match(r"^(nats|tls)://[^\s/@]+:\d{1,5}$", self.url):
            raise ValueError(f"NATS url {self.url[:80]!r} is not nats://host:port (credentials "
                             "come from the server's settings, never the URL)")
        for what in ("namespace", "component"):
            if not SUBJECT_TOKEN.match(getattr(self, what)):
                raise ValueError(f"{what} must be letters, digits, '_' or '-' (a NATS subject token)")
        if self.subject is not None and not re.match(r"^[A-Za-z0-9_*>.-]{1,256}$", self.subject):
            raise ValueError("subject must be a NATS subject (letters, digits, . * > _ -)")

    def subjects(self) -> list[str]:
        if self.subject:
            return [self.subject]
        base = f"namespace.{self.namespace}.component.{self.component}"
        return [f"{base}.kv-events", f"{base}.endpoint.*.kv-events"]


class _Publisher(DynamoWire, Subscriber):
    """One Dynamo publisher's sequence on the subscription (no socket of its own)."""

    framed = False

    def decode(self, envelope) -> list:
        return self.batches_of(envelope.payload, envelope.published_at)


class NatsSource:
    """The subscription of one Fleet, its thread, and the workers it has seen."""

    def __init__(self, fleet, spec: NatsSpec) -> None:
        import nats  # noqa: F401  (refused at once when the client is missing)

        spec.check()
        self.fleet, self.spec = fleet, spec
        self.state = "connecting"
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.retries = 0
        self.retry_in_ms: int | None = None
        self.connected_at: float | None = None
        self.disconnects = 0
        self.messages = 0
        self.bad_envelopes = 0
        self.problems: deque = deque(maxlen=PROBLEMS_KEPT)
        self.publishers: dict[int, _Publisher] = {}  # touched by the source's thread only
        self.workers: dict[int, WorkerLink] = {}
        self.fed_by: dict[tuple[int, int], int] = {}  # (worker, rank) -> publisher_id
        self.refused_workers: dict[int, int] = {}
        self.refused_worker_count = 0
        self.refused_batches = 0
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"fleet-{fleet.name}-nats")
        self._thread.start()

    # -- connection ---------------------------------------------------------------------------------
    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._follow())
        finally:
            loop.close()

    async def _follow(self) -> None:
        import nats

        delay = RECONNECT_MS
        while not self._stop.is_set():
            lost = asyncio.Event()

            async def on_error(exc) -> None:
                self._note(f"{type(exc).__name__}: {exc}")

            async def on_gone(lost=lost) -> None:
                lost.set()

            nc = None
            try:
                # one try (nats-py's attempts count from 1; 0 is "forever"), bounded besides;
                # NoServersError carries no cause: the reason is what error_cb noted
                nc = await asyncio.wait_for(nats.connect(
                    servers=[self.spec.url], allow_reconnect=False, connect_timeout=CONNECT_TIMEOUT_S,
                    max_reconnect_attempts=1, reconnect_time_wait=0, error_cb=on_error,
                    disconnected_cb=on_gone,
                    closed_cb=on_gone, name=f"kvscope fleet {self.fleet.name}",
                    **(self.spec.auth.options() if self.spec.auth else {})), CONNECT_TIMEOUT_S * 2)
                for subject in self.spec.subjects():
                    await nc.subscribe(subject, cb=self._on_msg)
                await nc.flush(timeout=CONNECT_TIMEOUT_S)
            except Exception as exc:  # unreachable, refused, timed out: shown, then retried
                if not isinstance(exc, (asyncio.TimeoutError, nats.errors.NoServersError)) \
                        or not self.last_error:
                    self._note(_reason(exc))
                self.state, self.retry_in_ms = "unreachable", delay
                self.retries += 1
                if nc is not None:
                    await _close(nc)
                if await self._sleep(delay / 1000):
                    return
                delay = min(delay * 2, RECONNECT_MAX_MS)
                continue
            self.state, self.connected_at, self.retry_in_ms = "connected", time.time(), None
            delay = RECONNECT_MS
            while not self._stop.is_set() and not lost.is_set() and not nc.is_closed:
                await asyncio.sleep(0.1)
            await _close(nc)
            if self._stop.is_set():
                return
            self.disconnects += 1
            self.state = "disconnected"

    async def _sleep(self, seconds: float) -> bool:
        """Wait, waking early when told to stop; True when stopping."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self._stop.is_set():
                return True
            await asyncio.sleep(min(0.05, end - time.monotonic()))
        return self._stop.is_set()

    def _note(self, reason: str) -> None:
        for secret in self.spec.auth.secrets() if self.spec.auth else ():
            reason = reason.replace(secret, "***")
        self.last_error, self.last_error_at = reason[:300], time.time()

    # -- messages -----------------------------------------------------------------------------------
    async def _on_msg(self, msg) -> None:
        self.handle(msg.data)

    def handle(self, data: bytes) -> None:
        """One NATS message: an envelope of one publisher."""
        self.messages += 1
        if self.state == "connected":
            self.state = "live"
        try:
            env = decode_envelope(data)
        except WireError as exc:
            self.bad_envelopes += 1
            self.problems.append(str(exc)[:200])
            return
        pub = self.publishers.get(env.publisher_id)
        if pub is None:
            if len(self.publishers) >= PUBLISHERS_PER_ENGINE * self.fleet.index.max_engines:
                self.refused_batches += 1
                return
            pub = self.publishers[env.publisher_id] = _Publisher(
                self.spec.url, on_batch=lambda seq, batch, pid=env.publisher_id: self._route(pid, batch),
                on_restart=lambda pid=env.publisher_id: self._restart(pid), ctx=None)
        if env.sequence > (1 << 63) - 1:
            pub._error("frames", f"sequence {env.sequence} past 2**63")
            return
        pub.sequenced(env.sequence, env)

    def _route(self, pid: int, batch) -> None:
        worker = self.publishers[pid].worker_id
        if worker is None:
            return
        link = self.workers.get(worker)
        if link is None or link.removed:
            link = self._new_worker(worker)
            if link is None:
                return
        if link.refused:
            link.refused_batches += 1
            self._count_refused(worker)
            return
        rank = batch.dp_rank or 0
        if self.fed_by.get((worker, rank), pid) != pid:  # another publisher now: it restarted
            link.restarts += 1
            self._clear(link, rank)
        self.fed_by[(worker, rank)] = pid
        link.publishers.add(pid)
        self.fleet.route(link, batch)

    def _new_worker(self, worker: int):
        live = sum(not w.removed for w in self.workers.values())
        if live >= self.fleet.index.max_engines:
            self._count_refused(worker)
            return None
        link = WorkerLink(self, worker)
        self.workers[worker] = link
        self.fleet.submit(lambda: self.fleet.adopt(link))
        return link

    def _restart(self, pid: int) -> None:
        """A publisher's sequence went back: its engines are cleared."""
        for (worker, rank), fed in list(self.fed_by.items()):
            if fed == pid and worker in self.workers:
                self.workers[worker].restarts += 1
                self._clear(self.workers[worker], rank)

    def _clear(self, link, rank: int) -> None:
        fleet = self.fleet
        name = link.ranks.get(rank)

        def change() -> None:
            if name is not None and name in fleet.index.engines:
                fleet.index.clear_all(fleet.index.engine(name).eid)
        fleet.submit(change)

    def _count_refused(self, worker: int) -> None:
        self.refused_batches += 1
        if worker in self.refused_workers:
            self.refused_workers[worker] += 1
            return
        if len(self.refused_workers) < REFUSED_NAMES_KEPT:
            self.refused_workers[worker] = 1
        self.refused_worker_count += 1

    def refuse(self, link, why: str) -> None:
        link.refused, link.refusal = True, why
        self._note(why)
        self._count_refused(link.worker_id)

    # -- lifecycle and reading ----------------------------------------------------------------------
    def stop_soon(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> bool:
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def publisher_status(self, pids) -> dict:
        """Summed stream figures of some publishers (a worker's)."""
        out = {"batches": 0, "events": 0, "gaps": 0, "lost_batches": 0, "restarts": 0,
               "duplicates": 0, "error_count": 0, "last_batch_at": None, "last_error": None}
        for pid in snapshot(pids):
            pub = self.publishers.get(pid)
            if pub is None:
                continue
            s = pub.status()
            for k in ("batches", "events", "gaps", "lost_batches", "restarts", "duplicates", "error_count"):
                out[k] += s[k]
            if s["last_batch_at"] and (out["last_batch_at"] or 0) < s["last_batch_at"]:
                out["last_batch_at"] = s["last_batch_at"]
            out["last_error"] = s["last_error"] or out["last_error"]
            for tier, n in s["tier_blocks"].items():
                out.setdefault("tier_blocks", {})[tier] = out.get("tier_blocks", {}).get(tier, 0) + n
        out.setdefault("tier_blocks", {})
        return out

    def errors(self) -> list[str]:
        out = []
        if self.state == "unreachable":
            out.append(f"NATS {self.spec.url} unreachable: {self.last_error}")
        if self.refused_worker_count:
            names = ", ".join(f"worker-{w}" for w in sorted(self.refused_workers))
            out.append(f"{self.refused_worker_count} workers refused: the fleet takes at most "
                       f"{self.fleet.index.max_engines} engines; nothing of {names} is indexed")
        if self.bad_envelopes:
            out.append(f"{self.bad_envelopes} messages were not Dynamo event envelopes")
        return out

    def describe(self) -> dict:
        s = self.spec
        return {"url": s.url, "namespace": s.namespace, "component": s.component,
                "subjects": s.subjects(), "auth": s.auth.kind() if s.auth else None,
                "state": self.state if self.alive() else "stopped", "retries": self.retries,
                "retry_in_ms": self.retry_in_ms, "connected_at": self.connected_at,
                "disconnects": self.disconnects, "last_error": self.last_error,
                "last_error_at": self.last_error_at, "messages": self.messages,
                "bad_envelopes": self.bad_envelopes, "problems": list(self.problems),
                "workers": len(self.workers), "publishers": len(self.publishers),
                "refused_workers": self.refused_worker_count,
                "refused_batches": self.refused_batches, "errors": self.errors()}


class WorkerLink:
    """One Dynamo worker seen on a NatsSource: the link interface of an EngineLink (DP ranks,
    lags, health), its stream figures summed over its publishers."""

    shared = True

    def __init__(self, source: NatsSource, worker: int) -> None:

        s = source.spec
        name = f"worker-{worker}"
        self.source, self.fleet, self.worker_id = source, source.fleet, worker
        self.spec = EngineSpec(name=name, endpoint=s.url, topic=" ".join(s.subjects()),
                               num_blocks=s.num_blocks, block_size=s.block_size, server=name,
                               wire="dynamo")
        self.ranks: dict[int, str | None] = {0: name}
        self.lags: deque = deque(maxlen=LAGS)
        self.refused_batches = 0
        self.restarts = 0
        self.refused = self.removed = False
        self.refusal: str | None = None
        self.publishers: set[int] = set()
        self.monitor = self.poller = None
        self.subscriber = None

    def engine_names(self) -> list[str]:
        return [n for n in self.ranks.values() if n is not None]

    def refuse(self, why: str) -> None:
        self.source.refuse(self, why)

    def health(self) -> dict:

        src = self.source
        sub = src.publisher_status(self.publishers)
        state = src.state if src.alive() else "stopped"
        if state in ("connected", "live"):
            state = "live" if sub["batches"] else "connected"
        if self.refused:
            state = "refused"
        out = {"state": state, "connection": "nats", "retries": src.retries,
               "retry_in_ms": src.retry_in_ms, "disconnects": src.disconnects,
               "refused_batches": self.refused_batches, **sub, "restarts": sub["restarts"] + self.restarts,
               "wire": "dynamo", "worker_id": self.worker_id,
               "last_error": self.refusal or sub["last_error"] or (src.last_error if state == "unreachable" else None)}
        last = sub["last_batch_at"]
        out["lag_s"] = None if last is None else round(max(0.0, time.time() - last), 3)
        out.update(lag_percentiles(self.lags))
        return out

    def on_monitor(self, event: int, value: int) -> None:
        """Never called: a worker has no socket of its own."""

    def stop_soon(self) -> None:
        """Forget the worker; a later batch of it makes it an engine again."""
        self.removed = True
        src = self.source

        def forget() -> None:
            if src.workers.get(self.worker_id) is self:
                del src.workers[self.worker_id]
        if src._loop is not None and src.alive():
            src._loop.call_soon_threadsafe(forget)

    def join(self, deadline: float) -> bool:
        self.fleet = None
        return True

    def alive(self) -> bool:
        return False


def _reason(exc: BaseException) -> str:
    """Why a connection failed, in a line (nats-py wraps the cause of NoServersError)."""
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause) and str(cause) not in text:
        text = f"{text}: {cause}"
    return f"{type(exc).__name__}: {text}"


async def _close(nc) -> None:
    try:
        await asyncio.wait_for(nc.close(), 1.0)
    except Exception:  # closing a connection that failed: nothing to keep
        pass
