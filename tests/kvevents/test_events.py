"""The KV-event decoder against vLLM's wire layout, the subscriber's gaps, replay and
memory cap, and residency read from a stream (capacity, evictions, miss reasons)."""

from __future__ import annotations

import time

import msgpack
import pytest

from ctxlab.errors import CtxlabError
from ctxlab.kvevents.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_frames,
    decode_payload,
    encode_frames,
)
from ctxlab.kvevents.publisher import EventPublisher, block_id
from ctxlab.kvevents.residency import Request, Residency, count_evictions, first_eviction
from ctxlab.kvevents.subscriber import Subscriber, check_loopback
from tests.servers import free_port

# What vLLM 0.32.0's own encoder (msgspec, `KVEventBatch`) wrote for a batch of a
# BlockStored (hashes b"ab" and 7), a BlockStored with extra_keys and group_idx, a
# BlockRemoved and an AllBlocksCleared; captured once in vLLM's environment.
VLLM_PAYLOAD = (
    b"\x93\xcb?\xf8\x00\x00\x00\x00\x00\x00\x94\x88\xa4type\xabBlockStored\xacblock_hashes"
    b"\x92\xc4\x02ab\x07\xb1parent_block_hash\xc0\xa9token_ids\x92\x01\x02\xaablock_size\x02"
    b"\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0\x8a\xa4type\xabBlockStored\xacblock_"
    b"hashes\x92\xc4\x02ab\x07\xb1parent_block_hash\xc4\x01x\xa9token_ids\x92\x01\x02\xaa"
    b"block_size\x02\xa7lora_id\xc0\xa6medium\xa3GPU\xa9lora_name\xc0\xaaextra_keys\x92\x91"
    b"\xa4salt\xc0\xa9group_idx\x00\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91\x07\xa6"
    b"medium\xa3GPU\x81\xa4type\xb0AllBlocksCleared\xc0"
)


def test_decodes_vllm_own_bytes():
    b = decode_payload(VLLM_PAYLOAD, seq=5)
    assert b.seq == 5 and b.ts == 1.5 and b.data_parallel_rank is None and b.unknown == 0
    s1, s2, rm, cl = b.events
    assert s1 == BlockStored((b"ab", 7), None, (1, 2), 2, "GPU")
    assert s2.parent == b"x" and s2.group_idx == 0 and s2.salt() == "salt"
    assert rm == BlockRemoved((7,), "GPU")
    assert cl == AllBlocksCleared()


def test_hand_built_frames_unknown_fields_and_types_are_skipped():
    stored = {
        "type": "BlockStored",
        "block_hashes": [11, 12],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "a_field_from_the_future": {"x": [1, 2]},
    }
    future = {"type": "BlockPromoted", "block_hashes": [11]}
    old_array_form = ["BlockRemoved", [12], "GPU"]
    payload = msgpack.packb([2.0, [stored, future, old_array_form, 42], 0, "extra"])
    b = decode_frames([b"kv", (9).to_bytes(8, "big"), payload])
    assert (b.seq, b.topic, b.data_parallel_rank, b.unknown) == (9, "kv", 0, 2)
    assert b.events == (
        BlockStored((11, 12), None, (1, 2, 3, 4), 2, "GPU"),
        BlockRemoved((12,), "GPU"),
    )


def test_encoder_round_trip():
    events = (
        BlockStored((1, 2), 9, (5, 6, 7, 8), 2, "GPU", extra_keys=(("t1",), None)),
        BlockRemoved((1,), "GPU"),
        AllBlocksCleared(),
    )
    b = decode_frames(encode_frames(3, 4.5, events, topic="t"))
    assert b == EventBatch(3, 4.5, events, 0, 0, "t")


@pytest.mark.parametrize(
    "frames",
    [
        [b"", (0).to_bytes(8, "big")],
        [b"", b"\x00", msgpack.packb([1.0, []])],
        [b"", (0).to_bytes(8, "big"), b"\xc1"],
        [b"", (0).to_bytes(8, "big"), msgpack.packb({"ts": 1})],
    ],
)
def test_broken_frames_are_one_sentence(frames):
    with pytest.raises(CtxlabError):
        decode_frames(frames)


@pytest.mark.parametrize("bad", ["tcp://10.0.0.1:5557", "tcp://*:5557", "udp://x", "tcp://h"])
def test_only_loopback_endpoints(bad):
    with pytest.raises(CtxlabError):
        check_loopback(bad)


def _stream(pub_port: int, replay_port: int | None = None):
    ep = f"tcp://127.0.0.1:{pub_port}"
    rep = None if replay_port is None else f"tcp://127.0.0.1:{replay_port}"
    return ep, rep


def _raw_pub(port: int):
    import zmq

    s = zmq.Context.instance().socket(zmq.PUB)
    s.setsockopt(zmq.LINGER, 0)
    s.bind(f"tcp://127.0.0.1:{port}")
    return s


def _send_until_seen(pub, sub, frames_list):
    """PUB drops messages until the SUB's subscription arrives: resend the first until seen."""
    for _ in range(100):
        pub.send_multipart(frames_list[0])
        if sub.poll(0.05):
            break
    else:
        raise AssertionError("the subscriber never connected")
    for f in frames_list[1:]:
        pub.send_multipart(f)
    end = time.monotonic() + 5
    while sub.last_seq != int.from_bytes(frames_list[-1][1], "big") and time.monotonic() < end:
        sub.poll(0.05)


