"""Content hashes of logical blocks, chained so a hash names a whole prefix.

A full block of `block_size` tokens hashes to H(parent_hash, token_ids, extra). The tenant
`cache_salt` (and the model id) are folded into the first block only; every later block
inherits them through its parent, so two tenants never share a block and the chain stays
cheap. blake2b rather than Python's `hash` because it is stable across processes.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes


def hash_block(
    parent: BlockHash | None, token_ids: Sequence[int], extra: tuple[str, ...] = ()
) -> BlockHash:
    """Hash of one full block given its parent's hash (None for the first block)."""
    h = hashlib.blake2b(digest_size=16)
    if parent is None:
        h.update(b"\x00root")
        for item in extra:
            data = item.encode("utf-8")
            h.update(len(data).to_bytes(4, "little"))
            h.update(data)
    else:
        h.update(b"\x01")
        h.update(parent)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra: tuple[str, ...] = (),
    start: int = 0,
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids` from block index `start` on.

    `parent` must be the hash of block `start - 1` when `start > 0`.
    """
    out: list[BlockHash] = []
    n_full = len(token_ids) // block_size
    for b in range(start, n_full):
        parent = hash_block(parent, token_ids[b * block_size : (b + 1) * block_size], extra)
        out.append(parent)
    return out
