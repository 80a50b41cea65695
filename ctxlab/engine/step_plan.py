"""The step plan: plain data, built before the forward, the one thing attention reads in a step
(as nano-vllm's `Context`); and the readback, the one thing attention hands back.

Data flows one way. `Runner.plan` builds the `StepPlan` once per step from the batch, the
cache's block tables and what the policy's runtime asks for (`PolicyReads`): the pool rows to
write, the prefill chunks, and for decode, per layer, every read with the path that serves it
(`DecodeRead.path`: the compiled kernel, in place, or gathered; the kernel is chosen once per
step). Nothing writes into the plan after that. Attention reads it layer by layer and puts
what it observed (kept queries, decode probabilities, the keys it wrote when a page reader
summarises them) into a separate `StepReadback` that the runtime reads after the forward.

Two choices depend on the layer's query and so cannot be made before the forward: a page
policy's pages (Quest) and recall's far rows. A read marks them (`pages`, `far`); attention
asks the runtime's page reader and far reader, which it was given once when built, and never
stores their answers anywhere but in its output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from ctxlab.engine.lane_runs import RowRuns

# Extra rows of a decode step: K and V `[B, n_kv, E, d]` and their mask `[B, n_kv, E]`:
# bool (which rows count), or float (an additive logit bias, -inf for a row that does not).
ExtraRows = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# How a decode read reaches the pool: the compiled paged kernel (kernels/paged_decode.py),
# views over long runs of adjacent blocks (lane_runs.py), or a gather into dense K/V.
ReadPath = Literal["kernel", "in-place", "gather"]


class PageReader(Protocol):
    """Narrows a layer's decode reads to chosen pages (engine side of a selection policy)."""

    def narrow(
        self, layer: int, q: torch.Tensor, table: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, ExtraRows | None] | None: ...


class ExtraReader(Protocol):
    """Extra K/V rows each decode row attends to beside its lanes (recall's far tier)."""

    def rows(self, layer: int, q: torch.Tensor) -> ExtraRows: ...


class PrefillMask(Protocol):
    """A sparse pattern for prefill queries (`Policy.prefill_mask`): `[n, L]` bool for the
    queries at `q_pos` over the keys at `k_pos` of a `prompt_len`-token prompt."""

    def __call__(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, prompt_len: int
    ) -> torch.Tensor | None: ...


@dataclass(frozen=True)
class PrefillItem:
    start: int  # first index of this sequence's tokens in the flat batch
    end: int
    fresh: bool  # nothing of this sequence was in the cache before this chunk
    table: torch.Tensor | None = None  # [n_lanes, nb]
    prev_len: torch.Tensor | None = None  # [n_lanes] tokens before the chunk
    first_pos: int = 0
    prompt_len: int = 0  # the sequence's prompt tokens (a prefill mask's question rows)


@dataclass(frozen=True)
class DecodeRead:
    """One decode attention call of one layer: which decode rows, which blocks, how."""

    path: ReadPath
    rows: torch.Tensor | None  # [Bg] rows of the decode batch; None = all, in order
    table: torch.Tensor  # [Bg, Hkv, nb] block ids
    mask: torch.Tensor | None  # [Bg, Hkv, 1, L] keys read; None: the first `length` slots
    length: int | None = None
    runs: list[RowRuns] | None = None  # per row, for path "in-place" (`lane_runs.plan_runs`)
    want_probs: bool = False  # also return the probabilities (H2O's scores)
    pages: bool = False  # narrowed first by the page reader for this layer's query (Quest)
    own_width: bool = False  # after narrowing, cut to this layer's longest lane
    far: bool = False  # the far reader's rows for this layer's query join the softmax
    extra: ExtraRows | None = None  # rows the page reader chose (single tokens, mean rows)


@dataclass(frozen=True)
class PolicyReads:
    """What a policy's runtime asks of this step's attention (`NullRuntime`: nothing)."""

    keep_queries: torch.Tensor | None = None  # flat rows whose queries are kept per layer
    want_probs: bool = False  # decode attention returns its probabilities (H2O)
    own_width: bool = False  # each layer's decode reads only its own longest lane
    pages: bool = False  # the page reader narrows each layer's decode reads (Quest)
    far: bool = False  # the far reader adds rows to each layer's decode reads (recall)
    record_keys: bool = False  # hand back the keys written, for the page reader's summaries
    prefill_mask: PrefillMask | None = None  # a pattern prefill attention adds (Longformer)

    @property
    def shaped_decode(self) -> bool:
        """A policy shapes decode reads: one batch at full width, not length buckets."""
        return self.want_probs or self.own_width or self.pages or self.far


@dataclass(frozen=True)
class StepPlan:
    """What attention does this step (see the module docstring)."""

    rows: torch.Tensor  # [n_layers, T, Hkv] pool rows of the new tokens
    prefills: list[PrefillItem] = field(default_factory=list)
    decode_idx: torch.Tensor | None = None  # [Bd] flat indices of decode tokens
    decode: list[tuple[DecodeRead, ...]] = field(default_factory=list)  # per layer
    # per layer, the reads when the page reader reads every page anyway (Quest; else empty)
    unnarrowed: list[tuple[DecodeRead, ...]] = field(default_factory=list)
    policy: PolicyReads = field(default_factory=PolicyReads)


@dataclass
class StepReadback:
    """What attention hands back after a step's forward, per layer: the queries of the
    plan's `keep_queries` rows `[R, H, d]`, with `want_probs` the decode probabilities
    `[B, n_kv, g, L]`, and with `record_keys` the pool rows, keys and values written
    `([T, Hkv], [T, Hkv, d], [T, Hkv, dv])` (None where a layer produced none)."""

    queries: list[torch.Tensor | None]
    probs: list[torch.Tensor | None]
    keys: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]

    @classmethod
    def empty(cls, n_layers: int) -> StepReadback:
        return cls([None] * n_layers, [None] * n_layers, [None] * n_layers)
