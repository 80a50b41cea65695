"""How long one engine step takes: a roofline by default, or a measured profile.

A step processes some prefill chunks and one token for each decoding request. The roofline
prices it as max(FLOPs / (peak x compute efficiency), bytes / (bandwidth x memory
efficiency)) + a fixed step overhead, so a big prefill chunk comes out compute-bound and a
decode-only step memory-bound without a special case. FLOPs: 2 per active parameter per
token plus attention (2 x H_q x (d_k + d_v) per attended key per layer, causal, windows
capped; the formulas of `ctxlab.plan.compute`). Bytes: the weights read once per step plus
every attended key's cache bytes plus the recurrent state of each request in the step.

A profile (JSON, written by the real engine's `ctxlab profile`) instead lists measured steps;
a linear model over the same load features is fitted to it by least squares. File format:

    {"format": "ctxlab-step-profile/1",
     "model": "smollm2-135m", "device": "cpu (2 cores)",        # free text, shown only
     "steps": [{"prefill_tokens": 512, "prefill_keys": 131328,
                "decode_tokens": 0, "decode_keys": 0, "seconds": 0.081}, ...]}

`prefill_keys` is the sum over the step's prefill tokens of the keys each attends to
(causal, ignoring windows); `decode_keys` the sum of the decoding requests' context lengths
including the new token. At least five steps with both prefill and decode load are needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ctxlab.arch.spec import ArchSpec
from ctxlab.errors import CtxlabError
from ctxlab.inputs import load_json
from ctxlab.plan.compute import attended_keys, decode_weight_bytes
from ctxlab.plan.devices import Device
from ctxlab.plan.parallel import replication

PROFILE_FORMAT = "ctxlab-step-profile/1"


@dataclass(frozen=True)
class AttentionGroup:
    """Attention layers sharing one window (None = global): FLOPs and cache bytes per key."""

    window: int | None
    flops_per_key: int
    bytes_per_key: float


@dataclass(frozen=True)
class ArchCost:
    """What the simulator needs from an ArchSpec, precomputed once (per all `gpus` ranks)."""

    groups: tuple[AttentionGroup, ...]
    kv_bytes_per_token: int  # pool bytes one retained token costs (all ranks, copies counted)
    state_bytes: int  # fixed recurrent state per running request (all ranks)
    weight_flops_per_token: int
    decode_weight_bytes: int

    @staticmethod
    def build(arch: ArchSpec, weights_bytes: int, gpus: int = 1) -> ArchCost:
        # Group 0 is always the global (window None) group, so its key counts are the
        # unwindowed features a measured profile uses, even for an all-sliding model.
        by_window: dict[int | None, list[float]] = {None: [0.0, 0.0]}
        kv_per_token = 0.0
        state = 0.0
        for layer in arch.layers:
            copies = float(replication(layer, gpus))
            if layer.kind in ("full", "sliding", "mla"):
                window = layer.window if layer.kind == "sliding" else None
                if layer.kind == "mla":
                    d_k = layer.d_k or (layer.d_c + layer.d_rope)
                    d_v = layer.d_v or layer.d_c
                else:
                    d_k, d_v = layer.d_k, layer.d_v
                per_token = layer.bytes_per_token(arch.cache_dtype_bytes) * copies
                slot = by_window.setdefault(window, [0.0, 0.0])
                slot[0] += 2 * arch.n_query_heads * (d_k + d_v)
                slot[1] += per_token
                kv_per_token += per_token
            state += layer.fixed_bytes(arch.cache_dtype_bytes) * copies
        groups = tuple(
            AttentionGroup(w, int(v[0]), v[1])
            for w, v in sorted(by_window.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))
        )
        return ArchCost(
            groups=groups,
            kv_bytes_per_token=math.ceil(kv_per_token),
            state_bytes=math.ceil(state),
            weight_flops_per_token=2 * arch.flops_params,
            decode_weight_bytes=decode_weight_bytes(arch, weights_bytes),
        )

    def add_prefill(self, load: StepLoad, n: int, context: int) -> None:
        """Add a chunk of n tokens computed after `context` cached tokens to a step."""
        load.prefill_tokens += n
        load.requests += 1
        for i, g in enumerate(self.groups):
            load.flop_keys[i] += attended_keys(context + n, g.window) - attended_keys(
                context, g.window
            )
            end = context + n
            load.read_keys[i] += end if g.window is None else min(end, g.window)

    def add_decode(self, load: StepLoad, contexts: list[int]) -> None:
        """Add one new token for each request (its context before the token) to a step."""
        n = len(contexts)
        load.decode_tokens += n
        load.requests += n
        total = sum(contexts) + n
        for i, g in enumerate(self.groups):
            keys = total if g.window is None else sum(min(c + 1, g.window) for c in contexts)
            load.flop_keys[i] += keys
            load.read_keys[i] += keys
        load.decode_keys_full += total

    def new_load(self) -> StepLoad:
        k = len(self.groups)
        return StepLoad(flop_keys=[0] * k, read_keys=[0] * k)


@dataclass
class StepLoad:
    """One step's work. flop_keys: attended (query, key) pairs per group; read_keys: cache
    tokens read per group; group 0 is global, so flop_keys[0] counts pairs unwindowed."""

    flop_keys: list[int]
    read_keys: list[int]
    prefill_tokens: int = 0
    decode_tokens: int = 0
    decode_keys_full: int = 0
    requests: int = 0

    @property
    def prefill_keys_full(self) -> int:
        return self.flop_keys[0] - self.decode_keys_full


class RooflineStepTime:
    """Roofline step time with efficiency factors and a fixed per-step overhead."""

    def __init__(
        self,
        cost: ArchCost,
        device: Device,
        gpus: int = 1,
        compute_efficiency: float = 0.5,
        memory_efficiency: float = 0.8,
        overhead_s: float = 0.0005,
    ) -> None:
        if not 0 < compute_efficiency <= 1 or not 0 < memory_efficiency <= 1:
            raise CtxlabError("efficiency factors must be in (0, 1]")
        if not 0 <= overhead_s < math.inf:
            raise CtxlabError(f"step overhead must be zero or a positive number, got {overhead_s}")
        self.cost = cost
        self.flops_rate = device.peak_flops * gpus * compute_efficiency
        self.byte_rate = device.mem_bandwidth * gpus * memory_efficiency
        self.overhead = overhead_s
        self.label = (
            f"roofline ({compute_efficiency:.0%} of peak FLOP/s, "
            f"{memory_efficiency:.0%} of bandwidth, {overhead_s * 1e3:g} ms overhead)"
        )

    def seconds(self, load: StepLoad) -> float:
        c = self.cost
        flops = c.weight_flops_per_token * (load.prefill_tokens + load.decode_tokens)
        mem = c.decode_weight_bytes + c.state_bytes * load.requests
        for g, fk, rk in zip(c.groups, load.flop_keys, load.read_keys, strict=True):
            flops += g.flops_per_key * fk
            mem += g.bytes_per_key * rk
        return max(flops / self.flops_rate, mem / self.byte_rate) + self.overhead

    def decode_stretch(self, contexts: np.ndarray, steps: int) -> np.ndarray:
        """Durations of `steps` decode-only steps; each request grows by one token a step."""
        c = self.cost
        n = len(contexts)
        j = np.arange(steps, dtype=np.float64)
        flops = np.full(steps, float(c.weight_flops_per_token * n))
        mem = np.full(steps, float(c.decode_weight_bytes + c.state_bytes * n))
        for g in c.groups:
            keys = _stretch_keys(contexts, j, g.window)
            flops += g.flops_per_key * keys
            mem += g.bytes_per_key * keys
        return np.maximum(flops / self.flops_rate, mem / self.byte_rate) + self.overhead


class StepTime(Protocol):
    """What the simulator asks of a step-time model."""

    label: str

    def seconds(self, load: StepLoad) -> float: ...

    def decode_stretch(self, contexts: np.ndarray, steps: int) -> np.ndarray: ...


class ScaledStepTime:
    """Another model's step times x `scale`. A queue amplifies a step-price error (near
    saturation a 5 % slower step moves p50 TTFT by far more than 5 %), so a prediction is
    worth reading beside the same run at a slightly slower and faster step."""

    def __init__(self, inner: StepTime, scale: float) -> None:
        self.inner = inner
        self.scale = scale
        self.label = f"{inner.label}, every step x {scale:g}"

    def seconds(self, load: StepLoad) -> float:
        return self.scale * self.inner.seconds(load)

    def decode_stretch(self, contexts: np.ndarray, steps: int) -> np.ndarray:
        return self.scale * self.inner.decode_stretch(contexts, steps)


def _stretch_keys(contexts: np.ndarray, j: np.ndarray, window: int | None) -> np.ndarray:
    """Per step j: sum over requests of min(c + 1 + j, window)."""
    if window is None:
        return float(contexts.sum() + len(contexts)) + len(contexts) * j
    grid = np.minimum(contexts[None, :] + 1 + j[:, None], window)
    return grid.sum(axis=1).astype(np.float64)


_FEATURES = ("prefill_tokens", "prefill_keys", "decode_tokens", "decode_keys")


class ProfileStepTime:
    """Step time fitted to measured steps: seconds = c0 + sum(c_i x feature_i), c_i >= 0."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        data = load_json(path, "step profile")
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
            raise CtxlabError(f"step profile {path} must have format {PROFILE_FORMAT!r}")
        steps = data.get("steps")
        if not isinstance(steps, list) or len(steps) < 5:
            raise CtxlabError(f"step profile {path} needs a list of at least 5 measured steps")
        rows, secs = [], []
        for i, step in enumerate(steps):
            try:
                features = [float(step.get(k, 0)) for k in _FEATURES]
                seconds = float(step["seconds"])
            except (AttributeError, KeyError, TypeError, ValueError):
                raise CtxlabError(
                    f"step profile {path} step {i} needs numeric {', '.join(_FEATURES)} and seconds"
                ) from None
            if not (math.isfinite(seconds) and seconds > 0):
                raise CtxlabError(
                    f"step profile {path} step {i} took {seconds} seconds; a measured step "
                    "time must be a positive number"
                )
            if not all(math.isfinite(f) and f >= 0 for f in features):
                raise CtxlabError(
                    f"step profile {path} step {i} has a negative or non-finite load "
                    f"({', '.join(_FEATURES)} must be zero or positive)"
                )
            rows.append([1.0, *features])
            secs.append(seconds)
        self.coef = _nonnegative_lstsq(np.array(rows), np.array(secs))
        self.label = f"profile {path.name} ({data.get('model', '?')} on {data.get('device', '?')})"
        self.source = str(path)

    def seconds(self, load: StepLoad) -> float:
        return self._fit(
            load.prefill_tokens, load.prefill_keys_full, load.decode_tokens, load.decode_keys_full
        )

    def price(self, step: dict[str, float]) -> float:
        """Seconds the fit gives one step written in the profile format (e.g. a line of
        `ctxlab serve --step-log`), to set beside the seconds it really took."""
        return self._fit(*(float(step.get(k, 0)) for k in _FEATURES))

    def _fit(self, prefill_tokens: float, prefill_keys: float, decode_tokens: float,
             decode_keys: float) -> float:  # fmt: skip
        """The fitted line at one step's four features (in `_FEATURES` order)."""
        c = self.coef
        return float(
            c[0] + c[1] * prefill_tokens + c[2] * prefill_keys + c[3] * decode_tokens
            + c[4] * decode_keys
        )  # fmt: skip

    def decode_stretch(self, contexts: np.ndarray, steps: int) -> np.ndarray:
        c = self.coef
        n = len(contexts)
        keys = _stretch_keys(contexts, np.arange(steps, dtype=np.float64), None)
        return c[0] + c[3] * n + c[4] * keys


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients clipped at zero and refitted (a step never gets
    faster with more work)."""
    active = np.ones(x.shape[1], dtype=bool)
    coef = np.zeros(x.shape[1])
    for _ in range(x.shape[1]):
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        coef[:] = 0
        coef[active] = sol
        if (coef >= 0).all():
            break
        active &= coef > 0
    return np.clip(coef, 0, None)
