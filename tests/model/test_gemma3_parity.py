"""Gemma 3 270M: ctxlab's decoder and engine against transformers on the same GGUF.

transformers reads the file as `Gemma3ForCausalLM` (its own dequantisation, its own
subtraction of the 1 llama.cpp adds to the norms, its own sliding-window cache), so every
Gemma-specific piece (four norms, q/k norms, embedding scale, GELU-tanh, query scale, two
RoPE bases, the layer pattern, the window) must agree for the tokens to. One prompt is
longer than three windows, so the sliding layers really drop keys; the engine prefills it
in chunks shorter than the window.

Tolerances (float32 on both sides; kernels may differ on another CPU): logits within 2e-3
absolute (they span about -29..30; measured here with the dense backend: 0.0, bitwise
equal), the engine's prompt log-probabilities within 2e-3.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ctxlab.engine import LLM, SamplingParams  # noqa: E402
from ctxlab.model import DenseBackend  # noqa: E402

pytestmark = pytest.mark.model

LOGIT_TOL = 2e-3
LOGPROB_TOL = 2e-3
NEW_TOKENS = 64

SHORT = [
    "The capital of France is",
    "Here is a recipe for bread. First, mix the flour",
    "def fibonacci(n):\n    ",
]
PARAGRAPH = (
    "Section {i}. The harbour town kept its ledgers in a stone tower by the water. Each "
    "evening clerk {i} climbed the stairs, counted the barrels that had come in from the "
    "ships, and wrote the totals beside the names of the captains. When the tide was low, "
    "the clerks argued about whether salt fish or lamp oil had paid more that season. "
)
LONG_TOKENS = 1600  # > 3 windows of 512


@pytest.fixture(scope="module")
def prompts(gemma_loaded) -> list[list[int]]:
    tok = gemma_loaded.tokenizer
    out = [tok.encode(p) for p in SHORT]
    text, i = "", 0
    while len(tok.encode(text)) < LONG_TOKENS:
        text += PARAGRAPH.format(i=i)
        i += 1
    long_ids = tok.encode(text)[:LONG_TOKENS]
    return [*out, long_ids]


@pytest.fixture(scope="module")
def hf_long_hidden(gemma_hf_model, prompts) -> torch.Tensor:
    """transformers' final hidden states [T, 640] over the long prompt (one pass)."""
    with torch.no_grad():
        return gemma_hf_model.model(torch.tensor([prompts[-1]])).last_hidden_state[0]


@pytest.fixture(scope="module")
def engine_outputs(gemma_loaded, prompts):
    """The four prompts through the paged engine as one batch, the long one prefilled in
    chunks of 256 tokens (under the window), each scored and continued greedily."""
    llm = LLM(gemma_loaded, kv_pool_tokens=4096, max_num_batched_tokens=256)
    return llm.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, prompt_logprobs=True))


def test_config_comes_from_the_file(gemma_loaded):
    cfg = gemma_loaded.config
    assert cfg.arch == "gemma3" and cfg.num_layers == 18 and cfg.vocab_size == 262144
    assert cfg.num_heads == 4 and cfg.num_kv_heads == 1 and cfg.head_dim == 256
    globals_ = [i for i, w in enumerate(cfg.sliding_windows) if w is None]
    assert globals_ == [5, 11, 17]
    assert {w for w in cfg.sliding_windows if w is not None} == {512}
    assert cfg.rope_theta == 1_000_000.0 and cfg.rope_local_theta == 10_000.0
    assert cfg.tie_word_embeddings and cfg.final_logit_softcap is None
    assert gemma_loaded.tokenizer.vocab_size == 262144


def test_layer_types_match_transformers(gemma_loaded, gemma_hf_model):
    types = gemma_hf_model.config.layer_types
    assert [w is not None for w in gemma_loaded.config.sliding_windows] == [
        t == "sliding_attention" for t in types
    ]
    assert gemma_hf_model.config.sliding_window == 512


def test_logits_match_transformers_past_the_window(
    gemma_loaded, gemma_hf_model, prompts, hf_long_hidden
):
    """Dense reference backend, one pass over 1,600 tokens; logits compared at positions
    inside the first window and far past it (the full vocabulary at each)."""
    ids = prompts[-1]
    model = gemma_loaded.model
    backend = DenseBackend.for_model(model)
    backend.set_batch([0], [0, len(ids)])
    mine_hidden = model.forward(torch.tensor(ids), torch.arange(len(ids)), backend)
    rows = torch.tensor([0, 1, 100, 511, 512, 513, 900, 1024, 1300, *range(len(ids) - 8, len(ids))])
    mine = model.compute_logits(mine_hidden[rows])
    with torch.no_grad():
        ref = gemma_hf_model.lm_head(hf_long_hidden[rows]).float()
    assert mine.shape == ref.shape == (len(rows), 262144)
    assert (mine - ref).abs().max().item() <= LOGIT_TOL
    assert (mine.argmax(-1) == ref.argmax(-1)).all()


def test_engine_greedy_64_tokens_match_transformers(
    gemma_loaded, gemma_hf_model, prompts, engine_outputs
):
    """transformers decodes each prompt on its own with its own (sliding-window) cache."""
    eos = list(gemma_loaded.tokenizer.eos_token_ids)
    tok = gemma_loaded.tokenizer
    for prompt, out in zip(prompts, engine_outputs, strict=True):
        with torch.no_grad():
            ref = gemma_hf_model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
        expected = ref[0, len(prompt) :].tolist()
        got = list(out.token_ids)
        assert got == expected, tok.decode(got) + " | " + tok.decode(expected)
    assert sum(len(o.token_ids) == NEW_TOKENS for o in engine_outputs) >= 3


def test_engine_prompt_logprobs_past_the_window(
    gemma_hf_model, prompts, engine_outputs, hf_long_hidden
):
    """log p(token i+1 | tokens <= i) over the long prompt, scored by the engine in chunks
    of 256 (all positions are checked for being there; every 5th is compared, to keep the
    oracle's 262k-wide projections cheap)."""
    ids = prompts[-1]
    scored = engine_outputs[-1].prompt_logprobs
    assert scored is not None and len(scored) == len(ids) - 1
    assert all(v is not None for v in scored)
    rows = torch.arange(0, len(ids) - 1, 5)
    got = torch.tensor([scored[i] for i in rows.tolist()], dtype=torch.float32)
    with torch.no_grad():
        lp = torch.log_softmax(gemma_hf_model.lm_head(hf_long_hidden[rows]).float(), -1)
    ref = lp.gather(1, torch.tensor(ids)[rows + 1][:, None])[:, 0]
    assert (got - ref).abs().max().item() <= LOGPROB_TOL


def test_chat_without_a_template_is_plain_text(gemma_loaded):
    """The pretrained GGUF has no chat template: a chat becomes its contents as paragraphs,
    encoded as a prompt (BOS first), so chat-speaking commands run on a base model."""
    tok = gemma_loaded.tokenizer
    assert not tok.has_chat_template
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert tok.apply_chat(chat) == tok.encode("Be brief.\n\nHi there\n\n")
    assert tok.apply_chat(chat)[0] == tok.bos_token_id
