"""kvscope's wire against the engines' own decoders, both event forms, hash forms, framing."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from kve_zmq import connect_joined
from support.kve_source import RefPrefixCache

from kvevents.codec import (
    HASH_MASK,
    Cleared,
    Removed,
    Stored,
    WireError,
    decode_batch,
    encode_batch,
    encode_positional,
    norm_hash,
)
from kvevents.publisher import Publisher

U64 = st.integers(0, HASH_MASK)
EVENTS = st.lists(st.one_of(
    st.builds(Stored, st.lists(U64, min_size=1, max_size=5), st.one_of(st.none(), U64),
              st.lists(st.integers(0, 1 << 31), max_size=20), st.integers(1, 64),
              st.sampled_from(["GPU", None])),
    st.builds(Removed, st.lists(U64, min_size=1, max_size=5), st.sampled_from(["GPU", None])),
    st.just(Cleared()),
), max_size=8)


def same(a, b) -> bool:
    if a.kind != b.kind:
        return False
    if a.kind == "stored":
        return (a.block_hashes, a.parent, list(a.token_ids or []), a.block_size, a.medium) == \
               (b.block_hashes, b.parent, list(b.token_ids or []), b.block_size, b.medium)
    if a.kind == "removed":
        return (a.block_hashes, a.medium) == (b.block_hashes, b.medium)
    return True


@settings(max_examples=150, deadline=None)
@given(EVENTS, st.floats(0, 2e9))
def test_both_forms_round_trip(events, ts):
    for enc in (encode_batch, encode_positional):
        batch = decode_batch(enc(events, ts, 3))
        assert batch.ts == ts and batch.dp_rank == 3
        assert len(batch.events) == len(events)
        assert all(same(a, b) for a, b in zip(events, batch.events))


def test_hash_forms_name_a_block_alike():
    assert norm_hash(5) == 5 and norm_hash(HASH_MASK) == HASH_MASK
    assert norm_hash(-1) == HASH_MASK and norm_hash(-(1 << 63)) == 1 << 63   # SGLang's signed
    digest = bytes(range(32))                                                # sha256 bytes
    assert norm_hash(digest) == int.from_bytes(digest, "big") & HASH_MASK     # as vLLM folds them
    for bad in (1 << 64, -(1 << 63) - 1, 1.5, "ab", b"", None):
        with pytest.raises(WireError):
            norm_hash(bad)


def test_vllm_typed_decoder_reads_kvscope_output(vllm_kv, sglang_kv):
    events = []
    src = RefPrefixCache(seed=3)
    for _ in range(20):
        events += src.step()
    events += [Cleared()]
    payload = encode_batch(events, 123.5, 0)
    for mod in (vllm_kv, sglang_kv):
        theirs = msgspec.msgpack.Decoder(type=mod.KVEventBatch).decode(payload)
        assert theirs.ts == 123.5 and len(theirs.events) == len(events)
        for mine, their in zip(events, theirs.events):
            name = type(their).__name__
            assert name == {"stored": "BlockStored", "removed": "BlockRemoved",
                            "cleared": "AllBlocksCleared"}[mine.kind]
            if mine.kind == "stored":
                hashes = [h & HASH_MASK for h in their.block_hashes]
                assert hashes == mine.block_hashes
                assert (their.parent_block_hash is None) == (mine.parent is None)
                assert their.token_ids == mine.token_ids and their.block_size == mine.block_size
                assert their.medium == "GPU" and their.lora_id is None
            elif mine.kind == "removed":
                assert [h & HASH_MASK for h in their.block_hashes] == mine.block_hashes


def test_engine_encoded_batches_decode(vllm_kv, sglang_kv):
    """What the engines' own structs encode (tagged maps; SGLang signed; vLLM bytes hashes)."""
    enc = msgspec.msgpack.Encoder()
    digest = bytes(range(32))
    v = vllm_kv.KVEventBatch(ts=1.0, events=[
        vllm_kv.BlockStored(block_hashes=[digest, 7], parent_block_hash=None, token_ids=[1, 2],
                            block_size=2, lora_id=None, medium="GPU", lora_name=None,
                            extra_keys=[None, None], group_idx=0, session_id="s"),
        vllm_kv.BlockRemoved(block_hashes=[7], medium="GPU"),
        vllm_kv.AllBlocksCleared()], data_parallel_rank=2)
    b = decode_batch(enc.encode(v))
    assert [e.kind for e in b.events] == ["stored", "removed", "cleared"] and b.dp_rank == 2
    assert b.events[0].block_hashes == [int.from_bytes(digest, "big") & HASH_MASK, 7]
    s = sglang_kv.KVEventBatch(ts=2.0, events=[
        sglang_kv.BlockStored(block_hashes=[-2], parent_block_hash=-3, token_ids=[1],
                              block_size=1, lora_id=None, cache_salt="x")])
    b = decode_batch(enc.encode(s))
    assert b.events[0].block_hashes == [HASH_MASK - 1] and b.events[0].parent == HASH_MASK - 2


class OldKVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """vLLM <= 0.23's declaration: positional arrays led by the class name."""


