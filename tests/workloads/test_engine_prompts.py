"""The Mooncake trace as token-id prompts for real engines: shared prefixes share token ids."""

from __future__ import annotations

from workloads.engine_prompts import BLOCK_TOKENS, SCALE, prompt
from workloads.mooncake import load_mooncake, parse_mooncake

LINES = [
    '{"timestamp": 0, "input_length": 1100, "output_length": 40, "hash_ids": [5, 6, 7]}',
    '{"timestamp": 10, "input_length": 1500, "output_length": 2000, "hash_ids": [5, 6, 8]}',
    '{"timestamp": 20, "input_length": 600, "output_length": 1, "hash_ids": [9, 6]}',
]


def test_prompts_share_token_ids_exactly_where_the_trace_shares_a_prefix():
    t = parse_mooncake(LINES)
    a, b, c = (prompt(t, i) for i in range(3))
    assert len(a.tokens) == -(-1100 // SCALE) and len(b.tokens) == -(-1500 // SCALE)
    # Blocks 5, 6 are the same prefix in requests 0 and 1: the same 64 ids; block 7 vs 8 differ.
    assert a.tokens[:2 * BLOCK_TOKENS] == b.tokens[:2 * BLOCK_TOKENS]
    assert a.tokens[2 * BLOCK_TOKENS:] != b.tokens[2 * BLOCK_TOKENS:len(a.tokens)]
    # Hash id 6 under another first block is another prefix: other ids.
    assert c.tokens[BLOCK_TOKENS:2 * BLOCK_TOKENS] != a.tokens[BLOCK_TOKENS:2 * BLOCK_TOKENS]
    assert all(4 <= x < 4096 for x in a.tokens + b.tokens + c.tokens)
    assert (a.max_tokens, b.max_tokens, c.max_tokens) == (3, 32, 1)
    assert (a.arrival_s, b.arrival_s) == (0.0, 0.01)
    assert prompt(t, 0).tokens == a.tokens  # deterministic


def test_long_prompts_are_cut_keeping_their_first_ids():
    t = load_mooncake(limit=50)
    longest = max(range(50), key=lambda i: int(t.input_length[i]))
    full = prompt(t, longest, max_prompt=10_000)
    cut = prompt(t, longest, max_prompt=100)
    assert len(cut.tokens) == 100 and cut.tokens == full.tokens[:100]
