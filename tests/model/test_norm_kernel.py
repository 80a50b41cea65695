"""ctxlab's compiled RMSNorm (`rms_norm.c`) against float64 RMSNorm, and where it stays out.

The kernel sums squares in float32 in another order than aten, so it must match a float64
norm of the same input to a few float32 roundings; a wrong row stride, a dropped tail or a
wrong scale is off by order one. Marked `isa`: `tests/second_isa.py` reruns them with the
kernel built one instruction set lower.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ctxlab import native
from ctxlab.model import norm_kernel
from ctxlab.model.layers import RMSNorm

pytestmark = pytest.mark.isa
built = pytest.mark.skipif(
    norm_kernel.kernel() is None, reason=f"not built: {native.why_not('rms_norm')}"
)


def top(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def exact(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@built
@pytest.mark.parametrize(("rows", "dim"), [(1, 576), (4, 576), (17, 640), (3, 7), (2, 1), (0, 64)])
def test_matches_a_float64_norm(rows, dim):
    g = torch.Generator().manual_seed(rows * 1000 + dim)
    x = torch.randn(rows, dim, generator=g) * 3
    w = torch.randn(dim, generator=g)
    got = norm_kernel.rms_norm(x, w, 1e-6)
    assert got is not None and got.shape == x.shape and got.dtype == torch.float32
    want = exact(x, w, 1e-6)
    assert top(got.double() - want) <= 1e-5 * (1 + top(want))
    assert torch.allclose(got, F.rms_norm(x, (dim,), w, 1e-6), rtol=1e-5, atol=1e-5)


@built
def test_a_row_s_norm_does_not_depend_on_where_it_sits_or_its_neighbours():
    """Bit for bit the same output for the same row alone, among other rows, and at every
    offset in memory: a batch never changes a sequence's norm (a vectorised reduction that
    peeled iterations to align the row would)."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(576, generator=g)
    row = torch.randn(576, generator=g)
    alone = norm_kernel.rms_norm(row[None], w, 1e-5)
    assert alone is not None
    buffer = torch.randn(16 + 5 * 576, generator=g)
    for shift in range(16):
        block = buffer[shift : shift + 5 * 576].view(5, 576)
        block[3] = row
        got = norm_kernel.rms_norm(block, w, 1e-5)
        assert got is not None and torch.equal(got[3], alone[0]), shift


@built
def test_leading_dimensions_are_rows_and_eps_is_used():
    x = torch.full((2, 3, 8), 1e-4)
    w = torch.ones(8)
    got = norm_kernel.rms_norm(x, w, 1e-2)
    assert got is not None
    assert torch.allclose(got.double(), exact(x, w, 1e-2), rtol=1e-6)  # eps dominates: ~1e-3


@built
def test_cases_it_does_not_take_are_left_to_aten():
    w = torch.ones(8)
    assert norm_kernel.rms_norm(torch.ones(2, 8, dtype=torch.bfloat16), w, 1e-6) is None
    assert norm_kernel.rms_norm(torch.ones(8, 2).t(), w, 1e-6) is None  # not contiguous
    x = torch.ones(2, 8, requires_grad=True)
    assert norm_kernel.rms_norm(x, w, 1e-6) is None
    with torch.no_grad():
        assert norm_kernel.rms_norm(x, w, 1e-6) is not None


@pytest.mark.parametrize("rows", [1, 5])
def test_the_module_gives_aten_s_answer_with_or_without_the_kernel(rows, monkeypatch):
    norm = RMSNorm(96, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(-2, 2, 96))
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    want = F.rms_norm(x, (96,), norm.weight.detach(), 1e-5)
    with torch.inference_mode():
        compiled = norm(x)
        monkeypatch.setattr(norm_kernel, "rms_norm", lambda *a: None)
        fallback = norm(x)
    assert torch.allclose(compiled, want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(fallback, want, rtol=1e-5, atol=1e-6)
