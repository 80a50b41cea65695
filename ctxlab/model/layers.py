"""The pieces of one Llama-family decoder block: RMSNorm, GQA attention projections, SwiGLU.

Projections are fused (one q|k|v matmul, one gate|up matmul) because on a CPU a few large
GEMMs beat several small ones; the loader concatenates the checkpoint's separate matrices.
Attention itself is not here: the block hands rotated q/k/v to an `AttentionBackend`, which
owns the cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ctxlab.model import decode_block, elementwise, gemv, norm_kernel
from ctxlab.model.backend import AttentionBackend
from ctxlab.model.config import ModelConfig


class RMSNorm(nn.Module):
    """x / rms(x) * weight, normalised in float32 as the reference implementations do.

    float32 rows run ctxlab's compiled kernel (`norm_kernel`: one pass to sum the squares,
    one to scale), where it is built. Without it, one float32 token (a batch-1 decode step)
    goes through `F.layer_norm` of [x, -x]: that vector has mean 0 and variance mean(x^2), so
    its first half is exactly RMSNorm(x). On CPU `F.rms_norm` runs as five kernels (about
    16 us for 576 values here), layer_norm as one (about 7 us); 61 norms per step make that
    half a millisecond of a ~15 ms step.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self._doubled: tuple[tuple[int, int], torch.Tensor] | None = None

    def _doubled_weight(self) -> torch.Tensor:
        key = (self.weight.data_ptr(), self.weight._version)
        if self._doubled is None or self._doubled[0] != key:
            w = self.weight.detach()
            self._doubled = (key, torch.cat((w, w)))
        return self._doubled[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            y = norm_kernel.rms_norm(x, self.weight, self.eps)
            if y is not None:
                return y
            d = x.shape[-1]
            if x.shape[0] == 1 and x.dim() == 2:
                both = torch.cat((x, x.neg()), -1)
                return F.layer_norm(both, (2 * d,), self._doubled_weight(), None, self.eps)[:, :d]
            return F.rms_norm(x, (d,), self.weight, self.eps)
        normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    """Q/K/V projection, optional per-head q/k RMSNorm (Qwen3), RoPE, backend call, output."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.sliding_window = cfg.sliding_windows[layer_idx]
        self.qkv_proj = gemv.Linear(
            cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias
        )
        self.o_proj = gemv.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        t = x.shape[0]
        nq, nkv = self.num_heads, self.num_kv_heads
        # `.forward` on submodules here and below: no hook dispatch, ~1 us per call saved,
        # some 250 calls per decode step
        qkv = self.qkv_proj.forward(x).view(t, nq + 2 * nkv, self.head_dim)
        qk, v = qkv[:, : nq + nkv], qkv[:, nq + nkv :]
        if self.q_norm is not None and self.k_norm is not None:
            q_normed, k_normed = self.q_norm.forward(qk[:, :nq]), self.k_norm.forward(qk[:, nq:])
            qk = torch.cat((q_normed, k_normed), dim=1)
        # q and k rotated together, in place by the compiled kernel where it applies (qk is
        # this step's own projection output). `cos`/`sin` come as [T, 1, d] with the sign of
        # rotate_half folded into `sin` (see `rope_tables`), so in aten rotate_half is one
        # flip of the two halves: bit for bit x*cos + rotate_half(x)*sin, with fewer kernels.
        if not elementwise.rope_(qk, cos, sin):
            half = self.head_dim // 2
            rot = qk.unflatten(-1, (2, half)).flip(-2).flatten(-2)
            qk = (qk * cos).add_(rot.mul_(sin))
        return self.o_proj.forward(self.attend(qk[:, :nq], qk[:, nq:], v, backend))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        """The backend's attention of rotated q `[T, heads, d]`, k and v `[T, kv heads, d]`,
        as rows `[T, heads * d]` for the output projection."""
        out = backend.attend(self.layer_idx, q, k, v)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) with gate and up in one matmul."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate = cfg.intermediate_size
        self.gate_up_proj = gemv.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = gemv.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj.forward(x)
        act = elementwise.silu_mul(gate_up, self.intermediate)  # one pass where compiled
        if act is None:
            gate, up = gate_up.split(self.intermediate, dim=-1)
            act = F.silu(gate).mul_(up)
        return self.down_proj.forward(act)


def rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, d] -> [T, 1, d] tables for `Attention`, built once per forward: the sin
    half that multiplies -x2 in rotate_half(x) = (-x2, x1) is negated here instead."""
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos.unsqueeze(1), signed.unsqueeze(1)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor:
        # decode sizes, nothing for autograd to record: two compiled calls where they apply
        if x.shape[0] <= gemv.MAX_ROWS and not torch.is_grad_enabled():
            y = self._compiled(x, cos, sin, backend)
            if y is not None:
                return y
        x = self.self_attn.forward(self.input_layernorm.forward(x), cos, sin, backend).add_(x)
        return self.mlp.forward(self.post_attention_layernorm.forward(x)).add_(x)

    def _compiled(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend
    ) -> torch.Tensor | None:
        """`forward` through `decode_block` (bit for bit the same), or None where it does
        not apply."""
        attn, mlp = self.self_attn, self.mlp
        if attn.q_norm is not None:
            return None
        nq, nkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        norms = (self.input_layernorm, self.post_attention_layernorm)
        linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        block = decode_block.for_layer(self, norms, linears, nq + nkv, d)
        if block is None:
            return None
        described = getattr(backend, "compiled_decode", None)  # `CompiledDecodeBackend`
        at = 0 if described is None else described(attn.layer_idx)
        y = block.step(x, cos, sin, at) if at else None  # attention in the same call
        if y is not None:
            return y
        qkv = block.pre(x, cos, sin)
        if qkv is None:
            return None
        qkv = qkv.view(x.shape[0], nq + 2 * nkv, d)
        out = attn.attend(qkv[:, :nq], qkv[:, nq : nq + nkv], qkv[:, nq + nkv :], backend)
        y = block.post(out, x)
        if y is None:  # attention gave rows the block does not take: the Python tail
            x = attn.o_proj.forward(out).add_(x)
            y = mlp.forward(self.post_attention_layernorm.forward(x)).add_(x)
        return y
