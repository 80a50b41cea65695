import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxlab.errors import CtxlabError
from ctxlab.eval import haystack
from ctxlab.eval.fit import make_sample
from ctxlab.eval.lost_in_middle import lost_in_middle_samples
from ctxlab.eval.sample import whitespace_counter
from ctxlab.eval.tasks import DEPTH_TASKS, TASKS, get_task


@pytest.mark.parametrize("name", list(TASKS))
def test_same_seed_same_sample_and_other_seed_differs(name):
    task = get_task(name)
    a = make_sample(task, 1500, 0.5, seed=7, count=whitespace_counter)
    b = make_sample(task, 1500, 0.5, seed=7, count=whitespace_counter)
    c = make_sample(task, 1500, 0.5, seed=8, count=whitespace_counter)
    assert a == b
    assert a.instruction != c.instruction


@pytest.mark.parametrize("name", list(TASKS))
@pytest.mark.parametrize("length", [512, 2048])
def test_prompt_fits_target_with_the_largest_haystack(name, length, chat_counter):
    task = get_task(name)
    sample = make_sample(task, length, 0.25, seed=3, count=chat_counter)
    assert sample.prompt_tokens + task.max_new_tokens <= length
    bigger = task.draft(sample.haystack_units + 1, 0.25, 3)
    assert chat_counter(bigger.instruction, bigger.answer_prefix) + task.max_new_tokens > length
    for ref in sample.references:
        assert ref in sample.instruction, "every reference must be recoverable from the context"
    if name in DEPTH_TASKS:  # a needle or gold document: its answer appears exactly once
        for ref in sample.references:
            assert sample.instruction.count(ref) == 1, (ref, name)


@pytest.mark.parametrize("name", DEPTH_TASKS)
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_asked_needle_sits_at_the_requested_depth(name, depth):
    task = get_task(name)
    sample = make_sample(task, 3000, depth, seed=11, count=whitespace_counter)
    first_ref = sample.references[0]
    position = sample.instruction.index(first_ref) / len(sample.instruction)
    assert abs(position - depth) < 0.15


def test_too_short_a_target_is_one_clear_error():
    with pytest.raises(CtxlabError, match="too short for task niah_single_noise"):
        make_sample(get_task("niah_single_noise"), 20, 0.5, 0, whitespace_counter)


def test_unknown_task_lists_known_ones():
    with pytest.raises(CtxlabError, match="known tasks: niah_single_noise"):
        get_task("niah_nonexistent")


@given(
    n_units=st.integers(0, 60),
    depths=st.lists(st.floats(0, 1), min_size=1, max_size=5),
)
@settings(max_examples=60, deadline=None)
def test_insert_keeps_every_unit_and_insert_in_order(n_units, depths):
    units = [f"u{i}" for i in range(n_units)]
    inserts = [(d, f"N{i}") for i, d in enumerate(depths)]
    out, where = haystack.insert_at_depths(units, inserts)
    assert [u for u in out if u.startswith("u")] == units
    assert [out[w] for w in where] == [text for _, text in inserts]


def test_noise_haystack_is_rulers_paragraph():
    units = haystack.filler_units("noise", 5, __import__("random").Random(0))
    assert " ".join(units) == (
        "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    )


def test_multivalue_asks_four_values_and_multiquery_four_keys():
    mv = make_sample(get_task("niah_multivalue"), 2000, 0.5, 1, whitespace_counter)
    mq = make_sample(get_task("niah_multiquery"), 2000, 0.5, 1, whitespace_counter)
    assert len(mv.references) == 4 and len(mq.references) == 4
    assert mq.instruction.count("special magic numbers for") >= 4


def test_lost_in_middle_moves_only_the_gold_document():
    samples = lost_in_middle_samples(5, seed=2, count=whitespace_counter)
    assert [s.depth for s in samples] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert len({s.references for s in samples}) == 1
    gold = samples[0].references[0]
    positions = [s.instruction.index(f"born in the town of {gold}") for s in samples]
    assert positions == sorted(positions)
