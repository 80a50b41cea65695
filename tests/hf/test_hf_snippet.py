"""The README's five-line ctxlab.hf example runs as written (offline, the packaged model)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model

SNIPPET = """
import ctxlab.hf
model, tok = ctxlab.hf.from_gguf()  # the packaged SmolLM2 GGUF, read by transformers
ids = tok("Paris is the capital of France. " * 20, return_tensors="pt").input_ids
cache = ctxlab.hf.cache(model, policy="snapkv", budget=0.5)
out = model.generate(ids, cache=cache, max_new_tokens=8, do_sample=False)
print(tok.decode(out[0, ids.shape[1]:]), cache.resident_bytes())
"""


def test_readme_snippet_runs(capsys, gguf_path):
    exec(compile(SNIPPET, "README", "exec"), {})
    text, nbytes = capsys.readouterr().out.rsplit(" ", 1)
    assert text.strip() and int(nbytes) > 0
