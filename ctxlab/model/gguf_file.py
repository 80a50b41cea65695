"""GGUF tensors as numpy views over one memory map, for the weight loader.

The header (metadata and tensor index, checked against the file's size) is read by
`ctxlab.arch.gguf_header`, the one reader the planner uses too, so a truncated file gets
the same sentence in `ctxlab plan --gguf` and `ctxlab generate --model`. Here the tensor
bytes are mapped once; dequantisation is `gguf.quants.dequantize` in the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctxlab.arch.gguf_header import read_gguf_header


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order: rows first (GGUF stores dims fastest-first)
    qtype: int  # gguf.GGMLQuantizationType value
    data: np.ndarray  # uint8 bytes shaped (*shape[:-1], bytes per row)


@dataclass(frozen=True)
class GGUFFile:
    metadata: dict[str, Any]  # scalars, strings and numeric arrays; string arrays -> length
    tensors: list[GGUFTensor]


def read_gguf_file(path: Path) -> GGUFFile:
    """Parse header, metadata and tensor index of a GGUF file; tensor bytes stay on disk."""
    header = read_gguf_header(path)
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for t in header.tensors:
        # a plain ndarray view: numpy subclass hooks on memmap slices cost seconds in dequantize
        data = np.asarray(blob[t.offset : t.offset + t.n_bytes]).reshape(*t.shape[:-1], t.row_bytes)
        tensors.append(GGUFTensor(t.name, t.shape, t.qtype, data))
    return GGUFFile(header.metadata, tensors)
