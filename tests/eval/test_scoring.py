import pytest

from ctxlab.eval.scoring import RULER_THRESHOLD, effective_length, string_match


def test_all_is_fraction_found_and_part_is_any_found():
    refs = ["1234567", "7654321"]
    assert string_match("the numbers are 1234567.", refs, "all") == 50.0
    assert string_match("the numbers are 1234567.", refs, "part") == 100.0
    assert string_match("nothing here", refs, "part") == 0.0
    assert string_match("ABC-Def", ["abc-def"], "all") == 100.0


def test_effective_length_stops_at_first_failure():
    scores = {1024: 95.0, 2048: 90.0, 4096: 70.0, 8192: 88.0}
    result = effective_length(scores)
    assert result.length == 2048
    assert result.threshold == RULER_THRESHOLD and result.basis == "absolute"


def test_relative_threshold_is_named():
    result = effective_length({512: 60.0, 1024: 50.0}, threshold=0.9, relative_to=60.0)
    assert result.length == 512
    assert result.threshold == pytest.approx(54.0)
    assert "full-cache score" in result.explanation


def test_nothing_passes():
    assert effective_length({512: 10.0}).length is None


def test_a_length_is_established_only_when_its_interval_clears_the_bar():
    """One sample that scored 100 has the interval [20.7, 100]: its mean clears 85.6, its
    interval does not, so no length is established at this n (not "512")."""
    result = effective_length({512: 100.0}, low_by_length={512: 20.7})
    assert result.length is None and not result.established
    assert result.shown == "not established at this n"
    assert "512 tokens not established at this n" in result.explanation
    # Enough samples: the interval clears the bar, and the length is established.
    sure = effective_length({512: 100.0, 1024: 97.0}, low_by_length={512: 96.0, 1024: 86.0})
    assert sure.length == 1024 and sure.established and sure.shown == "1,024"
    # A mean under the bar is a failure, whatever its interval: a different verdict.
    below = effective_length({512: 100.0, 1024: 50.0}, low_by_length={512: 96.0, 1024: 20.0})
    assert below.length == 512 and below.established


def test_the_bar_says_where_it_comes_from():
    assert "RULER's bar: Llama-2-7B's mean score at 4K" in effective_length({512: 90.0}).explanation
    assert "the threshold given" in effective_length({512: 90.0}, threshold=50.0).explanation
    assert "threshold 85.6, bar 85.6" not in effective_length({512: 90.0}).explanation


def test_rows_of_one_sample_establish_nothing():
    from ctxlab.eval.summary import effective_lengths

    rows = [{"task": "niah", "length": 512, "policy": "full", "score": 100.0}]
    eff = effective_lengths(rows)["full"]
    assert eff.length is None and eff.shown == "not established at this n"
    many = [dict(rows[0]) for _ in range(40)]
    assert effective_lengths(many)["full"].length == 512
