"""Read an `ArchSpec` from a GGUF file's header, without touching the tensor data.

`ctxlab.arch.gguf_header` parses only the key/value metadata and the tensor table (names,
shapes, types) and checks them against the file's size; nothing is dequantized or read into
memory, so this is cheap even for a 100 GB file. The parameter count comes from the tensor
shapes in that table, and the weight width from their stored sizes (a Q4 file really is
~0.6 bytes per parameter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxlab.arch.gguf_header import GGUFHeader, read_gguf_header
from ctxlab.arch.limits import MAX_DIM, MAX_HEADS, MAX_LAYERS, MAX_TOKENS, MAX_WIDTH, check_heads
from ctxlab.arch.spec import ArchSpec, LayerSpec, RecurrentState
from ctxlab.errors import CtxlabError

# Architectures whose GGUF leaves the sliding pattern implicit (llama.cpp hard-codes it):
# every Nth layer is global.
_DEFAULT_SWA_PERIOD = {"gemma3": 6, "gemma2": 2, "gpt-oss": 2, "cohere2": 4}
# The most each key (after the architecture prefix) may hold; past it the value is absurd.
_KEY_LIMITS = {
    "block_count": MAX_LAYERS,
    "embedding_length": MAX_WIDTH,
    "attention.head_count": MAX_HEADS,
    "attention.head_count_kv": MAX_HEADS,
    "attention.key_length": MAX_DIM,
    "attention.value_length": MAX_DIM,
    "attention.key_length_mla": MAX_DIM,
    "attention.value_length_mla": MAX_DIM,
    "attention.kv_lora_rank": MAX_DIM,
    "attention.sliding_window": MAX_TOKENS,
    "rope.dimension_count": MAX_DIM,
    "context_length": MAX_TOKENS,
    "ssm.state_size": MAX_DIM,
    "ssm.inner_size": MAX_WIDTH,
    "ssm.conv_kernel": MAX_DIM,
    "kda.head_dim": MAX_DIM,
}


# llama.cpp's encoder-only architectures (embedding models): no KV cache to plan.
_ENCODER_ONLY = {"bert", "modern-bert", "neo-bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2",
                 "t5encoder"}  # fmt: skip


class _Meta:
    """Metadata access that names the file and the key in every error."""

    def __init__(self, header: GGUFHeader, origin: str) -> None:
        self.fields = header.metadata
        self.origin = origin
        arch = self.raw("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise self.fail("general.architecture", "is missing")
        if arch in _ENCODER_ONLY:
            raise CtxlabError(
                f"{origin}: {arch!r} is an encoder-only model; it keeps no KV cache, so there "
                "is nothing to plan (ctxlab plans decoders that generate)."
            )
        self.arch = arch

    def fail(self, key: str, why: str) -> CtxlabError:
        return CtxlabError(f"{self.origin}: GGUF key {key!r} {why}")

    def raw(self, key: str) -> Any:
        return self.fields.get(key)

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def int(self, suffix: str, default: int | None = None, minimum: int = 1) -> int:
        key = self.key(suffix)
        value = self.raw(key)
        if value is None:
            if default is None:
                raise self.fail(key, "is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum}, got {value!r}")
        return self._in_range(suffix, value)

    def _in_range(self, suffix: str, value: int) -> int:
        limit = _KEY_LIMITS.get(suffix, MAX_TOKENS)
        if value > limit:
            raise self.fail(
                self.key(suffix), f"of {value:,} is absurdly large; ctxlab accepts up to {limit:,}"
            )
        return value

    def per_layer(self, suffix: str, n_layers: int, default: int | None = None) -> list[int]:
        """An integer that some architectures store per layer (an array) and others once."""
        key = self.key(suffix)
        value = self.raw(key)
        if isinstance(value, list):
            if len(value) != n_layers or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
            ):
                raise self.fail(key, f"must hold {n_layers} non-negative integers")
            return [self._in_range(suffix, v) for v in value]
        return [self.int(suffix, default=default)] * n_layers


def _swa_flags(meta: _Meta, n_layers: int) -> list[bool]:
    """Per layer: does it slide? From the pattern key, or the architecture's known default."""
    if meta.raw(meta.key("attention.sliding_window")) is None:
        return [False] * n_layers
    key = meta.key("attention.sliding_window_pattern")
    pattern = meta.raw(key)
    if isinstance(pattern, list):
        if len(pattern) != n_layers or not all(isinstance(v, bool) for v in pattern):
            raise meta.fail(key, f"must hold {n_layers} true/false values")
        return list(pattern)
    period = pattern if pattern is not None else _DEFAULT_SWA_PERIOD.get(meta.arch)
    if period is None:
        return [True] * n_layers  # e.g. Mistral: every layer slides
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise meta.fail(key, f"must be a positive integer or a list, got {period!r}")
    return [(i + 1) % period != 0 for i in range(n_layers)]


