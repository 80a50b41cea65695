"""The experiment contract's schema: every section of the TOML file as a pydantic model.

Strict types (TOML's own: no string is read as a number), no unknown keys, and checks of
values that cannot work: a page size of 0, a divergence past the prompt, a pool that cannot
hold the running requests, a prediction for a metric the demonstration does not report.
Reading a file, merging it over the default and turning an error into one sentence is
`config_file.load_config`. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ctxlab.arch.spec import ArchSpec
from ctxlab.inputs import SEED_MAX
from ctxlab.workshop.catalog import BY_KEY, metric_ref
from ctxlab.workshop.config_servers import ServerList

Pos = Annotated[int, Field(ge=1)]
NonNeg = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]


def arch_from(source: str) -> ArchSpec:
    """An architecture from a preset name, a Hugging Face config.json or a GGUF file (its
    header only); what cannot be read raises ValueError with the reason."""
    from ctxlab.arch import resolve_arch
    from ctxlab.arch.presets import PRESETS
    from ctxlab.errors import CtxlabError

    try:
        if source.endswith(".gguf"):
            return resolve_arch(gguf=source)
        if source.endswith(".json"):
            return resolve_arch(config=source)
        if source not in PRESETS:
            raise ValueError(
                f"{source!r} is not a preset (known: {', '.join(PRESETS)}), a .gguf file or a "
                "config.json"
            )
        return resolve_arch(name=source)
    except CtxlabError as exc:
        raise ValueError(str(exc).rstrip(".")) from None


class _Strict(BaseModel):
    # allow_inf_nan: every number of the contract is finite (TOML's inf would pass gt=0).
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class ModelSection(_Strict):
    source: str = Field(min_length=1)
    arch: str
    dtype: Literal["float32", "bfloat16"]
    threads: NonNeg
    max_model_len: Annotated[int, Field(ge=16)]
    reserved_output_tokens: Pos
    seed: Seed

    @field_validator("arch")
    @classmethod
    def _arch(cls, name: str) -> str:
        if name:
            arch_from(name)
        return name

    @model_validator(mode="after")
    def _budget(self) -> ModelSection:
        if self.reserved_output_tokens >= self.max_model_len:
            raise ValueError(
                f"reserved_output_tokens {self.reserved_output_tokens} leaves no prompt budget "
                f"in max_model_len {self.max_model_len}"
            )
        return self


class EngineSection(_Strict):
    page_size: Pos
    kv_pool_tokens: Pos
    max_num_batched_tokens: Pos
    max_num_seqs: Pos

    @model_validator(mode="after")
    def _pool(self) -> EngineSection:
        if self.kv_pool_tokens < self.page_size:
            raise ValueError(
                f"kv_pool_tokens {self.kv_pool_tokens} holds less than one page of "
                f"{self.page_size} tokens"
            )
        return self


class CostSection(_Strict):
    currency: str = Field(min_length=1)
    input_per_mtok: PosFloat
    cache_write_per_mtok: PosFloat
    cache_read_per_mtok: PosFloat
    output_per_mtok: PosFloat
    cpu_hourly: PosFloat


class PrefixMissSection(_Strict):
    prompt_tokens: Annotated[int, Field(ge=8)]
    output_tokens: Pos
    repeats: Pos


class WarmPrefixSection(_Strict):
    prefix_tokens: Pos
    suffix_tokens: Pos
    output_tokens: Annotated[int, Field(ge=2)]
    repeats: Annotated[int, Field(ge=3)]


class PageSizeSection(_Strict):
    page_sizes: list[Pos] = Field(min_length=2)
    request_tokens: list[Pos] = Field(min_length=1)
    pair_tokens: Annotated[int, Field(ge=2)]
    divergence_at: Pos

    @model_validator(mode="after")
    def _shape(self) -> PageSizeSection:
        if sorted(set(self.page_sizes)) != self.page_sizes:
            raise ValueError("page_sizes must be distinct and in increasing order")
        if self.divergence_at >= self.pair_tokens:
            raise ValueError(
                f"divergence_at {self.divergence_at} must fall inside the pair's "
                f"{self.pair_tokens} tokens"
            )
        if all(self.divergence_at % p == 0 for p in self.page_sizes):
            raise ValueError(
                f"divergence_at {self.divergence_at} is a multiple of every page size, so it "
                "cannot show reuse granularity"
            )
        return self


class EvictionSection(_Strict):
    groups: Annotated[int, Field(ge=2)]
    requests_per_group: Annotated[int, Field(ge=2)]
    prefix_tokens: Pos
    suffix_tokens: Pos
    output_tokens: Pos
    pool_share: Annotated[float, Field(gt=0, lt=1)]
    concurrency: Pos
    profile: str = Field(min_length=1)


class Workload(_Strict):
    requests: Pos
    input_tokens: Pos
    output_tokens: Pos


class SimWorkload(Workload):
    rate: Annotated[float, Field(ge=0)]  # arrivals per second, evenly spaced; 0: all at once


class RecurrentSection(_Strict):
    recurrent_arch: str
    kv_arch: str
    device: str
    pool_gib: PosFloat
    short: SimWorkload
    long: SimWorkload
    engine_pool_tokens: Pos
    engine_short: Workload
    engine_long: Workload

    @field_validator("recurrent_arch", "kv_arch")
    @classmethod
    def _arch(cls, name: str) -> str:
        arch_from(name)  # an unknown preset or an unreadable file is one sentence
        return name

    @field_validator("device")
    @classmethod
    def _device(cls, name: str) -> str:
        from ctxlab.plan.devices import DEVICES

        if name not in DEVICES:
            raise ValueError(f"{name!r} is not a device (known: {', '.join(DEVICES)})")
        return name

    @model_validator(mode="after")
    def _kinds(self) -> RecurrentSection:
        rec, kv = arch_from(self.recurrent_arch), arch_from(self.kv_arch)
        if rec.fixed_state_bytes() == 0:
            raise ValueError(f"recurrent_arch {self.recurrent_arch!r} has no recurrent layer")
        if kv.fixed_state_bytes() != 0 or kv.kv_bytes_per_token() == 0:
            raise ValueError(f"kv_arch {self.kv_arch!r} is not a pure KV-cache architecture")
        for name, w in (("engine_short", self.engine_short), ("engine_long", self.engine_long)):
            if w.input_tokens + w.output_tokens > self.engine_pool_tokens:
                raise ValueError(
                    f"one {name} request ({w.input_tokens} + {w.output_tokens} tokens) does not "
                    f"fit engine_pool_tokens {self.engine_pool_tokens}"
                )
        return self


class CompactionSection(_Strict):
    strategies: list[
        Literal["truncation", "summary", "summary-extractive", "tiered", "compact"]
    ] = Field(min_length=1)
    sessions: Annotated[int, Field(ge=2)]
    turns_per_session: Annotated[int, Field(ge=3)]
    facts: Annotated[int, Field(ge=1, le=10)]
    window_tokens: Annotated[int, Field(ge=64)]
    reserve_tokens: Pos
    note_position: Literal["system", "turn"]
    summary_tokens: Annotated[int, Field(ge=8)]
    search_k: Pos
    retriever: Literal["bm25", "dense", "hybrid"]
    answer_tokens: Pos
    ceiling: bool
    fixture_seed: Seed

    @field_validator("strategies")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("strategies must be distinct")
        return names

    @model_validator(mode="after")
    def _budget(self) -> CompactionSection:
        if self.reserve_tokens + self.answer_tokens > self.window_tokens // 2:
            raise ValueError(
                f"reserve_tokens {self.reserve_tokens} and answer_tokens {self.answer_tokens} "
                f"leave less than half of window_tokens {self.window_tokens} for the context"
            )
        if self.answer_tokens > self.reserve_tokens:
            raise ValueError(
                f"answer_tokens {self.answer_tokens} exceeds the output reserve_tokens "
                f"{self.reserve_tokens}"
            )
        return self


class RetrievalSection(_Strict):
    k_values: list[Pos] = Field(min_length=1)
    retriever: Literal["bm25", "dense", "hybrid"]
    questions: Annotated[int, Field(ge=1, le=100)]  # the fixture has 100 gold questions
    answer_questions: Pos
    answer_tokens: Pos
    order: Literal["relevance", "edges"]
    gold_row: bool
    fixture_seed: Seed

    @model_validator(mode="after")
    def _shape(self) -> RetrievalSection:
        if sorted(set(self.k_values)) != self.k_values:
            raise ValueError("k_values must be distinct and in increasing order")
        if self.answer_questions > self.questions:
            raise ValueError(
                f"answer_questions {self.answer_questions} is more than the {self.questions} "
                "questions retrieval is measured on"
            )
        return self


class UsefulContextSection(_Strict):
    enabled: bool
    tasks: list[str] = Field(min_length=1)
    lengths: list[Pos] = Field(min_length=1)
    samples: Pos
    threshold: Annotated[float, Field(gt=0, le=100)]

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, names: list[str]) -> list[str]:
        from ctxlab.eval.tasks import TASKS

        for name in names:
            if name not in TASKS:
                raise ValueError(f"{name!r} is not an eval task (known: {', '.join(TASKS)})")
        return names


class Prediction(_Strict):
    """How a metric should move from its baseline to the observed value, said before the run.

    `tolerance` is relative to the baseline: `unchanged` holds when |observed - baseline| <=
    tolerance x |baseline|, `down` when observed < baseline x (1 - tolerance), `up` when
    observed > baseline x (1 + tolerance). `range` = [low, high] must also hold when given.
    """

    direction: Literal["down", "up", "unchanged"]
    tolerance: Annotated[float, Field(ge=0)] = 0.0
    range: list[float] | None = None

    @field_validator("range")
    @classmethod
    def _range(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (len(value) != 2 or value[0] > value[1]):
            raise ValueError("range must be [low, high] with low <= high")
        return value


class WorkshopConfig(_Strict):
    model: ModelSection
    engine: EngineSection
    cost: CostSection
    prefix_miss: PrefixMissSection
    warm_prefix: WarmPrefixSection
    page_size: PageSizeSection
    eviction: EvictionSection
    compaction: CompactionSection
    retrieval_depth: RetrievalSection
    recurrent_vs_kv: RecurrentSection
    useful_context: UsefulContextSection
    required_metrics: list[str]
    predictions: dict[str, dict[str, Prediction]]
    servers: ServerList = Field(default_factory=list)  # [[servers]]: config_servers.py

    @field_validator("required_metrics")
    @classmethod
    def _required(cls, refs: list[str]) -> list[str]:
        for ref in refs:
            found = metric_ref(ref)
            if isinstance(found, str):
                raise ValueError(found)
        return refs

    @field_validator("predictions")
    @classmethod
    def _predictions(cls, table: dict[str, dict[str, Prediction]]) -> dict:
        for key, metrics in table.items():
            if key not in BY_KEY:
                raise ValueError(f"{key!r} is not a demonstration (known: {', '.join(BY_KEY)})")
            for name in metrics:
                if isinstance(metric_ref(f"{key}.{name}"), str):
                    known = ", ".join(BY_KEY[key].metric_names)
                    raise ValueError(
                        f"[predictions.{key}] names {name!r}, not a metric of {key} "
                        f"(known: {known})"
                    )
        return table

    @model_validator(mode="after")
    def _cross(self) -> WorkshopConfig:
        e, ev, pm = self.engine, self.eviction, self.prefix_miss
        limit = self.model.max_model_len
        if ev.prefix_tokens % e.page_size:
            raise ValueError(
                f"eviction.prefix_tokens {ev.prefix_tokens} is not a whole number of "
                f"engine.page_size {e.page_size} pages"
            )
        request = ev.prefix_tokens + ev.suffix_tokens + ev.output_tokens
        slots = -(-request // e.page_size) * e.page_size
        pool = eviction_pool_tokens(self)
        if pool < ev.concurrency * slots:
            raise ValueError(
                f"eviction.pool_share {ev.pool_share} gives a pool of {pool} tokens, less than "
                f"{ev.concurrency} running requests of {slots} tokens; raise pool_share or "
                "lower concurrency"
            )
        sizes = {
            "prefix_miss.prompt_tokens": pm.prompt_tokens + pm.output_tokens,
            "warm_prefix": sum((self.warm_prefix.prefix_tokens, self.warm_prefix.suffix_tokens))
            + self.warm_prefix.output_tokens,
            "page_size.pair_tokens": self.page_size.pair_tokens + 1,
            "page_size.request_tokens": max(self.page_size.request_tokens) + 1,
            "eviction": request,
            "useful_context.lengths": max(self.useful_context.lengths),
            "recurrent_vs_kv.engine_long": self.recurrent_vs_kv.engine_long.input_tokens
            + self.recurrent_vs_kv.engine_long.output_tokens,
            "compaction.window_tokens": self.compaction.window_tokens,
        }
        for what, need in sizes.items():
            if need > limit:
                raise ValueError(
                    f"{what} needs {need} tokens, more than model.max_model_len {limit}"
                )
            if need > e.kv_pool_tokens and what.startswith(("prefix_miss", "warm_prefix")):
                raise ValueError(
                    f"{what} needs {need} tokens, more than engine.kv_pool_tokens "
                    f"{e.kv_pool_tokens}"
                )
        return self


def eviction_pool_tokens(cfg: WorkshopConfig) -> int:
    """Demonstration 4's pool: `pool_share` of the groups' prefixes, in whole pages."""
    ev, page = cfg.eviction, cfg.engine.page_size
    tokens = ev.pool_share * ev.groups * ev.prefix_tokens
    return max(page, -(-int(tokens) // page) * page)
