"""The exact server flag that makes a server report what the probe reads.

Without `usage.prompt_tokens_details.cached_tokens` every cache figure is either "not
measurable" or inferred from TTFT; the report then names the one flag that fixes it for the
engine it identified, instead of leaving the user to search each engine's options.
"""

from __future__ import annotations

CACHED_TOKENS_FLAGS: dict[str, str] = {
    "vllm": "--enable-prompt-tokens-details",
    "sglang": "--enable-cache-report",
}


def cached_tokens_hint(engine: str) -> str:
    """One sentence: how to make `engine` report cached prompt tokens."""
    flag = CACHED_TOKENS_FLAGS.get(engine)
    if flag:
        return f"start the {engine} server with {flag} to report cached tokens"
    if engine == "llama.cpp":
        return "use a llama.cpp server build that returns timings.cache_n"
    if engine == "ctxlab":
        return "ctxlab serve always reports cached tokens; this server did not"
    known = ", ".join(f"{e} {f}" for e, f in CACHED_TOKENS_FLAGS.items())
    return f"start the server with the flag that reports cached tokens ({known})"
