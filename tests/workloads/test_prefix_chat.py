"""The prefix-chat scenario: prompts grow by reply + message, system prompts shared, and the
prefix cache serves most prompt tokens; the same ops without prefix caching serve none."""

from __future__ import annotations

from workloads.cli import scenario_main
from workloads.scenarios import Geometry, compare_prefix_caching, make_scenario, prefix_chat


def turns(seed: int = 3, blocks: int = 256) -> tuple[list, dict]:
    """Each opened prompt, in order, answering every op as if it succeeded."""
    gen = make_scenario("prefix-chat", seed, Geometry(64, blocks, 0, 16))
    prompts, replies, result = [], {}, None
    try:
        op = next(gen)
        while True:
            if op.kind == "open":
                prompts.append((op.ref, op.tokens))
                replies[op.ref] = ()
                result = op.ref
            elif op.kind == "append":
                replies[op.ref] += op.tokens
                result = op.ref
            else:
                result = None
            op = gen.send(result)
    except StopIteration:
        pass
    return prompts, replies


def test_each_turn_extends_a_previous_prompt_with_its_reply_and_a_new_message():
    prompts, replies = turns()
    seen = {}
    continued = 0
    for ref, prompt in prompts:
        for earlier_ref, earlier in seen.items():
            full = earlier + replies[earlier_ref]
            if len(prompt) > len(full) and prompt[:len(full)] == full:
                continued += 1
                break
        seen[ref] = prompt
    assert continued > len(prompts) // 3
    firsts = {p[:32] for _, p in prompts}
    assert len(firsts) <= 3 + 1  # conversations start from one of the few system prompts


def test_same_seed_same_ops():
    a = list(prefix_chat(5, Geometry(64, 128, 0, 16)))
    b = list(prefix_chat(5, Geometry(64, 128, 0, 16)))
    assert a == b and a


def test_prefix_caching_on_serves_most_prompt_tokens_and_off_serves_none():
    cmp = compare_prefix_caching(seed=1, num_blocks=384)
    on, off = cmp["strategies"]["prefix caching on"], cmp["strategies"]["prefix caching off"]
    assert on["prefix_queries"] == off["prefix_queries"] > 0
    assert on["prefix_hit_ratio"] > 0.5 and off["prefix_hits"] == 0
    assert on["prefix"]["evicted"] > 0  # the conversations outgrow the pool
    assert on["check"] == [] and off["check"] == []
    assert on["prefix"]["hits"] == on["prefix_hits"]


def test_cli_prints_the_side_by_side_comparison(capsys):
    assert scenario_main(["prefix-chat", "--blocks", "256", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "prefix caching on" in out and "served from the prefix cache" in out
