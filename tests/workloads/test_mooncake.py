import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import InvalidRequest
from workloads.mooncake import (
    DEFAULT_MOONCAKE,
    expand,
    load_mooncake,
    parse_mooncake,
    splitmix64,
    sub_blocks,
)


def line(t=0, n_in=600, n_out=5, ids=(1, 2), **extra) -> str:
    obj = {"timestamp": t, "input_length": n_in, "output_length": n_out, "hash_ids": list(ids)}
    obj.update(extra)
    return json.dumps(obj) + "\n"


def parse(*lines: str):
    return parse_mooncake(list(lines), source="m.jsonl")


def test_bundled_trace_is_whole_with_its_attribution():
    trace = load_mooncake()
    s = trace.summary()
    assert (s["requests"], s["blocks"], s["distinct_blocks"]) == (12_031, 288_500, 182_790)
    assert s["input_tokens_max"] == 126_195 and round(s["duration_s"]) == 3537
    assert trace.arrival_s[0] == 0.0 and (np.diff(trace.arrival_s) >= 0).all()
    readme = (DEFAULT_MOONCAKE.parent / "README.md").read_text()
    assert "Apache License 2.0" in readme and "USENIX FAST 2025" in readme


def test_timestamps_are_milliseconds_from_the_first():
    trace = parse(line(t=1000), line(t=2500, n_in=100, ids=[7]))
    assert trace.arrival_s.tolist() == [0.0, 1.5]
    assert trace.input_length.tolist() == [600, 100] and trace.output_length.tolist() == [5, 5]
    assert trace.block_nodes(1).tolist() == [2]


def test_nodes_number_prefixes_not_raw_ids():
    # id 5 under prefix 1 and id 5 under prefix 2 are different blocks; [1, 5] twice is one.
    trace = parse(line(n_in=1024, ids=[1, 5]), line(n_in=1024, ids=[2, 5]), line(n_in=1000, ids=[1, 5]))
    assert [trace.block_nodes(i).tolist() for i in range(3)] == [[0, 1], [2, 3], [0, 1]]
    assert trace.num_nodes == 4


@pytest.mark.parametrize("text, message", [
    ("{not json", r"line 2: not valid JSON"),
    ("[1, 2]", r"line 2: expected a JSON object"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1}', r"line 2: missing field\(s\) hash_ids"),
    (line(t=-1).strip(), r"line 2: timestamp -1 is not a non-negative"),
    (line(t="soon").strip(), r"line 2: timestamp 'soon'"),
    (line(n_in=0, ids=[]).strip(), r"line 2: input_length 0 is below 1"),
    (line(n_in=True).strip(), r"line 2: input_length True is not an integer"),
    (line(n_out=0).strip(), r"line 2: output_length 0 is below 1"),
    (line(n_in=600, ids=[1]).strip(), r"line 2: hash_ids has 1 ids, expected ceil\(input_length 600 / 512\) = 2"),
    (line(ids=[1, -3]).strip(), r"line 2: hash_ids\[1\] -3 is not an integer"),
    (line(ids=[1, 2.5]).strip(), r"line 2: hash_ids\[1\] 2.5"),
    (line(hash_ids="12").strip(), r"line 2: hash_ids is str"),
])
def test_a_bad_line_names_its_number_and_problem(text, message):
    with pytest.raises(InvalidRequest, match="m.jsonl: " + message):
        parse(line(), text)


def test_blank_lines_are_skipped_but_counted_and_order_is_enforced():
    with pytest.raises(InvalidRequest, match=r"line 4: timestamp 5 is before the previous request's 9"):
        parse(line(t=1), "\n", line(t=9), line(t=5))
    assert len(parse(line(t=1), "  \n", line(t=1))) == 2


def test_empty_file_unreadable_path_and_bad_limit_are_invalid_requests(tmp_path):
    with pytest.raises(InvalidRequest, match="no requests"):
        parse("\n")
    with pytest.raises(InvalidRequest, match="cannot read trace"):
        load_mooncake(tmp_path / "missing.jsonl")
    with pytest.raises(InvalidRequest, match="limit must be a positive integer"):
        load_mooncake(limit=0)
    raw = tmp_path / "bin.jsonl"
    raw.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidRequest, match="not a UTF-8 text file"):
        load_mooncake(raw)


def test_limit_and_head_keep_the_first_requests():
    full = load_mooncake(limit=50)
    assert len(full) == 50 and len(full.head(10)) == 10
    head = full.head(10)
    assert head.offsets[-1] == full.offsets[10]
    assert head.num_nodes == int(full.nodes[: full.offsets[10]].max()) + 1


def test_expansion_gives_each_trace_block_its_pool_blocks():
    trace = parse(line(n_in=1024, ids=[1, 2]), line(n_in=700, ids=[1, 3]))
    a, b = trace.block_hashes(0, 16), trace.block_hashes(1, 16)
    assert len(a) == len(b) == 64  # 2 trace blocks x 32 sub-blocks, the partial last one too
    assert a[:32] == b[:32] and not set(a[32:]) & set(b[32:])  # shared first block only
    assert len(set(a + b[32:])) == 96  # no collisions
    assert all(0 <= h < 2**64 for h in a)
    assert trace.block_hashes(0, 512) == expand(np.array([0, 1]), 512)
    assert len(trace.block_hashes(0, 128)) == 8


def test_expansion_needs_a_divisor_of_512():
    assert sub_blocks(16) == 32 and sub_blocks(512) == 1
    for bad in (0, 3, 1024, 16.0, True):
        with pytest.raises(InvalidRequest, match="tokens_per_block must divide 512"):
            sub_blocks(bad)


def test_splitmix64_is_a_bijection_on_a_sample():
    x = np.arange(100_000, dtype=np.uint64)
    y = splitmix64(x)
    assert len(np.unique(y)) == len(x) and y.dtype == np.uint64
    # Known value: SplitMix64's first output from seed 0 (state advanced once).
    assert int(splitmix64(np.array([0], np.uint64))[0]) == 0xE220A8397B1DCDAF


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=20))
def test_two_blocks_share_a_node_exactly_when_their_whole_prefixes_agree(prompts):
    trace = parse(*[line(t=i, n_in=len(p) * 512, ids=p) for i, p in enumerate(prompts)])
    blocks = [(tuple(p[:k + 1]), int(trace.block_nodes(i)[k]))
              for i, p in enumerate(prompts) for k in range(len(p))]
    for prefix_a, node_a in blocks:
        for prefix_b, node_b in blocks:
            assert (node_a == node_b) == (prefix_a == prefix_b)
    assert trace.num_nodes == len({prefix for prefix, _ in blocks})
