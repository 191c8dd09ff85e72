"""The simulated engines over real HTTP and real ZeroMQ: what routers probe, prefix-cache hits in
the answers and in /metrics, KV events a kvscope fleet follows to the same blocks, service times
from the costs, streaming, bad input, and `kvscope sim-engines` as a process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from support.apputil import ROOT

from app.engines.sim import SimEngines
from app.engines.sim_engine import tokenize
from kvevents.fleet import EngineSpec, Fleet
from workloads.routing.serving import ServingCosts

FAST = ServingCosts(prefill_token_s=0.0002, step_base_s=0.002, step_seq_s=0.0, model="linear")


def words(first: int, n: int) -> str:
    return " ".join(f"w{i}" for i in range(first, first + n))


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def post_together(url: str, bodies: list[dict]) -> dict[int, tuple[int, float]]:
    """POST each body to /v1/completions at once, one thread each; {i: (status, done at)}."""
    results: dict[int, tuple[int, float]] = {}

    def send(i: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            r = c.post("/v1/completions", json=bodies[i])
            results[i] = (r.status_code, time.monotonic())
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.fixture()
def engines():
    with SimEngines(SimEngines.uniform(2, num_blocks=128, block_size=16, costs=FAST)) as se:
        yield se


def test_an_engine_answers_what_routers_probe(engines):
    with httpx.Client(base_url=engines.urls[0], timeout=30) as c:
        for path in ("/health", "/health_generate"):
            assert c.get(path).status_code == 200
        assert c.get("/v1/models").json()["data"][0]["id"] == "kvscope-sim"
        info = c.get("/get_server_info").json()
        assert info["block_size"] == 16 and info["page_size"] == 16 and info["num_gpu_blocks"] == 128
        assert info["kv_events"]["endpoint"].startswith("tcp://127.0.0.1:")
        assert c.get("/get_model_info").json()["is_generation"] is True
        text = "alpha beta gamma alpha"
        tok = c.post("/tokenize", json={"prompt": text}).json()
        assert tok["tokens"] == tokenize(text) and tok["count"] == 4
        assert tok["tokens"][0] == tok["tokens"][3] != tok["tokens"][1]
        # vLLM's render answers: a list of GenerateRequests for a completion, one for a chat
        rendered = c.post("/v1/completions/render", json={"prompt": text}).json()
        assert [r["token_ids"] for r in rendered] == [tokenize(text)]
        chat_r = c.post("/v1/chat/completions/render",
                        json={"messages": [{"role": "user", "content": text}]}).json()
        assert chat_r["token_ids"] == tokenize(text) and chat_r["request_id"]
        chat = c.post("/tokenize", json={"messages": [{"role": "user", "content": text}]}).json()
        assert chat["tokens"] == tokenize(text)
        assert c.post("/detokenize", json={"tokens": [1, 2]}).json() == {"prompt": "t1 t2"}


def test_a_repeated_prompt_hits_its_cached_blocks_the_counters_and_a_fleet_say_so(engines):
    fleet = Fleet("sim")
    try:
        for cfg, ev in zip(engines.configs, engines.events()):
            fleet.add(EngineSpec(cfg.name, ev["endpoint"], replay_endpoint=ev["replay_endpoint"],
                                 block_size=16, num_blocks=cfg.num_blocks))
        prompt = words(0, 200)  # 12 full blocks of 16 and 8 tokens over
        with httpx.Client(base_url=engines.urls[0], timeout=30) as c:
            first = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4}).json()
            second = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4}).json()
            other = c.post("/v1/completions", json={"prompt": words(1000, 40), "max_tokens": 2})
            m = c.get("/metrics").text
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 192
        assert other.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert first["choices"][0]["text"].split() == ["tok"] * 4
        assert metric(m, "vllm:prefix_cache_queries_total") == 440
        assert metric(m, "vllm:prefix_cache_hits_total") == 192
        assert metric(m, "vllm:request_success_total") == 3
        held = engines.stats()[0]["cached_blocks"]
        assert held == 12 + 2
        # the engine's KV events, followed by kvscope's fleet index: the same blocks, matched by
        # the prompt's token ids on that engine only
        deadline = time.monotonic() + 30
        while True:
            with fleet.lock:
                row = fleet.index.engine_stats("sim-0")
                got = fleet.index.match(tokenize(prompt))
            if row["cached_blocks"] == held:
                break
            assert time.monotonic() < deadline, row
            time.sleep(0.05)
        assert got == {"sim-0": 12, "sim-1": 0}
    finally:
        fleet.close()


def test_service_times_follow_the_costs_and_a_full_batch_queues():
    costs = ServingCosts(prefill_token_s=0.002, step_base_s=0.01, step_seq_s=0.0, max_batch=1,
                         model="linear")
    with SimEngines(SimEngines.uniform(1, num_blocks=64, block_size=16, costs=costs)) as se:
        with httpx.Client(base_url=se.urls[0], timeout=60) as c:
            t0 = time.monotonic()
            c.post("/v1/completions", json={"prompt": words(0, 100), "max_tokens": 5})
            alone = time.monotonic() - t0
            # 100 tokens at 2 ms + 5 steps of 10 ms: the answer cannot come sooner
            assert alone >= 0.100 + 0.04, alone
            t0 = time.monotonic()
            results = post_together(se.urls[0], [
                {"prompt": words(500 + 1000 * i, 50), "max_tokens": 5} for i in range(2)])
        st = se.stats()[0]
    assert [results[i][0] for i in (0, 1)] == [200, 200]
    # one request runs at a time: the second waits for the first, 2 x (50 x 2 ms + 5 x 10 ms)
    assert max(t for _, t in results.values()) - t0 >= 2 * (0.1 + 0.05) - 0.02, results
    assert st["completed"] == 3 and st["simulated_s"] >= 0.14 + 0.3 - 0.02


def test_streaming_sends_a_first_chunk_then_the_rest(engines):
    body = {"messages": [{"role": "user", "content": words(0, 64)}], "stream": True, "max_tokens": 3}
    with httpx.Client(base_url=engines.urls[1], timeout=30) as c:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and len(data) == 3
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["content"] == "tok"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 3 and chunks[-1]["usage"]["prompt_tokens"] == 64


@pytest.mark.parametrize("path, body, says", [
    ("/v1/completions", {"prompt": ""}, "prompt is empty"),
    ("/v1/completions", {}, "needs 'prompt'"),
    ("/v1/completions", {"prompt": 5}, "string or a list of token ids"),
    ("/v1/completions", {"prompt": [1, -1]}, "string or a list of token ids"),
    ("/v1/completions", {"prompt": "a b", "max_tokens": 0}, "max_tokens must be"),
    ("/v1/completions", {"prompt": "a b", "max_tokens": True}, "max_tokens must be"),
    ("/v1/completions", {"prompt": words(0, 2040), "max_tokens": 16}, "maximum context length is 2048"),
    ("/v1/chat/completions", {"messages": []}, "messages must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, "content must be"),
    ("/generate", {"text": "a", "sampling_params": 3}, "sampling_params must be"),
    ("/tokenize", {"prompt": {"x": 1}}, "string or a list of token ids"),
])
def test_bad_requests_are_400_with_a_message_and_change_nothing(engines, path, body, says):
    with httpx.Client(base_url=engines.urls[0], timeout=30) as c:
        r = c.post(path, json=body)
        assert r.status_code == 400, r.text
        assert says in r.json()["message"], r.json()
        assert c.post("/v1/completions", content=b"{nope").status_code == 400
        assert c.post("/v1/completions", content=b"[1]").json()["message"] == "the body must be a JSON object"
    st = engines.stats()[0]
    assert st["requests"] == 0 and st["cached_blocks"] == 0 and st["waiting"] == 0


def test_sim_engines_cli_prints_its_engines_writes_a_fleet_file_and_stops_on_sigterm(tmp_path):
    out = tmp_path / "fleet.json"
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "sim-engines", "--engines", "2",
                             "--num-blocks", "64", "--fleet-file", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = []
        while not any("engines up" in line for line in lines):
            line = proc.stdout.readline()
            assert line, f"exited {proc.poll()}: {''.join(lines)}"
            lines.append(line)
        urls = [line.split()[1] for line in lines if line.startswith("sim-")]
        assert len(urls) == 2
        for url in urls:
            assert httpx.get(url + "/health", timeout=10).status_code == 200
        spec = json.loads(out.read_text())
        assert [e["name"] for e in spec["engines"]] == ["sim-0", "sim-1"]
        assert all(e["endpoint"].startswith("tcp://127.0.0.1:") and e["block_size"] == 16
                   for e in spec["engines"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_sim_engines_cli_refuses_bad_flags_in_one_line():
    for flags, says in ((["--engines", "0"], "--engines must be 1..64"),
                        (["--speed", "0"], "--speed must be a positive number"),
                        (["--block-size", "0"], "block_size must be a whole number >= 1")):
        r = subprocess.run([sys.executable, "-m", "app.cli", "sim-engines", *flags], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and says in r.stderr, (flags, r.stderr)


def test_a_preempted_request_is_admitted_again_and_completes():
    """A pool too small for two long requests at once: the later one is preempted (freed,
    queued again, its tokens recomputed at re-admission) and both complete. Both arrive in one
    step of the engines' loop, so they overlap however loaded the machine is."""
    costs = ServingCosts(prefill_token_s=0.00001, step_base_s=0.001, step_seq_s=0.0, model="linear")
    with SimEngines(SimEngines.uniform(1, num_blocks=12, block_size=16, costs=costs)) as se:
        def submit_both():
            e = se.engines[0]
            loop = asyncio.get_running_loop()
            return [e.submit(tokenize(words(1000 * i, 60)), 60, loop, tag=f"r{i}")
                    for i in range(2)]
        pending = se.call(submit_both)
        deadline = time.monotonic() + 60
        while se.stats()[0]["completed"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        st = se.stats()[0]
    assert all(p.done.done() and not p.done.exception() for p in pending)
    assert st["preemptions"] >= 1 and st["completed"] == 2 and st["errors"] == 0, st
