"""What hears the prefix cache's hash map change: a block stored (findable) or removed.

`ctxlab serve --kv-events-endpoint` attaches a publisher here (`KVCacheManager.observe`), so
a subscriber sees ctxlab's cache as vLLM's KV events show vLLM's; the allocator knows only
this protocol, not the wire format.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ctxlab.kv.hashing import BlockHash


class BlockEvents(Protocol):
    def stored(
        self,
        hashes: Sequence[BlockHash],
        parent: BlockHash | None,
        token_ids: Sequence[int],
        block_size: int,
        salt: str | None,
    ) -> None:
        """Consecutive full blocks of one chain became findable; `token_ids` are all of
        theirs, `parent` is the hash before the first (None at a prompt's start)."""

    def removed(self, hashes: Sequence[BlockHash]) -> None:
        """Groups left the hash map (their blocks are being handed out again)."""
