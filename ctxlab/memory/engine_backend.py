"""The in-process engine as a memory backend: the default model, counted by its tokenizer.

Nothing heavy loads at construction: counting needs only the tokenizer (built from the same
GGUF), and the weights load on the first generation. torch is imported only then, so the
memory and retrieval packages stay importable without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctxlab.memory.backend import Chat, Reply

DEFAULT_MODEL = "smollm2-135m"


class EngineBackend:
    """`LLM(...)` behind the Backend protocol.

    `model` is a model name or path, an already loaded `LoadedModel`, or an `LLM` (so a caller
    that holds one shares it). `llm_kwargs` go to `LLM(...)` (pool size, dtype, policy).
    """

    name = "ctxlab-engine"

    def __init__(
        self,
        model: Any = DEFAULT_MODEL,
        context_window: int | None = None,
        batch_size: int = 16,
        **llm_kwargs: Any,
    ) -> None:
        self._model = model
        self._window = context_window
        self._llm_kwargs = {"kv_pool_tokens": 16384, **llm_kwargs}
        self._llm: Any = model if _is_llm(model) else None
        self._tokenizer: Any = None
        self.batch_size = batch_size

    # -- lazy pieces ----------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            if self._llm is not None:
                self._tokenizer = self._llm.tokenizer
            elif isinstance(self._model, str):
                from ctxlab.model.registry import resolve_model_path
                from ctxlab.model.tokenizer import load_tokenizer

                self._tokenizer = load_tokenizer(str(resolve_model_path(self._model)))
            else:
                self._tokenizer = self._model.tokenizer
        return self._tokenizer

    @property
    def llm(self) -> Any:
        if self._llm is None:
            from ctxlab.engine import LLM

            self._llm = LLM(self._model, **self._llm_kwargs)
        return self._llm

    @property
    def model_label(self) -> str:
        if isinstance(self._model, str):
            return self._model
        return str(getattr(getattr(self._model, "loaded", self._model), "source_path", "model"))

    def load(self) -> None:
        """Load the tokenizer and the weights now rather than on the first generation."""
        _ = self.llm, self.tokenizer

    # -- Backend ----------------------------------------------------------------------------
    @property
    def context_window(self) -> int:
        if self._window is None:
            self._window = int(self.llm.engine.max_position)
        return self._window

    def count_tokens(self, chat: Chat) -> int:
        return len(self.tokenizer.apply_chat(list(chat), add_generation_prompt=True))

    def spans(self, text: str) -> list[tuple[int, int]]:
        enc = self.tokenizer.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    def generate(self, chats: Sequence[Chat], max_tokens: int) -> list[Reply]:
        from ctxlab.engine import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        outs = self.llm.generate([list(c) for c in chats], params)
        return [Reply(o.text.strip(), len(o.prompt_token_ids), len(o.token_ids)) for o in outs]

    def measure_prefill(self, chat: Chat) -> float | None:
        """Time to first token of this chat alone (one output token): its prefill time."""
        from ctxlab.engine import SamplingParams

        out = self.llm.generate([list(chat)], SamplingParams(max_tokens=1, temperature=0.0))[0]
        return float(out.metrics.ttft)


def _is_llm(obj: Any) -> bool:
    return hasattr(obj, "generate") and hasattr(obj, "engine") and hasattr(obj, "tokenizer")
