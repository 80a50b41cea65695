"""Weight formats: which storage and kernel the linear layers use, chosen at load.

`--weights fp32|fp32-onednn|bf16|int8|int4` (`load_model(weights=...)`, `LLM(weights=...)`):

| format | linear layers | output head | embedding table |
|---|---|---|---|
| fp32 | float32 `nn.Linear` (the parity reference) (****) | float32, tied | float32 |
| fp32-onednn | float32 prepacked for oneDNN (a private copy) | float32, its own copy | float32 |
| bf16 | bfloat16: ctxlab's AMX tiles or loop, oneDNN or `F.linear` (***) | (***) | bfloat16 |
| int8 | int8, a scale per row: AMX tiles, else fbgemm (*) | int8 | int8, a scale per 32 |
| int4 | aten int4, scale and offset per 32 (**) | int8 | int8, a scale per 32 |

(*) on a rotated residual stream (`rotation.py`), so per-token int8 inputs lose little.
(**) calls of 64 tokens or more (prefill) run an int8 copy of the same weights, input
rotated online (`qlinear.Int4Linear`): aten's int4 kernel is slow at large M.
(***) `qlinear.bf16_linear` decides: ctxlab's C kernels where a C compiler builds them (AMX
tiles, a packed copy of the head, where the CPU has them; else the loop on the tied table),
else oneDNN's prepacked kernel (its own copy) on a CPU with bf16 dot products.
(****) calls of up to 8 rows (decode) through ctxlab's compiled loop where it is built
(`gemv.linear`): the same float32 products in another order.
Activations, norms, RoPE, decode attention and the KV cache stay in the model dtype
(`--dtype`). Prefill attention of these formats (bf16, int8, int4) runs in bfloat16 where
the CPU has bf16 dot products (`model.prefill_attention_dtype`; q, k, v rounded to bf16,
float32 sums, as vLLM's bf16): torch's flash kernel is 2.5-3x faster there in bf16; fp32
and fp32-onednn keep float32 (the parity reference).
Where the source is a GGUF whose blocks a format can hold exactly (Q4_0/Q4_1 in int4, Q8_0
in the int8 embedding table), the file's own codes are used; everything else is quantized
from the dequantized float weights, which adds a rounding of its own (docs/decode.md states
it beside the GGUF's). Conversion replaces the modules in place and frees the float copies.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ctxlab.errors import CtxlabError
from ctxlab.model.config import ModelConfig
from ctxlab.model.gguf_blocks import GroupCodes, decode_blocks, quantize_groups, unpermute_qk
from ctxlab.model.qlinear import (
    GroupInt8Embedding,
    Int4Linear,
    Int8Linear,
    OneDNNLinear,
    TableEmbedding,
    bf16_linear,
    native_bf16,
)
from ctxlab.model.rotation import RotateInput, RotateOutput, rotate_residual

WEIGHT_FORMATS = ("fp32", "fp32-onednn", "bf16", "int8", "int4")
DEFAULT_WEIGHTS = "fp32"
LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
_GGUF_PARTS = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}


def check_weights(name: str) -> str:
    """The format name, or one sentence naming the allowed ones."""
    if name not in WEIGHT_FORMATS:
        raise CtxlabError(
            f"--weights {name!r} is not a weight format; use one of {', '.join(WEIGHT_FORMATS)}."
        )
    return name


def gguf_codes(
    path: Path, cfg: ModelConfig, wanted: set[str] | None = None
) -> dict[str, GroupCodes]:
    """The GGUF's own block codes per module of ours ("layers.3.mlp.down_proj", "embed_tokens",
    "lm_head"; only those in `wanted` when given), fused and un-permuted as the float loader
    does; only block types `decode_blocks` reads, and fused groups whose parts share one."""
    from ctxlab.model.gguf_file import read_gguf_file

    tensors = {t.name: t for t in read_gguf_file(path).tensors}

    def codes_of(name: str, heads: int | None = None) -> GroupCodes | None:
        t = tensors.get(name)
        c = None if t is None else decode_blocks(t.qtype, t.data)
        if c is None or heads is None or cfg.arch != "llama":
            return c
        return GroupCodes(
            unpermute_qk(c.codes, heads),
            unpermute_qk(c.scale, heads),
            unpermute_qk(c.offset, heads),
            c.code_zero,
            c.bits,
            c.source,
        )

    out: dict[str, GroupCodes] = {}
    heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}
    for i in range(cfg.num_layers):
        for module, parts in _GGUF_PARTS.items():
            if wanted is not None and f"layers.{i}.{module}" not in wanted:
                continue
            found = [codes_of(f"blk.{i}.{p}.weight", heads.get(p)) for p in parts]
            usable = [c for c in found if c is not None]
            if len(usable) == len(parts) and len({(c.bits, c.code_zero) for c in usable}) == 1:
                out[f"layers.{i}.{module}"] = GroupCodes.cat(usable)
    for gguf_name, ours in (("token_embd.weight", "embed_tokens"), ("output.weight", "lm_head")):
        c = codes_of(gguf_name) if wanted is None or ours in wanted else None
        if c is not None:
            out[ours] = c
    return out


def _linear(fmt: str, weight: torch.Tensor, bias: torch.Tensor | None, codes: GroupCodes | None):
    if fmt == "fp32-onednn":
        return OneDNNLinear(weight, bias)
    if fmt == "bf16":
        return bf16_linear(weight, bias)
    if fmt == "int8":
        return Int8Linear(weight, bias)
    if codes is None or codes.bits != 4:
        codes = quantize_groups(weight, 4)
    return Int4Linear(codes, bias)


def _int8_table(table: torch.Tensor, codes: dict[str, GroupCodes], dtype: torch.dtype):
    source = codes.get("embed_tokens")
    if source is None or source.bits != 8:
        source = quantize_groups(table, 8)
    return GroupInt8Embedding(source, dtype)


def convert_weights(model: nn.Module, fmt: str, gguf: Path | None = None) -> nn.Module:
    """Put `model`'s linear layers, output head and embedding table in format `fmt`, in place.

    `gguf`: the file the model came from, whose own block codes are used where the format
    holds them exactly (int4: Q4_0/Q4_1 layers; int8 and int4: a Q8_0 embedding table).
    int8 first rotates the residual stream (`rotation.rotate_residual`): its kernel quantizes
    activations per token, which outlier channels would otherwise ruin.
    """
    check_weights(fmt)
    if fmt == "fp32":
        return model
    wanted = {"embed_tokens"} if fmt == "int8" else None
    float_only = fmt in ("bf16", "fp32-onednn")
    codes = gguf_codes(gguf, model.config, wanted) if gguf is not None and not float_only else {}
    dtype = model.dtype
    rotated = rotate_residual(model) if fmt == "int8" else None
    for i, layer in enumerate(model.layers):
        for name in LINEARS:
            owner_name, attr = name.split(".")
            owner = getattr(layer, owner_name)
            old = getattr(owner, attr)
            new = _linear(fmt, old.weight, old.bias, codes.get(f"layers.{i}.{name}"))
            if name == "mlp.down_proj" and rotated is not None and rotated["down"] is not None:
                new = RotateInput(new, rotated["down"])
            setattr(owner, attr, new)
    table = model.embed_tokens.weight
    head = table if model.lm_head is None else model.lm_head.weight
    if fmt == "fp32-onednn":
        model.output = OneDNNLinear(head)  # the table stays for lookups: one more copy
    elif fmt == "bf16":
        model.embed_tokens = TableEmbedding(table.to(torch.bfloat16), dtype)
        tied = model.lm_head is None
        model.output = bf16_linear(model.embed_tokens.weight if tied else head)
    elif fmt == "int8":
        model.output = Int8Linear(rotated["head"])
        model.embed_tokens = RotateOutput(_int8_table(table, codes, dtype), rotated["residual"])
    else:
        model.output = Int8Linear(head)
        model.embed_tokens = _int8_table(table, codes, dtype)
    model.lm_head = None
    model.weight_format = fmt
    if fmt in ("bf16", "int8", "int4") and native_bf16():  # torch's flash kernel: 2.5-3x
        model.prefill_attention_dtype = torch.bfloat16
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes held by the model's weights in their stored formats (tied tables counted once)."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if hasattr(module, "weight_bytes"):
            held = [b for b in module.buffers(recurse=False) if b is not None]
            if held and all(b.data_ptr() in seen for b in held):
                continue
            seen.update(b.data_ptr() for b in held)
            total += module.weight_bytes()
            continue
        for p in module.parameters(recurse=False):
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
    return total


def step_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: every linear layer and the output head (the
    embedding table's looked-up rows are negligible and not counted)."""
    total = 0
    for layer in model.layers:
        for name in LINEARS:
            owner, attr = name.split(".")
            total += _decode_bytes(getattr(getattr(layer, owner), attr))
    head = model.output or model.lm_head or model.embed_tokens
    return total + _decode_bytes(head)


def _decode_bytes(module: nn.Module) -> int:
    # int4 also holds a prefill-only int8 copy, which a decode step does not read
    inner = getattr(module, "inner", module)  # RotateInput around down_proj
    return inner.decode_bytes() if hasattr(inner, "decode_bytes") else weight_bytes(module)
