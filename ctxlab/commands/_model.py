"""Loading the model and running one request with progress, for the engine commands.

`open_model` shows a spinner while the weights load and while the tokenizer is built (a
cached tokenizer takes half a second, a first build about ten). `run_one` drives the engine
step by step so a long prompt shows its prefill advancing, then the decode.
"""

from __future__ import annotations

from typing import Any

from ctxlab.commands.options import DEFAULT_MODEL, DEFAULT_MODEL_LABEL
from ctxlab.progress import progress


def model_label(model: str) -> str:
    """The readable name of a model argument (the default's full name)."""
    return DEFAULT_MODEL_LABEL if model == DEFAULT_MODEL else model


def open_model(model: str, dtype: str = "float32", *, enabled: bool = True) -> Any:
    """A `LoadedModel` with its tokenizer built, both under progress."""
    from ctxlab.model import load_model

    with progress(f"loading {model_label(model)} ({dtype})", enabled=enabled):
        loaded = load_model(model, dtype=dtype)
    with progress("loading the tokenizer", enabled=enabled):
        _ = loaded.tokenizer
    return loaded


def run_one(engine: Any, request: Any, params: Any, *, enabled: bool = True) -> Any:
    """One request through the engine, with the prefill and the decode as progress bars."""
    rid = engine.add_request(request, params)
    seq = engine.seqs[rid]
    prompt = seq.num_prompt
    with progress(f"prefill of {prompt:,} tokens", total=prompt, enabled=enabled) as bar:
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
