"""The planner's prediction of a server's KV pool, beside the published and the measured one.

The probe knows the engine (`identify`) and, on vLLM, reads every start-up setting the pool
depends on from `/metrics` (`cache_config_info` carries all of vLLM's `CacheConfig`:
`block_size`, `cache_dtype`, `kv_cache_memory_bytes`, which `VLLM_CPU_KVCACHE_SPACE` sets,
and `num_gpu_blocks_override`) and the max-model-len from `/v1/models`. With the model's
architecture (`--arch`, else the folder vLLM loaded when it is on this machine, else a
preset of the served name) `ctxlab.plan.engines` predicts the blocks and the token capacity
the server should publish, so three figures stand side by side: predicted (planner),
published (the server's metrics) and measured (the probe's fills). `agreement` says, in
one sentence, which of them disagrees.

Only vLLM is predicted here: SGLang publishes no pool in bytes and llama.cpp's probe
capacity counts prompts, so for them (and `ctxlab serve`, whose pool is its
`--kv-pool-tokens`) the prediction is "not measurable" with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.probe.figures import Figure
from ctxlab.probe.identify import ServerInfo

Samples = list[tuple[str, dict[str, str], float]]
NAME = "capacity predicted by the planner"

# vLLM's cache_dtype values and torch dtype names -> the planner's cache dtypes
_DTYPES = {
    "float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16",
    "half": "fp16", "fp16": "fp16", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
}  # fmt: skip


@dataclass(frozen=True)
class Architecture:
    spec: ArchSpec
    source: str  # where it came from, for the note
    dtype: str | None  # the model's own dtype (config.json), None when not stated


@dataclass(frozen=True)
class Prediction:
    figures: list[Figure]
    pool: dict[str, Any] | None  # the planner's whole answer (ctxlab plan --engine's JSON)
    tokens: int | None  # predicted capacity in tokens, comparable with the published figure


def user_architecture(arch: str) -> Architecture:
    """The user's `--arch`: a preset name, a config.json or its folder, a GGUF file."""
    from ctxlab.arch.presets import get_preset

    path = Path(arch)
    if path.suffix == ".gguf":
        from ctxlab.arch.gguf_meta import from_gguf

        return Architecture(from_gguf(path), f"--arch {arch}", None)
    if path.exists():
        return _from_config(path, f"--arch {arch}")
    return Architecture(get_preset(arch), f"--arch preset {arch}", None)


def served_architecture(info: ServerInfo) -> Architecture | str:
    """The served model's architecture from what the server says, or why it is unknown."""
    from ctxlab.arch.presets import PRESETS, get_preset

    root = Path(info.model_root) if info.model_root else None
    if root is not None and (root / "config.json").is_file():
        try:
            return _from_config(root, f"the folder the server loaded ({root}/config.json)")
        except CtxlabError as exc:  # a model the planner cannot read: no prediction, no failure
            return f"the planner cannot read {root}/config.json ({str(exc).rstrip('.')})"
    for name in (info.model, root.name if root else ""):
        if name and name.lower() in PRESETS:
            return Architecture(get_preset(name), f"the preset {name.lower()} (served name)", None)
    return (
        f"the served model {info.model!r} is not a preset and its folder is not on this "
        "machine: name its architecture with --arch (a preset, config.json or GGUF file)"
    )


def _from_config(path: Path, source: str) -> Architecture:
    from ctxlab.arch.hf_config import from_hf_config

    config = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise CtxlabError(f"cannot read {config}: {exc}") from None
    dtype = raw.get("dtype") or raw.get("torch_dtype") if isinstance(raw, dict) else None
    return Architecture(from_hf_config(config), source, dtype if isinstance(dtype, str) else None)


def _cache_config(samples: Samples | None) -> dict[str, str] | None:
    for name, labels, _ in samples or []:
        if name == "vllm:cache_config_info":
            return labels
    return None


def _int(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key, "")
    return int(value) if value.isdigit() else None


