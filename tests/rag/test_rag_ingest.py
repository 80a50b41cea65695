"""Reading, chunking and versioned ingestion: never a duplicate, a changed text is a version."""

from __future__ import annotations

import itertools

import pytest
from conftest import write_pdf
from memory_fakes import WordBackend

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
