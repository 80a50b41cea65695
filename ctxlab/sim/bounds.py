"""What a trace may ask of a simulation: the model's context, and this machine's memory.

A trace is data from elsewhere: its prompts may be longer than the simulated model's context
(a request no server would admit, simulated without a word), and its output counts may be
finite but absurd (one request of 10^9 output tokens grew a simulation to 24 GB until the
kernel killed it). `fit_to_context` clamps each request to the context and says how many it
changed; `check_memory` estimates what a run keeps (the timings of every output token) and
refuses one that would not fit in half of the memory available now, naming the limit,
before it starts. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import replace

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.inputs import available_memory
from ctxlab.sim.requests import Trace

# What a run keeps per output token (inter-token gaps, their repeat for percentiles and its
# sorted copy, the decode stretches): about 53 bytes measured on a one-request trace of 1M
# and 4M output tokens with --unlimited-cache (peak RSS 110 MB and 271 MB), rounded up; and
# per request (its Seq, its metrics row).
BYTES_PER_OUTPUT_TOKEN = 64
BYTES_PER_REQUEST = 4096


def memory_needed(trace: Trace) -> int:
    """Bytes a simulation of `trace` keeps, at most (one run)."""
    return trace.output_tokens * BYTES_PER_OUTPUT_TOKEN + len(trace) * BYTES_PER_REQUEST


def check_memory(trace: Trace, available: int | None = None) -> None:
    """Refuse, before it starts, a run that would need more than half the available memory."""
    free = available_memory() if available is None else available
    if free is None:
        return
    limit = free // 2
    need = memory_needed(trace)
    if need <= limit:
        return
    tokens = max(0, (limit - len(trace) * BYTES_PER_REQUEST) // BYTES_PER_OUTPUT_TOKEN)
    raise CtxlabError(
        f"simulating trace {trace.name} ({len(trace):,} requests, {trace.output_tokens:,} "
        f"output tokens) keeps about {need / 2**30:.1f} GiB of per-token timings, more than "
        f"half of the {free / 2**30:.1f} GiB this machine has available; the limit here is "
        f"about {tokens:,} output tokens in all: simulate fewer or shorter requests."
    )


def fit_to_context(trace: Trace, arch: ArchSpec) -> tuple[Trace, str | None]:
    """The trace with every request cut to the model's context (prompt below it, output to
    what is left), and a note saying how many were cut, or None when none was (or the
    architecture does not say its context)."""
    limit = arch.max_position
    if limit <= 1:
        return trace, None
    block = trace.block_tokens
    cut_in = cut_out = 0
    longest = 0
    requests = []
    for r in trace.requests:
        if r.input_len + r.output_len <= limit:
            requests.append(r)
            continue
        longest = max(longest, r.input_len + r.output_len)
        n_in = min(r.input_len, limit - 1)
        cut_in += n_in < r.input_len
        cut_out += 1
        ids = r.hash_ids[: -(-n_in // block)]
        requests.append(replace(r, input_len=n_in, output_len=limit - n_in, hash_ids=ids))
    if not cut_out:
        return trace, None
    note = (
        f"{cut_out:,} of {len(trace):,} requests of {trace.name} ask for more than {arch.name}'s "
        f"{limit:,}-token context (the longest {longest:,} tokens); clamped to it: "
        f"{cut_in:,} prompts cut to {limit - 1:,} tokens, outputs cut to what the context leaves."
    )
    return Trace(trace.name, requests, trace.block_tokens), note
