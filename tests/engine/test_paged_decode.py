"""The compiled paged decode attention against the torch reference, and the fallbacks.

`decode_attention` runs the kernel's C loops where a C compiler built them, else its numba
loops; forcing it off (`paged_decode.set_enabled(False)`) runs the gather + SDPA reference
over the same pool and tables. Each implementation is checked against the reference on
random shapes: GQA groups, lengths that are not a multiple of the block size, block tables
in a scrambled order with holes (masked slots and whole masked blocks), float32, bfloat16
and int8 pools; within a float tolerance (they sum in different orders). Shapes the C loops
do not take (heads of 8) run numba's. A process where `import numba` fails still decodes,
through the reference; one with `CTXLAB_NATIVE=off` through numba's loops.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.engine.decode_attention import decode_attention
from ctxlab.engine.kernels import paged_decode as pd
from ctxlab.kv import KVLayout, KVPool, QuantKVPool

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore():
    yield
    pd.set_enabled(None)


def c_loops_built() -> bool:
    pd.set_enabled("c")
    built = pd.backend() == "c"
    pd.set_enabled(None)
    return built


# the kernel's implementations this machine has: numba's always, C where a compiler built it
IMPLS = ["numba", "c"] if c_loops_built() else ["numba"]


def both(q, pool, table, mask=None, length=None, impl="numba"):
    """(kernel, reference) outputs of the engine's decode attention on the same inputs."""
    pd.set_enabled(impl)
    assert pd.backend() == impl
    assert pd.paged_decode(q, pool, table, mask, length) is not None  # the kernel serves it
    got, _ = decode_attention(q, pool, table, mask, length)
    pd.set_enabled(False)
    want, _ = decode_attention(q, pool, table, mask, length)
    return got, want


def make_pool(kind: str, layout: KVLayout, n_blocks: int, gen: torch.Generator):
    if kind == "int8":
        pool = QuantKVPool(layout, n_blocks, "int8")
        bs = layout.block_size
        rows = torch.arange(n_blocks * bs).view(n_blocks, bs)
        k = torch.randn(n_blocks, bs, layout.head_dim, generator=gen)
        v = torch.randn(n_blocks, bs, layout.head_dim_v, generator=gen)
        pool.write(rows, k, v)
        return pool
    pool = KVPool(layout, n_blocks)
    pool.data.copy_(torch.randn(pool.data.shape, generator=gen))
    return pool


TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["f32", "bf16", "int8"]),
    B=st.integers(1, 5),
    n_kv=st.integers(1, 3),
    group=st.sampled_from([1, 2, 3, 4, 5]),
    d=st.sampled_from([8, 16, 64, 128]),
    bs=st.sampled_from([4, 16, 32]),
    n_keys=st.integers(1, 90),
    holes=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_kernel_matches_reference(impl, kind, B, n_kv, group, d, bs, n_keys, holes, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    layout = KVLayout(1, n_kv, d, d, block_size=bs, dtype=dtype)
    nb = -(-n_keys // bs)
    n_blocks = B * n_kv * nb + 3
    pool = make_pool(kind, layout, n_blocks, gen)
    table = torch.randperm(n_blocks, generator=gen)[: B * n_kv * nb].view(B, n_kv, nb)
    q = torch.randn(B, n_kv, group, d, generator=gen).to(dtype)
    if not holes:
        got, want = both(q, pool, table, length=n_keys, impl=impl)
    else:
        L = n_keys
        mask = torch.rand(B, n_kv, 1, L, generator=gen) < 0.7
        if nb > 1:  # a whole block given back: its table entry is a hole (block 0)
            mask[:, 0, :, :bs] = False
            table[:, 0, 0] = 0
        mask[..., L - 1] = True  # every lane keeps at least its newest key
        got, want = both(q, pool, table, mask=mask, impl=impl)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.isa
@pytest.mark.skipif("c" not in IMPLS, reason="no C compiler: the C loops are not built")
@pytest.mark.parametrize("kind", ["f32", "bf16", "int8"])
@pytest.mark.parametrize("d, group", [(64, 3), (256, 4), (32, 16), (8, 3), (64, 17)])
def test_c_loops_agree_with_numba(kind, d, group):
    """The C loops and numba's compute the same attention to float32 rounding, Gemma's heads
    of 256 and 16 query heads per KV head included; heads of 8 and 17 query heads are not
    shapes the C loops take, and the call still answers (numba's loop)."""
    gen = torch.Generator().manual_seed(d + group)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    layout = KVLayout(1, 2, d, d, block_size=16, dtype=dtype)
    pool = make_pool(kind, layout, 24, gen)
    table = torch.randperm(24, generator=gen)[:20].view(2, 2, 5)
    q = torch.randn(2, 2, group, d, generator=gen)
    mask = torch.rand(2, 2, 1, 77, generator=gen) < 0.6
    mask[..., -1] = True
    out = {}
    for impl in ("c", "numba"):
        pd.set_enabled(impl)
        out[impl] = (
            decode_attention(q, pool, table, length=73)[0],
            decode_attention(q, pool, table, mask=mask)[0],
        )
    for got, want in zip(out["c"], out["numba"], strict=True):
        torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)


def test_without_a_compiler_numba_runs():
    """`CTXLAB_NATIVE=off` (as a machine without a C compiler): numba's loops decode."""
    code = (
        "from ctxlab.engine.kernels import paged_decode as pd\n"
        "assert pd.backend() == 'numba', pd.backend()\n"
        "from ctxlab import native\n"
        "from ctxlab.engine.kernels import c_decode\n"
        "assert c_decode.library() is None and native.why_not('paged_decode')\n"
        "print('ok')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "CTXLAB_NATIVE": "off"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_kivi_pool_falls_back_to_reference():
    layout = KVLayout(1, 1, 16, 16, block_size=16)
    pool = QuantKVPool(layout, 4, "kivi4")
    q = torch.randn(1, 1, 2, 16)
    assert pd.paged_decode(q, pool, torch.zeros(1, 1, 1, dtype=torch.int64), length=4) is None


def test_env_var_forces_the_reference(monkeypatch):
    monkeypatch.setenv(pd.ENV, "torch")
    pd.set_enabled(None)
    assert pd.backend() == "torch"
    layout = KVLayout(1, 1, 8, 8, block_size=4)
    pool = KVPool(layout, 2)
    q = torch.randn(1, 1, 1, 8)
    assert pd.paged_decode(q, pool, torch.zeros(1, 1, 1, dtype=torch.int64), length=3) is None


def test_without_numba_the_engine_still_decodes():
    """`import numba` fails in this process: the toy engine decodes through the reference."""
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "from ctxlab.engine.kernels import paged_decode as pd\n"
        "assert pd.backend() == 'torch', pd.backend()\n"
        "import torch\n"
        "from ctxlab.engine.decode_attention import decode_attention\n"
        "from ctxlab.kv import KVLayout, KVPool\n"
        "pool = KVPool(KVLayout(1, 2, 8, 8, block_size=4), 6)\n"
        "pool.data.normal_()\n"
        "o, _ = decode_attention(torch.randn(2, 2, 3, 8), pool,"
        " torch.arange(6).view(2, 1, 3).expand(2, 2, 3).contiguous(), length=10)\n"
        "assert o.shape == (2, 2, 3, 8) and bool(o.isfinite().all())\n"
        "print('ok', pd._state['why'])\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok numba is not importable")


def unshared(pool: KVPool, table: torch.Tensor) -> torch.Tensor:
    """`table` with every block that several lanes name copied to a block of its own (same
    rows): the same attention, with nothing shared."""
    fresh, seen, next_free = table.clone(), set(), int(table.max()) + 1
    for idx in range(table.numel()):
        blk = int(table.view(-1)[idx])
        if blk in seen:
            pool.data[:, next_free] = pool.data[:, blk]
            fresh.view(-1)[idx] = next_free
            next_free += 1
        seen.add(blk)
    return fresh


@pytest.mark.isa
@pytest.mark.skipif("c" not in IMPLS, reason="no C compiler: the C loops are not built")
@pytest.mark.parametrize("kind", ["f32", "bf16"])
@pytest.mark.parametrize(("B", "group"), [(4, 3), (5, 5), (3, 16), (6, 1)])
@pytest.mark.parametrize("masked", [False, True])
def test_sequences_sharing_a_prefix_read_it_once_with_the_same_answer(kind, B, group, masked):
    """Sequences whose tables start with the same blocks (the prefix cache's sharing) fold
    those blocks together; each output must be bit for bit the one it gets when the blocks
    are copies: one sequence diverging after two blocks, lengths that end mid-block, a mask
    with a hole inside a shared block."""
    gen = torch.Generator().manual_seed(B * 100 + group)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    bs, nb, n_kv, d = 16, 6, 2, 64
    layout = KVLayout(1, n_kv, d, d, block_size=bs, dtype=dtype)
    pool = make_pool(kind, layout, 4 * B * n_kv * nb, gen)
    prefix = torch.arange(n_kv * 4).view(n_kv, 4)  # 4 blocks every sequence starts with
    own = torch.arange(n_kv * 4, n_kv * 4 + B * n_kv * 2).view(B, n_kv, 2)
    table = torch.cat((prefix.expand(B, n_kv, 4), own), -1).contiguous()
    table[B - 1, :, 2:4] = own[B - 1] + B * n_kv * 2  # the last one diverges after 2 blocks
    q = torch.randn(B, n_kv, group, d, generator=gen)
    mask = None
    if masked:
        mask = torch.ones(B, n_kv, 1, nb * bs - 5, dtype=torch.bool)
        mask[0, 1, 0, 20] = False  # a hole in the second shared block of one lane
        mask[1, :, 0, 90:] = False  # a shorter sequence
    pd.set_enabled("c")
    got = decode_attention(q, pool, table, mask=mask, length=nb * bs - 7)[0]
    apart = decode_attention(q, pool, unshared(pool, table), mask=mask, length=nb * bs - 7)[0]
    assert torch.equal(got, apart)
    pd.set_enabled(False)
    want = decode_attention(q, pool, table, mask=mask, length=nb * bs - 7)[0]
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
