"""Demonstration 4 through a server that publishes its KV events (`[[servers]] kv_events`):
the evicted blocks are counted from the events (BlockRemoved while each order ran), not
inferred. The run through the session's `ctxlab serve`, which publishes vLLM's format
(tests/kvevents), is read in tests/probe/test_workshop_server.py; here the counting windows
and the key's bad values."""

from __future__ import annotations

import pytest

from tests.probe.test_workshop_server import workshop

pytest.importorskip("zmq")
pytest.importorskip("msgpack")


def test_a_kv_events_key_off_loopback_is_one_sentence(tmp_path):
    config = tmp_path / "servers.toml"
    config.write_text(
        '[[servers]]\nlabel = "vllm"\nurl = "http://127.0.0.1:9"\n'
        'kv_events = "tcp://192.168.1.2:5557"\n'
    )
    run = workshop(tmp_path / "out", str(config), "--only", "4")
    assert run.res.code == 2 and len(run.res.err_lines) == 1, run.res.err
    assert "kv_events" in run.res.err and "not on this machine's loopback" in run.res.err


def _listener(batches: int, gaps: list | None = None):
    from types import SimpleNamespace

    sub = SimpleNamespace(received_batches=batches, gaps=gaps or [], dropped_events=0)
    return SimpleNamespace(endpoint="ipc:///tmp/x", subscriber=sub)


def test_removals_are_counted_per_order_window():
    from ctxlab.kvevents.events import BlockRemoved, BlockStored, EventBatch
    from ctxlab.kvevents.residency import Residency
    from ctxlab.kvevents.subscriber import Gap
    from ctxlab.workshop.server_eviction import evictions_from_events

    stored = BlockStored(tuple(range(1, 7)), None, tuple(range(6 * 4)), 4)
    later = BlockStored(tuple(range(7, 10)), None, tuple(range(100, 100 + 3 * 4)), 4)
    batches = [
        EventBatch(0, 10.0, (stored,)),
        EventBatch(1, 11.0, (BlockRemoved((1,)),)),  # grouped: one of its own
        # interleaved starts on the blocks grouped left: making room is not its eviction
        EventBatch(2, 20.0, (BlockRemoved((2, 3)),)),
        EventBatch(3, 21.0, (later,)),
        EventBatch(4, 29.0, (BlockRemoved((4, 7, 8)),)),  # two of its own, one older
    ]
    res = Residency().feed_all(batches)
    assert evictions_from_events(_listener(5), res, [10.0, 20.0]) == [1, 2]
    # a block stored before the stream was read has no known age: never counted
    unknown = Residency().feed_all([EventBatch(0, 12.0, (BlockRemoved((42,)),))])
    assert evictions_from_events(_listener(1), unknown, [10.0, 20.0]) == [0, 0]
    silent = evictions_from_events(_listener(0), Residency(), [10.0, 20.0])
    assert isinstance(silent, str) and silent.startswith("no KV events arrived")
    missed = evictions_from_events(_listener(5, [Gap(5, 6)]), res, [10.0, 20.0])
    assert isinstance(missed, str) and "2 batches" in missed
