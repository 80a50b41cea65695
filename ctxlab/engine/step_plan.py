"""The step plan: the one thing attention reads in a step (as nano-vllm's `Context`), and
the one thing it hands back.

Data flows one way. The runner writes the rows to write, the decode rows with their block
tables and masks, and the prefill chunks; a policy's runtime adds what attention must do
for the policy: rows whose queries it keeps, whether decode probabilities are wanted (H2O's
scores), whether each layer reads only its own longest lane (per-layer budgets), a page
reader that narrows each layer's decode table to chosen pages (Quest) and extra K/V rows
per decode row (recall's far tier). Attention only reads the plan; what it produces for
the runtime (the kept queries, the decode probabilities) goes into a separate
`StepReadback` that `PagedAttention.end_step` returns after the forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

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


@dataclass(frozen=True)
class PrefillItem:
    start: int  # first index of this sequence's tokens in the flat batch
    end: int
    fresh: bool  # nothing of this sequence was in the cache before this chunk
    table: torch.Tensor | None = None  # [n_lanes, nb]
    prev_len: torch.Tensor | None = None  # [n_lanes] tokens before the chunk
    first_pos: int = 0


@dataclass
class StepPlan:
    """What attention does this step: written by the runner and the policy runtime, read
    by attention only."""

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

    @property
    def shaped_decode(self) -> bool:
        """A policy shapes decode reads: one batch at full width, not length buckets."""
        return self.want_probs or self.own_width or self.pages is not None or self.extra is not None


@dataclass
class StepReadback:
    """What attention hands back after a step's forward, per layer: the queries of the
    plan's `keep_queries` rows `[R, H, d]` and, with `want_probs`, the decode
    probabilities `[B, n_kv, g, L]` (None where a layer produced none)."""

    queries: list[torch.Tensor | None]
    probs: list[torch.Tensor | None]

    @classmethod
    def empty(cls, n_layers: int) -> StepReadback:
        return cls([None] * n_layers, [None] * n_layers)
