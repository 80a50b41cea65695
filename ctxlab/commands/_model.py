"""Running one request with progress, for the engine commands.

`run_one` drives the engine step by step so a long prompt shows its prefill advancing, then
the decode (`ctxlab.model.open_model` shows the model and tokenizer loading).
"""

from __future__ import annotations

from typing import Any

from ctxlab.progress import progress


def run_one(engine: Any, request: Any, params: Any, *, enabled: bool = True) -> Any:
    """One request through the engine, with the prefill and the decode as progress bars.

    The prompt's length plus `max_tokens` is checked against the model's positions first."""
    ids = engine.encode(request)
    engine.check_context(len(ids), params.max_tokens)
    rid = engine.add_request(ids, params)
    seq = engine.seqs[rid]
    prompt = seq.num_prompt
    # The bar advances once per engine step, i.e. per prefill chunk. A prompt that one step
    # computes whole would sit at 0/N until it is done: a spinner with the count says what
    # happens instead (chunks of max_num_batched_tokens make a moving bar).
    budget = engine.scheduler.max_num_batched_tokens
    one_pass = prompt <= budget
    label = f"prefill of {prompt:,} tokens" + (
        " (one forward pass)" if one_pass else f" (chunks of up to {budget:,})"
    )
    with progress(label, total=None if one_pass else prompt, enabled=enabled) as bar:
        done = 0
        while engine.has_unfinished() and seq.num_computed < prompt and not seq.finished:
            engine.step()
            now = min(seq.num_computed, prompt)
            bar.advance(max(0, now - done))
            done = max(done, now)
    with progress("decoding", total=params.max_tokens, enabled=enabled) as bar:
        produced = len(seq.output_ids)
        bar.advance(produced)
        while engine.has_unfinished():
            engine.step()
            bar.advance(len(seq.output_ids) - produced)
            produced = len(seq.output_ids)
    out = engine.output(rid)
    del engine.seqs[rid]
    return out
