"""Tokenizer and chat template built from the GGUF file itself."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model


def test_chat_template_matches_transformers(tokenizer):
    messages = [{"role": "user", "content": "What is a KV cache?"}]
    ids = tokenizer.apply_chat(messages)
    direct = tokenizer.hf.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == list(direct)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def test_roundtrip_and_special_ids(tokenizer, loaded):
    text = "Long context costs memory: 1,024 tokens, 3 KV heads."
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert 2 in tokenizer.eos_token_ids  # <|im_end|> ends an assistant turn
    assert tokenizer.vocab_size == loaded.config.vocab_size


def test_tokenizer_is_cached_per_path(loaded):
    from ctxlab.model.tokenizer import load_tokenizer

    again = load_tokenizer(str(loaded.source_path), loaded.config.eos_token_ids)
    assert again is loaded.tokenizer
