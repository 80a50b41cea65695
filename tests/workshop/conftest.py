"""One small real workshop run on the default model, shared by the tests that read it.

Every demonstration that this build has runs at tiny sizes (tens of tokens), with one
prediction written wrong on purpose, so the tests can check each measurement, the verdicts
and the reports from a single run instead of loading and running seven times.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

TINY_TOML = """
required_metrics = [
  "prefix_miss.reused_tokens_at_token0",
  "warm_prefix.ttft_ms",
  "page_size.waste_tokens_vs_planner",
  "eviction.reused_tokens",
  "recurrent_vs_kv.engine_concurrency_reached",
]

[model]
threads = 0
max_model_len = 1024
reserved_output_tokens = 64

[engine]
kv_pool_tokens = 1024
max_num_batched_tokens = 512
max_num_seqs = 8

[prefix_miss]
prompt_tokens = 64
output_tokens = 2
repeats = 1

[warm_prefix]
prefix_tokens = 64
suffix_tokens = 16
output_tokens = 4
repeats = 3

[page_size]
page_sizes = [1, 16, 64]
request_tokens = [40, 100]
pair_tokens = 96
divergence_at = 70

[eviction]
groups = 3
requests_per_group = 2
prefix_tokens = 64
suffix_tokens = 16
output_tokens = 2
pool_share = 0.9
concurrency = 1

[recurrent_vs_kv]
short = { requests = 32, input_tokens = 512, output_tokens = 32, rate = 4.0 }
long = { requests = 4, input_tokens = 8192, output_tokens = 32, rate = 0.5 }
engine_pool_tokens = 512
engine_short = { requests = 4, input_tokens = 32, output_tokens = 2 }
engine_long = { requests = 2, input_tokens = 200, output_tokens = 2 }

[disaggregation]
streams = 2
stream_tokens = 32
stream_output = 8
long_prompts = 1
long_tokens = 128
long_output = 2
lead_s = 0.1
gap_s = 0.2
pool_tokens = 1024

[compaction]
strategies = ["truncation", "summary", "tiered", "compact"]
sessions = 2
turns_per_session = 4
facts = 3
window_tokens = 256
reserve_tokens = 32
summary_tokens = 16
answer_tokens = 8
ceiling = true

[retrieval_depth]
k_values = [1, 2]
questions = 20
answer_questions = 4
answer_tokens = 8
gold_row = true

[followup]
documents = 2
facts = 2
filler_units = 12
policies = ["snapkv", "streaming"]
budgets = [0.5]
recall_tokens = 96
answer_tokens = 5
pool_tokens = 1024

[long_vs_retrieval]
context_tokens = 400
k_values = [1]
answer_questions = 2
cold_questions = 1
answer_tokens = 4

[useful_context]
enabled = true
tasks = ["niah_single_noise"]
lengths = [256]
samples = 1

[predictions.prefix_miss]
reused_tokens_at_token0 = { direction = "up" }   # wrong on purpose: it must be reported failed
reused_tokens_mid = { direction = "down", range = [32, 32] }
reused_tokens_other_tenant = { direction = "down", range = [0, 0] }

[predictions.page_size]
waste_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }
bytes_per_token_slot = { direction = "unchanged", tolerance = 0.0 }
reused_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }

[predictions.eviction]
reused_tokens = { direction = "down" }

[predictions.compaction]
facts_lost = { direction = "unchanged", tolerance = 0.0 }
context_tokens = { direction = "unchanged", tolerance = 1.0, range = [0, 224] }

[predictions.disaggregation]
# whole pages of the prompt minus its last token: 7 pages x 16 tokens x 46,080 bytes
kv_bytes_per_request = { direction = "up", range = [5160960, 5160960] }
resident_extra_mib = { direction = "up", range = [513, 8192] }

[predictions.retrieval_depth]
recall_at_k_pct = { direction = "up" }
context_tokens_per_question = { direction = "up" }
"""


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("workshop-config") / "tiny.toml"
    path.write_text(TINY_TOML, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tiny_run(loaded, tiny_config: Path, tmp_path_factory) -> tuple[dict[str, Any], Path]:
    """(results, output folder) of one real run at tiny sizes."""
    from ctxlab.workshop.config_file import load_config
    from ctxlab.workshop.runner import run_workshop

    out = tmp_path_factory.mktemp("workshop-out")
    cfg = load_config(tiny_config)
    results = run_workshop(
        cfg, out, config_label=str(tiny_config), loaded=loaded, show_progress=False
    )
    return results, out


@pytest.fixture
def session(loaded, tiny_config: Path, tmp_path: Path):
    """A workshop session on the tiny config, for running one demonstration's `measure`."""
    from ctxlab.workshop.config_file import load_config
    from ctxlab.workshop.session import Session

    return Session(load_config(tiny_config), loaded, tmp_path)
