"""Serving layer: an OpenAI-compatible HTTP server over the engine (`ctxlab serve`).

`create_app(engine, ServeSettings(...))` builds the FastAPI app: one background thread owns
the engine (`EngineLoop`), handlers only enqueue and read, metrics use vLLM's names
(`ServeMetrics`), and an optional API-key file maps keys to tenants whose prefix-cache
entries never mix (`Tenants`). `run_server` serves it with uvicorn.
"""

from ctxlab.serve.app import ServeSettings, create_app
from ctxlab.serve.metrics import ServeMetrics
from ctxlab.serve.tenants import Tenants

__all__ = ["ServeMetrics", "ServeSettings", "Tenants", "create_app"]
