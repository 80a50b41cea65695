"""The compiled K/V row write (`kv/row_write.c`) against aten's, and where it stays out.

A write must land each token's heads at exactly the slots named (a wrong stride or slot
corrupts another sequence's cache), round to bfloat16 as torch does (ties to even, NaN, inf,
denormals), and write nothing when a slot is out of range. Marked `isa`: the second
instruction set reruns them.
"""

from __future__ import annotations

import pytest
import torch

from ctxlab import native
from ctxlab.kv import row_write
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.pool import KVPool

pytestmark = pytest.mark.isa
built = pytest.mark.skipif(
    row_write.kernel() is None, reason=f"not built: {native.why_not('row_write')}"
)


def fused_qkv(tokens: int, heads: int, width: int, seed: int) -> tuple[torch.Tensor, ...]:
    """k and v as the engine passes them: head slices of one q|k|v row per token."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, 3 * heads + 2, width, generator=g) * 4
    return qkv[:, 2 : 2 + heads], qkv[:, 2 + heads : 2 + 2 * heads]


@built
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "heads", "width"), [(1, 3, 64), (4, 3, 64), (33, 2, 80)])
def test_rows_land_where_aten_puts_them(dtype, tokens, heads, width):
    k, v = fused_qkv(tokens, heads, width, tokens)
    slots = 4 * tokens * heads
    rows = torch.randperm(slots, generator=torch.Generator().manual_seed(1))[: tokens * heads]
    rows = rows.view(tokens, heads)
    want_k, want_v = (
        torch.full((slots, width), 7.0, dtype=dtype),
        torch.zeros(slots, width, dtype=dtype),
    )
    got_k, got_v = want_k.clone(), want_v.clone()
    want_k.index_copy_(0, rows.reshape(-1), k.reshape(-1, width).to(dtype))
    want_v.index_copy_(0, rows.reshape(-1), v.reshape(-1, width).to(dtype))
    assert row_write.write_rows(got_k, got_v, rows, k, v)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@built
def test_bfloat16_rounding_is_torch_s():
    bits = torch.arange(0, 1 << 16, 7, dtype=torch.int32) << 16  # every exponent, many mantissas
    odd = (torch.arange(bits.numel(), dtype=torch.int32) % 2) << 16
    halfway = (bits | 0x8000) | odd  # exactly between two bf16 values, below odd and even
    values = torch.cat((bits, halfway, bits | 0x7FFF, bits | 0x1)).view(torch.float32)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-45, -0.0, 0.0, 0.0, 0.0])
    values = torch.cat((values[: values.numel() // 4 * 4], special))
    k = values.view(-1, 1, 4)
    rows = torch.arange(k.shape[0]).view(-1, 1)
    got = torch.zeros(k.shape[0], 4, dtype=torch.bfloat16)
    assert row_write.write_rows(got, torch.zeros_like(got), rows, k, k)
    want = k.reshape(-1, 4).to(torch.bfloat16)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


@built
def test_a_slot_out_of_range_writes_nothing():
    k, v = fused_qkv(3, 2, 16, 0)
    pool_k, pool_v = torch.zeros(12, 16), torch.zeros(12, 16)
    for bad in (12, -1):
        rows = torch.tensor([[0, 1], [2, 3], [4, bad]])
        with pytest.raises(IndexError, match="outside the pool"):
            row_write.write_rows(pool_k, pool_v, rows, k, v)
        assert not pool_k.any() and not pool_v.any()


@built
def test_cases_it_does_not_take_are_left_to_aten():
    k, v = fused_qkv(2, 2, 8, 0)
    rows = torch.tensor([[0, 1], [2, 3]])
    pool = torch.zeros(8, 8)
    assert not row_write.write_rows(pool.half(), pool.half(), rows, k, v)  # another pool dtype
    assert not row_write.write_rows(pool, pool.clone(), rows.int(), k, v)  # int32 rows
    assert not row_write.write_rows(pool, pool.clone(), rows, k.double(), v.double())
    assert not row_write.write_rows(pool, pool.clone(), rows, k.transpose(1, 2), v)
    assert not row_write.write_rows(pool[:, :4], pool[:, :4].clone(), rows, k, v)  # width


def test_the_pool_writes_the_same_with_or_without_the_kernel(monkeypatch):
    layout = KVLayout(n_layers=1, n_kv_heads=2, head_dim=16, head_dim_v=16, block_size=4)
    k, v = fused_qkv(5, 2, 16, 3)
    rows = torch.tensor([[0, 9], [1, 10], [2, 11], [3, 12], [4, 13]])
    pools = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(row_write, "kernel", lambda: None)
        pool = KVPool(layout, num_blocks=8)
        pool.write(rows, k, v)
        pools.append(pool.data.clone())
    assert torch.equal(*pools) and bool(pools[0].any())


def test_a_pool_binds_the_kernel_once_and_writes_through_it():
    """`KVPool.write` binds a `RowWriter` to its rows on the first write and uses it after:
    the rows land where aten's copy puts them."""
    if row_write.kernel() is None:
        pytest.skip("the row-write kernel is not built here")
    layout = KVLayout(n_layers=1, n_kv_heads=2, head_dim=16, head_dim_v=16, block_size=4)
    pool = KVPool(layout, num_blocks=8)
    rows = torch.tensor([[3, 9], [12, 30]])
    k, v = torch.randn(2, 2, 16), torch.randn(2, 2, 16)
    pool.write(rows, k, v)
    bound = pool._writer
    assert bound is not None and bound[1] is not None
    pool.write(rows + 1, v, k)
    assert pool._writer is bound
    got_k, got_v = pool.read_rows(torch.cat([rows.reshape(-1), rows.reshape(-1) + 1]))
    assert torch.equal(got_k, torch.cat([k.reshape(-1, 16), v.reshape(-1, 16)]))
    assert torch.equal(got_v, torch.cat([v.reshape(-1, 16), k.reshape(-1, 16)]))
    assert row_write.writer(pool._k_rows, pool._v_rows[:, :8].contiguous()) is None  # shapes differ
