"""`kvscope route --executor ray:ADDRESS` against a running Ray cluster started the way users
start one: `ray start --head`, then a second node with `ray start --address=...`, each in its
own processes and temp dir, with Ray's token authentication (what Ray 2.5x turns on for a head
when ~/.ray/auth_token exists). The head has no CPUs, so every task runs on the second node.
The sweep's rows equal the local executor's; a driver without the token is told so in one
line; and nothing of the cluster is left afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray_cluster import PORT_TAKEN, RayCluster
from routing_util import random_rows

ROOT = Path(__file__).resolve().parents[2]
POLICIES = "round_robin,dynamo_kv,sglang_cache_aware,llmd_precise"


def route(trace: Path, out: Path, executor: str, env: dict):
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "route", "--trace", str(trace), "--replicas", "2,3",
         "--capacity-tokens", "4096,20480", "--policies", POLICIES,
         "--executor", executor, "--out", str(out), "--no-png", "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture()
def trace_file(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                                        "hash_ids": ids}) + "\n"
                            for t, n, o, ids in random_rows(9, requests=120)))
    return path


def test_a_sweep_on_a_two_node_cluster_equals_the_local_executor_and_leaves_nothing(trace_file, tmp_path):
    root = Path(f"/tmp/kvrc-{os.getpid()}")  # short: Ray's unix sockets live under it
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    cluster = RayCluster(root)
    # the first port tried is taken (a listening socket of ours): the head gives it up for
    # another, as it must when a free port is taken between choosing and binding it
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    try:
        t0 = time.monotonic()
        cluster.start_head(ports=[taken_port])
        taken.close()
        assert cluster.port != taken_port and len(cluster.groups) == 2
        assert PORT_TAKEN in "".join(
            p.read_text(errors="replace") for p in (root / "head0").glob("session_*/logs/gcs_server.*"))
        cluster.add_node("node1", num_cpus=2)
        started = time.monotonic() - t0

        env = cluster.env()
        ray_out, local_out = tmp_path / "ray", tmp_path / "local"
        done = route(trace_file, ray_out, f"ray:{cluster.address}", env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "16 points routed in" in done.stdout and f"(ray:{cluster.address})" in done.stdout
        local = route(trace_file, local_out, "local", env)
        assert local.returncode == 0, local.stderr[-3000:]
        rows = json.loads((ray_out / "route_report.json").read_text())["results"]
        assert rows == json.loads((local_out / "route_report.json").read_text())["results"]
        assert len(rows) == 4 * 2 * 2 and all("pooled_bound_hit_ratio" in r for r in rows)
        # the tasks ran on the second node: the head has no CPU, its raylet started no worker
        assert list((root / "node1").glob("session_*/logs/worker-*.out"))
        assert not list((root / "head1").glob("session_*/logs/worker-*.out"))

        # a driver without the token: one line that says what to set, well before ray.init's
        # own 20 s of retries
        t1 = time.monotonic()
        refused = route(trace_file, tmp_path / "refused", f"ray:{cluster.address}",
                        cluster.env(RAY_AUTH_MODE="disabled", RAY_AUTH_TOKEN=""))
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            f"error: cannot join the Ray cluster at '{cluster.address}': it wants a token (Ray "
            "token authentication): set RAY_AUTH_MODE=token and give the cluster's token in "
            "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, as for `ray start "
            "--address`"]
        assert time.monotonic() - t1 < 15
        print(f"cluster up in {started:.1f} s (ray start: "
              f"{', '.join(f'{s:.1f}' for s in cluster.start_s)} s)")
    finally:
        taken.close()
        cluster.stop()
    deadline = time.monotonic() + 10
    while cluster.left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cluster.left() == []
    assert cluster.seen  # it did find the cluster's processes to stop
    shutil.rmtree(root, ignore_errors=True)
