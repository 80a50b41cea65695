"""ctxlab's compiled linear kernels (`gemv.c`) against exact products, and the bf16 module.

Each loop computes float32 sums of exact products, so it must match a float64 product of
the same (rounded) operands to float32's rounding: a wrong block, a dropped tail column, a
missed bias or a wrong tile layout is off by order one. Shapes cover the loops' edges: row
counts 1 to 8 (every register block), column counts that are not a multiple of the blocks,
and input sizes that are not a multiple of a vector. Marked `isa`: `tests/second_isa.py`
reruns them with the kernels built one instruction set lower (AVX2, then scalar loops).
"""

from __future__ import annotations

import copy

import pytest
import torch

from ctxlab import native
from ctxlab.model import gemv
from ctxlab.model.qlinear import BF16Linear, Int8Linear, bf16_linear, row_int8
from ctxlab.model.rotation import hadamard_signs, signed_hadamard

pytestmark = pytest.mark.isa
built = pytest.mark.skipif(
    gemv.kernels() is None, reason=f"the kernels are not built: {native.why_not('gemv')}"
)


SHAPES = [(96, 64), (37, 100), (5, 33), (960, 576), (64, 1536)]


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(((got - want).abs() / (want.abs() + 1)).max())


def exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().t()
    return (y if b is None else y + b.double()).float()


def sum_error(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> float:
    """|got - exact| over the sum of the products' magnitudes: float32 sums of exact products
    stay within a few 1e-7 of it whatever their order; a wrong term is order one."""
    scale = x.double().abs() @ w.double().abs().t() + (0 if b is None else b.double().abs()) + 1
    return float(((got.double() - exact(x, w, b).double()).abs() / scale).max())


@built
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_small_linear_is_exact_products(n, k, dtype):
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen)
    if dtype == torch.int8:
        w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    else:
        w = w.to(dtype)
    b = torch.randn(n, generator=gen)
    assert gemv.serves(w)
    for rows in range(1, gemv.MAX_ROWS + 1):
        x = torch.randn(rows, k, generator=gen)
        xr = x.bfloat16() if dtype == torch.bfloat16 else x  # bf16: the input rounded first
        assert sum_error(gemv.small_linear(x, w, b), xr, w, b) < 1e-6
        assert sum_error(gemv.small_linear(x, w), xr, w, None) < 1e-6
    x = torch.randn(2, 3, k, generator=gen)  # leading dims kept
    assert gemv.small_linear(x, w).shape == (2, 3, n)


@built
@pytest.mark.skipif(not gemv.amx(), reason="CPU without AMX tiles")
@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40])
def test_amx_tiles_are_exact_products(rows):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(192, 96, generator=gen).bfloat16()
    b = torch.randn(192, generator=gen)
    tiles = gemv.amx_pack(w)
    assert torch.equal(gemv.amx_unpack(tiles), w)
    assert not torch.equal(tiles, w)  # reordered, not the rows as they were
    x = torch.randn(rows, 96, generator=gen)
    assert sum_error(gemv.amx_linear(x, tiles, b), x.bfloat16(), w, b) < 1e-6


@built
def test_amx_takes_only_whole_tiles():
    assert gemv.amx_fits(torch.empty(64, 32)) and gemv.amx_fits(torch.empty(960, 576))
    assert not gemv.amx_fits(torch.empty(96, 64)) and not gemv.amx_fits(torch.empty(64, 48))


@built
@pytest.mark.parametrize("kernel", BF16Linear.KERNELS)
@pytest.mark.parametrize("rows", [1, 4, 9, 64])
def test_bf16_kernels_agree(kernel, rows):
    """Every kernel of the bf16 format computes the input rounded to bf16 times the bf16
    weights: ctxlab's kernels to float32's rounding, aten's within the bf16 rounding of its
    output and bias; exact weights back out; copies compute the same."""
    if kernel == "amx" and not gemv.amx():
        pytest.skip("CPU without AMX tiles")
    w, b = torch.randn(128, 64), torch.randn(128)
    lin = BF16Linear(w, b, kernel=kernel)
    assert lin.kernel == kernel
    ours = kernel == "amx" or (kernel == "loop" and rows <= gemv.MAX_ROWS)
    wb = w.to(torch.bfloat16)
    for x in (torch.randn(rows, 64), torch.randn(2, rows, 64)):
        got = lin(x)
        assert got.shape == (*x.shape[:-1], 128) and got.dtype == x.dtype
        if ours:
            assert sum_error(got.reshape(-1, 128), x.reshape(-1, 64).bfloat16(), wb, b) < 1e-6
        else:
            assert rel(got, exact(x.reshape(-1, 64).bfloat16(), wb, b).view_as(got)) < 2**-6
    assert torch.equal(lin.dense_weight(), wb)
    x = torch.randn(rows, 64)
    assert torch.equal(copy.deepcopy(lin)(x), lin(x))
    assert lin.weight_bytes() == 128 * 64 * 2 + 128 * 4  # weights bf16, bias float32


