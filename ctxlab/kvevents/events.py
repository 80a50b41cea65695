"""KV events as vLLM publishes them: typed records, and a tolerant decoder and an encoder.

The wire format is read from vLLM 0.32.0's own source, `vllm/distributed/kv_events.py`
(`EventBatch`, `KVCacheEvent`, `BlockStored`, `BlockRemoved`, `AllBlocksCleared`,
`ZmqEventPublisher`) and `vllm/config/kv_events.py` (`KVEventsConfig`); this is our own
reading of it, not its code. One ZMQ multipart message per batch:

    [topic (utf-8), seq (8-byte big-endian, from 0), msgpack(EventBatch)]

msgspec encodes the batch as an array `[ts, events, data_parallel_rank]` (`array_like`),
and each event as a map tagged by its class name: `{"type": "BlockStored", "block_hashes":
[...], "parent_block_hash": h | None, "token_ids": [...], "block_size": n, "lora_id",
"medium", "lora_name", and, when not default, "extra_keys", "group_idx", ...}`. Older vLLM
releases encoded events as tagged arrays (`["BlockStored", hashes, parent, tokens, size,
lora_id, medium]`); both are decoded. A block hash is an int (vLLM's default,
`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the low 64 bits of the sha256) or bytes.

The decoder is tolerant: fields it does not know are ignored, an event of a type it does
not know is counted in `EventBatch.unknown` and skipped, and a frame that is not a batch is
one `CtxlabError` sentence, never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ctxlab.errors import CtxlabError

BlockId = int | bytes  # vLLM's ExternalBlockHash
END_SEQ = -1  # the replay socket's end-of-replay marker (8 bytes, signed)


@dataclass(frozen=True)
class BlockStored:
    """Full blocks that became findable in the prefix cache, in chain order: block i's
    parent is block i-1, the first one's is `parent`; `token_ids` holds all their tokens."""

    block_hashes: tuple[BlockId, ...]
    parent: BlockId | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    # vLLM's extra_keys: per block, the extra hash inputs (cache_salt, LoRA, media), or None
    extra_keys: tuple[tuple[object, ...] | None, ...] | None = None
    group_idx: int | None = None

    def salt(self) -> str | None:
        """The first block's string extra key (vLLM puts the cache_salt there), if any."""
        if not self.extra_keys or self.extra_keys[0] is None:
            return None
        strings = [k for k in self.extra_keys[0] if isinstance(k, str)]
        return strings[-1] if strings else None


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks that left the prefix cache (their memory was handed to another block)."""

    block_hashes: tuple[BlockId, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    seq: int  # the publisher's sequence number of this batch
    ts: float  # the publisher's wall-clock time (seconds since the epoch)
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None
    unknown: int = 0  # events of a type this decoder does not know (skipped)
    topic: str = ""


@dataclass
class _Fields:
    """One event's fields by name, from either encoding."""

    kind: str
    values: dict[str, object] = field(default_factory=dict)


# Positional field order of the older array encoding (tag first), per event type.
_ARRAY_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def _fields(raw: object) -> _Fields | None:
    if isinstance(raw, Mapping):
        kind = raw.get("type")
        if not isinstance(kind, str):
            return None
        return _Fields(kind, {str(k): v for k, v in raw.items()})
    if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        names = _ARRAY_FIELDS.get(raw[0], ())
        return _Fields(raw[0], dict(zip(names, raw[1:], strict=False)))
    return None


def _hash(value: object) -> BlockId:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise CtxlabError(f"a KV event carries a block hash of type {type(value).__name__}.")
    return value


