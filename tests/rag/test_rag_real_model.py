"""The default model behind the Backend protocol: exact chat-template counts, a real answer
with citations, and a measured prefill."""

from __future__ import annotations

import pytest

from ctxlab.memory.embed import WordLlamaEmbedder
from ctxlab.rag.answer import answer_chat
from ctxlab.rag.ask import ask
from ctxlab.rag.documents import ingest
from ctxlab.rag.readers import SourceDoc

pytestmark = pytest.mark.model


def test_counts_are_the_chat_templates_own(real_backend):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = real_backend.tokenizer.apply_chat(chat, add_generation_prompt=True)
    assert real_backend.count_tokens(chat) == len(ids)
    text = real_backend.tokenizer.decode(ids, skip_special_tokens=False)
    assert text.rstrip().endswith("assistant")  # the generation prompt is counted too


def test_real_answer_cites_the_newest_version(real_backend, store):
    emb = WordLlamaEmbedder()
    for text, day in (
        ("Zanlo Observatory is led by director Tyka Thofen.", "2019-01-01"),
        ("Zanlo Observatory is led by director Romar Rogar.", "2023-01-01"),
    ):
        ingest(store, SourceDoc("zanlo", text, day, "Zanlo", "z"), real_backend, emb, 64, 8)
    got = ask(
        real_backend,
        store,
        "Who is the director of Zanlo Observatory?",
        k=1,
        max_tokens=12,
        embedder=emb,
    )
    assert [p.version for p in got.passages] == [2]
    assert "Romar Rogar" in got.text  # the 135M model copies the one name it is shown
    assert got.citations == ["zanlo#0"]
    assert got.prompt_tokens == real_backend.count_tokens(answer_chat(got.question, got.passages))
    seconds = real_backend.measure_prefill([{"role": "user", "content": "Hello."}])
    assert seconds is not None and seconds > 0
