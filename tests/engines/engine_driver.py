"""A real vLLM engine (CPU build, tiny dummy model) driven step by step over stdin / stdout.

Run in the engine environment, in a process of its own, so a test can give it its own
environment (e.g. VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, read once per process by vLLM) and kill
it mid-stream. The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so after
every step the driver reads the engine's own BlockPool: that is the ground truth a mirror is held
to. It publishes its KV events on `--events-port` (replay on `--replay-port`).

Protocol: one JSON object per line each way.
- `{"op": "add", "requests": [{"id", "tokens", "max_tokens"}]}` -> `{"ok": true}`
- `{"op": "step"}` -> `{"seq", "cached", "finished", "num_cached_tokens", "unfinished"}`: `seq`
  is the last batch sequence number the engine published (None: none yet), once the publisher
  has sent everything this step queued; `cached` the engine's cached block hashes, as kvscope
  names them (the 64-bit fold of vLLM's hash bytes).
- `{"op": "quit"}` ends the process.
The first line written is `{"ready": true, "boot_s": ...}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MASK = (1 << 64) - 1


def build_llm(model: str, *, num_blocks: int, max_num_seqs: int, max_model_len: int,
              events_port: int | None = None, replay_port: int | None = None):
    """An in-process vLLM engine on the tiny model: dummy weights, 32-token blocks, prefix
    caching, `num_blocks` KV blocks (block 0 is vLLM's null block)."""
    from vllm import LLM
    from vllm.config import KVEventsConfig

    kw = {}
    if events_port is not None:
        kw["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://*:{events_port}",
            replay_endpoint=f"tcp://*:{replay_port}" if replay_port else None)
    return LLM(model=model, load_format="dummy", block_size=32, enable_prefix_caching=True,
               num_gpu_blocks_override=num_blocks, max_model_len=max_model_len,
               max_num_seqs=max_num_seqs, seed=0, enforce_eager=True, **kw)


def core(llm):
    """The in-process EngineCore (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return llm.llm_engine.engine_core.engine_core


def block_pool(llm):
    return core(llm).scheduler.kv_cache_manager.block_pool


def cached_hashes(llm) -> set[int]:
    """The engine's cached block hashes, folded to 64 bits as its int-hash events name them."""
    from vllm.v1.core.kv_cache_utils import get_block_hash

    keys = block_pool(llm).cached_block_hash_to_block._cache.keys()
    return {int.from_bytes(get_block_hash(k), "big") & MASK for k in keys}


def published_seq(llm, timeout: float = 10.0) -> int | None:
    """The last seq the engine's publisher sent, after it sent all that was queued."""
    pub = core(llm).scheduler.kv_event_publisher
    deadline = time.monotonic() + timeout
    while pub._event_queue.unfinished_tasks:
        if time.monotonic() > deadline:
            raise TimeoutError("the KV-event publisher did not drain")
        time.sleep(0.001)
    return pub._buffer[-1][0] if pub._buffer else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--events-port", type=int, required=True)
    p.add_argument("--replay-port", type=int, required=True)
    p.add_argument("--num-blocks", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=1024)
    args = p.parse_args()
    t0 = time.monotonic()
    # The protocol owns the real stdout; vLLM's logging (to stdout) goes to stderr instead.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from vllm import SamplingParams

    llm = build_llm(args.model, num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
                    max_model_len=args.max_model_len, events_port=args.events_port,
                    replay_port=args.replay_port)
    engine = llm.llm_engine

    def say(obj) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    say({"ready": True, "boot_s": round(time.monotonic() - t0, 1)})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "add":
            for r in cmd["requests"]:
                engine.add_request(r["id"], {"prompt_token_ids": r["tokens"]},
                                   SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True,
                                                  temperature=0.0))
            say({"ok": True})
        elif op == "step":
            finished, cached_tokens = [], {}
            for o in engine.step():
                if o.finished:
                    finished.append(o.request_id)
                    cached_tokens[o.request_id] = o.num_cached_tokens
            say({"seq": published_seq(llm), "cached": sorted(cached_hashes(llm)),
                 "finished": finished, "num_cached_tokens": cached_tokens,
                 "unfinished": engine.get_num_unfinished_requests()})
        elif op == "quit":
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
