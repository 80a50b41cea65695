"""The measured tables of docs/memory.md: retrieval, task, cost and compaction on the default
model (SmolLM2-135M-Instruct) over the seeded fixtures, in one process run.

    PYTHONPATH=. .venv/bin/python benchmarks/memory_rag_tables.py [--limit N] [--out DIR]

Retrieval rows come from the 100 gold questions; task rows answer them with two passages
(bm25 and hybrid), with four (hybrid, relevance order and edges order), with the gold
passages alone (the model's ceiling) and with none (what the model knows by itself). Cost
rows count the prompt exactly and time the prefill on the engine. Compaction rows replay
the seeded conversation under every strategy at a 1,024-token window, with the strategy's
note in the system message and next to the user's turn. It prints Markdown
with the load average beside the timings and writes every figure to JSON. On 2 shared CPU
cores it takes about 15 minutes.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from ctxlab.memory import MemoryConfig, compaction_report, conversation_fixture, model_ceiling
from ctxlab.memory.budget import NOTE_POSITIONS
from ctxlab.memory.engine_backend import EngineBackend
from ctxlab.memory.strategies import STRATEGIES
from ctxlab.rag import evaluate


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="First N questions only.")
    parser.add_argument("--out", type=Path, default=Path("out/memory-rag-tables"))
    parser.add_argument(
        "--replot", action="store_true", help="Only redraw the PNGs from --out/tables.json."
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        plots(json.loads((args.out / "tables.json").read_text()), args.out)
        return
    start, load_before = time.perf_counter(), loadavg()
    backend = EngineBackend("smollm2-135m", enable_prefix_caching=False)
    runs = {
        "k2": evaluate(
            backend, answer_retrievers=("bm25", "hybrid"), closed_book=True, limit=args.limit
        ),
        "k4": evaluate(
            backend,
            answer_k=4,
            answer_retrievers=("hybrid",),
            gold_row=False,
            cost_samples=0,
            limit=args.limit,
        ),
        "k4_edges": evaluate(
            backend,
            answer_k=4,
            answer_retrievers=("hybrid",),
            gold_row=False,
            cost_samples=0,
            order="edges",
            limit=args.limit,
        ),
    }
    fx = conversation_fixture(0)
    cfg = MemoryConfig(window=1024, reserve=64)
    ceiling = model_ceiling(fx.history, fx.facts, backend, cfg, 16)
    compaction = [
        compaction_report(
            fx.history, fx.facts, name, backend, replace(cfg, note_position=where), 3, "hybrid", 16
        )
        for where in NOTE_POSITIONS
        for name in STRATEGIES
        if where == "system" or name != "truncation"  # truncation writes no note
    ]
    wall = time.perf_counter() - start
    doc = {
        "load_before": load_before,
        "load_after": loadavg(),
        "wall_s": wall,
        "rag": {k: r.as_dict() for k, r in runs.items()},
        "compaction": [r.as_dict() for r in compaction],
        "compaction_ceiling": ceiling,
    }
    (args.out / "tables.json").write_text(json.dumps(doc, indent=1) + "\n")
    plots(doc, args.out)

    main_run = runs["k2"]
    print(f"load average before {load_before}, after {doc['load_after']}; wall {wall:.0f} s\n")
    print("Retrieval\n\n| retriever | k | recall@k | MRR@k |\n|---|---|---|---|")
    for r in main_run.retrieval:
        print(f"| {r.retriever} | {r.k} | {r.recall:.3f} | {r.mrr:.3f} |")
    print("\nTask\n\n| setting | order | accuracy | citation precision | citation recall |")
    print("|---|---|---|---|---|")
    for run in runs.values():
        for t in run.task:
            print(
                f"| {t.setting} | {run.settings['order']} | {pct(t.accuracy)} | "
                f"{pct(t.citation_precision)} | {pct(t.citation_recall)} |"
            )
    kinds = sorted(main_run.task[0].accuracy_by_kind)
    print("\nTask accuracy by kind\n\n| setting | " + " | ".join(kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for t in main_run.task:
        print(f"| {t.setting} | " + " | ".join(pct(t.accuracy_by_kind[k]) for k in kinds) + " |")
    print(
        "\nCost\n\n| k | prompt tokens | prefill s (n) | USD per 1k questions |\n|---|---|---|---|"
    )
    for c in main_run.cost:
        pre = "-" if c.prefill_s is None else f"{c.prefill_s:.2f} ({c.prefill_samples})"
        print(f"| {c.k} | {c.prompt_tokens:.0f} | {pre} | {c.dollars_per_1k_questions:.4f} |")
    print(f"\n{main_run.verdict}")
    print(
        "\nCompaction\n\n| strategy | in context | recoverable | lost | accuracy | tokens before "
        "| tokens after | compactions |\n|---|---|---|---|---|---|---|---|"
    )
    for r in compaction:
        s = r.summary()
        print(
            f"| {s['strategy']} | {s['in_context']} | {s['recoverable']} | {s['lost']} | "
            f"{pct(s['accuracy'])} | {s['tokens_before']} | {s['tokens_after']} | "
            f"{s['compactions']} |"
        )
    print(f"| (each fact's own message only) | - | - | - | - | {pct(ceiling)} | - | - | - |")


def plots(doc: dict, out: Path) -> None:
    """rag_eval.png (the k=2 run) and compaction.png, rebuilt from the JSON figures."""
    from ctxlab.memory.loss import CompactionReport, FactOutcome
    from ctxlab.memory.plot import plot_compaction
    from ctxlab.rag.plot import plot_eval
    from ctxlab.rag.report import CostRow, EvalReport, RetrievalRow, TaskRow

    rag = doc["rag"]["k2"]
    report = EvalReport(
        settings=rag["settings"],
        retrieval=[RetrievalRow(**r) for r in rag["retrieval"]],
        task=[TaskRow(**t) for t in rag["task"]],
        cost=[CostRow(**c) for c in rag["cost"]],
    )
    plot_eval(report, out / "rag_eval.png")
    reports = []
    for r in doc["compaction"]:
        fields = {
            k: r[k]
            for k in (
                "strategy",
                "window",
                "reserve",
                "messages",
                "tokens_before",
                "tokens_after",
                "compactions",
                "warnings",
                "search_k",
                "retriever",
                "note_position",
            )
        }
        reports.append(
            CompactionReport(
                **fields,
                evicted=r["evicted_messages"],
                facts=[FactOutcome(**f) for f in r["per_fact"]],
            )
        )
    plot_compaction(reports, doc["compaction_ceiling"], out / "compaction.png")


if __name__ == "__main__":
    main()
