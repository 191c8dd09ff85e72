"""Fleet: many engines' KV-event streams into one FleetIndex.

One `Subscriber` per engine (the same sequencing, replay and bad-input handling as a mirror),
its batches handed to `apply` as changes to the index. A batch whose `data_parallel_rank` is not
the engine's own belongs to another rank of the same server: that rank is its own engine in the
fleet, named `<server>:dp<rank>`, added on first sight (while the fleet has room; else the batch
is counted in `refused_batches`). An engine restart clears every rank of that server.

Connection state comes from a ZeroMQ socket monitor: an endpoint nobody answers shows
`unreachable` with the retry count and the next retry interval, which ZeroMQ doubles per retry
up to `RECONNECT_MAX_MS` (the fleet's own context sets that backoff).

A fleet recording (`record=`) is one kvscope recording whose topic frame names the engine of each
batch; `play(path)` feeds one back through the same routing.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections import deque
from collections.abc import Callable

import zmq

from allocator.errors import Conflict, InvalidRequest

from .block_map import BlockMap
from .codec import Removed, Stored, WireError, decode_batch
from .dynamo import HASH_KEYED_BLOCK_SIZE, signed64, tokens_hashes
from .engine_link import (  # noqa: F401  (EngineSpec, lag_percentiles: re-exported)
    CLOSE_DEADLINE_S,
    LAGS,
    RECONNECT_MAX_MS,
    RECONNECT_MS,
    EngineLink,
    EngineSpec,
    _context,
    lag_percentiles,
)
from .fleet_view import EngineQuery, recorded_server, server_of, view_of
from .follow import threaded_apply
from .index import MAX_FLEET_ENGINES, FleetIndex
from .listen import Listener
from .nats_source import NatsSource
from .receiver import Receiver
from .recording import Recorder, read_records

SAMPLE_EVERY_S = 1.0
SAMPLES = 600  # ten minutes of duplication and missed-reuse figures at one per second
RECENT = 12  # recent stored chains offered to the match box
APPLY_PART_BLOCKS = 4096  # a batch is applied in parts of at most this many blocks


class Fleet:
    """A named fleet: the index, one EngineLink per engine spec, and figures over time.

    `apply(change)` runs each change to the index (default: at once under a lock private to the
    fleet); a server hands a loop applier so changes run on its event loop under the fleet's
    lock. Reads (`describe`, `match`) must run where changes run (on that loop, or under
    `self.lock` in threaded mode).
    """

    def __init__(self, name: str, *, apply: Callable[[Callable[[], None]], None] | None = None,
                 record: str | None = None, max_engines: int = MAX_FLEET_ENGINES) -> None:
        self.name = name
        self.index = FleetIndex(max_engines=max_engines)
        self.lock = threading.Lock()
        self.submit = apply or threaded_apply(self.lock)
        self.ctx = _context()
        self.receiver = Receiver(f"fleet-{name}-recv")  # reads every engine's SUB socket
        self.links: dict[str, EngineLink] = {}
        self.specs: dict[str, EngineSpec] = {}
        self.recorder = Recorder(record, f"fleet {name}", "") if record else None
        self.samples: deque = deque(maxlen=SAMPLES)
        self.apply_failures = 0
        self.playback: dict | None = None  # a recording being played into the fleet
        self.recent: deque = deque(maxlen=4 * RECENT)  # (ts, engine, key of a chain's last block)
        self.block_map = BlockMap()
        self.created_at = time.time()
        self.closed = False
        self.listener = None  # a bound endpoint engines connect to (`listen`)
        self.nats = None  # a NATS subscription to Dynamo workers' events (`follow_nats`)
        self._stop = threading.Event()
        self._monitor_thread = threading.Thread(target=self._watch, daemon=True,
                                                name=f"fleet-{name}-monitor")
        self._monitor_thread.start()

    # -- engines --------------------------------------------------------------------------------
    def add(self, spec: EngineSpec) -> None:
        """Add an engine and start following it. Raises Conflict (name taken, fleet full) or
        InvalidRequest (endpoint unusable); then nothing changed. Call where changes run."""
        if spec.name in self.index.engines or spec.name in self.links:
            raise Conflict(f"engine {spec.name!r} is already in fleet {self.name!r}")
        self.index.add(spec.name, server=server_of(spec.name, spec.server), dp_rank=spec.dp_rank,
                       block_size=spec.index_block_size(), max_blocks=spec.num_blocks)
        try:
            self.links[spec.name] = EngineLink(self, spec)
        except Exception:
            self.index.discard(spec.name)
            raise
        self.specs[spec.name] = spec

    def listen(self, spec) -> None:
        """Bind `spec.endpoint` (a `listen.ListenSpec`) and make an engine of every pod
        publishing to it. Raises InvalidRequest (cannot bind, or already listening)."""

        if self.listener is not None:
            raise InvalidRequest(f"fleet {self.name!r} already listens on {self.listener.spec.endpoint}")
        self.listener = Listener(self, spec)

    def follow_nats(self, spec) -> None:
        """Subscribe to a Dynamo component's KV events on NATS (a `nats_source.NatsSpec`): every
        worker is an engine. Raises InvalidRequest (a bad spec, already subscribed, no client)."""

        if self.nats is not None:
            raise InvalidRequest(f"fleet {self.name!r} already follows {self.nats.spec.url}")
        try:
            self.nats = NatsSource(self, spec)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        except ImportError as exc:
            raise InvalidRequest(f"NATS needs the nats-py client ({exc})") from None

    def sources(self) -> list:
        """The shared sources (a listener, a NATS subscription) whose engines come and go."""
        return [s for s in (self.listener, self.nats) if s is not None]

    def adopt(self, link) -> None:
        """Index an engine a shared source found (a pod on the listener). A fleet that cannot
        take it (full, or the name taken) refuses it: nothing of it is indexed. Call where
        changes run."""
        if self.closed or link.removed:
            return
        spec = link.spec
        try:
            self.index.add(spec.name, server=server_of(spec.name, spec.server), dp_rank=spec.dp_rank,
                           block_size=spec.index_block_size(), max_blocks=spec.num_blocks)
        except Conflict as exc:
            link.refuse(f"not indexed: {exc}")
            return
        self.links[spec.name] = link
        self.specs[spec.name] = spec

    def remove(self, name: str) -> EngineLink | None:
        """Forget an engine spec (and its other DP ranks) in the index; returns its link, whose
        `close()` (blocking) the caller runs off the loop. An engine that is another DP rank of
        a spec's server (`server:dpN`, added as its batches came) is forgotten alone, and that
        rank's batches are refused from then on (counted in `refused_batches`); returns None.
        Raises NotFound."""
        link = self.links.get(name)
        if link is None:
            self.index.engine(name)  # raises NotFound naming the engines
            for other in self.links.values():
                for rank, n in other.ranks.items():
                    if n == name:
                        other.ranks[rank] = None
                        self.index.discard(name)
                        return None
            self.index.discard(name)  # a recorded engine (from a playback)
            return None
        for n in link.engine_names():
            if n in self.index.engines:
                self.index.discard(n)
        del self.links[name], self.specs[name]
        return link

    def recorder_for(self, engine: str):
        if self.recorder is None:
            return None
        return _TaggedRecorder(self.recorder, engine)

    # -- applying ---------------------------------------------------------------------------------
    def route(self, link: EngineLink, batch) -> None:
        """Hand one decoded batch of `link` to the index, on its rank's engine, in parts of at
        most APPLY_PART_BLOCKS blocks (each part one change: the loop runs other work between
        them). A rank is 0..1023 (the decoder refuses others)."""
        rank = link.spec.dp_rank if batch.dp_rank is None else batch.dp_rank
        spec = link.spec
        parts = _parts(batch.events)

        def change(events, first: bool, last: bool) -> None:
            if self.closed:
                return
            if rank in link.ranks:
                name = link.ranks[rank]
                if name is None:  # a rank the user removed
                    if first:
                        link.refused_batches += 1
                    return
            elif self._takes_rank(link, rank):
                name = spec.name
            else:
                name = f"{spec.name}:dp{rank}"
                if name in self.index.engines or len(self.index.engines) >= self.index.max_engines:
                    if first:
                        link.refused_batches += 1
                    return
                self.index.add(name, server=server_of(spec.name, spec.server), dp_rank=rank,
                               block_size=spec.index_block_size(), max_blocks=spec.num_blocks)
                link.ranks[rank] = name
            if name not in self.index.engines:
                return  # removed meanwhile
            eid = self.index.engine(name).eid
            self.index.apply(eid, events, first)
            if last:
                link.lags.append(time.time() - batch.ts)
            self._note_recent(name, eid, events)

        for i, events in enumerate(parts):
            self.submit(lambda events=events, i=i: change(events, i == 0, i == len(parts) - 1))

    def restarted(self, link) -> None:
        """`link`'s engine started over (its cache is empty): every rank of it cleared, on every
        tier, where changes run."""
        def change() -> None:
            for name in list(link.ranks.values()):
                if name in self.index.engines:
                    self.index.clear_all(self.index.engine(name).eid)
        self.submit(change)

    def _takes_rank(self, link, rank: int) -> bool:
        """A Dynamo worker's events name its DP rank: the engine of its spec takes the rank its
        first batch names (the spec's `dp_rank` is a default there), so a worker of rank 3
        is one engine, not an empty rank 0 and a `:dp3`."""
        spec = link.spec
        if spec.wire != "dynamo" or len(link.ranks) != 1 or spec.name not in self.index.engines:
            return False
        info = self.index.engine(spec.name)
        if self.index.engine_stats(spec.name)["batches"]:
            return False
        link.ranks = {rank: spec.name}
        info.dp_rank = rank
        return True

    def play(self, path: str, speed: float | None = None, stop: threading.Event | None = None) -> dict:
        """Feed a fleet recording back, batch by batch to the engine each one names (an engine
        not in the fleet is added on its first batch, a `:dpN` suffix read as its DP rank), at
        `speed` times real time (None: as fast as it goes). Blocking; `self.playback` follows it."""
        out = self.playback = {"path": path, "state": "playing", "batches": 0, "events": 0, "errors": 0}
        t0 = start = None
        for ts, _seq, topic, payload in read_records(path):
            if stop is not None and stop.is_set():
                break
            if speed:
                t0 = ts if t0 is None else t0
                start = time.monotonic() if start is None else start
                wait = (ts - t0) / speed - (time.monotonic() - start)
                if wait > 0 and (stop.wait(wait) if stop is not None else time.sleep(wait)):
                    break
            engine = topic.decode("utf-8", "replace")
            try:
                batch = decode_batch(payload)
            except WireError:
                out["errors"] += 1
                continue
            self.submit(lambda engine=engine, batch=batch: self._apply_recorded(engine, batch))
            out["batches"] += 1
            out["events"] += len(batch.events)
        out["state"] = "done"
        return out

    def _note_recent(self, name: str, eid: int, events) -> None:
        """Remember the last chain this batch stored (the page offers recent chains to match)."""
        for ev in reversed(events):
            if ev.kind == "stored" and ev.block_hashes:
                key = self.index.key_of(eid, ev.block_hashes[-1])
                if key is not None:
                    self.recent.append((time.time(), name, key))
                return

    def recent_chains(self, n: int = RECENT) -> list[dict]:
        """The last chains stored that are still indexed, newest first, with their length."""
        out, seen = [], set()
        for at, engine, key in reversed(self.recent):
            if key in seen:
                continue
            seen.add(key)
            blocks = len(self.index.chain_of(key))
            if blocks:
                out.append({"engine": engine, "key": f"{key:016x}", "blocks": blocks, "at": at})
            if len(out) >= n:
                break
        return out

    def _apply_recorded(self, engine: str, batch) -> None:
        if engine not in self.index.engines:
            if len(self.index.engines) >= self.index.max_engines:
                return
            server, rank = recorded_server(engine)
            self.index.add(engine, server=server, dp_rank=rank)
        eid = self.index.engine(engine).eid
        self.index.apply(eid, batch.events)
        self._note_recent(engine, eid, batch.events)

    # -- reading ----------------------------------------------------------------------------------
    def stats(self) -> dict:
        """The index's figures, `recompute_tokens` in tokens also for tokens_hash-keyed engines
        (whose blocks the index counts as one token each)."""
        out = self.index.stats()
        for name, bs in self.hash_keyed().items():
            if bs and bs > 1:
                out["recompute_tokens"] += (bs - 1) * self.index.engine_stats(name)["recompute_tokens"]
        return out

    def hash_keyed(self) -> dict[str, int | None]:
        """Engines whose blocks are keyed by Dynamo's tokens_hash, with their kv block size (None:
        not configured, so a prompt cannot be hashed for them)."""
        return {n: link.spec.block_size for link in self.links.values()
                if link.spec.wire == "dynamo" for n in link.engine_names() if n in self.index.engines}

    def block_sizes(self) -> dict[str, int | None]:
        """Tokens per block of every engine (a Dynamo engine's as configured)."""
        out = {n: self.index.block_size(n) for n in self.index.engines}
        out.update(self.hash_keyed())
        return out

    def match_tokens(self, tokens: list[int], lora_id: int | None = None,
                     lora_name: str | None = None) -> dict[str, int]:
        """Each engine's longest cached prefix of `tokens`, in blocks: engines keyed by token
        ids as the index matches them (a LoRA's blocks by `lora_id`), Dynamo's by the
        tokens_hash chain of the prompt's blocks at their block size (a LoRA's by `lora_name`,
        which Dynamo mixes into the hash; 0 for one whose block size is not known). Call where
        changes run."""
        out = self.index.match(tokens, lora_id)
        keyed = self.hash_keyed()
        by_size: dict[int, int] = {}
        for name, bs in keyed.items():
            out[name] = 0
            if bs:
                by_size[bs] = by_size.get(bs, 0) | (1 << self.index.engine(name).eid)
        for bs, mask in by_size.items():
            got = self.index.match_tokens(tokens_hashes(tokens, bs, lora_name), HASH_KEYED_BLOCK_SIZE,
                                          None, mask)
            for eid, n in got.items():
                out[self.index.name_of(eid)] = n
        return out

    def prompt_chains(self, tokens: list[int], lora_id: int | None = None,
                      lora_name: str | None = None) -> list[tuple[list[int], int | None]]:
        """The prompt's blocks as each group of engines keys them: (keys, the engines as a
        mask, None: all), one per block size of the engines keyed by token ids and per kv block
        size of the tokens_hash-keyed ones (as `match_tokens` matches them)."""
        index = self.index
        keyed = self.hash_keyed()
        keyed_mask = 0
        by_size: dict[int, int] = {}
        for name, bs in keyed.items():
            bit = 1 << index.engine(name).eid
            keyed_mask |= bit
            if bs:
                by_size[bs] = by_size.get(bs, 0) | bit
        out = []
        for bs, mask in index._block_size_groups().items():
            if keyed_mask:
                mask = (index.active if mask is None else mask) & ~keyed_mask
                if not mask:
                    continue
            out.append((index.keys_of(list(tokens), bs, lora_id), mask))
        for bs, mask in by_size.items():
            out.append((index.keys_of(tokens_hashes(tokens, bs, lora_name), HASH_KEYED_BLOCK_SIZE), mask))
        return out

    def match_weighted(self, tokens: list[int], weights: dict[str, float]) -> dict[str, float]:
        """llm-d's scores of a prompt (`FleetIndex.match_weighted` on each group's chain):
        {engine: score} for the engines holding its first block on some tier. Call where
        changes run."""
        out: dict[str, float] = {}
        for keys, mask in self.prompt_chains(tokens):
            for eid, score in self.index.match_weighted(keys, weights, mask).items():
                out[self.index.name_of(eid)] = score
        return out

    def match_tiered(self, tokens: list[int], lora_id: int | None = None,
                     lora_name: str | None = None) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """Dynamo's tiered match of a prompt: (each engine's device blocks, as `match_tokens`;
        per tier below the GPU, {engine: blocks} matched there after the tiers above, as
        Dynamo's lower-tier indexers continue a match). Call where changes run."""
        device = self.match_tokens(tokens, lora_id, lora_name)
        if not self.index.tiers:
            return device, {}
        return device, self._lower_tiers(device, self.prompt_chains(tokens, lora_id, lora_name))

    def match_tiered_hashes(self, hashes: list[int]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """`match_tiered` for a chain of Dynamo's block hashes (`match_tokens_hashes`)."""
        device = self.match_tokens_hashes(hashes)
        if not self.index.tiers or not device:
            return device, {}
        mask = 0
        for name in device:
            mask |= 1 << self.index.engine(name).eid
        chain = [signed64(h & ((1 << 64) - 1)) for h in hashes]
        return device, self._lower_tiers(device, [(self.index.keys_of(chain, HASH_KEYED_BLOCK_SIZE), mask)])

    def _lower_tiers(self, device: dict[str, int], chains) -> dict[str, dict[str, int]]:
        index = self.index
        lower: dict[str, dict[str, int]] = {t: {} for t in index.tiers}
        for keys, mask in chains:
            among = index.active if mask is None else mask
            start = {index.engine(n).eid: b for n, b in device.items()
                     if b > 0 and among >> index.engine(n).eid & 1}
            for tier, hits in index.match_lower_tiers(keys, start, among).items():
                for eid, n in hits.items():
                    lower[tier][index.name_of(eid)] = n
        return lower

    def match_tokens_hashes(self, hashes: list[int]) -> dict[str, int]:
        """Each tokens_hash-keyed engine's longest cached prefix of a chain of Dynamo's block
        hashes (`tokens_hash`es, as Dynamo's `/query_by_hash` takes them; u64 or signed), in
        blocks. Engines keyed by token ids are not in the answer: their blocks are known by
        their tokens, not by Dynamo's hash of them. Call where changes run."""
        keyed = self.hash_keyed()
        out = dict.fromkeys(keyed, 0)
        mask = 0
        for name in keyed:
            mask |= 1 << self.index.engine(name).eid
        if mask:
            chain = [signed64(h & ((1 << 64) - 1)) for h in hashes]
            for eid, n in self.index.match_tokens(chain, HASH_KEYED_BLOCK_SIZE, None, mask).items():
                out[self.index.name_of(eid)] = n
        return out

    def identities(self) -> dict[str, tuple[int | str, int, str | None]]:
        """Each engine as Dynamo's indexer names a worker, with the model it serves: (instance,
        DP rank, model). The instance is the worker id its Dynamo events carry, else its
        server's name, as an int when it is one (an engine registered the way Dynamo's indexer
        registers workers is named by its instance id)."""
        by_name = {n: link for link in self.links.values() for n in link.ranks.values() if n is not None}
        out = {}
        for name, info in self.index.engines.items():
            link = by_name.get(name)
            worker = None
            if link is not None:
                worker = getattr(link, "worker_id", None)
                if worker is None:
                    worker = getattr(getattr(link, "subscriber", None), "worker_id", None)
            server = info.server
            if worker is None:
                worker = int(server) if server.isascii() and server.isdigit() and len(server) < 20 else server
            out[name] = (worker, info.dp_rank, link.spec.model if link is not None else None)
        return out

    def held_tables(self, names: list[str]) -> tuple[dict[str, dict[int, int]], dict[int, int]]:
        """What `names` hold, for a dump: each engine's table from its own block hashes to the
        index's keys, and every indexed key's parent key (0: a root). O(blocks held); call
        where changes run."""
        tables = {n: self.index.engine_table(self.index.engine(n).eid) for n in names}
        keys, parents = self.index.nodes()[:2]
        return tables, dict(zip(keys.tolist(), parents.tolist()))

    def held_blocks(self, names: list[str]) -> int:
        """Blocks held by `names`, counted per engine (cheap)."""
        return sum(self.index.held_of(self.index.engine(n).eid) for n in names)

    def sample(self) -> None:
        """Append the figures now to `samples` (the page's duplication and missed reuse over
        time), and bound each engine by the KV block count its /metrics report (when its spec
        gives no `num_blocks`). Call where changes run."""
        for link in self.links.values():
            poller = link.poller
            n = (poller.latest or {}).get("num_gpu_blocks") if poller is not None else None
            if n and link.spec.num_blocks is None:
                for name in link.engine_names():
                    if name in self.index.engines:
                        self.index.set_max_blocks(self.index.engine(name).eid, n)
        s = self.stats()
        s["at"] = time.time()
        self.samples.append(s)

    def engines(self) -> list[dict]:
        """One row per engine, in the index's order (the order engines were added)."""
        out = []
        by_server = {n: link for link in self.links.values() for n in link.ranks.values()}
        healths: dict = {}  # one link's health for all its ranks' rows
        for name, info in self.index.engines.items():
            link = by_server.get(name)
            spec = link.spec if link is not None else None
            row = {"name": name, "server": info.server, "dp_rank": info.dp_rank,
                   "endpoint": spec.endpoint if spec else None,
                   "model": spec.model if spec else None,
                   "wire": spec.wire if spec else "vllm",
                   "num_blocks": spec.num_blocks if spec else None,
                   "configured_block_size": info.block_size,
                   **self.index.engine_stats(name)}
            if spec is not None and spec.wire == "dynamo":
                _dynamo_row(row, spec)
            row["stream"] = _health_of(link, healths)
            poller = link.poller if link is not None and spec.name == name else None
            row["metrics"] = _engine_metrics(poller)
            cyc = row["parent_cycles"] = self.block_map.cycle_blocks.get(name, 0)
            cycle_error = (f"{cyc} blocks in parent-hash cycles: the engine stored blocks under "
                           "their own descendants (blocks without token ids are keyed by its "
                           "hashes); the maps cut each cycle" if cyc else None)
            row["errors"] = [e for e in (row["block_size_error"], row["capacity_error"],
                                         cycle_error) if e]
            out.append(row)
        return out

    def describe(self, query: EngineQuery | None = None) -> dict:
        """The fleet as GET /api/fleets/{fleet} shows it: the page of its engines `query` asks
        for (default: the first DEFAULT_LIMIT, with the first groups), `engines_page`, `groups`,
        `groups_page` and the `summary` of every engine (`fleet_view.view_of`), its figures."""
        view = view_of(self.engines(), query or EngineQuery())
        return {"name": self.name, **view, "stats": self.stats(),
                "max_engines": self.index.max_engines, "created_at": self.created_at,
                "recording": None if self.recorder is None else
                {"path": self.recorder.path, "records": self.recorder.records},
                "playback": None if self.playback is None else dict(self.playback),
                "listen": None if self.listener is None else self.listener.describe(),
                "nats": None if self.nats is None else self.nats.describe(),
                "recent_chains": self.recent_chains(),
                "apply": self.submit.figures() if hasattr(self.submit, "figures") else None,
                "block_map": {"version": self.block_map.version, "cycles": self.block_map.cycles,
                              "computations": self.block_map.computations,
                              "longest_snapshot_ms": round(self.block_map.longest_snapshot_s * 1000, 2)}}

    def summary(self) -> dict:
        return {"name": self.name, "engines": len(self.index.engines),
                "listen": None if self.listener is None else self.listener.spec.endpoint,
                "nats": None if self.nats is None else self.nats.spec.url,
                **self.stats()}

    # -- lifecycle --------------------------------------------------------------------------------
    def _watch(self) -> None:
        """Read every link's monitor socket (one thread for the fleet)."""
        from zmq.utils.monitor import recv_monitor_message

        poller = zmq.Poller()
        watched: dict = {}
        while not self._stop.is_set():
            for link in list(self.links.values()):
                mon = link.monitor
                if mon is not None and mon not in watched:
                    watched[mon] = link
                    poller.register(mon, zmq.POLLIN)
            try:
                ready = dict(poller.poll(100)) if watched else {}
            except zmq.ZMQError:
                ready = {}
            if not watched:
                self._stop.wait(0.1)
            for mon in ready:
                try:
                    msg = recv_monitor_message(mon, zmq.NOBLOCK)
                except zmq.ZMQError:
                    continue
                if msg["event"] == zmq.EVENT_MONITOR_STOPPED:
                    poller.unregister(mon)
                    watched.pop(mon, None)
                    mon.close(0)
                    continue
                watched[mon].on_monitor(msg["event"], msg["value"])
        for mon in watched:
            mon.close(0)

    def close(self) -> None:
        """Stop every link and the monitor (blocking: call off the event loop). The index is
        kept, as it was, for reading."""
        self.release(free_index=False)
        self.finish_close(time.monotonic() + CLOSE_DEADLINE_S)

    def release(self, free_index: bool = True) -> list[EngineLink]:
        """The non-blocking half of closing (call where changes run): no change applies from
        now on, every link and the monitor are told to stop and, with `free_index`, the index's
        memory goes back at once (it is left empty). Returns the links, for `finish_close`."""
        self.closed = True
        if hasattr(self.submit, "close"):
            self.submit.close()  # queued batches are dropped
        links, self.links = list(self.links.values()), {}
        self._closing = links
        for source in self.sources():
            source.stop_soon()
        for link in links:
            link.stop_soon()
        self.receiver.stop_soon()
        self._stop.set()
        if free_index:
            self.index.release()
            self.recent.clear()
            self.block_map = BlockMap()
            _trim_heap()
        return links

    def finish_close(self, deadline: float) -> bool:
        """Wait (blocking, until `deadline`, monotonic) for the threads told to stop by
        `release`, then close the sockets. True when every thread is gone."""
        gone = True
        for link in getattr(self, "_closing", []):
            gone = link.join(deadline) and gone
        gone = self.receiver.join(max(0.0, deadline - time.monotonic())) and gone
        self._monitor_thread.join(max(0.0, deadline - time.monotonic()))
        gone = gone and not self._monitor_thread.is_alive()
        for source in self.sources():
            gone = source.join(deadline - time.monotonic()) and gone
        if self.recorder is not None:
            self.recorder.close()
        if gone:
            self.ctx.destroy(linger=0)
            self._closing = []
        return gone

    def closing_links(self) -> list[EngineLink]:
        return list(getattr(self, "_closing", []))

    def threads_alive(self) -> int:
        """Threads of this fleet still running (its links' and the monitor's)."""
        n = sum(link.alive() for link in getattr(self, "_closing", []))
        n += sum(link.alive() for link in self.links.values())
        n += sum(source.alive() for source in self.sources())
        return n + self._monitor_thread.is_alive() + self.receiver.alive()


def _health_of(link: EngineLink | None, healths: dict) -> dict:
    if link is None:
        return {"state": "recorded"}
    out = healths.get(id(link))
    if out is None:
        out = healths[id(link)] = link.health()
    return dict(out)


def _dynamo_row(row: dict, spec: EngineSpec) -> None:
    """A Dynamo engine's row: its blocks are one tokens_hash each to the index, so its block
    size is the configured one, and they are keyed by that hash."""
    row["configured_block_size"] = row["block_size"] = spec.block_size
    if row["keyed_by"] == "tokens":
        row["keyed_by"] = "tokens_hash"
    row["recompute_tokens"] = row["recompute_tokens"] * (spec.block_size or 1)


def _parts(events: list) -> list[list]:
    """A batch's events in parts of at most APPLY_PART_BLOCKS blocks. A longer event is split
    into pieces the index applies as the one event (a stored chain's later pieces hang under
    the last block of the piece before; `cont` marks them, so counters count the event once)."""
    parts, cur, blocks = [], [], 0
    for ev in events:
        for piece in _pieces(ev):
            n = 1 if piece.kind == "cleared" else len(piece.block_hashes) + 1
            if cur and blocks + n > APPLY_PART_BLOCKS:
                parts.append(cur)
                cur, blocks = [], 0
            cur.append(piece)
            blocks += n
    parts.append(cur)
    return parts


def _pieces(ev) -> list:
    if ev.kind == "cleared" or len(ev.block_hashes) <= APPLY_PART_BLOCKS:
        return [ev]
    hashes, step = ev.block_hashes, APPLY_PART_BLOCKS
    if ev.kind == "removed":
        return [Removed(hashes[i:i + step], ev.medium, cont=i > 0) for i in range(0, len(hashes), step)]
    tokens, bs = ev.token_ids, ev.block_size
    if tokens and not (bs and bs > 0 and len(tokens) == len(hashes) * bs):
        return [ev]  # malformed: the index refuses it whole
    return [Stored(hashes[i:i + step], ev.parent if i == 0 else hashes[i - 1],
                   tokens[i * bs:(i + step) * bs] if tokens else tokens, bs, ev.medium, ev.lora_id,
                   cont=i > 0) for i in range(0, len(hashes), step)]


def _trim_heap() -> None:
    """Give freed heap pages back to the system now (glibc keeps them otherwise)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _TaggedRecorder:
    """A recorder view that writes the engine's name as each record's topic."""

    def __init__(self, recorder: Recorder, engine: str) -> None:
        self._r, self._topic = recorder, engine.encode()

    def write(self, recv_ts: float, seq: int, topic: bytes, payload: bytes) -> None:
        self._r.write(recv_ts, seq, self._topic, payload)


def _engine_metrics(poller) -> dict | None:
    if poller is None:
        return None
    latest = poller.latest or {}
    return {"url": poller.url, "failing": poller.failing, "last_error": poller.last_error,
            "prefix_cache_queries": latest.get("prefix_queries"),
            "prefix_cache_hits": latest.get("prefix_hits"),
            "kv_usage": latest.get("kv_usage"), "hit_ratio": latest.get("hit_ratio"),
            "num_gpu_blocks": latest.get("num_gpu_blocks")}
