"""Reading, chunking and versioned ingestion: never a duplicate, a changed text is a version."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memory_fakes import WordBackend
from rag_pdf import write_pdf

from ctxlab.errors import CtxlabError
from ctxlab.memory.embed import WordLlamaEmbedder
from ctxlab.rag.chunking import chunk_text
from ctxlab.rag.documents import chunks_of, documents, ingest
from ctxlab.rag.readers import SourceDoc, collect, read_document

SPANS = WordBackend().spans


def test_chunks_respect_size_overlap_and_sentence_ends():
    text = " ".join(f"Sentence {i} has five words." for i in range(40))
    spans = SPANS(text)
    chunks = chunk_text(text, spans, 16, 3)
    assert all(c.tokens <= 16 for c in chunks)
    assert all(text[c.start : c.end] == c.text for c in chunks)
    for c in chunks[:-1]:
        assert c.text.endswith(".")  # cut at a sentence end in the chunk's second half
    covered = set()
    for c in chunks:
        covered |= set(range(c.start, c.end))
    assert covered >= {i for i, ch in enumerate(text) if not ch.isspace()}
    for a, b in itertools.pairwise(chunks):
        assert a.end - b.start > 0  # consecutive chunks overlap


def test_chunks_with_the_real_tokenizer(real_backend):
    text = "The Veltrin Bridge spans the Quell. " * 30
    chunks = chunk_text(text, real_backend.spans(text), 32, 4)
    for c in chunks:
        assert len(real_backend.spans(c.text)) <= 32 + 1  # +1: a leading space token merges
    assert len(chunks) > 3


@pytest.mark.parametrize(("size", "overlap"), [(4, 0), (64, 32), (64, -1)])
def test_bad_chunk_sizes(size, overlap):
    with pytest.raises(CtxlabError):
        chunk_text("a b c", [(0, 1)], size, overlap)


def test_front_matter_and_pdf(tmp_path):
    md = tmp_path / "note.md"
    md.write_text("---\ndoc_id: notes/plan\ndate: 2024-02-03\n---\n# The plan\n\nBuild it.\n")
    doc = read_document(md)
    assert (doc.doc_id, doc.date, doc.title, doc.text) == (
        "notes/plan",
        "2024-02-03",
        "The plan",
        "# The plan\n\nBuild it.",
    )
    pdf = write_pdf(tmp_path / "report.pdf", ["Quarterly report.", "Revenue grew."])
    got = read_document(pdf)
    assert "Quarterly report." in got.text and "Revenue grew." in got.text
    assert got.doc_id == "report"


@pytest.mark.parametrize(
    ("name", "content", "phrase"),
    [
        ("a.docx", b"x", "not a .txt, .md or .pdf"),
        ("a.md", b"---\ndate: yesterday\n---\nx", "YYYY-MM-DD"),
        ("a.md", b"   \n", "no text to ingest"),
        ("a.pdf", b"%PDF-1.4 broken", "not a readable PDF"),
        ("a.txt", b"\xff\xfe\x00bad", "not UTF-8"),
    ],
)
def test_bad_documents_are_one_sentence(tmp_path, name, content, phrase):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CtxlabError, match=phrase):
        read_document(path)


def test_collect_checks_every_path_first(tmp_path):
    with pytest.raises(CtxlabError, match="does not exist"):
        collect([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CtxlabError, match="holds no"):
        collect([tmp_path / "empty"])


def doc(text: str, day: str) -> SourceDoc:
    return SourceDoc("acme", text, day, "Acme", "acme.md")


def test_versions_never_duplicate(store):
    emb = WordLlamaEmbedder()
    v1 = "Acme is led by Ada Stone. Acme makes brass valves."
    v2 = "Acme is led by Bo Reed. Acme makes brass valves."
    first = ingest(store, doc(v1, "2020-01-01"), WordBackend(), emb, 8, 1)
    assert (first.status, first.version) == ("new", 1)
    again = ingest(store, doc(v1, "2020-01-01"), WordBackend(), emb, 8, 1)
    assert (again.status, again.version, again.chunks) == ("unchanged", 1, first.chunks)
    second = ingest(store, doc(v2, "2023-01-01"), WordBackend(), emb, 8, 1)
    assert (second.status, second.version) == ("new version", 2)
    old = ingest(store, doc(v1, "2020-01-01"), WordBackend(), emb, 8, 1)  # a folder holding v1
    assert (old.status, old.version) == ("unchanged", 1)
    assert [(d.doc_id, d.version) for d in documents(store)] == [("acme", 1), ("acme", 2)]
    assert "Bo Reed" in " ".join(c.text for c in chunks_of(store, "acme"))
    assert "Ada Stone" in " ".join(c.text for c in chunks_of(store, "acme", 1))


def _char_spans(text: str) -> list[tuple[int, int]]:
    """A tokenizer as hostile as a real one: every digit and every character its own token."""
    return [(i, i + 1) for i in range(len(text))]


@given(
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 99999)), min_size=1, max_size=25),
    st.integers(8, 60),
    st.integers(0, 3),
)
def test_no_chunk_starts_or_ends_inside_a_word_or_number(sentences, size, overlap):
    text = " ".join(" ".join(["word"] * n) + f" {value:,} units." for n, value in sentences)
    overlap = min(overlap * size // 8, size // 2 - 1)
    chunks = chunk_text(text, _char_spans(text), size, overlap)
    assert chunks and chunks[-1].end == len(text)
    for c in chunks:
        assert c.start == 0 or text[c.start - 1].isspace()
        assert c.end == len(text) or text[c.end].isspace() or text[c.end - 1] in ".!?"
        assert c.tokens <= size
    for a, b in itertools.pairwise(chunks):
        assert b.start <= a.end + 1  # nothing between consecutive chunks is skipped


def test_whole_sentences_when_they_fit_and_long_ones_split_with_overlap():
    short = "The bridge opened in 1911. It carries 4,096 carts a day. Its engineer was Ulla."
    chunks = chunk_text(short, _char_spans(short), 40, 4)
    assert all(c.text.endswith(".") for c in chunks)
    assert "It carries 4,096 carts a day." in [c.text for c in chunks]
    long = "This sentence is " + "very " * 30 + "long."
    parts = chunk_text(long, _char_spans(long), 40, 10)
    assert len(parts) > 2
    for a, b in itertools.pairwise(parts):
        assert a.end > b.start  # windows of one long sentence overlap


def test_a_version_1_store_is_migrated_and_its_chunks_found_by_title(tmp_path, word_backend):
    import sqlite3

    from ctxlab.memory.schema import _fts
    from ctxlab.memory.store import open_store
    from ctxlab.rag.retriever import CorpusRetriever

    db = tmp_path / "old.db"
    doc = SourceDoc("org", "Its founder was born here.", "2024-01-01", "Quelith Works", "a.md")
    with open_store(db) as s:
        ingest(s, doc, word_backend, None, 16, 2)
    conn = sqlite3.connect(db)  # make it look like a version 1 file: no heading indexed
    conn.executescript(
        "DROP TRIGGER chunks_ai; DROP TRIGGER chunks_ad; DROP TRIGGER chunks_au;"
        "DROP TABLE chunks_fts; ALTER TABLE chunks DROP COLUMN heading;"
        + _fts("chunks", "text")
        + "INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild');"
        "UPDATE schema_version SET version = 1;"
    )
    conn.close()
    with open_store(db) as s:
        assert s.conn.execute("SELECT version FROM schema_version").fetchone()[0] == 2
        hits = CorpusRetriever(s, None).search("Quelith", 1, "bm25")
        assert [h.key for h in hits] == ["org#0"]
