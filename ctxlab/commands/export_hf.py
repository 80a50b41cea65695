"""`ctxlab export-hf`: a packaged GGUF model as a Hugging Face folder, for vLLM to serve.

A user deploying vLLM needs the same model ctxlab measures in the format vLLM loads, offline:
this writes transformers' reading of the GGUF with `save_pretrained` (model and tokenizer)
and prints the folder (docs/deployment.md, "vLLM as the reference deployment"). It is a
command, not only a make step, because users of a pip-installed ctxlab have no Makefile.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ctxlab.commands.options import JsonOpt


def register(app: typer.Typer) -> None:
    @app.command("export-hf")
    def export_hf(
        model: str = typer.Argument(
            "smollm2-135m", help="Registry name (smollm2-135m, gemma3-270m) or a .gguf file."
        ),
        out: Path = typer.Option(
            None, "--out", help="Folder to write (default: <ctxlab cache>/hf-models/<name>)."
        ),
        force: bool = typer.Option(False, "--force", help="Rewrite a current export."),
        as_json: JsonOpt = False,
    ) -> None:
        """Write a GGUF model as a Hugging Face folder (config, float32 safetensors,
        tokenizer) for servers that load only those, e.g. vLLM; an up-to-date export is
        reused."""
        from ctxlab.hf.export import default_folder, export_folder, is_current

        folder = (out or default_folder(model)).expanduser()
        reused = not force and folder.is_dir() and is_current(folder, model)
        folder = export_folder(model, folder, force=force)
        if as_json:
            typer.echo(json.dumps({"model": model, "folder": str(folder), "reused": reused}))
            return
        typer.echo(f"{'up to date' if reused else 'wrote'}: {folder}")
        typer.echo(
            f"serve it: python -m vllm.entrypoints.openai.api_server --model {folder} "
            f"--served-model-name {default_folder(model).name}"
        )