def _event(raw: object) -> Event | None:
    f = _fields(raw)
    if f is None:
        return None
    v = f.values
    if f.kind == "BlockStored":
        parent = v.get("parent_block_hash")
        extra = v.get("extra_keys")
        return BlockStored(
            block_hashes=tuple(_hash(h) for h in _list(v.get("block_hashes"))),
            parent=None if parent is None else _hash(parent),
            token_ids=tuple(int(t) for t in _list(v.get("token_ids"))),  # type: ignore[call-overload]
            block_size=int(v.get("block_size") or 0),  # type: ignore[call-overload]
            medium=_opt_str(v.get("medium")),
            lora_name=_opt_str(v.get("lora_name")),
            extra_keys=None
            if not isinstance(extra, list | tuple)
            else tuple(None if k is None else tuple(_list(k)) for k in extra),
            group_idx=_opt_int(v.get("group_idx")),
        )
    if f.kind == "BlockRemoved":
        return BlockRemoved(
            block_hashes=tuple(_hash(h) for h in _list(v.get("block_hashes"))),
            medium=_opt_str(v.get("medium")),
            group_idx=_opt_int(v.get("group_idx")),
        )
    if f.kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _list(value: object) -> Sequence[object]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise CtxlabError(f"a KV event field holds {type(value).__name__} where a list belongs.")
    return value


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def msgpack_module():
    try:
        import msgpack
    except ImportError:
        raise CtxlabError(
            "KV events need the msgpack package: pip install 'ctxlab[events]'."
        ) from None
    return msgpack


def decode_payload(payload: bytes, seq: int = 0, topic: str = "") -> EventBatch:
    """One batch from its msgpack payload; unknown fields and event types are skipped."""
    try:
        raw = msgpack_module().unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for a broken frame
        raise CtxlabError(f"a KV event payload is not msgpack ({type(exc).__name__}).") from None
    if not isinstance(raw, list | tuple) or len(raw) < 2 or not isinstance(raw[1], list | tuple):
        raise CtxlabError("a KV event payload is not an EventBatch [ts, events, rank].")
    ts = raw[0]
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise CtxlabError("a KV event batch has no timestamp.")
    events: list[Event] = []
    unknown = 0
    for item in raw[1]:
        ev = _event(item)
        if ev is None:
            unknown += 1
        else:
            events.append(ev)
    rank = _opt_int(raw[2]) if len(raw) > 2 else None
    return EventBatch(seq, float(ts), tuple(events), rank, unknown, topic)


def decode_frames(frames: Sequence[bytes]) -> EventBatch:
    """One batch from a multipart message [topic, seq, payload]."""
    if len(frames) != 3:
        raise CtxlabError(f"a KV event message has {len(frames)} parts, not 3.")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise CtxlabError("a KV event message's sequence number is not 8 bytes.")
    return decode_payload(
        payload, int.from_bytes(seq, "big", signed=True), topic.decode("utf-8", "replace")
    )


def _event_map(ev: Event) -> dict[str, object]:
    if isinstance(ev, BlockStored):
        out: dict[str, object] = {
            "type": "BlockStored",
            "block_hashes": list(ev.block_hashes),
            "parent_block_hash": ev.parent,
            "token_ids": list(ev.token_ids),
            "block_size": ev.block_size,
            "lora_id": None,
            "medium": ev.medium,
            "lora_name": ev.lora_name,
        }
        if ev.extra_keys is not None:
            out["extra_keys"] = [None if k is None else list(k) for k in ev.extra_keys]
        if ev.group_idx is not None:
            out["group_idx"] = ev.group_idx
        return out
    if isinstance(ev, BlockRemoved):
        out = {"type": "BlockRemoved", "block_hashes": list(ev.block_hashes), "medium": ev.medium}
        if ev.group_idx is not None:
            out["group_idx"] = ev.group_idx
        return out
    return {"type": "AllBlocksCleared"}


def encode_payload(ts: float, events: Sequence[Event], data_parallel_rank: int | None = 0) -> bytes:
    """msgpack of one batch in vLLM 0.32's layout (events as tagged maps)."""
    body = [float(ts), [_event_map(e) for e in events], data_parallel_rank]
    return msgpack_module().packb(body, use_bin_type=True)


def encode_frames(
    seq: int, ts: float, events: Sequence[Event], topic: str = "", rank: int | None = 0
) -> list[bytes]:
    """The multipart message [topic, seq, payload] of one batch."""
    return [topic.encode("utf-8"), seq.to_bytes(8, "big"), encode_payload(ts, events, rank)]
