"""`ctxlab generate "text"`: run one prompt through the paged engine, print text + metrics.

torch and the model are imported inside the command so `ctxlab --help` stays fast, and
every check that needs no model (paths, sampling values, KV format, page and pool sizes,
policy and budget) runs before the model loads, so a typo costs a second, not a load.
"""

from __future__ import annotations

from pathlib import Path

import typer

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
    JsonOpt,
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
    check_sampling,
    engine_options,
    input_file,
    refuse_gone_dtype,
    set_threads,
)
from ctxlab.errors import CtxlabError
from ctxlab.inputs import SEED_MAX, check_text, read_text
from ctxlab.json_output import dumps


def register(app: typer.Typer) -> None:
    @app.command("generate")
    def generate(
        prompt: str = typer.Argument(
            None, help="The prompt text (or use --file).", metavar="PROMPT", show_default=False
        ),
        chat: bool = typer.Option(False, "--chat", help="Wrap the prompt as one user message."),
        file: Path = typer.Option(None, "--file", help="Read the prompt from this file."),
        model: ModelOpt = DEFAULT_MODEL,
        max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to generate."),
        temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
        top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass (1 = off)."),
        top_k: int = typer.Option(0, "--top-k", help="Sample from the k likeliest (0 = off)."),
        seed: int = typer.Option(
            None,
            "--seed",
            min=0,
            max=SEED_MAX,
            help="Sampling seed (temperature > 0).",
            show_default=False,
        ),
        kv_pool_tokens: KVPoolTokensOpt = 16384,
        page_size: PageSizeOpt = 16,
        no_prefix_cache: NoPrefixCacheOpt = False,
        gone_dtype: GoneDTypeOpt = None,
        as_json: JsonOpt = False,
        threads: ThreadsOpt = None,
        policy: PolicyOpt = None,
        budget: BudgetOpt = None,
        kv_format: KVFormatOpt = None,
        kv_cache_dtype: KVCacheDtypeOpt = "auto",
        weights: WeightsOpt = "fp32",
        rope_scaling: RopeScalingOpt = None,
        offload_bytes: OffloadBytesOpt = None,
        offload_dir: OffloadDirOpt = None,
    ) -> None:
        """Generate text with the paged-KV engine and print one line of metrics."""
        check_sampling(max_tokens, temperature, top_p, top_k)
        if file is not None:
            if prompt:
                raise CtxlabError(
                    "give the prompt as an argument or with --file, not both "
                    f"({prompt[:20]!r} and {file})."
                )
            prompt = read_text(input_file(file, "--file", "text file"), "--file")
        if not prompt:
            raise CtxlabError("the prompt is empty; give text as an argument or with --file.")
        check_text(prompt, "the prompt")
        refuse_gone_dtype(gone_dtype, "generate")
        options = engine_options(locals())
        tier = check_offload(offload_bytes, offload_dir, not no_prefix_cache, kv_format, model)
        set_threads(threads)
        from ctxlab.commands._model import run_one
        from ctxlab.engine import LLM, SamplingParams
        from ctxlab.model.open_model import open_model
        from ctxlab.model.weights import weight_bytes

        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
        )
        loaded = open_model(model, options.dtype, weights=weights, rope_scaling=rope_scaling)
        llm = LLM(loaded, **{k: v for k, v in options.llm_kwargs().items() if k != "model"})
        attach(llm.engine, tier)
        request = [{"role": "user", "content": prompt}] if chat else prompt
        out = run_one(llm.engine, request, params)
        keeps_all = _budget_keeps_all(budget, len(out.prompt_token_ids), max_tokens)
        if keeps_all:
            typer.echo(f"note: {keeps_all}", err=True)
        m = out.metrics
        stats = llm.stats()
        if as_json:
            doc = {
                "text": out.text,
                "token_ids": out.token_ids,
                "finish_reason": out.finish_reason,
                **m.as_dict(),
                "decode_tok_per_s": _rate(m),  # NaN -> null in dumps
                "pool_bytes": stats.pool_bytes,
                "dtype": options.dtype,
                "policy": policy or "full",
                "budget": budget,
                "budget_keeps_all": keeps_all is not None,
                "kv_format": llm.engine.kv.kv_format,
                "kv_cache_dtype": options.kv_cache_dtype,
                "weights": weights,
                "weight_bytes": weight_bytes(loaded.model),
                "offload": llm.engine.offload.stats().as_dict() if llm.engine.offload else None,
            }
            typer.echo(dumps(doc))
            return
        typer.echo(out.text)
        typer.echo(
            f"[prompt {m.prompt_tokens} tok, reused {m.reused_tokens}, output "
            f"{m.output_tokens} tok ({out.finish_reason}) | TTFT {m.ttft * 1e3:.0f} ms, "
            f"TPOT {m.tpot * 1e3:.1f} ms, {_rate(m):.1f} tok/s | resident KV "
            f"{m.resident_kv_bytes / 2**20:.2f} MiB | preemptions {m.preemptions}"
            + (f" | policy {policy} budget {budget}" if policy else "")
            + (f" | KV {llm.engine.kv.kv_format}" if llm.engine.kv.kv_format else "")
            + (f" | KV {kv_cache_dtype}" if kv_cache_dtype != "auto" else "")
            + (f" | weights {weights}" if weights != "fp32" else "")
            + _offload_note(llm.engine)
            + "]"
        )


def _budget_keeps_all(budget: str | None, prompt_tokens: int, max_tokens: int) -> str | None:
    """A sentence when a token budget covers the whole request, so the policy evicts nothing."""
    from ctxlab.policy.budget import Budget

    tokens = None if budget is None else Budget.parse(budget).tokens  # None: a share
    if tokens is None or tokens < prompt_tokens + max_tokens:
        return None
    return (
        f"--budget {tokens:,} tokens covers the whole request (prompt {prompt_tokens:,} + "
        f"--max-tokens {max_tokens:,}), so the policy keeps every token, as full does."
    )


def _rate(m) -> float:
    """Decode tokens per second after the first token."""
    span = m.latency - m.ttft
    return (m.output_tokens - 1) / span if m.output_tokens > 1 and span > 0 else float("nan")


def _offload_note(engine) -> str:
    """The tier's part of the metrics line: tokens restored, bytes moved each way."""
    if engine.offload is None:
        return ""
    st = engine.offload.stats()
    return (
        f" | offload restored {st.external_prefix_cache_hits} tok, stored "
        f"{st.kv_offload_store_bytes / 2**20:.2f} MiB, loaded "
        f"{st.kv_offload_load_bytes / 2**20:.2f} MiB"
    )
