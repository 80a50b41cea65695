"""The far tier: evicted KV blocks kept in host memory or a file on disk, with summaries.

Recall's storage (`ctxlab.policy.recall` decides, the engine stores): every block of
evicted tokens of a lane goes here with its key summary (per-channel minimum and maximum,
as Quest's pages), so choosing what to bring back never reads the keys. A disk tier
writes the raw K and V bytes to one file and reads them back bit-exactly. The tier counts
bytes moved in each direction, recall operations and far-tier hits (a block brought back).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from ctxlab.errors import CtxlabError


@dataclass
class FarBlock:
    positions: torch.Tensor  # [n] int64
    kmin: torch.Tensor  # [d_k]
    kmax: torch.Tensor  # [d_k]
    offset: int = -1  # disk: byte offset of k then v in the file
    k: torch.Tensor | None = None  # memory tier only
    v: torch.Tensor | None = None
    d_k: int = 0
    d_v: int = 0
    dtype: torch.dtype = torch.float32


@dataclass
class FarTier:
    """Evicted blocks per lane with summaries; `kind` is "memory" or "disk"."""

    kind: str = "memory"
    path: str | None = None
    lanes: dict[Hashable, list[FarBlock]] = field(default_factory=dict)  # key: a lane
    bytes_out: int = 0  # near -> far
    bytes_in: int = 0  # far -> near
    recalls: int = 0  # recall operations that brought at least one block back
    hits: int = 0  # blocks brought back from the far tier
    _file: object | None = None
    _summary: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("memory", "disk"):
            raise CtxlabError(f"far tier kind {self.kind!r} is unknown; use 'memory' or 'disk'.")
        if self.kind == "disk":
            if self.path is None:
                fd, self.path = tempfile.mkstemp(prefix="ctxlab-far-", suffix=".kv")
                os.close(fd)
            self._file = open(self.path, "w+b")  # noqa: SIM115 - lives as long as the tier

    @property
    def bytes_moved(self) -> int:
        return self.bytes_out + self.bytes_in

    def drop(self, lane: Hashable) -> None:
        """Forget a lane's far blocks (its sequence finished); the disk file is not shrunk."""
        self.lanes.pop(lane, None)
        self._summary.pop(lane, None)

    def num_blocks(self, lane: Hashable) -> int:
        return len(self.lanes.get(lane, []))

    def put(self, lane: Hashable, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
        """Store one block of a lane; returns its index in the lane's far list."""
        blk = FarBlock(positions.clone(), k.float().amin(0), k.float().amax(0))
        blk.d_k, blk.d_v, blk.dtype = k.shape[-1], v.shape[-1], k.dtype
        nbytes = k.numel() * k.element_size() + v.numel() * v.element_size()
        if self.kind == "memory":
            blk.k, blk.v = k.detach().clone().cpu(), v.detach().clone().cpu()
        else:
            f = self._file
            f.seek(0, os.SEEK_END)  # type: ignore[attr-defined]
            blk.offset = f.tell()  # type: ignore[attr-defined]
            f.write(k.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())  # type: ignore[attr-defined]
            f.write(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())  # type: ignore[attr-defined]
            f.flush()  # type: ignore[attr-defined]
            blk.k = None
        self.bytes_out += nbytes
        self.lanes.setdefault(lane, []).append(blk)
        self._summary.pop(lane, None)
        return len(self.lanes[lane]) - 1

    def read(self, lane: Hashable, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(positions, k, v) of a far block, bit-exact; counts the bytes brought back."""
        blk = self.lanes[lane][idx]
        n = int(blk.positions.numel())
        if self.kind == "memory":
            k, v = blk.k, blk.v
            assert k is not None and v is not None
        else:
            dk, dv, dt = blk.d_k, blk.d_v, blk.dtype
            es = torch.tensor([], dtype=dt).element_size()
            f = self._file
            f.seek(blk.offset)  # type: ignore[attr-defined]
            raw_k = bytearray(f.read(n * dk * es))  # type: ignore[attr-defined]
            raw_v = bytearray(f.read(n * dv * es))  # type: ignore[attr-defined]
            k = torch.frombuffer(raw_k, dtype=torch.uint8).view(dt).view(n, dk)
            v = torch.frombuffer(raw_v, dtype=torch.uint8).view(dt).view(n, dv)
        self.bytes_in += k.numel() * k.element_size() + v.numel() * v.element_size()
        self.hits += 1
        return blk.positions, k, v

    def summaries(self, lane: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """Per far block of a lane: key channel minimum and maximum `[P, d]` (P may be 0)."""
        blocks = self.lanes.get(lane, [])
        if not blocks:
            return torch.empty(0, 0), torch.empty(0, 0)
        if lane not in self._summary:
            self._summary[lane] = (
                torch.stack([b.kmin for b in blocks]),
                torch.stack([b.kmax for b in blocks]),
            )
        return self._summary[lane]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()  # type: ignore[attr-defined]
            self._file = None
            if self.path and os.path.exists(self.path):
                os.unlink(self.path)
