"""Measure the real engine's step times for the simulator (`ctxlab profile`).

The simulator prices a step from four counts (see `ctxlab.sim.steptime`): prefill tokens,
prefill keys (sum over prefill tokens of the keys each attends to, causal), decode tokens and
decode keys (sum of the decoding requests' contexts including the new token). Here the real
`LLMEngine` runs a designed set of requests and every `step()` is timed whole (scheduling,
batch building, the forward, sampling, cache bookkeeping), because that is what a request
waits for. The counts are read off the sequences themselves (how far each one's
`num_computed` moved during the step), so no hook inside the engine is needed.

Decode step time is concave in the batch size on a CPU (the first extra requests cost the
most), and the profile's model is linear, so the design samples small batches densely: the
fit is then right where a small server spends its steps. The design covers what serving
mixes: prefill chunks of several sizes after several cached
prefixes (one long prompt fed through a small chunk budget), decode batches of several sizes
at several context lengths (requests sharing one cached prompt, so only a block is
prefilled per request), and mixed steps (a fresh prompt joining running decodes). The step
that admits a batch of prompt-sharing requests (many one-block chunks at once, a shape
serving rarely sees and the profile's features cannot tell apart) is timed but not kept.
"""

from __future__ import annotations

import json
import os
import platform
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ctxlab.engine.llm_engine import LLMEngine
from ctxlab.engine.request import TokenEvent
from ctxlab.engine.sampling import SamplingParams
from ctxlab.errors import CtxlabError
from ctxlab.plan.compute import attended_keys
from ctxlab.progress import progress

if TYPE_CHECKING:
    from ctxlab.model.loader import LoadedModel

PROFILE_FORMAT = "ctxlab-step-profile/1"  # the format `ctxlab.sim.steptime` reads


@dataclass
class StepRecord:
    """One measured engine step: the load counts the profile format needs and its time."""

    kind: str  # prefill, decode or mixed
    prefill_tokens: int
    prefill_keys: int
    decode_tokens: int
    decode_keys: int
    seconds: float


