"""The vocabulary reaches every client: GET /api/meta, the stream's hello, and the page's options."""

from __future__ import annotations

import re

from allocator import vocab


def test_meta_is_the_vocabulary(client):
    r = client.get("/api/meta")
    assert r.status_code == 200
    assert r.json() == vocab.meta()


def test_hello_carries_the_vocabulary(client):
    with client.websocket_connect("/ws/pools/default") as ws:
        hello = ws.receive_json()
    assert hello["type"] == "hello" and hello["meta"] == vocab.meta()


def test_page_renders_every_option_from_the_vocabulary(client):
    html = client.get("/").text
    strategy = re.search(r'<select name="strategy">(.*?)</select>', html, re.S).group(1)
    assert re.findall(r'<option value="([^"]+)"', strategy) == list(vocab.STRATEGIES)
    policy = re.search(r'<select id="policy-select">(.*?)</select>', html, re.S).group(1)
    assert re.findall(r'<option value="([^"]+)"', policy) == [
        p for p, info in vocab.POLICY_INFO.items() if not info.needs_next_use]
    assert html.count("<option title=") >= 2 * len(vocab.SCENARIOS)  # dashboard and compare forms
    filters = re.search(r'id="event-filters">(.*?)</div>', html, re.S).group(1)
    assert re.findall(r'value="([^"]+)"', filters) == list(vocab.EVENT_GROUPS)


def test_a_created_pool_refuses_a_strategy_outside_the_vocabulary(client):
    r = client.post("/api/pools", json={"name": "x", "strategy": "buddy", "num_blocks": 4, "block_bytes": 64})
    assert r.status_code == 422
    assert all(s in r.text for s in vocab.STRATEGIES)
