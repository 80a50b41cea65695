"""The representation layer must start where no model stack is installed: no torch import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def test_arch_readers_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from ctxlab.arch import resolve_arch\n"
        "resolve_arch('gemma-3-27b')\n"
        f"resolve_arch(config={str(FIXTURES / 'jamba-v0.1.json')!r})\n"
        "import ctxlab.arch.gguf_meta\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
