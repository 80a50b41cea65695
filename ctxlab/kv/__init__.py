"""Allocation layer: a head-granular paged KV pool with automatic prefix caching.

`KVLayout` says what one token costs per lane, `KVPool` owns the one storage tensor
(`QuantKVPool`: the same methods over int8 / KIVI codes, `ctxlab.kv.quantize` their math),
`BlockAllocator` owns reference counts, the LRU free queue and the prefix hash map, and
`KVCacheManager` is what the engine calls (look up a prefix, allocate slots, commit full
blocks, free, compact lanes). `SeqKV` is one
sequence's view: a block table per lane and a length per lane. `KVStore` is the protocol
both pools implement, what the layers above hold.
"""

from ctxlab.kv.allocator import BlockAllocator
from ctxlab.kv.hashing import BlockHash, hash_block, hash_blocks
from ctxlab.kv.layout import KVLayout
from ctxlab.kv.manager import KVCacheManager, KVStats, PrefixHit
from ctxlab.kv.pool import KVPool
from ctxlab.kv.quant_pool import QuantKVPool
from ctxlab.kv.seq_kv import SeqKV
from ctxlab.kv.store import KVStore

__all__ = [
    "BlockAllocator",
    "BlockHash",
    "KVCacheManager",
    "KVLayout",
    "KVPool",
    "KVStats",
    "KVStore",
    "PrefixHit",
    "QuantKVPool",
    "SeqKV",
    "hash_block",
    "hash_blocks",
]
