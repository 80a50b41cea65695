"""resolve_arch takes exactly one source; tensor-parallel views split KV heads, not MLA."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxlab.arch import get_preset, resolve_arch
from ctxlab.errors import CtxlabError

FIXTURES = Path(__file__).parent / "fixtures"


def test_resolve_by_name_and_by_config() -> None:
    assert resolve_arch("llama-3.1-8b") == get_preset("llama-3.1-8b")
    by_config = resolve_arch(config=FIXTURES / "llama-3.1-8b.json")
    assert by_config.layers == get_preset("llama-3.1-8b").layers
    assert resolve_arch(config=str(FIXTURES / "mistral-7b-v0.1.json")).n_layers == 32


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"name": "llama-3.1-8b", "config": FIXTURES / "llama-3.1-8b.json"},
        {"name": "llama-3.1-8b", "gguf": "x.gguf"},
        {"config": FIXTURES / "llama-3.1-8b.json", "gguf": "x.gguf"},
    ],
)
def test_resolve_needs_exactly_one_source(kwargs: dict) -> None:
    with pytest.raises(CtxlabError, match="exactly one"):
        resolve_arch(**kwargs)


def test_resolve_unknown_name() -> None:
    with pytest.raises(CtxlabError, match="known presets"):
        resolve_arch("gpt-5")


def test_kv_heads_split_as_ceil_over_ranks() -> None:
    arch = get_preset("llama-3.1-8b")  # 8 KV heads
    assert arch.kv_bytes_per_token_per_rank(1) == 131_072
    assert arch.kv_bytes_per_token_per_rank(2) == 65_536
    assert arch.kv_bytes_per_token_per_rank(8) == 16_384
    # Beyond the KV head count heads are replicated: each rank still holds one.
    assert arch.kv_bytes_per_token_per_rank(16) == 16_384
    smol = get_preset("smollm2-135m")  # 3 KV heads: ceil(3/2) = 2 per rank
    assert smol.kv_bytes_per_token_per_rank(2) == 30 * 2 * 128 * 2


def test_mla_is_replicated_not_split() -> None:
    arch = get_preset("deepseek-v3")
    assert arch.kv_bytes_per_token_per_rank(8) == arch.kv_bytes_per_token()
    assert arch.request_bytes_per_rank(4096, 8) == arch.request_bytes(4096)


def test_recurrent_state_splits_with_heads() -> None:
    kimi = get_preset("kimi-linear-48b-a3b")
    per_rank = kimi.per_rank(4)
    assert per_rank.fixed_state_bytes() == 20 * 8 * 128 * 128 * 2
    assert per_rank.kv_bytes_per_token() == kimi.kv_bytes_per_token()  # MLA layers replicated
    jamba = get_preset("jamba-v0.1")
    assert jamba.per_rank(2).fixed_state_bytes() * 2 == jamba.fixed_state_bytes()


@pytest.mark.parametrize("tp", [0, -1, 1.5, True])
def test_bad_tensor_parallel_size(tp) -> None:
    with pytest.raises(CtxlabError, match="tensor-parallel size"):
        get_preset("llama-3.1-8b").per_rank(tp)
