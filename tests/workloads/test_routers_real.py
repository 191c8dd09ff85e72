"""The lab's models against the real routers: sglang-router 0.3.2 and vllm-router 0.1.17 run as
subprocesses in front of real HTTP workers that hold every request open, fed traces one request
at a time; the worker that received each request must be the one the model picks in sequence
mode. cache_aware for both; vllm-router's kv_aware too, with the workers publishing the blocks
of each request they receive as KV events before the next request goes out."""

import gc
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pytest
from routing_util import agent_rows, trace_of

import workloads.routing.real as real_module
from allocator import InvalidRequest
from workloads.mooncake import load_mooncake
from workloads.routing import make_policy, run_sequence
from workloads.routing.policies import BLOCK_TOKENS, Policy, argmin_first
from workloads.routing.real import replay
from workloads.routing.real_prompts import FILLER, FIRST_CHAR, MAX_BLOCK_ID, block_text, prompt_blocks, prompt_text
from workloads.routing.real_router import (
    ROUTERS,
    RealRouter,
    RouterError,
    RouterKind,
    RouterUnavailable,
    _log_file,
    require,
    router_kind,
)
from workloads.routing.real_workers import MODEL_ID, HoldingWorkers
from workloads.routing.sequence import requests
from workloads.routing.sglang import VARIANTS, CacheAware
from workloads.routing.vllm_kv import credited_blocks

REQUESTS = 300  # of the bundled conversation trace
AGENT_REQUESTS = 600  # of the synthetic agent trace (enough for its hot prompt to unbalance)


class Recorder:
    def __init__(self, policy):
        self.policy, self.picks, self.rules = policy, [], []

    def route(self, req, cluster):
        r = self.policy.route(req, cluster)
        self.picks.append(r)
        self.rules.append(self.policy.rule)
        return r


@pytest.fixture(scope="module")
def traces():
    return {"mooncake": load_mooncake(None).head(REQUESTS),
            "agents": trace_of(agent_rows(2, AGENT_REQUESTS))}


def model_picks(trace, n, name):
    rec = Recorder(make_policy(name, n))
    run_sequence(trace, n, 1 << 40, rec)  # the capacity does not enter cache_aware's choices
    return rec


@pytest.mark.parametrize("trace_name", ["mooncake", "agents"])
@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_the_real_router_chooses_what_the_model_chooses(kind, n, trace_name, traces):
    trace = traces[trace_name]
    real = replay(trace, n, kind)
    assert real.version == ROUTERS[kind].tested
    assert len(real.picks) == len(trace)
    rec = model_picks(trace, n, ROUTERS[kind].model)
    same = sum(a == b for a, b in zip(rec.picks, real.picks))
    differ = [(i, rec.picks[i], real.picks[i], rec.rules[i])
              for i in range(len(trace)) if rec.picks[i] != real.picks[i]]
    assert same >= 0.99 * len(trace), (f"{kind} N={n} {trace_name}: {same}/{len(trace)} agree; "
                                       f"first (request, model, real, rule): {differ[:5]}")
    # the router's loads are the requests it routed to each worker: the model's load
    assert real.loads == [real.picks.count(w) for w in range(n)]
    # the cases exercise both branches of the match rule (and the agent trace the imbalance rule)
    rules = Counter(rule.split()[0] for rule in rec.rules)
    kinds = Counter("best" if "best match" in r else "imbalanced" if "imbalanced" in r else "low"
                    for r in rec.rules)
    assert kinds["best"] > 0 and kinds["low"] > 0, rules
    if trace_name == "agents":
        assert kinds["imbalanced"] > 0, kinds