class StepRecorder:
    """Times `engine.step()` and counts what each step computed.

    Records are kept in `steps` (or `skipped`), or handed to `sink` instead when one is given
    (a server's step log, which must not grow in memory)."""

    def __init__(self, engine: LLMEngine, sink: Callable[[StepRecord], None] | None = None) -> None:
        self.engine = engine
        self.sink = sink
        self.steps: list[StepRecord] = []
        self.skipped: list[StepRecord] = []

    def step(self, keep: bool = True, detokenize: bool = False) -> list[TokenEvent]:
        """One engine step; `keep=False` files it under `skipped` (a setup step)."""
        live = [s for s in self.engine.seqs.values() if not s.finished]
        before = [(s.num_computed, s.admitted) for s in live]
        t0 = time.perf_counter()
        events = self.engine.step(detokenize=detokenize)
        seconds = time.perf_counter() - t0
        pt = pk = dt = dk = 0
        for seq, (c, admitted) in zip(live, before, strict=True):
            if not admitted and seq.admitted:  # admitted in this step: the prefix-cache
                c = seq.metrics.reused_tokens  # hit was read, not computed
            n = seq.num_computed - c
            if n <= 0:  # not scheduled (or preempted: its work is lost, not counted)
                continue
            # A request re-admitted after preemption may also hit the cache; its hit is not
            # recorded anywhere, so it counts as computed (the profile runs never preempt).
            if n == 1 and c >= seq.num_prompt:
                dt += 1
                dk += c + 1
            else:
                pt += n
                pk += attended_keys(c + n) - attended_keys(c)
        kind = "mixed" if pt and dt else ("prefill" if pt else "decode")
        record = StepRecord(kind, pt, pk, dt, dk, seconds)
        if self.sink is not None:
            self.sink(record)
        else:
            (self.steps if keep else self.skipped).append(record)
        return events


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    low = min(1000, vocab // 4)  # clear of special and byte tokens
    return [rng.randrange(low, vocab) for _ in range(n)]


@dataclass(frozen=True)
class Design:
    """Which steps to measure. prefill: (chunk, chunks) - one prompt of chunk x chunks tokens
    fed `chunk` at a time; decode: contexts x batch sizes, `decode_steps` each; mixed: a
    fresh prompt of each size joining `mixed_batch` running decodes at `mixed_context`."""

    prefill: tuple[tuple[int, int], ...]
    decode_contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_steps: int
    mixed_batch: tuple[int, ...]
    mixed_context: int
    mixed_prompts: tuple[int, ...]

    def scenarios(self) -> int:
        return len(self.prefill) + len(self.decode_contexts) + len(self.mixed_batch)

    def max_tokens(self) -> int:
        """Pool tokens the largest scenario holds at once (plus slack for rounding)."""
        pre = max((c * k for c, k in self.prefill), default=0)
        dec = max(self.decode_contexts, default=0) + max(self.decode_batches, default=0) * (
            self.decode_steps + 32
        )
        mix = self.mixed_context + max(self.mixed_batch, default=0) * (
            2 * len(self.mixed_prompts) + 32
        )
        return max(pre, dec, mix + max(self.mixed_prompts, default=0)) + 64


FULL = Design(
    prefill=((32, 4), (96, 3), (192, 3), (384, 3), (640, 2)),
    decode_contexts=(64, 320, 768),
    decode_batches=(1, 2, 3, 4, 6, 8, 12, 16),
    decode_steps=5,
    mixed_batch=(2, 8),
    mixed_context=256,
    mixed_prompts=(64, 256, 512),
)
QUICK = Design(
    prefill=((64, 2), (128, 2), (256, 2), (512, 2)),
    decode_contexts=(128, 512),
    decode_batches=(1, 2, 4, 8),
    decode_steps=3,
    mixed_batch=(4,),
    mixed_context=256,
    mixed_prompts=(128, 384),
)
TINY = Design(  # for tests: every kind of step, a few seconds on one core
    prefill=((16, 2), (48, 1)),
    decode_contexts=(32,),
    decode_batches=(1, 3),
    decode_steps=2,
    mixed_batch=(2,),
    mixed_context=32,
    mixed_prompts=(24, 40),
)


def _drain(rec: StepRecorder) -> None:
    while rec.engine.has_unfinished():
        rec.step()


def _forget_finished(engine: LLMEngine) -> None:
    for rid in [r for r, s in engine.seqs.items() if s.finished]:
        del engine.seqs[rid]


def warm_up(engine: LLMEngine, vocab_size: int, seed: int = 0) -> None:
    """One short request, untimed: the first forward pays for lazy allocations. Its own
    random stream, so its blocks never turn into prefix hits for the measured prompts."""
    rng = random.Random(f"warm-up {seed}")
    prompt = _prompt(rng, 48, vocab_size)
    engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    _forget_finished(engine)


def measure(
    engine: LLMEngine,
    design: Design,
    vocab_size: int,
    seed: int = 0,
    on_scenario: Callable[[str], None] | None = None,
) -> list[StepRecord]:
    """Run the design on `engine` and return every step it measured."""
    rng = random.Random(seed)
    rec = StepRecorder(engine)
    sched = engine.scheduler
    budget = sched.max_num_batched_tokens
    done = on_scenario or (lambda _label: None)

    def greedy(n: int) -> SamplingParams:
        return SamplingParams(max_tokens=n, ignore_eos=True)

    try:
        for chunk, chunks in design.prefill:
            sched.max_num_batched_tokens = chunk  # the chunk budget shapes these steps only
            engine.add_request(_prompt(rng, chunk * chunks, vocab_size), greedy(1))
            _drain(rec)
            done(f"prefill {chunk} x {chunks}")
        sched.max_num_batched_tokens = budget
        for ctx in design.decode_contexts:
            shared = _prompt(rng, ctx, vocab_size)
            engine.add_request(shared, greedy(1))  # cache the prompt once
            _drain(rec)
            for b in design.decode_batches:
                for _ in range(b):
                    engine.add_request(shared, greedy(design.decode_steps + 1))
                rec.step(keep=False)  # b prompts' last blocks: setup, not a serving step
                _drain(rec)
            done(f"decode at context {ctx}")
        for b in design.mixed_batch:
            shared = _prompt(rng, design.mixed_context, vocab_size)
            engine.add_request(shared, greedy(1))
            _drain(rec)
            for _ in range(b):
                engine.add_request(shared, greedy(1 + 2 * len(design.mixed_prompts)))
            rec.step(keep=False)  # the decoders' last prompt blocks: setup
            for n in design.mixed_prompts:
                engine.add_request(_prompt(rng, n, vocab_size), greedy(2))
                rec.step()  # the fresh prompt's prefill beside b decodes
                rec.step()  # b + 1 decodes
            _drain(rec)
            done(f"mixed with {b} decodes")
    finally:
        sched.max_num_batched_tokens = budget
        _forget_finished(engine)
    return rec.steps


def machine_info() -> dict[str, Any]:
    """What the timings belong to: CPU, cores, torch build and thread count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
    }


def profile_document(
    steps: list[StepRecord],
    model: str,
    dtype: str,
    engine: LLMEngine,
    design_name: str,
) -> dict[str, Any]:
    """The `ctxlab-step-profile/1` JSON object (extra keys are ignored by the loader)."""
    info = machine_info()
    sched = engine.scheduler
    return {
        "format": PROFILE_FORMAT,
        "model": model,
        "device": f"cpu, {info['torch_threads']} torch thread(s) of {info['cores']} cores",
        "dtype": dtype,
        "torch_threads": info["torch_threads"],
        "machine": info,
        "engine": {
            "block_size": engine.kv.block_size,
            "pool_tokens": engine.kv.pool_tokens,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "max_num_seqs": sched.max_num_seqs,
        },
        "design": design_name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "steps": [asdict(s) for s in steps],
    }


def open_engine(
    model: str,
    dtype: str,
    threads: int,
    pool_tokens: int,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
) -> tuple[LoadedModel, LLMEngine]:
    """Pin torch's thread count, load the model, build an engine; (loaded model, engine).

    The thread count is pinned because timings on a shared machine are only comparable
    when the profile and the run it predicts use the same number of threads."""
    if threads <= 0:
        raise CtxlabError(f"--threads must be positive, got {threads}")
    torch.set_num_threads(threads)
    from ctxlab.model.open_model import open_model

    loaded = open_model(model, dtype)
    engine = LLMEngine(
        loaded.model,
        loaded.config,
        loaded.tokenizer,
        kv_pool_tokens=pool_tokens,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        model_id=str(loaded.source_path),
    )
    return loaded, engine


def measure_profile(
    loaded: LoadedModel,
    engine: LLMEngine,
    model: str,
    dtype: str,
    quick: bool,
    out: Path,
    seed: int = 0,
    show_progress: bool = False,
    design: Design | None = None,
    earlier: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Warm up, run the design (with a progress bar if asked), write the profile; the document.

    `earlier` is a profile document measured before on the same engine: its steps are kept
    (phase "before"), and the new ones are marked "after", so one file brackets a run."""
    design = design or (QUICK if quick else FULL)
    need = design.max_tokens()
    if need > engine.kv.pool_tokens:
        raise CtxlabError(
            f"the profile needs a pool of at least {need} tokens; raise --kv-pool-tokens"
        )
    vocab = loaded.config.vocab_size
    with progress("warming up", total=design.scenarios() + 1, enabled=show_progress) as bar:
        warm_up(engine, vocab, seed)
        bar.advance()

        def step_done(label: str) -> None:
            bar.advance()
            bar.describe(f"measured {label}")

        steps = measure(engine, design, vocab, seed, step_done)
    name = "quick" if design is QUICK else ("full" if design is FULL else "custom")
    doc = profile_document(steps, model, dtype, engine, name)
    if earlier is not None:
        for step in earlier["steps"]:
            step.setdefault("phase", "before")
        for step in doc["steps"]:
            step["phase"] = "after"
        doc["steps"] = earlier["steps"] + doc["steps"]
        doc["design"] = f"{name}, measured before and after"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc
