"""Policies inside the paged engine, on the engine's tiny float64 toy model.

- `full` gives exactly the engine's own greedy output;
- positional policies (window, streaming in both position modes, Longformer) give exactly
  the output of an independent dense reference that applies the same keep rule after every
  forward (so chunked prefill is covered too);
- every eviction policy, at batch > 1 with different prompt lengths, chunked prefill and
  prefix caching, keeps the resident KV bytes measured from the pool within the budget plus
  one partial block per lane at every step, leaves shared prefix blocks untouched, and
  returns every block at the end.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from engine_toy_model import CFG, ToyModel, one_torch_thread, rope  # noqa: F401  (fixture)
from policy_cases import build, evicting_names

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.engine.observe import lane_keys
from ctxlab.engine.policy_runtime import NullRuntime
from ctxlab.policy import LayerObs, make_policy

MODEL = ToyModel(with_rope=True)
BS = 4
N_OUT = 10


def prompts(n: int, seed: int = 0, lo: int = 40, hi: int = 110) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(CFG.vocab_size) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def engine(**kw) -> LLMEngine:
    args = dict(kv_pool_tokens=2048, block_size=BS, max_num_batched_tokens=512, max_num_seqs=8)
    args.update(kw)
    return LLMEngine(MODEL, CFG, **args)


def run(eng: LLMEngine, ps: list[list[int]], n: int = N_OUT) -> list[list[int]]:
    rids = [eng.add_request(p, SamplingParams(max_tokens=n)) for p in ps]
    return [o.token_ids for o in eng.run_all(rids)]


def test_full_policy_is_exactly_the_engine():
    ps = prompts(4)
    base = run(engine(max_num_batched_tokens=37), ps)
    eng = engine(max_num_batched_tokens=37, policy="full")
    assert type(eng.runtime) is NullRuntime
    assert run(eng, ps) == base


# -- an independent dense reference for positional keep rules ------------------------------
class KeepRef:
    """One sequence, dense K/V per layer, a keep rule applied after every prompt chunk and,
    during decode, whenever more than `budget + slack` tokens are held (slack 0: after every
    token, the papers' schedule; the engine's default is one block less one token)."""

    def __init__(self, keep, cache_slot: bool, budget: int, slack: int):
        self.keep = keep  # (original positions [L], next position) -> kept indices
        self.cache_slot = cache_slot
        self.budget = budget
        self.slack = slack
        self.k: list[torch.Tensor | None] = [None] * CFG.num_layers
        self.v: list[torch.Tensor | None] = [None] * CFG.num_layers
        self.pos = torch.empty(0, dtype=torch.int64)  # original positions held

    def attend(self, layer, q, k, v):
        prev = 0 if self.k[layer] is None else self.k[layer].shape[0]
        kk = k if self.k[layer] is None else torch.cat((self.k[layer], k))
        vv = v if self.v[layer] is None else torch.cat((self.v[layer], v))
        self.k[layer], self.v[layer] = kk, vv
        t, L = q.shape[0], kk.shape[0]
        mask = torch.arange(L)[None, :] <= prev + torch.arange(t)[:, None]
        g = q.shape[1] // k.shape[1]
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            kk.repeat_interleave(g, 1).transpose(0, 1),
            vv.repeat_interleave(g, 1).transpose(0, 1),
            attn_mask=mask,
        )
        return o.transpose(0, 1)

    @torch.inference_mode()
    def feed(self, ids: list[int], start: int, decode: bool = False) -> torch.Tensor:
        n_held = self.pos.numel()
        positions = torch.arange(n_held, n_held + len(ids)) if self.cache_slot else None
        if positions is None:
            positions = torch.arange(start, start + len(ids))
        h = MODEL.forward(torch.tensor(ids), positions, self)
        self.pos = torch.cat((self.pos, torch.arange(start, start + len(ids))))
        if decode and self.pos.numel() <= self.budget + self.slack:
            return h
        idx = self.keep(self.pos, start + len(ids))
        for layer in range(CFG.num_layers):
            k = self.k[layer][idx]
            if self.cache_slot:
                k = rope(k, torch.arange(len(idx)) - idx)
            self.k[layer], self.v[layer] = k, self.v[layer][idx]
        self.pos = self.pos[idx]
        return h


@torch.inference_mode()
def ref_generate(prompt, n, chunk, keep, budget, slack, cache_slot=False):
    ref = KeepRef(keep, cache_slot, budget, slack)
    out = []
    start = 0
    while start < len(prompt):
        h = ref.feed(prompt[start : start + chunk], start)
        start += len(prompt[start : start + chunk])
    for _ in range(n):
        tok = int(MODEL.compute_logits(h[-1:]).argmax(-1))
        out.append(tok)
        h = ref.feed([tok], start, decode=True)
        start += 1
    return out


def sinks_and_recent(n_sinks, n_recent):
    def keep(pos, seq_len):
        return torch.nonzero((pos < n_sinks) | (pos >= seq_len - n_recent)).flatten()

    return keep


@pytest.mark.parametrize("slack", [None, 0], ids=["per-block", "per-token"])
@pytest.mark.parametrize(
    ("name", "params", "keep", "cache_slot"),
    [
        ("window", {"budget": 24}, sinks_and_recent(0, 24), False),
        ("streaming", {"budget": 24}, sinks_and_recent(4, 20), True),
        (
            "streaming",
            {"budget": 24, "position_mode": "original"},
            sinks_and_recent(4, 20),
            False,
        ),
        ("longformer", {"local": 16, "n_global": 2}, sinks_and_recent(2, 16), False),
    ],
    ids=["window", "streaming-slot", "streaming-orig", "longformer"],
)
def test_positional_policies_match_dense_reference(name, params, keep, cache_slot, slack):
    chunk = 13
    policy = make_policy(name, slack=slack, **params)
    budget, trigger = policy.budget.tokens, BS - 1 if slack is None else slack
    for p in prompts(3, seed=5):
        eng = engine(max_num_batched_tokens=chunk, policy=policy)
        got = run(eng, [p])[0]
        assert got == ref_generate(p, N_OUT, chunk, keep, budget, trigger, cache_slot)


def test_streaming_cache_slot_runs_past_the_trained_length():
    eng = engine(max_num_batched_tokens=64, policy="streaming", budget=32, kv_pool_tokens=256)
    assert eng.runtime.unbounded_positions
    rid = eng.add_request(prompts(1, lo=700, hi=700)[0], SamplingParams(max_tokens=8))
    bpb = eng.kv.layout.bytes_per_block
    while eng.has_unfinished():
        eng.step()
        s = eng.seqs[rid]
        if not s.finished:
            assert eng.kv.resident_bytes(s.kv) <= eng.kv.n_lanes * (32 // BS + 1) * bpb
    out = eng.output(rid)
    assert len(out.token_ids) == 8 and CFG.max_position < 700


# -- budgets, batches, chunks and prefix sharing for every eviction policy -----------------
@pytest.mark.parametrize("name", evicting_names())
def test_resident_bytes_follow_the_budget_at_batch_with_chunks_and_prefix_cache(name):
    """Every registered policy that evicts, at 32 tokens (or the least it accepts)."""
    policy = build(name, 32)
    eng = engine(max_num_batched_tokens=29, policy=policy)
    lay = eng.kv.layout
    shared = prompts(1, seed=9, lo=48, hi=48)[0]
    ps = [shared + p for p in prompts(3, seed=3, lo=5, hi=60)] + prompts(2, seed=4)
    ps += prompts(1, seed=8, lo=150, hi=160)  # over bigbird-prefill's least budget (128)
    # The first request fills the prefix cache; snapshot its shared blocks.
    run(eng, [[*shared, 1, 2, 3]], n=2)
    alloc = eng.kv.alloc
    cached = {h: (g, eng.kv.pool.data[:, list(g)].clone()) for h, g in alloc.cached.items()}
    assert cached
    checked = 0
    rids = [eng.add_request(p, SamplingParams(max_tokens=N_OUT)) for p in ps]
    rt = eng.runtime
    grows = not policy.wants_decode_hook(1)  # cut once at the prompt's end, then lanes grow
    while eng.has_unfinished():
        eng.step()
        alloc.check_invariants()
        for h, (g, before) in cached.items():
            if alloc.cached.get(h) == g:  # still the same cached block (not reused)
                assert torch.equal(eng.kv.pool.data[:, list(g)], before), "shared blocks change"
                checked += 1
        for rid in rids:
            s = eng.seqs[rid]
            st = rt.states.get(rid)
            if s.finished or st is None or not st.prefilled:
                continue
            bound = 0  # per layer: its lanes' budget plus one partial block each
            for layer in range(lay.n_layers):
                obs = LayerObs(layer, lay.n_layers, CFG.num_heads, torch.empty(2, 0), 0, 1)
                obs.prompt_len = st.prompt_len
                b = policy.lane_budget(obs)
                bound += lay.n_kv_heads * (-(-b // BS) + 1 + (-(-st.step // BS) if grows else 0))
            assert eng.kv.resident_bytes(s.kv) <= bound * lay.bytes_per_block
    outs = [eng.output(r) for r in rids]
    assert all(len(o.token_ids) == N_OUT for o in outs)
    if policy.prefill_key(1) is None:
        assert eng.stats().prefix_cache_hits > 0, "the shared prefix was reused"
    # else: a prefill mask's question rows depend on where each prompt ends, so its blocks
    # are shared only between prompts of one length (test_prefill_masks.py checks that)
    assert eng.stats().blocks_used == 0, "every block came back"
    assert checked > 0
    assert rt.compactions > 0


def test_quest_reads_fewer_blocks_and_keeps_everything():
    ps = prompts(3, lo=90, hi=110)
    base = run(engine(), ps)
    eng = engine(policy="quest", budget=16)
    got = run(eng, ps)
    assert 0 < eng.runtime.pages.read_fraction < 0.3
    assert eng.runtime.compactions == 0
    assert all(len(g) == N_OUT for g in got)
    # With a budget covering the whole context, Quest reads everything: exact output.
    eng = engine(policy="quest", budget=512)
    assert run(eng, ps) == base and eng.runtime.pages.read_fraction == 1.0


def test_quest_ratio_budget_reads_a_share_of_each_prompt():
    """--budget 0.25 for Quest: each sequence's lanes read a quarter of its own prompt per
    decode step (in pages of one block, at least the sink page and the current one)."""
    short, long_ = prompts(1, seed=5, lo=40, hi=40)[0], prompts(1, seed=6, lo=160, hi=160)[0]
    eng = engine(policy="quest", budget=0.25)
    rids = [eng.add_request(p, SamplingParams(max_tokens=6)) for p in (short, long_)]
    pages = eng.runtime.pages
    seen = []
    while eng.has_unfinished():
        eng.step()
        seen.append(pages.per_row.tolist())
    eng.run_all(rids)
    assert [40 // 4 // BS, 160 // 4 // BS] in seen  # 2 and 10 pages of 4 tokens
    assert 0 < pages.read_fraction < 0.6
    assert make_policy("quest", budget=0.25).pages_per_step(4000, 16) == 62  # 1,000 tokens / 16


def test_h2o_scores_from_the_attention_match_the_per_layer_definition():
    """H2O's decode scores, taken from the batched attention itself (two sequences decoding
    together), equal the slow per-layer definition: this step's softmax of the current
    query over the lane's keys, summed over the query heads of each KV head."""
    from ctxlab.policy import attention_probs, group_reduce

    # slack 8: no cut between the two snapshots, so slots do not move under the check.
    eng = engine(policy=make_policy("h2o", 24, slack=8), max_num_batched_tokens=16)
    rids = [
        eng.add_request(p, SamplingParams(max_tokens=50)) for p in prompts(2, seed=2, lo=40, hi=70)
    ]
    drv = eng.runtime
    assert drv.scores_in_attention
    checked = 0
    for _ in range(60):
        sts = [drv.states.get(r) for r in rids]
        if not all(st is not None and st.prefilled for st in sts):
            eng.step()
            continue
        before = {r: (drv.states[r].acc.clone(), eng.seqs[r].kv.lane_len.clone()) for r in rids}
        eng.step()
        for rid in rids:
            seq, st = eng.seqs[rid], drv.states[rid]
            acc0, len0 = before[rid]
            if not torch.equal(seq.kv.lane_len, len0 + 1):
                continue  # this step cut the lanes: slots moved
            assert not seq.kv.lockstep
            q, q_pos = st.log.ordered()
            for layer in range(CFG.num_layers):
                pos = eng.kv.lane_positions(seq.kv, eng.kv.layout.lanes_of_layer(layer))
                keys = lane_keys(eng.kv, seq.kv, layer, pos.shape[1])
                p = attention_probs(q[layer][:, -1:], keys, pos, q_pos[-1:])[:, 0]
                want = group_reduce(p, CFG.num_kv_heads, "sum")
                lanes = eng.kv.layout.lanes_of_layer(layer)
                n = pos.shape[1]
                got = st.acc[lanes, :n] - acc0[lanes, :n]
                torch.testing.assert_close(got, want)
            checked += 1
        if checked >= 4:
            break
    assert checked >= 4


