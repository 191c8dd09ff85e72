"""An engine's /metrics read the way vLLM 0.33 and SGLang export them, over real HTTP."""

from __future__ import annotations

import pytest
from kve_metrics_http import metrics_server

from kvevents.engine_metrics import MetricsError, MetricsPoller, num_gpu_blocks, parse, summarize

VLLM = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="27162",prefix_caching_hash_algo="sha256"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.125
vllm:prefix_cache_queries_total{engine="0",model_name="m"} %s
vllm:prefix_cache_hits_total{engine="0",model_name="m"} %s
"""


class Body:
    text = VLLM % (100, 40)
    status = 200


@pytest.fixture
def url():
    with metrics_server(lambda: (Body.status, Body.text)) as u:
        yield u
    Body.text, Body.status = VLLM % (100, 40), 200


def test_vllm_metrics(url):
    assert num_gpu_blocks(url) == 27162
    s = summarize(parse(VLLM % (10, 5)))
    assert (s["block_size"], s["kv_usage"], s["prefix_queries"], s["prefix_hits"]) == (16, 0.125, 10, 5)


def test_sglang_metrics_have_no_block_count():
    s = summarize(parse('sglang:token_usage{model_name="m"} 0.5\nsglang:cache_hit_rate{model_name="m"} 0.7\n'))
    assert s["kv_usage"] == 0.5 and s["hit_rate"] == 0.7 and s["num_gpu_blocks"] is None


def test_poller_hit_ratio_over_the_interval_and_recovery(url):
    p = MetricsPoller(url)
    p.poll_once()
    Body.text = VLLM % (300, 190)  # 200 more queries, 150 more hits
    p.poll_once()
    assert p.latest["hit_ratio"] == pytest.approx(0.75)
    Body.status = 500
    p.poll_once()
    st = p.status()
    assert st["failing"] and st["errors"] == 1 and "500" in st["last_error"]
    assert st["latest"]["hit_ratio"] == pytest.approx(0.75)  # the last good reading stays
    Body.status = 200
    p.poll_once()
    assert not p.status()["failing"]


def test_bad_urls_say_so():
    with pytest.raises(MetricsError, match="http:// or https://"):
        num_gpu_blocks("file:///etc/passwd")
    with pytest.raises(MetricsError, match="could not read"):
        num_gpu_blocks("http://127.0.0.1:9/metrics", timeout=1)
    with pytest.raises(MetricsError, match="num_gpu_blocks"):
        with metrics_server(lambda: (200, "vllm:kv_cache_usage_perc 0.5\n")) as url:
            num_gpu_blocks(url)
