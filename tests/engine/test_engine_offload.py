"""The prefix cache's offload tier on the toy model: evicted prefixes come back from host
memory or disk instead of being recomputed, every injected restore failure falls back to
recompute for that request alone, and the greedy tokens never change."""

from __future__ import annotations

import os
import random

import pytest
import torch
from engine_toy_model import CFG, ToyModel, one_torch_thread, oracle_greedy  # noqa: F401

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.errors import CtxlabError
from ctxlab.kv.offload_tier import DISK, HOST, OffloadTier

MODEL = ToyModel(seed=3)
N_OUT = 4
BS = 4
PREFIX, SUFFIX = 32, 6  # 8 blocks of prefix; a request needs 11 of the pool's 12 blocks
POOL = 48


def _workload(groups: int = 4, rounds: int = 2, seed: int = 0) -> list[list[int]]:
    """Interleaved prefixes (A B C D A B C D): on this pool each evicts the one before."""
    rng = random.Random(seed)
    pre = [[rng.randrange(CFG.vocab_size) for _ in range(PREFIX)] for _ in range(groups)]
    out = []
    for _ in range(rounds):
        for p in pre:
            out.append(p + [rng.randrange(CFG.vocab_size) for _ in range(SUFFIX)])
    return out


PROMPTS = _workload()
EXPECTED = [oracle_greedy(MODEL, p, N_OUT) for p in PROMPTS]
BLOCK_BYTES = 2 * 4 * BS * CFG.head_dim * 8  # K and V, 4 lanes, float64


def _engine() -> LLMEngine:
    return LLMEngine(
        MODEL, CFG, kv_pool_tokens=POOL, block_size=BS, max_num_batched_tokens=64, max_num_seqs=1
    )


def _run(eng: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=N_OUT)
    outs = []
    for p in prompts:  # one at a time: the order of evictions is the order of prompts
        outs.extend(o.token_ids for o in eng.run_all([eng.add_request(p, params)]))
    return outs


def test_without_tier_the_second_round_recomputes():
    eng = _engine()
    assert _run(eng, PROMPTS) == EXPECTED
    st = eng.stats()
    assert st.cached_blocks_evicted > 0
    assert st.prefix_cache_hits == 0  # every prefix was evicted before it came back


@pytest.mark.parametrize("where", ["host", "disk", "host+disk"])
def test_tier_restores_evicted_prefixes_with_the_same_tokens(where, tmp_path):
    eng = _engine()
    host = {"host": 64 * BLOCK_BYTES, "disk": 0, "host+disk": 3 * BLOCK_BYTES}[where]
    directory = None if where == "host" else str(tmp_path)
    off = eng.attach_offload(host, directory)
    assert _run(eng, PROMPTS) == EXPECTED
    st = off.stats()
    # the second round finds all 8 prefix blocks of each group in the tier (4 groups)
    assert st.external_prefix_cache_hits == 4 * PREFIX
    assert eng.stats().prefix_cache_hits == 4 * PREFIX
    if where == "host":
        assert st.restored_tokens_host == 4 * PREFIX and st.restored_tokens_disk == 0
    elif where == "disk":
        assert st.restored_tokens_disk == 4 * PREFIX and st.restored_tokens_host == 0
    else:  # the host holds only 3 blocks: most come back from disk, LRU across tiers
        assert st.restored_tokens_disk > 0 and st.kv_offload_demote_bytes > 0
    assert st.kv_offload_load_bytes == 4 * (PREFIX // BS) * BLOCK_BYTES
    assert st.kv_offload_store_bytes >= st.kv_offload_load_bytes
    assert not any(st.restore_failures.values())
    assert st.load_wait_p50_s >= 0 and len(off.transfers.waits["load"]) == 4
    outs = [o for o in eng.seqs.values()]
    assert not outs
    eng.kv.alloc.check_invariants()
    off.close()


def _corrupt(directory: str, kind: str) -> int:
    """Damage every block file of the tier's directory the way `kind` says; how many."""
    files = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs]
    for path in files:
        if kind == "missing":
            os.unlink(path)
        elif kind == "checksum":
            with open(path, "r+b") as f:
                f.seek(9)
                b = f.read(1)
                f.seek(9)
                f.write(bytes([b[0] ^ 0xFF]))
        else:  # an I/O error: the path is a directory now, so reading it fails
            os.unlink(path)
            os.mkdir(path)
    return len(files)


@pytest.mark.parametrize("kind", ["missing", "checksum", "io"])
def test_a_failed_restore_recomputes_that_request_alone(kind, tmp_path):
    eng = _engine()
    off = eng.attach_offload(0, str(tmp_path))  # disk only
    first = _run(eng, PROMPTS[:4])
    off.transfers.drain()
    assert _corrupt(str(tmp_path), kind) > 0
    second = _run(eng, PROMPTS[4:])
    assert first + second == EXPECTED
    st = off.stats()
    assert st.restore_failures[kind] > 0
    assert sum(st.restore_failures.values()) == st.restore_failures[kind]
    assert st.recomputed_after_failure_tokens > 0
    # the prompts whose files were damaged computed their prefix again
    assert st.external_prefix_cache_hits + st.recomputed_after_failure_tokens <= 4 * PREFIX
    eng.kv.alloc.check_invariants()
    off.close()


