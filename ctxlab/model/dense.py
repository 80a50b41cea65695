"""A plain contiguous KV cache: the reference backend for tests and small scripts.

Each sequence keeps, per layer, one growing K and V tensor; position i of the sequence is
row i of its cache. The engine uses the paged pool instead; this one exists so the model can
be checked against transformers without any paging logic in the way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ctxlab.model.llama import LlamaModel


class DenseBackend:
    """Causal attention over contiguous per-sequence caches (GQA, optional sliding windows).

    Call `set_batch(seq_ids, cu_seqlens)` before each forward: tokens cu[i]:cu[i+1] of the
    flat batch are the next tokens of sequence seq_ids[i], appended to its cache.
    """

    def __init__(self, num_layers: int, sliding_windows: Sequence[int | None] | None = None):
        self.num_layers = num_layers
        self.sliding_windows = tuple(sliding_windows or (None,) * num_layers)
        self._k: dict[int, list[torch.Tensor | None]] = {}
        self._v: dict[int, list[torch.Tensor | None]] = {}
        self._seq_ids: list[int] = []
        self._cu: list[int] = []

    @classmethod
    def for_model(cls, model: LlamaModel) -> DenseBackend:
        return cls(model.config.num_layers, model.sliding_windows)

    def set_batch(self, seq_ids: Sequence[int], cu_seqlens: Sequence[int]) -> None:
        if len(cu_seqlens) != len(seq_ids) + 1 or cu_seqlens[0] != 0:
            raise ValueError("cu_seqlens must start at 0 and have one entry per sequence plus one")
        self._seq_ids = list(seq_ids)
        self._cu = [int(c) for c in cu_seqlens]
        for s in self._seq_ids:
            self._k.setdefault(s, [None] * self.num_layers)
            self._v.setdefault(s, [None] * self.num_layers)

    def seq_len(self, seq_id: int) -> int:
        """Tokens cached for a sequence (layer 0)."""
        k = self._k.get(seq_id, [None])[0]
        return 0 if k is None else k.shape[0]

    def free(self, seq_id: int) -> None:
        self._k.pop(seq_id, None)
        self._v.pop(seq_id, None)

    def attend(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if not self._cu or self._cu[-1] != q.shape[0]:
            raise ValueError("set_batch was not called for this flat batch")
        window = self.sliding_windows[layer_idx]
        outs = []
        for i, s in enumerate(self._seq_ids):
            a, b = self._cu[i], self._cu[i + 1]
            ks, vs = self._k[s], self._v[s]
            prev_k, prev_v = ks[layer_idx], vs[layer_idx]
            full_k = k[a:b] if prev_k is None else torch.cat((prev_k, k[a:b]))
            full_v = v[a:b] if prev_v is None else torch.cat((prev_v, v[a:b]))
            ks[layer_idx], vs[layer_idx] = full_k, full_v
            outs.append(_causal_attention(q[a:b], full_k, full_v, window))
        return outs[0] if len(outs) == 1 else torch.cat(outs)


def _causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None
) -> torch.Tensor:
    """q [t, H, d] are the last t of the L positions in k, v [L, Hkv, d]; returns [t, H, d]."""
    t, n_heads, _ = q.shape
    length, n_kv, _ = k.shape
    # 4-D [1, heads, tokens, d] inputs: the fused CPU (flash) kernel only takes 4-D tensors and
    # is several times faster than the 3-D math fallback. enable_gqa maps each KV head to its
    # group of query heads without copying K and V.
    qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    mask = None
    is_causal = False
    if window is None and t == length:
        is_causal = True
    elif window is not None or t > 1:
        q_pos = torch.arange(length - t, length, device=q.device)[:, None]
        k_pos = torch.arange(length, device=q.device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask, is_causal=is_causal, enable_gqa=n_heads != n_kv
    )
    return out.squeeze(0).transpose(0, 1)


@torch.inference_mode()
def greedy_generate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
) -> list[int]:
    """Greedy continuation of one prompt (argmax each step); stops early at an eos id."""
    return greedy_generate_batch(model, [prompt_ids], max_new_tokens, eos_ids)[0]


@torch.inference_mode()
def greedy_generate_batch(
    model: LlamaModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_ids: Sequence[int] = (),
) -> list[list[int]]:
    """Greedy continuations of several prompts run as one flat batch per step.

    Each step feeds every unfinished sequence's new tokens (the whole prompt first, then one
    token), so it exercises the multi-sequence path of the backend the engine also relies on.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens <= 0:
        return [[] for _ in prompts]
    backend = DenseBackend.for_model(model)
    device = model.device
    outputs: list[list[int]] = [[] for _ in prompts]
    pending = {i: list(p) for i, p in enumerate(prompts)}  # seq id -> tokens to feed
    lengths = [0] * len(prompts)  # tokens already cached per sequence
    while pending:
        seq_ids = list(pending)
        chunks = [pending[s] for s in seq_ids]
        cu = [0]
        for c in chunks:
            cu.append(cu[-1] + len(c))
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.int64, device=device)
        positions = torch.cat(
            [
                torch.arange(lengths[s], lengths[s] + len(c))
                for s, c in zip(seq_ids, chunks, strict=True)
            ]
        ).to(device)
        backend.set_batch(seq_ids, cu)
        hidden = model.forward(ids, positions, backend)
        last = torch.tensor([end - 1 for end in cu[1:]], device=device)
        tokens = model.compute_logits(hidden[last]).argmax(-1).tolist()
        for s, c, token in zip(seq_ids, chunks, tokens, strict=True):
            lengths[s] += len(c)
            outputs[s].append(int(token))
            if int(token) in eos_ids or len(outputs[s]) >= max_new_tokens:
                del pending[s]
                backend.free(s)
            else:
                pending[s] = [int(token)]
    return outputs
