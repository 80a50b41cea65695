"""H2O's decode scores grow on a model whose first layer is a sliding-window one.

Gemma 3's layers 0-4 are sliding, and a sliding layer's decode read returns no
probabilities (no policy acts there), so a runtime that looked only at layer 0 for the
step's probabilities never added a decode step to H2O's scores. Toy model: layer 0 slides
(window 5), layer 1 is global; with a budget that keeps everything, each decode step adds
one unit of attention per query head to the global layer's scores.
"""

from __future__ import annotations

import random
import sys
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from engine_toy_model import CFG, ToyModel, one_torch_thread  # noqa: F401  (fixture)

from ctxlab.engine import LLMEngine, SamplingParams
from ctxlab.policy import make_policy

WCFG = SimpleNamespace(**{**vars(CFG), "sliding_windows": (5, None)})


def test_decode_steps_add_to_the_global_layers_scores():
    eng = LLMEngine(
        ToyModel(seed=2, with_rope=True),
        WCFG,
        kv_pool_tokens=1024,
        block_size=4,
        max_num_batched_tokens=16,
        policy=make_policy("h2o", 1000),
    )
    rng = random.Random(4)
    eng.add_request(
        [rng.randrange(CFG.vocab_size) for _ in range(30)], SamplingParams(max_tokens=6)
    )
    runtime = eng.runner.runtime
    lanes = eng.kv.layout.lanes_of_layer(1)
    mass = []
    for _ in range(12):  # the prompt's chunks, then decode steps until the request ends
        eng.step()
        st = next(iter(runtime.states.values()), None)
        if st is None:
            break
        if st.acc is not None:
            mass.append(float(st.acc[lanes].sum()))
    steps = [b - a for a, b in pairwise(mass)]
    assert steps and all(abs(s - CFG.num_heads) < 1e-3 for s in steps), mass
