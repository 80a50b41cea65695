"""What a policy may see: one layer of one sequence (`LayerObs`), a decode step's pages
(`PageObs`, Quest), a lane's far-tier blocks (`FarObs`, recall).

The engine builds these and nothing else reaches a policy: no pool, no step plan, no
engine object. `observe_layer` is the one builder of a `LayerObs`, called by the engine's
policy runtime and by `ctxlab.hf`'s. `LayerView` is the protocol a retention policy reads;
the optional tensors are filled only when the policy's `needs` names them, so the engine
computes no more than asked. Positions are original token positions (`-1` pads shorter
lanes; real slots are sorted ascending).

`needs` vocabulary (what a policy asks the engine to compute or keep):
- `obs_attn`: the last `obs_window` prompt queries' attention, at the prompt-end hook;
- `step_attn`: the current decode query's attention, at a decode hook;
- `acc_attn`: attention accumulated over decode steps (H2O), kept by the engine;
- `keys`: the lane's keys as stored (rotated);
- `query`: the current decode query;
- `pages`: the policy picks the pages each decode step reads (`choose_pages`), answering
  with a `PageChoice`, from per-page summaries the engine keeps beside the pool as keys
  are written (so choosing never reads the keys), only those named below:
- `page_bounds`: each page's per-channel key minimum and maximum (Quest's bound);
- `page_means`: each page's mean key and mean value (MoBA's block score,
  NSA's compressed rows);
- `index_keys`: every token's indexer key (the policy's `index_keys`
  of the key as written; DSA-style token selection);
- `far`: evicted blocks kept in a far tier; the policy picks which come back
  (`choose_far`, recall).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

LAYER_NEEDS = ("obs_attn", "step_attn", "acc_attn", "keys", "query")  # seen in a LayerView
PAGE_NEEDS = ("page_bounds", "page_means", "index_keys")  # summaries a `pages` policy reads
NEEDS = (*LAYER_NEEDS, "pages", *PAGE_NEEDS, "far")


class LayerView(Protocol):
    """One layer of one sequence at a retention hook."""

    layer: int
    n_layers: int
    n_heads: int  # query heads of the layer (GQA groups are consecutive query heads)
    positions: torch.Tensor  # [n_kv, L] int64, -1 padding
    seq_len: int  # tokens seen so far; the next token gets this position
    prompt_len: int
    step: int  # decode steps done (0 at the prefill hook)
    keys: torch.Tensor | None  # [n_kv, L, d] as stored (rotated)
    query: torch.Tensor | None  # [n_heads, d] the current decode query
    obs_attn: torch.Tensor | None  # [n_heads, w, L] last w prompt queries, softmaxed
    step_attn: torch.Tensor | None  # [n_heads, L] current query, softmaxed
    acc_attn: torch.Tensor | None  # [n_kv, L] attention summed over steps and group

    @property
    def n_kv(self) -> int: ...

    @property
    def valid(self) -> torch.Tensor: ...

    @property
    def lane_lens(self) -> torch.Tensor: ...

    def need(self, name: str) -> torch.Tensor: ...


@dataclass
class LayerObs:
    """The engine's `LayerView`: one layer of one sequence as a policy sees it at a hook."""

    layer: int
    n_layers: int
    n_heads: int
    positions: torch.Tensor
    seq_len: int
    prompt_len: int
    step: int = 0
    keys: torch.Tensor | None = None
    query: torch.Tensor | None = None
    obs_attn: torch.Tensor | None = None
    step_attn: torch.Tensor | None = None
    acc_attn: torch.Tensor | None = None

    @property
    def n_kv(self) -> int:
        return int(self.positions.shape[0])

    @property
    def valid(self) -> torch.Tensor:
        return self.positions >= 0

    @property
    def lane_lens(self) -> torch.Tensor:
        return self.valid.sum(dim=1)

    def need(self, name: str) -> torch.Tensor:
        return needed(self, name)


@dataclass
class PageObs:
    """One layer of a decode step's sequences, for a page-selection policy.

    A page is one block of the pool. Only the summaries the policy's `needs` name are
    filled: `page_bounds`: `kmin`/`kmax`, its keys' per-channel minimum and maximum;
    `page_means`: `kmean`, its mean key; `index_keys`: `ikeys`, every slot's indexer key,
    and `lens`, each lane's tokens.
    """

    query: torch.Tensor  # [B, n_kv, g, d] float32: each decode row's query heads by KV head
    kmin: torch.Tensor | None  # [B, n_kv, nb, d] per-page channel minimum (`page_bounds`)
    kmax: torch.Tensor | None  # [B, n_kv, nb, d] per-page channel maximum (`page_bounds`)
    have: torch.Tensor  # [B, n_kv] pages each lane holds (the last one is the current page)
    pages: torch.Tensor  # [B] pages each row may read (from the policy's own budget)
    page: int = 0  # tokens per page (0: not given; Quest does not need it)
    kmean: torch.Tensor | None = None  # [B, n_kv, nb, d] per-page mean key (`page_means`)
    ikeys: torch.Tensor | None = None  # [B, n_kv, nb * page, r] indexer keys (`index_keys`)
    lens: torch.Tensor | None = None  # [B, n_kv] tokens each lane holds (`index_keys`)

    def need(self, name: str) -> torch.Tensor:
        return needed(self, name)