@built
def test_bf16_format_takes_the_compiled_kernels():
    lin = bf16_linear(torch.randn(128, 64))
    assert isinstance(lin, BF16Linear)
    assert lin.kernel == ("amx" if gemv.amx() else "loop")
    odd = bf16_linear(torch.randn(100, 64))  # not whole tiles: the loop
    assert isinstance(odd, BF16Linear) and odd.kernel == "loop"


@built
def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel"):
        BF16Linear(torch.randn(4, 4), kernel="fast")


@built
@pytest.mark.skipif(not gemv.amx_int8(), reason="CPU without AMX int8 tiles")
@pytest.mark.parametrize("rows", [1, 5, 16, 33])
def test_amx_int8_is_per_token_int8_exactly(rows):
    """The tile loop's arithmetic, emulated in float64: each row of x quantized at its own
    scale (max |x| / 127, round half to even), exact integer sums, both scales applied."""
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(128, 192, generator=gen)
    codes, scale = row_int8(w)
    tiles = gemv.amx_pack(codes)
    assert torch.equal(gemv.amx_unpack(tiles), codes)
    x = torch.randn(rows, 192, generator=gen)
    x[0, :7] = 0.0  # a zero stretch; and below, a row of zeros
    if rows > 1:
        x[1] = 0.0
    b = torch.randn(128, generator=gen)
    s = (x.abs().amax(1, keepdim=True) / 127).clamp_min(1e-30)
    xq = torch.round(x / s).clamp(-127, 127).double()
    want = xq @ codes.double().t() * s.double() * scale.double() + b.double()
    got = gemv.amx_int8_linear(x, tiles, scale, b)
    assert float((got.double() - want).abs().max()) < 1e-4


@built
@pytest.mark.skipif(not gemv.amx_int8(), reason="CPU without AMX int8 tiles")
@pytest.mark.parametrize(("rows", "block"), [(1, 32), (5, 16), (40, 64), (300, 32)])
def test_amx_int8_rotates_its_input_as_a_product_would(rows, block):
    """`hadamard_signs=s` is x times blockdiag(signed_hadamard) before the quantization (a
    fast Walsh-Hadamard transform in the kernel): against the kernel on rows rotated by
    torch's product, the same up to an int8 step where a rotated value's last bits sit on a
    rounding boundary; a wrong sign, stage or scale is off by order one."""
    gen = torch.Generator().manual_seed(rows + block)
    w = torch.randn(128, 192, generator=gen)
    codes, scale = row_int8(w)
    tiles = gemv.amx_pack(codes)
    m = signed_hadamard(block, seed=rows)
    signs = hadamard_signs(m)
    assert signs is not None and hadamard_signs(m.t().contiguous() * 1.5) is None
    x = torch.randn(rows, 192, generator=gen)
    rotated = (x.reshape(-1, block) @ m).view(rows, 192)
    got = gemv.amx_int8_linear(x, tiles, scale, None, signs)
    want = gemv.amx_int8_linear(rotated, tiles, scale, None)
    ref = rotated @ (codes.float() * scale[:, None]).t()
    assert float((got - want).norm() / ref.norm()) < 1e-3
    assert float((got - ref).norm() / ref.norm()) < 0.02
    wrong = gemv.amx_int8_linear(x, tiles, scale, None, -signs.roll(1))
    assert float((wrong - ref).norm() / ref.norm()) > 0.1
    lin = Int8Linear(w, kernel="amx")
    assert lin.fuses_rotation and torch.allclose(lin(x, hadamard_signs=signs), got)
    fb = Int8Linear(w, kernel="fbgemm")
    assert not fb.fuses_rotation
    assert float((fb(x, hadamard_signs=signs) - ref).norm() / ref.norm()) < 0.02


