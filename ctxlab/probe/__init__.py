"""Measure a deployment's cache from outside: `ctxlab probe`.

A server (vLLM, SGLang, llama.cpp's server, `ctxlab serve`) is reached only through its
OpenAI API and, where it has them, `/metrics`, `/tokenize` and its info endpoints. Every
figure is a `Figure` marked measured or inferred, and the report names the server.
"""
