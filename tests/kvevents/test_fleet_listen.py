"""A listening fleet (llm-d's layout): kvscope binds one endpoint, vLLM's own ZmqEventPublisher
(from its wheel) connects to it from every pod with topic `kv@<pod>@<model>`, and each pod is
an engine of the fleet with its own sequencing, replay and restarts."""

from __future__ import annotations

import socket
import time

import pytest
import zmq
from support.kve_source import RefPrefixCache
from test_fleet_publishers import held_prefix
from test_real_publishers import DEADLINE, REPLAY_TIMEOUT, Engine, wait_for

from allocator.errors import InvalidRequest
from kvevents.fleet import Fleet
from kvevents.listen import ListenSpec, is_loopback_endpoint, loopback_endpoint, parse_topic


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pod(Engine):
    """vLLM's publisher on a pod: it connects to the listening endpoint (vLLM connects to any
    endpoint without a '*'), with llm-d's topic, and binds its own replay socket."""

    def __init__(self, mod, endpoint: str, topic: str, replay: str | None, seed: int = 0):
        self.mod, self.engine, self.seq = mod, "vllm", -1
        self.pub = mod.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay,
                                         buffer_steps=10_000, topic=topic)
        self.source = RefPrefixCache(seed=seed, hash_seed=1000 + seed)


def applied(fleet: Fleet, name: str) -> int:
    with fleet.lock:
        return fleet.index.engine_stats(name)["batches"] if name in fleet.index.engines else -1


def publish_until_applied(fleet: Fleet, pods: dict[str, Pod], steps: int) -> None:
    """Publish `steps` batches per pod, then wait until the fleet applied every one. A pod
    whose PUB has not finished connecting drops its first batches (ZeroMQ's slow joiner); an
    empty batch then shows the gap and the pod's replay socket fills it."""
    for _ in range(steps):
        for pod in pods.values():
            pod.send(pod.source.step())
    end = time.monotonic() + DEADLINE
    nudge = time.monotonic() + 0.5
    while any(applied(fleet, n) < p.seq + 1 for n, p in pods.items()):
        assert time.monotonic() < end, fleet.describe()["listen"]
        time.sleep(0.02)
        if time.monotonic() > nudge:
            for n, p in pods.items():
                if applied(fleet, n) < p.seq + 1:
                    p.send([])
            nudge = time.monotonic() + 0.5


