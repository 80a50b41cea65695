"""The planner's prediction beside the published and the measured capacity (no server: the
server's /metrics labels and /v1/models card as vLLM 0.32 publishes them). The figures are
vLLM's own start-up answers from issue 36 (CPU build, 1 GiB pool, bf16, block 128)."""

from __future__ import annotations

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.probe import prediction
from ctxlab.probe.identify import ServerInfo

GIB = 1024**3


def _info(model: str, max_len: int, engine: str = "vllm") -> ServerInfo:
    return ServerInfo("http://127.0.0.1:1", model, [model], engine, "0.32.0", max_len)


def _samples(**labels: str) -> list[tuple[str, dict[str, str], float]]:
    return [("vllm:cache_config_info", {"block_size": "128", **labels}, 1.0)]


@pytest.mark.parametrize(
    ("model", "max_len", "blocks", "tokens"),
    [("smollm2-135m", 4096, 364, 46_592), ("gemma-3-270m", 32_768, 2_730, 247_802)],
)
def test_vllm_pool_predicted_from_published_settings(model, max_len, blocks, tokens):
    info = _info(model, max_len)
    samples = _samples(
        cache_dtype="auto", kv_cache_memory_bytes=str(GIB), num_gpu_blocks=str(blocks),
        num_gpu_blocks_override="None", kv_cache_size_tokens=str(tokens),
    )  # fmt: skip
    arch = prediction.served_architecture(info)
    assert not isinstance(arch, str)
    pred = prediction.predict(info, samples, arch)
    assert pred.pool is not None and pred.pool["num_blocks"] == blocks
    assert pred.tokens == tokens  # Gemma: the groups' figure, not blocks x 128
    figs = {f.name: f for f in pred.figures}
    assert figs["num_gpu_blocks predicted / published"].value == f"{blocks} / {blocks}"
    assert "equal" in figs["KV cache size predicted / published"].note


def test_a_wrong_dtype_shows_as_a_disagreement():
    info = _info("smollm2-135m", 4096)
    samples = _samples(
        cache_dtype="float32", kv_cache_memory_bytes=str(GIB), num_gpu_blocks="364"
    )  # fp32 halves the blocks: the published 364 came from a bf16 cache
    pred = prediction.predict(info, samples, prediction.served_architecture(info))
    assert pred.pool is not None and pred.pool["num_blocks"] == 182
    figs = {f.name: f for f in pred.figures}
    assert "off by -182 blocks" in figs["num_gpu_blocks predicted / published"].note
    verdict = prediction.agreement(pred.tokens, 46_592, 46_464, 128)
    assert verdict.value == "predicted" and "disagrees" in verdict.note


def test_the_block_override_is_the_pool():
    info = _info("smollm2-135m", 2048)
    samples = _samples(
        cache_dtype="auto", kv_cache_memory_bytes=str(GIB), num_gpu_blocks_override="48",
        num_gpu_blocks="48",
    )  # fmt: skip
    pred = prediction.predict(info, samples, prediction.served_architecture(info))
    assert pred.tokens == 48 * 128
    assert "num_gpu_blocks_override 48" in pred.figures[0].note


def test_unknown_architecture_and_other_engines_are_not_predicted():
    info = _info("my-finetune", 2048)
    arch = prediction.served_architecture(info)
    assert isinstance(arch, str) and "--arch" in arch
    pred = prediction.predict(info, _samples(num_gpu_blocks="4"), arch)
    assert pred.tokens is None and pred.figures[0].how == "not measurable"
    ours = prediction.predict(_info("smollm2-135m", 2048, "ctxlab"), _samples(), None)
    assert ours.tokens is None and "--kv-pool-tokens" in ours.figures[0].note


def test_user_arch_from_a_config_folder_reads_its_dtype(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,'
        ' "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,'
        ' "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,'
        ' "max_position_embeddings": 8192, "dtype": "float32"}'
    )
    arch = prediction.user_architecture(str(tmp_path))
    assert arch.dtype == "float32"
    samples = _samples(cache_dtype="auto", kv_cache_memory_bytes=str(GIB))
    pred = prediction.predict(_info("x", 4096), samples, arch)
    assert pred.pool is not None and pred.pool["num_blocks"] == 182  # fp32: half of bf16's
    with pytest.raises(CtxlabError, match="unknown architecture preset"):
        prediction.user_architecture("no-such-model")


@pytest.mark.parametrize(
    ("pred", "pub", "meas", "odd"),
    [
        (6144, 6144, 6016, "none"),  # within one page: vLLM's null block
        (12_288, 6144, 6016, "predicted"),
        (6144, 9000, 6016, "published"),
        (6144, 6144, 3000, "measured"),
        (1000, 6144, 20_000, "all"),
        (None, 6144, 3000, "unknown"),
    ],
)
def test_agreement_names_the_figure_that_disagrees(pred, pub, meas, odd):
    verdict = prediction.agreement(pred, pub, meas, 128)
    assert verdict.value == odd
    assert verdict.note.count(". ") == 0  # one sentence


def test_a_served_folder_the_planner_cannot_read_is_a_reason(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    info = _info("x", 2048)
    info.model_root = str(tmp_path)
    why = prediction.served_architecture(info)
    assert isinstance(why, str) and why.startswith(f"the planner cannot read {tmp_path}")
