"""Every registered policy still does exactly what the golden record says (default model).

`golden_policies.py` holds the cases and rewrites the record; this test reruns them and
compares greedy text and ids, resident KV bytes and kept positions exactly. A policy that
is registered but absent from the record fails here, so a new policy gets a golden entry.
"""

from __future__ import annotations

import json

import pytest
import torch
from golden_policies import GOLDEN, case_id, cases, prompts, run_case

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny steps: on a shared CPU more threads only wait
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def ids(loaded, golden) -> list[list[int]]:
    got = prompts(loaded.tokenizer)
    assert [len(p) for p in got] == golden["prompt_tokens"]
    return got


def test_every_registered_policy_has_a_golden_entry(golden):
    from ctxlab.policy import policy_names

    recorded = {key.split("@")[0].split("+")[0] for key in golden["cases"]}
    assert set(policy_names()) <= recorded


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_policy_matches_the_golden_record(loaded, golden, ids, case):
    want = golden["cases"][case_id(case)]
    got = run_case(loaded, case, ids)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g["token_ids"] == w["token_ids"], f"prompt {i}: greedy tokens differ"
        assert g["text"] == w["text"]
        assert g["resident_kv_bytes"] == w["resident_kv_bytes"], f"prompt {i}: resident bytes"
        for layer, (a, b) in enumerate(zip(g["kept_positions"], w["kept_positions"], strict=True)):
            assert a == b, f"prompt {i}, layer {layer}: kept positions differ"