def _param_counts(header: GGUFHeader, meta: _Meta) -> tuple[int, int, int]:
    """(total params, active params, stored bytes) from the tensor table."""
    total = stored = experts = 0
    for tensor in header.tensors:
        n = int(tensor.n_elements)
        total += n
        stored += int(tensor.n_bytes)
        if "_exps" in tensor.name:
            experts += n
    count = meta.int("expert_count", default=0, minimum=0)
    used = meta.int("expert_used_count", default=0, minimum=0)
    active = total
    if experts and count and used:
        active = total - experts + experts * min(used, count) // count
    return total, active, stored


def from_gguf(path: str | Path) -> ArchSpec:
    """Build an `ArchSpec` from a GGUF file's metadata and tensor table."""
    path = Path(path)
    header = read_gguf_header(path)
    meta = _Meta(header, str(path))

    n_layers = meta.int("block_count")
    hidden = meta.int("embedding_length")
    heads = meta.per_layer("attention.head_count", n_layers)
    kv_heads = meta.per_layer("attention.head_count_kv", n_layers, default=max(heads))
    q_heads = max(heads)
    if q_heads < 1:
        raise meta.fail(meta.key("attention.head_count"), "must be at least 1 in some layer")
    d_k = meta.int("attention.key_length", default=hidden // q_heads)
    d_v = meta.int("attention.value_length", default=hidden // q_heads)
    swa = _swa_flags(meta, n_layers)
    window = meta.int("attention.sliding_window") if any(swa) else None
    d_c = meta.int("attention.kv_lora_rank", default=0, minimum=0)
    d_rope = meta.int("rope.dimension_count", default=0, minimum=0)
    if d_c:
        # Newer DeepSeek GGUFs store the absorbed (latent) widths in key/value_length and the
        # per-head attention widths in the *_mla keys.
        d_k = meta.int("attention.key_length_mla", default=d_k)
        d_v = meta.int("attention.value_length_mla", default=d_v)
    notes: list[str] = []

    layers: list[LayerSpec] = []
    for i in range(n_layers):
        if kv_heads[i] == 0:
            layers.append(_recurrent(meta, heads[i] or q_heads, notes, i))
        elif d_c:
            layers.append(
                LayerSpec("mla", kv_heads=heads[i], d_k=d_k, d_v=d_v, d_c=d_c, d_rope=d_rope)
            )
        elif swa[i]:
            check_heads(heads[i] or q_heads, kv_heads[i], f"{path}: layer {i}")
            layers.append(
                LayerSpec("sliding", kv_heads=kv_heads[i], d_k=d_k, d_v=d_v, window=window)
            )
        else:
            check_heads(heads[i] or q_heads, kv_heads[i], f"{path}: layer {i}")
            layers.append(LayerSpec("full", kv_heads=kv_heads[i], d_k=d_k, d_v=d_v))

    total, active, stored = _param_counts(header, meta)
    if total <= 0:
        raise CtxlabError(f"{path}: the GGUF file lists no tensors")
    tokens = meta.raw("tokenizer.ggml.tokens")  # a string array: its length
    vocab = meta.int("vocab_size", default=tokens if isinstance(tokens, int) else 0, minimum=0)
    name = meta.raw("general.name")
    notes.append(
        f"parameters counted from the GGUF tensor table; weights stored at "
        f"{stored / total:.3f} bytes per parameter"
    )
    return ArchSpec(
        name=name if isinstance(name, str) and name else path.stem,
        layers=tuple(layers),
        n_query_heads=q_heads,
        hidden_size=hidden,
        params=total,
        active_params=active if active != total else None,
        vocab_size=vocab,
        max_position=meta.int("context_length", default=0, minimum=0),
        weight_dtype_bytes=stored / total,
        weight_format="as stored in the GGUF",
        source=f"GGUF metadata: {path}",
        notes=tuple(notes),
    )


def _recurrent(meta: _Meta, heads: int, notes: list[str], index: int) -> LayerSpec:
    """A layer without KV heads: Mamba (ssm.*) or KDA (kda.head_dim); otherwise no cache."""
    state_size = meta.int("ssm.state_size", default=0, minimum=0)
    if state_size:
        inner = meta.int("ssm.inner_size")
        state = RecurrentState(
            "mamba",
            d_model=inner,
            expand=1,
            d_state=state_size,
            d_conv=meta.int("ssm.conv_kernel", default=4),
        )
        return LayerSpec("recurrent", recurrent=state)
    kda_dim = meta.int("kda.head_dim", default=0, minimum=0)
    if kda_dim:
        return LayerSpec(
            "recurrent", recurrent=RecurrentState("kda", heads=heads, head_dim=kda_dim)
        )
    if not any("no KV heads" in n for n in notes):
        notes.append(
            f"layer {index} (and any like it) has no KV heads and no known state keys; "
            "it is counted as caching nothing"
        )
    return LayerSpec("none")
