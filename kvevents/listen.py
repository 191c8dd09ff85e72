"""A listening fleet: one bound SUB socket that every engine's PUB connects to (llm-d's layout).

In llm-d the indexer binds one ZeroMQ endpoint (`tcp://*:5557`) and every vLLM pod connects to
it, publishing with topic `kv@<pod>@<model>`. The `Listener` binds that endpoint for a Fleet and
turns each topic it sees into an engine, named by the pod (a pod serving several models is one
engine per model, the later ones `<pod>@<model>`), with its own `Subscriber` state: sequence,
gap and restart detection are per topic, exactly as for an engine followed on its own endpoint.

Replay: a pod's replay socket is its own (vLLM binds it on the pod), so the listener asks the
endpoint `replay` names with `{pod}` put in, and applies the reply to the pod it asked,
whatever the reply's topic frame says (vLLM's replay frames may carry no topic). Replays run in
the listener's thread, each bounded by POD_REPLAY_TIMEOUT_S.

Bad input never makes an engine: a topic that does not parse is counted and shown on the fleet
(`bad_topics`, the last few with their reason); a pod past the fleet's engine limit is refused,
counted and named on the fleet, and nothing of it is indexed.

ZeroMQ has no authentication in this layout: any host that reaches the bound port can publish
into the fleet. So the endpoint binds loopback unless the user names another interface.
"""

from __future__ import annotations

import ipaddress
import queue
import re
import threading
import time
from collections import deque
from dataclasses import dataclass

import zmq

from allocator.errors import InvalidRequest

from .codec import MAX_BATCH_BYTES
from .engine_link import LAGS, EngineLink, EngineSpec
from .subscriber import Subscriber

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
DEFAULT_TOPIC = "kv@"
# k8s pod names are DNS labels; kvscope keeps a pod's name usable as an engine name (a URL
# path part, shown on the page), ':' left out so it never reads as a `:dpN` suffix.
POD_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MAX_MODEL_CHARS = 256
MAX_TOPIC_BYTES = 512
BAD_TOPICS_KEPT = 8
REFUSED_NAMES_KEPT = 16
POD_REPLAY_TIMEOUT_S = 1.0
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
_MONITOR_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED


@dataclass(slots=True)
class ListenSpec:
    """Where a listening fleet binds and what it takes. `replay`: each pod's replay endpoint as
    seen from here, `{pod}` standing for the pod's name (e.g. `tcp://{pod}.vllm:5558`); None:
    gaps are counted lost. `block_size` / `num_blocks` apply to every pod."""

    endpoint: str = DEFAULT_ENDPOINT
    topic: str = DEFAULT_TOPIC
    replay: str | None = None
    block_size: int | None = None
    num_blocks: int | None = None
    replay_timeout: float = POD_REPLAY_TIMEOUT_S


def snapshot(items) -> list:
    """A list of a dict's or set's items that another thread may change meanwhile."""
    for _ in range(100):
        try:
            return list(items)
        except RuntimeError:  # changed size during the copy: try again
            continue
    return []


def parse_topic(topic: bytes) -> tuple[str, str]:
    """(pod, model) of a topic `kv@<pod>@<model>` (the model may itself hold '@'). Raises
    ValueError with the reason."""
    if len(topic) > MAX_TOPIC_BYTES:
        raise ValueError(f"topic of {len(topic)} bytes (at most {MAX_TOPIC_BYTES})")
    try:
        text = topic.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("topic is not UTF-8") from None
    parts = text.split("@", 2)
    if len(parts) != 3:
        raise ValueError("topic is not kv@<pod>@<model>")
    _, pod, model = parts
    if not POD_PATTERN.match(pod):
        raise ValueError(f"pod {pod[:64]!r} is not a name of letters, digits, '.', '_', '-' "
                         "(at most 63)")
    if not model or len(model) > MAX_MODEL_CHARS or not model.isprintable():
        raise ValueError(f"model {model[:64]!r} is empty, longer than {MAX_MODEL_CHARS} or not "
                         "printable")
    return pod, model


def is_loopback_endpoint(endpoint: str) -> bool:
    """Whether binding `endpoint` keeps it to this machine (ipc:// does; tcp:// on a loopback
    address or `localhost` does; `*`, 0.0.0.0 and every other interface do not)."""
    if endpoint.startswith("ipc://"):
        return True
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_endpoint(given: str) -> str:
    """A `--listen` value as an endpoint: a bare port (`5557`, `:5557`) binds loopback."""
    port = given.removeprefix(":")
    if port.isdigit():
        return f"tcp://127.0.0.1:{port}"
    return given


