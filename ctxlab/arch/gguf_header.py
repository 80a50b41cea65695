"""The one GGUF header reader: metadata and tensor index, checked against the file's size.

The planner (`--gguf`), the model loader and the tokenizer cache all read GGUF files through
this module, so a truncated or corrupt file gets the same sentence wherever it is opened.
It walks the key/value section with `struct`, keeps numeric arrays, and skips string arrays
(a vocabulary of 100,000 strings) keeping only their length. Every length read from the file
is checked against the bytes left before it is used, so a corrupt count is an error, not a
huge allocation or a long loop. Tensor data is never read here. numpy only, no torch.
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2 and 3).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ctxlab.errors import CtxlabError
from ctxlab.inputs import MAX_DEPTH

# value type id -> struct format of a scalar
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
_MAX_DIMS = 8  # ggml uses 4; anything far beyond is corruption


class _Corrupt(Exception):
    """The header does not parse; the message says where."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the index: where its bytes are and how they are shaped."""

    name: str
    shape: tuple[int, ...]  # numpy order: rows first (GGUF stores dims fastest-first)
    qtype: int  # gguf.GGMLQuantizationType value
    offset: int  # absolute byte offset in the file
    row_bytes: int
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFHeader:
    """Metadata (string arrays as their length) and the tensor index of one GGUF file."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorEntry]
    file_size: int
    metadata_span: tuple[int, int]  # byte range of the key/value section (tokenizer included)


class _Reader:
    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f, self.size = f, size

    def left(self) -> int:
        return self.size - self.f.tell()

    def take(self, n: int) -> bytes:
        if n < 0 or n > self.left():
            raise _Corrupt("it ends inside its header")
        return self.f.read(n)

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype: int, depth: int = 0) -> Any:
        """One value; arrays of arrays nest at most `MAX_DEPTH` levels (the shared limit of
        every structured input), so a crafted header is one sentence, not a RecursionError."""
        if depth > MAX_DEPTH:
            raise _Corrupt(f"its metadata arrays nest deeper than {MAX_DEPTH} levels")
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype == _STRING:  # vocabularies and merges: skip, keep the count
                if count * 8 > self.left():
                    raise _Corrupt("it ends inside its header")
                self._skip_strings(count)
                return count
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                raw = self.take(struct.calcsize(fmt) * count)
                return np.frombuffer(raw, dtype=np.dtype(fmt)).tolist()
            if etype != _ARRAY or count > self.left():
                raise _Corrupt(f"unknown value type {etype}")
            return [self.value(etype, depth + 1) for _ in range(count)]
        raise _Corrupt(f"unknown value type {vtype}")

    def _skip_strings(self, count: int) -> None:
        """Skip `count` strings (the hot loop of a 100,000-entry vocabulary: no checks but
        the length read and one position check at the end)."""
        read, seek, unpack, size = self.f.read, self.f.seek, struct.unpack, self.size
        for _ in range(count):
            raw = read(8)
            if len(raw) != 8:
                raise _Corrupt("it ends inside its header")
            n = unpack("<Q", raw)[0]
            if n > size:
                raise _Corrupt("it ends inside its header")
            seek(n, os.SEEK_CUR)
        if self.f.tell() > size:
            raise _Corrupt("it ends inside its header")


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Parse and check the header of a GGUF file; every problem is one CtxlabError sentence."""
    path = Path(path)
    if path.is_dir():
        raise CtxlabError(f"{path} is a directory, not a GGUF file.")
    if not path.is_file():
        raise CtxlabError(f"GGUF file {path} does not exist.")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(4) != b"GGUF":
                raise CtxlabError(f"{path} is not a GGUF file (its first bytes are not GGUF).")
            r = _Reader(f, size)
            version = r.scalar("<I")
            if version not in (2, 3):
                raise CtxlabError(
                    f"{path} is GGUF version {version}, which is not supported; ctxlab reads "
                    "versions 2 and 3."
                )
            n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
            if n_tensors > size or n_kv > size:
                raise _Corrupt("its counts exceed the file's size")
            start_kv = f.tell()
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = r.string()
                meta[key] = r.value(r.scalar("<I"))
            end_kv = f.tell()
            index = []
            for _ in range(n_tensors):
                name = r.string()
                n_dims = r.scalar("<I")
                if n_dims > _MAX_DIMS:
                    raise _Corrupt(f"tensor {name} has {n_dims} dimensions")
                dims = [r.scalar("<Q") for _ in range(n_dims)]
                qtype, offset = r.scalar("<I"), r.scalar("<Q")
                index.append((name, tuple(reversed(dims)), qtype, offset))
            align = meta.get("general.alignment", 32)
            if not isinstance(align, int) or isinstance(align, bool) or align <= 0:
                raise _Corrupt(f"general.alignment is {align!r}")
            data_start = -(-f.tell() // align) * align
    except CtxlabError:
        raise
    except (_Corrupt, struct.error, OSError, OverflowError, ValueError) as exc:
        reason = str(exc) or "it ends inside its header"
        raise CtxlabError(f"{path} is a truncated or corrupt GGUF file ({reason}).") from None
    tensors = [_entry(path, size, data_start, *item) for item in index]
    return GGUFHeader(path, version, meta, tensors, size, (start_kv, end_kv))


def _entry(
    path: Path, size: int, data_start: int, name: str, shape: tuple, qtype: int, offset: int
) -> TensorEntry:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (KeyError, ValueError):
        raise CtxlabError(f"{path}: tensor {name} has unknown type {qtype}.") from None
    if not shape or shape[-1] % block:
        raise CtxlabError(f"{path} is a truncated or corrupt GGUF file (tensor {name}'s shape).")
    row_bytes = shape[-1] // block * type_size
    n_bytes = row_bytes * math.prod(shape[:-1])
    begin = data_start + offset
    if begin + n_bytes > size:
        raise CtxlabError(
            f"{path} is a truncated or corrupt GGUF file (tensor {name} runs past its end)."
        )
    return TensorEntry(name, shape, qtype, begin, row_bytes, n_bytes)
