"""`ctxlab serve`: an OpenAI-compatible server over the paged engine, with Prometheus metrics.

It takes the same model, policy and pool options as `ctxlab generate`. torch, the model and
the web stack are imported inside the command so `ctxlab --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ctxlab.commands._serve_roles import (
    DecodeCPUOpt,
    DisaggOpt,
    KVSocketOpt,
    PrefillCPUOpt,
    RoleOpt,
    Roles,
    serve_args,
)
from ctxlab.commands.offload_options import (
    OffloadBytesOpt,
    OffloadDirOpt,
    attach,
    check_offload,
)
from ctxlab.commands.options import (
    DEFAULT_MODEL,
    BudgetOpt,
    GoneDTypeOpt,
    KVCacheDtypeOpt,
    KVFormatOpt,
    KVPoolTokensOpt,
    ModelOpt,
    NoPrefixCacheOpt,
    PageSizeOpt,
    PolicyOpt,
    RopeScalingOpt,
    ThreadsOpt,
    WeightsOpt,
    engine_options,
    output_file,
    refuse_gone_dtype,
    set_threads,
)
from ctxlab.errors import CtxlabError


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve(
        model: ModelOpt = DEFAULT_MODEL,
        host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
        port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port)."),
        served_model_name: str = typer.Option(
            None, "--served-model-name", help="Model name clients send (default: --model)."
        ),
        policy: PolicyOpt = None,
        budget: BudgetOpt = None,
        kv_format: KVFormatOpt = None,
        kv_cache_dtype: KVCacheDtypeOpt = "auto",
        kv_pool_tokens: KVPoolTokensOpt = 16384,
        page_size: PageSizeOpt = 16,
        no_prefix_cache: NoPrefixCacheOpt = False,
        gone_dtype: GoneDTypeOpt = None,
        weights: WeightsOpt = "fp32",
        rope_scaling: RopeScalingOpt = None,
        max_num_seqs: int = typer.Option(
            64, "--max-num-seqs", help="Most requests running in one batch."
        ),
        max_num_batched_tokens: int = typer.Option(
            4096, "--max-num-batched-tokens", help="Token budget of one step (chunked prefill)."
        ),
        max_model_len: int = typer.Option(
            None, "--max-model-len", help="Longest prompt + output (default: the model's)."
        ),
        max_waiting: int = typer.Option(
            256, "--max-waiting", help="Requests waiting for admission before 429 answers."
        ),
        request_timeout: float = typer.Option(
            600.0, "--request-timeout", help="Seconds a request may take before it is aborted."
        ),
        api_keys: Path = typer.Option(
            None, "--api-keys", help='TOML key file: [keys] "KEY" = "tenant" (tenant isolation).'
        ),
        metrics_prefix: str = typer.Option(
            "ctxlab", "--metrics-prefix", help="ctxlab (ctxlab:...) or vllm (vLLM's exact names)."
        ),
        offload_bytes: OffloadBytesOpt = None,
        offload_dir: OffloadDirOpt = None,
        threads: ThreadsOpt = None,
        log_level: str = typer.Option("warning", "--log-level", help="uvicorn's log level."),
        step_log: Path = typer.Option(
            None,
            "--step-log",
            help="Append every engine step (its prefill/decode load, seconds, start and the "
            "idle time before it) to this .jsonl file: what the server really did, to set "
            "beside a step profile or the simulator.",
        ),
        kv_events_endpoint: str = typer.Option(
            None,
            "--kv-events-endpoint",
            help="Publish every prefix-cache block stored and removed on this ZMQ PUB "
            "endpoint, in vLLM's KV-event format (tcp://127.0.0.1:PORT); read it with "
            "`ctxlab watch`.",
        ),
        kv_events_replay_endpoint: str = typer.Option(
            None,
            "--kv-events-replay-endpoint",
            help="Answer replay requests for missed event batches here (as vLLM's).",
        ),
        role: str = RoleOpt,
        disaggregated: bool = DisaggOpt,
        kv_socket: str = KVSocketOpt,
        prefill_cpu: int = PrefillCPUOpt,
        decode_cpu: int = DecodeCPUOpt,
    ) -> None:
        """Serve the model over OpenAI's API (/v1/completions, /v1/chat/completions,
        /v1/models) with /health and Prometheus /metrics."""
        refuse_gone_dtype(gone_dtype, "serve")
        options = engine_options(locals())
        tier = check_offload(offload_bytes, offload_dir, not no_prefix_cache, kv_format, model)
        _check(port, max_num_seqs, max_num_batched_tokens, max_waiting, request_timeout)
        roles = Roles.check(
            role,
            disaggregated,
            kv_socket,
            prefill_cpu,
            decode_cpu,
            policy,
            kv_format,
            kv_cache_dtype,
        )
        if tier is not None and (disaggregated or role != "colocated"):
            raise CtxlabError(
                "the offload tier serves one colocated engine: give no --offload-bytes or "
                "--offload-dir with --disaggregated or --role."
            )
        from ctxlab.serve.server import check_log_level

        check_log_level(log_level)
        if step_log is not None:
            output_file(step_log, ".jsonl", "--step-log")
            if disaggregated or role != "colocated":
                raise CtxlabError(
                    "--step-log records one colocated engine's steps; give it without "
                    "--disaggregated or --role."
                )
        _check_kv_events(kv_events_endpoint, kv_events_replay_endpoint, disaggregated, role)
        _check_max_model_len(max_model_len, _positions(model, rope_scaling))  # before the load
        set_threads(threads)
        roles.pin()
        if metrics_prefix not in ("ctxlab", "vllm"):
            raise CtxlabError(
                f"--metrics-prefix {metrics_prefix!r} is unknown; use ctxlab or vllm."
            )
        from ctxlab.serve.tenants import Tenants

        tenants = Tenants.load(api_keys) if api_keys is not None else None
        from ctxlab.progress import progress
        from ctxlab.serve.server import bind

        model_id = f"{model}@{weights}"
        if not roles.is_prefill:
            sock = bind(host, port)  # a taken port is one sentence before the model loads
        roles.start_prefill(
            serve_args(
                model=model,
                page_size=page_size,
                kv_pool_tokens=kv_pool_tokens,
                weights=weights,
                no_prefix_cache=no_prefix_cache,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                rope_scaling=rope_scaling,
                threads=1,
            )
        )

        with progress(f"loading {model}"):
            from ctxlab.engine import LLM

            llm = LLM(
                **options.llm_kwargs(),
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
            )
            _ = llm.tokenizer  # built now, not on the first request
            attach(llm.engine, tier)
        _check_max_model_len(max_model_len, int(llm.engine.config.max_position))
        if roles.is_prefill:
            roles.run_prefill(llm.engine, model_id)
            return
        engine = roles.connect(llm.engine, model_id) if roles.is_decode else llm.engine
        from ctxlab.serve import ServeSettings, create_app
        from ctxlab.serve.server import serve as run

        name = served_model_name or model
        settings = ServeSettings(
            name,
            max_waiting,
            request_timeout,
            metrics_prefix,
            tenants,
            step_log,
            kv_events_endpoint,
            kv_events_replay_endpoint,
        )
        app_ = create_app(engine, settings)
        if roles.is_decode:
            engine.attach_metrics(app_.state.metrics.registry, metrics_prefix, name)

        def ready(url: str) -> None:
            extra = f", policy {policy} budget {budget}" if policy else ""
            typer.echo(f"serving {name} on {url}/v1 (metrics at {url}/metrics{extra})", err=True)
            typer.echo(f"ready {url}", err=False)

        run(app_, sock, log_level, on_ready=ready)


def _check_kv_events(
    endpoint: str | None, replay: str | None, disaggregated: bool, role: str
) -> None:
    """KV events: loopback only, one colocated engine, the packages present."""
    if endpoint is None:
        if replay is not None:
            raise CtxlabError("--kv-events-replay-endpoint needs --kv-events-endpoint.")
        return
    if disaggregated or role != "colocated":
        raise CtxlabError(
            "--kv-events-endpoint publishes one colocated engine's cache; give it without "
            "--disaggregated or --role."
        )
    from ctxlab.kvevents.events import msgpack_module
    from ctxlab.kvevents.subscriber import check_loopback, zmq_module

    check_loopback(endpoint, "--kv-events-endpoint")
    if replay is not None:
        check_loopback(replay, "--kv-events-replay-endpoint")
    msgpack_module()
    zmq_module()


def _positions(model: str, rope_scaling: str | None) -> int | None:
    """The positions the model will run to: its file's, times F under --rope-scaling."""
    from ctxlab.arch.rope_scaling import scaled_positions
    from ctxlab.model.registry import model_positions

    return scaled_positions(model_positions(model), rope_scaling)


def _check_max_model_len(max_model_len: int | None, trained: int | None) -> None:
    """Serving past the model's trained positions would answer with garbage: refuse it."""
    if max_model_len is not None and max_model_len < 1:
        raise CtxlabError(f"--max-model-len must be at least 1, got {max_model_len}.")
    if max_model_len is not None and trained is not None and max_model_len > trained:
        raise CtxlabError(
            f"--max-model-len {max_model_len:,} is beyond the model's {trained:,} positions; "
            f"give at most {trained:,} (or leave it out)."
        )


def _check(
    port: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_waiting: int,
    timeout: float,
) -> None:
    if not 0 <= port <= 65535:
        raise CtxlabError(f"--port must be 0..65535, got {port}.")
    for flag, value in (
        ("--max-num-seqs", max_num_seqs),
        ("--max-num-batched-tokens", max_num_batched_tokens),
        ("--max-waiting", max_waiting),
    ):
        if value < 1:
            raise CtxlabError(f"{flag} must be at least 1, got {value}.")
    if not timeout > 0:
        raise CtxlabError(f"--request-timeout must be positive seconds, got {timeout}.")
