"""The `prefix-chat` scenario: multi-turn conversations whose prompts share prefixes.

Every turn's prompt is the previous prompt plus the model's reply plus a new user message, and
every conversation starts with one of a few system prompts, so on a prefix-caching pool each turn
reuses its conversation's cached blocks (and the system prompt is shared by every conversation
that uses it): sharing, hits and eviction are all visible live. Each turn opens the prompt as a
sequence, appends the reply token by token-chunk (decode), and closes it; a conversation that
outgrows its budget ends and a new one takes its place. Popularity is Zipf-skewed.

On a pool without prefix caching the same ops run as plain allocations (open = allocate the
prompt, append = extend, close = free): every prompt is computed again, the baseline that the
compare view puts beside it.
"""

from __future__ import annotations

import numpy as np

from .scenarios import Geometry, Op, ScenarioGen

SYSTEM_PROMPTS = 3
BATCH = 6  # turns in flight together
VOCAB = 32_000


def prefix_chat(seed: int, geo: Geometry, conversations: int | None = None, turns: int = 400,
                zipf_s: float = 1.1) -> ScenarioGen:
    rng = np.random.default_rng(seed)
    tpb = geo.tokens_per_block
    n = max(geo.free_blocks, 16)
    if conversations is None:
        conversations = max(4, min(48, n // 24))
    # Budget per conversation: long enough to share many blocks, short enough that the live
    # conversations overfill the pool and the cache has to evict.
    longest = max(4 * tpb, (n * tpb) // max(4, conversations // 2))
    systems = [rng.integers(0, VOCAB, size=int(rng.integers(2, 5)) * tpb).tolist()
               for _ in range(SYSTEM_PROMPTS)]
    weights = 1.0 / np.arange(1, conversations + 1) ** zipf_s
    ranks = rng.choice(conversations, size=turns, p=weights / weights.sum()).tolist()
    history: list[list[int] | None] = [None] * conversations
    handle = 0
    step = max(1, tpb // 2)
    for start in range(0, turns, BATCH):
        # A batch of turns in flight at once, as a serving engine schedules them: conversations
        # on the same system prompt hold its blocks together (shared), then decode, then finish.
        batch = []
        for rank in ranks[start:start + BATCH]:
            message = rng.integers(0, VOCAB, size=int(rng.integers(tpb // 2, 2 * tpb) + 1)).tolist()
            reply = rng.integers(0, VOCAB, size=int(rng.integers(tpb, 3 * tpb) + 1)).tolist()
            prompt = history[rank]
            if prompt is None or len(prompt) + len(message) + len(reply) > longest:
                prompt = list(systems[int(rng.integers(SYSTEM_PROMPTS))])  # a new conversation
            prompt = prompt + message
            handle += 1
            result = yield Op("open", handle, dt=0.03, tokens=tuple(prompt))
            history[rank] = None  # unless this turn completes
            if not isinstance(result, Exception):
                batch.append((rank, handle, prompt, reply))
        for i in range(0, 3 * tpb + 1, step):  # decode: every reply grows by a chunk per step
            for _, h, _, reply in batch:
                if i < len(reply):
                    yield Op("append", h, dt=0.005, tokens=tuple(reply[i:i + step]))
        for rank, h, prompt, reply in batch:
            yield Op("close", h, dt=0.01)
            history[rank] = prompt + reply