@pytest.fixture
def listening(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    fleet = Fleet("llmd")
    fleet.listen(ListenSpec(endpoint=endpoint, replay=f"ipc://{tmp_path}/{{pod}}-replay.sock",
                            block_size=4, replay_timeout=REPLAY_TIMEOUT))
    yield fleet, endpoint, tmp_path
    fleet.close()


def test_two_vllm_pods_on_one_endpoint_are_two_engines_matched_by_tokens(listening, vllm_kv):
    fleet, endpoint, tmp = listening
    pods = {name: Pod(vllm_kv, endpoint, f"kv@{name}@m", f"ipc://{tmp}/{name}-replay.sock", seed=i)
            for i, name in enumerate(("pod-a", "pod-b"))}
    pods["pod-b"].source.prompts = pods["pod-a"].source.prompts  # the same system prompts
    try:
        for _ in range(4):
            publish_until_applied(fleet, pods, 6)
            with fleet.lock:
                assert fleet.index.check() == []
                for p in pods["pod-a"].source.prompts:
                    assert fleet.index.match(p) == {n: held_prefix(e.source, p) for n, e in pods.items()}
                for n, e in pods.items():
                    assert fleet.index.engine_stats(n)["cached_blocks"] == len(e.source.cached)
        with fleet.lock:
            out = fleet.describe()
        rows = {r["name"]: r for r in out["engines"]}
        assert set(rows) == {"pod-a", "pod-b"}
        for name, r in rows.items():
            assert r["model"] == "m" and r["server"] == name and r["endpoint"] == endpoint
            assert r["stream"]["state"] == "live" and r["stream"]["error_count"] == 0
            assert r["stream"]["lost_batches"] == 0 and not r["errors"]
        assert out["listen"]["pods"] == 2 and out["listen"]["bad_topics"] == 0
        assert out["listen"]["loopback"] and out["listen"]["errors"] == []
        assert out["stats"]["duplicated_blocks"] > 0  # the same prompts found on both pods
    finally:
        for p in pods.values():
            p.close()


def test_a_pod_joining_late_is_replayed_from_its_own_replay_socket(tmp_path, vllm_kv):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    # pod-b publishes before kvscope listens on its endpoint: those batches go nowhere
    early = Pod(vllm_kv, endpoint, "kv@pod-b@m", f"ipc://{tmp_path}/pod-b-replay.sock", seed=3)
    fleet = Fleet("late")
    try:
        for _ in range(5):
            early.send(early.source.step())
        time.sleep(0.3)  # its publisher thread sends them (to nobody)
        fleet.listen(ListenSpec(endpoint=endpoint, replay=f"ipc://{tmp_path}/{{pod}}-replay.sock",
                                block_size=4, replay_timeout=REPLAY_TIMEOUT))
        publish_until_applied(fleet, {"pod-b": early}, 1)
        with fleet.lock:
            assert fleet.index.engine_stats("pod-b")["cached_blocks"] == len(early.source.cached)
            sub = fleet.links["pod-b"].subscriber
        assert sub.replays >= 1 and sub.replayed_batches >= 5 and sub.lost_batches == 0
    finally:
        fleet.close()
        early.close()


def test_replay_answers_without_topic_frames_still_land_on_the_pod_asked(listening, vllm_kv):
    """vLLM's replay reply may drop the topic frame: the listener applies what a pod's replay
    socket answers to that pod, never to whatever topic the reply names."""
    fleet, endpoint, tmp = listening
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{tmp}/pod-c-replay.sock")
    pub = ctx.socket(zmq.PUB)
    pub.connect(endpoint)
    src = RefPrefixCache(seed=4, hash_seed=44)
    payloads = [vllm_kv.KVEventBatch(ts=time.time(), events=_to(vllm_kv, src.step())) for _ in range(4)]
    enc = [__import__("msgspec").msgpack.encode(b) for b in payloads]
    try:
        wait_for(lambda: fleet.listener.accepted >= 1, what="the pod's connection")
        time.sleep(0.3)
        pub.send_multipart((b"kv@pod-c@m", (3).to_bytes(8, "big"), enc[3]))  # 0..2 missed
        assert router.poll(int(DEADLINE * 1000)), "no replay request"
        ident, _, start = router.recv_multipart()
        assert int.from_bytes(start, "big") == 0
        for seq in range(3):  # [seq, payload] and an empty topic: no pod named
            frames = [b"", seq.to_bytes(8, "big"), enc[seq]] if seq % 2 else [seq.to_bytes(8, "big"), enc[seq]]
            router.send_multipart([ident, b"", *frames])
        router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        wait_for(lambda: applied(fleet, "pod-c") == 4, what="the replayed batches")
        with fleet.lock:
            assert fleet.index.engine_stats("pod-c")["cached_blocks"] == len(src.cached)
        assert fleet.links["pod-c"].subscriber.replayed_batches == 3
    finally:
        pub.close(0)
        router.close(0)


def _to(mod, events):
    from support.kve_source import to_engine

    return to_engine(mod, events, "vllm")


def test_a_pod_restart_clears_that_pod_only(listening, vllm_kv):
    fleet, endpoint, tmp = listening
    pods = {n: Pod(vllm_kv, endpoint, f"kv@{n}@m", f"ipc://{tmp}/{n}-replay.sock", seed=i)
            for i, n in enumerate(("pod-a", "pod-b"))}
    try:
        publish_until_applied(fleet, pods, 5)
        with fleet.lock:
            b_before = fleet.index.engine_stats("pod-b")["cached_blocks"]
        pods["pod-a"].close()
        accepted = fleet.listener.accepted
        fresh = Pod(vllm_kv, endpoint, "kv@pod-a@m", f"ipc://{tmp}/pod-a-replay.sock", seed=9)
        pods["pod-a"] = fresh  # seq 0 again on the same topic: pod-a restarted
        # a restart shows as the seq going back: the fresh pod's first batches must arrive
        # (vLLM's numbering gives no other sign), so it publishes once its PUB has joined
        wait_for(lambda: fleet.listener.accepted > accepted, what="the fresh pod's connection")
        time.sleep(0.5)
        publish_until_applied(fleet, {"pod-a": fresh}, 2)
        wait_for(lambda: fleet.links["pod-a"].subscriber.restarts == 1, what="the restart")
        wait_for(lambda: fleet.index.engine_stats("pod-a")["cached_blocks"] == len(fresh.source.cached),
                 what="pod-a's blocks after its restart")
        with fleet.lock:
            assert fleet.index.engine_stats("pod-b")["cached_blocks"] == b_before
            assert fleet.index.check() == []
    finally:
        for p in pods.values():
            p.close()


def test_bad_topics_are_counted_on_the_fleet_and_never_an_engine(listening):
    fleet, endpoint, _ = listening
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.connect(endpoint)
    try:
        wait_for(lambda: fleet.listener.accepted >= 1, what="the connection")
        time.sleep(0.3)
        bad = [b"kv@onlypod", b"kv@@m", b"kv@pod a@m", b"kv@" + b"p" * 70 + b"@m", b"kv@pod@",
               b"kv@\xff\xfe@m"]
        for t in bad:
            pub.send_multipart((t, (0).to_bytes(8, "big"), b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x90\x00"))
        pub.send_multipart((b"kv@pod-x@m", b"short"))  # two frames
        wait_for(lambda: fleet.listener.bad_topics == len(bad) and fleet.listener.frame_errors == 1,
                 what="the bad topics counted")
        with fleet.lock:
            out = fleet.describe()
        assert out["engines"] == [] and out["listen"]["pods"] == 0
        assert len(out["listen"]["bad_topic_examples"]) == len(bad)
        assert any("kv@<pod>@<model>" in e for e in out["listen"]["errors"])
    finally:
        pub.close(0)


def test_pods_past_the_fleet_limit_are_refused_and_nothing_of_them_indexed(tmp_path, vllm_kv):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    fleet = Fleet("small", max_engines=2)
    fleet.listen(ListenSpec(endpoint=endpoint, block_size=4))
    pods = {n: Pod(vllm_kv, endpoint, f"kv@{n}@m", None, seed=i)
            for i, n in enumerate(("pod-a", "pod-b", "pod-c"))}
    try:
        end = time.monotonic() + DEADLINE
        while fleet.listener.refused_pod_count < 1 or len(fleet.index.engines) < 2:
            assert time.monotonic() < end, fleet.describe()["listen"]
            for p in pods.values():
                p.send(p.source.step())
            time.sleep(0.1)
        with fleet.lock:
            out = fleet.describe()
        assert len(out["engines"]) == 2
        refused = set(pods) - {r["name"] for r in out["engines"]}
        assert out["listen"]["refused_pod_names"] == sorted(refused) and out["listen"]["refused_pods"] == 1
        assert out["listen"]["refused_batches"] >= 1
        assert any("1 pods refused" in e and "at most 2 engines" in e for e in out["listen"]["errors"])
        assert out["stats"]["engines"] == 2 and fleet.listener.pods.keys() == {
            f"kv@{r['name']}@m".encode() for r in out["engines"]}
    finally:
        fleet.close()
        for p in pods.values():
            p.close()


def test_several_models_on_one_pod_are_several_engines(listening):
    fleet, endpoint, _ = listening
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.connect(endpoint)
    try:
        wait_for(lambda: fleet.listener.accepted >= 1, what="the connection")
        time.sleep(0.3)
        empty = b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x90\x00"
        for topic in (b"kv@pod-a@llama", b"kv@pod-a@org/qwen 7b"):
            pub.send_multipart((topic, (0).to_bytes(8, "big"), empty))
        wait_for(lambda: len(fleet.index.engines) == 2, what="two engines")
        with fleet.lock:
            rows = {r["name"]: r for r in fleet.engines()}
        assert rows["pod-a"]["model"] == "llama"
        assert rows["pod-a@org_qwen_7b"]["model"] == "org/qwen 7b"
        assert rows["pod-a@org_qwen_7b"]["server"] == "pod-a"
    finally:
        pub.close(0)


def test_an_endpoint_in_use_is_refused_and_binding_is_loopback_unless_named():
    port = free_port()
    first = Fleet("one")
    try:
        first.listen(ListenSpec(endpoint=f"tcp://127.0.0.1:{port}"))
        second = Fleet("two")
        try:
            with pytest.raises(InvalidRequest, match="cannot listen"):
                second.listen(ListenSpec(endpoint=f"tcp://127.0.0.1:{port}"))
        finally:
            second.close()
    finally:
        first.close()
    assert loopback_endpoint("5557") == loopback_endpoint(":5557") == "tcp://127.0.0.1:5557"
    assert loopback_endpoint("tcp://0.0.0.0:5557") == "tcp://0.0.0.0:5557"
    assert is_loopback_endpoint("tcp://127.0.0.1:1") and is_loopback_endpoint("tcp://localhost:1")
    assert is_loopback_endpoint("tcp://[::1]:1")
    assert not is_loopback_endpoint("tcp://*:5557") and not is_loopback_endpoint("tcp://0.0.0.0:1")
    assert not is_loopback_endpoint("tcp://eth0:5557")


@pytest.mark.parametrize(("topic", "want"), [
    (b"kv@pod-a@m", ("pod-a", "m")),
    (b"kv@vllm-0.x_y@meta-llama/Llama-3.1-8B@v2", ("vllm-0.x_y", "meta-llama/Llama-3.1-8B@v2")),
])
def test_topics_parse_as_llm_d_writes_them(topic, want):
    assert parse_topic(topic) == want


@pytest.mark.parametrize("topic", [b"kv", b"kv@pod", b"kv@@m", b"kv@-pod@m", b"kv@a:b@m",
                                   b"kv@pod@", b"kv@pod@\x00", b"kv@" + b"x" * 600])
def test_topics_that_do_not_parse_say_why(topic):
    with pytest.raises(ValueError):
        parse_topic(topic)


# -- over REST and the command line --------------------------------------------------------------
def test_listening_fleet_over_rest_matches_each_pod_and_forgets_a_removed_one(tmp_path, vllm_kv):
    from support.apputil import make_client

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with make_client() as client:
        r = client.post("/api/fleets", json={"name": "llmd", "listen": {
            "endpoint": endpoint, "replay_endpoint": f"ipc://{tmp_path}/{{pod}}-replay.sock",
            "block_size": 4}})
        assert r.status_code == 201, r.text
        assert r.json()["listen"]["endpoint"] == endpoint and r.json()["engines"] == []
        pods = {n: Pod(vllm_kv, endpoint, f"kv@{n}@m", f"ipc://{tmp_path}/{n}-replay.sock", seed=i)
                for i, n in enumerate(("pod-a", "pod-b"))}
        try:
            for _ in range(6):
                for p in pods.values():
                    p.send(p.source.step())

            def caught_up() -> bool:
                rows = {e["name"]: e for e in client.get("/api/fleets/llmd").json()["engines"]}
                if set(rows) != set(pods):
                    for p in pods.values():
                        p.send([])
                    time.sleep(0.1)
                    return False
                return all(rows[n]["batches"] >= p.seq + 1 for n, p in pods.items())

            wait_for(caught_up, what="both pods applied")
            for prompt in pods["pod-a"].source.prompts:
                got = client.post("/api/fleets/llmd/match", json={"tokens": prompt}).json()["engines"]
                assert got == {n: held_prefix(p.source, prompt) for n, p in pods.items()}
            assert client.get("/api/fleets").json()["fleets"][0]["listen"] == endpoint
            assert client.delete("/api/fleets/llmd/engines/pod-b").status_code == 204
            assert [e["name"] for e in client.get("/api/fleets/llmd").json()["engines"]] == ["pod-a"]

            def back() -> bool:
                pods["pod-b"].send(pods["pod-b"].source.step())
                time.sleep(0.1)
                return "pod-b" in {e["name"] for e in client.get("/api/fleets/llmd").json()["engines"]}

            wait_for(back, what="pod-b back when it publishes again")
        finally:
            for p in pods.values():
                p.close()
        assert client.delete("/api/fleets/llmd").status_code == 204


def test_listening_fleet_bad_requests_are_4xx():
    from support.apputil import assert_error, make_client

    port = free_port()
    with make_client() as client:
        for body in ({"name": "x", "listen": None, "nats": 1}, {"name": "x", "listen": {"endpoint": "ipc:///tmp/x.sock"}},
                     {"name": "x", "listen": {"endpoint": "tcp://127.0.0.1:99999"}},
                     {"name": "x", "listen": {"endpoint": f"tcp://127.0.0.1:{port}", "nope": 1}},
                     {"name": "x", "listen": {}, "max_engines": 0}):
            assert_error(client.post("/api/fleets", json=body), 422, "invalid_request")
        ok = client.post("/api/fleets", json={"name": "a", "listen": {"endpoint": f"tcp://127.0.0.1:{port}"}})
        assert ok.status_code == 201, ok.text
        r = client.post("/api/fleets", json={"name": "b", "listen": {"endpoint": f"tcp://127.0.0.1:{port}"}})
        assert r.status_code == 422 and "cannot listen" in r.text
        assert "b" not in {f["name"] for f in client.get("/api/fleets").json()["fleets"]}


def test_fleet_command_listens_on_loopback_for_a_bare_port(vllm_kv):
    import httpx
    from test_kve_cli import Cli

    port = free_port()
    cli = Cli("fleet", "--listen", str(port), "--block-size", "4")
    pod = Pod(vllm_kv, f"tcp://127.0.0.1:{port}", "kv@pod-a@m", None)
    try:
        state = httpx.get(f"{cli.url}/api/fleets/fleet", timeout=5).json()
        assert state["listen"]["endpoint"] == f"tcp://127.0.0.1:{port}" and state["listen"]["loopback"]

        def seen() -> bool:
            pod.send(pod.source.step())
            time.sleep(0.1)
            rows = httpx.get(f"{cli.url}/api/fleets/fleet", timeout=5).json()["engines"]
            return [r["name"] for r in rows] == ["pod-a"]

        wait_for(seen, what="the pod as an engine")
    finally:
        pod.close()
        log = cli.stop()
    assert "Traceback" not in log, log


@pytest.mark.parametrize(("args", "says"), [
    (["--listen", "ipc:///tmp/x"], "--listen"),
    (["--pod-replay-endpoint", "tcp://{pod}:1", "tcp://h:1"], "needs --listen"),
])
def test_fleet_command_refuses_bad_listen_arguments(args, says, capsys):
    from app.cli import main

    with pytest.raises(SystemExit) as info:
        main(["fleet", *args])
    assert info.value.code == 2
    assert says in capsys.readouterr().err
