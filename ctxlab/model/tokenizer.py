"""Tokenizer and chat template from the same GGUF file or HF folder as the weights.

transformers builds a fast tokenizer from the GGUF vocabulary and merges; that takes seconds,
so one instance per path is cached for the life of the process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxlab.errors import CtxlabError


class Tokenizer:
    """encode / decode / apply_chat over a transformers tokenizer, returning plain int lists."""

    def __init__(self, hf_tokenizer: Any, extra_eos_ids: Sequence[int] = ()) -> None:
        self.hf = hf_tokenizer
        eos = [hf_tokenizer.eos_token_id] if hf_tokenizer.eos_token_id is not None else []
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys([*eos, *extra_eos_ids]))
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, with whatever special tokens the model adds by default."""
        return list(self.hf.encode(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of a chat rendered by the model's own template."""
        if not self.has_chat_template:
            raise CtxlabError("this model has no chat template; pass plain text instead.")
        ids = self.hf.apply_chat_template(
            list(messages),
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
        )
        return [int(i) for i in ids]


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str, extra_eos_ids: tuple[int, ...] = ()) -> Tokenizer:
    """Tokenizer for a .gguf file or an HF folder (local files only, never the hub)."""
    from transformers import AutoTokenizer

    p = Path(path)
    try:
        if p.is_dir():
            hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        else:
            hf = AutoTokenizer.from_pretrained(
                str(p.parent), gguf_file=p.name, local_files_only=True
            )
    except Exception as exc:  # transformers raises many kinds; the user needs the path
        raise CtxlabError(f"could not build a tokenizer from {p} ({type(exc).__name__}).") from exc
    return Tokenizer(hf, extra_eos_ids)