@dataclass
class PageChoice:
    """What a page-selection policy answers for one layer of a decode step.

    `pages`/`ok`: the pages each lane reads in full (Quest's whole answer). A token
    selector adds `tokens`, lane slots read one by one beside those pages; NSA adds
    `compressed`, the pages read as one mean-pooled key/value row each (its logit raised by
    log of the page's token count, so the row stands for that many keys).
    """

    pages: torch.Tensor  # [B, n_kv, P] page indices, sorted
    ok: torch.Tensor  # [B, n_kv, P] the slot is a real page the row reads
    tokens: torch.Tensor | None = None  # [B, n_kv, K] lane slot indices read one by one
    tokens_ok: torch.Tensor | None = None  # [B, n_kv, K]
    compressed: torch.Tensor | None = None  # [B, n_kv, nb] pages read as one mean row


@dataclass
class FarObs:
    """One lane's far-tier blocks, for a recall policy, at one decode step."""

    query: torch.Tensor  # [g, d] the query heads of the lane's GQA group
    kmin: torch.Tensor  # [P, d] per far block channel minimum
    kmax: torch.Tensor  # [P, d] per far block channel maximum


def group_reduce(x: torch.Tensor, n_kv: int, how: str = "mean") -> torch.Tensor:
    """Fold query heads `[n_heads, ...]` into their KV heads `[n_kv, ...]` (GQA groups)."""
    g = x.shape[0] // n_kv
    y = x.reshape(n_kv, g, *x.shape[1:])
    if how == "mean":
        return y.mean(dim=1)
    if how == "sum":
        return y.sum(dim=1)
    if how == "max":
        return y.amax(dim=1)
    raise ValueError(f"unknown reduction {how!r}")


def attention_probs(
    q: torch.Tensor, keys: torch.Tensor, key_pos: torch.Tensor, q_pos: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of queries `q [H, t, d]` over lanes `keys [n_kv, L, d]`.

    Causal by original position (a query at p sees keys at positions <= p), padding
    (`key_pos < 0`) masked; returns `[H, t, L]` in float32. This is the definition of
    `obs_attn` and `step_attn`; the engine computes them with it at a hook.
    """
    n_heads, _, d = q.shape
    n_kv = keys.shape[0]
    k = keys.float().repeat_interleave(n_heads // n_kv, dim=0)
    kp = key_pos.repeat_interleave(n_heads // n_kv, dim=0)
    logits = torch.einsum("htd,hld->htl", q.float(), k) / math.sqrt(d)
    ok = (kp[:, None, :] >= 0) & (kp[:, None, :] <= q_pos.view(1, -1, 1))
    logits = logits.masked_fill(~ok, float("-inf"))
    return torch.softmax(logits, dim=-1).nan_to_num(0.0)


def observe_layer(
    *,
    layer: int,
    n_layers: int,
    n_heads: int,
    positions: torch.Tensor,
    seq_len: int,
    prompt_len: int,
    step: int,
    needs: frozenset[str],
    keys: Callable[[], torch.Tensor],
    queries: torch.Tensor | None = None,
    query_pos: torch.Tensor | None = None,
    acc: torch.Tensor | None = None,
    seed: bool = False,
) -> LayerObs:
    """THE observation builder: one layer of one sequence as a policy sees it, with only
    the tensors its `needs` names. The engine's runtime and `ctxlab.hf` both call it, so a
    new input is added here once.

    `positions [n_kv, L]` are the lanes' original positions; `keys()` gives the lanes' keys
    `[n_kv, L, d]` (called only when something needs them: a gather in the engine);
    `queries [H, m, d]` and `query_pos [m]` are the logged last queries of the layer;
    `acc [n_kv, L]` is the runtime's accumulated attention (H2O), a view into its state.
    With `seed` (the prompt-end hook) H2O's scores start here, in place in `acc`: the
    logged prompt queries' attention summed over each GQA group.
    """
    q, q_pos = queries, query_pos
    seeding = seed and acc is not None and "acc_attn" in needs and q is not None
    attn_needs = q is not None and bool(needs & {"obs_attn", "step_attn"})
    k = keys() if "keys" in needs or attn_needs or seeding else None
    obs = LayerObs(
        layer, n_layers, n_heads, positions, seq_len, prompt_len, step,
        keys=k if "keys" in needs else None,
    )  # fmt: skip
    if q is not None and k is not None:
        assert q_pos is not None
        window_attn = None
        if "obs_attn" in needs or seeding:
            window_attn = attention_probs(q, k, positions, q_pos)
        if "obs_attn" in needs:
            obs.obs_attn = window_attn
        if step > 0 and "step_attn" in needs:
            obs.step_attn = attention_probs(q[:, -1:], k, positions, q_pos[-1:])[:, 0]
        if seeding and window_attn is not None and acc is not None:
            acc += group_reduce(window_attn.sum(1), int(positions.shape[0]), "sum")
    if step > 0 and q is not None and "query" in needs:
        obs.query = q[:, -1]
    if "acc_attn" in needs:
        obs.acc_attn = acc
    return obs


def needed(obs: object, name: str) -> torch.Tensor:
    """The observation `name` the policy declared in `needs`; a clear error if the engine
    left it out."""
    t = getattr(obs, name)
    if t is None:
        raise RuntimeError(f"the engine did not provide {name!r} to this policy")
    return t
