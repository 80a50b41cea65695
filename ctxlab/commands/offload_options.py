"""`--offload-bytes` and `--offload-dir`: the prefix cache's second tier, on `generate` and
`serve` (and the workshop config's `[offload]`), checked before the model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Protocol

import typer

from ctxlab.errors import CtxlabError

OffloadBytesOpt = Annotated[
    str | None,
    typer.Option(
        "--offload-bytes",
        help="Host memory for evicted prefix-cache blocks, e.g. 512MiB (0 with --offload-dir: "
        "disk only). Later hits restore them instead of recomputing.",
        show_default=False,
    ),
]
OffloadDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--offload-dir",
        help="Directory for block files below the host tier (one LRU across both).",
        show_default=False,
    ),
]


class _Attachable(Protocol):
    def attach_offload(self, host_bytes: int, directory: str | None = None) -> object: ...


def check_offload(
    offload_bytes: str | None,
    offload_dir: Path | None,
    prefix_cache: bool = True,
    kv_format: str | None = None,
    model: str | None = None,
) -> tuple[int, str | None] | None:
    """(host bytes, directory) when a tier was asked for, else None; one sentence if wrong
    (before the model loads: a quantized KV format or a sliding-window model is refused
    here, read from the model file's header)."""
    if offload_bytes is None and offload_dir is None:
        return None
    from ctxlab.plan.units import parse_bytes  # here: `ctxlab.plan` imports numpy (GGUF)

    host = parse_bytes(offload_bytes, "--offload-bytes") if offload_bytes is not None else 0
    if host < 0:
        raise CtxlabError(f"--offload-bytes must be zero or more, got {offload_bytes}.")
    if host == 0 and offload_dir is None:
        raise CtxlabError("--offload-bytes 0 keeps nothing; give a size or an --offload-dir.")
    if not prefix_cache:
        raise CtxlabError("--offload-bytes keeps prefix-cache blocks; drop --no-prefix-cache.")
    if offload_dir is not None and offload_dir.exists() and not offload_dir.is_dir():
        raise CtxlabError(f"--offload-dir {offload_dir} is a file, not a directory.")
    if kv_format is not None:
        raise CtxlabError(
            f"--offload-bytes keeps float KV blocks; it cannot be combined with --kv-format "
            f"{kv_format}."
        )
    if model is not None:
        from ctxlab.engine_options import has_sliding_layers
        from ctxlab.model.registry import resolve_model_path

        if has_sliding_layers(resolve_model_path(model)):
            raise CtxlabError(
                "--offload-bytes supports full-attention models only; this model has "
                "sliding-window layers."
            )
    return host, None if offload_dir is None else str(offload_dir)


def attach(engine: _Attachable, tier: tuple[int, str | None] | None) -> None:
    """Give `engine` the tier `check_offload` returned (nothing when it returned None)."""
    if tier is not None:
        engine.attach_offload(*tier)