class Listener:
    """The bound SUB socket of one Fleet, its thread, and the pods it has seen (by topic)."""

    def __init__(self, fleet, spec: ListenSpec) -> None:
        self.fleet, self.spec = fleet, spec
        self.loopback = is_loopback_endpoint(spec.endpoint)
        sock = fleet.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_BATCH_BYTES + 64)
        sock.setsockopt(zmq.SUBSCRIBE, spec.topic.encode())
        try:
            self._monitor = sock.get_monitor_socket(_MONITOR_EVENTS)
            sock.bind(spec.endpoint)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise InvalidRequest(f"cannot listen on {spec.endpoint}: {exc}") from None
        self.bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sock = sock
        self.pods: dict[bytes, PodLink] = {}  # touched by the listener's thread only
        self._removed: queue.SimpleQueue = queue.SimpleQueue()
        self.messages = 0
        self.frame_errors = 0
        self.bad_topics = 0
        self.bad_topic_examples: deque = deque(maxlen=BAD_TOPICS_KEPT)
        self.refused_pods: dict[str, int] = {}  # the first REFUSED_NAMES_KEPT names -> batches
        self.refused_pod_count = 0
        self.refused_batches = 0
        self.accepted = 0
        self.disconnected = 0
        self.last_error: str | None = None
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"fleet-{fleet.name}-listen")
        self._thread.start()

    # -- the thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                self._forget_removed()
                try:
                    ready = dict(poller.poll(100))
                    if self._monitor in ready:
                        ev = recv_monitor_message(self._monitor, zmq.NOBLOCK)["event"]
                        self.accepted += ev == zmq.EVENT_ACCEPTED
                        self.disconnected += ev == zmq.EVENT_DISCONNECTED
                    if self._sock in ready:
                        self.handle(self._sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    continue
                except zmq.ZMQError as exc:
                    self.last_error = f"socket: {exc}"
                    time.sleep(0.1)
                except Exception as exc:  # never die: shown, and the next message is read
                    self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            for link in self.pods.values():
                link.subscriber._drop_dealer()
            self._sock.close(linger=0)
            self._monitor.close(linger=0)

    def handle(self, frames: list[bytes]) -> None:
        """One message `[topic, seq, payload]` from whichever pod sent it."""
        self.messages += 1
        if len(frames) != 3:
            self.frame_errors += 1
            self.last_error = f"message of {len(frames)} frames, expected 3 (topic, seq, payload)"
            return
        link = self.pods.get(frames[0])
        if link is None or link.removed:
            link = self._new_pod(frames[0])
            if link is None:
                return
        if link.refused:
            link.refused_batches += 1
            self._count_refused(link.pod)
            return
        link.subscriber.handle(frames)

    def _new_pod(self, topic: bytes) -> PodLink | None:
        try:
            pod, model = parse_topic(topic)
        except ValueError as exc:
            self.bad_topics += 1
            self.bad_topic_examples.append({"topic": topic[:80].decode("utf-8", "replace"),
                                            "reason": str(exc), "at": time.time()})
            return None
        old = self.pods.pop(topic, None)
        if old is not None:
            old.subscriber._drop_dealer()
        if len(self.pods) >= self.fleet.index.max_engines:
            self._count_refused(pod)
            return None
        link = PodLink(self, self._name_for(pod, model), pod, model, topic)
        self.pods[topic] = link
        self.fleet.submit(lambda: self.fleet.adopt(link))
        return link

    def _name_for(self, pod: str, model: str) -> str:
        taken = {link.spec.name for link in self.pods.values()}
        base = pod if all(link.pod != pod for link in self.pods.values()) else \
            f"{pod}@{_NAME_CHARS.sub('_', model)}"[:60]
        name, i = base, 2
        while name in taken or name in self.fleet.index.engines:
            name, i = f"{base}-{i}", i + 1
        return name

    def _count_refused(self, pod: str) -> None:
        self.refused_batches += 1
        if pod in self.refused_pods:
            self.refused_pods[pod] += 1
            return
        if len(self.refused_pods) < REFUSED_NAMES_KEPT:
            self.refused_pods[pod] = 1
        self.refused_pod_count += 1

    def refuse(self, link: PodLink, why: str) -> None:
        """The fleet could not take the pod (full, or its name is taken): nothing of it is
        indexed, its batches are counted from now on."""
        link.refused = True
        link.refusal = why
        self.last_error = why
        self._count_refused(link.pod)

    def _forget_removed(self) -> None:
        while True:
            try:
                link = self._removed.get_nowait()
            except queue.Empty:
                return
            if self.pods.get(link.topic) is link:
                del self.pods[link.topic]
            link.subscriber._drop_dealer()

    # -- lifecycle and reading ----------------------------------------------------------------------
    def stop_soon(self) -> None:
        self._stop.set()
        for link in snapshot(self.pods.values()):
            link.subscriber.stop_soon()  # breaks a replay wait off

    def join(self, timeout: float) -> bool:
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def errors(self) -> list[str]:
        out = []
        if self.refused_pod_count:
            names = ", ".join(sorted(self.refused_pods))
            more = self.refused_pod_count - len(self.refused_pods)
            out.append(f"{self.refused_pod_count} pods refused: the fleet takes at most "
                       f"{self.fleet.index.max_engines} engines; nothing of {names}"
                       f"{f' and {more} more' if more > 0 else ''} is indexed")
        if self.bad_topics:
            out.append(f"{self.bad_topics} messages with a topic that is not kv@<pod>@<model> "
                       "were dropped")
        if not self.loopback:
            out.append(f"listening on {self.spec.endpoint}, beyond loopback: any host that "
                       "reaches the port can publish into this fleet")
        return out

    def describe(self) -> dict:
        return {"endpoint": self.spec.endpoint, "bound": self.bound, "topic": self.spec.topic,
                "replay": self.spec.replay, "loopback": self.loopback,
                "state": "listening" if self.alive() else "stopped",
                "pods": len(self.pods), "messages": self.messages,
                "connections": max(0, self.accepted - self.disconnected),
                "accepted": self.accepted, "disconnected": self.disconnected,
                "frame_errors": self.frame_errors, "bad_topics": self.bad_topics,
                "bad_topic_examples": list(self.bad_topic_examples),
                "refused_pods": self.refused_pod_count,
                "refused_pod_names": sorted(self.refused_pods),
                "refused_batches": self.refused_batches,
                "last_error": self.last_error, "errors": self.errors()}


class PodLink:
    """One (pod, model) topic seen by a Listener: the link interface of an EngineLink (a
    Subscriber's state, DP ranks, lags, health) without a socket or thread of its own (the
    listener's thread drives `subscriber.handle`)."""

    shared = True  # no thread of its own: not counted against the server's engine threads

    def __init__(self, listener: Listener, name: str, pod: str, model: str, topic: bytes) -> None:

        fleet, spec = listener.fleet, listener.spec
        self.listener, self.fleet, self.pod, self.topic = listener, fleet, pod, topic
        replay = spec.replay.replace("{pod}", pod) if spec.replay else None
        self.spec = EngineSpec(name=name, endpoint=spec.endpoint, replay_endpoint=replay,
                               topic=topic.decode(), num_blocks=spec.num_blocks,
                               block_size=spec.block_size, server=pod, model=model)
        self.connection, self.retries, self.disconnects = "connected", 0, 0
        self.retry_in_ms = self.connected_at = None
        self.refused_batches = 0
        self.refused = self.removed = False
        self.refusal: str | None = None
        self.lags: deque = deque(maxlen=LAGS)
        self.ranks: dict[int, str | None] = {0: name}
        self.monitor = self.poller = None
        self.subscriber = Subscriber(spec.endpoint, topic=self.spec.topic, replay_endpoint=replay,
                                     replay_timeout=spec.replay_timeout, on_batch=self._on_batch,
                                     on_restart=self._on_restart, ctx=fleet.ctx,
                                     recorder=fleet.recorder_for(name))

    def _on_batch(self, seq: int, batch) -> None:
        fleet = self.fleet
        if fleet is not None and not self.refused:
            fleet.route(self, batch)

    def _on_restart(self) -> None:
        fleet = self.fleet
        if fleet is not None:
            fleet.restarted(self)

    def engine_names(self) -> list[str]:
        return [n for n in self.ranks.values() if n is not None]

    def refuse(self, why: str) -> None:
        self.listener.refuse(self, why)

    def health(self) -> dict:

        out = EngineLink.health(self)
        out["connection"] = "listening"
        if self.refused:
            out["state"] = "refused"
            out["last_error"] = self.refusal
        return out

    def on_monitor(self, event: int, value: int) -> None:
        """Never called: a pod has no socket of its own."""

    def stop_soon(self) -> None:
        """Forget the pod (the listener drops its replay socket); a later batch of its topic
        makes it an engine again, as a pod restarted under the same name would."""
        self.removed = True
        self.subscriber.stop_soon()
        self.listener._removed.put(self)

    def join(self, deadline: float) -> bool:
        self.fleet = None
        return True

    def alive(self) -> bool:
        return False
