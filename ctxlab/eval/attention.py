"""Where attention goes: sinks and heavy hitters, measured per layer and KV head.

StreamingLLM (Xiao et al., 2024) keeps the first tokens because they draw attention mass far
beyond their share ("attention sinks"); H2O (Zhang et al., 2023) keeps the keys that draw
most of it ("heavy hitters"). Both are observations about a model, so this module measures
them on the model ctxlab runs, over real prose, instead of assuming them.

How: the prompt is prefilled once through the engine's model with a dense backend (the
model's own kernels, `DenseBackend`), which also keeps every layer's rotated keys. For a
sample of query positions the backend recomputes plain softmax(q k^T / sqrt(d)) over the
keys that query may see (causal, and the layer's window on sliding layers), and averages
the probabilities over the query heads that share a KV head: a kept or evicted key serves
the whole group, so a KV head's distribution is what an eviction policy acts on.

Per (layer, KV head) and query, from that distribution over the n visible keys:
- `first`: mass on the prompt's first token; `sinks`: on its first k tokens (0 on a sliding
  layer whose window has moved past them);
- `oldest`: mass on the k oldest keys the query can see (the window's edge on a sliding
  layer; the same as `sinks` on a global one), so a sliding layer's own edge is measured;
- `top1`, `top20`: the share of mass held by the ceil(1 %) and ceil(20 %) of the visible keys
  that draw most of it (chosen with hindsight: an upper bound on what an eviction policy
  that keeps that many keys could keep).
Each is averaged over the sampled queries of one prompt; the spread across prompts gives
the interval (`summarize`). A uniform distribution would give k/n for `sinks`, 1 % and 20 %.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ctxlab.model.dense import DenseBackend
from ctxlab.model.llama import LlamaModel
from ctxlab.model.loader import LoadedModel

STATS = ("first", "sinks", "oldest", "top1", "top20")
TOP_FRACTIONS = {"top1": 0.01, "top20": 0.20}


def mass_statistics(
    probs: torch.Tensor, query_pos: torch.Tensor, window: int | None, sinks: int
) -> dict[str, torch.Tensor]:
    """Per-row statistics of attention distributions.

    probs [..., Q, L]: rows sum to 1 over the keys each query sees (zeros elsewhere), key j
    at prompt position j; query_pos [Q]: each row's position; window: None or the layer's W.
    Returns each name of `STATS` as a tensor [..., Q].
    """
    length = probs.shape[-1]
    start = query_pos - window + 1 if window is not None else torch.zeros_like(query_pos)
    start = start.clamp(min=0)
    visible = query_pos - start + 1  # [Q]
    out = {
        "first": probs[..., 0],
        "sinks": probs[..., : min(sinks, length)].sum(-1),
    }
    edge = (start[:, None] + torch.arange(sinks)[None, :]).clamp(max=length - 1)  # [Q, k]
    inside = edge <= query_pos[:, None]
    gathered = probs.gather(-1, edge.expand(*probs.shape[:-1], sinks))
    out["oldest"] = (gathered * inside).sum(-1)
    ranked = probs.sort(dim=-1, descending=True).values.cumsum(-1)
    for name, frac in TOP_FRACTIONS.items():
        keep = torch.ceil(visible.to(torch.float64) * frac).to(torch.int64).clamp(min=1)  # [Q]
        idx = (keep - 1).expand(probs.shape[:-1]).unsqueeze(-1)
        out[name] = ranked.gather(-1, idx).squeeze(-1)
    return out


def group_probs(q: torch.Tensor, k: torch.Tensor, query_pos: torch.Tensor, window: int | None):
    """softmax(q k^T / sqrt(d)) per query head, averaged over each KV head's query heads.

    q [Q, H, d] (rotated, at positions query_pos), k [L, Hkv, d] (rotated, positions 0..L-1).
    Returns [Hkv, Q, L], each row summing to 1 over its visible keys."""
    n_heads, n_kv, d = q.shape[1], k.shape[1], q.shape[2]
    group = n_heads // n_kv
    kh = k.float().repeat_interleave(group, dim=1)  # [L, H, d]
    scores = torch.einsum("qhd,lhd->hql", q.float(), kh) / math.sqrt(d)
    key_pos = torch.arange(k.shape[0])[None, :]
    allowed = key_pos <= query_pos[:, None]
    if window is not None:
        allowed &= key_pos > query_pos[:, None] - window
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return probs.view(n_kv, group, *probs.shape[1:]).mean(1)


class RecordingBackend(DenseBackend):
    """The dense backend, which also measures the sampled queries' attention per layer.

    One sequence, prefilled in one call; `stats[layer][name]` is a tensor [Hkv] of means
    over the sampled queries. The attention output itself is the dense backend's."""

    def __init__(self, model: LlamaModel, query_pos: torch.Tensor, sinks: int) -> None:
        super().__init__(model.config.num_layers, model.sliding_windows)
        self.query_pos = query_pos
        self.sinks = sinks
        self.stats: dict[int, dict[str, torch.Tensor]] = {}

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        out = super().attend(layer_idx, q, k, v)
        keys = self._k[self._seq_ids[0]][layer_idx]
        assert keys is not None
        window = self.sliding_windows[layer_idx]
        probs = group_probs(q[self.query_pos], keys, self.query_pos, window)
        per_query = mass_statistics(probs, self.query_pos, window, self.sinks)
        self.stats[layer_idx] = {name: v.mean(-1) for name, v in per_query.items()}
        return out


