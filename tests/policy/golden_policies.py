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

`tests/policy/test_golden.py` reruns every case and requires the file to match exactly.
The file was written from the engine before the policy runtime moved into `ctxlab/engine`;
it is regenerated only when a policy's behaviour is meant to change.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
}
# Two budgets per policy: tokens and a share of the prompt, or two token counts where the
# policy takes tokens only.
BUDGETS: dict[str, tuple[Any, ...]] = {
    "full": (None,),
    "quant": (None,),
    "recall": (16, 24),
    "longformer": (16, 24),
    "bigbird": (16, 24),
}
DEFAULT_BUDGETS = (16, 0.5)
EXTRA = [("snapkv", "kivi4")]  # (policy, kv_format): a storage format over a policy


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

    def recording_finish(seq: Any, reason: str) -> None:
        kept[seq.seq_id] = kept_positions(seq.kv, cfg.num_layers, cfg.num_kv_heads)
        finish(seq, reason)

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
