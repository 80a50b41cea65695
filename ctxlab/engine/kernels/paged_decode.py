"""The compiled implementation of the engine's decode attention, and when it runs.

`run_kernel` is what the engine's attention runs for a decode read whose path is "kernel"
(the step plan asks `serves(pool)` once per step; a plain read: no extra rows, no
probabilities), and `paged_decode` what `decode_attention` runs for other callers: a loop
that walks each lane's block table and reads K and V in place from the pool's storage (no
copy), every lane of the batch in one call, one pass over the bytes. Two implementations of
that loop: C (`paged_decode.c`, built once per machine by `ctxlab.native`: 16 slots at a time
with vector exponentials and the next block prefetched) where a C compiler is present, and
numba's (`numba_decode.py`) elsewhere and for the shapes the C loops do not take.
The gather + SDPA path stays in `decode_attention` as the reference and the fallback; it
runs when numba is not importable, the pool is not on the CPU or not a float32 / bfloat16 /
int8 pool (KIVI codes, other dtypes), or `CTXLAB_DECODE_KERNEL=torch`. Which one runs is
logged once (`ctxlab.engine.kernels`).

Compilation: the numba loops are `cache=True`, so a machine compiles them once (about 10 s
for the three pool formats) and every later process loads them from numba's cache (well
under a second); `warm_up(pool)` does it when an engine is built (`LLMEngine.__init__`), so
no timed step (TTFT, TPOT) pays it. The C library is built (1-2 s) or loaded at the same
point, on the first decision.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

import numpy as np
import torch

from ctxlab.engine.kernels import c_decode

if TYPE_CHECKING:
    from ctxlab.kv.store import KVStore

log = logging.getLogger("ctxlab.engine.kernels")
_NO_SCOPE = nullcontext()

ENV = "CTXLAB_DECODE_KERNEL"
# "auto" (default): the C loops where they are built, else numba's; "c" the same; "numba":
# numba's only (for side-by-side runs); "torch": the reference path.
CHOICES = ("auto", "c", "numba", "torch")

_kernels: dict[str, Callable[..., None]] | None = None
_state: dict[str, bool | str] = {"decided": False, "why": "", "impl": "torch"}
_NO_MASK = np.zeros((1, 1, 1), dtype=np.bool_)
# A pool's storage as numpy views, made once per pool (a call costs ~2 us inside the loop;
# remaking the views each call cost several times that).
_views: weakref.WeakKeyDictionary[KVStore, tuple[str, tuple[np.ndarray, ...]] | None] = (
    weakref.WeakKeyDictionary()
)


def _decide() -> dict[str, Callable[..., None]] | None:
    """Choose once which loops run (None: the torch path), logging the choice. The numba
    loops are the fallback of the C ones (shapes the C loops do not take), so both need
    numba."""
    global _kernels
    if _state["decided"]:
        return _kernels
    _state["decided"] = True
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        log.warning("%s=%s is not one of %s; using auto", ENV, choice, ", ".join(CHOICES))
        choice = "auto"
    _state["impl"] = "torch"
    if choice == "torch":
        _state["why"] = f"{ENV}=torch"
    else:
        try:
            from ctxlab.engine.kernels.numba_decode import KERNELS

            _kernels = KERNELS
            _state["impl"] = "numba"
        except ImportError as exc:  # numba missing or broken: the reference still runs
            _state["why"] = f"numba is not importable ({exc})"
    if _kernels is not None and choice != "numba" and c_decode.library() is not None:
        _state["impl"] = "c"
    if _state["impl"] == "c":
        log.info("decode attention: C paged loops (in place, float32/bf16/int8 pools)")
    elif _kernels is not None:
        log.info("decode attention: numba paged kernel (in place, float32/bf16/int8 pools)")
    else:
        log.info("decode attention: torch gather + SDPA (%s)", _state["why"])
    return _kernels


def set_enabled(enabled: bool | str | None) -> None:
    """Force the kernel on (`True`: the C loops where built, else numba's), off (`False`:
    the torch path), one implementation by name (one of `CHOICES`), or back to the
    environment's choice (`None`); for tests and side-by-side benchmarks."""
    global _kernels
    _state["decided"] = False
    _kernels = None
    if enabled is None:
        _decide()
        return
    saved = os.environ.get(ENV)
    if isinstance(enabled, str):
        os.environ[ENV] = enabled
    else:
        os.environ[ENV] = "auto" if enabled else "torch"
    try:
        _decide()
    finally:
        if saved is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = saved


def backend() -> str:
    """Which decode attention runs: "c", "numba" or "torch"."""
    _decide()
    return str(_state["impl"])


def _pool_arrays(pool: KVStore) -> tuple[str, tuple[np.ndarray, ...]] | None:
    """The kernel's name and the pool's storage as numpy views (cached per pool), or None."""
    try:
        return _views[pool]
    except KeyError:
        pass
    except TypeError:  # not weakly referenceable: build the views each call
        return pool.decode_views()
    views = pool.decode_views()
    _views[pool] = views
    return views


def float_rows(pool: KVStore) -> tuple[str, tuple[np.ndarray, ...]] | None:
    """The pool's storage as numpy views (cached per pool) where it holds float32 or bf16
    rows ("f32" / "bf16" and K, V), or None (a pool of codes: int8, KIVI; not the CPU)."""
    arrays = _pool_arrays(pool)
    return arrays if arrays is not None and arrays[0] in ("f32", "bf16") else None


