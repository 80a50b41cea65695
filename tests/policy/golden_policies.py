"""The golden record of what every registered policy does on the default model.

For every registered policy x 2 budgets x 3 prompts (and `full`, `quant` once each, since
they take no budget; plus SnapKV over a KIVI-4 pool, a storage format wrapping a policy)
it records, per prompt, the greedy token ids and text, the resident KV bytes measured from
the pool when the request finished, and the original positions every lane kept at that
moment. The three prompts run together (batch 3) with 4-token blocks, so decode-time cuts
(every block for H2O, TOVA, the positional policies; SnapKV and PyramidKV re-run every
block), Quest's page choice and recall's far tier all act within 8 decode tokens.

    .venv/bin/python tests/policy/golden_policies.py                 # rewrite every entry
    .venv/bin/python tests/policy/golden_policies.py --only keydiff  # add / redo one policy

`tests/policy/test_golden.py` reruns every case. Greedy ids, text and resident bytes must
match exactly. Kept positions must match exactly too, except a position that this run's own
scores put within `TOLERANCE` of the cut at some selection (`NearTies`): float sums differ
in the last bits between instruction sets (AVX-512 against AVX2 kernels in MKL and oneDNN),
so a near tie flips on one CPU and not on another, and no ranking rule can prevent that
(`ctxlab/policy/ranking.py`). The tolerance is relative to the lane's largest score. Measured
between AVX-512 and AVX2 on the same machine: float pools' scores differ by at most 1.7e-6 of
that, a KIVI-4 pool's by up to 6e-3 (a key within noise of a rounding boundary takes the
next 4-bit code: one quantization step, not one float bit).
The file is regenerated only when a policy's behaviour is meant to change.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import torch

GOLDEN = Path(__file__).with_name("golden_policies.json")
BLOCK = 4
MAX_TOKENS = 8
PROMPT_CHARS = (0, 700, 1500)  # where each prompt starts in the bundled text
PROMPT_TOKENS = (32, 48, 64)

# Smaller windows than the papers' defaults so a 32-token prompt can be cut to 16 tokens.
PARAMS: dict[str, dict[str, Any]] = {
    "h2o": {"obs_window": 8},
    "snapkv": {"obs_window": 8, "rerun_every": BLOCK},
    "pyramidkv": {"obs_window": 8, "rerun_every": BLOCK},
    "recall": {"recall_blocks": 2, "block": 4},
    "bigbird": {"n_random": 4},
    "longformer-prefill": {"question": 8},
    "bigbird-prefill": {"n_random": 4, "question": 8},
    "nsa": {"window": 8},
}
# Two budgets per policy: tokens and a share of the prompt, or two token counts where the
# policy takes tokens only.
BUDGETS: dict[str, tuple[Any, ...]] = {
    "full": (None,),
    "quant": (None,),
    "recall": (16, 24),
    "longformer": (16, 24),
    "bigbird": (16, 24),
    "longformer-prefill": (16, 24),
    "bigbird-prefill": (24, 32),
}
DEFAULT_BUDGETS = (16, 0.5)
EXTRA = [("snapkv", "kivi4")]  # (policy, kv_format): a storage format over a policy
# How close to the cut (a share of the lane's largest score) a kept position may sit and still
# differ from the record; per storage format, from the measured spread above with margin.
TOLERANCE: dict[str | None, float] = {None: 1e-4, "kivi4": 2e-2}


def cases() -> list[dict[str, Any]]:
    from ctxlab.policy import policy_names

    out = []
    for name in policy_names():
        for budget in BUDGETS.get(name, DEFAULT_BUDGETS):
            out.append({"policy": name, "budget": budget, "kv_format": None})
    for name, fmt in EXTRA:
        for budget in BUDGETS.get(name, DEFAULT_BUDGETS):
            out.append({"policy": name, "budget": budget, "kv_format": fmt})
    return out


def case_id(case: dict[str, Any]) -> str:
    fmt = f"+{case['kv_format']}" if case["kv_format"] else ""
    return f"{case['policy']}{fmt}@{case['budget']}"


def prompts(tokenizer: Any) -> list[list[int]]:
    text = resources.files("ctxlab").joinpath("data/tinyshakespeare.txt").read_text()
    return [
        tokenizer.encode(text[at : at + 2000])[:n]
        for at, n in zip(PROMPT_CHARS, PROMPT_TOKENS, strict=True)
    ]


def ranges(positions: list[int]) -> str:
    """Sorted positions as "0-3,7,9-12" (compact for windows, exact for any set)."""
    parts: list[str] = []
    i = 0
    while i < len(positions):
        j = i
        while j + 1 < len(positions) and positions[j + 1] == positions[j] + 1:
            j += 1
        a, b = positions[i], positions[j]
        parts.append(str(a) if a == b else f"{a}-{b}")
        i = j + 1
    return ",".join(parts)


def kept_positions(seq_kv: Any, n_layers: int, n_kv: int) -> list[str]:
    """Per layer: the kept positions of its lanes ("|" between KV heads when they differ)."""
    out = []
    for layer in range(n_layers):
        lanes = []
        for h in range(n_kv):
            lane = layer * n_kv + h
            n = int(seq_kv.lane_len[lane])
            pos = torch.arange(n) if seq_kv.slot_pos is None else seq_kv.slot_pos[lane, :n]
            lanes.append(ranges(pos.tolist()))
        out.append(lanes[0] if len(set(lanes)) == 1 else "|".join(lanes))
    return out


class NearTies:
    """Within `with NearTies(n_prompts_by_len) as ties:` every policy cut is also recorded:
    for each (prompt, layer, KV head, position), the closest the position came to the cut,
    as a share of its lane's largest score. A kept position's distance is its score less the
    best excluded one; an excluded position's is the worst kept score less its own.
    Positions forced by a sink or window rule never count as near."""

    def __init__(self, prompt_lens: list[int]):
        self.prompt_of = {n: i for i, n in enumerate(prompt_lens)}
        self.closest: dict[tuple[int, int, int, int], float] = {}

    def __enter__(self) -> NearTies:
        from ctxlab.policy.base import ScorerPolicy

        self._select = select = ScorerPolicy.select
        ties = self

        def recording_select(policy: Any, obs: Any, trigger: int = 0) -> Any:
            keep = select(policy, obs, trigger)
            if keep is not None:
                ties.record(policy, obs, keep)
            return keep

        ScorerPolicy.select = recording_select  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from ctxlab.policy.base import ScorerPolicy

        ScorerPolicy.select = self._select  # type: ignore[method-assign]

    def record(self, policy: Any, obs: Any, keep: list[torch.Tensor]) -> None:
        scores = policy.score(obs).float()
        b = policy.lane_budget(obs)
        forced_pos = policy.n_sinks(), obs.seq_len - policy.n_recent(b)
        prompt = self.prompt_of[obs.prompt_len]
        for h, kept in enumerate(keep):
            valid = obs.valid[h]
            pos, s = obs.positions[h][valid], scores[h][valid]
            free = (pos >= forced_pos[0]) & (pos < forced_pos[1])
            if not bool(free.any()):
                continue
            is_kept = torch.isin(pos, kept)
            scale = float(s[free].abs().max().clamp(min=1e-30))
            kept_free, out_free = s[free & is_kept], s[free & ~is_kept]
            worst_kept = float(kept_free.min()) if kept_free.numel() else float("inf")
            best_out = float(out_free.max()) if out_free.numel() else float("-inf")
            for p, sp, k, f in zip(
                pos.tolist(), s.tolist(), is_kept.tolist(), free.tolist(), strict=True
            ):
                if not f:
                    continue
                gap = (sp - best_out) if k else (worst_kept - sp)
                key = (prompt, obs.layer, h, p)
                self.closest[key] = min(self.closest.get(key, float("inf")), gap / scale)

    def near(self, prompt: int, layer: int, head: int, position: int, tol: float) -> bool:
        """Whether this run ever had `position` within `tol` of its lane's cut."""
        return self.closest.get((prompt, layer, head, position), float("inf")) <= tol


