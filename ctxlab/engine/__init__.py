"""Execution layer: a small continuous-batching engine over the paged KV pool.

`Sequence` (per request), `Scheduler` (waiting/running, chunked prefill, preemption by
recompute), `Runner` (flat batch, paged attention, sampling), `LLMEngine` (the step loop a
server drives) and `LLM` (the batch API).
"""

from ctxlab.engine.llm import LLM
from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.metrics import RequestMetrics
from ctxlab.engine.request import RequestFailedError, RequestOutput, TokenEvent
from ctxlab.engine.sampling import SamplingParams
from ctxlab.engine.scheduler import Scheduler
from ctxlab.engine.sequence import RequestError, Sequence
from ctxlab.stats import percentile

__all__ = [
    "LLM",
    "LLMEngine",
    "RequestError",
    "RequestFailedError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "Scheduler",
    "Sequence",
    "TokenEvent",
    "percentile",
]
