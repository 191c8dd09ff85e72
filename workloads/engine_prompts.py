"""A Mooncake trace as token-id prompts a small real engine can serve.

The trace names each 512-token prompt block by a hash id; a real engine needs token ids. Each
trace block becomes `BLOCK_TOKENS` (32) token ids, drawn from a generator seeded by the block's
prefix-tree node (`MooncakeTrace.block_nodes`), so two requests share token ids exactly where the
trace says their prompts share a prefix, and the engine's own prefix cache sees the trace's
reuse. Lengths scale by 512 / 32 = 16: a prompt of `input_length` tokens sends
`ceil(input_length / 16)` ids, cut to `max_prompt` (its first ids: the shared part is kept), and
asks for `ceil(output_length / 16)` new tokens, at most `max_output`. One trace block is one
32-token engine block, so the hit ratio the engine sees follows the trace's block reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .mooncake import TRACE_BLOCK_TOKENS, MooncakeTrace

BLOCK_TOKENS = 32
SCALE = TRACE_BLOCK_TOKENS // BLOCK_TOKENS
FIRST_ID = 4  # below: the tiny tokenizer's special tokens


@dataclass(frozen=True, slots=True)
class EnginePrompt:
    arrival_s: float
    tokens: list[int]
    max_tokens: int


def block_tokens(node: int, vocab: int) -> np.ndarray:
    """The 32 token ids standing for trace prefix node `node` (the same node, the same ids)."""
    return np.random.default_rng(int(node)).integers(FIRST_ID, vocab, BLOCK_TOKENS)


def prompt(trace: MooncakeTrace, i: int, *, vocab: int = 4096, max_prompt: int = 2000,
           max_output: int = 32) -> EnginePrompt:
    """Request i of `trace`, scaled down (see the module docstring)."""
    nodes = trace.block_nodes(i)
    n = min(-(-int(trace.input_length[i]) // SCALE), max_prompt)
    need = -(-n // BLOCK_TOKENS)
    ids = np.concatenate([block_tokens(int(x), vocab) for x in nodes[:need]])[:n]
    out = max(1, min(max_output, -(-int(trace.output_length[i]) // SCALE)))
    return EnginePrompt(float(trace.arrival_s[i]), ids.tolist(), out)
