"""Every registered policy on a model with a sliding-window layer (toy model, layer 0 keeps
a window of 5, layer 1 is global, pages of 4).

Each policy either runs, acting on the global layer only (a sliding lane stays within its
window bound and keeps lane index = position, an evicting policy really cuts the global
lanes, every block comes back), or is refused with one CtxlabError sentence when the
engine is built (the CLI gives the same sentence from the GGUF header, before the model
loads: tests/policy/test_policies_cli.py).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from engine_toy_model import CFG, ToyModel, one_torch_thread  # noqa: F401  (fixture)
from policy_cases import build

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.errors import CtxlabError
from ctxlab.policy import policy_names
from ctxlab.policy.windowed import acts_on, windowed_refusal

WINDOW = 5
WCFG = SimpleNamespace(**{**vars(CFG), "sliding_windows": (WINDOW, None)})
MODEL = ToyModel(seed=2, with_rope=True)
SLIDING, GLOBAL = [0, 1], [2, 3]
rng = random.Random(4)
PROMPTS = [[rng.randrange(CFG.vocab_size) for _ in range(n)] for n in (30, 45, 60)]


def engine(policy) -> LLMEngine:
    return LLMEngine(
        MODEL,
        WCFG,
        kv_pool_tokens=1024,
        block_size=4,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        policy=policy,
    )


@pytest.mark.parametrize("name", policy_names())
def test_each_policy_runs_on_the_global_layers_or_is_refused(name):
    policy = build(name, 12, small=True)
    refusal = windowed_refusal(name, policy.position_mode)
    if refusal is not None:
        with pytest.raises(CtxlabError, match="sliding-window layers") as err:
            engine(policy)
        assert str(err.value) == refusal and "\n" not in refusal
        assert acts_on(name).startswith("refused")
        return
    eng = engine(policy)
    bound = eng.kv.layout.window_blocks(WINDOW)
    rids = [eng.add_request(p, SamplingParams(max_tokens=12)) for p in PROMPTS]
    seqs = [eng.seqs[r] for r in rids]
    while eng.has_unfinished():
        eng.step()
        for s in seqs:
            if s.finished or not s.num_computed:
                continue
            kv = s.kv
            assert int(kv.held[SLIDING].max()) <= bound
            # a sliding lane is never cut: it still holds every position up to the last
            assert kv.lane_len[SLIDING].tolist() == [s.num_computed] * len(SLIDING)
    outs = eng.run_all(rids)
    assert [len(o.token_ids) for o in outs] == [12] * len(PROMPTS)
    assert eng.stats().blocks_used == 0
    if policy.evicts:
        assert eng.runtime.compactions > 0  # it did cut, on the global layer
        assert "global" in acts_on(name)


@pytest.mark.parametrize("name", ["h2o", "tova", "pyramidkv"])
def test_a_policy_that_keeps_everything_gives_the_windowed_oracle(name):
    """With a budget no prompt reaches nothing is cut, but the policy still shapes every
    decode read (H2O's probabilities, TOVA's query log, PyramidKV's per-layer widths): the
    sliding layer's window must hold on that path too."""
    from test_engine_windows import MODEL as WMODEL
    from test_engine_windows import WCFG as WIN_CFG
    from test_engine_windows import oracle

    eng = LLMEngine(
        WMODEL, WIN_CFG, kv_pool_tokens=1024, block_size=4, max_num_batched_tokens=16,
        policy=build(name, 256),
    )  # fmt: skip
    rids = [eng.add_request(p, SamplingParams(max_tokens=8)) for p in PROMPTS]
    assert [o.token_ids for o in eng.run_all(rids)] == [oracle(p, 8) for p in PROMPTS]


@pytest.mark.parametrize("name", ["quest", "streaming"])
def test_the_cli_refuses_before_the_model_loads(name, monkeypatch, capsys):
    """On the real Gemma 3 file the refusal comes from the GGUF header: the model is never
    loaded (its loader would fail this test)."""
    import ctxlab.model
    from ctxlab.cli import main

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded before the policy was refused")

    monkeypatch.setattr(ctxlab.model, "load_model", no_load)
    monkeypatch.setattr(sys, "argv", ["ctxlab", "generate", "--model", "gemma3-270m"])
    sys.argv += ["--policy", name, "hi"]
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {windowed_refusal(name)}"


def test_policies_json_says_where_each_acts_with_sliding_layers():
    from ctxlab.policy.registry import describe_policies

    rows = {r["name"]: r["with_sliding_layers"] for r in describe_policies()}
    assert rows["snapkv"].startswith("full-attention (global) layers only")
    assert rows["quest"].startswith("refused") and rows["quant"].startswith("every layer")