def parse_ranges(text: str) -> set[int]:
    """The inverse of `ranges`."""
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def unexplained_differences(
    got: str, want: str, n_kv: int, near: Callable[[int, int], bool]
) -> list[str]:
    """Positions kept in one of `got` / `want` (one layer, "|" between heads) and not in the
    other that `near(head, position)` does not explain as a near tie."""
    heads_got = got.split("|") if "|" in got else [got] * n_kv
    heads_want = want.split("|") if "|" in want else [want] * n_kv
    out = []
    for h, (g, w) in enumerate(zip(heads_got, heads_want, strict=True)):
        for p in sorted(parse_ranges(g) ^ parse_ranges(w)):
            if not near(h, p):
                out.append(f"head {h} position {p}")
    return out


def engine_for(loaded: Any, case: dict[str, Any]) -> Any:
    """The engine a case runs on: its policy, 4-token blocks, a small pool."""
    from ctxlab.engine import LLM
    from ctxlab.policy import make_policy

    name, budget = case["policy"], case["budget"]
    policy = make_policy(name, budget, **PARAMS.get(name, {}))
    return LLM(
        loaded,
        kv_pool_tokens=1024,
        block_size=BLOCK,
        max_num_batched_tokens=512,
        policy=policy,
        kv_format=case["kv_format"],
    )


