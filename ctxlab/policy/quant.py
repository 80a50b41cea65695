"""`quant`: quantized KV storage (a storage format; composes with any eviction policy).

Two formats:
- int8 per token: symmetric absmax, one float32 scale per (token, head) vector.
- KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", ICML
  2024, arXiv:2402.02750), 4 or 2 bits, asymmetric (scale and zero point). Parameters copied:
  keys quantized per channel (a group is `group` = 32 consecutive tokens of one channel),
  values per token (a group is 32 consecutive channels of one token), and the most recent
  tokens kept in full precision until a whole group of `group` tokens is there.

Codes are bit-packed (two 4-bit or four 2-bit codes per byte); scales and zero points are
float32. `kv_bytes` is the exact byte formula and `QuantKV.nbytes` measures the tensors, and
the tests require the two to agree. The arithmetic lives in `ctxlab.kv.quantize`, shared
with the engine's quantized pool (`ctxlab.kv.quant_pool.QuantKVPool`).

In the engine the format is the pool's: `LLM(policy="quant")` keeps every token in a
quantized pool, and `LLM(policy="snapkv", budget=256, kv_format="kivi4")` (CLI:
`--kv-format kivi4`) runs any policy over one: the engine wraps the policy in a
`QuantPolicy`, as `QuantPolicy(fmt="kivi4", base=...)` does by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ctxlab.errors import CtxlabError
from ctxlab.kv.quantize import (
    FORMATS,
    SCALE_BYTES,
    dequantize_asym,
    dequantize_int8,
    kv_bytes,
    pack_bits,
    quantize_asym,
    quantize_int8,
    unpack_bits,
)
from ctxlab.policy.base import Policy, PolicyWrapper
from ctxlab.policy.budget import Budget

__all__ = [
    "FORMATS",
    "SCALE_BYTES",
    "QuantKV",
    "QuantPolicy",
    "dequantize_asym",
    "dequantize_int8",
    "kv_bytes",
    "pack_bits",
    "quantize_asym",
    "quantize_int8",
    "unpack_bits",
]


QUANT_BUDGET = (
    "quant keeps every token (it is a storage format) and takes no budget; to bound the cache "
    "give an eviction policy and a KV format, e.g. --policy snapkv --budget 256 --kv-format kivi4."
)


@dataclass
class QuantKV:
    """One batch of lanes `[n, T, d]` stored quantized, appended token by token or in chunks."""

    fmt: str
    d_k: int
    d_v: int
    group: int = 32
    n: int = 1
    parts: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    resid_k: torch.Tensor | None = None
    resid_v: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise CtxlabError(f"quantization format {self.fmt!r} is unknown; use one of {FORMATS}.")
        if self.fmt != "int8" and (self.d_v % self.group or self.group % 4):
            raise CtxlabError(
                f"KIVI needs the value head dim ({self.d_v}) to be a multiple of the group "
                f"({self.group}) and the group a multiple of 4."
            )
        self.parts = {"k": [], "ks": [], "kz": [], "v": [], "vs": [], "vz": []}
        self.resid_k = torch.zeros(self.n, 0, self.d_k)
        self.resid_v = torch.zeros(self.n, 0, self.d_v)

    @property
    def bits(self) -> int:
        return {"int8": 8, "kivi4": 4, "kivi2": 2}[self.fmt]

    def __len__(self) -> int:
        q = sum(p.shape[1] for p in self.parts["ks"]) if self.fmt == "int8" else 0
        if self.fmt != "int8":
            q = len(self.parts["ks"]) * self.group
        return q + int(self.resid_k.shape[1])

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.fmt == "int8":
            qk, sk = quantize_int8(k)
            qv, sv = quantize_int8(v)
            self.parts["k"].append(qk)
            self.parts["ks"].append(sk)
            self.parts["v"].append(qv)
            self.parts["vs"].append(sv)
            return
        self.resid_k = torch.cat((self.resid_k, k.float()), dim=1)
        self.resid_v = torch.cat((self.resid_v, v.float()), dim=1)
        g = self.group
        while self.resid_k.shape[1] >= g:
            kg, self.resid_k = self.resid_k[:, :g], self.resid_k[:, g:]
            vg, self.resid_v = self.resid_v[:, :g], self.resid_v[:, g:]
            qk, sk, zk = quantize_asym(kg, self.bits, dim=1)  # per channel over g tokens
            vv = vg.reshape(self.n, g, self.d_v // g, g)  # per token, g channels a group
            qv, sv, zv = quantize_asym(vv, self.bits, dim=3)
            self.parts["k"].append(pack_bits(qk, self.bits))
            self.parts["ks"].append(sk)
            self.parts["kz"].append(zk)
            self.parts["v"].append(pack_bits(qv.reshape(self.n, g, self.d_v), self.bits))
            self.parts["vs"].append(sv)
            self.parts["vz"].append(zv)

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 keys `[n, T, d_k]` and values `[n, T, d_v]`, oldest first."""
        ks: list[torch.Tensor] = []
        vs: list[torch.Tensor] = []
        p = self.parts
        if self.fmt == "int8":
            ks = [dequantize_int8(q, s) for q, s in zip(p["k"], p["ks"], strict=True)]
            vs = [dequantize_int8(q, s) for q, s in zip(p["v"], p["vs"], strict=True)]
        else:
            g = self.group
            for i in range(len(p["ks"])):
                qk = unpack_bits(p["k"][i], self.bits)
                ks.append(dequantize_asym(qk, p["ks"][i], p["kz"][i]))
                qv = unpack_bits(p["v"][i], self.bits).reshape(self.n, g, self.d_v // g, g)
                vs.append(dequantize_asym(qv, p["vs"][i], p["vz"][i]).reshape(self.n, g, -1))
        ks.append(self.resid_k)
        vs.append(self.resid_v)
        return torch.cat(ks, dim=1), torch.cat(vs, dim=1)

    @property
    def nbytes(self) -> int:
        """Bytes of every stored tensor (codes, scales, zero points, full-precision tail)."""
        total = sum(t.numel() * t.element_size() for ts in self.parts.values() for t in ts)
        for t in (self.resid_k, self.resid_v):
            total += t.numel() * t.element_size()
        return total


@dataclass
class QuantPolicy(PolicyWrapper):
    """Storage format of the pool: int8 or KIVI 4/2-bit, around any policy (None: keep all).

    `QuantPolicy(fmt="kivi4", base=SnapKVPolicy(...))` runs SnapKV over a KIVI-4 pool; the
    engine's `kv_format=` is the same wrapping. In the pool, KIVI key groups are gcd(group,
    block size) tokens (a group never spans two blocks) and value groups gcd(group, head
    dim) channels.
    """

    name: ClassVar[str] = "quant"
    paper: ClassVar[str] = "int8 per token; KIVI 4/2-bit (Liu et al., ICML 2024)"
    stack_layer: ClassVar[str] = "storage"
    fmt: str = "kivi4"
    group: int = 32

    @classmethod
    def from_budget(cls, budget: Budget | None = None, **params: Any) -> Policy:
        if budget is not None:
            raise CtxlabError(QUANT_BUDGET)
        return cls(**params)

    def check(self) -> None:
        super().check()
        if self.fmt not in FORMATS:
            raise CtxlabError(f"quantization format {self.fmt!r} is unknown; use one of {FORMATS}.")
        if self.group < 1:
            raise CtxlabError(f"the quantization group must be at least 1 token, got {self.group}.")

    def storage(self) -> tuple[str | None, int]:
        return self.fmt, self.group
