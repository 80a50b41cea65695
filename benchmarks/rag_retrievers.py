"""recall@k of every retriever on both retrieval corpora, with 95 % intervals and paired
changes against the default retriever (retrieval only: no model call, under a minute).

    PYTHONPATH=. .venv/bin/python benchmarks/rag_retrievers.py [--chunk-tokens 64]
        [--overlap-tokens 8] [--json FILE]

The corpora: the seeded fixture (100 questions about made-up organisations, 48 document
versions) and the opening of Coriolanus (`ctxlab/rag/prose.py`: 32 hand-written, mostly
reworded questions). Chunks are cut in the default model's tokens. This is the measurement
behind the default retriever (`ctxlab/rag/retriever.py`, `docs/statistics.md`).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--overlap-tokens", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None)
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
        out[name] = {
            "retrieval": report.as_dict()["retrieval"],
            "comparisons": report.as_dict()["comparisons"],
        }
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
