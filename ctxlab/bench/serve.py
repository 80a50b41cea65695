"""`bench serve` as a function: build the workload, send it, summarize, report.

`BenchConfig` holds every choice of a run; `run_bench(cfg)` returns the summary (vLLM's
keys), the per-request results and the printable lines. The CLI (`ctxlab bench serve`) and
the benchmark scripts both call it, so they measure the same way.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ctxlab.bench import workloads as wl
from ctxlab.bench.client import CHAT, COMPLETIONS, Endpoint
from ctxlab.bench.metrics import RequestResult, summarize
from ctxlab.bench.report import result_document, result_lines
from ctxlab.bench.runner import arrival_times, run
from ctxlab.errors import CtxlabError
from ctxlab.inputs import check_positive
from ctxlab.peer.key import check_key
from ctxlab.peer.url import base_url, public, redact
from ctxlab.progress import progress

DATASETS = ("random", "shared-prefix", "multi-turn", "trace")


@dataclass
class BenchConfig:
    base_url: str
    model: str
    endpoint: str = COMPLETIONS
    dataset: str = "random"
    num_prompts: int | None = None  # None: 100, or every request of a trace
    input_len: int = 128
    output_len: int = 32
    range_ratio: float = 0.0
    prefix_len: int = 256
    num_prefixes: int = 4
    turns: int = 3
    trace: Path | None = None
    trace_hash_block: int = 512
    trace_time_scale: float = 1.0
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ignore_eos: bool = False
    percentiles: list[float] = field(default_factory=lambda: [99.0])
    percentile_metrics: list[str] = field(default_factory=lambda: ["ttft", "tpot", "itl"])
    goodput: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    api_key: str | None = None
    timeout: float = 600.0

    def workload(self) -> tuple[list[wl.BenchRequest], list[float]]:
        """The requests and their arrival times."""
        if self.dataset not in DATASETS:
            raise CtxlabError(f"--dataset {self.dataset!r} is unknown; use {', '.join(DATASETS)}.")
        check_positive(self.timeout, "--timeout")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise CtxlabError(f"--num-prompts must be at least 1, got {self.num_prompts}.")
        n = self.num_prompts or 100
        if self.dataset == "trace":
            if self.trace is None:
                raise CtxlabError("--dataset trace needs --trace FILE (a Mooncake .jsonl).")
            if not math.isinf(self.request_rate):
                raise CtxlabError("a trace keeps its own timestamps; drop --request-rate.")
            reqs = wl.trace_requests(
                self.trace, self.trace_hash_block, self.num_prompts, self.trace_time_scale
            )
            return reqs, [r.arrival or 0.0 for r in reqs]
        if self.dataset == "random":
            reqs = wl.random_requests(
                n, self.input_len, self.output_len, self.range_ratio, self.seed
            )
        elif self.dataset == "shared-prefix":
            reqs = wl.shared_prefix_requests(
                n, self.num_prefixes, self.prefix_len, self.input_len, self.output_len, self.seed
            )
        else:
            reqs = wl.multi_turn_requests(n, self.turns, self.input_len, self.output_len, self.seed)
        return reqs, arrival_times(n, self.request_rate, self.burstiness, self.seed)

    def endpoint_for_run(self) -> Endpoint:
        path = self.endpoint if self.endpoint.startswith("/") else "/" + self.endpoint
        if path not in (COMPLETIONS, CHAT):
            raise CtxlabError(
                f"--endpoint {self.endpoint!r} is unknown; use {COMPLETIONS} or {CHAT}."
            )
        if self.dataset == "multi-turn":
            path = CHAT  # conversations need messages
        root = base_url(self.base_url, "--base-url")
        check_key(
            self.api_key
        )  # a key with a space, a break or non-ASCII: one sentence, the key unshown
        return Endpoint(root, path, self.model, self.api_key, self.ignore_eos)

    def settings(self) -> dict[str, Any]:
        """What the result file records about the run (vLLM's keys where it has them)."""
        d = asdict(self)
        d.pop("api_key")
        d["base_url"] = redact(public(self.base_url))
        d["trace"] = str(self.trace) if self.trace else None
        d["request_rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        d["model_id"] = self.model
        d["date"] = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        d["backend"] = "openai-chat" if self.endpoint_for_run().chat else "openai"
        return d


@dataclass
class BenchOutcome:
    summary: dict[str, Any]
    results: list[RequestResult]
    lines: list[str]
    document: dict[str, Any]
    interrupted: bool


def run_bench(cfg: BenchConfig, show_progress: bool = True) -> BenchOutcome:
    """Run the benchmark; Ctrl-C ends it early with what finished."""
    ep = cfg.endpoint_for_run()
    requests, arrivals = cfg.workload()
    total = sum(1 + len(r.turns) for r in requests)
    label = f"benchmarking {ep.shown} (--timeout {cfg.timeout:g} s per request)"
    with progress(label, total, enabled=show_progress) as bar:
        outcome = asyncio.run(
            run(ep, requests, arrivals, cfg.max_concurrency, cfg.timeout, lambda _r: bar.advance())
        )
    summary = summarize(outcome.results, outcome.duration, cfg.percentiles, cfg.goodput)
    summary["interrupted"] = outcome.interrupted
    lines = result_lines(
        summary, cfg.percentiles, cfg.percentile_metrics, cfg.max_concurrency, cfg.request_rate
    )
    if outcome.interrupted:
        lines.insert(0, f"interrupted: {len(outcome.results)} of {total} requests finished")
    doc = result_document(summary, outcome.results, cfg.settings())
    return BenchOutcome(summary, outcome.results, lines, doc, outcome.interrupted)
