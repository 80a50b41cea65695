"""What a demonstration declares: its number, key, config section, metrics, default config,
the risks it guards against, what it does through a server, its plots and its context
numbers.

A demonstration is one module that builds one `Demonstration` and one line in
`registry.REGISTERED`. Everything else reads these declarations: the config schema takes the
section model, the default config takes the TOML fragments, a prediction or a required metric
must name a declared metric, `DemoResult.observe` refuses an undeclared one, the "what
could go wrong" list asks each demonstration that ran for its guards, server mode reads
`server` (whether its requests go through the server, what it needs of one, its variant),
the six context numbers read `context_numbers`, and the files list reads `plots`. No runner,
document or command names a demonstration by key or number. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:  # the session and the progress tracker only appear in signatures
    from ctxlab.progress import Tracker
    from ctxlab.workshop.result import DemoResult, JSONValue, Layer
    from ctxlab.workshop.server_findings import ServerRun
    from ctxlab.workshop.session import Session


@dataclass(frozen=True)
class Metric:
    """One quantity a demonstration observes twice: at a baseline and at the observed value."""

    name: str
    unit: str  # "tokens", "ms", "bytes", "requests", "%", "USD", "blocks", "facts"
    baseline: str  # what the observed value is compared against
    observed: str
    description: str


class Risk(StrEnum):
    """The known ways to fool oneself about long context (the "what could go wrong" list),
    in the order the report lists them."""

    USEFUL_CONTEXT = "configured context reported as useful context"
    PAYLOAD_VS_COMPUTE = "KV payload and prefill compute treated as one complexity"
    PAGING_BYTES = "paging credited with smaller bytes per token"
    HIT_REQUESTS = "hit requests counted instead of reused tokens"
    LRU_AS_MEMORY = "an LRU cache called semantic memory"
    TENANTS = "cross-tenant reuse without an isolation key"
    SUMMARIES = "summary quality judged by token reduction alone"
    RECALL_ONLY = "retrieval recall without answer and citation quality"
    STORAGE_RATIOS = "MQA/GQA/MLA storage ratios read as quality claims"
    RECURRENT_LOSSLESS = "recurrent state treated as lossless history"
    OFFLOAD = "offload without queueing"
    P99 = "averages hiding p99 collapse"
    DISAGGREGATION = "disaggregation without duplicate weights and transfer"
    PRICING = "pricing without misses, failures or idle reserve"


FigureValues = dict[str, "JSONValue"]
# A guard reads the figures of a demonstration that ran and says how it guards against its
# risk: ("guarded" or "partly guarded", the sentence that cites this run's figures).
GuardFn = Callable[[FigureValues], tuple[str, str]]

S = TypeVar("S", bound=BaseModel)


@dataclass(frozen=True)
class Plot:
    """One figure a demonstration draws: its file under the run's `plots/` folder and what it
    shows. The drawing function lives in the demonstration's own file (`plots.py` holds only
    the shared matplotlib set-up)."""

    file: str
    shows: str

    def path(self, out: Path) -> Path:
        return out / "plots" / self.file


@dataclass(frozen=True)
class ContextNumber:
    """One of the six context numbers a demonstration measures: read from its figure
    `figure` in results.json (`source` says what it is; when the figure is absent the
    report says the demonstration's status instead)."""

    name: str
    figure: str
    source: str


# A server variant: what the demonstration measures through a server instead of its `run`
# (its config asks for what a client cannot set, e.g. the page size or the pool).
ServerVariant = Callable[["Session", "ServerRun"], "DemoResult"]
# A server extra: run after `run` on the local engine, it adds what the server measures.
ServerExtra = Callable[["Session", "ServerRun", "DemoResult"], None]


@dataclass(frozen=True)
class ServerMode:
    """What `ctxlab workshop --server` does with a demonstration.

    - `through`: its requests go to the run's request backend (`session.requests`, the
      server when there is one); otherwise it runs on the local engine.
    - `chat`: it calls the backend's chat API (`session.requests.chat`), so it needs the
      server to count a chat's tokens as the local tokenizer does.
    - `needs_cached_tokens`: not measurable through a server that does not report them.
    - `variant`: measured instead of `run` through a server; `instead` says what it
      measured (for the report's server line).
    - `extra`: run after `run` (on the local engine) with the server.
    - `staircase`: how long a prompt its variant needs the server's divergence staircase
      (measured once per run, before any demonstration) to reach, from its section."""

    through: bool = False
    chat: bool = False
    needs_cached_tokens: bool = False
    variant: ServerVariant | None = None
    instead: str = ""
    extra: ServerExtra | None = None
    staircase: Callable[[BaseModel], int] | None = None

    @property
    def uses_server(self) -> bool:
        """Whether the server answers (some of) its requests."""
        return self.through or self.variant is not None


LOCAL = ServerMode()


@dataclass(frozen=True)
class Demonstration(Generic[S]):
    """One demonstration's declarations and its two entry points.

    `toml`, `predictions_toml`, `quick_toml` and `full_toml` are this demonstration's
    commented fragments of the embedded default config (its `[key]` table, its
    `[predictions.key]` table, its `[quick.key]` / `[quick.predictions.key]` tables and its
    `[full.key]` table, or ""); `required` names the metrics the default config requires it
    to measure."""

    number: int
    key: str  # the config section and the prefix of its metric names
    title: str
    section: type[S]
    metrics: tuple[Metric, ...]
    layers: tuple[Layer, ...]  # the report tables its results go to
    steps: Callable[[Session], int]
    run: Callable[[Session, Tracker], DemoResult]
    toml: str
    predictions_toml: str
    quick_toml: str = ""
    full_toml: str = ""
    required: tuple[str, ...] = ()
    guards: tuple[tuple[Risk, GuardFn], ...] = ()
    # what the section needs of the shared config, checked when a config is read; raises
    # ValueError with the sentence (a pool too small, a prompt past max_model_len)
    check: Callable[[S, BaseModel], None] | None = None
    # files the section names, read before the model loads when the demonstration is
    # selected (a bad file costs a second); raises CtxlabError with the sentence
    preflight: Callable[[S], None] | None = None
    server: ServerMode = LOCAL
    plots: tuple[Plot, ...] = ()
    context_numbers: tuple[ContextNumber, ...] = ()
    metric_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metric_names", tuple(m.name for m in self.metrics))
        unknown = set(self.required) - set(self.metric_names)
        if unknown:
            raise ValueError(f"{self.key}: required metrics not declared: {sorted(unknown)}")

    def plot(self, file: str) -> Plot:
        """The declared plot written to `file` (a demonstration draws only declared plots)."""
        found = next((p for p in self.plots if p.file == file), None)
        if found is None:
            raise ValueError(f"{self.key}: plot {file!r} is not declared")
        return found

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)

    def config(self, cfg: BaseModel) -> S:
        """This demonstration's section of a workshop config."""
        section = getattr(cfg, self.key)
        assert isinstance(section, self.section)
        return section
