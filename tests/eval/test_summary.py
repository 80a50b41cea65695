import json

import pytest

from ctxlab.errors import CtxlabError
from ctxlab.eval import summary


def _rows(samples: int = 3):
    rows = []
    for policy, budget, kv, drop in (("full", None, 4_000_000, 0), ("snapkv", 256, 1_000_000, 40)):
        for length in (512, 1024):
            for depth in [i / max(1, samples - 1) for i in range(samples)]:
                score = 100.0 - (drop if length == 1024 else 0)
                rows.append(
                    {
                        "task": "niah_single_noise",
                        "policy": policy,
                        "budget": budget,
                        "length": length,
                        "depth": depth,
                        "score": score,
                        "resident_kv_bytes": kv * length // 512,
                    }
                )
    return rows


def test_cells_average_score_and_measured_bytes():
    table = {(c.policy, c.length): c for c in summary.cells(_rows())}
    assert table[("snapkv@256", 1024)].score == 60.0
    assert table[("full", 1024)].kv_bytes == 8_000_000
    assert table[("full", 512)].samples == 3
    full = table[("full", 512)]  # 3 of 3 samples right: Wilson's interval, not [100, 100]
    assert full.score_high == 100.0 and full.score_low == pytest.approx(43.85, abs=0.01)
    snap = table[("snapkv@256", 1024)]  # every sample scored 60: a bootstrap of one value
    assert snap.score_low == snap.score_high == 60.0


def test_length_means_weigh_each_task_once():
    rows = _rows()
    # A second task with one sample per length: its mean counts as much as the first task's.
    for length, score in ((512, 0.0), (1024, 50.0)):
        rows.append(
            {
                "task": "vt",
                "policy": "full",
                "budget": None,
                "length": length,
                "depth": None,
                "score": score,
                "resident_kv_bytes": 2_000_000,
            }
        )
    means = summary.length_means(rows)
    assert means["full"][512].score == 50.0 and means["full"][512].tasks == 2
    assert means["full"][1024].score == 75.0
    assert means["full"][512].kv_bytes == 3_000_000  # mean of the two task cells
    assert means["snapkv@256"][1024].score == 60.0 and means["snapkv@256"][1024].tasks == 1


def test_effective_length_per_policy_absolute_and_relative():
    absolute = summary.effective_lengths(_rows(samples=40))
    assert absolute["full"].length == 1024 and absolute["snapkv@256"].length == 512
    relative = summary.effective_lengths(_rows(samples=40), threshold=0.5, relative=True)
    assert relative["snapkv@256"].length == 1024 and relative["full"].basis == "relative"


def test_three_samples_establish_no_length():
    """3 of 3 right is the interval [43.9, 100]: its mean clears 85.6, the interval does not."""
    absolute = summary.effective_lengths(_rows())
    assert absolute["full"].length is None and not absolute["full"].established
    assert absolute["full"].shown == "not established at this n"


def test_relative_without_full_is_an_error():
    rows = [r for r in _rows() if r["policy"] != "full"]
    with pytest.raises(CtxlabError, match="full policy"):
        summary.effective_lengths(rows, relative=True)


def test_plots_are_written(tmp_path):
    heatmaps = summary.plot_heatmaps(_rows(), tmp_path)
    scatter = summary.plot_score_vs_bytes(_rows(), tmp_path)
    assert len(heatmaps) == 2 and len(scatter) == 1
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in heatmaps)


def test_bad_jsonl_line_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(_rows()[0]) + "\n{oops\n")
    with pytest.raises(CtxlabError, match="line 2"):
        summary.read_rows(path)
    path.write_text(json.dumps(_rows()[0]) + "\n" + json.dumps({"a": 1}) + "\n")
    with pytest.raises(CtxlabError, match="line 2 has no valid 'task'"):
        summary.read_rows(path)
    path.write_text("\n\n")
    with pytest.raises(CtxlabError, match="holds no rows"):
        summary.read_rows(path)


def test_sliding_perplexity_gives_enough_full_windows():
    import math

    from ctxlab.eval.perplexity import CURVE_POINTS, sliding_perplexity

    logprobs = [-math.log(2.0)] * 511  # every token at probability 1/2: perplexity 2
    ends, ppl = sliding_perplexity(logprobs, 63, CURVE_POINTS)
    assert len(ends) >= CURVE_POINTS - 1 and ends[-1] == 511
    assert ends[0] == 63 and all(abs(p - 2.0) < 1e-9 for p in ppl)
    short_ends, short_ppl = sliding_perplexity(logprobs[:10], 63, CURVE_POINTS)
    assert short_ends == [10] and abs(short_ppl[0] - 2.0) < 1e-9  # a window of what there is


def test_score_plot_draws_each_cells_interval(tmp_path, monkeypatch):
    """Per-task points carry their 95 % interval as error bars (the cells' score_low/high)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.axes import Axes

    drawn: list[tuple[list[float], list[list[float]]]] = []
    real = Axes.errorbar

    def spy(self, x, y, *args, **kwargs):
        drawn.append((list(y), kwargs["yerr"]))
        return real(self, x, y, *args, **kwargs)

    monkeypatch.setattr(Axes, "errorbar", spy)
    summary.plot_score_vs_bytes(_rows(), tmp_path)
    cells = [c for c in summary.cells(_rows()) if c.kv_bytes is not None]
    assert sum(len(y) for y, _ in drawn) == len(cells)
    for _ys, (below, above) in drawn:
        assert all(b >= 0 and a >= 0 for b, a in zip(below, above, strict=True))
    wide = {(c.score, c.score - c.score_low, c.score_high - c.score) for c in cells}
    got = {(y, b, a) for ys, (lo, hi) in drawn for y, b, a in zip(ys, lo, hi, strict=True)}
    assert got == wide