class OldBlockStored(OldKVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldBlockRemoved(OldKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class OldAllBlocksCleared(OldKVCacheEvent, tag="AllBlocksCleared"):
    pass


class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[OldBlockStored | OldBlockRemoved | OldAllBlocksCleared]
    data_parallel_rank: int | None = None


def test_pre_024_positional_form_decodes():
    payload = msgspec.msgpack.encode(OldBatch(5.0, [
        OldBlockStored([10, 11], None, [1, 2, 3, 4], 2, None, "GPU"),
        OldBlockRemoved([10], "GPU"), OldAllBlocksCleared()]))
    raw = msgspec.msgpack.decode(payload)
    assert raw[1][0][0] == "BlockStored" and raw[1][2] == ["AllBlocksCleared"]  # the layout
    b = decode_batch(payload)
    assert [e.kind for e in b.events] == ["stored", "removed", "cleared"]
    assert b.events[0].block_hashes == [10, 11] and b.events[0].block_size == 2
    assert decode_batch(encode_positional(b.events, 5.0)).events[0].token_ids == [1, 2, 3, 4]


def test_bad_payloads_are_typed_errors():
    enc = msgspec.msgpack.encode
    for payload, kind in ((b"\xc1garbage", "malformed"), (enc({"a": 1}), "malformed"),
                          (enc([1.0, [{"type": "BlockStored"}] * 11, 0]), "too_large"),
                          (enc(["x", [], 0]), "malformed")):
        with pytest.raises(WireError) as err:
            decode_batch(payload, max_events=10)
        assert err.value.kind == kind
    b = decode_batch(enc([1.0, [{"type": "Nope"}, ["AlsoNope", 1], {"type": "BlockRemoved",
                                "block_hashes": "x"}, 5, {"type": "AllBlocksCleared"}], 0]))
    assert (b.unknown, b.malformed, [e.kind for e in b.events]) == (2, 2, ["cleared"])


def recv_all(sock, n, timeout=30.0):
    out = []
    end = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < end:
        if sock.poll(50):
            out.append(sock.recv_multipart())
    return out


def test_kvscope_publisher_frames_and_replay_match_vllm(ipc, vllm_kv):
    pub = Publisher(ipc("pub"), replay_endpoint=ipc("replay"), topic="kv", buffer_steps=4)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    connect_joined(sub, pub.endpoint)  # slow joiner
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(pub.replay_endpoint)
    try:
        src = RefPrefixCache(seed=5)
        sent = [src.step() for _ in range(6)]
        for events in sent:
            pub.publish(events)
        live = recv_all(sub, 6)
        assert [f[0] for f in live] == [b"kv"] * 6
        assert [int.from_bytes(f[1], "big") for f in live] == list(range(6))
        dec = msgspec.msgpack.Decoder(type=vllm_kv.KVEventBatch)
        for frames, events in zip(live, sent):
            assert len(dec.decode(frames[2]).events) == len(events)
        dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        replies = recv_all(dealer, 5)
        # buffer_steps=4: seqs 2..5, then the end marker; each [empty, topic, seq, payload].
        assert [int.from_bytes(r[2], "big", signed=True) for r in replies] == [2, 3, 4, 5, -1]
        assert all(r[0] == b"" and r[1] == b"kv" for r in replies[:-1])
        assert replies[-1][1:] == [b"", (-1).to_bytes(8, "big", signed=True), b""]
        assert replies[0][3] == live[2][2]
    finally:
        sub.close(0)
        dealer.close(0)
        pub.close()


def test_caps_refuse_oversized_events_and_batches_before_decoding_them():
    """An event of 3M hashes is one malformed event, refused from its array header (not
    decoded: a few microseconds); hashes or token ids past the batch caps refuse the batch."""
    from kvevents.codec import MAX_BATCH_BLOCKS, MAX_EVENT_BLOCKS

    enc = msgspec.msgpack.encode
    big = {"type": "BlockStored", "block_hashes": [7] * 3_000_000,
           "parent_block_hash": None, "token_ids": [], "block_size": 16}
    ok = {"type": "BlockRemoved", "block_hashes": [1, 2]}
    payload = enc([1.0, [big, ok], 0])
    t0 = time.process_time()
    b = decode_batch(payload)
    assert time.process_time() - t0 < 0.05  # the 3M hashes were never built
    assert b.malformed == 1 and [e.kind for e in b.events] == ["removed"]
    assert f"cap {MAX_EVENT_BLOCKS}" in b.problems[0]
    # the same refusal on the slow path (hashes as bytes, the pre-0.24 array form)
    old = ["BlockStored", [b"\x01"] * (MAX_EVENT_BLOCKS + 1), None, [], 16, None, "GPU"]
    b = decode_batch(enc([1.0, [old, ok], 0]))
    assert b.malformed == 1 and len(b.events) == 1
    # many events each under the event cap, together past the batch's
    per = MAX_EVENT_BLOCKS // 2
    n = MAX_BATCH_BLOCKS // per + 1
    events = [{"type": "BlockRemoved", "block_hashes": list(range(i * per, (i + 1) * per))}
              for i in range(n)]
    with pytest.raises(WireError) as err:
        decode_batch(enc([1.0, events, 0]))
    assert err.value.kind == "too_large" and str(MAX_BATCH_BLOCKS) in str(err.value)
    # exactly at the cap is fine
    events = [{"type": "BlockRemoved", "block_hashes": list(range(i * per, (i + 1) * per))}
              for i in range(MAX_BATCH_BLOCKS // per)]
    assert sum(len(e.block_hashes) for e in decode_batch(enc([1.0, events, 0])).events) == MAX_BATCH_BLOCKS


@pytest.mark.parametrize("rank", [-1, -(1 << 63), (1 << 63) - 1, 1024])
def test_a_dp_rank_outside_0_1023_is_malformed(rank):
    payload = msgspec.msgpack.encode([1.0, [{"type": "AllBlocksCleared"}], rank])
    with pytest.raises(WireError) as err:
        decode_batch(payload)
    assert err.value.kind == "malformed" and "data_parallel_rank" in str(err.value)
    assert decode_batch(msgspec.msgpack.encode([1.0, [], 1023])).dp_rank == 1023
