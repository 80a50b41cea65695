"""Where evicted prefix-cache blocks go: host memory with a byte budget, then files on disk.

Keyed by the prefix cache's chained block hash (`ctxlab.kv.hashing`), so a block found here
is the same prefix's K/V a recompute would produce. One LRU runs across both tiers, as in
vLLM's native CPU offload and LMCache: a new block enters host memory at the MRU end; when
host memory is over budget its least recently used block moves down to disk (when a
directory is given) or is dropped; when disk is over its budget its LRU block is deleted.
A restored block leaves the tier (it lives in the pool again and comes back here when
evicted again).

The index (what is where, bytes used) lives on the engine's thread and is updated when a
transfer is queued; the bytes move on the transfer worker (`TransferQueue`), in queue order,
so a restore queued after a store always finds the stored block. A disk file holds a CRC32
of its bytes; a restore that finds the file missing, unreadable or not matching its
checksum raises `RestoreFailed`, and the caller recomputes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
import zlib
from collections import OrderedDict
from concurrent.futures import Future

import torch

from ctxlab.errors import CtxlabError
from ctxlab.kv.hashing import BlockHash
from ctxlab.kv.transfer_queue import LOAD, STORE, TransferQueue

HOST, DISK = "host", "disk"
KV = tuple[torch.Tensor, torch.Tensor]


class RestoreFailed(Exception):
    """A block could not be brought back: `kind` is "missing", "checksum" or "io"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class OffloadTier:
    """Host memory (`host_bytes`) above an optional directory of block files."""

    def __init__(
        self,
        block_shape: tuple[tuple[int, ...], tuple[int, ...]],
        dtype: torch.dtype,
        host_bytes: int,
        directory: str | None = None,
        disk_bytes: int | None = None,
        transfers: TransferQueue | None = None,
    ):
        """`block_shape`: shapes of one block's K and V (every lane of one logical block)."""
        if host_bytes < 0:
            raise CtxlabError(f"the offload tier size must be non-negative, got {host_bytes}.")
        if host_bytes == 0 and directory is None:
            raise CtxlabError("the offload tier has neither host memory nor a directory.")
        self.k_shape, self.v_shape = block_shape
        self.dtype = dtype
        es = torch.empty(0, dtype=dtype).element_size()
        self.k_bytes = es * _numel(self.k_shape)
        self.block_bytes = self.k_bytes + es * _numel(self.v_shape)
        self.host_bytes = host_bytes
        self.disk_bytes = disk_bytes
        self._own_dir = False
        if directory is not None:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as exc:
                raise CtxlabError(
                    f"the offload directory {directory} cannot be created ({exc.strerror})."
                ) from None
            if not os.access(directory, os.W_OK):
                raise CtxlabError(f"the offload directory {directory} is not writable.")
            directory = tempfile.mkdtemp(prefix="ctxlab-offload-", dir=directory)
            self._own_dir = True
            # the block files go with the tier, or at the latest when the process exits
            self._cleanup = weakref.finalize(self, shutil.rmtree, directory, True)
        self.directory = directory
        self.transfers = transfers or TransferQueue()
        # engine-thread index, most recently used last
        self.index: dict[str, OrderedDict[BlockHash, None]] = {
            HOST: OrderedDict(),
            DISK: OrderedDict(),
        }
        # worker-thread data
        self._host: dict[BlockHash, KV] = {}
        # counters (bytes per direction, as vLLM's kv_offload_{store,load}_bytes)
        self.store_bytes = 0  # pool -> host (or straight to disk)
        self.demote_bytes = 0  # host -> disk
        self.load_bytes = {HOST: 0, DISK: 0}
        self.dropped_blocks = 0  # fell off the bottom of the LRU

    # -- where a block is ----------------------------------------------------------------
    def where(self, h: BlockHash) -> str | None:
        for tier in (HOST, DISK):
            if h in self.index[tier]:
                return tier
        return None

    def used(self, tier: str) -> int:
        return len(self.index[tier]) * self.block_bytes

    def path(self, h: BlockHash) -> str:
        assert self.directory is not None
        return os.path.join(self.directory, h.hex() + ".kv")

    # -- store -----------------------------------------------------------------------------
    def put(self, h: BlockHash, k: torch.Tensor, v: torch.Tensor) -> None:
        """Queue one evicted block (`k`, `v` are copies the caller no longer touches)."""
        tier = self.where(h)
        if tier is not None:  # the same prefix's bytes are already here: refresh its place
            self.index[tier].move_to_end(h)
            return
        nbytes = self.block_bytes
        if self.host_bytes >= nbytes:
            while self.used(HOST) + nbytes > self.host_bytes:
                self._demote_lru()
            self.index[HOST][h] = None
            self.store_bytes += nbytes
            self.transfers.submit(lambda: self._host.__setitem__(h, (k, v)), STORE)
        elif self.directory is not None and self._disk_room():
            self.index[DISK][h] = None
            self.store_bytes += nbytes
            self.transfers.submit(lambda: self._write(h, k, v), STORE)
        else:
            self.dropped_blocks += 1

    def _disk_room(self) -> bool:
        """Make room for one block on disk (deleting its LRU blocks); False if none fits."""
        if self.disk_bytes is None:
            return True
        if self.disk_bytes < self.block_bytes:
            return False
        while self.used(DISK) + self.block_bytes > self.disk_bytes:
            old, _ = self.index[DISK].popitem(last=False)
            self.dropped_blocks += 1
            self.transfers.submit(lambda old=old: self._unlink(old), STORE)
        return True

    def _demote_lru(self) -> None:
        h, _ = self.index[HOST].popitem(last=False)
        if self.directory is not None and self._disk_room():
            self.index[DISK][h] = None
            self.demote_bytes += self.block_bytes
            self.transfers.submit(lambda: self._write(h, *self._host.pop(h)), STORE)
        else:
            self.dropped_blocks += 1
            self.transfers.submit(lambda: self._host.pop(h, None), STORE)

    # -- restore ---------------------------------------------------------------------------
    def load(self, hashes: list[BlockHash]) -> Future[list[KV]]:
        """Queue the restore of `hashes` (all in the tier); they leave the tier now."""
        tiers = []
        for h in hashes:
            tier = self.where(h)
            assert tier is not None, "load of a block the tier does not hold"
            del self.index[tier][h]
            tiers.append(tier)
        return self.transfers.submit(lambda: self._read_all(hashes, tiers), LOAD)

    def _read_all(self, hashes: list[BlockHash], tiers: list[str]) -> list[KV]:
        out: list[KV] = []
        try:
            for h, tier in zip(hashes, tiers, strict=True):
                out.append(self._host.pop(h) if tier == HOST else self._read(h))
                self.load_bytes[tier] += self.block_bytes
        finally:  # a failed restore leaves nothing of its blocks behind
            for h, tier in zip(hashes, tiers, strict=True):
                if tier == HOST:
                    self._host.pop(h, None)
                else:
                    self._unlink(h)
        return out

    def inject(self, h: BlockHash, kind: str) -> None:
        """Damage block `h`'s file so its next restore fails: "missing" deletes it,
        "checksum" flips one byte, "io" puts a directory where it was (reading it raises an
        OSError). For tests and demonstration 8; call after `transfers.drain()`."""
        if self.where(h) != DISK:
            raise CtxlabError("only a block on disk can be damaged.")
        path = self.path(h)
        if kind == "missing":
            os.unlink(path)
        elif kind == "checksum":
            with open(path, "r+b") as f:
                f.seek(4 + self.block_bytes // 2)
                b = f.read(1)
                f.seek(4 + self.block_bytes // 2)
                f.write(bytes([b[0] ^ 0xFF]))
        elif kind == "io":
            os.unlink(path)
            os.mkdir(path)
        else:
            raise CtxlabError(f"unknown failure kind {kind!r}; use missing, checksum or io.")

    # -- files (worker thread) -------------------------------------------------------------
    def _write(self, h: BlockHash, k: torch.Tensor, v: torch.Tensor) -> None:
        data = k.contiguous().view(torch.uint8).numpy().tobytes()
        data += v.contiguous().view(torch.uint8).numpy().tobytes()
        with open(self.path(h), "wb") as f:
            f.write(zlib.crc32(data).to_bytes(4, "little"))
            f.write(data)

    def _read(self, h: BlockHash) -> KV:
        path = self.path(h)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise RestoreFailed("missing", f"block file {path} is missing") from None
        except OSError as exc:
            raise RestoreFailed("io", f"block file {path} cannot be read ({exc})") from None
        data = raw[4:]
        if len(data) != self.block_bytes or zlib.crc32(data) != int.from_bytes(raw[:4], "little"):
            raise RestoreFailed("checksum", f"block file {path} does not match its checksum")
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        k = buf[: self.k_bytes].view(self.dtype).view(self.k_shape)
        v = buf[self.k_bytes :].view(self.dtype).view(self.v_shape)
        return k, v

    def _unlink(self, h: BlockHash) -> None:
        path = self.path(h)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.unlink(path)

    def close(self) -> None:
        self.transfers.close()
        if self._own_dir:
            self._cleanup()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