def test_the_other_holder_rule_disagrees_with_each_router(traces):
    """The holder rules are what tell the routers apart: swapped, the model loses agreement."""
    trace = traces["mooncake"]
    for kind, wrong in (("sglang", "least_loaded"), ("vllm", "oldest")):
        real = replay(trace, 4, kind)
        policy = make_policy(ROUTERS[kind].model, 4)
        policy.holder = wrong
        rec = Recorder(policy)
        run_sequence(trace, 4, 1 << 40, rec)
        same = sum(a == b for a, b in zip(rec.picks, real.picks))
        assert same < 0.9 * len(trace), (kind, wrong, same)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_eviction_cuts_each_workers_share_of_the_tree(kind):
    """Worker 0 holds a 1-block prompt and a 1-token one, worker 1 a
    4-block one; the budget lies between their shares, so a per-worker cut evicts only worker
    1's, a cut of the whole tree evicts the oldest first, worker 0's. Once the router has
    evicted (nothing is sent meanwhile), the 1-block prompt's continuation shows which: it
    still matches (to worker 0) or no longer does (to the least-loaded worker 1). Both routers
    cut per worker, in their own units (the test's prompts: SGLang 1 character a token, vLLM 8)."""
    unit = 1 if kind == "sglang" else 8
    budget, interval = 525 * unit, 5
    rows = [(0, 512, 1, [0]), (0, 2048, 1, [10, 11, 12, 13]), (0, 1, 1, [30]),
            (interval * 1000, 1024, 1, [0, 1]), (interval * 1000, 2560, 1, [10, 11, 12, 13, 14])]
    trace = trace_of(rows)
    real = replay(trace, 2, kind, not_before_s={3: interval + 0.5},
                  args=("--eviction-interval-secs", str(interval), "--max-tree-size", str(budget)))
    # the continuations went out after the first eviction and before the second
    assert real.sent_s[3] > interval + real.ready_s and real.sent_s[-1] < 2 * interval
    want = {"per_worker": [0, 1, 0, 0, 1], "shared": [0, 1, 0, 1, 0]}
    name = ROUTERS[kind].model
    for eviction, picks in want.items():
        policy = CacheAware(2, name=name, **{**VARIANTS[name], "units_per_token": unit,
                                             "max_tree_size": budget,
                                             "eviction_interval_s": interval, "eviction": eviction})
        assert model_picks_of(policy, trace) == picks, eviction
    assert real.picks == want["per_worker"]


def model_picks_of(policy, trace):
    rec = Recorder(policy)
    run_sequence(trace, policy.n, 1 << 40, rec)
    return rec.picks


