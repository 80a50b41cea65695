"""What every demonstration shares: the loaded model, the config, prompts, engines, the arch.

The model loads once per run and every demonstration builds its own engine over it with its
own pool and page size (an engine is cheap; the weights are not). Prompts are natural text
(the shipped Shakespeare) cut into token-id windows that never overlap, so two prompts share
a prefix only when a demonstration makes them share one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ctxlab.workshop.config import CommonConfig

if TYPE_CHECKING:
    from ctxlab.arch.spec import ArchSpec
    from ctxlab.engine import LLM
    from ctxlab.model import LoadedModel
    from ctxlab.workshop.request_backend import RequestBackend

WARM_UP_TOKENS = 48
TEXT_CHARS = 400_000  # about 100,000 tokens: far more than one run's prompts need


@dataclass
class TextStream:
    """The shipped text as token ids, handed out in windows that never repeat in a run (one
    stream per run, shared by every copy of the session)."""

    ids: list[int] = field(default_factory=list)
    cursor: int = 0


@dataclass
class Session:
    cfg: CommonConfig  # a registry.WorkshopConfig: each demonstration reads its table
    loaded: LoadedModel
    out: Path
    quick: bool = False
    text: TextStream = field(default_factory=TextStream)
    resident_tokens: list[tuple[str, int]] = field(default_factory=list)
    # when this run began (wall clock): a file in `out` written since then is this run's
    started: float = field(default_factory=time.time)
    # where the requests of a demonstration declared `ServerMode(through=True)` go: the
    # local engine unless the runner chose a server for the whole run
    requests: RequestBackend = field(init=False)

    def __post_init__(self) -> None:
        from ctxlab.workshop.request_backend import EngineRequests

        self.requests = EngineRequests(self)

    # -- prompts --------------------------------------------------------------------------
    def text_ids(self, n: int) -> list[int]:
        """The next `n` token ids of natural text, never handed out before in this run."""
        t = self.text
        if not t.ids:
            from ctxlab.eval.vocab import essay_text

            text = essay_text()
            start = (self.cfg.model.seed * 7919) % (len(text) // 2)
            t.ids = self.loaded.tokenizer.encode(text[start : start + TEXT_CHARS])
            t.cursor = 0
        if t.cursor + n > len(t.ids):
            raise RuntimeError("the shipped text ran out of tokens for distinct prompts")
        out = t.ids[t.cursor : t.cursor + n]
        t.cursor += n
        return out

    def other_token(self, token: int) -> int:
        """A different ordinary token (for 'change one token')."""
        vocab = self.loaded.config.vocab_size
        low = min(1000, vocab // 4)
        return low + (token - low + 1) % (vocab - low) if token >= low else low

    # -- engines --------------------------------------------------------------------------
    def llm(
        self,
        page_size: int | None = None,
        pool_tokens: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        prefix_caching: bool = True,
        warm_up: bool = True,
    ) -> LLM:
        """An engine over the shared model; `warm_up` runs one short untimed request first,
        so the first measured request does not pay for lazy allocations. Always the local
        engine: requests that may go to a server go through `requests`."""
        from ctxlab.engine import LLM, SamplingParams

        e = self.cfg.engine
        llm = LLM(
            self.loaded,
            kv_pool_tokens=pool_tokens or e.kv_pool_tokens,
            block_size=page_size or e.page_size,
            enable_prefix_caching=prefix_caching,
            max_num_batched_tokens=max_num_batched_tokens or e.max_num_batched_tokens,
            max_num_seqs=max_num_seqs or e.max_num_seqs,
            max_model_len=self.cfg.model.max_model_len,
        )
        if warm_up:
            ids = self.text_ids(WARM_UP_TOKENS)
            llm.generate([ids], SamplingParams(max_tokens=2, ignore_eos=True), cache_salt="warm-up")
        return llm

    def slot_bytes(self, llm: LLM) -> int:
        """Pool bytes of one token slot over every layer and KV head, read from the pool."""
        kv = llm.engine.kv
        return kv.pool.block_bytes * kv.n_lanes // kv.block_size

    def note_resident(self, where: str, resident_bytes: int | None, slot_bytes: int) -> None:
        """Record one request's resident cache tokens (for the six context numbers); a
        server does not tell them (None), so nothing is recorded."""
        if resident_bytes is None:
            return
        self.resident_tokens.append((where, resident_bytes // slot_bytes))

    # -- the planner's view of the same model ---------------------------------------------
    def arch(self) -> ArchSpec:
        """The architecture for plan and simulate, its cache at the engine's dtype width."""
        from ctxlab.workshop.config import arch_from

        name = self.cfg.model.arch
        if not name:
            source = Path(self.loaded.source_path)
            name = str(source / "config.json") if source.is_dir() else str(source)
        width = 4 if self.cfg.model.dtype == "float32" else 2
        return arch_from(name).with_cache_dtype(width)

    def check_arch(self) -> None:
        """model.arch must describe the engine's model: one token must cost the same bytes in
        the plan as in the engine's pool, or every planner-beside-pool figure is meaningless."""
        from ctxlab.errors import CtxlabError

        llm = self.llm(pool_tokens=64, warm_up=False)
        plan, pool = self.arch().kv_bytes_per_token(), self.slot_bytes(llm)
        if plan != pool:
            raise CtxlabError(
                f"model.arch {self.cfg.model.arch or '(read from the model file)'} does not "
                f"describe model.source {self.cfg.model.source}: one token costs {plan:,} bytes "
                f"in the plan and {pool:,} in the engine's pool."
            )
