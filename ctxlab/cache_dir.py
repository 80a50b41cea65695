"""Where ctxlab caches the files it derives (tokenizers, weights, models, compiled kernels):
`CTXLAB_CACHE_DIR`, else the user's cache folder. One definition, below every layer, since
the kernels' builder (`ctxlab.native`) and the model loaders all write there."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "CTXLAB_CACHE_DIR"


def cache_root() -> Path:
    """The folder ctxlab caches derived files in (`CTXLAB_CACHE_DIR` or the user cache)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ctxlab"))
