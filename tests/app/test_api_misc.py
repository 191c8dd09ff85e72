"""Health, metrics, the page, unknown routes, the CLI and the settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.apputil import assert_error, make_client

from app import cli
from app.settings import Settings, get_settings

ROOT = Path(__file__).resolve().parents[2]  # the repository (conftest modules share one name)


def test_healthz(client):
    body = client.get("/healthz").json()
    assert body["ok"] is True and len(body["instance_id"]) == 16 and body["started_at"] > 1.7e9


def test_metrics_read_pool_state_at_scrape_time(client):
    client.post("/api/pools/default/allocations", json={"bytes": 10 * 4096})
    client.put("/api/pools/default/entries/a", json={"bytes": 4096})
    client.get("/api/pools/default/entries/a")
    client.get("/api/pools/default/entries/b")
    client.post("/api/pools/default/allocations", json={"bytes": 250 * 4096})
    text = client.get("/metrics").text

    def value(pattern: str) -> float:
        m = re.search(re.escape(pattern) + r" ([0-9.e+-]+)", text)
        assert m, pattern
        return float(m.group(1))

    assert value('kvscope_blocks{pool="default",state="used"}') == 10
    assert value('kvscope_blocks{pool="default",state="cached"}') == 1
    assert value('kvscope_utilization{pool="default"}') == pytest.approx(11 / 256)
    assert 'kvscope_internal_fragmentation{pool="default"}' in text
    assert 'kvscope_external_fragmentation{pool="default"}' in text
    assert 'kvscope_largest_free_bytes{pool="default"}' in text
    assert value('kvscope_ooms_total{cause="capacity",pool="default"}') == 1
    assert value('kvscope_cache_hits_total{pool="default"}') == 1
    assert value('kvscope_cache_misses_total{pool="default"}') == 1
    assert 'kvscope_evictions_total{pool="default",reason="capacity"}' in text
    assert re.search(r'kvscope_request_duration_seconds_count\{method="POST",'
                     r'route="/api/pools/\{pool\}/allocations",status="201"\} 1', text)


def test_unknown_route_and_method_use_the_error_shape(client):
    assert_error(client.get("/api/nothing"), 404, "not_found")
    assert_error(client.patch("/api/pools"), 405, "method_not_allowed")


@pytest.mark.parametrize("body,reason", [
    ("[" * 100_000, "nested too deeply"),
    ('{"bytes": ' + "9" * 5000 + "}", "too many digits"),
])
def test_unparsable_json_is_422_on_the_body_field_not_400(client, body, reason):
    r = client.post("/api/pools/default/allocations", content=body, headers={"content-type": "application/json"})
    err = assert_error(r, 422, "invalid_request")
    assert err["details"]["field"] == "body" and reason in err["message"]


@pytest.mark.parametrize("body,pos", [('{"bytes": 1', 11), ('{"bytes": 1}x', 12), ("{,}", 1)])
def test_malformed_json_names_the_body_field_with_the_position_in_the_message(client, body, pos):
    r = client.post("/api/pools/default/ops", content=body, headers={"content-type": "application/json"})
    err = assert_error(r, 422, "invalid_request")
    assert err["details"]["field"] == "body"
    assert [e["field"] for e in err["details"]["errors"]] == ["body"]
    assert err["message"].startswith(f"body: JSON decode error at position {pos}: ")


def test_page_renders(client):
    r = client.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert 'data-protocol="1"' in r.text


def test_docs_page_loads_swagger_ui_from_the_server_not_a_cdn(client):
    r = client.get("/docs")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    urls = re.findall(r'(?:src|href)="([^"]*)"', r.text)
    assert urls and not [u for u in urls if re.match(r"(https?:)?//", u)], urls
    assert "http://" not in r.text and "https://" not in r.text
    for url in urls:
        if url.startswith("/"):
            assert client.get(url).status_code == 200, url
    assert (ROOT / "static/vendor/swagger-ui/LICENSE").is_file()
    assert_error(client.get("/redoc"), 404, "not_found")


def chunks(total: int):
    """A batch of about `total` bytes as a generator, which httpx sends chunked (no
    Content-Length): the cap must count it as it arrives."""
    op = b'{"op": "get", "key": "a"},'
    yield b'{"ops": ['
    for _ in range(total // len(op)):
        yield op
    yield b'{"op": "get", "key": "a"}]}'


def test_chunked_body_over_the_cap_is_413_not_422():
    with make_client(max_body=4096) as c:
        before = c.get("/api/pools/default/stats").json()["cache"]
        r = c.post("/api/pools/default/ops", content=chunks(8192), headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers
        err = assert_error(r, 413, "too_large")
        assert err["details"]["max_bytes"] == 4096
        assert c.get("/api/pools/default/stats").json()["cache"] == before
        small = c.post("/api/pools/default/ops", content=chunks(512), headers={"content-type": "application/json"})
        assert small.status_code == 200, small.text


def test_stats_has_a_response_model_and_omits_cache_when_none(client):
    spec = client.get("/openapi.json").json()
    schema = spec["paths"]["/api/pools/{pool}/stats"]["get"]["responses"]["200"]["content"]["application/json"]
    assert schema["schema"]["$ref"].endswith("/StatsOut")
    client.post("/api/pools", json={"name": "raw", "num_blocks": 8, "block_bytes": 64})
    assert "cache" not in client.get("/api/pools/raw/stats").json()
    assert client.get("/api/pools/default/stats").json()["cache"]["policy"] == "lru"


def test_openapi_has_examples(client):
    spec = client.get("/openapi.json").json()
    assert "/api/pools/{pool}/ops" in spec["paths"]
    schemas = spec["components"]["schemas"]
    assert schemas["BatchIn"]["examples"] and schemas["PoolCreate"]["examples"]


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("KVSCOPE_PORT", "9001")
    monkeypatch.setenv("KVSCOPE_TOKEN", "t")
    monkeypatch.setenv("KVSCOPE_MAX_BATCH", "5")
    s = Settings.from_env()
    assert (s.port, s.token, s.max_batch, s.host) == (9001, "t", 5, "127.0.0.1")
    assert get_settings() is get_settings()


def test_default_pool_size_is_configurable():
    with make_client(default_blocks=100) as c:
        assert c.get("/api/pools/default").json()["config"]["num_blocks"] == 100


def test_cli_dispatches_to_the_workloads_cli(monkeypatch):
    import sys
    import types

    calls = []
    fake = types.ModuleType("workloads.cli")
    fake.replay_main = lambda argv: calls.append(("replay", argv)) or 0
    fake.scenario_main = lambda argv: calls.append(("scenario", argv)) or 0
    fake.prefix_main = lambda argv: calls.append(("prefix", argv)) or 0
    monkeypatch.setitem(sys.modules, "workloads.cli", fake)
    import workloads

    monkeypatch.setattr(workloads, "cli", fake, raising=False)
    assert cli.main(["replay", "--limit", "5"]) == 0
    assert cli.main(["scenario", "chat"]) == 0
    assert cli.main(["prefix", "--quiet"]) == 0
    assert calls == [("replay", ["--limit", "5"]), ("scenario", ["chat"]), ("prefix", ["--quiet"])]
    assert cli.main(["bogus"]) == 2
    assert cli.main(["--help"]) == 0


@pytest.mark.parametrize("name,value,says", [
    ("KVSCOPE_PORT", "abc", "KVSCOPE_PORT must be an integer, got 'abc'"),
    ("KVSCOPE_PORT", "70000", "KVSCOPE_PORT must be from 0 to 65535, got 70000"),
    ("KVSCOPE_MAX_BODY", "-1", "KVSCOPE_MAX_BODY must be at least 0, got -1"),
    ("KVSCOPE_DEFAULT_BLOCK_BYTES", "0", "KVSCOPE_DEFAULT_BLOCK_BYTES must be at least 1, got 0"),
    ("KVSCOPE_MAX_POOLS", "0", "KVSCOPE_MAX_POOLS must be at least 1, got 0"),
    ("KVSCOPE_DEVICE", "tpu", "KVSCOPE_DEVICE must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    ("KVSCOPE_DEFAULT_BLOCK_BYTES", str(1 << 30),
     f"the default pool's 4096 x {1 << 30} bytes exceed KVSCOPE_MAX_POOL_BYTES={2 << 30} "
     "(set KVSCOPE_DEFAULT_BLOCKS or KVSCOPE_DEFAULT_BLOCK_BYTES)"),
    ("KVSCOPE_MAX_TOTAL_BYTES", "1000",
     "the default pool's 4096 x 4096 bytes exceed the server's total of 1000 bytes (KVSCOPE_MAX_TOTAL_BYTES)"),
    ("KVSCOPE_MAX_STREAM_CLIENTS", "0", "KVSCOPE_MAX_STREAM_CLIENTS must be at least 1, got 0"),
    ("KVSCOPE_STREAM_STALL_MS", "5", "KVSCOPE_STREAM_STALL_MS must be at least 100, got 5"),
])
def test_serve_with_a_bad_env_value_says_which_and_exits_2(monkeypatch, capsys, name, value, says):
    import uvicorn

    def never(*args, **kwargs):
        raise AssertionError("serve must exit before starting the server")

    monkeypatch.setattr(uvicorn, "run", never)
    monkeypatch.setenv("KVSCOPE_DEFAULT_BLOCKS", "4096")  # the same default pool on any host
    monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        assert cli.main(["serve"]) == 2
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert err == f"kvscope serve: {says}\n"


@pytest.mark.parametrize("device,says", [
    ("tpu", "--device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    ("cuda:99", "--device: device 'cuda:99' requested; CUDA devices here: "),
])
def test_serve_with_a_bad_device_says_so_and_exits_2(monkeypatch, capsys, device, says):
    import uvicorn

    def never(*args, **kwargs):
        raise AssertionError("serve must exit before starting the server")

    monkeypatch.setattr(uvicorn, "run", never)
    monkeypatch.delenv("KVSCOPE_DEVICE", raising=False)
    get_settings.cache_clear()
    try:
        assert cli.main(["serve", "--device", device]) == 2
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert err.startswith(f"kvscope serve: {says}") and err.count("\n") == 1, err


def test_make_run_honours_kvscope_host_and_port():
    import os
    import subprocess

    clean = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "KVSCOPE_HOST", "KVSCOPE_PORT")}

    def run_line(env: dict, *args: str) -> str:
        out = subprocess.run(["make", "-n", "-s", "run", *args], cwd=ROOT, capture_output=True, text=True,
                             env=clean | env)
        return out.stdout.strip().splitlines()[-1]

    assert run_line({}).endswith("serve --host 127.0.0.1 --port 8000")
    assert run_line({"KVSCOPE_HOST": "0.0.0.0", "KVSCOPE_PORT": "9123"}).endswith("--host 0.0.0.0 --port 9123")
    assert run_line({"KVSCOPE_PORT": "9123"}, "PORT=9000").endswith("--port 9000")


def test_registry_find_is_none_for_an_unknown_pool(client):
    registry = client.app.state.services.registry
    assert registry.find("nope") is None and registry.find("default").name == "default"


def test_api_doc_rest_block_names_every_api_route(client):
    """Each method and path under /api appears on one line of docs/API.md's REST block, or of a
    REST block of a feature's own page in docs/ (a line may list siblings as `parent/a | b`)."""
    fenced = r"^```\w*\n(.*?)^```"
    text = (ROOT / "docs" / "API.md").read_text()
    block = next(b for b in re.findall(fenced, text, flags=re.S | re.M)
                 if "/api/pools/{pool}/ops" in b)
    for doc in sorted((ROOT / "docs").glob("*.md")):
        block += "\n" + "\n".join(b for b in re.findall(fenced, doc.read_text(), flags=re.S | re.M)
                                  if re.search(r"^(GET|POST|PUT|DELETE)\s+/api/", b, flags=re.M))
    missing = []
    for path, ops in client.get("/openapi.json").json()["paths"].items():
        if not path.startswith("/api"):
            continue
        parent, leaf = path.rsplit("/", 1)
        for method in (m.upper() for m in ops):
            if not any(re.search(rf"\b{method}\b", line)
                       and (re.search(re.escape(path) + r"(\s|$)", line)
                            or f"{parent}/" in line and f"| {leaf}" in line)
                       for line in block.splitlines()):
                missing.append(f"{method} {path}")
    assert not missing, missing


