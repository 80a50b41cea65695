"""Load generation for any OpenAI-compatible server (`ctxlab bench serve`).

Workloads (`workloads`), arrivals and sending (`runner`, `client`), `vllm bench serve`'s
metric definitions (`metrics`) and its printed lines (`report`); `serve.run_bench` ties them
together. Only httpx, numpy and the standard library: no torch, no tokenizer, no model.
"""
