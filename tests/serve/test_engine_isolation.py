"""What a server needs from the engine: abort, refusal of a request that cannot run, and one
request's failure staying that request's (the issue's SnapKV repro), on the default model."""

from __future__ import annotations

import pytest

from ctxlab.engine import LLM, RequestFailedError, SamplingParams
from ctxlab.engine.runner import Runner
from ctxlab.errors import CtxlabError

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
LONGER = SamplingParams(max_tokens=20, ignore_eos=True)
TEXTS = [
    "The history of the printing press begins in the fifteenth century, when a goldsmith in "
    "Mainz combined movable metal type, oil-based ink and a screw press. Explain why it "
    "spread so quickly across Europe and what it changed for ordinary readers.",
    "Write a short letter to a neighbour asking them to water the plants while you are away "
    "for two weeks in August, and say where the key is hidden and which plants need more.",
    "Q: A train leaves the station at 9:40 in the morning and arrives in the city at 13:05. "
    "How long is the journey in hours and minutes? Show the subtraction step by step.\nA:",
]


@pytest.fixture(scope="module")
def ids(loaded) -> list[list[int]]:
    return [loaded.tokenizer.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def short45(loaded) -> list[int]:
    """The issue's repro prompt: 45 tokens, so SnapKV at 0.5 gets 22 < its 32-token window."""
    out = loaded.tokenizer.encode(" ".join(["word"] * 60))[:45]
    assert len(out) == 45
    return out


@pytest.fixture(scope="module")
def long_ids(ids) -> list[int]:
    """A prompt long enough for SnapKV at 0.5 (its half must cover the 32-token window)."""
    out = ids[0] + ids[1]
    assert len(out) >= 80
    return out


@pytest.fixture(scope="module")
def solo(loaded, ids) -> list[list[int]]:
    """Greedy tokens of each prompt run alone, full cache (20 tokens; tests of 8 compare the
    first 8)."""
    llm = LLM(loaded, kv_pool_tokens=1024)
    return [llm.generate(p, LONGER)[0].token_ids for p in ids]


def free_all(llm: LLM) -> None:
    st = llm.stats()
    assert st.blocks_used == 0 and st.blocks_free == st.blocks_total
    eng = llm.engine
    assert not eng.has_unfinished() and not eng.scheduler.suspects


def test_a_budget_below_the_policy_floor_is_refused_at_add_request(loaded, short45, long_ids):
    llm = LLM(loaded, policy="snapkv", budget=0.5, kv_pool_tokens=1024)
    llm.engine.policy.lift = lambda b: b  # a budget that is not lifted to the policy's floor
    with pytest.raises(CtxlabError, match=r"45 tokens cannot run under snapkv with budget 0\.5"):
        llm.engine.add_request(short45, GREEDY)
    assert not llm.engine.seqs
    # Batched with good prompts, nothing is left behind, and the engine keeps working.
    with pytest.raises(CtxlabError, match="snapkv"):
        llm.generate([long_ids, short45, long_ids], GREEDY)
    assert not llm.engine.seqs
    free_all(llm)
    out = llm.generate(long_ids, GREEDY)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8


def test_a_failing_step_fails_that_request_alone(loaded, short45, long_ids):
    """The issue's repro with the floor check switched off, so it fails inside a step, batched
    with a long request: the long one finishes with its solo text, the engine stays usable."""
    alone = LLM(loaded, policy="snapkv", budget=0.5, kv_pool_tokens=1024)
    expected = alone.generate(long_ids, GREEDY)[0].token_ids
    llm = LLM(loaded, policy="snapkv", budget=0.5, kv_pool_tokens=1024)
    llm.engine.policy.lift = lambda b: b  # a budget that is not lifted to the policy's floor
    llm.engine._check_policy_floor = lambda n: None  # type: ignore[method-assign]
    with pytest.raises(RequestFailedError, match="1 of 2 requests failed") as info:
        llm.generate([short45, long_ids], GREEDY)
    bad, good = info.value.outputs
    assert bad.finish_reason == "error" and bad.error is not None
    assert bad.error.user_fault and "too small for snapkv" in bad.error.message
    assert good.finish_reason == "length" and good.token_ids == expected
    assert llm.engine.num_failed_steps >= 1
    free_all(llm)
    assert llm.generate(long_ids, GREEDY)[0].token_ids == expected  # not poisoned


def test_a_decode_failure_in_a_batch_is_isolated(loaded, ids, solo, monkeypatch):
    """An engine fault (not the user's) in every decode step of one request once it has three
    tokens, in a batch of three: the batch is recomputed, the requests run alone until the
    culprit fails again by itself (a server error); the others give their solo text."""
    culprit = ids[1]
    real_run = Runner.run

    def run(self, batch):
        for sch in batch:
            seq = sch.seq
            if seq.prompt_ids == culprit and len(seq.output_ids) >= 3 and sch.num_new == 1:
                raise RuntimeError("injected fault")
        return real_run(self, batch)

    monkeypatch.setattr(Runner, "run", run)
    llm = LLM(loaded, kv_pool_tokens=1024)
    events = list(llm.stream(ids, GREEDY))
    finals = {e.request_id: e.output for e in events if e.finished}
    assert len(finals) == 3
    outs = [finals[r] for r in sorted(finals)]
    assert outs[1].finish_reason == "error" and outs[1].error is not None
    assert not outs[1].error.user_fault and outs[1].error.message == "injected fault"
    n = len(outs[1].token_ids)  # 3, plus the token its recompute sampled before failing
    assert n == 4 and outs[1].token_ids == solo[1][:n]
    assert [outs[0].token_ids, outs[2].token_ids] == [solo[0][:8], solo[2][:8]]
    free_all(llm)


def test_abort_frees_blocks_and_others_finish_unchanged(loaded, ids, solo):
    llm = LLM(loaded, kv_pool_tokens=1024, max_num_seqs=2)
    eng = llm.engine
    rids = [eng.add_request(p, GREEDY) for p in ids]
    eng.step()
    eng.step()
    assert eng.num_running == 2 and eng.num_waiting == 1
    before = llm.stats().blocks_used
    out = eng.abort(rids[0])  # running
    assert out is not None and out.finish_reason == "abort" and len(out.token_ids) == 2
    assert llm.stats().blocks_used < before
    waiting = eng.abort(rids[2])  # never admitted
    assert waiting is not None and waiting.token_ids == []
    assert eng.abort(rids[0]) is None and eng.abort(12345) is None
    while eng.has_unfinished():
        eng.step()
    assert eng.output(rids[1]).token_ids == solo[1][:8]
    free_all(llm)


def test_preemptions_are_counted_for_metrics(loaded, ids, solo):
    # Prompts of 49, 36 and 49 tokens take 4, 3 and 4 pages of 16; 8 pages admit two, and
    # their growth to 5 and 4 pages preempts one.
    assert [len(p) for p in ids] == [49, 36, 49]
    llm = LLM(loaded, kv_pool_tokens=8 * 16)
    outs = llm.generate(ids, LONGER)
    assert [o.token_ids for o in outs] == solo
    assert llm.engine.num_preemptions == sum(o.metrics.preemptions for o in outs) > 0