def test_invented_http_methods_and_paths_do_not_grow_the_metrics():
    """/metrics labels take a bounded set of values: a method outside HTTP's is `other`, a path
    no route matches is `unmatched`, whatever a client sends (here over real HTTP): a second
    round of 300 new methods and paths adds no line to /metrics."""
    import httpx
    from support.apputil import SMALL, LiveApp

    from app.main import create_app
    from app.settings import Settings

    def invent(http, first: int) -> None:
        for i in range(first, first + 300):
            path = "/api/pools" if i % 2 else f"/api/no-such-{i}"
            r = http.request(f"M{i:05d}", path)
            assert r.status_code in (404, 405), (r.status_code, r.text)
            assert http.get(f"/api/elsewhere/{i}").status_code == 404

    with LiveApp(create_app(Settings(**SMALL))) as live, httpx.Client(base_url=live.url,
                                                                      timeout=10) as http:
        http.get("/metrics")  # its own series, there from the first scrape on
        invent(http, 0)
        once = http.get("/metrics").text
        invent(http, 300)
        text = http.get("/metrics").text
    assert len(text.splitlines()) == len(once.splitlines()), (len(once), len(text))
    series = re.findall(r'kvscope_request_duration_seconds_count\{method="([^"]*)",'
                        r'route="([^"]*)",status="([^"]*)"\} ([0-9.e+]+)', text)
    methods = {m for m, _, _, _ in series}
    assert methods == {"GET", "other"}, methods
    assert sum(float(n) for m, _, _, n in series if m == "other") == 600
    assert {r for _, r, _, _ in series} == {"/api/pools", "unmatched", "/metrics"}, series
    assert {s for _, _, s, _ in series} == {"200", "404", "405"}, series
