"""docs/followup-and-long-context.md: every config it gives for a longer run of
demonstrations 10 and 11 is a valid workshop config, merged over the default as a user's
file is (no model needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ctxlab.workshop.config_file import load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "followup-and-long-context.md"
BLOCKS = re.findall(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_the_page_gives_the_three_configs() -> None:
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("block", BLOCKS, ids=["smollm2-6k", "gemma-11-16k", "gemma-10"])
def test_each_config_loads(block: str, tmp_path: Path) -> None:
    path = tmp_path / "long.toml"
    path.write_text(block, encoding="utf-8")
    cfg = load_config(path)
    c = cfg.long_vs_retrieval
    if "context_tokens" in block:  # the slice, a question and its answer fit the window
        assert c.context_tokens + 64 + c.answer_tokens <= cfg.model.max_model_len
    if "gemma3-270m" in block:
        assert cfg.model.source == "gemma3-270m"
