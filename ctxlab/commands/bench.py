"""`ctxlab bench serve`: measure any OpenAI-compatible server with `vllm bench serve`'s
definitions (TTFT, TPOT, ITL, E2EL, goodput) and line labels.

Nothing here imports torch: the load generator runs where no model is installed, against
vLLM, SGLang, llama.cpp's server or `ctxlab serve` alike.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import typer

from ctxlab.commands.options import JsonOpt, SeedOpt, output_dir
from ctxlab.json_output import dumps
from ctxlab.outputs import write_text


def register(app: typer.Typer) -> None:
    bench = typer.Typer(help="Load generators for OpenAI-compatible servers.", no_args_is_help=True)
    app.add_typer(bench, name="bench")

    @bench.command("serve")
    def serve(
        base_url: str = typer.Option(
            ..., "--base-url", help="Server root, e.g. http://127.0.0.1:8000 (/v1 optional)."
        ),
        model: str = typer.Option(..., "--model", help="Model name the server expects."),
        endpoint: str = typer.Option(
            "/v1/completions", "--endpoint", help="/v1/completions or /v1/chat/completions."
        ),
        dataset: str = typer.Option(
            "random", "--dataset", help="random, shared-prefix, multi-turn or trace."
        ),
        num_prompts: int = typer.Option(
            None, "--num-prompts", help="Requests (conversations); default 100, a trace: all."
        ),
        input_len: int = typer.Option(128, "--input-len", help="Prompt tokens (words)."),
        output_len: int = typer.Option(32, "--output-len", help="max_tokens per request."),
        range_ratio: float = typer.Option(
            0.0, "--range-ratio", help="random: lengths uniform in len x [1-r, 1+r]."
        ),
        prefix_len: int = typer.Option(
            256, "--prefix-len", help="shared-prefix: tokens of each group's prefix."
        ),
        num_prefixes: int = typer.Option(
            4, "--num-prefixes", help="shared-prefix: groups (request i uses prefix i mod n)."
        ),
        turns: int = typer.Option(3, "--turns", help="multi-turn: user turns per conversation."),
        trace: Path = typer.Option(
            None, "--trace", help="trace: a Mooncake .jsonl (timestamp ms, lengths, hash_ids)."
        ),
        trace_hash_block: int = typer.Option(
            512, "--trace-hash-block", min=1, help="trace: tokens per hash id (Mooncake: 512)."
        ),
        trace_time_scale: float = typer.Option(
            1.0, "--trace-time-scale", help="trace: multiply the timestamps (0.5 = twice as fast)."
        ),
        request_rate: float = typer.Option(
            math.inf, "--request-rate", help="Requests per second (inf: all at once)."
        ),
        burstiness: float = typer.Option(
            1.0, "--burstiness", help="Gamma shape of the arrivals (1: Poisson)."
        ),
        max_concurrency: int = typer.Option(
            None, "--max-concurrency", help="Most requests in flight at once."
        ),
        ignore_eos: bool = typer.Option(
            False, "--ignore-eos", help="Send ignore_eos so every answer has output-len tokens."
        ),
        metric_percentiles: str = typer.Option(
            "99", "--metric-percentiles", help="Percentiles to print, e.g. 50,90,99."
        ),
        percentile_metrics: str = typer.Option(
            "ttft,tpot,itl", "--percentile-metrics", help="Which of ttft,tpot,itl,e2el to print."
        ),
        goodput: list[str] = typer.Option(
            None, "--goodput", help="SLOs in ms, e.g. --goodput 'ttft:300 tpot:50 e2el:2000'."
        ),
        api_key: str = typer.Option(
            None, "--api-key", help="Bearer key (default: $OPENAI_API_KEY when set)."
        ),
        timeout: float = typer.Option(
            600.0,
            "--timeout",
            help="Total seconds per request, however it trickles (the test request: at most 60).",
        ),
        seed: SeedOpt = 0,
        out: Path = typer.Option(
            Path("out/bench"), "--out", help="Folder for result.json (created if missing)."
        ),
        as_json: JsonOpt = False,
    ) -> None:
        """Send a workload to an OpenAI-compatible server and print vLLM's serving metrics."""
        from ctxlab.bench.metrics import parse_goodput, parse_metric_names, parse_percentiles
        from ctxlab.bench.serve import BenchConfig, run_bench

        cfg = BenchConfig(
            base_url=base_url,
            model=model,
            endpoint=endpoint,
            dataset=dataset,
            num_prompts=num_prompts,
            input_len=input_len,
            output_len=output_len,
            range_ratio=range_ratio,
            prefix_len=prefix_len,
            num_prefixes=num_prefixes,
            turns=turns,
            trace=trace,
            trace_hash_block=trace_hash_block,
            trace_time_scale=trace_time_scale,
            request_rate=request_rate,
            burstiness=burstiness,
            max_concurrency=max_concurrency,
            ignore_eos=ignore_eos,
            percentiles=parse_percentiles(metric_percentiles),
            percentile_metrics=parse_metric_names(percentile_metrics),
            goodput=parse_goodput(goodput or []),
            seed=seed,
            api_key=api_key or os.environ.get("OPENAI_API_KEY"),
            timeout=timeout,
        )
        cfg.workload()  # every input check before the first request
        folder = output_dir(out)
        outcome = run_bench(cfg)
        path = folder / "result.json"
        write_text(path, dumps(outcome.document, indent=1) + "\n", "--out")
        if as_json:
            doc = {k: v for k, v in outcome.summary.items()}
            typer.echo(dumps({**doc, "result_file": str(path)}))
        else:
            for line in outcome.lines:
                typer.echo(line)
            typer.echo(f"results written to {path}")
        if outcome.interrupted:
            raise typer.Exit(130)
        failed = [r for r in outcome.results if not r.success]
        if outcome.results and len(failed) == len(outcome.results):
            typer.echo(
                f"error: every timed request failed ({len(failed)} of {len(failed)}), so "
                f"nothing was measured; the first: {failed[0].error}",
                err=True,
            )
            raise typer.Exit(1)
