"""A prefix hit under any registered policy gives what a cold run gives (default model).

Full blocks enter the prefix cache as they are computed, before a retention policy cuts
them, so a request that repeats a prompt reuses the whole prompt's state and makes its own
cut. A policy that reads the prompt's last W queries at the prompt end (SnapKV's observation
window, H2O's seed, TOVA's last query) gets at least those W tokens computed, so its cut
sees the same queries as a cold run: the greedy tokens, the kept positions and the
resident bytes must all be the cold run's, and the reused tokens exactly the full blocks
before the last W tokens.

A quantized pool (a storage format, or `quant` alone) is the exception to "as cold": a cold
prefill attends to its own chunk at full precision, a warm one attends to the reused blocks
as stored (quantized), exactly as a later prefill chunk would. There only the reuse is
checked.
"""

from __future__ import annotations

import pytest
from golden_policies import BLOCK, case_id, cases, engine_for, generate_recording, prompts

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]


def first_budget_cases() -> list[dict]:
    seen: set[tuple[str, str | None]] = set()
    out = []
    for case in cases():
        key = (case["policy"], case["kv_format"])
        if key not in seen:
            seen.add(key)
            out.append(case)
    return out


@pytest.mark.parametrize("case", first_budget_cases(), ids=case_id)
def test_a_repeated_prompt_reuses_its_prefix_and_runs_as_cold(loaded, case):
    prompt = prompts(loaded.tokenizer)[2]  # 64 tokens
    llm = engine_for(loaded, case)
    cold = generate_recording(llm, [prompt])[0]
    warm = generate_recording(llm, [prompt])[0]
    tail = max(1, llm.engine.runtime.obs_window)
    assert cold["reused_tokens"] == 0
    assert warm["reused_tokens"] == (len(prompt) - tail) // BLOCK * BLOCK > 0
    if case["kv_format"] or case["policy"] == "quant":
        return  # the reused state is the quantized one (see the module docstring)
    assert warm["token_ids"] == cold["token_ids"]
    assert warm["kept_positions"] == cold["kept_positions"]
    assert warm["resident_kv_bytes"] == cold["resident_kv_bytes"]
