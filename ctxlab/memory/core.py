"""Core memory: a few labelled blocks (persona, human, ...) that are always in the prompt.

Each block has a character limit, so the prompt's fixed part cannot grow without bound, and
a read-only flag for blocks the application owns. Edits that break either rule raise
`MemoryEditError`, whose sentence a tool call hands back to the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.errors import CtxlabError
from ctxlab.memory.store import Store, now_iso

DEFAULT_LIMIT = 2000


class MemoryEditError(CtxlabError):
    """A memory edit that the rules forbid; the message is one sentence for the caller."""


@dataclass(frozen=True)
class Block:
    label: str
    value: str
    limit: int = DEFAULT_LIMIT
    read_only: bool = False


class CoreMemory:
    def __init__(self, store: Store, agent: str = "default"):
        self.store, self.agent = store, agent

    def blocks(self) -> list[Block]:
        rows = self.store.conn.execute(
            "SELECT label, value, char_limit, read_only FROM core_blocks WHERE agent = ? "
            "ORDER BY rowid",
            (self.agent,),
        ).fetchall()
        return [Block(r[0], r[1], int(r[2]), bool(r[3])) for r in rows]

    def get(self, label: str) -> Block:
        for block in self.blocks():
            if block.label == label:
                return block
        known = ", ".join(b.label for b in self.blocks()) or "none"
        raise MemoryEditError(f"core memory has no block {label!r} (blocks: {known}).")

    def set(
        self, label: str, value: str, limit: int = DEFAULT_LIMIT, read_only: bool = False
    ) -> Block:
        """Create or overwrite a block (the application's call; tools use append/replace)."""
        if not label.strip():
            raise MemoryEditError("a core memory block needs a non-empty label.")
        if limit <= 0:
            raise MemoryEditError(f"block {label!r} needs a positive character limit.")
        if len(value) > limit:
            raise MemoryEditError(
                f"block {label!r} would hold {len(value)} characters, over its limit of {limit}."
            )
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO core_blocks(agent, label, value, char_limit, read_only, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(agent, label) DO UPDATE SET "
                "value = excluded.value, char_limit = excluded.char_limit, "
                "read_only = excluded.read_only, updated_at = excluded.updated_at",
                (self.agent, label, value, limit, int(read_only), now_iso()),
            )
        return Block(label, value, limit, read_only)

    def append(self, label: str, content: str) -> Block:
        block = self._writable(label)
        value = f"{block.value}\n{content}" if block.value else content
        return self._write(block, value)

    def replace(self, label: str, old: str, new: str) -> Block:
        block = self._writable(label)
        if not old or old not in block.value:
            raise MemoryEditError(f"block {label!r} does not contain the text to replace.")
        return self._write(block, block.value.replace(old, new))

    def _writable(self, label: str) -> Block:
        block = self.get(label)
        if block.read_only:
            raise MemoryEditError(f"block {label!r} is read-only.")
        return block

    def _write(self, block: Block, value: str) -> Block:
        if len(value) > block.limit:
            raise MemoryEditError(
                f"block {block.label!r} would hold {len(value)} characters, over its limit of "
                f"{block.limit}."
            )
        return self.set(block.label, value, block.limit, block.read_only)

    def render(self) -> str:
        """The blocks as prompt text, one section per label."""
        return "\n".join(f"<{b.label}>\n{b.value}\n</{b.label}>" for b in self.blocks())