def query_positions(length: int, queries: int) -> torch.Tensor:
    """`queries` evenly spaced positions over the prompt's second half (fewer if it is short):
    late queries see many keys, so a uniform share is small and a sink stands out."""
    first = length // 2
    n = max(1, min(queries, length - first))
    return torch.linspace(first, length - 1, n).round().to(torch.int64).unique()


@dataclass
class PromptMeasure:
    """One prompt's statistics: values[name] is [layers][kv heads] (means over queries)."""

    tokens: int
    queries: int
    values: dict[str, list[list[float]]] = field(default_factory=dict)
    uniform_sinks: float = 0.0  # k / visible keys, averaged over the queries (global layers)


@torch.inference_mode()
def measure_prompt(
    model: LlamaModel, ids: Sequence[int], queries: int, sinks: int
) -> PromptMeasure:
    """Prefill `ids` once and measure the sampled queries' attention in every layer."""
    pos = query_positions(len(ids), queries)
    backend = RecordingBackend(model, pos, sinks)
    backend.set_batch([0], [0, len(ids)])
    device = model.device
    model.forward(
        torch.tensor(list(ids), dtype=torch.int64, device=device),
        torch.arange(len(ids), device=device),
        backend,
    )
    values = {
        name: [backend.stats[i][name].tolist() for i in range(model.config.num_layers)]
        for name in STATS
    }
    uniform = float((sinks / (pos + 1).to(torch.float64)).mean())
    return PromptMeasure(len(ids), int(pos.numel()), values, uniform)


def measure_prompts(
    loaded: LoadedModel,
    tokens: int,
    prompts: int,
    queries: int,
    sinks: int,
    on_prompt: Callable[[], None] | None = None,
) -> list[PromptMeasure]:
    """`prompts` disjoint passages of the shipped prose (Shakespeare), `tokens` each, measured
    one by one; passage i starts `i * tokens * 8` characters in (about 4 characters a token,
    so the passages do not overlap)."""
    from ctxlab.eval.perplexity import text_ids

    out = []
    for i in range(prompts):
        ids = text_ids(loaded.tokenizer, tokens, offset_chars=i * tokens * 8)
        out.append(measure_prompt(loaded.model, ids, queries, sinks))
        if on_prompt:
            on_prompt()
    return out
