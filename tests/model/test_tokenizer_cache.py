"""The tokenizer cache: a cached tokenizer is the built one, and writers never collide."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ctxlab.arch.gguf_header import read_gguf_header
from ctxlab.cache_dir import CACHE_ENV
from ctxlab.model import tokenizer as tok

pytestmark = pytest.mark.model

TEXTS = ["Hello world", "  spaces\n\nand\ttabs", "ünïcödé 漢字 🙂", "<|im_start|>user", ""]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path


def _same(a, b) -> None:
    for text in TEXTS:
        assert a.encode(text) == b.encode(text), text
        assert a.decode(a.encode(text)) == b.decode(b.encode(text))
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    kw = {"add_generation_prompt": True, "tokenize": True, "return_dict": False}
    assert a.apply_chat_template(chat, **kw) == b.apply_chat_template(chat, **kw)
    assert (a.eos_token_id, a.bos_token_id, len(a)) == (b.eos_token_id, b.bos_token_id, len(b))
    assert a.chat_template == b.chat_template


def test_a_cached_tokenizer_equals_the_one_built_from_the_gguf(cache, gguf_path, tokenizer):
    built = tokenizer.hf  # the session's tokenizer (however it was obtained)
    first = tok._cached_gguf_tokenizer(gguf_path)  # a miss in this empty cache: builds
    entries = list((cache / "tokenizers").iterdir())
    assert [e.name for e in entries] == [tok.gguf_tokenizer_key(gguf_path)]
    assert (entries[0] / "tokenizer.json").is_file()
    second = tok._cached_gguf_tokenizer(gguf_path)  # a hit
    _same(first, built)
    _same(second, first)


def test_concurrent_writers_leave_one_whole_entry(cache, gguf_path, tokenizer, monkeypatch):
    monkeypatch.setattr(tok, "_build_from_gguf", lambda _p: tokenizer.hf)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            barrier.wait()
            tok._cached_gguf_tokenizer(gguf_path)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    names = sorted(p.name for p in (cache / "tokenizers").iterdir())
    assert names == [tok.gguf_tokenizer_key(gguf_path)]  # no temporary folder left behind
    _same(tok._cached_gguf_tokenizer(gguf_path), tokenizer.hf)


def test_a_damaged_entry_is_rebuilt(cache, gguf_path, tokenizer, monkeypatch):
    monkeypatch.setattr(tok, "_build_from_gguf", lambda _p: tokenizer.hf)
    entry = cache / "tokenizers" / tok.gguf_tokenizer_key(gguf_path)
    entry.mkdir(parents=True)
    (entry / "tokenizer.json").write_text("{ not json")
    _same(tok._cached_gguf_tokenizer(gguf_path), tokenizer.hf)
    _same(tok._cached_gguf_tokenizer(gguf_path), tokenizer.hf)  # now a good entry


def test_the_key_changes_with_the_file(tmp_path, gguf_path):
    copy = tmp_path / "copy.gguf"
    data = bytearray(gguf_path.read_bytes())
    copy.write_bytes(data)
    assert tok.gguf_tokenizer_key(copy) == tok.gguf_tokenizer_key(gguf_path)
    start, end = read_gguf_header(copy).metadata_span
    at = data.find(b"hello", start, end)  # a vocabulary entry, inside the key/value section
    assert at > 0
    data[at] = ord("j")
    copy.write_bytes(data)
    assert tok.gguf_tokenizer_key(copy) != tok.gguf_tokenizer_key(gguf_path)
