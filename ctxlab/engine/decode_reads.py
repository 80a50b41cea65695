"""What a step's decode reads from the pool, layer by layer, planned before the forward: the
`DecodeRead`s of the `StepPlan` (block table, mask or length, in-place runs, the path).

`plan_decode` builds them once per step from the decode rows' block tables and masks. Work
that does not depend on the layer (buckets, per-layer block ids, masks, in-place runs,
window columns) is done once and shared by every layer's reads.
- A policy that shapes decode reads (probabilities, per-layer width, pages, extra rows)
  reads the whole decode batch at once, as its runtime asked (`PolicyReads`).
- Otherwise sequences of very different lengths are split into length buckets
  (`decode_buckets`), so a short sequence does not attend over the padding of the longest
  one; a bucket whose lanes all hold the same long prefix is read in place when the pool
  has views and the kernel does not serve the step (`lane_runs.py`).
- A sliding-window layer reads only the blocks its window covers (`window_read`); no
  policy compacts a sliding lane, so one window read serves every layer of that window.
- Each read names its path: "kernel" wherever the compiled kernel serves the step and the
  read needs neither probabilities nor extra rows, else "in-place" or "gather".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ctxlab.engine.lane_runs import RowRuns, plan_runs
from ctxlab.engine.step_plan import DecodeRead, PolicyReads, ReadPath
from ctxlab.kv.layout import KVLayout

# Padding cost model of `decode_buckets`: one more bucket costs, per layer, about as much as
# gathering and attending over this many extra (sequence, block) pairs (a gather, an SDPA
# call and an index copy ~ 100-150 us on a CPU core; one padded block ~ 4-5 us).
BUCKET_OVERHEAD_BLOCKS = 32


def decode_buckets(extents: list[int], overhead: int = BUCKET_OVERHEAD_BLOCKS) -> list[list[int]]:
    """Split decode rows into buckets minimising sum(|bucket| * its longest extent) plus
    `overhead` per bucket (extents in blocks). Exact, by dynamic programming over the rows
    sorted by extent (in a sorted order an optimal partition is contiguous)."""
    order = sorted(range(len(extents)), key=lambda i: extents[i])
    ext = [extents[i] for i in order]
    n = len(ext)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        for j in range(i):  # bucket = sorted rows j..i-1, its longest is ext[i-1]
            c = best[j] + (i - j) * ext[i - 1] + overhead
            if c < best[i]:
                best[i], cut[i] = c, j
    out: list[list[int]] = []
    i = n
    while i > 0:
        out.append(order[cut[i] : i])
        i = cut[i]
    return out[::-1]


def window_read(
    lens: torch.Tensor, window: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a sliding layer's decode reads: for lanes of `lens [B, Hkv]` tokens, the block
    columns `[B, Hkv, nw]` its window covers (a column past a lane's end is clamped by the
    caller and masked) and the mask `[B, Hkv, 1, nw * block_size]` of the keys the new token
    (at lane index len - 1) attends: len - window <= index < len."""
    first = torch.div((lens - window).clamp(min=0), block_size, rounding_mode="floor")
    last = torch.div(lens + block_size - 1, block_size, rounding_mode="floor")
    nw = max(1, int((last - first).max()))
    cols = first[..., None] + torch.arange(nw)
    idx = first[..., None] * block_size + torch.arange(nw * block_size)  # lane index
    lens_ = lens[..., None]
    mask = (idx < lens_) & (idx >= lens_ - window)
    return cols, mask.unsqueeze(2)


@dataclass
class _Bucket:
    """Decode sequences attended together: their rows in the decode batch and, per layer,
    their block ids `[n_layers, Bg * Hkv * nb]` and mask `[n_layers, Bg, Hkv, 1, nb * bs]`
    (None when every lane holds exactly `length` tokens)."""

    rows: torch.Tensor | None
    ids: torch.Tensor
    mask: torch.Tensor | None
    n_seqs: int
    n_blocks: int
    length: int  # keys attended (trimmed to the longest lane when the mask is None)
    lens: torch.Tensor  # [Bg, n_lanes] keys per lane, for sliding windows
    runs: list[list[RowRuns]] | None  # per layer, per row


def own_width(
    table: torch.Tensor, mask: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`table [B, Hkv, nb]` and `mask [B, Hkv, 1, L]` cut to the layer's longest lane (not the
    longest of any layer: per-layer budgets)."""
    n = int(mask.sum(-1).max())
    nb = -(-n // block_size)
    return table[..., :nb], mask[..., : nb * block_size]


def plan_decode(
    table: torch.Tensor,
    mask: torch.Tensor,
    layout: KVLayout,
    windows: tuple[int | None, ...],
    views: bool,
    kernel: bool,
    policy: PolicyReads,
) -> tuple[list[tuple[DecodeRead, ...]], list[tuple[DecodeRead, ...]]]:
    """Per layer, the reads of decode rows with block tables `table [B, n_lanes, nb]` and
    masks `mask [B, n_lanes, 1, L]`; and, for a page policy, per layer the reads to use
    when the page reader reads every page (else an empty list). `views`: in-place runs may
    be planned; `kernel`: the compiled kernel serves this step's plain reads."""
    plan = _Planner(table, mask, layout, windows, views, kernel)
    layers = range(layout.n_layers)
    if not policy.shaped_decode:
        return [plan.buckets(layer) for layer in layers], []
    shaped = [(plan.shaped(layer, policy),) for layer in layers]
    unnarrowed = [plan.buckets(layer) for layer in layers] if policy.pages else []
    return shaped, unnarrowed


