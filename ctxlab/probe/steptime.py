"""A step-time profile of a server, measured from outside, in the format `ctxlab profile`
writes (`ctxlab-step-profile/1`), so `ctxlab simulate --profile FILE` predicts it.

- Prefill: cold prompts (fresh words, so nothing is cached) of several lengths, one output
  token each; the client's TTFT is the step (it also holds the request's HTTP and queueing
  overhead, which is what a user's TTFT holds too). Each becomes a prefill step of its
  uncached tokens and their causal keys.
- Decode: b cold prompts of one context sent at once with `ignore_eos`; while all b are
  decoding (after the last first token, before the first last token) each gap between a
  request's chunks is one decode step of batch b, its keys the b contexts so far. A batch
  the server did not run at once (fewer slots than b) leaves no such window and is named
  in the result instead of being faked.

Step times seen from a client are whole-step times only if the server streams one chunk
per step (vLLM, SGLang, llama.cpp and `ctxlab serve` do).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ctxlab.plan.compute import attended_keys
from ctxlab.probe.client import Answer, ProbeClient
from ctxlab.probe.figures import Figure
from ctxlab.probe.prompts import TokenRule, Words, text

PROFILE_FORMAT = "ctxlab-step-profile/1"


@dataclass(frozen=True)
class ProfileDesign:
    prefill_lengths: tuple[int, ...]
    prefill_repeats: int
    decode_contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_tokens: int
    mixed_batch: int = 0  # decoders a mixed step's prompt joins (0: no mixed steps)
    mixed_context: int = 256
    mixed_prompts: tuple[int, ...] = ()

    def planned(self) -> tuple[int, int]:
        reqs = len(self.prefill_lengths) * self.prefill_repeats + len(self.decode_contexts) * sum(
            self.decode_batches
        )
        toks = sum(self.prefill_lengths) * self.prefill_repeats + sum(
            c * sum(self.decode_batches) for c in self.decode_contexts
        )
        mixed = len(self.mixed_prompts) if self.mixed_batch else 0
        reqs += mixed * (self.mixed_batch + 1)
        toks += mixed * self.mixed_batch * self.mixed_context + (
            sum(self.mixed_prompts) if self.mixed_batch else 0
        )
        return reqs, toks


QUICK = ProfileDesign((64, 128, 256, 512), 2, (64, 384), (1, 2, 4, 8), 12, 2, 256, (64, 192, 384))
FULL = ProfileDesign(
    (32, 64, 128, 256, 512, 1024), 3, (64, 256, 768), (1, 2, 3, 4, 6, 8, 12, 16), 16,
    4, 256, (64, 192, 384),
)  # fmt: skip


@dataclass
class ProfileResult:
    steps: list[dict[str, float | int | str]] = field(default_factory=list)
    prefill: list[Figure] = field(default_factory=list)
    decode: list[Figure] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def figures(self) -> list[Figure]:
        return self.prefill + self.decode


def measure(
    client: ProbeClient,
    words: Words,
    rule: TokenRule,
    design: ProfileDesign,
    step: Callable[[str], None],
    slots: int | None = None,
) -> ProfileResult:
    """`slots`: how many requests the server runs at once, where it says (llama.cpp's
    /props); larger batches are not sent (they would only queue)."""
    res = ProfileResult()
    warm = words.take(rule.words_for(32))
    client.complete(text(warm), 32, max_tokens=2)  # untimed: first-request allocations
    for n in design.prefill_lengths:
        times = []
        for _ in range(design.prefill_repeats):
            a = client.complete(text(words.take(rule.words_for(n))), n)
            fresh = a.prompt_tokens - (a.cached_tokens or 0)
            done = a.cached_tokens or 0
            res.steps.append({
                "kind": "prefill", "prefill_tokens": fresh,
                "prefill_keys": attended_keys(a.prompt_tokens) - attended_keys(done),
                "decode_tokens": 0, "decode_keys": 0, "seconds": a.ttft,
            })  # fmt: skip
            times.append(a.ttft)
        med = statistics.median(times)
        res.prefill.append(
            Figure(f"prefill {n} tokens", n / med, "measured",
                   f"median TTFT {med * 1e3:.1f} ms of {len(times)} cold prompts", "tokens/s")
        )  # fmt: skip
        step(f"profile: prefill {n} tokens")
    with ThreadPoolExecutor(max(design.decode_batches)) as pool:
        for ctx in design.decode_contexts:
            for b in design.decode_batches:
                if slots is not None and b > slots:
                    res.missing.append(
                        f"batch {b} at context {ctx}: the server runs at most {slots} requests "
                        "at once (its slots), so it was not sent"
                    )
                    continue
                prompts = [text(words.take(rule.words_for(ctx))) for _ in range(b)]
                answers = list(
                    pool.map(
                        lambda p, n=ctx: client.complete(
                            p, n, max_tokens=design.decode_tokens, ignore_eos=True
                        ),
                        prompts,
                    )
                )
                gaps = _steady_gaps(answers)
                if not gaps:
                    res.missing.append(
                        f"batch {b} at context {ctx}: the {b} requests never decoded together "
                        "(the server ran fewer at once)"
                    )
                else:
                    for k, gap in gaps:
                        keys = sum(a.prompt_tokens + k + 1 for a in answers)
                        res.steps.append({
                            "kind": "decode", "prefill_tokens": 0, "prefill_keys": 0,
                            "decode_tokens": b, "decode_keys": keys, "seconds": gap,
                        })  # fmt: skip
                    med = statistics.median(g for _, g in gaps)
                    res.decode.append(
                        Figure(f"decode step, batch {b}, context {ctx}", med * 1e3, "measured",
                               f"median of {len(gaps)} gaps while all {b} decoded", "ms")
                    )  # fmt: skip
                step(f"profile: decode batch {b} at context {ctx}")
        if design.mixed_batch and (slots is None or design.mixed_batch + 1 <= slots):
            _mixed(client, words, rule, design, pool, res, step)
        elif design.mixed_batch:
            res.missing.append(
                f"mixed steps: {design.mixed_batch} decodes and a prompt need "
                f"{design.mixed_batch + 1} requests at once; the server runs {slots}"
            )
    return res


def _mixed(
    client: ProbeClient,
    words: Words,
    rule: TokenRule,
    design: ProfileDesign,
    pool: ThreadPoolExecutor,
    res: ProfileResult,
    step: Callable[[str], None],
) -> None:
    """A cold prompt sent while b requests decode: the step that computes its prefill also
    gives each decoder a token, so the decoders' gap that ends when the prompt's first token
    arrives is one mixed step (the prompt's prefill beside b decodes)."""
    b, ctx = design.mixed_batch, design.mixed_context
    n_out = 8 * design.decode_tokens  # a decode window long enough to land in
    for n in design.mixed_prompts:
        prompts = [text(words.take(rule.words_for(ctx))) for _ in range(b)]
        fresh = text(words.take(rule.words_for(n)))
        futures = [
            pool.submit(client.complete, p, ctx, max_tokens=n_out, ignore_eos=True) for p in prompts
        ]
        # the decoders' progress is not visible until they finish: wait as long as their
        # prefill and a few decode steps take, then send the prompt
        time.sleep(_lead(res, b, ctx))
        injected = client.complete(fresh, n)
        answers = [f.result() for f in futures]
        found = _mixed_gap(answers, injected)
        if found is None:
            res.missing.append(
                f"mixed step with a {n}-token prompt: its prefill did not land while all "
                f"{b} requests were decoding"
            )
        else:
            k, gap = found
            done = injected.cached_tokens or 0
            res.steps.append({
                "kind": "mixed", "prefill_tokens": injected.prompt_tokens - done,
                "prefill_keys": attended_keys(injected.prompt_tokens) - attended_keys(done),
                "decode_tokens": b,
                "decode_keys": sum(a.prompt_tokens + k + 1 for a in answers),
                "seconds": gap,
            })  # fmt: skip
            res.decode.append(
                Figure(f"mixed step, {n}-token prompt + {b} decodes", gap * 1e3, "measured",
                       "the decoders' gap that ended with the prompt's first token", "ms")
            )  # fmt: skip
        step(f"profile: mixed step, {n}-token prompt beside {b} decodes")


def _lead(res: ProfileResult, b: int, ctx: int) -> float:
    """Seconds to wait before the injected prompt: the b decoders' prefills (each as long as
    the measured prefill nearest to `ctx` tokens, with a fifth to spare) and three steps."""
    pre = [s for s in res.steps if s["kind"] == "prefill"]
    near = min(pre, key=lambda s: abs(int(s["prefill_tokens"]) - ctx), default=None)
    prefill = float(near["seconds"]) * ctx / max(1, int(near["prefill_tokens"])) if near else 1.0
    decode = [float(s["seconds"]) for s in res.steps if s["kind"] == "decode"]
    gap = statistics.median(decode) if decode else 0.1
    return 1.2 * b * prefill + 3 * gap


def _mixed_gap(answers: list[Answer], injected: Answer) -> tuple[int, float] | None:
    if not injected.chunk_times or any(len(a.chunk_times) < 2 for a in answers):
        return None
    t_first = injected.chunk_times[0]
    begin = max(a.chunk_times[0] for a in answers)
    end = min(a.chunk_times[-1] for a in answers)
    t = answers[0].chunk_times
    best = min(range(1, len(t)), key=lambda k: abs(t[k] - t_first))
    gap = t[best] - t[best - 1]
    if not (begin <= t[best - 1] and t[best] <= end and gap > 0):
        return None
    if abs(t[best] - t_first) > 0.5 * gap:
        return None
    return best, gap


def _steady_gaps(answers: list[Answer]) -> list[tuple[int, float]]:
    """(token index, gap) of the first request's chunks while every request was decoding."""
    if any(len(a.chunk_times) < 2 for a in answers):
        return []
    begin = max(a.chunk_times[0] for a in answers)
    end = min(a.chunk_times[-1] for a in answers)
    t = answers[0].chunk_times
    return [
        (k, t[k] - t[k - 1])
        for k in range(1, len(t))
        if t[k - 1] >= begin and t[k] <= end and t[k] > t[k - 1]
    ]


def profile_document(
    res: ProfileResult, server: str, model: str, page: int | None, capacity: int | None, design: str
) -> dict[str, object]:
    return {
        "format": PROFILE_FORMAT,
        "model": model,
        "device": f"server {server} (measured from the client)",
        "source": "ctxlab probe",
        "engine": {"block_size": page, "pool_tokens": capacity},
        "design": design,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "steps": res.steps,
    }
