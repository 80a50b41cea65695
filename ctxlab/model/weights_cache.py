"""Dequantized GGUF tensors cached as one safetensors file, so a later load is an mmap.

Dequantizing a GGUF file (the `gguf` package, pure numpy) is CPU work that every process
repeated: about a second for SmolLM2-135M on a quiet core, ten under load, while reading the
same float32 tensors back from a safetensors file maps them in hundredths of a second. So
the first load writes the HF-named tensors `read_gguf` produced (norm offsets applied, Q/K
unpermuted: exactly what the model loads) under the user's cache folder, and later loads
map them.

The key is what the tensors depend on: the file's size and modification time, its header
(metadata and tensor index, read without touching tensor data), and `FORMAT` (bumped when
the conversion changes). A rewritten file gets a new modification time and so a new entry;
nothing is ever downloaded. Writers write a private temporary file and rename it into
place, so processes that start together never read half an entry; a damaged entry is
rebuilt, and a read-only cache folder only costs the next process the dequantization
again. `CTXLAB_WEIGHTS_CACHE=0` turns the cache off (`CTXLAB_CACHE_DIR` moves it, as for
the tokenizer).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from ctxlab.cache_dir import cache_root

FORMAT = 1
ENV = "CTXLAB_WEIGHTS_CACHE"
_FREQS = "__ctxlab_rope_freqs__"  # the RoPE frequency factors, when the file has them

Tensors = dict[str, torch.Tensor]
Built = tuple[Tensors, torch.Tensor | None]


def enabled() -> bool:
    return os.environ.get(ENV, "1") not in ("0", "false", "no", "off")


def cache_key(path: Path) -> str:
    """Size, modification time and header bytes of the GGUF file, and the cache format."""
    from ctxlab.arch.gguf_header import read_gguf_header

    header = read_gguf_header(path)
    st = path.stat()
    digest = hashlib.sha256(f"{FORMAT}:{st.st_size}:{st.st_mtime_ns}:".encode())
    start, end = header.metadata_span
    with open(path, "rb") as f:
        f.seek(start)
        digest.update(f.read(end - start))
    for t in header.tensors:
        digest.update(f"{t.name}:{t.shape}:{t.qtype}:{t.offset}:{t.n_bytes};".encode())
    return digest.hexdigest()[:32]


def entry_path(path: Path) -> Path:
    return cache_root() / "weights" / f"{cache_key(path)}.safetensors"


def cached_tensors(path: Path, build: Callable[[], Built]) -> Built:
    """`build()`'s tensors for the GGUF file at `path`, from the cache when it holds them."""
    if not enabled():
        return build()
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    entry = entry_path(path)
    if entry.is_file():
        try:
            tensors = load_file(str(entry))
            return tensors, tensors.pop(_FREQS, None)
        except (SafetensorError, OSError, RuntimeError):  # damaged: rebuild below
            entry.unlink(missing_ok=True)
    tensors, freqs = build()
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=entry.parent)
        os.close(fd)
        try:
            stored = {k: v.contiguous() for k, v in tensors.items()}
            if freqs is not None:
                stored[_FREQS] = freqs.contiguous()
            save_file(stored, tmp, metadata={"source": path.name, "format": str(FORMAT)})
            os.replace(tmp, entry)  # atomic: readers see the old entry or the whole new one
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass  # a read-only or full cache folder: the next process dequantizes again
    return tensors, freqs
