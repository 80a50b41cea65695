"""Read-time selectors (every registered policy that picks pages: Quest, MoBA, DSA, NSA).

Pure decisions on synthetic tensors (what each rule picks, ties by index, keys read within
the budget), the extra-row attention they rely on (single tokens and mean-pooled rows with
a log-count bias), and, over the registry, each selector in the paged engine on its toy
float64 model: a budget covering the context gives the engine's own tokens, a small one
reads at most `budget` keys per lane per step, keeps every block and evicts nothing.
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from engine_toy_model import CFG, ToyModel, one_torch_thread  # noqa: F401  (fixture)

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.engine.decode_attention import attend
from ctxlab.engine.page_reads import PageReads
from ctxlab.errors import CtxlabError
from ctxlab.policy import make_policy, policy_names
from ctxlab.policy.dsa import DSAPolicy
from ctxlab.policy.observation import PageChoice, PageObs
from ctxlab.policy.ranking import top_indices, top_mask

SELECTORS = [n for n in policy_names() if "pages" in make_policy(n).needs]
MODEL = ToyModel(with_rope=True)
BS = 4
PARAMS = {"nsa": {"window": 4}}


def obs_for(keys: torch.Tensor, q: torch.Tensor, page: int, n_pages: int, policy) -> PageObs:
    """One sequence's `PageObs` (batch 1) from lanes `keys [n_kv, L, d]`, `q [H, d]`."""
    n_kv, L, d = keys.shape
    nb = -(-L // page)
    pad = torch.nn.functional.pad(keys, (0, 0, 0, nb * page - L)).view(n_kv, nb, page, d)
    cnt = torch.full((n_kv, nb), float(page))
    cnt[:, -1] = L - (nb - 1) * page
    obs = PageObs(
        q.float().view(1, n_kv, -1, d),
        pad.amin(2)[None],
        pad.amax(2)[None],
        torch.full((1, n_kv), nb),
        torch.tensor([n_pages]),
        page=page,
        kmean=(pad.sum(2) / cnt[..., None])[None],
        lens=torch.full((1, n_kv), L),
    )
    if isinstance(policy, DSAPolicy):
        obs.ikeys = policy.index_keys(torch.nn.functional.pad(keys, (0, 0, 0, nb * page - L)))[None]
    return obs


def keys_read(choice: PageChoice, page: int, L: int) -> torch.Tensor:
    """Keys each lane of row 0 reads: its full pages' real slots, single tokens, mean rows."""
    slots = choice.pages[0][..., None] * page + torch.arange(page)
    n = ((slots < L) & choice.ok[0][..., None]).sum((-1, -2))
    if choice.tokens_ok is not None:
        n = n + choice.tokens_ok[0].sum(-1)
    if choice.compressed is not None:
        n = n + choice.compressed[0].sum(-1)
    return n


def planted(seed: int = 0, n_kv: int = 2, L: int = 160, d: int = 16, at: int = 83):
    torch.manual_seed(seed)
    keys = torch.randn(n_kv, L, d) * 0.1
    q = torch.zeros(n_kv * 2, d)
    q[:, 0] = 1.0
    keys[:, at, 0] = 8.0  # one token (in page at // page) that matches the query
    return keys, q


@pytest.mark.parametrize("name", SELECTORS)
def test_each_selector_reads_the_planted_key_sinks_and_current_page(name):
    page, budget = 16, 64
    keys, q = planted()
    pol = make_policy(name, budget, **PARAMS.get(name, {}))
    choice = pol.choose_pages(obs_for(keys, q, page, budget // page, pol))
    nb = 160 // page
    for h in range(2):
        pages = set(choice.pages[0, h][choice.ok[0, h]].tolist())
        assert {0, nb - 1} <= pages, "the sink page and the current page are always read"
        toks = set()
        if choice.tokens is not None:
            toks = set(choice.tokens[0, h][choice.tokens_ok[0, h]].tolist())
        assert 83 // page in pages or 83 in toks, f"{name} missed the planted key"
    assert int(keys_read(choice, page, 160).max()) <= budget


@pytest.mark.parametrize("name", SELECTORS)
def test_ties_go_to_the_lower_index(name):
    """Every key equal: every score ties, and the choice is the lowest pages / slots."""
    page, budget = 4, 20 if name == "nsa" else 16
    keys = torch.ones(1, 40, 8)
    q = torch.ones(2, 8)
    pol = make_policy(name, budget, **PARAMS.get(name, {}))
    choice = pol.choose_pages(obs_for(keys, q, page, budget // page, pol))
    got = choice.pages[0, 0][choice.ok[0, 0]].tolist()
    if choice.tokens is not None:  # DSA: sink + current page, then the earliest tokens
        assert got == [0, 9]
        assert choice.tokens[0, 0][choice.tokens_ok[0, 0]].tolist() == list(range(4, 12))
    elif choice.compressed is not None:  # NSA: sink, window (= current), earliest; 19 keys
        assert got == [0, 1, 9] and int(choice.compressed[0, 0].sum()) == 7
    else:
        assert got == [0, 1, 2, 9]


@pytest.mark.parametrize("budget", [24, 40, 64, 100])
@pytest.mark.parametrize("L", [30, 57, 120])
def test_nsa_reads_within_the_budget_and_compresses_only_what_it_does_not_read(budget, L):
    page = 4
    keys = torch.randn(2, L, 8, generator=torch.Generator().manual_seed(L))
    pol = make_policy("nsa", budget, window=8)
    choice = pol.choose_pages(obs_for(keys, torch.randn(4, 8), page, budget // page, pol))
    nb = -(-L // page)
    read = torch.zeros(2, nb, dtype=torch.bool).scatter_(-1, choice.pages[0], choice.ok[0])
    assert choice.compressed is not None
    assert not bool((read & choice.compressed[0]).any())
    assert bool((read | choice.compressed[0]).all()), "every page is read one way or the other"
    assert bool(read[:, -2:].all()) and bool(read[:, 0].all()), "window and sink pages"
    if nb + 3 * (page - 1) <= budget:  # room for the forced pages: within the budget
        assert int(keys_read(choice, page, L).max()) <= budget


def test_dsa_indexer_is_a_fixed_seeded_projection():
    a, b = make_policy("dsa", 64), make_policy("dsa", 64, seed=1)
    k = torch.randn(5, 16)
    assert torch.equal(a.index_keys(k), make_policy("dsa", 64).index_keys(k))
    assert not torch.equal(a.index_keys(k), b.index_keys(k))
    assert a.index_keys(k).shape == (5, 16)
    with pytest.raises(CtxlabError, match="index_dim"):
        make_policy("dsa", 64, index_dim=0)


@pytest.mark.parametrize("name", SELECTORS)
def test_a_budget_too_small_for_the_forced_pages_is_one_sentence(name):
    pol = make_policy(name, 4, **PARAMS.get(name, {}))
    with pytest.raises(CtxlabError) as err:
        pol.check_page(16)
    assert "too small" in str(err.value) and "\n" not in str(err.value)


def test_a_mean_row_with_a_log_count_bias_stands_for_its_identical_keys():
    """The extra-row attention the compressed branch uses: a page of n identical keys and
    values read as one row with logit bias log(n) gives exactly the full read."""
    torch.manual_seed(0)
    q = torch.randn(1, 1, 2, 8, dtype=torch.float64)
    own_k, own_v = (
        torch.randn(1, 1, 5, 8, dtype=torch.float64),
        torch.randn(1, 1, 5, 8, dtype=torch.float64),
    )
    k1, v1 = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    n = 6
    full_k = torch.cat((own_k, k1.expand(1, 1, n, 8)), 2)
    full_v = torch.cat((own_v, v1.expand(1, 1, n, 8)), 2)
    want, _ = attend(q, full_k, full_v)
    ek, ev = k1.view(1, 1, 1, 8), v1.view(1, 1, 1, 8)
    bias = torch.tensor([[[math.log(n)]]], dtype=torch.float32)
    mask = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    got, _ = attend(q, own_k, own_v, mask, (ek, ev, bias))
    torch.testing.assert_close(got, want)
    got_p, _ = attend(q, own_k, own_v, mask, (ek, ev, bias), want_probs=True)
    torch.testing.assert_close(got_p, want)
    dropped, _ = attend(q, own_k, own_v, mask, (ek, ev, torch.full_like(bias, -math.inf)))
    torch.testing.assert_close(dropped, attend(q, own_k, own_v)[0])


# -- in the engine (toy float64 model) ----------------------------------------------------


def prompts(n: int, seed: int = 0, lo: int = 80, hi: int = 110) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(CFG.vocab_size) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def engine(**kw) -> LLMEngine:
    args = dict(kv_pool_tokens=2048, block_size=BS, max_num_batched_tokens=512, max_num_seqs=8)
    args.update(kw)
    return LLMEngine(MODEL, CFG, **args)


def run(eng: LLMEngine, ps: list[list[int]], n: int = 10) -> list[list[int]]:
    rids = [eng.add_request(p, SamplingParams(max_tokens=n)) for p in ps]
    return [o.token_ids for o in eng.run_all(rids)]


@pytest.fixture(scope="module")
def base() -> list[list[int]]:
    return run(engine(), prompts(3))


@pytest.mark.parametrize("name", SELECTORS)
def test_a_budget_covering_the_context_gives_the_engines_tokens(name, base):
    eng = engine(policy=make_policy(name, 512, **PARAMS.get(name, {})))
    assert run(eng, prompts(3)) == base
    assert eng.runtime.pages.keys_read_fraction == 1.0


@pytest.mark.parametrize("name", SELECTORS)
def test_each_step_reads_at_most_the_budget_and_keeps_everything(name, monkeypatch):
    budget = 48
    eng = engine(policy=make_policy(name, budget, **PARAMS.get(name, {})))
    reads = eng.runtime.pages
    narrow = PageReads.narrow
    calls = []

    def checked(self, layer, q, table, mask):
        before = self.keys_read
        out = narrow(self, layer, q, table, mask)
        lanes = table.shape[0] * table.shape[1]
        calls.append((self.keys_read - before, lanes, out is None))
        return out

    monkeypatch.setattr(PageReads, "narrow", checked)
    got = run(eng, prompts(3))
    assert all(len(g) == 10 for g in got)
    narrowed = [(k, lanes) for k, lanes, dense in calls if not dense]
    assert narrowed, "the context outgrew the budget, so reads were narrowed"
    assert all(k <= budget * lanes for k, lanes in narrowed)
    assert 0 < reads.keys_read_fraction < 0.7
    assert eng.runtime.compactions == 0, "a selector evicts nothing"
    assert eng.stats().blocks_used == 0


class EveryTokenDSA(DSAPolicy):
    """DSA's answer shape with every token outside the forced pages read one by one."""

    def choose_pages(self, obs: PageObs) -> PageChoice:
        choice = super().choose_pages(obs)
        lens = obs.need("lens")
        L = obs.need("ikeys").shape[2]
        _, forced = self.forced(obs, L // obs.page)
        slot = torch.arange(L)
        tokens = slot.expand(*lens.shape, L)
        ok = (slot < lens[..., None]) & ~forced.repeat_interleave(obs.page, -1)
        return PageChoice(choice.pages, choice.ok, tokens, ok)


def test_single_token_reads_come_from_the_right_pool_rows(base):
    """Reading every non-forced token one by one (DSA's path) is the full attention."""
    eng = engine(policy=EveryTokenDSA(budget=16))
    assert run(eng, prompts(3)) == base


@pytest.mark.parametrize("name", ["moba", "dsa"])
def test_summaries_kept_as_keys_are_written_equal_a_rebuild_from_the_pool(name):
    """What `record` folds in step by step is what `rebuild` reads back from the pool (the
    benchmark forks an engine and rebuilds), for every block a request wrote."""
    eng = engine(policy=make_policy(name, 16))
    rids = [eng.add_request(p, SamplingParams(max_tokens=5)) for p in prompts(2)]
    for _ in range(4):
        eng.step()
    reads = eng.runtime.pages
    held = []
    for r in rids:
        kv = eng.seqs[r].kv
        full = kv.lane_len // BS  # whole blocks only: a rebuild counts every slot of a block
        held += [kv.table[lane, : int(full[lane])] for lane in range(kv.n_lanes)]
    blocks = torch.unique(torch.cat(held))
    kept = {}
    for key in ("ksum", "vsum", "count", "ikeys"):
        t = getattr(reads, key)
        if t is not None and t.numel():
            kept[key] = t.clone()
    reads.rebuild()
    for key, before in kept.items():
        after = getattr(reads, key)
        idx = blocks if key != "ikeys" else (blocks[:, None] * BS + torch.arange(BS)).flatten()
        torch.testing.assert_close(after[idx], before[idx])
    eng.run_all(rids)


@settings(max_examples=80, deadline=None)
@given(
    length=st.integers(1, 40),
    seed=st.integers(0, 10_000),
    levels=st.integers(1, 4),
)
def test_top_mask_is_the_ranking_rules_top_k(length, seed, levels):
    """DSA's selection (`top_mask`, via topk) picks exactly the set the ranking rule's sort
    picks, ties and -inf included, for every row's own k."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-1, levels, (3, 2, length), generator=g).float()
    scores[scores < 0] = float("-inf")
    k = torch.randint(0, length + 1, (3, 2), generator=g)
    mask = top_mask(scores, k)
    for i in range(3):
        for j in range(2):
            want = set(top_indices(scores[i, j], int(k[i, j])).tolist())
            assert set(torch.nonzero(mask[i, j]).flatten().tolist()) == want


def test_a_reader_built_over_a_filled_pool_summarises_what_it_holds():
    """After a failed step the engine rebuilds its runtime and the requests hit the prefix
    cache: the new page reader must see the cached blocks' summaries, not empty ones."""
    eng = engine(policy=make_policy("moba", 16), enable_prefix_caching=True)
    ps = prompts(1)
    run(eng, ps, n=2)  # the prompt's full blocks stay in the prefix cache
    before = eng.runtime.pages
    fresh = PageReads(eng.policy, eng.kv)
    cached = torch.nonzero(before.count).flatten()
    assert cached.numel() > 0
    torch.testing.assert_close(fresh.ksum[cached], before.ksum[cached])