@built
@pytest.mark.parametrize("kernel", Int8Linear.KERNELS)
def test_int8_kernels_agree(kernel):
    """Both int8 kernels quantize each token's input to 8 bits: within 2 % of the float
    product and of each other (a wrong scale or layout is off by order one); same bytes."""
    if kernel == "amx" and not gemv.amx_int8():
        pytest.skip("CPU without AMX int8 tiles")
    w, b = torch.randn(192, 128) * 0.05, torch.randn(192)
    lin, fb = Int8Linear(w, b, kernel=kernel), Int8Linear(w, b, kernel="fbgemm")
    assert lin.kernel == kernel and lin.weight_bytes() == fb.weight_bytes()
    for rows in (1, 4, 40):
        x = torch.randn(rows, 128)
        ref = torch.nn.functional.linear(x, w, b)
        got = lin(x)
        assert float((got - ref).norm() / ref.norm()) < 0.02
        assert float((got - fb(x)).norm() / ref.norm()) < 0.02
    x = torch.randn(3, 128)
    assert torch.equal(copy.deepcopy(lin)(x), lin(x))


@built
def test_int8_format_takes_the_tiles_where_it_can():
    lin = Int8Linear(torch.randn(128, 128))
    assert lin.kernel == ("amx" if gemv.amx_int8() else "fbgemm")
    assert Int8Linear(torch.randn(100, 128)).kernel == "fbgemm"  # not whole tiles


@built
@pytest.mark.skipif(not gemv.amx(), reason="CPU without AMX tiles")
def test_tiles_split_between_threads_compute_the_same(monkeypatch):
    """A prefill-sized call split between threads by rows gives exactly the one-thread
    result (each row's sums do not depend on the split)."""
    w, b = torch.randn(192, 128), torch.randn(192)
    lin, codes = BF16Linear(w, b, kernel="amx"), Int8Linear(w, b)
    x = torch.randn(300, 128)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = (lin(x), codes(x))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert len(gemv._row_slices(300)) == 2  # 128 rows at least per thread
    three = (lin(x), codes(x))
    for a, c in zip(one, three, strict=True):
        assert torch.equal(a, c)


@built
@pytest.mark.parametrize("rows", [1, 4, gemv.MAX_ROWS])
def test_fixed_calls_compute_what_the_general_path_does(rows):
    """A `FixedCall` runs the same kernel on the same operands as the general path (bit for
    bit); it takes only contiguous float32 rows of the right width, at most `MAX_ROWS`."""
    w, b = torch.randn(128, 64), torch.randn(128)
    x = torch.randn(rows, 64)
    cases = [
        (gemv.loop_call(w, b), lambda: gemv.small_linear(x, w, b)),
        (gemv.loop_call(w.bfloat16()), lambda: gemv.small_linear(x, w.bfloat16())),
    ]
    if gemv.amx():
        tiles = gemv.amx_pack(w)
        cases.append((gemv.amx_call(tiles, b), lambda: gemv.amx_linear(x, tiles, b)))
    if gemv.amx_int8():
        codes, scale = row_int8(w)
        ct, sc = gemv.amx_pack(codes), scale.float().contiguous()
        signs = hadamard_signs(signed_hadamard(32, 3))
        cases.append((gemv.amx_int8_call(ct, sc, b), lambda: gemv.amx_int8_linear(x, ct, sc, b)))
        cases.append(
            (
                gemv.amx_int8_call(ct, sc, None, signs),
                lambda: gemv.amx_int8_linear(x, ct, sc, None, signs),
            )
        )
    for call, general in cases:
        assert torch.equal(call(x), general())
        assert call.out_features == 128
        assert call(x.bfloat16()) is None and call(torch.randn(rows, 128)[:, ::2]) is None
        assert (
            call(torch.randn(gemv.MAX_ROWS + 1, 64)) is None and call(torch.randn(rows, 32)) is None
        )


@built
def test_a_module_remakes_its_fixed_call_when_its_weights_move():
    """The call a module keeps holds its weights' addresses: a storage swapped in
    (`t.data = ...`, as `huge_pages` does) makes a new one; copies and pickles compute with
    their own weights."""
    import pickle

    lin = gemv.Linear(64, 32)
    x = torch.randn(3, 64)
    with torch.inference_mode():
        first = lin(x)
        call = lin.__dict__["_fixed_call"]
        assert lin(x).equal(first) and lin.__dict__["_fixed_call"] is call  # kept
        lin.weight.data = lin.weight.data * 2
        assert torch.allclose(lin(x), 2 * first - lin.bias, atol=1e-5)
        assert lin.__dict__["_fixed_call"] is not call
        for twin in (copy.deepcopy(lin), pickle.loads(pickle.dumps(lin))):
            assert torch.equal(twin(x), lin(x))
            assert twin.__dict__["_fixed_call"].key != lin.__dict__["_fixed_call"].key
