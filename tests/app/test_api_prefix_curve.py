"""GET /api/prefix/curve: the bundled trace's capacity curve, shipped as package data, behind the token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocator import vocab
from workloads import prefix_curve_data
from workloads.prefix_curve_data import CurveDataError, curve_payload, validate


def by_policy(data: dict) -> dict[str, list[float]]:
    caps = data["capacities_tokens"]
    out = {p: [None] * len(caps) for p in data["policies"]}
    for pt in data["curve"]:
        out[pt["policy"]][caps.index(pt["capacity_tokens"])] = pt["hit_ratio"]
    return out


def test_curve_has_every_policy_at_every_capacity_and_lru_is_monotone(client):
    r = client.get("/api/prefix/curve")
    assert r.status_code == 200
    data = r.json()
    assert data["trace"]["source"] == "mooncake_conversation.jsonl"
    assert set(data["policies"]) == set(vocab.PREFIX_POLICIES) | {"belady"}
    caps = data["capacities_tokens"]
    assert caps == sorted(caps) and caps[0] == 10**5 and caps[-1] == 10**8
    lines = by_policy(data)
    assert all(None not in ys for ys in lines.values())
    assert len(data["curve"]) == len(caps) * len(data["policies"])
    lru = lines["lru"]
    assert all(a <= b for a, b in zip(lru, lru[1:])), lru
    assert lru[-1] > lru[0]
    top = data["max_hit_ratio"]
    assert 0.369 <= top <= 0.379  # computed independently of kvscope: 0.374
    for p, ys in lines.items():
        assert all(0 <= y <= top + 1e-9 for y in ys), p
        assert all(b >= y - 1e-9 for b, y in zip(lines["belady"], ys)), p  # MIN bounds every policy
    assert "Apache-2.0" in data["attribution"]


def test_curve_agrees_with_the_committed_report(client):
    """The shipped file is the drawable part of docs/report/prefix_report.json, not a copy that drifted."""

    report = json.loads((Path(__file__).resolve().parents[2] / "docs/report/prefix_report.json").read_text())
    assert client.get("/api/prefix/curve").json() == curve_payload(report)


def test_curve_needs_the_token(authed):
    r = authed.get("/api/prefix/curve")
    assert r.status_code == 401 and r.json()["error"]["code"]
    r = authed.get("/api/prefix/curve", headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 200 and r.json()["curve"]


def test_a_missing_or_broken_file_answers_503_with_what_to_do(client, tmp_path, monkeypatch):
    monkeypatch.setattr(prefix_curve_data, "BUNDLED_CURVE", tmp_path / "none.json")
    prefix_curve_data.load_bundled_curve.cache_clear()
    try:
        r = client.get("/api/prefix/curve")
        assert r.status_code == 503 and "bench_mooncake" in r.json()["error"]["message"]
        good = json.loads((Path(prefix_curve_data.__file__).parent / "reports/mooncake_prefix_curve.json").read_text())
        good["curve"] = good["curve"][1:]
        (tmp_path / "none.json").write_text(json.dumps(good))
        prefix_curve_data.load_bundled_curve.cache_clear()
        r = client.get("/api/prefix/curve")
        assert r.status_code == 503 and "one point per policy" in r.json()["error"]["message"]
    finally:
        prefix_curve_data.load_bundled_curve.cache_clear()


def test_write_then_load_round_trips(tmp_path, monkeypatch):
    report = {"trace": {"source": "t.jsonl", "requests": 2, "blocks": 9}, "tokens_per_block": 512,
              "definition": "d", "capacities_tokens": [10, 100], "policies": ["lru"], "max_hit_ratio": 0.5,
              "attribution": "a", "serving": {"big": True},
              "curve": [{"capacity_tokens": 10, "policy": "lru", "hit_ratio": 0.1, "hit_tokens": 3},
                        {"capacity_tokens": 100, "policy": "lru", "hit_ratio": 0.5, "hit_tokens": 9}]}
    path = prefix_curve_data.write_bundled_curve(report, tmp_path / "c.json")
    monkeypatch.setattr(prefix_curve_data, "BUNDLED_CURVE", path)
    prefix_curve_data.load_bundled_curve.cache_clear()
    try:
        data = prefix_curve_data.load_bundled_curve()
    finally:
        prefix_curve_data.load_bundled_curve.cache_clear()
    assert "serving" not in data and data["trace"] == {"source": "t.jsonl", "requests": 2}
    assert data["curve"][1] == {"capacity_tokens": 100, "policy": "lru", "hit_ratio": 0.5}


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(capacities_tokens=[100, 10]), "ascend"),
    (lambda d: d.update(max_hit_ratio=1.5), "max_hit_ratio"),
    (lambda d: d["curve"][0].update(hit_ratio=0.9), "out of range"),
    (lambda d: d.pop("policies"), "lacks"),
])
def test_validate_names_what_is_wrong(change, message):
    data = {"capacities_tokens": [10, 100], "policies": ["lru"], "max_hit_ratio": 0.5,
            "curve": [{"capacity_tokens": 10, "policy": "lru", "hit_ratio": 0.1},
                      {"capacity_tokens": 100, "policy": "lru", "hit_ratio": 0.5}]}
    validate(data)
    change(data)
    with pytest.raises(CurveDataError, match=message):
        validate(data)
