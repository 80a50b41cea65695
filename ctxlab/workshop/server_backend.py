"""The workshop's seam to a user's server: `ServerLLM` answers `generate` as the in-process
`LLM` does, but every request goes to an OpenAI-compatible server (`ctxlab workshop
--server URL`).

Prompts are the session's token ids (chats are rendered with the local model's template
first) sent as `/v1/completions` token-id prompts, which vLLM, SGLang, llama.cpp and `ctxlab
serve` accept, so the server's prefix cache sees the token sequences a demonstration built.
A server outlives a run, and the session hands out the same text windows in every run with
the same seed, so a second run would find the first one's prompts cached (llama.cpp's
host-memory prompt cache keeps them for long). Token-id prompts are therefore relabelled
by a per-run rotation of the ordinary vocabulary (ids >= 1000): equal ids stay equal and
different ids stay different, so every prefix relation a demonstration builds is kept,
while no two runs send the same sequence. A chat given to `generate` is sent as rendered;
demonstrations 5 and 6 use the server's own chat API instead (`server_chat.py`).

Each answer is streamed: TTFT and every inter-token gap are the client's clock; reused
tokens are the server's `cached_tokens` (or llama.cpp's `timings.cache_n`). What a server
does not tell (the resident KV bytes of a request) is None, never a guess; a demonstration
that needs the engine's pool itself runs on the local engine or declares a server variant
(`demonstration.ServerMode`). It is one of the two request backends
(`request_backend.ServerRequests`).
"""

from __future__ import annotations

import logging
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxlab.errors import CtxlabError
from ctxlab.probe.client import Answer, Budget, ProbeClient
from ctxlab.probe.identify import ServerInfo, check_url, identify
from ctxlab.workshop.config_servers import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from ctxlab.model.tokenizer import Tokenizer


LOW = 1000  # ids below this are special or byte tokens on common vocabularies
PARALLEL = 16  # requests of one generate() call in flight at once


@dataclass
class ServerMetrics:
    """The subset of `ctxlab.engine.RequestMetrics` a client can measure."""

    ttft: float
    itl: list[float]
    latency: float
    prompt_tokens: int
    output_tokens: int
    reused_tokens: int
    resident_kv_bytes: int | None = None  # not visible from outside

    @property
    def tpot(self) -> float:
        n = self.output_tokens
        return (self.latency - self.ttft) / (n - 1) if n > 1 else 0.0


@dataclass
class ServerOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]  # placeholders: only their count is known (usage.completion_tokens)
    text: str
    metrics: ServerMetrics
    finish_reason: str = "length"
    error: None = None


@dataclass
class ServerLLM:
    client: ProbeClient
    info: ServerInfo
    tokenizer: Tokenizer  # the local model's: chats are rendered to ids with it
    vocab_size: int
    rotation: int = field(init=False)  # in [1, ordinary ids): never the identity
    kv_events: str | None = None  # its KV-event publisher (`[[servers]] kv_events`), if any

    def __post_init__(self) -> None:
        span = self.vocab_size - min(LOW, self.vocab_size // 4)
        self.rotation = 1 + secrets.randbelow(max(1, span - 1))

    @classmethod
    def connect(
        cls,
        url: str,
        api_key: str | None,
        model: str | None,
        tokenizer: Tokenizer,
        vocab_size: int,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> ServerLLM:
        """Check the server (one sentence on a bad URL, key or model) and wrap it. `timeout`:
        seconds one request may take in total (`--server-timeout`, `[[servers]] timeout`);
        every client the run makes for this server takes it from `client.timeout`."""
        check_url(url)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
        client = ProbeClient(url, model or "", api_key, Budget(10**9, 10**12), timeout=timeout)
        info = identify(client, model)
        client.model = info.model
        # it answered: a request that later gets no answer in time means it stopped answering
        # mid-run (exit 3, the report kept), not that it was never reachable
        client.answered += 1
        return cls(client, info, tokenizer, vocab_size)

    def relabel(self, ids: list[int]) -> list[int]:
        """Token ids as this run sends them: the ordinary ones rotated (see the module)."""
        low = min(LOW, self.vocab_size // 4)
        span, r = self.vocab_size - low, self.rotation
        # special and byte tokens keep their ids
        return [t if t < low else low + (t - low + r) % span for t in map(int, ids)]

    def label(self, code: bool = False) -> str:
        return self.info.label(code)

    def _ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        if prompt and isinstance(prompt[0], dict):
            return list(self.tokenizer.apply_chat(list(prompt), add_generation_prompt=True))
        return self.relabel(list(prompt))

    def generate(
        self, prompts: Any, params: Any = None, cache_salt: str | None = None
    ) -> list[ServerOutput]:
        from ctxlab.engine.request import as_prompt_list
        from ctxlab.engine.sampling import SamplingParams

        params = params or SamplingParams()
        if params.stop:
            raise CtxlabError("stop strings are not sent to a server by the workshop backend")
        ids = [self._ids(p) for p in as_prompt_list(prompts)]

        def one(p: list[int]) -> ServerOutput:
            a = self.client.complete(
                p, len(p), max_tokens=params.max_tokens, salt=cache_salt,
                ignore_eos=params.ignore_eos, temperature=params.temperature,
            )  # fmt: skip
            return _output(p, a)

        if len(ids) == 1:
            return [one(ids[0])]
        with ThreadPoolExecutor(min(PARALLEL, len(ids))) as pool:
            return list(pool.map(one, ids))

    def reports_cached(self) -> bool:
        """Whether the server says how many prompt tokens its cache served (two requests)."""
        from ctxlab.probe.prompts import Words, text

        prompt = text(Words(0x5EED).take(64))
        self.client.complete(prompt, 64)
        return self.client.complete(prompt, 64).cached_tokens is not None

    def close(self) -> None:
        self.client.close()


def _output(ids: list[int], a: Answer) -> ServerOutput:
    t = a.chunk_times
    itl = [t[k] - t[k - 1] for k in range(1, len(t))]
    latency = (t[-1] - a.sent_at) if t else a.ttft
    metrics = ServerMetrics(
        ttft=a.ttft,
        itl=itl,
        latency=latency,
        prompt_tokens=a.prompt_tokens,
        output_tokens=a.output_tokens,
        reused_tokens=a.cached_tokens or 0,
    )
    return ServerOutput(ids, [0] * a.output_tokens, a.text, metrics)