def test_recall_of_every_far_block_gives_back_full_attention():
    """With room to bring back every evicted block, decode attends to every token again."""
    ps = prompts(2, seed=11, lo=120, hi=140)
    base = run(engine(), ps)
    pol = make_policy("recall", budget=170, recall_blocks=40, block=4, base="h2o")
    eng = engine(policy=pol)
    assert run(eng, ps) == base
    tier = eng.runtime.far.tier
    assert tier.bytes_out > 0 and tier.hits > 0 and tier.recalls > 0
    assert tier.bytes_in <= tier.bytes_out, "each far block is moved back once, then kept"


def test_recall_keeps_the_resident_budget():
    pol = make_policy("recall", budget=32, recall_blocks=2, block=4, base="h2o", every=2)
    eng = engine(policy=pol, max_num_batched_tokens=40)
    rids = [eng.add_request(p, SamplingParams(max_tokens=N_OUT)) for p in prompts(3, seed=12)]
    lay = eng.kv.layout
    own = lay.n_lanes * (-(-24 // BS) + 1) * lay.bytes_per_block
    while eng.has_unfinished():
        eng.step()
        for rid in rids:
            s, st = eng.seqs[rid], eng.runtime.states.get(rid)
            if not s.finished and st is not None and st.prefilled:
                assert eng.kv.resident_bytes(s.kv) <= own
        assert eng.runtime.far.scratch_bytes() <= 3 * lay.n_lanes * 8 * (8 + 8) * 8
    tier = eng.runtime.far.tier
    assert tier.recalls > 0 and tier.bytes_in > 0
    assert not tier.lanes, "finished sequences leave nothing in the far tier"


@pytest.mark.parametrize("name", ["snapkv", "recall"])
def test_preemption_by_recompute_with_a_policy(name):
    """SnapKV lanes grow during decode: a small pool forces preemption, recompute, finish."""
    if name == "recall":
        pol = make_policy("recall", 48, recall_blocks=2, block=4, base="snapkv")
    else:
        pol = make_policy("snapkv", 40, obs_window=8)
    eng = engine(policy=pol, kv_pool_tokens=192, max_num_batched_tokens=64)
    ps = prompts(4, seed=21, lo=50, hi=90)
    rids = [eng.add_request(p, SamplingParams(max_tokens=60)) for p in ps]
    while eng.has_unfinished():
        eng.step()
        eng.kv.alloc.check_invariants()
    assert eng.scheduler.num_preemptions > 0
    assert all(len(eng.output(r).token_ids) == 60 for r in rids)
    assert eng.stats().blocks_used == 0 and not eng.runtime.states


def test_pyramidkv_reads_each_layer_at_its_own_width_with_the_same_output():
    """Per-layer budgets: each layer's decode gathers only its own lanes' blocks, and the
    tokens are those of the engine's own attention over the full-width (masked) table."""
    ps = prompts(3, seed=8, lo=60, hi=100)

    def pyramid():
        return engine(policy=make_policy("pyramidkv", 32, obs_window=8, rerun_every=4))

    eng = pyramid()
    got = run(eng, ps)
    assert eng.runtime.uneven_layers
    ref = pyramid()
    rids = [ref.add_request(p, SamplingParams(max_tokens=N_OUT)) for p in ps]
    while ref.has_unfinished():
        ref.runtime.uneven_layers = False  # the engine's own decode path
        ref.step()
    assert [ref.output(r).token_ids for r in rids] == got
