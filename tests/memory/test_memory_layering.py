"""The application layer talks to a backend: importing memory and rag, and running a store
round trip with the fake backend, never imports torch or transformers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_memory_and_rag_do_not_import_torch(tmp_path) -> None:
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import ctxlab.memory, ctxlab.rag, ctxlab.commands.memory, ctxlab.commands.rag\n"
        "from memory_fakes import WordBackend\n"
        "from ctxlab.memory import MemoryAgent, MemoryConfig, Message, open_store\n"
        f"store = open_store({str(tmp_path / 'x.db')!r})\n"
        "agent = MemoryAgent(WordBackend(), 'tiered', store, MemoryConfig(window=200))\n"
        "agent.respond('My code is 4417.', max_tokens=8)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