class _Planner:
    """The shared work of one step's decode reads (see the module docstring)."""

    def __init__(
        self,
        table: torch.Tensor,
        mask: torch.Tensor,
        layout: KVLayout,
        windows: tuple[int | None, ...],
        views: bool,
        kernel: bool,
    ):
        self.table, self.mask = table, mask
        self.layout = layout
        self.n_kv = layout.n_kv_heads
        self.windows = windows
        self.sliding = frozenset(i for i, w in enumerate(windows) if w is not None)
        self.views = views and not kernel  # in-place runs feed the torch path only
        self.kernel = kernel
        self._buckets: list[_Bucket] | None = None
        # per (bucket, or -1 for the whole batch) and window: block columns and mask
        self._window: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _windowed(
        self, key: int, layer: int, table: torch.Tensor, lens: Callable[[], torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A sliding layer's `table [B, Hkv, nb]` narrowed to the block columns its window
        covers, and the window's mask; None for a full-attention layer. `lens()` gives the
        layer's lane lengths `[B, Hkv]` when the window read is not known yet."""
        window = self.windows[layer] if self.windows else None
        if window is None:
            return None
        if (key, window) not in self._window:
            self._window[key, window] = window_read(lens(), window, self.layout.block_size)
        cols, mask = self._window[key, window]
        return table.gather(2, cols.clamp(max=table.shape[-1] - 1)), mask

    def shaped(self, layer: int, policy: PolicyReads) -> DecodeRead:
        """The whole decode batch at once, read as the policy's runtime asked."""
        lanes = self.layout.lanes_of_layer(layer)
        table, mask = self.table[:, lanes], self.mask[:, lanes]
        # A policy never acts on a sliding layer (its lanes are dense): its window only.
        windowed = self._windowed(-1, layer, table, lambda: mask[:, :, 0].sum(-1))
        plain: ReadPath = "kernel" if self.kernel else "gather"
        if windowed is not None:
            return DecodeRead(plain, None, *windowed)
        if policy.own_width and not policy.pages:  # with pages: cut after narrowing
            table, mask = own_width(table, mask, self.layout.block_size)
        torch_only = policy.far or policy.want_probs  # the kernel returns neither
        return DecodeRead(
            "gather" if torch_only else plain,
            None,
            table,
            mask,
            want_probs=policy.want_probs,
            pages=policy.pages,
            own_width=policy.own_width and policy.pages,
            far=policy.far,
        )

    def buckets(self, layer: int) -> tuple[DecodeRead, ...]:
        """The length-bucketed reads of `layer`."""
        return tuple(self._bucket_read(i, b, layer) for i, b in enumerate(self._all_buckets()))

    def _bucket_read(self, i: int, b: _Bucket, layer: int) -> DecodeRead:
        table = b.ids[layer].view(b.n_seqs, self.n_kv, b.n_blocks)
        lanes = self.layout.lanes_of_layer(layer)
        windowed = self._windowed(i, layer, table, lambda: b.lens[:, lanes])
        if windowed is not None:
            return DecodeRead("kernel" if self.kernel else "gather", b.rows, *windowed)
        mask = None if b.mask is None else b.mask[layer]
        runs = b.runs[layer] if b.runs is not None else None
        path: ReadPath = "kernel" if self.kernel else ("in-place" if runs else "gather")
        return DecodeRead(path, b.rows, table, mask, length=b.length, runs=runs)

    def _all_buckets(self) -> list[_Bucket]:
        if self._buckets is not None:
            return self._buckets
        lay = self.layout
        bs, n_kv = lay.block_size, self.n_kv
        table, mask = self.table, self.mask
        B, n_lanes, nb = table.shape
        m = mask[:, :, 0, : nb * bs]  # [B, n_lanes, L]
        used = m.reshape(B, n_lanes, nb, bs).any(-1).any(1)  # [B, nb] blocks any lane reads
        extents = (used * torch.arange(1, nb + 1)).amax(-1).clamp(min=1).tolist()
        lens = m.sum(-1)  # [B, n_lanes] keys per lane (a prefix when lanes are not selected)
        groups = decode_buckets(extents) if B > 1 else [[0]]
        buckets = []
        for g in groups:
            g.sort()
            rows = None if len(groups) == 1 else torch.tensor(g, dtype=torch.int64)
            nbg = max(extents[i] for i in g)
            tg = table[:, :, :nbg] if rows is None else table[rows, :, :nbg]
            mg = m[:, :, : nbg * bs] if rows is None else m[rows, :, : nbg * bs]
            lg = lens if rows is None else lens[rows]
            Bg = len(g)
            # [n_layers, Bg, Hkv, nb] so each layer's ids are one contiguous slice.
            ids = tg.reshape(Bg, lay.n_layers, n_kv, nbg).transpose(0, 1).contiguous()
            n0 = int(lg.flatten()[0])
            dense = bool((lg == n0).all()) and bool(mg[..., :n0].all())
            bmask = None
            runs = None
            if dense and self.views:
                runs = plan_runs(tg, n0, lay.n_layers, n_kv, bs, self.sliding)
            if not dense:
                bmask = mg.reshape(Bg, lay.n_layers, n_kv, 1, nbg * bs).transpose(0, 1)
                bmask = bmask.contiguous()
            buckets.append(
                _Bucket(
                    rows=rows,
                    ids=ids.view(lay.n_layers, -1),
                    mask=bmask,
                    n_seqs=Bg,
                    n_blocks=nbg,
                    length=n0 if dense else nbg * bs,
                    lens=lg,
                    runs=runs,
                )
            )
        self._buckets = buckets
        return buckets
