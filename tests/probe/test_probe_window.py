"""What a server reuses past a sliding window (`ctxlab.probe.window`), from staircase points."""

from __future__ import annotations

from ctxlab.arch.presets import get_preset
from ctxlab.probe.window import past_window, sliding_window


def points(cached) -> list[dict[str, int]]:
    return [{"position": d, "prompt_tokens": d + 8, "cached": cached(d)} for d in range(5, 1200, 7)]


def test_gemma_has_a_window_and_smollm2_none():
    assert sliding_window(get_preset("gemma-3-270m")) == (512, 15)
    assert sliding_window(get_preset("smollm2-135m")) is None


def test_whole_pages_past_the_window():
    f = past_window(points(lambda d: d // 128 * 128), 512, 15, 128)
    assert f.value == "every whole page" and f.how == "measured"
    assert "past the 512-token window of 15 sliding layers" in f.note
    assert "tokens 516 to 1195" in f.note


def test_nothing_past_the_window():
    f = past_window(points(lambda d: d // 128 * 128 if d <= 512 else 0), 512, 15, 128)
    assert f.value == "nothing"


def test_part_past_the_window_names_the_points():
    # reuse capped at the window's last whole page
    f = past_window(points(lambda d: min(d // 128 * 128, 512)), 512, 15, 128)
    assert f.value == "part"
    assert "at most 512 tokens cached past the window" in f.note
    assert "642: 512" in f.note  # the first point that falls short of whole pages


def test_a_staircase_inside_the_window_says_how_to_reach_past_it():
    f = past_window(points(lambda d: d // 128 * 128)[:40], 512, 15, 128)
    assert f.value is None and f.how == "not measurable"
    assert "--longest above 512" in f.note


def test_points_left_out_are_named_in_the_figure():
    """Points the server counted otherwise are not among `points`; the figure says so."""
    why = "2 of 171 divergence points left out: the server counted their prompts otherwise"
    f = past_window(points(lambda d: d // 128 * 128), 512, 15, 128, left_out=why)
    assert f.value == "every whole page" and f.note.endswith(why)
    assert past_window(points(lambda d: d // 128 * 128), 512, 15, 128).note.count(";") == 0
