"""The prefix cache's event hook tells the truth: after any random operation sequence, the
blocks stored and not removed are exactly the hash map's keys, and every stored block's
token ids hash (with its parent and salt) to the hash it was stored under. (These short
random runs evict into the offload tier but seldom restore from it; a restore's store is
checked through a real server in test_serve_events.py.)"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxlab.kv import hash_block
from tests.kv.test_pool_properties import BS, LAYOUT, WINDOWED, Model, op


class Recorder:
    def __init__(self, extra: tuple[str, ...]):
        self.extra = extra
        self.resident: set[bytes] = set()
        self.stores = 0

    def stored(
        self,
        hashes: Sequence[bytes],
        parent: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        salt: str | None,
    ) -> None:
        assert block_size == BS and len(token_ids) == len(hashes) * BS
        extra = (*self.extra, f"salt={salt}" if salt is not None else "nosalt")
        for i, h in enumerate(hashes):
            parent = hash_block(parent, token_ids[i * BS : (i + 1) * BS], extra)
            assert parent == h, "a stored block's tokens do not hash to its hash"
            assert h not in self.resident, "stored twice without a removal"
            self.resident.add(h)
        self.stores += len(hashes)

    def removed(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            assert h in self.resident, "removed a block never stored"
            self.resident.remove(h)


@pytest.mark.parametrize(
    ("layout", "offload"),
    [(LAYOUT, False), (WINDOWED, False), (LAYOUT, True)],
    ids=["full", "windowed", "offload"],
)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), pool_tokens=st.integers(4, 40))
def test_events_mirror_the_hash_map(layout, offload, ops, pool_tokens):
    m = Model(pool_tokens, True, layout, offload=offload)
    rec = Recorder(m.kv.extra)
    m.kv.observe(rec)
    for name, a, b in ops:
        if name == "start":
            m.start(list(a), b)
        elif m.seqs:
            i = a % len(m.seqs)
            if name == "append":
                m.append(i, b)
            elif name == "free":
                m.free(i)
            else:
                m.compact(i, b, 2)
        assert rec.resident == set(m.kv.alloc.cached)
    assert rec.stores >= len(m.kv.alloc.cached)
    if m.offload is not None:
        m.offload.close()
