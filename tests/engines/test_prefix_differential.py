"""kvscope's prefix cache against a real vLLM engine: the same token sequences, one request at a
time, through vLLM (in this process) and through a PrefixPool with the same usable blocks and
LRU. Every request's cached tokens must agree, evictions included.

The one known difference: when a prompt is entirely made of cached full blocks, vLLM recomputes
its last token (it needs that token's logits), and since it computes whole blocks that costs the
last block: it reports one block less as cached than kvscope does, and stores that block again.
"""

from __future__ import annotations

import os
import random

import pytest
from engine_driver import build_llm

from allocator import PrefixPool

pytestmark = pytest.mark.engines

BLOCK = 32
NUM_BLOCKS = 48  # vLLM's count: block 0 is its null block, so 47 hold tokens
USABLE = NUM_BLOCKS - 1
REQUESTS = 400
VOCAB = 4096


@pytest.fixture(scope="module")
def llm(engine_env):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = build_llm(str(engine_env), num_blocks=NUM_BLOCKS, max_num_seqs=1, max_model_len=1024)
    yield engine
    engine.llm_engine.engine_core.shutdown()


def run(llm, tokens: list[int]) -> int:
    """vLLM's num_cached_tokens for one request of `tokens` (prefill plus one sampled token)."""
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": tokens}], SamplingParams(max_tokens=1),
                       use_tqdm=False)
    return out[0].num_cached_tokens


def workload(seed: int, n: int):
    """Chat-like prompts: a system prompt (one of 8, 1-6 blocks) plus a fresh question, or an
    earlier prompt continued (a conversation's next turn). Every prompt ends in at least one
    token never sent before, so no prompt is a full hit (that case has its own test)."""
    rng = random.Random(seed)

    def fresh(k: int) -> list[int]:
        return [rng.randrange(4, VOCAB) for _ in range(k)]

    systems = [fresh(BLOCK * rng.randint(1, 6)) for _ in range(8)]
    earlier: list[list[int]] = []
    for _ in range(n):
        if earlier and rng.random() < 0.4:
            base = rng.choice(earlier[-12:])
        else:
            base = rng.choice(systems)
        prompt = base + fresh(rng.randint(1, 160))
        prompt = prompt[-(BLOCK * (USABLE - 2)):] if len(prompt) > BLOCK * (USABLE - 2) else prompt
        earlier.append(prompt)
        yield prompt


def test_cached_tokens_equal_vllms_over_hundreds_of_requests_with_evictions(llm, figures):
    assert llm.reset_prefix_cache()
    pool = PrefixPool(USABLE, 4096, tokens_per_block=BLOCK, policy="lru")
    mismatches, evicting, hitting = [], 0, 0
    for i, tokens in enumerate(workload(11, REQUESTS)):
        theirs = run(llm, tokens)
        before = pool.prefix_stats()["evicted"]
        seq = pool.open_sequence(tokens=tokens)
        ours = seq.cached_tokens
        pool.close_sequence(seq.id)
        evicting += pool.prefix_stats()["evicted"] > before
        hitting += ours > 0
        if ours != theirs:
            mismatches.append((i, len(tokens), ours, theirs))
    assert pool.check() == []
    assert not mismatches, f"(request, tokens, kvscope, vLLM): {mismatches[:10]}"
    # The workload must exercise what it claims to: hits and evictions, often.
    assert hitting > REQUESTS // 3 and evicting > REQUESTS // 4, (hitting, evicting)
    figures.append(f"differential: {REQUESTS} requests compared, {hitting} with cache hits, "
                   f"{evicting} of them evicted blocks ({pool.prefix_stats()['evicted']} blocks in all)")


def test_a_full_hit_costs_vllm_its_last_block(llm):
    """A prompt of whole blocks sent twice: kvscope reuses every block, vLLM all but the last
    (recomputed for the last token's logits). One token more and both reuse every full block."""
    assert llm.reset_prefix_cache()
    pool = PrefixPool(USABLE, 4096, tokens_per_block=BLOCK, policy="lru")
    rng = random.Random(5)
    tokens = [rng.randrange(4, VOCAB) for _ in range(BLOCK * 4)]

    def ours(t):
        seq = pool.open_sequence(tokens=t)
        pool.close_sequence(seq.id)
        return seq.cached_tokens

    assert (run(llm, tokens), ours(tokens)) == (0, 0)
    assert (run(llm, tokens), ours(tokens)) == (BLOCK * 3, BLOCK * 4)
    longer = tokens + [7]
    assert (run(llm, longer), ours(longer)) == (BLOCK * 4, BLOCK * 4)
