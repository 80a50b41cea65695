"""`ctxlab generate --weights` loads the model in that format (its stored bytes say so)."""

from __future__ import annotations

import json


def test_generate_with_int8_weights_runs_the_packed_model(cli):
    r = cli("generate", "The capital of France is", "--max-tokens", "4", "--weights", "int8",
            "--json")  # fmt: skip
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["weights"] == "int8"
    assert len(doc["token_ids"]) == 4
    # fp32 holds 513 MiB; int8 about 160 MiB (codes, scales, the Q8_0 table, the rotation)
    assert doc["weight_bytes"] < 200 * 2**20


def test_generate_with_fp32_onednn_weights_runs_the_prepacked_model(cli):
    r = cli("generate", "The capital of France is", "--max-tokens", "4", "--weights",
            "fp32-onednn", "--json")  # fmt: skip
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["weights"] == "fp32-onednn"
    assert len(doc["token_ids"]) == 4
