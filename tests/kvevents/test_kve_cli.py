"""`kvscope mirror` against vLLM's own publisher (real uvicorn, real HTTP), its recording, and
`kvscope recording` summarising and playing it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from support.apputil import free_port
from support.kve_source import RefPrefixCache, to_engine
from test_real_publishers import wait_for

ROOT = Path(__file__).resolve().parents[2]


class Cli:
    """`python -m app.cli ARGS --port P` on a free P, once it answers /healthz. P is chosen before
    the server binds it: a start that fails on "address already in use" tries a fresh P."""

    def __init__(self, *args):
        for attempt in range(3):
            try:
                self._start(args)
                return
            except RuntimeError as exc:
                if attempt == 2 or "address already in use" not in str(exc).lower():
                    raise

    def _start(self, args) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "app.cli", *args, "--port", str(self.port)],
                                     cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        end = time.monotonic() + 60  # importing torch on a loaded machine takes a while
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(self.proc.stdout.read().decode(errors="replace"))
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def stats(self, pool):
        return httpx.get(f"{self.url}/api/pools/{pool}/stats", timeout=5).json()

    def stop(self) -> str:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=15)
        return out.decode(errors="replace")


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_mirror_command_records_and_the_recording_plays_back(ipc, vllm_kv, tmp_path):
    rec = tmp_path / "incident.kvevents"
    pub = vllm_kv.ZmqEventPublisher(0, endpoint=ipc("pub"), replay_endpoint=ipc("replay"), topic="kv")
    src = RefPrefixCache(seed=21)
    cli = Cli("mirror", ipc("pub"), "--replay-endpoint", ipc("replay"), "--topic", "kv",
              "--num-blocks", "64", "--record", str(rec))
    try:
        for _ in range(40):
            pub.publish(vllm_kv.KVEventBatch(ts=time.time(), events=to_engine(vllm_kv, src.step())))
        pub.publish(vllm_kv.KVEventBatch(ts=time.time(), events=[]))
        wait_for(lambda: (cli.stats("engine")["mirror"]["source"]["last_seq"] or 0) >= 40 or
                 pub.publish(vllm_kv.KVEventBatch(ts=time.time(), events=[])), timeout=60,
                 what="the mirror to catch up")
        m = cli.stats("engine")["mirror"]
        assert m["cached_blocks"] == len(src.cached) and m["source"]["lost_batches"] == 0
        assert m["source"]["recording"]["records"] >= 41
    finally:
        log = cli.stop()
        pub.shutdown()
    assert "Traceback" not in log, log
    assert "?pool=engine" in log
    r = run("recording", str(rec), "--num-blocks", "64")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["cached_blocks"] == len(src.cached)
    assert summary["gaps"] == 0 and summary["restarts"] == 0 and summary["errors"] == 0
    assert summary["forest"]["top_prefixes"]
    play = Cli("recording", str(rec), "--num-blocks", "64", "--serve")
    try:
        wait_for(lambda: play.stats("recording")["mirror"]["source"]["state"] == "done",
                 what="the playback to finish")
        assert play.stats("recording")["mirror"]["cached_blocks"] == len(src.cached)
    finally:
        assert "Traceback" not in play.stop()


def test_cli_refusals_are_one_line_exit_2(tmp_path):
    r = run("mirror", "tcp://127.0.0.1:5557")
    assert r.returncode == 2 and "--num-blocks" in r.stderr
    r = run("mirror", "tcp://127.0.0.1:5557", "--metrics-url", "http://127.0.0.1:9/metrics")
    assert r.returncode == 2 and "could not read http://127.0.0.1:9/metrics" in r.stderr
    assert "Traceback" not in r.stderr
    r = run("mirror", "http://nope", "--num-blocks", "8")
    assert r.returncode == 2 and "endpoint" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "x.kvevents"
    bad.write_bytes(b"not a recording")
    r = run("recording", str(bad))
    assert r.returncode == 2 and "not a kvscope recording" in r.stderr and "Traceback" not in r.stderr
    r = run("recording", str(tmp_path / "missing"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    # a KV-event recording is not given the pool history recordings' suffix
    r = run("mirror", "tcp://127.0.0.1:5557", "--num-blocks", "8", "--record", str(tmp_path / "x.kvrec"))
    assert r.returncode == 2 and ".kvrec is the suffix of pool history recordings" in r.stderr
    assert ".kvevents" in r.stderr and not (tmp_path / "x.kvrec").exists()


def test_serve_publish_default_pool(tmp_path):
    """`kvscope serve --publish`: the default pool is a prefix-caching pool that publishes its
    events; a publish endpoint that is not a ZeroMQ address is one line and exit 2."""
    for attempt in range(3):  # the publish port is chosen before the server binds it
        try:
            cli = Cli("serve", "--publish", f"tcp://*:{free_port()}", "--publish-topic", "kv")
            break
        except RuntimeError as exc:
            if attempt == 2 or "already in use" not in str(exc):
                raise
    try:
        assert cli.stats("default")["strategy"] == "paged"
    finally:
        assert "Traceback" not in cli.stop()
    r = run("serve", "--publish", "http://x")
    assert r.returncode == 2 and "--publish" in r.stderr


def test_prefix_publish_is_a_live_engine(tmp_path):
    """`kvscope prefix --trace F --publish E --speed X`: a router-side mirror ends with the set
    the same trace leaves on the same prefix-caching pool."""
    import random

    from allocator import create_pool
    from allocator.prefix.mirror import MirrorPool
    from kvevents.follow import follow
    from workloads import mooncake

    rng = random.Random(5)
    lines = []
    for i in range(14):
        n = rng.randint(1, 3) * 512
        stem = rng.choice([[1, 2], [1, 3], [7, 8]])
        ids = (stem + [rng.randrange(100, 10_000) for _ in range(4)])[: n // 512]
        lines.append(json.dumps({"timestamp": i * 150, "input_length": n, "output_length": 10,
                                 "hash_ids": ids}))
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    # The ports are chosen before `kvscope prefix` binds them (the mirror follows them first):
    # a run refused because another process took one meanwhile tries fresh ports.
    for attempt in range(3):
        port, replay = free_port(), free_port()
        mirror = MirrorPool(4096, name="router", device="cpu")
        sub = follow(mirror, f"tcp://127.0.0.1:{port}", topic="kv",
                     replay_endpoint=f"tcp://127.0.0.1:{replay}", replay_timeout=30)
        r = run("prefix", "--trace", str(trace), "--publish", f"tcp://*:{port}",
                "--publish-replay-endpoint", f"tcp://*:{replay}", "--publish-topic", "kv",
                "--speed", "1", "--capacity-tokens", "2048", "--tokens-per-block", "64")
        if r.returncode == 2 and "already in use" in r.stderr and attempt < 2:
            sub.stop()
            continue
        break
    try:
        assert r.returncode == 0, r.stderr
        counts = json.loads(r.stdout.strip().splitlines()[-1])
        assert counts["requests"] == 14 and counts["events"] > 0
        # The same trace on the same pool, here.
        pool = create_pool("paged", num_blocks=32, block_bytes=64, tokens_per_block=64, device="cpu",
                           prefix_caching={"policy": "lru"}, event_capacity=100_000)
        t = mooncake.load_mooncake(trace)
        for i in range(len(t)):
            hashes = t.block_hashes(i, 64)
            info = pool.open_sequence(block_hashes=hashes, num_tokens=len(hashes) * 64)
            pool.close_sequence(info.id)
        want: set[int] = set()
        for e in pool.events.after(0, 1_000_000):
            if e["type"] == "stored":
                want.update(e["block_hashes"])
            elif e["type"] == "removed":
                want.difference_update(e["block_hashes"])
        wait_for(lambda: mirror.cached_hashes() == want, what="the router-side mirror")
        assert sub.status()["lost_batches"] == 0
    finally:
        sub.stop()