def test_one_damaged_block_fails_only_its_request(tmp_path):
    eng = _engine()
    off = eng.attach_offload(0, str(tmp_path))
    _run(eng, PROMPTS[:4])
    off.transfers.drain()
    first_group = eng.kv.new_seq()
    eng.kv._extend_hashes(first_group, PROMPTS[0], None, PREFIX // BS)
    os.unlink(off.tier.path(first_group.block_hashes[0]))
    assert _run(eng, PROMPTS[4:]) == EXPECTED[4:]
    st = off.stats()
    assert st.restore_failures["missing"] == 1
    assert st.recomputed_after_failure_tokens == PREFIX  # A's whole prefix
    # B, C and D's prefixes were still restored (A's recompute evicted D: stored again)
    assert st.external_prefix_cache_hits >= 2 * PREFIX
    off.close()


def test_tier_lru_runs_across_host_and_disk(tmp_path):
    shape = ((2, 4, 8), (2, 4, 8))
    t = OffloadTier(shape, torch.float32, 2 * 512, str(tmp_path), disk_bytes=2 * 512)
    assert t.block_bytes == 512
    blocks = {
        bytes([i]): (torch.full((2, 4, 8), float(i)), torch.full((2, 4, 8), -float(i)))
        for i in range(6)
    }
    for h, (k, v) in blocks.items():
        t.put(h, k, v)
    # newest two in host, the two before on disk, the oldest two dropped
    assert list(t.index[HOST]) == [bytes([4]), bytes([5])]
    assert list(t.index[DISK]) == [bytes([2]), bytes([3])]
    assert t.dropped_blocks == 2
    got = t.load([bytes([3]), bytes([5])]).result()
    for (k, v), i in zip(got, (3, 5), strict=True):
        assert torch.equal(k, blocks[bytes([i])][0]) and torch.equal(v, blocks[bytes([i])][1])
    assert t.where(bytes([3])) is None and t.where(bytes([5])) is None
    assert t.load_bytes == {HOST: 512, DISK: 512}
    t.close()
    assert not os.listdir(tmp_path)  # the tier's own folder is gone


def test_bad_tier_options_are_one_sentence(tmp_path):
    with pytest.raises(CtxlabError, match="neither host memory nor a directory"):
        _engine().attach_offload(0, None)
    with pytest.raises(CtxlabError, match="non-negative"):
        _engine().attach_offload(-1, None)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CtxlabError, match="cannot be created"):
        _engine().attach_offload(0, str(blocker / "sub"))
    eng = LLMEngine(MODEL, CFG, kv_pool_tokens=POOL, block_size=BS, enable_prefix_caching=False)
    with pytest.raises(CtxlabError, match="enable prefix caching"):
        eng.attach_offload(1 << 20, None)


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_transfer_profile_is_fitted_and_leaves_nothing_behind(tier, tmp_path):
    eng = _engine()
    off = eng.attach_offload(1 << 20, str(tmp_path))
    free = eng.kv.alloc.num_free
    prof = off.measure_profile(tier, sizes=(1, 2, 4), repeats=2)
    assert prof.bandwidth_bytes_per_s > 0 and prof.latency_s >= 0
    assert [p[0] for p in prof.points] == [1, 2, 4]
    assert prof.block_bytes == BLOCK_BYTES
    st = off.stats()
    assert st.host_blocks == st.disk_blocks == 0 and st.kv_offload_load_bytes == 0
    assert eng.kv.alloc.num_free == free
    eng.kv.alloc.check_invariants()
    assert _run(eng, PROMPTS) == EXPECTED
    off.close()


def test_a_profile_whose_times_do_not_grow_is_an_upper_bound_not_unbounded(monkeypatch):
    """On a busy machine the restore medians may not grow with the bytes; the fit then cannot
    tell latency from bandwidth (it said 931,322 GiB/s: a clamped slope) and is priced at the
    largest restore's rate instead, marked unresolved."""
    import ctxlab.kv.prefix_offload as po

    eng = _engine()
    off = eng.attach_offload(1 << 20, None)
    clock = iter(range(10_000))
    monkeypatch.setattr(po.time, "perf_counter", lambda: next(clock) * 0.5)  # a fixed tick
    prof = off.measure_profile("host", sizes=(1, 2, 4), repeats=2)
    took = {t for _, t in prof.points}
    assert len(took) == 1 and min(took) > 0  # every size took the same time
    assert not prof.resolved and prof.latency_s == 0.0
    assert prof.bandwidth_bytes_per_s == pytest.approx(4 * BLOCK_BYTES / min(took))
    assert prof.seconds(4 * BLOCK_BYTES) == pytest.approx(min(took))  # the largest, exactly
    off.close()
