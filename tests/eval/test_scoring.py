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
