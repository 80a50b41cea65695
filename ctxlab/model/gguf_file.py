"""A lean GGUF reader: metadata and tensor views, without decoding the vocabulary.

`gguf.GGUFReader` builds a numpy view for every string of the vocabulary and merges
(about 100,000 for SmolLM2), which took 7 s of a 10 s load here. The weights need none of
that: this reader walks the key/value section with `struct`, skips string arrays, and maps
the tensor data with one memmap. Dequantisation is still `gguf.quants.dequantize`.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (version 2 and 3).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ctxlab.errors import CtxlabError

# value type id -> struct format for scalars
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


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


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise EOFError
    return struct.unpack(fmt, raw)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    raw = f.read(n)
    if len(raw) != n:
        raise EOFError
    return raw.decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, count = _read(f, "<I"), _read(f, "<Q")
        if etype == _STRING:  # vocabularies and merges: skip, keep the count
            for _ in range(count):
                f.seek(_read(f, "<Q"), 1)
            return count
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            raw = f.read(struct.calcsize(fmt) * count)
            return np.frombuffer(raw, dtype=np.dtype(fmt)).tolist()
        return [_value(f, etype) for _ in range(count)]
    raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf_file(path: Path) -> GGUFFile:
    """Parse header, metadata and tensor index of a GGUF file; tensor bytes stay on disk."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise CtxlabError(f"{path} is not a GGUF file (its first bytes are not GGUF).")
            version = _read(f, "<I")
            if version < 2:
                raise CtxlabError(f"{path} is GGUF version {version}; ctxlab reads 2 and 3.")
            n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = _string(f)
                meta[key] = _value(f, _read(f, "<I"))
            index = []
            for _ in range(n_tensors):
                name = _string(f)
                dims = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
                qtype, offset = _read(f, "<I"), _read(f, "<Q")
                index.append((name, tuple(reversed(dims)), qtype, offset))
            align = int(meta.get("general.alignment", 32))
            start = -(-f.tell() // align) * align
    except CtxlabError:
        raise
    except (EOFError, ValueError, struct.error) as exc:
        reason = str(exc) or "it ends inside its header"
        raise CtxlabError(f"{path} is a truncated or corrupt GGUF file ({reason}).") from None
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for name, shape, qtype, offset in index:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        except (KeyError, ValueError):
            raise CtxlabError(f"{path}: tensor {name} has unknown type {qtype}.") from None
        row_bytes = shape[-1] // block * type_size
        n_bytes = row_bytes * int(np.prod(shape[:-1], dtype=np.int64))
        begin = start + offset
        if begin + n_bytes > blob.size:
            raise CtxlabError(f"{path} is truncated: tensor {name} runs past the end.")
        # a plain ndarray view: numpy subclass hooks on memmap slices cost seconds in dequantize
        data = np.asarray(blob[begin : begin + n_bytes]).reshape(*shape[:-1], row_bytes)
        tensors.append(GGUFTensor(name, shape, qtype, data))
    return GGUFFile(meta, tensors)
