"""What a step profile says about the engine it was measured on, applied to a simulation.

A profile written by `ctxlab probe` (or `ctxlab profile`) carries the server's page size
(`engine.block_size`), its pool (`engine.pool_tokens`: measured, or as its `/metrics`
publishes it), its scheduling limits where they are known (`engine.max_num_seqs` or
`max_running`, `engine.max_num_batched_tokens`: vLLM's names) and the device
it was measured on. Simulating that deployment with the simulator's own defaults (16-token
pages, a pool derived from a GPU's memory) would predict another server, so `simulate
--profile` takes each of these from the profile unless its option was given, and prints
every value it took.
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxlab.arch.spec import ArchSpec
from ctxlab.inputs import load_json
from ctxlab.sim.config import SimConfig


@dataclass(frozen=True)
class ProfileEngine:
    device: str | None
    block_size: int | None
    pool_tokens: int | None
    max_running: int | None
    step_tokens: int | None = None  # the token budget of one step (vLLM's max_num_batched_tokens)


def _positive(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def read_profile_engine(path: str) -> ProfileEngine:
    doc = load_json(path, "step profile")
    engine = doc.get("engine") if isinstance(doc, dict) else None
    engine = engine if isinstance(engine, dict) else {}
    device = doc.get("device") if isinstance(doc, dict) else None
    return ProfileEngine(
        device if isinstance(device, str) and device else None,
        _positive(engine.get("block_size")),
        _positive(engine.get("pool_tokens")),
        _positive(engine.get("max_running")) or _positive(engine.get("max_num_seqs")),
        _positive(engine.get("max_num_batched_tokens")),
    )


def apply_profile_engine(
    cfg: SimConfig, spec: ArchSpec, eng: ProfileEngine, given: set[str]
) -> tuple[SimConfig, list[str]]:
    """`cfg` with the profile's engine settings where no option in `given` (the options the
    user gave: "--page-size", "--pool-bytes", "--max-running", "--chunk-tokens") set them;
    and one line per value taken."""
    said: list[str] = []
    changes: dict[str, object] = {}
    if eng.block_size and "--page-size" not in given:
        changes["page_size"] = eng.block_size
        said.append(f"page size {eng.block_size} tokens (engine.block_size; --page-size overrides)")
    if eng.pool_tokens and "--pool-bytes" not in given and not cfg.unlimited:
        pool = eng.pool_tokens * spec.kv_bytes_per_token()
        changes["pool_bytes"] = pool
        said.append(
            f"KV pool {eng.pool_tokens:,} tokens = {pool:,} bytes of {spec.name}'s cache "
            "(engine.pool_tokens; --pool-bytes overrides)"
        )
    if eng.max_running and "--max-running" not in given:
        changes["max_running"] = eng.max_running
        said.append(
            f"at most {eng.max_running} requests at once (engine.max_num_seqs; --max-running "
            "overrides)"
        )
    if eng.step_tokens and "--chunk-tokens" not in given:
        changes["chunk_tokens"] = eng.step_tokens
        said.append(
            f"at most {eng.step_tokens:,} tokens a step (engine.max_num_batched_tokens; "
            "--chunk-tokens overrides)"
        )
    return (cfg.with_(**changes) if changes else cfg), said
