"""What `ctxlab rag ask` costs beyond its model call, in a fresh process, two ways.

The goal (issue 22): on a warm store, a question is answered in the time of its model call
plus under a second. Each question is asked by a fresh `ctxlab rag ask --json` process; the
command times its own phases (retrieval, model load, model call; `Answer.seconds`) and the
script times the whole process from outside, so

    start-up = wall - retrieval - model load - model call   (interpreter, imports, store checks)
    overhead = wall - model call

Two paths, alternated question by question so a change in the machine's load hits both:

- in-process: `--backend ctxlab` (the default): torch, the tokenizer and the weights load in
  every process;
- server: `ctxlab serve` started once (its load is not counted, it is the point), then
  `--backend openai --base-url URL`: the process imports no torch and loads no model.

Also measured, as floors: `python -c pass`, `import torch`, `import transformers`. Medians
over the questions, with the load average before and after (timings on a shared machine are
noisy: read the two paths side by side, not against another day's run).

    PYTHONPATH=. .venv/bin/python benchmarks/rag_ask_overhead.py --questions 5

`--before DIR` also asks every question with an older ctxlab tree (e.g. `git archive
COMMIT | tar -x -C DIR`), alternating with this one on both paths, and prints the median
wall times side by side and their ratio (an older tree may not report phases, so only
wall time is compared).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serving import CLI, ENV, ROOT, ctxlab_server, load_average

MODEL = "smollm2-135m"  # the name `ctxlab serve` serves the default model under
PHASES = ("startup", "retrieval", "model_load", "model_call", "overhead", "wall")


def _wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=ENV, cwd=ROOT, capture_output=True)
    return time.perf_counter() - start


def _ask(db: Path, question: str, extra: list[str], tree: Path = ROOT) -> dict[str, float]:
    cmd = [*CLI, "rag", "ask", question, "--db", str(db), "--max-tokens", "16", "--json", *extra]
    env = {**ENV, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"rag ask failed:\n{res.stderr[-2000:]}")
    doc = json.loads(res.stdout)
    if "seconds" not in doc:  # an older tree: wall time only
        return {"wall": wall}
    s = doc["seconds"]
    inside = s["retrieval"] + s["model_load"] + s["model_call"]
    return {
        **s,
        "wall": wall,
        "startup": wall - inside,
        "overhead": wall - s["model_call"],
    }


def _row(name: str, runs: list[dict[str, float]]) -> str:
    cells = [f"{statistics.median(r[p] for r in runs):.2f}" for p in PHASES]
    return f"| {name} | {len(runs)} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=5, help="questions asked per path")
    parser.add_argument("--before", type=Path, help="an older ctxlab tree to compare against")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from ctxlab.rag.corpus import corpus_fixture

    load_before = load_average()
    floors = {
        "python -c pass": _wall([sys.executable, "-c", "pass"]),
        "import torch": _wall([sys.executable, "-c", "import torch"]),
        "import transformers": _wall([sys.executable, "-c", "import transformers"]),
        "import ctxlab.cli": _wall([sys.executable, "-c", "import ctxlab.cli"]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        fixture = corpus_fixture()
        docs = fixture.write(Path(tmp) / "fixture")
        db = Path(tmp) / "store.db"
        subprocess.run(
            [*CLI, "rag", "ingest", str(docs), "--db", str(db)],
            check=True,
            env=ENV,
            cwd=ROOT,
            capture_output=True,
        )
        questions = [q.question for q in fixture.questions[: args.questions]]
        local: list[dict[str, float]] = []
        served: list[dict[str, float]] = []
        old_local: list[dict[str, float]] = []
        old_served: list[dict[str, float]] = []
        with ctxlab_server() as url:
            remote = ["--backend", "openai", "--base-url", f"{url}/v1", "--served-model", MODEL]
            # untimed: fills the caches a warm store's user has (tokenizer, weights, page cache)
            for tree in [ROOT] + ([args.before] if args.before is not None else []):
                _ask(db, questions[0], [], tree)
            for i, q in enumerate(questions):
                if args.before is not None:
                    old_local.append(_ask(db, q, [], args.before))
                local.append(_ask(db, q, []))
                if args.before is not None:
                    old_served.append(_ask(db, q, remote, args.before))
                served.append(_ask(db, q, remote))
                print(
                    f"question {i + 1}: in-process {local[-1]['wall']:.2f} s "
                    f"(call {local[-1]['model_call']:.2f}), server {served[-1]['wall']:.2f} s "
                    f"(call {served[-1]['model_call']:.2f})",
                    flush=True,
                )
    print()
    print("floors (one fresh process each, wall seconds):")
    for name, s in floors.items():
        print(f"  {name}: {s:.2f} s")
    print()
    print("median seconds per question (fresh `ctxlab rag ask` process, warm store):")
    print("| path | n | " + " | ".join(PHASES) + " |")
    print("|---|---|" + "---|" * len(PHASES))
    print(_row("in-process (--backend ctxlab)", local))
    print(_row("server (--backend openai)", served))
    for name, runs in (("in-process", local), ("server", served)):
        worst = max(r["overhead"] for r in runs)
        med = statistics.median(r["overhead"] for r in runs)
        verdict = "met" if med < 1.0 else "NOT met"
        print(f"{name}: overhead median {med:.2f} s, worst {worst:.2f} s -> goal < 1 s {verdict}")
    if args.before is not None:
        print()
        print(f"median wall seconds, {args.before} (before) against this tree, alternating:")
        for name, old, new in (("in-process", old_local, local), ("server", old_served, served)):
            b = statistics.median(r["wall"] for r in old)
            a = statistics.median(r["wall"] for r in new)
            print(f"  {name}: before {b:.2f} s, now {a:.2f} s, now/before {a / b:.2f}")
    print(f"load average before {load_before}, after {load_average()}")


if __name__ == "__main__":
    main()