def predict(
    info: ServerInfo, samples: Samples | None, arch: Architecture | str | None
) -> Prediction:
    """The planner's vLLM pool for this server's model and published settings."""
    if info.engine != "vllm":
        why = (
            "ctxlab serve's pool is its --kv-pool-tokens, not derived from memory"
            if info.engine == "ctxlab"
            else f"the probe predicts vLLM's pool only ({info.engine} is modeled by "
            "`ctxlab plan --engine` from its documentation, with a pool in bytes this server "
            "does not publish)"
        )
        return Prediction([Figure(NAME, None, "not measurable", why)], None, None)
    labels = _cache_config(samples)
    if labels is None:
        return _none("vLLM publishes no cache_config_info in /metrics")
    if isinstance(arch, str) or arch is None:
        return _none(arch or "no architecture")
    block, mml = _int(labels, "block_size"), info.max_model_len
    if block is None or mml is None:
        return _none("the server publishes no block_size or max_model_len")
    cache_dtype = labels.get("cache_dtype", "auto")
    named = cache_dtype if cache_dtype != "auto" else arch.dtype
    dtype = _DTYPES.get((named or "").lower())
    dtype_how = (
        f"cache_dtype {cache_dtype}"
        if cache_dtype != "auto"
        else f"cache_dtype auto: the model's dtype {arch.dtype}"
        if dtype
        else "cache_dtype auto and no model dtype stated: the architecture's default"
    )
    spec = arch.spec
    if dtype is not None:
        from ctxlab.plan.memory import with_cache_dtype

        spec = with_cache_dtype(spec, dtype)
    pool_bytes = _int(labels, "kv_cache_memory_bytes")
    override = _int(labels, "num_gpu_blocks_override")
    published_blocks = _int(labels, "num_gpu_blocks")
    # block 128 is vLLM's CPU default (16 on GPU): only the tokens a sliding group reserves
    # for tokens in flight depend on the platform
    platform = "cpu" if block == 128 else "gpu"
    pool_how = f"kv_cache_memory_bytes {pool_bytes:,}" if pool_bytes else ""
    if pool_bytes is None and override is None:
        if published_blocks is None:
            return _none("the server publishes neither its pool in bytes nor num_gpu_blocks")
        override = published_blocks  # the blocks only: the groups' rules are still predicted
        pool_how = f"the published num_gpu_blocks {published_blocks} (no pool in bytes published)"
    from ctxlab.plan.engines import predict_engine_pool

    def run(pool: int) -> dict[str, Any]:
        return predict_engine_pool(
            spec, "vllm", max_model_len=mml, kv_cache_bytes=pool, platform=platform,
            block_size=block,
        ).to_dict()  # fmt: skip

    try:
        first = run(pool_bytes or 1 << 40)
        if override is not None:  # vLLM's may_override_num_blocks: the pool is the override
            per_block = int(first["bytes_per_block"])
            pool = run(override * per_block)
            if pool_bytes is not None:  # what vLLM logs as "Overriding num_gpu_blocks=N"
                pool_how = (
                    f"num_gpu_blocks_override {override} x {per_block:,} bytes per block (the "
                    f"kv_cache_memory_bytes {pool_bytes:,} alone give {first['num_blocks']} "
                    "blocks: vLLM's log line 'Overriding num_gpu_blocks=N')"
                )
            elif not pool_how:
                pool_how = f"num_gpu_blocks_override {override} x {per_block:,} bytes per block"
        else:
            pool = first
    except CtxlabError as exc:
        return _none(str(exc).rstrip("."))
    blocks, tokens = int(pool["num_blocks"]), int(pool["kv_cache_tokens"])
    groups = ", ".join(
        f"{len(g['layers'])} {g['kind']} layers x {g['blocks_per_request']} blocks"
        for g in pool["groups"]
    )
    note = (
        f"ctxlab plan --engine vllm ({pool['version'].split(' (')[0]}): {blocks} blocks of "
        f"{block} tokens ({pool['bytes_per_block']:,} bytes each) from {pool_how}; per "
        f"request of {mml:,} tokens: {groups}; max concurrency {pool['max_concurrency']:.2f}x; "
        f"{arch.source}; {dtype_how}"
    )
    figs = [Figure(NAME, tokens, "inferred", note, "tokens")]
    if published_blocks is not None:
        same = published_blocks == blocks
        figs.append(
            Figure(
                "num_gpu_blocks predicted / published", f"{blocks} / {published_blocks}",
                "inferred",
                ("equal, as num_gpu_blocks_override sets it" if override is not None
                 else "equal: the planner reproduces vLLM's own block count") if same
                else f"the planner is off by {blocks - published_blocks:+} blocks",
            )
        )  # fmt: skip
    published_tokens = _int(labels, "kv_cache_size_tokens")
    if published_tokens is not None:
        figs.append(
            Figure(
                "KV cache size predicted / published", f"{tokens:,} / {published_tokens:,}",
                "inferred",
                "vLLM's start-up 'KV cache size' (int(max concurrency x max_model_len)): "
                + ("equal" if tokens == published_tokens
                   else f"off by {tokens - published_tokens:+,} tokens"),
                "tokens",
            )
        )  # fmt: skip
    return Prediction(figs, pool, tokens)


def _none(why: str) -> Prediction:
    return Prediction([Figure(NAME, None, "not measurable", why)], None, None)


def agreement(
    predicted: int | None, published: int | None, measured: int | None, page: int
) -> Figure:
    """Which of the three capacities disagrees, in one sentence (within one page agrees:
    vLLM keeps one block back as its null block, the probe reads whole pages)."""
    tol = max(1, page)
    named = {"predicted": predicted, "published": published, "measured": measured}
    known = {k: v for k, v in named.items() if v is not None}

    def close(a: str, b: str) -> bool:
        return abs(known[a] - known[b]) <= tol

    name = "capacity: which figure disagrees"
    if len(known) < 2:
        missing = ", ".join(k for k in named if k not in known)
        return Figure(name, None, "not measurable", f"only one figure to compare ({missing} "
                      "not known)")  # fmt: skip
    keys = list(known)
    if len(known) == 2:
        a, b = keys
        if close(a, b):
            return Figure(name, "none", "inferred", f"the {a} and the {b} capacity agree "
                          f"within one page ({tol} tokens); the third is not known")  # fmt: skip
        return Figure(
            name, "unknown", "inferred",
            f"the {a} ({known[a]:,}) and the {b} ({known[b]:,}) capacity differ by "
            f"{known[a] - known[b]:+,} tokens; without the third figure neither can be blamed",
        )  # fmt: skip
    pairs = {(a, b): close(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :]}
    if all(pairs.values()):
        return Figure(name, "none", "inferred", "the predicted, published and measured "
                      f"capacities agree within one page ({tol} tokens)")  # fmt: skip
    for odd in keys:
        others = [k for k in keys if k != odd]
        if pairs[(others[0], others[1])] and not any(v for pair, v in pairs.items() if odd in pair):
            mean = sum(known[k] for k in others) / 2
            return Figure(
                name, odd, "inferred",
                f"the {odd} capacity ({known[odd]:,} tokens) disagrees: the other two agree "
                f"within one page and it is {known[odd] - mean:+,.0f} tokens from them",
            )  # fmt: skip
    return Figure(
        name, "all", "inferred",
        "the three capacities disagree: "
        + ", ".join(f"{k} {v:,}" for k, v in known.items()) + " tokens",
    )  # fmt: skip