def compiled_target(pool: KVStore) -> tuple[int, tuple[int, ...], int, int] | None:
    """For a float32 or bf16 pool the C loops serve: the address of the loop that reads it,
    the storage's K and V addresses and their row widths; None otherwise (no C loops, numba
    or torch chosen, another pool format)."""
    arrays = float_rows(pool) if serves(pool) and _state["impl"] == "c" else None
    return None if arrays is None else c_decode.target(arrays[0], pool, arrays[1])


def serves(pool: KVStore) -> bool:
    """Whether the kernel reads this pool's plain decode calls (no extra rows, no probs), so
    the torch path's in-place read plans would go unused."""
    return _decide() is not None and pool.device.type == "cpu" and _pool_arrays(pool) is not None


def paged_decode(
    q: torch.Tensor,
    pool: KVStore,
    table: torch.Tensor,
    mask: torch.Tensor | None = None,
    length: int | None = None,
) -> torch.Tensor | None:
    """Decode attention `[B, n_kv, g, dv]` over the pool, read in place; None when the kernel
    does not serve this call (then the caller runs the torch path). For callers that did
    not ask `serves` first; the engine's step asks once and calls `run_kernel`.

    Arguments as `decode_attention`'s: q `[B, n_kv, g, d]`, `table [B, n_kv, nb]`, `mask
    [B, n_kv, 1, L]` of the first L slots (None: the first `length` slots, or all).
    """
    if _decide() is None or q.device.type != "cpu" or _pool_arrays(pool) is None:
        return None
    return run_kernel(q, pool, table, mask, length)


def run_kernel(
    q: torch.Tensor,
    pool: KVStore,
    table: torch.Tensor,
    mask: torch.Tensor | None = None,
    length: int | None = None,
) -> torch.Tensor:
    """`paged_decode` for a pool the kernel is known to serve (`serves(pool)` was true for
    this step): no decision, straight to the C loop (or numba's)."""
    kernels = _kernels
    arrays = _pool_arrays(pool)
    assert kernels is not None and arrays is not None, "run_kernel needs serves(pool)"
    kind, storage = arrays
    B, H, g, d = q.shape
    nb = table.shape[-1]
    bs = pool.layout.block_size
    width = nb * bs
    mask3: torch.Tensor | None = None
    if mask is not None:
        L = min(mask.shape[-1], width)
        m = mask.reshape(B, H, mask.shape[-1])
        mask3 = m if m.is_contiguous() else m.contiguous()
    else:
        L = width if length is None else min(length, width)
    qf = q if q.dtype == torch.float32 else q.to(torch.float32)
    qf = qf if qf.is_contiguous() else qf.contiguous()
    tb = table if table.dtype == torch.int64 else table.to(torch.int64)
    tb = tb if tb.is_contiguous() else tb.contiguous()
    dv = pool.layout.head_dim_v
    out = torch.empty((B, H, g, dv), dtype=torch.float32)
    scale = float(d**-0.5)
    profiled = torch.autograd.profiler._is_profiler_enabled  # named in torch.profiler's tables
    with torch.profiler.record_function("ctxlab::paged_decode") if profiled else _NO_SCOPE:
        done = False
        if _state["impl"] == "c":
            lens_t = torch.full((B, H), L, dtype=torch.int64)
            done = c_decode.run(kind, pool, storage, qf, tb, lens_t, mask3, scale, out)
        if not done:
            m_np, use_mask = (_NO_MASK, False) if mask3 is None else (mask3.numpy(), True)
            lens = np.full((B, H), L, dtype=np.int64)
            args = (qf.numpy(), *storage, tb.numpy(), lens, m_np, use_mask, np.float32(scale))
            kernels[kind](*args, out.numpy())
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def warm_up(pool: KVStore | None = None) -> float:
    """Compile (first time on a machine) or load from numba's cache the loop `pool` will run
    (every pool format's when None) on a tiny input, so no timed step pays it; returns the
    seconds it took (0 when the kernel does not serve this pool)."""
    kernels = _decide()
    if kernels is None:
        return 0.0
    kinds = ["f32", "bf16", "int8"]
    if pool is not None:
        views = _pool_arrays(pool)
        if views is None:
            return 0.0
        kinds = [views[0]]
    t0 = time.perf_counter()
    q = np.zeros((1, 1, 2, 4), np.float32)
    tb = np.zeros((1, 1, 1), np.int64)
    lens = np.ones((1, 1), np.int64)
    out = np.empty((1, 1, 2, 4), np.float32)
    s = np.float32(0.5)
    tiny: dict[str, tuple[np.ndarray, ...]] = {
        "f32": (np.zeros((1, 2, 4), np.float32),) * 2,
        "bf16": (np.zeros((1, 2, 4), np.uint16),) * 2,
        "int8": (np.zeros((1, 2, 4), np.int8), np.ones((1, 2), np.float32)) * 2,
    }
    for kind in kinds:
        kernels[kind](q, *tiny[kind], tb, lens, _NO_MASK, False, s, out)
    return time.perf_counter() - t0
