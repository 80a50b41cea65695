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
from ctxlab.rag.evaluate import evaluate


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(x: float | None) -> str:
    """A share as a whole percentage; '-' when undefined."""
    return "-" if x is None else f"{100 * x:.0f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="First N questions only.")
    parser.add_argument("--out", type=Path, default=Path("out/memory-rag-tables"))
    parser.add_argument(
        "--only",
        choices=("rag", "compaction"),
        default=None,
        help="Run one section; the other is kept from --out/tables.json.",
    )
    parser.add_argument(
        "--replot", action="store_true", help="Only print and redraw from --out/tables.json."
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "tables.json"
    doc = json.loads(saved.read_text()) if saved.is_file() else {}
    if not args.replot:
        run(doc, args)
        saved.write_text(json.dumps(doc, indent=1) + "\n")
    plots(doc, args.out)
    print_tables(doc)


def run(doc: dict, args: argparse.Namespace) -> None:
    backend = EngineBackend("smollm2-135m", enable_prefix_caching=False)
    if args.only in (None, "rag"):
        start, before = time.perf_counter(), loadavg()
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
        doc["rag"] = {k: r.as_dict() for k, r in runs.items()}
        doc["rag_run"] = {
            "load_before": before,
            "load_after": loadavg(),
            "wall_s": time.perf_counter() - start,
        }
    if args.only in (None, "compaction"):
        start, before = time.perf_counter(), loadavg()
        fx = conversation_fixture(0)
        cfg = MemoryConfig(window=1024, reserve=64)
        doc["compaction_ceiling"] = model_ceiling(fx.history, fx.facts, backend, cfg, 16)
        doc["compaction"] = [
            compaction_report(
                fx.history,
                fx.facts,
                name,
                backend,
                replace(cfg, note_position=where),
                3,
                "hybrid",
                16,
            ).as_dict()
            for where in NOTE_POSITIONS
            for name in STRATEGIES
            if where == "system" or name != "truncation"  # truncation writes no note
        ]
        doc["compaction_run"] = {
            "load_before": before,
            "load_after": loadavg(),
            "wall_s": time.perf_counter() - start,
        }


def print_tables(doc: dict) -> None:
    rag, runs = doc["rag_run"], doc["rag"]
    main_run = runs["k2"]
    print(
        f"rag: load average before {rag['load_before']}, after {rag['load_after']}; "
        f"wall {rag['wall_s']:.0f} s\n"
    )
    print("Retrieval\n\n| retriever | k | recall@k | MRR@k |\n|---|---|---|---|")
    for r in main_run["retrieval"]:
        print(f"| {r['retriever']} | {r['k']} | {r['recall']:.3f} | {r['mrr']:.3f} |")
    print("\nTask\n\n| setting | order | accuracy | citation precision | citation recall |")
    print("|---|---|---|---|---|")
    for one in runs.values():
        for t in one["task"]:
            print(
                f"| {t['setting']} | {one['settings']['order']} | {pct(t['accuracy'])} | "
                f"{pct(t['citation_precision'])} | {pct(t['citation_recall'])} |"
            )
    kinds = sorted(main_run["task"][0]["accuracy_by_kind"])
    print("\nTask accuracy by kind\n\n| setting | " + " | ".join(kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for t in main_run["task"]:
        cells = " | ".join(pct(t["accuracy_by_kind"][k]) for k in kinds)
        print(f"| {t['setting']} | {cells} |")
    print("\nCost\n\n| k | prompt tokens | prefill s (n) | USD per 1k questions |")
    print("|---|---|---|---|")
    for c in main_run["cost"]:
        pre = "-" if c["prefill_s"] is None else f"{c['prefill_s']:.2f} ({c['prefill_samples']})"
        print(
            f"| {c['k']} | {c['prompt_tokens']:.0f} | {pre} | {c['dollars_per_1k_questions']:.4f} |"
        )
    print(f"\n{main_run['verdict']}")
    comp = doc["compaction_run"]
    print(
        f"\ncompaction: load average before {comp['load_before']}, after "
        f"{comp['load_after']}; wall {comp['wall_s']:.0f} s\n"
    )
    print(
        "| strategy | note | in context | recoverable | lost | accuracy | tokens before | "
        "tokens after | compactions |\n|---|---|---|---|---|---|---|---|---|"
    )
    for s in doc["compaction"]:
        note = "-" if s["strategy"] == "truncation" else s["note_position"]
        print(
            f"| {s['strategy']} | {note} | {s['in_context']} | {s['recoverable']} | "
            f"{s['lost']} | {pct(s['accuracy'])} | {s['tokens_before']:,} | "
            f"{s['tokens_after']:,} | {s['compactions']} |"
        )
    print(
        f"| (each fact's own message only) | - | - | - | - | "
        f"{pct(doc['compaction_ceiling'])} | - | - | - |"
    )


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
