"""The planner must start where no model stack is installed: it never imports torch."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import ctxlab.arch, ctxlab.plan
import ctxlab.plan.report, ctxlab.plan.tables, ctxlab.plan.plot, ctxlab.plan.engines
import ctxlab.commands.plan
from ctxlab.plan.report import build_plan
build_plan("llama-3.1-8b", [4096, 131072])
gemma = ctxlab.arch.get_preset("gemma-3-270m")
ctxlab.plan.engines.predict_engine_pool(gemma, max_model_len=4096, kv_cache_bytes=2**30)
bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("torch modules:", bad)
sys.exit(1 if bad else 0)
"""


def test_plan_does_not_import_torch():
    proc = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
