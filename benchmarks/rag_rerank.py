"""Does reranking BM25's top 8 by the model's own likelihood pay? (an experiment, not shipped)

    PYTHONPATH=. .venv/bin/python benchmarks/rag_rerank.py [prose] [--limit N]

Each of BM25's top 8 passages is scored by the default model's mean log P(question tokens |
passage), and the 8 are re-sorted by it (ties keep BM25's order). recall@1, 2 and 4 before
and after, paired over the same questions (`ctxlab.stats.paired`). The result on the fixture
is in docs/statistics.md: it did not pay, so `ctxlab rag` has no reranking stage.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))

import tempfile
import time
from pathlib import Path

import torch

from ctxlab import stats
from ctxlab.memory.engine_backend import EngineBackend
from ctxlab.memory.store import open_store
from ctxlab.model.dense import DenseBackend
from ctxlab.model.loader import load_model
from ctxlab.rag.evaluate import evidence_chunks, ingest_fixture
from ctxlab.rag.metrics import recall_at_k
from ctxlab.rag.retriever import CorpusRetriever


def main() -> None:
    loaded = load_model("smollm2-135m")
    model, backend = loaded.model, EngineBackend(loaded)
    tok = backend.tokenizer.hf
    args = sys.argv[1:]
    limit = int(args[args.index("--limit") + 1]) if "--limit" in args else None
    corpus = None
    if "prose" in args:
        from ctxlab.rag.prose import prose_corpus

        corpus = prose_corpus()

    def score(passage: str, question: str) -> float:
        ctx = tok(f"{passage}\n\nQuestion: ", add_special_tokens=False)["input_ids"]
        q = tok(question, add_special_tokens=False)["input_ids"]
        ids = ctx + q
        attn = DenseBackend.for_model(model)
        attn.set_batch([0], [0, len(ids)])
        with torch.inference_mode():
            hidden = model.forward(torch.tensor(ids), torch.arange(len(ids)), attn)
            logits = model.compute_logits(hidden)
        lp = torch.log_softmax(logits[len(ctx) - 1 : -1], dim=-1)
        return float(lp[torch.arange(len(q)), torch.tensor(q)].mean())

    t0 = time.perf_counter()
    before: dict[int, list[float]] = {1: [], 2: [], 4: []}
    after: dict[int, list[float]] = {1: [], 2: [], 4: []}
    with tempfile.TemporaryDirectory() as tmp, open_store(Path(tmp) / "r.db") as store:
        fx = ingest_fixture(store, backend, None, 0, 64, 8, corpus=corpus)
        search = CorpusRetriever(store, None)
        questions = fx.questions[:limit] if limit else fx.questions
        for q in questions:
            ev = evidence_chunks(store, q)
            top = search.search(q.question, 8, "bm25")
            ranked = [p.key for p in top]
            s = {p.key: score(p.text, q.question) for p in top}
            new = sorted(ranked, key=lambda k: (-s[k], ranked.index(k)))
            for k in before:
                before[k].append(recall_at_k(ranked, ev, k))
                after[k].append(recall_at_k(new, ev, k))
    for k in before:
        p = stats.paired(before[k], after[k]).change
        print(
            f"recall@{k}: bm25 {sum(before[k]) / len(before[k]):.3f}, reranked "
            f"{sum(after[k]) / len(after[k]):.3f}, change {p.value:+.3f} "
            f"[{p.low:+.3f}, {p.high:+.3f}]"
        )
    print(f"{time.perf_counter() - t0:.0f} s for {len(questions)} questions x 8 passages")


if __name__ == "__main__":
    main()
