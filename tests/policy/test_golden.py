"""Every registered policy still does exactly what the golden record says (default model).

`golden_policies.py` holds the cases and rewrites the record; this test reruns them and
compares greedy text and ids and resident KV bytes exactly, and kept positions exactly but
for near ties: a position kept in one and not the other must have been within the case's
stated tolerance of a cut in this run's own scores (see `NearTies`: float sums differ per
instruction set, so near ties are allowed to flip; nothing else is). `make test` reruns
this file under a second instruction set (tests/second_isa.py). A policy that is
registered but absent from the record fails here, so a new policy gets a golden entry.
"""

from __future__ import annotations

import json

import pytest
import torch
from golden_policies import (
    GOLDEN,
    TOLERANCE,
    NearTies,
    case_id,
    cases,
    prompts,
    run_case,
    unexplained_differences,
)

pytestmark = [pytest.mark.model, pytest.mark.isa]


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
    tol = TOLERANCE[case["kv_format"]]
    with NearTies([len(p) for p in ids]) as ties:
        got = run_case(loaded, case, ids)
    n_kv = loaded.config.num_kv_heads
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g["token_ids"] == w["token_ids"], f"prompt {i}: greedy tokens differ"
        assert g["text"] == w["text"]
        assert g["resident_kv_bytes"] == w["resident_kv_bytes"], f"prompt {i}: resident bytes"
        for layer, (a, b) in enumerate(zip(g["kept_positions"], w["kept_positions"], strict=True)):
            if a == b:
                continue
            far = unexplained_differences(
                a, b, n_kv, lambda h, p, i=i, layer=layer: ties.near(i, layer, h, p, tol)
            )
            assert not far, (
                f"prompt {i}, layer {layer}: kept positions differ beyond near ties "
                f"(tolerance {tol:g} of the lane's largest score): {', '.join(far)}\n"
                f"- {b}\n+ {a}"
            )
