"""The step plan: the one thing attention reads in a step (as nano-vllm's `Context`).

The runner fills the rows to write, the decode rows with their block tables and masks, and
the prefill chunks. A policy's runtime adds to it what attention must do for the policy:
rows whose queries it keeps, whether decode probabilities are wanted (H2O's scores),
whether each layer reads only its own longest lane (per-layer budgets), a page reader that
narrows each layer's decode table to chosen pages (Quest) and extra K/V rows per decode row
(recall's far tier). Attention fills `queries` and `probs`; the runtime reads them after
the forward. Layer-independent work (buckets, per-layer block ids, masks) is cached on the
plan on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from ctxlab.engine.lane_runs import RowRuns

# Extra rows of a decode step: K and V `[B, n_kv, E, d]` and their mask `[B, n_kv, E]`.
ExtraRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class PageReader(Protocol):
    """Narrows a layer's decode reads to chosen pages (engine side of a selection policy)."""

    def record(self, rows: torch.Tensor, k: torch.Tensor) -> None: ...

    def narrow(
        self, layer: int, q: torch.Tensor, table: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None: ...


class ExtraReader(Protocol):
    """Extra K/V rows each decode row attends to beside its lanes (recall's far tier)."""

    def rows(self, layer: int, q: torch.Tensor) -> ExtraRows: ...


@dataclass
class PrefillItem:
    start: int  # first index of this sequence's tokens in the flat batch
    end: int
    fresh: bool  # nothing of this sequence was in the cache before this chunk
    table: torch.Tensor | None = None  # [n_lanes, nb]
    prev_len: torch.Tensor | None = None  # [n_lanes] tokens before the chunk
    first_pos: int = 0
    _mask: torch.Tensor | None = field(default=None, init=False, repr=False)


@dataclass
class DecodeBucket:
    """Decode sequences attended together: their rows in the decode batch and, per layer,
    their block ids `[n_layers, Bg * Hkv * nb]` and mask `[n_layers, Bg, Hkv, 1, nb * bs]`
    (None when every lane holds exactly `length` tokens)."""

    rows: torch.Tensor | None  # [Bg] rows of the decode batch; None = all, in order
    ids: torch.Tensor
    mask: torch.Tensor | None
    n_seqs: int
    n_blocks: int
    length: int  # keys attended (trimmed to the longest lane when the mask is None)
    lens: torch.Tensor | None = None  # [Bg, n_lanes] keys per lane, for sliding windows
    runs: list[list[RowRuns]] | None = None  # per layer, per row: read in place (lane_runs)
    # per window: block columns and mask a sliding layer reads (`attention.window_read`)
    _window_reads: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


@dataclass
class StepPlan:
    rows: torch.Tensor  # [n_layers, T, Hkv] pool rows of the new tokens
    decode_idx: torch.Tensor | None = None  # [Bd] flat indices of decode tokens
    decode_table: torch.Tensor | None = None  # [Bd, n_lanes, nb]
    decode_mask: torch.Tensor | None = None  # [Bd, n_lanes, 1, L] bool
    prefills: list[PrefillItem] = field(default_factory=list)
    # -- what a policy's runtime adds (see the module docstring) ---------------------------
    keep_queries: torch.Tensor | None = None  # flat rows whose queries are kept per layer
    want_probs: bool = False  # decode attention returns its probabilities (H2O)
    own_width: bool = False  # each layer's decode reads only its own longest lane
    pages: PageReader | None = None  # Quest: narrows each layer's decode table
    extra: ExtraReader | None = None  # recall: extra K/V rows per decode row and layer
    # -- filled by attention, read by the runtime after the forward -----------------------
    queries: list[torch.Tensor | None] = field(default_factory=list)  # per layer
    probs: list[torch.Tensor | None] = field(default_factory=list)  # per layer [B, n_kv, g, L]
    _buckets: list[DecodeBucket] | None = field(default=None, init=False, repr=False)
    # per window: what a sliding layer's shaped decode reads (`attention.window_read`)
    _window_reads: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False
    )

    @property
    def shaped_decode(self) -> bool:
        """A policy shapes decode reads: one batch at full width, not length buckets."""
        return self.want_probs or self.own_width or self.pages is not None or self.extra is not None
