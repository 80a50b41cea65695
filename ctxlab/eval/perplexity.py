"""Streaming perplexity: a text longer than the cache, scored token by token as it streams.

The text is fed as one prompt in small chunks, and every token is scored against the cache as
the policy had left it when the token arrived (the engine's prompt log-probabilities). Three
runs tell the StreamingLLM story (Xiao et al., 2024):
- full: every token stays; past the trained length RoPE positions extrapolate;
- window: the last W tokens only, no sinks; positions by cache slot;
- streaming: 4 sink tokens plus the last W - 4, positions by cache slot.
window and streaming differ only in the sinks, so the gap between them is what sinks buy.
Chunked feeding means a token sees up to W + chunk - 1 cached tokens; a chunk of 1 is
StreamingLLM's exact token-by-token protocol, larger chunks trade that for speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxlab.errors import CtxlabError
from ctxlab.outputs import save_figure


@dataclass(frozen=True)
class StreamRun:
    label: str
    policy: str | None  # None: the plain engine, every token kept
    sinks: int = 0


STREAM_RUNS = (
    StreamRun("full", None),
    StreamRun("window", "window"),
    StreamRun("streaming", "streaming", sinks=4),
)


@dataclass
class StreamResult:
    label: str
    policy: str
    cache_tokens: int | None
    position_mode: str
    segment_ends: list[int] = field(default_factory=list)
    segment_ppl: list[float] = field(default_factory=list)
    overall_ppl: float = math.nan
    resident_kv_bytes: int = 0
    curve_ends: list[int] = field(default_factory=list)  # the plot's sliding windows: ends
    curve_ppl: list[float] = field(default_factory=list)
    curve_window: int = 0  # tokens in each sliding window


CURVE_POINTS = 32  # points per line in the plot, whatever the table's segment


def segment_perplexity(logprobs: Sequence[float], segment: int) -> tuple[list[int], list[float]]:
    """exp(mean negative log-likelihood) over consecutive segments of `segment` tokens."""
    ends, ppl = [], []
    for start in range(0, len(logprobs), segment):
        part = logprobs[start : start + segment]
        ends.append(start + len(part))
        ppl.append(math.exp(-sum(part) / len(part)))
    return ends, ppl


def sliding_perplexity(
    logprobs: Sequence[float], window: int, points: int
) -> tuple[list[int], list[float]]:
    """Perplexity of the last `window` tokens at about `points` evenly spaced positions.

    Overlapping windows give a smooth curve with many points where disjoint segments give
    few (or noisy, short) ones; every value covers exactly `window` tokens."""
    n = len(logprobs)
    window = max(1, min(window, n))
    step = max(1, (n - window) // max(1, points - 1))
    ends = list(range(window, n + 1, step))
    if ends[-1] != n:
        ends.append(n)
    return ends, [math.exp(-sum(logprobs[e - window : e]) / window) for e in ends]


def text_ids(tokenizer: Any, tokens: int, offset_chars: int = 0) -> list[int]:
    """`tokens` token ids of the shipped natural text, from a character offset."""
    from ctxlab.eval.vocab import essay_text

    text = essay_text()[offset_chars:]
    ids = tokenizer.encode(text[: tokens * 8])
    if len(ids) < tokens:
        raise CtxlabError(f"the shipped text has fewer than {tokens} tokens after that offset")
    return ids[:tokens]


def check_stream_args(tokens: int, cache_tokens: int, chunk: int, segment: int) -> None:
    """Every check that needs no model, so `ctxlab eval perplexity` fails before loading."""
    if cache_tokens <= 4 or chunk <= 0 or segment <= 0:
        raise CtxlabError("cache must exceed 4 tokens; chunk and segment must be positive")
    if tokens <= cache_tokens:
        raise CtxlabError(
            f"the text ({tokens} tokens) must be longer than the cache ({cache_tokens})"
        )


def streaming_perplexity(
    loaded: Any,
    ids: list[int],
    cache_tokens: int,
    chunk: int = 32,
    segment: int = 256,
    runs: Sequence[StreamRun] = STREAM_RUNS,
    on_chunk: Callable[[str, int], None] | None = None,
) -> list[StreamResult]:
    from ctxlab.engine.llm import LLM
    from ctxlab.engine.sampling import SamplingParams
    from ctxlab.policy.registry import make_policy

    check_stream_args(len(ids), cache_tokens, chunk, segment)
    results = []
    for run in runs:
        policy = None
        if run.policy is not None:
            extra = {"sinks": run.sinks} if run.policy == "streaming" else {}
            policy = make_policy(run.policy, cache_tokens, position_mode="cache-slot", **extra)
        pool = len(ids) + 64 if policy is None else cache_tokens + 2 * chunk + 64
        llm = LLM(
            loaded,
            kv_pool_tokens=pool,
            enable_prefix_caching=False,
            max_num_batched_tokens=chunk,
            policy=policy,
            max_model_len=len(ids) + 2,
        )
        (out,) = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=True))
        scored = [lp for lp in out.prompt_logprobs or [] if lp is not None]
        if len(scored) != len(ids) - 1:
            raise RuntimeError(f"{run.label}: scored {len(scored)} of {len(ids) - 1} tokens")
        ends, ppl = segment_perplexity(scored, segment)
        window = max(32, len(scored) // 8)
        fine_ends, fine_ppl = sliding_perplexity(scored, window, CURVE_POINTS)
        results.append(
            StreamResult(
                label=run.label,
                policy=run.policy or "full",
                cache_tokens=None if policy is None else cache_tokens,
                position_mode="original" if policy is None else "cache-slot",
                segment_ends=ends,
                segment_ppl=ppl,
                overall_ppl=math.exp(-sum(scored) / len(scored)),
                resident_kv_bytes=out.metrics.resident_kv_bytes,
                curve_ends=fine_ends,
                curve_ppl=fine_ppl,
                curve_window=window,
            )
        )
        if on_chunk:
            on_chunk(run.label, len(ids))
    return results


def plot_streaming(
    results: Sequence[StreamResult],
    trained_length: int | None,
    cache_tokens: int,
    path: Path,
    kv_dtype: str = "float32",
) -> Path:
    """Perplexity along the stream, one line per run, about CURVE_POINTS points each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    from ctxlab.plan.units import short_tokens

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in results:
        kv = r.resident_kv_bytes / 2**20
        ends, ppl = (r.curve_ends, r.curve_ppl) if r.curve_ends else (r.segment_ends, r.segment_ppl)
        ax.plot(
            ends,
            ppl,
            ".-",
            label=f"{r.label}, {r.position_mode} positions ({kv:.2f} MiB KV at end)",
        )
    ax.axvline(cache_tokens, color="grey", ls=":", label=f"cache size ({cache_tokens} tokens)")
    if trained_length and trained_length <= max(results[0].segment_ends):
        ax.axvline(
            trained_length, color="black", ls="--", label=f"trained length ({trained_length:,})"
        )
    width = results[0].curve_window or results[0].segment_ends[0]
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: short_tokens(v)))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: ""))
    ax.set_xlabel("tokens streamed (K = 1,024)")
    ax.set_ylabel(f"perplexity of the last {width} tokens (log)")
    ax.set_title(f"Streaming perplexity: why sinks matter ({kv_dtype} KV cache)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, frameon=False)
    fig.tight_layout()
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