def test_gap_is_detected_and_memory_is_capped():
    port = free_port()
    pub = _raw_pub(port)
    ep, _ = _stream(port)
    one = (BlockRemoved((1,), "GPU"),)
    frames = [encode_frames(s, float(s), one * 3) for s in (0, 1, 2, 5, 6)]
    with Subscriber(ep, max_events=7) as sub:
        _send_until_seen(pub, sub, frames)
        assert sub.gaps and sub.gaps[0].first == 3 and sub.gaps[0].last == 4
        assert sub.gaps[0].missing == 2
        assert sub.n_events <= 7 and sub.dropped_events > 0
        assert sub.n_events + sub.dropped_events == 3 * sub.received_batches
    pub.close()


def test_publisher_replays_what_a_subscriber_missed():
    port, rport = free_port(), free_port()
    ep, rep = _stream(port, rport)
    publisher = EventPublisher(ep, rep)
    try:
        # batches published before anyone listens are lost on PUB but kept for replay
        publisher.removed([b"\x00" * 16])
        time.sleep(0.3)
        with Subscriber(ep, replay_endpoint=rep, expect_from=0) as sub:
            for _ in range(100):  # until the subscription is through
                publisher.removed([b"\x01" * 16])
                if sub.poll(0.05):
                    break
            assert sub.gaps and sub.gaps[0].first == 0
            assert sub.gaps[0].replayed == sub.gaps[0].last + 1  # every missed batch came back
            seqs = [r.batch.seq for r in sub.batches]
            assert seqs == list(range(len(seqs)))  # replayed in order, no duplicates
            assert sub.batches[0].batch.events == (BlockRemoved((block_id(b"\x00" * 16),), "GPU"),)
    finally:
        publisher.close()


def _b(seq: int, ts: float, *events) -> EventBatch:
    return EventBatch(seq, ts, tuple(events))


def test_residency_capacity_lifetimes_and_miss_reasons():
    bs = 2
    a = list(range(10, 16))  # 3 blocks
    batches = [
        _b(0, 1.0, BlockStored((1, 2, 3), None, tuple(a), bs)),
        _b(1, 2.0, BlockStored((4,), None, (10, 11), bs, extra_keys=(("tenant-b",),))),
        _b(2, 3.0, BlockStored((5,), 2, (90, 91), bs)),  # a branch off block 2
        _b(3, 4.0, BlockRemoved((3,))),
        _b(4, 6.0, BlockStored((3,), 2, (14, 15), bs)),  # the same content again: reuse gap
        _b(5, 7.0, AllBlocksCleared()),
    ]
    r = Residency().feed_all(batches)
    assert [n for _, n in r.timeline] == [3, 4, 5, 4, 5, 0]
    assert r.first is not None and r.first.resident_blocks == 5 and r.first.tokens == 10
    assert list(r.lifetimes) == [3.0, 6.0, 6.0, 5.0, 4.0, 1.0] and list(r.reuse_gaps) == [2.0]
    assert len(r.evictions) == 1 and r.cleared == 1  # a reset is not an eviction
    assert first_eviction(batches) == r.first
    assert count_evictions(batches, 0.0, 3.5) == 0 and count_evictions(batches, 0.0, 5.0) == 1

    def why(at, tokens, salt=None):
        return r.explain(Request(at, tuple(tokens), salt))

    assert why(1.5, [10, 11]).reason == "shorter than one block"
    full = why(3.5, [*a, 99])
    assert (full.reason, full.hit_blocks, full.shareable_blocks) == ("hit", 3, 3)
    ev = why(5.0, [*a, 99])
    assert (ev.reason, ev.hit_blocks, ev.evicted_at) == ("evicted", 2, 4.0)
    assert why(6.5, [*a, 99]).reason == "hit"  # stored again at 6.0
    assert why(3.5, [50, 51, 52]).reason == "never stored"
    assert why(0.5, [*a, 99]).reason == "never stored"  # sent before it was stored
    other = why(3.5, [10, 11, 12], salt="tenant-c")
    assert (other.reason, other.hit_blocks) == ("another salt", 0)
    assert why(3.5, [10, 11, 12], salt="tenant-b").hit_blocks == 1


def test_residency_records_are_bounded():
    r = Residency(max_records=10)
    for i in range(100):
        r.feed(_b(i, float(i), BlockStored((i,), None, (i, i), 2), BlockRemoved((i,))))
    assert len(r.timeline) == 10 and len(r.evictions) == 10 and len(r.lifetimes) == 10
    assert len(r._history) <= 10 and len(r._removed_at) <= 10
    assert r.stored_total == 100 and r.removed_total == 100


def test_a_taken_port_is_one_sentence():
    ep = f"tcp://127.0.0.1:{free_port()}"
    first = EventPublisher(ep)
    try:
        with pytest.raises(CtxlabError, match="cannot publish KV events"):
            EventPublisher(ep)
    finally:
        first.close()


def test_the_first_eviction_is_of_a_block_seen_stored():
    """A removal of a block stored before listening comes first on a warm server: it must not
    read as 'the pool was full with 0 blocks'."""
    bs = 2
    batches = [
        _b(0, 1.0, BlockRemoved((77,))),  # stored before the stream was read
        _b(1, 2.0, BlockStored((1, 2), None, (10, 11, 12, 13), bs)),
        _b(2, 3.0, BlockRemoved((1,))),
    ]
    r = Residency().feed_all(batches)
    assert r.removed_unknown == 1 and len(r.evictions) == 2
    assert r.first is not None and (r.first.at, r.first.resident_blocks) == (3.0, 2)
