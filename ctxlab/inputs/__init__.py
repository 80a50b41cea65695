"""Reading what a user hands in: text files, JSON and TOML, numbers and seeds.

Every layer reads user files and numbers through these few functions, so a bad byte, a
nesting bomb or a `nan` gets the same one sentence everywhere (a `CtxlabError`). Nothing
here imports torch, so `arch`, `plan` and `sim` use it too.
"""

from ctxlab.inputs.machine import (
    available_memory,
    check_fits_in_memory,
    check_threads,
    usable_cpus,
)
from ctxlab.inputs.numbers import SEED_MAX, check_finite, check_positive, check_seed
from ctxlab.inputs.paths import check_input_file, read_file_bytes, shown
from ctxlab.inputs.structured import (
    MAX_DEPTH,
    load_json,
    load_toml,
    loads_json,
    loads_toml,
)
from ctxlab.inputs.text import check_text, read_text

__all__ = [
    "MAX_DEPTH",
    "SEED_MAX",
    "available_memory",
    "check_finite",
    "check_fits_in_memory",
    "check_input_file",
    "check_positive",
    "check_seed",
    "check_text",
    "check_threads",
    "load_json",
    "load_toml",
    "loads_json",
    "loads_toml",
    "read_file_bytes",
    "read_text",
    "shown",
    "usable_cpus",
]
