from __future__ import annotations

from pathlib import Path

import pytest

from ctxlab.arch import get_preset
from ctxlab.plan.devices import get_device

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces"


@pytest.fixture(scope="session")
def llama8b():
    return get_preset("llama-3.1-8b")


@pytest.fixture(scope="session")
def h100():
    return get_device("h100")


def real_trace(name: str) -> Path:
    path = TRACES / f"{name}_trace.jsonl"
    if not path.exists():
        pytest.skip(f"real trace {path} is absent (../shared/data is not checked out)")
    return path