def generate_recording(llm: Any, ids: list[list[int]]) -> list[dict[str, Any]]:
    """Greedy outputs of `ids` (batched), each with the positions its lanes kept at the end."""
    from ctxlab.engine import SamplingParams

    eng = llm.engine
    cfg = llm.loaded.config
    kept: dict[int, list[str]] = {}
    finish = eng.scheduler.finish

    def recording_finish(seq: Any, reason: str, *rest: Any) -> None:
        kept[seq.seq_id] = kept_positions(seq.kv, cfg.num_layers, cfg.num_kv_heads)
        finish(seq, reason, *rest)

    eng.scheduler.finish = recording_finish  # type: ignore[method-assign]
    try:
        outs = llm.generate(ids, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    finally:
        eng.scheduler.finish = finish  # type: ignore[method-assign]
    return [
        {
            "text": o.text,
            "token_ids": o.token_ids,
            "resident_kv_bytes": o.metrics.resident_kv_bytes,
            "kept_positions": kept[o.request_id],
            "reused_tokens": o.metrics.reused_tokens,
        }
        for o in outs
    ]


def run_case(loaded: Any, case: dict[str, Any], ids: list[list[int]]) -> list[dict[str, Any]]:
    outs = generate_recording(engine_for(loaded, case), ids)
    for o in outs:
        del o["reused_tokens"]  # not part of the record (every prompt is fresh here)
    return outs


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ap = argparse.ArgumentParser(description="Write the golden record of every policy.")
    ap.add_argument("--only", help="comma-separated policy names: record only their entries")
    args = ap.parse_args()
    from ctxlab.model import load_model

    torch.set_num_threads(1)  # tiny steps: more threads only wait on each other
    loaded = load_model(dtype="float32")
    ids = prompts(loaded.tokenizer)
    doc = {"prompt_tokens": [len(p) for p in ids], "cases": {}}
    only = set(args.only.split(",")) if args.only else None
    if only is not None:
        doc = json.loads(GOLDEN.read_text())  # every other entry stays as recorded
    for case in cases():
        if only is not None and case["policy"] not in only:
            continue
        doc["cases"][case_id(case)] = run_case(loaded, case, ids)
        print(case_id(case), file=sys.stderr, flush=True)
    GOLDEN.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size:,} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
