"""KV events: vLLM's record of every block its prefix cache stores and removes, read as
measured residency (lifetimes, evictions in order, why a request missed), and published in
the same format by `ctxlab serve`. Torch-free; pyzmq and msgpack are needed only to
subscribe or publish (`pip install 'ctxlab[events]'`)."""

from ctxlab.kvevents.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_frames,
    decode_payload,
    encode_frames,
    encode_payload,
)
from ctxlab.kvevents.residency import (
    FirstEviction,
    MissReason,
    Request,
    Residency,
    count_evictions,
    first_eviction,
)

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "FirstEviction",
    "MissReason",
    "Request",
    "Residency",
    "count_evictions",
    "decode_frames",
    "decode_payload",
    "encode_frames",
    "encode_payload",
    "first_eviction",
]
