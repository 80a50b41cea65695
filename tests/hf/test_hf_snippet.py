"""The README's ctxlab.hf example runs as written (offline, the packaged model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_snippet() -> str:
    """The README's ```python block that builds a ctxlab.hf cache, exactly as shown."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    found = [b for b in blocks if "ctxlab.hf.cache(" in b]
    assert len(found) == 1, "the README shows one ctxlab.hf example"
    return found[0]


def test_readme_snippet_runs(capsys, gguf_path):
    exec(compile(readme_snippet(), "README", "exec"), {})
    text, nbytes = capsys.readouterr().out.rsplit(" ", 1)
    assert text.strip() and int(nbytes) > 0
