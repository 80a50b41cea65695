"""What a server reuses past a sliding window: the staircase's points beyond it.

A model with sliding-window layers (Gemma 3: 512-token windows on 5 of every 6 layers) keeps
for those layers only the last W tokens' keys. A prefix cache can still reuse a long prefix
if it kept the sliding layers' blocks of that prefix (the blocks inside the window before
the hit point), or reuse nothing past W, or something in between: vLLM 0.32 by default hashes
them only at checkpoints (a prompt's last page, a shared-prefix junction), so the first
request whose hit ends at a page no checkpoint covers reuses nothing (docs/deployment.md,
"Past a sliding window"). The probe's staircase answers it from outside: the divergence
points past W, against what a page-granular cache reuses below W (floor(position / P) x P).
"""

from __future__ import annotations

from dataclasses import replace

from ctxlab.arch.spec import ArchSpec
from ctxlab.probe.figures import Figure

NAME = "reuse past the sliding window"


def sliding_window(spec: ArchSpec) -> tuple[int, int] | None:
    """(the largest window, how many sliding layers) of `spec`, or None without any."""
    windows = [layer.window for layer in spec.layers if layer.kind == "sliding" and layer.window]
    return (max(windows), len(windows)) if windows else None


def past_window(
    points: list[dict[str, int]], window: int, layers: int, page: int, left_out: str = ""
) -> Figure:
    """The staircase's placed points past `window` against whole-page reuse (`page` tokens).
    `left_out`: why some points are not among `points` (the prefix section's note), added."""
    fig = _past(points, window, layers, page)
    return replace(fig, note=f"{fig.note}; {left_out}") if left_out else fig


def _past(points: list[dict[str, int]], window: int, layers: int, page: int) -> Figure:
    beyond = sorted((p for p in points if p["position"] > window), key=lambda p: p["position"])
    of = f"the {window}-token window of {layers} sliding layers"
    if not beyond:
        longest = max((p["position"] for p in points), default=0)
        return Figure(
            NAME, None, "not measurable",
            f"the staircase stopped at token {longest}, inside {of}: probe with "
            f"--longest above {window} (e.g. {2 * window + page})",
        )  # fmt: skip
    whole = [p for p in beyond if p["cached"] == p["position"] // page * page]
    none = [p for p in beyond if p["cached"] == 0]
    other = [p for p in beyond if p not in whole and p not in none]
    span = (
        f"{len(beyond)} divergence points past {of} (tokens {beyond[0]['position']} to "
        f"{beyond[-1]['position']})"
    )
    if len(whole) == len(beyond):
        value = "every whole page"
        note = f"cached = floor(position / {page}) x {page} at all {span}, as below the window"
    elif len(none) == len(beyond):
        value = "nothing"
        note = f"0 cached tokens at all {span}"
    else:
        value = "part"
        shown = ", ".join(f"{p['position']}: {p['cached']}" for p in (other or none)[:4])
        most = max(p["cached"] for p in beyond)
        note = (
            f"of {span}: whole pages (floor(position / {page}) x {page}) at {len(whole)}, "
            f"0 at {len(none)}, another count at {len(other)} (position: cached {shown}); "
            f"at most {most} tokens cached past the window"
        )
    return Figure(NAME, value, "measured", note)
