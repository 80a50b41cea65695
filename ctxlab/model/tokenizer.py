"""Tokenizer and chat template from the same GGUF file or HF folder as the weights.

transformers builds a fast tokenizer from the GGUF vocabulary and merges; that takes about
ten seconds on a small CPU, in every process. So the built tokenizer is saved once under the
user's cache folder (`tokenizer.json`, its config and chat template), keyed by the file's
size, a hash of its key/value section (where the vocabulary, merges, special tokens and
template live) and the transformers version that converted it; later processes load that in
half a second. Writers build in a private folder and rename it into place, so processes
that start together never see half a cache entry. `CTXLAB_CACHE_DIR` moves the cache.
Within a process one instance per path is kept as well.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxlab.cache_dir import cache_root
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
        """Token ids of a chat rendered by the model's own template.

        A base model without a template (Gemma 3 270M pretrained) has no chat format to
        follow, so its chat is rendered as plain text (`plain_chat_text`) and encoded as a
        prompt: commands that speak in chats (eval, RAG answers, memory, serving's chat
        endpoint) then run on it as a text continuation."""
        if not self.has_chat_template:
            return self.encode(plain_chat_text(messages, add_generation_prompt))
        ids = self.hf.apply_chat_template(
            list(messages),
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
        )
        return [int(i) for i in ids]


def plain_chat_text(messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
    """A chat as plain paragraphs, for models with no chat template: each message's content
    in turn, separated by a blank line, and a blank line after the last one when the model
    is to continue (its answer starts a new paragraph). Roles are not spelled out: a base
    model was trained on text, not on role markers."""
    text = "\n\n".join(str(m.get("content") or "").strip() for m in messages)
    last_is_answer = bool(messages) and messages[-1].get("role") == "assistant"
    return text + ("\n\n" if add_generation_prompt and not last_is_answer else "")


def gguf_tokenizer_key(path: Path) -> str:
    """What the tokenizer depends on: file size, key/value bytes, transformers version.

    Only the header's key/value section is read (a few MB), never the tensor data."""
    import transformers

    from ctxlab.arch.gguf_header import read_gguf_header

    header = read_gguf_header(path)
    start, end = header.metadata_span
    digest = hashlib.sha256()
    digest.update(f"{header.file_size}:{transformers.__version__}:".encode())
    with open(path, "rb") as f:
        f.seek(start)
        digest.update(f.read(end - start))
    return digest.hexdigest()[:32]


def _build_from_gguf(p: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)


def _cached_gguf_tokenizer(p: Path) -> Any:
    """Load the tokenizer of a GGUF file from the cache, building and saving it on a miss."""
    from transformers import AutoTokenizer

    entry = cache_root() / "tokenizers" / gguf_tokenizer_key(p)
    if (entry / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(entry), local_files_only=True)
        except Exception:  # a damaged entry: rebuild it below
            shutil.rmtree(entry, ignore_errors=True)
    hf = _build_from_gguf(p)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
        hf.save_pretrained(str(tmp))
        try:
            tmp.rename(entry)  # atomic; fails if another process got there first
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a read-only cache folder only costs the next process the build again
    return hf


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str, extra_eos_ids: tuple[int, ...] = ()) -> Tokenizer:
    """Tokenizer for a .gguf file or an HF folder (local files only, never the hub)."""
    from transformers import AutoTokenizer

    p = Path(path)
    try:
        if p.is_dir():
            hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        else:
            hf = _cached_gguf_tokenizer(p)
    except CtxlabError:
        raise
    except Exception as exc:  # transformers raises many kinds; the user needs the path
        raise CtxlabError(f"could not build a tokenizer from {p} ({type(exc).__name__}).") from exc
    return Tokenizer(hf, extra_eos_ids)
