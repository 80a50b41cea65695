"""Flags and helpers that `ctxlab memory` and `ctxlab rag` share: the chat backend.

Both commands talk to the same two backends (the in-process engine, or any OpenAI-compatible
server) and store into the same SQLite file, so the flags that choose them, and the one
function that builds the backend from them, live here rather than in either command: a
command module imports this one, never a sibling command.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlab.errors import CtxlabError

DbOpt = Annotated[
    Path | None,
    typer.Option("--db", help="SQLite store file (default: ctxlab.db in the user data folder)."),
]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend", help="ctxlab (the in-process engine) or openai (any compatible server)."
    ),
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option("--base-url", help="OpenAI-compatible server, e.g. http://h:8000 (/v1 optional)."),
]
ServedModelOpt = Annotated[
    str,
    typer.Option(
        "--served-model",
        help="Model name sent to the OpenAI-compatible server (default: the server's only "
        "model, from /v1/models).",
    ),
]
ApiKeyOpt = Annotated[
    str,
    typer.Option("--api-key", help="API key for the server (default: $OPENAI_API_KEY when set)."),
]
TimeoutOpt = Annotated[
    float,
    typer.Option("--timeout", help="Total seconds per request to --base-url, however it trickles."),
]
TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        help="The served model's tokenizer (.gguf, HF folder or smollm2-135m) for exact "
        "counts; without it the server's /tokenize or usage report is used.",
    ),
]
RetrieverOpt = Annotated[
    str, typer.Option("--retriever", help="bm25, dense (WordLlama vectors) or hybrid (RRF).")
]


def make_backend(
    backend: str,
    model: str,
    base_url: str | None,
    served_model: str,
    api_key: str,
    tokenizer: str | None,
    dtype: str = "float32",
    window: int | None = None,
    timeout: float = 600.0,
) -> Any:
    """The engine (default) or an OpenAI-compatible server, checked before anything loads.

    `window` is the context window assumed for a server that does not report its own.
    """
    if backend == "ctxlab":
        if base_url is not None:
            raise CtxlabError("--base-url needs --backend openai.")
        from ctxlab.engine_options import EngineOptions
        from ctxlab.memory.engine_backend import EngineBackend

        EngineOptions(model=model, dtype=dtype).check()
        return EngineBackend(model, dtype=dtype, enable_prefix_caching=False)  # its own window
    if backend == "openai":
        if not base_url:
            raise CtxlabError("--backend openai needs --base-url (e.g. http://localhost:8000/v1).")
        from ctxlab.inputs import check_positive
        from ctxlab.memory.openai_backend import OpenAIChatBackend

        check_positive(timeout, "--timeout")
        key = api_key if api_key != "none" else os.environ.get("OPENAI_API_KEY", "none")
        return OpenAIChatBackend(base_url, served_model, key, window, tokenizer, timeout)
    raise CtxlabError(f"--backend {backend!r} is unknown; use ctxlab or openai.")


def parse_list(text: str, flag: str) -> list[str]:
    """A comma list flag's values; an empty list is bad input, not "nothing to do"."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise CtxlabError(f"{flag} needs at least one value.")
    return items


def default_out(kind: str) -> Path:
    """A fresh output folder per run, so a second run never overwrites the first."""
    return Path("out") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
