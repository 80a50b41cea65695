"""Representation layer arithmetic: what long context costs before any hardware is bought.

One concept per module: `memory` (logical KV bytes), `paging` (page rounding), `sharing`
(ideal prefix sharing), `parallel` (tensor-parallel copies), `capacity` (requests that fit),
`compute` (prefill FLOPs, decode bytes, roofline times), `cost` (hosted and self-hosted),
`devices`, `engines` (what vLLM, SGLang and llama.cpp allocate: `predict_engine_pool`), and
`report.build_plan`, the one function every caller uses for the numbers.
Never imports torch.
"""

from ctxlab.plan.report import build_plan

__all__ = ["build_plan"]