def test_instant_answers_put_everything_on_one_worker():
    """Without held requests every load is 0 at each decision: a cold request goes to the first
    worker, and the next turns follow it there."""
    with HoldingWorkers(3) as workers, RealRouter("sglang", workers.urls) as router:
        workers.release()
        for blocks in ([1, 2], [3], [1, 2, 4], [5, 6, 7]):
            body = json.dumps({"model": MODEL_ID, "max_tokens": 1,
                               "prompt": prompt_text(blocks, 512 * len(blocks))}).encode()
            req = urllib.request.Request(router.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                assert r.status == 200
        first = workers.urls.index(router.order[0])
        assert [a.worker for a in workers.arrivals] == [first] * 4


# -- vllm-router's kv_aware, on KV events -----------------------------------------------------
class KvRecorder(Recorder):
    """Also what the model credits as cached for its pick, and whether the pick holds the most
    of the prompt (`cache`) or less than another worker (`load`: the load outweighed it)."""

    def __init__(self, policy):
        super().__init__(policy)
        self.credited, self.kinds = [], []

    def route(self, req, cluster):
        r = super().route(req, cluster)
        matches = [credited_blocks(m, req.tokens) for m in cluster.matches(req)]
        self.credited.append(BLOCK_TOKENS * matches[r])
        self.kinds.append("load" if matches[r] < max(matches) else
                          "cache" if matches[r] > min(matches) else "even")
        return r


@pytest.fixture(scope="module")
def kv_replays(traces):
    """The real kv_aware's replay of a trace over N workers, once per module."""
    done = {}

    def get(trace_name, n):
        if (trace_name, n) not in done:
            done[trace_name, n] = replay(traces[trace_name], n, "vllm", policy="kv_aware")
        return done[trace_name, n]
    return get


@pytest.mark.parametrize("trace_name", ["mooncake", "agents"])
@pytest.mark.parametrize("n", [4, 8])
def test_the_real_kv_aware_chooses_what_its_model_chooses(n, trace_name, traces, kv_replays):
    trace = traces[trace_name]
    real = kv_replays(trace_name, n)
    assert real.version == ROUTERS["vllm"].tested and real.policy == "kv_aware"
    assert ROUTERS["vllm"].model_of("kv_aware") == "vllm_kv_aware"
    rec = KvRecorder(make_policy("vllm_kv_aware", n))
    run_sequence(trace, n, 1 << 40, rec)  # unbounded: the workers never remove a block
    differ = [(i, rec.picks[i], real.picks[i], rec.rules[i])
              for i in range(len(trace)) if rec.picks[i] != real.picks[i]]
    assert len(differ) <= 0.01 * len(trace), (f"kv_aware N={n} {trace_name}: {len(differ)} of "
                                              f"{len(trace)} differ; first (request, model, real, "
                                              f"rule): {differ[:5]}")
    # the tokens the router says it credited as cached (its debug log) are the model's
    assert len(real.credited) == len(trace)
    same_credit = sum(a == b for a, b in zip(rec.credited, real.credited))
    assert same_credit >= 0.99 * len(trace), (same_credit, len(trace))
    assert sum(real.credited) > 0
    assert real.loads == [real.picks.count(w) for w in range(n)]
    # both sides of the rule decided: a pick holding the most of the prompt, and a pick holding
    # less than another worker (the load outweighed the cache)
    kinds = Counter(rec.kinds)
    assert kinds["cache"] > 0 and kinds["load"] > 0, kinds


class Squared(Policy):
    """A rule that fits requests of one size but not the router: uncached tokens x (in flight +
    1)^2, without the pending work."""

    def route(self, req, cluster):
        costs = [(req.tokens - BLOCK_TOKENS * credited_blocks(m, req.tokens))
                 * (cluster.requests[r] + 1) ** 2 for r, m in enumerate(cluster.matches(req))]
        return argmin_first(costs)


class MostCached(Policy):
    """vllm-router's earlier kv_aware: the longest credited prefix, least loaded if none."""

    def route(self, req, cluster):
        m = [credited_blocks(x, req.tokens) for x in cluster.matches(req)]
        if max(m) == 0:
            return argmin_first(cluster.requests)
        return m.index(max(m))


def test_other_kv_rules_disagree_with_the_real_kv_aware(traces, kv_replays):
    """The pending work and the load factor are what the router does: without the pending work,
    or by cache alone, the model loses agreement."""
    real = kv_replays("mooncake", 4)
    for wrong in (Squared(4), MostCached(4)):
        rec = Recorder(wrong)
        run_sequence(traces["mooncake"], 4, 1 << 40, rec)
        same = sum(a == b for a, b in zip(rec.picks, real.picks))
        assert same < 0.9 * len(real.picks), (type(wrong).__name__, same)


def test_kv_aware_keys_blocks_by_its_block_size_flag(traces):
    """Told the default 16-token blocks while the workers publish 512-token ones, the router
    credits nothing (and logs no fallback): `--kv-event-block-size` must be the engines'."""
    trace = traces["mooncake"].head(40)
    real = replay(trace, 2, "vllm", policy="kv_aware", args=("--kv-event-block-size", "16"))
    rec = KvRecorder(make_policy("vllm_kv_aware", 2))
    run_sequence(trace, 2, 1 << 40, rec)
    assert sum(rec.credited) > 0 and real.credited == [0] * len(trace)


# -- the launcher ------------------------------------------------------------------------------
def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_router_lists_our_workers_in_its_order_and_leaves_no_process(kind):
    with HoldingWorkers(3) as workers:
        router = RealRouter(kind, workers.urls)
        with router:
            pid = router.proc.pid
            assert sorted(router.order) == sorted(workers.urls)
            listed = router.workers()
            assert [w["url"] for w in listed] == router.order
            assert all(w["is_healthy"] and w["load"] == 0 for w in listed)
        assert router.proc is None and _gone(pid)


class TakenFirst(RealRouter):
    """Offers ports that are taken (a listening socket of the test) before free ones."""

    def __init__(self, *args, taken, **kw):
        super().__init__(*args, **kw)
        self.offers = list(taken)
        self.tried = []

    def ports(self):
        pair = self.offers.pop(0) if self.offers else super().ports()
        self.tried.append(pair)
        return pair


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("which", ["router", "metrics"])
def test_a_port_taken_meanwhile_is_retried_on_fresh_ports(kind, which):
    with socket.socket() as blocker, HoldingWorkers(2) as workers:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        other = free.getsockname()[1]
        free.close()
        pair = (taken, other) if which == "router" else (other, taken)
        with TakenFirst(kind, workers.urls, taken=[pair]) as router:
            assert len(router.tried) == 2 and router.tried[0] == pair
            port = int(router.url.rsplit(":", 1)[1])
            assert taken not in router.tried[1] and port == router.tried[1][0]
            assert sorted(router.order) == sorted(workers.urls)


def test_a_port_taken_every_time_fails_in_one_error_and_leaves_no_process():
    with socket.socket() as blocker, HoldingWorkers(1) as workers:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        router = TakenFirst("sglang", workers.urls, taken=[(taken, taken)] * 2, attempts=2)
        with pytest.raises(RouterError, match="ports were taken at each of 2 attempts"):
            router.start()
        assert router.proc is None


def test_a_router_that_cannot_start_says_why():
    with HoldingWorkers(1) as workers:
        router = RealRouter("vllm", workers.urls, args=("--cache-threshold", "7"))
        with pytest.raises(RouterError, match="vllm router exited"):
            router.start()
        assert router.proc is None


def test_unknown_and_missing_routers_are_one_clear_line():
    with pytest.raises(InvalidRequest, match="unknown router 'nginx'; choose from sglang, vllm"):
        router_kind("nginx")
    missing = RouterKind("acme", "acme-router", "kvscope_no_such_router_module", "1.0", (), "x")
    with pytest.raises(RouterUnavailable) as exc:
        require(missing)
    line = str(exc.value)
    assert "\n" not in line and "acme-router" in line and "pip install 'kvscope[routers]'" in line


# -- the prompt encoding -----------------------------------------------------------------------
def test_prompts_encode_blocks_as_text_that_starts_with_a_character_of_its_own():
    trace = load_mooncake(None).head(200)
    seen = {}
    for req in requests(trace):
        text = prompt_text(req.blocks, req.tokens)
        assert len(text) == req.tokens and len(text.encode()) == 4 * req.tokens
        assert prompt_blocks(text) == req.blocks
        for k, b in enumerate(req.blocks):  # a block is the same text wherever it appears
            piece = text[512 * k:512 * (k + 1)]
            assert piece[0] == chr(FIRST_CHAR + b) and set(piece[1:]) <= {FILLER}
            assert seen.setdefault(b, piece) == piece or k == len(req.blocks) - 1
    assert block_text(MAX_BLOCK_ID, 2) == chr(0xFFFFF) + FILLER
    with pytest.raises(InvalidRequest, match="outside"):
        block_text(MAX_BLOCK_ID + 1, 1)
    with pytest.raises(InvalidRequest, match="do not fill"):
        prompt_text([1, 2], 512)


def test_the_router_log_loses_no_line_while_it_is_read():
    """`wait_log` and `log_tail` read the log while the router writes it: their reads must not
    move where the router writes (a descriptor shared with the child shares its offset), so
    every line is found and the log is exactly what was written."""
    lines = [f"line {i} end" for i in range(30_000)]
    router = RealRouter("sglang", [])
    router._log, writer = _log_file()
    try:
        router.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys, time\n"
             "for i in range(30000):\n"
             "    print(f'line {i} end', flush=True)\n"
             "    if i % 100 == 0: time.sleep(0.002)\n"
             "print('done', flush=True)\ntime.sleep(60)"],
            stdout=writer, start_new_session=True)
    finally:
        os.close(writer)
    try:
        deadline = time.monotonic() + 30
        while not router.log_tail(6).endswith("done\n") and time.monotonic() < deadline:
            time.sleep(0.001)  # the whole log read, over and over while the child writes
        marks = {f"line {i} ": lines[i] + " " for i in range(0, len(lines), 997)} | {"done": "done "}
        assert router.wait_log(set(marks), 30) == marks  # read on while the child writes
        assert router.log_tail(1 << 30) == "\n".join(lines) + "\ndone\n"
    finally:
        router.close()


def test_no_collection_pauses_a_replay(monkeypatch):
    """A pause of this process while the router waits on a worker's /tokenize changes vLLM's
    picks: no cyclic collection starts while the workers serve a replay (thousands of
    allocations each request, well past the collector's thresholds), and the collector is on
    again after."""
    started, serving = [], []

    class Workers(HoldingWorkers):  # the real workers, telling when they serve
        def __init__(self, *args, **kw):
            serving.append(True)
            super().__init__(*args, **kw)

        def close(self):
            super().close()
            serving.clear()

    def seen(phase, info):
        if phase == "start" and serving:
            started.append(info["generation"])

    monkeypatch.setattr(real_module, "HoldingWorkers", Workers)
    trace = trace_of(agent_rows(3, 40))
    assert gc.isenabled()
    gc.callbacks.append(seen)
    try:
        real = replay(trace, 2, "vllm")
    finally:
        gc.callbacks.remove(seen)
    assert len(real.picks) == len(trace) and not serving
    assert started == [] and gc.isenabled()
