"""Dense vectors from WordLlama, loaded from the weights inside its wheel (never downloaded).

WordLlama's 256-dimensional token embeddings and its tokenizer ship in the `wordllama`
package; `load(cache_dir=<that folder>, disable_download=True)` finds them there and fails
instead of fetching if they are missing. Vectors are L2-normalised float32, so cosine
similarity is a dot product; they are stored as raw float32 bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ctxlab.errors import CtxlabError

if TYPE_CHECKING:  # numpy loads on first use: BM25 search and `rag ask` never need it
    import numpy as np

WORDLLAMA_DIM = 256


class Embedder(Protocol):
    """Text -> unit vectors; `name` is recorded in the store so vectors are never mixed."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@functools.lru_cache(maxsize=2)
def _load_wordllama(dim: int):
    try:
        import wordllama
        from wordllama import WordLlama
    except ImportError:
        raise CtxlabError(
            "dense retrieval needs the wordllama package; install it with `pip install wordllama`."
        ) from None
    folder = Path(wordllama.__file__).parent
    try:
        return WordLlama.load(cache_dir=folder, dim=dim, disable_download=True)
    except FileNotFoundError:
        raise CtxlabError(
            f"the wordllama package in {folder} has no {dim}-dimensional weights; "
            "reinstall it (its wheel ships them)."
        ) from None


class WordLlamaEmbedder:
    """WordLlama (l2_supercat) at 256 dimensions, offline."""

    dim = WORDLLAMA_DIM
    name = f"wordllama-l2_supercat-{WORDLLAMA_DIM}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = np.asarray(_load_wordllama(self.dim).embed(list(texts)), dtype=np.float32)
        return normalize(vectors)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero)."""
    import numpy as np

    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.where(norms == 0, 1.0, norms)).astype(np.float32)


def to_blob(vector: np.ndarray) -> bytes:
    import numpy as np

    return np.asarray(vector, dtype=np.float32).tobytes()


def from_blobs(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """Stacked float32 rows; a blob of the wrong size is a foreign vector, not a crash."""
    import numpy as np

    if not blobs:
        return np.zeros((0, dim), dtype=np.float32)
    out = np.frombuffer(b"".join(blobs), dtype=np.float32)
    if out.size != len(blobs) * dim:
        raise CtxlabError(
            f"the store holds vectors of another size than {dim}; it was built with another "
            "embedder."
        )
    return out.reshape(len(blobs), dim)
