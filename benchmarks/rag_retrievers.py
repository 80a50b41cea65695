"""recall@k of every retriever on both retrieval corpora, with 95 % intervals and paired
changes against the default retriever (retrieval only: no model call, under a minute).

    PYTHONPATH=. .venv/bin/python benchmarks/rag_retrievers.py [--chunk-tokens 64]
        [--overlap-tokens 8] [--fusion] [--json FILE]

The corpora: the seeded fixture (100 questions about made-up organisations, 48 document
versions) and the opening of Coriolanus (`ctxlab/rag/prose.py`: 32 hand-written, mostly
reworded questions). Chunks are cut in the default model's tokens. This is the measurement
behind the default retriever (`ctxlab/rag/retriever.py`, `docs/statistics.md`). `--fusion`
adds the fusion variants tried against BM25: reciprocal rank fusion at constants 1, 10 and
60, with the dense list's vote weighted 1, 0.5 or 0.25, and a convex mix of min-max
normalised scores, all over the same top-50 BM25 and dense lists.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))

import argparse
import json
from pathlib import Path

from ctxlab.memory.engine_backend import EngineBackend
from ctxlab.rag.evaluate import evaluate
from ctxlab.rag.prose import prose_corpus
from ctxlab.rag.retriever import DEFAULT_RETRIEVER

DEPTH = 50
VARIANTS = {
    "rrf c=60": ("rrf", 60, 1.0),
    "rrf c=10": ("rrf", 10, 1.0),
    "rrf c=1": ("rrf", 1, 1.0),
    "rrf c=60 dense x0.5": ("rrf", 60, 0.5),
    "rrf c=60 dense x0.25": ("rrf", 60, 0.25),
    "min-max 0.5 bm25": ("convex", 0, 0.5),
    "min-max 0.7 bm25": ("convex", 0, 0.7),
    "min-max 0.85 bm25": ("convex", 0, 0.85),
}


def fuse(kind: str, c: float, w: float, bm25: list, dense: list) -> list[int]:
    """Row ids best first; ties by row id."""
    score: dict[int, float] = {}
    if kind == "rrf":
        for weight, hits in ((1.0, bm25), (w, dense)):
            for h in hits:
                score[h.rowid] = score.get(h.rowid, 0.0) + weight / (c + h.rank)
    else:
        for weight, hits in ((w, bm25), (1 - w, dense)):
            if not hits:
                continue
            lo, hi = min(h.score for h in hits), max(h.score for h in hits)
            for h in hits:
                norm = (h.score - lo) / (hi - lo) if hi > lo else 1.0
                score[h.rowid] = score.get(h.rowid, 0.0) + weight * norm
    return sorted(score, key=lambda r: (-score[r], r))


def fusion_table(corpus, chunk_tokens: int, overlap_tokens: int, backend) -> list[str]:
    import tempfile

    from ctxlab import stats
    from ctxlab.memory import search as S
    from ctxlab.memory.embed import WordLlamaEmbedder
    from ctxlab.memory.store import open_store
    from ctxlab.rag.evaluate import evidence_chunks, ingest_fixture
    from ctxlab.rag.metrics import recall_at_k
    from ctxlab.rag.retriever import CHUNKS, version_filter

    emb = WordLlamaEmbedder()
    lines = []
    with tempfile.TemporaryDirectory() as tmp, open_store(Path(tmp) / "f.db") as store:
        fx = ingest_fixture(store, backend, emb, 0, chunk_tokens, overlap_tokens, corpus=corpus)
        keys = {
            int(r[0]): f"{r[1]}#{r[2]}"
            for r in store.conn.execute(
                "SELECT c.id, d.doc_id, c.chunk FROM chunks c JOIN documents d ON d.id = c.document"
            )
        }
        where = version_filter()
        lists = {}
        for q in fx.questions:
            vec = emb.embed([q.question])[0]
            lists[q.id] = (
                S.bm25(store.conn, CHUNKS, q.question, DEPTH, where),
                S.dense(store.conn, CHUNKS, vec, DEPTH, where),
            )
        ev = {q.id: evidence_chunks(store, q) for q in fx.questions}

        def recalls(order_of) -> dict[int, list[float]]:
            return {
                k: [
                    recall_at_k([keys[r] for r in order_of(*lists[q.id])], ev[q.id], k)
                    for q in fx.questions
                ]
                for k in (1, 2, 4, 8)
            }

        base = recalls(lambda b, d: [h.rowid for h in b])
        lines.append("| variant | recall@1 | recall@2 | recall@4 | recall@8 |")
        lines.append("|---|---|---|---|---|")
        lines.append(
            "| bm25 | " + " | ".join(f"{sum(v) / len(v):.3f}" for v in base.values()) + " |"
        )
        for name, (kind, c, w) in VARIANTS.items():
            got = recalls(lambda b, d, kind=kind, c=c, w=w: fuse(kind, c, w, b, d))
            cells = []
            for k, v in got.items():
                p = stats.paired(base[k], v).change
                cells.append(
                    f"{sum(v) / len(v):.3f} ({p.value:+.3f} [{p.low:+.3f}, {p.high:+.3f}])"
                )
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--overlap-tokens", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--fusion", action="store_true", help="also the fusion variants")
    args = ap.parse_args()
    backend = EngineBackend()
    out = {}
    for name, corpus in (("fixture", None), ("coriolanus", prose_corpus())):
        report = evaluate(
            backend,
            corpus=corpus,
            answers=False,
            retrievers=("bm25", "dense", "hybrid"),
            answer_retrievers=(DEFAULT_RETRIEVER,),
            chunk_tokens=args.chunk_tokens,
            overlap_tokens=args.overlap_tokens,
            show_progress=False,
        )
        s = report.settings
        print(
            f"\n## {name}: {s['questions']} questions, {s['chunks']} chunks of "
            f"{args.chunk_tokens} tokens (overlap {args.overlap_tokens})\n"
        )
        print("| retriever | k | recall@k | 95 % interval | change vs " + DEFAULT_RETRIEVER + " |")
        print("|---|---|---|---|---|")
        changes = {(c.retriever, c.k): c for c in report.comparisons}
        for r in report.retrieval:
            c = changes.get((r.retriever, r.k))
            delta = (
                "" if c is None else f"{c.change:+.3f} [{c.low:+.3f}, {c.high:+.3f}] {c.verdict}"
            )
            print(
                f"| {r.retriever} | {r.k} | {r.recall:.3f} | "
                f"[{r.recall_low:.3f}, {r.recall_high:.3f}] | {delta} |"
            )
        if args.fusion:
            print(f"\nfusion variants on {name} (change against bm25, paired 95 % interval):\n")
            print("\n".join(fusion_table(corpus, args.chunk_tokens, args.overlap_tokens, backend)))
        out[name] = {
            "retrieval": report.as_dict()["retrieval"],
            "comparisons": report.as_dict()["comparisons"],
        }
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
