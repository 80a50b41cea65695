"""Issue 33's planner items: generated tokens count in the capacity, a multimodal config's
vision tower is counted in the weights (or said to be left out), and the GPU count is one
an engine accepts as a tensor-parallel size (tests/plan/test_plan_defaults.py)."""

from __future__ import annotations

import json
from pathlib import Path

from ctxlab.arch import from_hf_config, get_preset
from ctxlab.plan.report import build_plan

FIXTURES = Path(__file__).parents[1] / "arch" / "fixtures"
KIB = 1024


def test_generated_tokens_are_held_by_a_request_and_counted():
    per_token = 128 * KIB  # llama-3.1-8b: 32 layers x 8 heads x 128 x 2 x 2 bytes
    plan = build_plan("llama-3.1-8b", [4096], output_tokens=1024)
    row = plan["per_context"][0]
    assert row["tokens_per_request"] == 5120
    assert row["kv_bytes_per_request_all_gpus"] == 5120 * per_token
    assert "5,120 tokens (4,096 context + 1,024 generated)" in row["capacity_sentence"]
    budget = plan["sections"]["capacity"]["summary"]["kv_budget_bytes"]
    assert row["max_concurrent_requests"] == budget // (5120 * per_token)
    bare = build_plan("llama-3.1-8b", [4096], output_tokens=0)["per_context"][0]
    assert bare["kv_bytes_per_request_all_gpus"] == 4096 * per_token
    assert "generated" not in bare["capacity_sentence"]


def test_a_multimodal_config_counts_its_vision_tower():
    spec = from_hf_config(FIXTURES / "gemma-3-27b.json")
    text = get_preset("gemma-3-27b").params
    # SigLIP so400m (27 layers of 1152, MLP 4304, 896 px in 14 px patches) and a
    # 1152 x 5376 projector: about 0.42B, the gap between "27B" and Gemma's "27.4B"
    assert 0.40e9 < spec.params - text < 0.44e9
    assert spec.active_params == text
    assert any(n.startswith("vision tower counted in the weights") for n in spec.notes)
    notes = build_plan(spec, [4096])["notes"]
    assert any(n.startswith("Vision tower: its weights are counted") for n in notes)
    assert not any(n.startswith("Mixture of experts") for n in notes)


def test_a_vision_tower_without_its_sizes_is_said_to_be_left_out():
    cfg = json.loads((FIXTURES / "gemma-3-27b.json").read_text())
    del cfg["vision_config"]["intermediate_size"]
    spec = from_hf_config(cfg)
    assert spec.params == get_preset("gemma-3-27b").params
    assert any("left out of the parameter count" in n for n in spec.notes)


def test_experts_still_get_the_mixture_of_experts_note():
    notes = build_plan("mixtral-8x7b", [4096], gpus=None)["notes"]
    assert any(n.startswith("Mixture of experts") for n in notes)
